"""Results files the stages write and others read: eval's per-task accuracy, bench's latency.

Eval results (``engines/<config>/eval/<task>.json``) are judged by ``gate`` and shown by
``report``; ``load_eval`` accepts only a file that can be judged. Bench results
(``engines/<config>/bench/*.json``) are shown by ``report``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trtllm_pipeline.errors import InputError

EVAL_SCHEMA = 1
BENCH_SCHEMA = 1
INPROCESS_SCHEMA = "inprocess-1"  # bench --in-process: the runtime timed in this process
INPROCESS_PREFIX = "inprocess-"  # its files in a build's bench/ directory


def load_eval(path: str | Path) -> dict[str, Any]:
    """An eval results file that can be judged; InputError (cannot judge) for anything else."""
    path = Path(path)
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the results file ({exc.strerror}).",
                         fix="run `trtllm-pipeline eval` for that config first") from None
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); the file is corrupt.", fix="re-run the eval") from None
    problem = eval_problem(results)
    if problem:
        raise InputError(f"{path}: cannot judge these results: {problem}.", fix="re-run the eval for a complete file")
    return results


def eval_problem(r: Any) -> str | None:
    """Why ``r`` is not a complete, well-formed eval results file, or None."""
    if not isinstance(r, dict) or r.get("schema") != EVAL_SCHEMA:
        return f"not a results file of schema {EVAL_SCHEMA}"
    for key, kind in (("task", str), ("config", str), ("settings", dict), ("items", list), ("complete", bool)):
        if not isinstance(r.get(key), kind):
            return f"`{key}` is missing or not a {kind.__name__}"
    score = r.get("score")
    if not isinstance(score, (int, float)) or not math.isfinite(score) or not 0 <= score <= 1:
        return f"`score` is {score!r}, not a finite number in 0..1"
    if r["complete"] is not True:
        return f"the run is incomplete (`complete: false`; {r.get('n')} of {r.get('n_selected')} items scored)"
    items = r["items"]
    if not items:
        return "no items"
    ids = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            return f"item {i} has no string `id`"
        if not isinstance(item.get("correct"), bool):
            return f"item {item['id']} has `correct` = {item.get('correct')!r}, not true/false"
        if item["id"] in ids:
            return f"item id {item['id']} appears twice"
        ids.add(item["id"])
    if r.get("n") != len(items):
        return f"`n` is {r.get('n')!r} but the file holds {len(items)} items"
    return None


def read_json(path: Path | None) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_bench(data: dict[str, Any] | None) -> bool:
    """Whether ``data`` is a bench results file this version reads."""
    return data is not None and data.get("schema") == BENCH_SCHEMA and isinstance(data.get("summary"), list)


def is_inprocess(data: dict[str, Any] | None) -> bool:
    """Whether ``data`` is a ``bench --in-process`` results file this version reads."""
    return data is not None and data.get("schema") == INPROCESS_SCHEMA and isinstance(data.get("runs"), list)


def level_label(entry: dict[str, Any]) -> str:
    """A bench load level as ``c=4`` (closed loop) or ``2.0/s`` (open loop)."""
    return f"c={entry['concurrency']}" if "concurrency" in entry else f"{entry['request_rate']}/s"
