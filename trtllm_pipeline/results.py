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
THROUGHPUT_SCHEMA = "throughput-1"  # bench --in-process --throughput: N requests through the runtime's scheduler
THROUGHPUT_PREFIX = "throughput-"  # its files in a build's bench/ directory


def runtime_line(rt: dict[str, Any]) -> str:
    """What ran a benchmark, from its results' ``runtime`` (a runtime's ``describe()``): the runtime and device, the
    weight format, the KV cache's element type, tensor parallelism, the decode path."""
    kv = f", KV {rt['kv_cache_dtype']}" if rt.get("kv_cache_dtype") else ""
    tp = f", tp {rt.get('world_size')} {rt.get('tp_mode')}" if rt.get("tp_mode") else ""
    return (f"runtime {rt.get('runtime')} on {rt.get('device')}, {rt.get('quant_algo') or rt.get('dtype')}{kv}{tp}; "
            f"decode: {rt.get('decode_path', 'n/a')}")


def number_cell(value: float | None, spec: str = ".1f", missing: str = "n/a") -> str:
    """A measured number as text in ``spec``, or ``missing`` when nothing was measured. Never a zero for a
    non-zero measurement: where ``spec`` would round it away (0.3 GB/s as ``.0f``), two significant digits."""
    if value is None:
        return missing
    text = format(value, spec)
    if value != 0 and not any(c in "123456789" for c in text.split("e")[0]):
        text = format(value, ".2g")
    return text


def load_eval(path: str | Path) -> dict[str, Any]:
    """An eval results file that can be judged; InputError (cannot judge) for anything else."""
    path = Path(path)
    try:
        results = json.loads(path.read_text(encoding="utf-8"), parse_constant=_non_finite)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the results file ({exc.strerror}).",
                         fix="run `trtllm-pipeline eval` for that config first") from None
    except _NonFinite as exc:
        raise InputError(f"{path}: cannot judge these results: the file holds {exc} (not a finite number).",
                         fix="re-run the eval") from None
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); the file is corrupt.", fix="re-run the eval") from None
    problem = eval_problem(results)
    if problem:
        raise InputError(f"{path}: cannot judge these results: {problem}.", fix="re-run the eval for a complete file")
    return results


class _NonFinite(ValueError):
    pass


def _non_finite(name: str):
    raise _NonFinite(name)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fraction(value: Any) -> bool:
    return _number(value) and 0 <= value <= 1


def _non_finite_at(value: Any, where: str) -> str | None:
    """Where in ``value`` a number is NaN or infinite (results made in code, not read from JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if found := _non_finite_at(item, f"{where}.{key}" if where else str(key)):
            return found
    return None


def eval_problem(r: Any) -> str | None:
    """Why ``r`` is not a complete, well-formed eval results file, or None."""
    if not isinstance(r, dict) or r.get("schema") != EVAL_SCHEMA:
        return f"not a results file of schema {EVAL_SCHEMA}"
    for key, kind in (("task", str), ("config", str), ("settings", dict), ("items", list), ("complete", bool)):
        if not isinstance(r.get(key), kind):
            return f"`{key}` is missing or not a {kind.__name__}"
    score = r.get("score")
    if not _fraction(score):
        return f"`score` is {score!r}, not a finite number in 0..1"
    ci95 = r.get("ci95")
    if ci95 is not None and not (isinstance(ci95, list) and len(ci95) == 2 and all(map(_fraction, ci95))
                                 and ci95[0] <= ci95[1]):
        return f"`ci95` is {ci95!r}, not an interval [low, high] of finite numbers in 0..1"
    for key in ("n", "n_selected"):
        if key in r and (not isinstance(r[key], int) or isinstance(r[key], bool) or r[key] < 0):
            return f"`{key}` is {r[key]!r}, not a count"
    if where := _non_finite_at(r, ""):
        return f"`{where}` is not a finite number"
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
        logprobs = item.get("logprobs")
        if logprobs is not None and not (isinstance(logprobs, list) and all(_number(x) for x in logprobs)):
            return f"item {item['id']} has `logprobs` = {logprobs!r}, not a list of finite numbers"
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


def is_throughput(data: dict[str, Any] | None) -> bool:
    """Whether ``data`` is a ``bench --in-process --throughput`` results file this version reads."""
    return data is not None and data.get("schema") == THROUGHPUT_SCHEMA and isinstance(data.get("runs"), list)


def level_label(entry: dict[str, Any]) -> str:
    """A bench load level as ``c=4`` (closed loop) or ``2.0/s`` (open loop)."""
    return f"c={entry['concurrency']}" if "concurrency" in entry else f"{entry['request_rate']}/s"
