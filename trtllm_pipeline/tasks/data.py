"""Reading evaluation data: the Hugging Face hub by default, or local files (``--data-dir``).

Local layouts accepted, under DIR/<task>/ or DIR itself:

* MMLU, the original CSV release: ``test/<subject>_test.csv`` and ``dev/<subject>_dev.csv``, no
  header, ``question,A,B,C,D,answer``. Read with Python's csv module: fields hold quoted newlines
  and CRLFs, and a type-guessing reader would turn choices such as ``None`` or ``1.0`` into
  something else. Field text is kept verbatim, CRLFs included (college_mathematics' dev row 2 has
  three), as lm-evaluation-harness keeps them: a changed character is a different prompt from lm-eval's.
* MMLU or GSM8K as parquet/jsonl (a hub snapshot such as ``all/test-*.parquet`` or plain
  ``test.jsonl``; MMLU rows need ``subject, question, choices, answer``). Parquet is read with ``datasets``;
  ``.jsonl``/``.json`` with the json module, rows as ``datasets`` gives them (blank lines skipped, a key a row
  lacks is None), so that evaluation runs where ``datasets`` is not installed (the GPU machine's image).
* A row may name its item (``item_id``): a subset of the release written by ``tools/accuracy_subset.py``
  keeps the full release's ids (``<subject>/<n>``, ``test/<n>``), hence the same items, results and ``--limit``
  ranks. Without one, an item's id is its place in the release. ``fidelity/documents.jsonl`` (MMLU and GSM8K
  test rows, each with ``task`` and ``item_id``), where present, is the fidelity task's text instead of the
  whole test splits (the subset holds the selected questions only).

Rows come back as plain dicts in the release's order. A file that is not what it should be (not
UTF-8, no records, a NUL byte, a wrong field count or answer, a question that is not text) is an
InputError naming the file and the record, never a silently different benchmark.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
from pathlib import Path
from typing import Any, Callable, Iterator

from trtllm_pipeline.errors import InputError, UnavailableError

log = logging.getLogger(__name__)

LETTERS = ("A", "B", "C", "D")
ITEM_ID = "item_id"  # a row's own item id (a subset keeps the full release's)
FIDELITY_FILE = Path("fidelity") / "documents.jsonl"
TABLE_SUFFIXES = (".parquet", ".jsonl", ".json")
DATA_DIR_HINT = ("pass --data-dir DIR with mmlu/{dev,test}/*.csv (the original MMLU release) and "
                 "gsm8k/{train,test}.jsonl, or make the hub reachable (HF_HUB_OFFLINE=1 uses a populated cache)")


# --------------------------------------------------------------------------- MMLU


def mmlu_rows(data_dir: Path | None) -> tuple[list[dict], list[dict], str]:
    """(test rows, dev rows, source); each row: subject, question, choices (4), answer (letter)."""
    if data_dir is None:
        test = [_mmlu_row(r, "cais/mmlu") for r in _hub("cais/mmlu", "all", "test")]
        dev = [_mmlu_row(r, "cais/mmlu") for r in _hub("cais/mmlu", "all", "dev")]
        return test, dev, "hub:cais/mmlu"
    root = _task_root(Path(data_dir), "mmlu", lambda d: (d / "test").is_dir() or _table_files(d, "test", "all"))
    if (root / "test").is_dir() and any((root / "test").glob("*_test.csv")):
        return _mmlu_csv(root, "test"), _mmlu_csv(root, "dev"), str(root)
    test = [_mmlu_row(r, f"{where}, row {i}") for where, i, r in _read_rows(root, "test", "all")]
    dev = [_mmlu_row(r, f"{where}, row {i}") for where, i, r in _read_rows(root, "dev", "all")]
    return test, dev, str(root)


def _mmlu_csv(root: Path, split: str) -> list[dict]:
    files = sorted((root / split).glob(f"*_{split}.csv"))
    if not files:
        raise InputError(f"{root / split}: no *_{split}.csv files (the MMLU release has one per subject).",
                         fix=DATA_DIR_HINT)
    rows = []
    for path in files:
        subject = path.name[: -len(f"_{split}.csv")]
        fix = "use the original MMLU CSV release (question,A,B,C,D,answer per record, UTF-8)"
        count = 0
        try:
            with open(path, newline="", encoding="utf-8") as f:
                for number, fields in enumerate(csv.reader(f), start=1):
                    count = number
                    if len(fields) != 6:
                        raise InputError(f"{path}, record {number}: expected 6 fields (question, 4 choices, answer), "
                                         f"got {len(fields)}.", fix=fix)
                    if fields[5].strip() not in LETTERS:
                        raise InputError(f"{path}, record {number}: the answer is {fields[5][:20]!r}, not a letter "
                                         "A-D.", fix=fix)
                    if any("\x00" in field for field in fields):
                        raise InputError(f"{path}, record {number}: a field holds a NUL byte; the file is damaged.",
                                         fix=fix)
                    question, *choices, answer = fields
                    rows.append({"subject": subject, "question": question, "choices": choices,
                                 "answer": answer.strip()})
        except UnicodeDecodeError as exc:
            raise InputError(f"{path}: not UTF-8 text (byte {exc.start}); the file is damaged or not an MMLU CSV.",
                             fix=fix) from None
        except csv.Error as exc:
            raise InputError(f"{path}, record {count + 1}: not CSV ({exc}).", fix=fix) from None
        if count == 0:
            raise InputError(f"{path}: no records (an empty subject file).", fix=fix)
    return rows


def _mmlu_row(row: dict[str, Any], where: str) -> dict:
    fix = "use cais/mmlu's 'all' configuration or the original CSV release"
    missing = {"subject", "question", "choices", "answer"} - set(row)
    if missing:
        raise InputError(f"{where}: MMLU rows lack the columns {sorted(missing)}.", fix=fix)
    answer, choices = row["answer"], row["choices"]
    letter = (LETTERS[answer] if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < 4
              else answer.strip() if isinstance(answer, str) else None)
    if not isinstance(choices, list) or len(choices) != 4 or not all(isinstance(c, str) for c in choices):
        raise InputError(f"{where}: `choices` is {str(choices)[:60]}; expected a list of 4 strings.", fix=fix)
    if letter not in LETTERS:
        raise InputError(f"{where}: `answer` is {answer!r}; expected 0-3 or A-D.", fix=fix)
    for key in ("subject", "question"):
        if not isinstance(row[key], str):
            raise InputError(f"{where}: `{key}` is {row[key]!r}, not text.", fix=fix)
    if any("\x00" in text for text in (row["question"], *choices)):
        raise InputError(f"{where}: a field holds a NUL byte; the data is damaged.", fix=fix)
    out = {"subject": row["subject"], "question": row["question"], "choices": list(choices), "answer": letter}
    return _with_item_id(out, row, where, fix)


# --------------------------------------------------------------------------- GSM8K


def gsm8k_rows(data_dir: Path | None) -> tuple[list[dict], list[dict], str]:
    """(test rows, train rows, source); each row: question, answer (worked solution ending in #### N)."""
    if data_dir is None:
        test = [_gsm8k_row(r, "openai/gsm8k") for r in _hub("openai/gsm8k", "main", "test")]
        train = [_gsm8k_row(r, "openai/gsm8k") for r in _hub("openai/gsm8k", "main", "train")]
        return test, train, "hub:openai/gsm8k"
    root = _task_root(Path(data_dir), "gsm8k", lambda d: bool(_table_files(d, "test", "main")))
    test = [_gsm8k_row(r, f"{where}, row {i}") for where, i, r in _read_rows(root, "test", "main")]
    train = [_gsm8k_row(r, f"{where}, row {i}") for where, i, r in _read_rows(root, "train", "main")]
    return test, train, str(root)


def _gsm8k_row(row: dict[str, Any], where: str) -> dict:
    fix = "use openai/gsm8k (main) or the grade-school-math jsonl files"
    if not {"question", "answer"} <= set(row):
        raise InputError(f"{where}: GSM8K rows need `question` and `answer`; this one has {sorted(row)[:6]}.", fix=fix)
    for key in ("question", "answer"):
        if not isinstance(row[key], str):
            raise InputError(f"{where}: `{key}` is {row[key]!r}, not text.", fix=fix)
        if "\x00" in row[key]:
            raise InputError(f"{where}: `{key}` holds a NUL byte; the data is damaged.", fix=fix)
    if "####" not in row["answer"]:
        raise InputError(f"{where}: the `answer` does not end in '#### N' (the final number).", fix=fix)
    return _with_item_id({"question": row["question"], "answer": row["answer"]}, row, where, fix)


# --------------------------------------------------------------------------- item ids


def _with_item_id(out: dict, row: dict[str, Any], where: str, fix: str) -> dict:
    """``out`` with the row's ``item_id`` where it has one (None: a row of a file whose other rows have one)."""
    value = row.get(ITEM_ID)
    if value is None:
        return out
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise InputError(f"{where}: `{ITEM_ID}` is {value!r}; expected the item's id as text (e.g. 'anatomy/3').",
                         fix=fix)
    return {**out, ITEM_ID: value}


def item_ids(rows: list[dict], source: str, group: Callable[[dict], str]) -> list[str]:
    """Each row's item id: its own ``item_id``, else ``<group>/<n>`` with n its place among the rows of its group
    (MMLU: the subject; GSM8K: "test"), as the release numbers them. A repeated id is an InputError."""
    counts: dict[str, int] = {}
    ids = []
    for row in rows:
        prefix = group(row)
        index = counts.get(prefix, 0)
        counts[prefix] = index + 1
        ids.append(row.get(ITEM_ID) or f"{prefix}/{index}")
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        repeated = next(i for i in ids if i in seen or seen.add(i))
        raise InputError(f"{source}: the item id {repeated!r} names two rows.",
                         fix="give each row its own item_id (tools/accuracy_subset.py writes the release's)")
    return ids


def without_item_id(row: dict) -> dict:
    """The row as the task reads it: the same dict with or without an ``item_id`` (hence the same prompts and
    data hash from a subset as from the release)."""
    return {key: value for key, value in row.items() if key != ITEM_ID}


# --------------------------------------------------------------------------- fidelity's own text


def fidelity_rows(data_dir: Path | None) -> tuple[list[dict], list[dict], str] | None:
    """(MMLU test rows, GSM8K test rows, source) of ``DIR/fidelity/documents.jsonl``; None where there is none.

    Each row is an MMLU or GSM8K test row with ``task`` ("mmlu" or "gsm8k") and its ``item_id`` in the release
    (the fidelity text's order comes from the ids)."""
    if data_dir is None or not (Path(data_dir) / FIDELITY_FILE).is_file():
        return None
    path = Path(data_dir) / FIDELITY_FILE
    fix = "write the data dir again with tools/accuracy_subset.py"
    mmlu_test, gsm8k_test = [], []
    rows = _read_json(path)
    if not rows:
        raise InputError(f"{path}: no rows.", fix=fix)
    for number, row in enumerate(rows, start=1):
        where = f"{path}, row {number}"
        if row.get(ITEM_ID) is None:
            raise InputError(f"{where}: no `{ITEM_ID}` (a fidelity document is named by its item in the release).",
                             fix=fix)
        if row.get("task") == "mmlu":
            mmlu_test.append(_mmlu_row(row, where))
        elif row.get("task") == "gsm8k":
            gsm8k_test.append(_gsm8k_row(row, where))
        else:
            raise InputError(f"{where}: `task` is {row.get('task')!r}; expected 'mmlu' or 'gsm8k'.", fix=fix)
    return mmlu_test, gsm8k_test, str(path)


# --------------------------------------------------------------------------- files and hub


def _task_root(data_dir: Path, task: str, looks_right) -> Path:
    if not data_dir.is_dir():
        raise InputError(f"--data-dir {data_dir}: no such directory.", fix=DATA_DIR_HINT)
    for root in (data_dir / task, data_dir):
        if root.is_dir() and looks_right(root):
            return root
    raise InputError(f"--data-dir {data_dir}: no {task} data found in {data_dir / task} or {data_dir}.",
                     fix=DATA_DIR_HINT)


def _table_files(root: Path, split: str, config_dir: str) -> list[Path]:
    """Parquet/jsonl files of one split: ``test.jsonl``, ``test-00000-of-00001.parquet``, ``all/test-*``."""
    for folder in (root, root / config_dir):
        files = sorted(p for p in folder.glob(f"{split}*") if p.suffix in TABLE_SUFFIXES and p.is_file())
        if files:
            return files
    return []


def _read_rows(root: Path, split: str, config_dir: str) -> list[tuple[str, int, dict]]:
    """(file, row number from 1, row) of every row of one split."""
    out = []
    for path in _table_files(root, split, config_dir) or [None]:
        rows = _read_tables(root, split, config_dir, only=path)
        if not rows:
            raise InputError(f"{path}: no rows.", fix=DATA_DIR_HINT)
        out += [(str(path), i, row) for i, row in enumerate(rows, start=1)]
    return out


def _read_tables(root: Path, split: str, config_dir: str, only: Path | None = None) -> list[dict]:
    files = [only] if only is not None else _table_files(root, split, config_dir)
    if not files:
        raise InputError(f"{root}: no {split} split ({split}.jsonl, {split}-*.parquet, {config_dir}/{split}-*).",
                         fix=DATA_DIR_HINT)
    if files[0].suffix != ".parquet":
        return [row for path in files for row in _read_json(path)]
    import datasets

    try:
        with _quiet_datasets():
            table = datasets.load_dataset("parquet", data_files=[str(p) for p in files], split="train")
    except Exception as exc:  # datasets raises many types for unreadable files
        raise InputError(f"{files[0]}: cannot read it as parquet: {_first_line(exc)}") from None
    return list(table)


def _read_json(path: Path) -> list[dict]:
    """The rows of a JSON-lines file (one object a line; blank lines skipped), or of a ``.json`` file holding one
    array of objects, as ``datasets``' json builder gives them: a key some rows lack is None in those rows, keys in
    the order they first appear. Read with the json module: the GPU machine's image has no ``datasets``."""
    fix = "write one JSON object per line (UTF-8), as the GSM8K release's jsonl files are"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}); the file is damaged.", fix=fix) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc}).", fix=fix) from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        rows = _json_array(path, text, fix)
    else:
        rows = [_json_line(path, number, line, fix) for number, line in enumerate(text.split("\n"), start=1)
                if line.strip()]  # only "\n" ends a line: a JSON string may hold U+2028 and its kin verbatim
    keys = list(dict.fromkeys(key for row in rows for key in row))
    return [{key: row.get(key) for key in keys} for row in rows]


def _json_line(path: Path, number: int, line: str, fix: str) -> dict:
    try:
        row = json.loads(line)
    except ValueError as exc:
        reason = f"{exc.msg}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise InputError(f"{path}, line {number}: not JSON ({reason}).", fix=fix) from None
    if not isinstance(row, dict):
        raise InputError(f"{path}, line {number}: a JSON {type(row).__name__}, not an object (one row a line).",
                         fix=fix)
    return row


def _json_array(path: Path, text: str, fix: str) -> list[dict]:
    try:
        rows = json.loads(text)
    except ValueError as exc:
        reason = f"{exc.msg}, line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise InputError(f"{path}: not JSON ({reason}).", fix=fix) from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise InputError(f"{path}: expected an array of objects (one a row).", fix=fix)
    return rows


def _hub(path: str, name: str, split: str) -> list[dict]:
    import datasets

    try:
        with _quiet_datasets():
            return list(datasets.load_dataset(path, name, split=split))
    except Exception as exc:  # offline, missing cache, hub errors: all mean "not available here"
        raise UnavailableError(f"cannot load {path} ({name}, {split}) from the Hugging Face hub: {_first_line(exc)}.",
                               fix=DATA_DIR_HINT) from None


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    import datasets

    enabled = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
