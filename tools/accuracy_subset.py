"""The data `make accuracy-table` evaluates, and nothing else, as a small data dir for a machine without the release.

    python tools/accuracy_subset.py --data-dir DIR [--model smollm2-135m-instruct] [--mmlu 20 --gsm8k 4] [-o .gpu_data]

The GPU machine has neither the MMLU/GSM8K release nor ``datasets``, and a device call carries at most 64 MiB; this
dir (~5 MB, plain jsonl) travels instead (``benchmarks/h200_queue.sh``: any ``wait`` call may carry it). Evaluating
it with the same limits gives the same items, prompts and results as the whole release: ``eval`` records the same
``data_sha256``, and this tool checks that before it replaces OUT (it reads the new dir back through the tasks).

    mmlu/test.jsonl          the stratified subset of --mmlu questions (limit and seed as accuracy_table's), each
                             with its id in the release (``item_id``): ``--limit`` ranks items by their ids
    mmlu/dev.jsonl           every subject's 5 exemplars (117 kB; the few-shot pools are part of the data hash)
    gsm8k/test.jsonl         the --gsm8k problems, with their ids
    gsm8k/train.jsonl        the whole train split (4.2 MB): lm-eval mode draws its exemplars by position in it
    fidelity/documents.jsonl the test rows the fidelity text is cut from (fidelity.DOCUMENTS, in the text's order)
    subset.json              the limits, seed, source and each task's data hash (what ``eval`` records)

A larger limit on this dir is not the release's subset of that size (only these items are here): use the limits it
was written for (subset.json).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from trtllm_pipeline import artifacts
from trtllm_pipeline.config import load_config
from trtllm_pipeline.errors import InputError, PipelineError
from trtllm_pipeline.eval import data_fingerprint
from trtllm_pipeline.tasks import data, fidelity, gsm8k, mmlu
from trtllm_pipeline.tasks.subset import stratified_subset

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from accuracy_table import DEFAULT_LIMITS  # a sibling script: one place for the subsets' sizes

TASKS = {"mmlu": mmlu, "gsm8k": gsm8k, "fidelity": fidelity}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:  # ASCII escapes: any reader, any line-splitting, reads it back
        f.writelines(json.dumps(row) + "\n" for row in rows)


def selection(data_dir: Path, limits: dict[str, int], seed: int) -> dict[str, tuple]:
    """{task: (TaskData, selected items, data hash)} as ``eval`` selects and hashes them."""
    out = {}
    for name, task in TASKS.items():
        task_data = task.load(data_dir)
        items = stratified_subset(task_data.items, limits[name], seed)
        out[name] = (task_data, items, data_fingerprint(items, task_data))
    return out


def write_subset(source: Path, out: Path, limits: dict[str, int], seed: int) -> dict:
    """Write the subset of ``source`` for ``limits``/``seed`` to ``out`` (replaced whole, only once checked);
    returns its manifest (subset.json)."""
    chosen = selection(source, limits, seed)
    (mmlu_data, mmlu_items, _), (gsm8k_data, gsm8k_items, _) = chosen["mmlu"], chosen["gsm8k"]
    mmlu_test, _, _ = data.mmlu_rows(source)
    gsm8k_test, _, _ = data.gsm8k_rows(source)
    documents = fidelity.ordered_rows(mmlu_test, gsm8k_test, str(source))
    manifest = {
        "written_by": "tools/accuracy_subset.py", "source": str(source), "seed": seed, "limits": limits,
        "data_sha256": {name: fingerprint for name, (_, _, fingerprint) in chosen.items()},
        "items": {"mmlu": [it.id for it in mmlu_items], "gsm8k": [it.id for it in gsm8k_items]},
    }
    with artifacts.atomic_dir(out) as tmp:
        write_jsonl(tmp / "mmlu" / "test.jsonl", [{data.ITEM_ID: it.id, **it.doc} for it in mmlu_items])
        write_jsonl(tmp / "mmlu" / "dev.jsonl", [row for rows in mmlu_data.fewshot.values() for row in rows])
        write_jsonl(tmp / "gsm8k" / "test.jsonl", [{data.ITEM_ID: it.id, **it.doc} for it in gsm8k_items])
        write_jsonl(tmp / "gsm8k" / "train.jsonl", gsm8k_data.fewshot["train"])
        write_jsonl(tmp / data.FIDELITY_FILE,
                    [{"task": task, data.ITEM_ID: item_id, **data.without_item_id(row)}
                     for task, item_id, row in documents])
        check(tmp, manifest)
        artifacts.write_json_atomic(tmp / "subset.json", manifest)
    return manifest


def check(written: Path, manifest: dict) -> None:
    """The written dir, read back through the tasks, selects the items and data hashes the source did."""
    again = selection(written, manifest["limits"], manifest["seed"])
    for name, (_, items, fingerprint) in again.items():
        if fingerprint != manifest["data_sha256"][name]:
            raise PipelineError(f"the subset's {name} data reads back as another data hash ({fingerprint[:12]} "
                                f"against {manifest['data_sha256'][name][:12]}): its items or exemplars changed "
                                f"({len(items)} items: {[it.id for it in items][:4]} ...).",
                                fix="report this: tools/accuracy_subset.py and tasks/data.py disagree")


def ignore_in_git(out: Path) -> None:
    """``out`` (inside this checkout) added to the checkout's .git/info/exclude, as tools/gpu_wheels.sh adds .whl/:
    never committed, and a device call carries it only when asked (``carry``)."""
    try:
        rel = out.resolve().relative_to(REPO)
    except ValueError:
        return  # outside the checkout: nothing to ignore
    git = ["git", "-C", str(REPO)]
    try:
        if subprocess.run([*git, "check-ignore", "-q", str(rel)], capture_output=True, check=False).returncode == 0:
            return
        exclude = Path(subprocess.run([*git, "rev-parse", "--git-path", "info/exclude"], capture_output=True,
                                      text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return  # not a git checkout
    exclude = exclude if exclude.is_absolute() else REPO / exclude
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with open(exclude, "a", encoding="utf-8") as f:
        f.write(f"/{rel.as_posix()}/\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="the release (mmlu/, gsm8k/)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="whose configs give the seed")
    parser.add_argument("--mmlu", type=int, default=DEFAULT_LIMITS["mmlu"], help="MMLU questions")
    parser.add_argument("--gsm8k", type=int, default=DEFAULT_LIMITS["gsm8k"], help="GSM8K problems")
    parser.add_argument("--fidelity", type=int, default=DEFAULT_LIMITS["fidelity"], help="fidelity chunks")
    parser.add_argument("-o", "--out", type=Path, default=REPO / ".gpu_data")
    args = parser.parse_args()
    try:
        config = REPO / "build_configs" / f"{args.model}-bf16-tp1.yaml"
        if not config.is_file():
            raise InputError(f"{config}: no such config.", fix="pass --model NAME with build_configs/NAME-bf16-tp1.yaml")
        seed = load_config(config).evaluation.seed
        limits = {"mmlu": args.mmlu, "gsm8k": args.gsm8k, "fidelity": args.fidelity}
        manifest = write_subset(args.data_dir, args.out, limits, seed)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    ignore_in_git(args.out)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"{args.out}: {len(manifest['items']['mmlu'])} MMLU questions, {len(manifest['items']['gsm8k'])} GSM8K "
          f"problems, the fidelity text (seed {seed}), {size / 1e6:.1f} MB; data hashes equal to {args.data_dir}'s")


if __name__ == "__main__":
    main()
