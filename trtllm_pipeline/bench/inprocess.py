"""``bench --in-process``: the engine's own decode speed, loaded in this process, at a few batch sizes.

No server, no client: ``batch`` requests of ``input_tokens`` synthetic token ids are submitted at
once to the runtime the build manifest names and decoded greedily for ``output_tokens`` tokens each
(the end id disabled, so every request runs to its length). Timing starts once every request has its
first token (the prefill is excluded) and ends with the last token: ms/token is the decode time per
step, tokens/s the decoded tokens over the decode time. One short warm-up run per batch size comes
first. The torch runtime is given ``batch`` cache slots; a TensorRT-LLM engine keeps its own
``max_batch_size`` (requests beyond it wait, which the numbers then include).

Results file (JSON, ``schema`` 1, ``kind: in_process``): ``config``, ``runtime`` (the runtime's
``describe()``: device, weight format, how the linears run), ``machine``, ``settings`` and
``levels``: one entry per batch size with ``batch``, ``ms_per_token``, ``tokens_per_s``, ``steps``.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from trtllm_pipeline import artifacts
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime

log = logging.getLogger(__name__)

IN_PROCESS_SCHEMA = 1
DEFAULT_BATCHES = (1, 32)


def run(cfg: BuildConfig, *, engines_dir: Path, batches: Sequence[int] = DEFAULT_BATCHES, input_tokens: int = 128,
        output_tokens: int = 64, progress: Callable[[str], None] = log.info) -> tuple[Path, dict[str, Any]]:
    """Measure each batch size and write ``<config>/bench/in_process/results.json``; returns (path, results)."""
    if output_tokens < 2:
        raise InputError("bench --in-process needs at least 2 output tokens (the first one is the prefill's).",
                         fix="raise --output-tokens")
    if not batches or min(batches) < 1:
        raise InputError(f"batch sizes must be positive, got {list(batches)}.", fix="e.g. --batch-sizes 1,32")
    # Cache slots for the largest batch, and no longer sequences than measured (the torch runtime's cache).
    limits = {"max_batch_size": max(max(batches), cfg.build.max_batch_size),
              "max_seq_len": min(cfg.build.max_seq_len, -(-(input_tokens + output_tokens) // 256) * 256)}
    sized = cfg.model_copy(update={"build": cfg.build.model_copy(update=limits)})
    sized._name, sized._path = cfg.name, cfg.path
    rt = load_runtime(sized, engines_dir)
    try:
        if input_tokens + output_tokens > getattr(rt, "max_seq_len", input_tokens + output_tokens):
            raise InputError(f"{input_tokens} + {output_tokens} tokens exceed the engine's max_seq_len.",
                             fix="lower --input-tokens or --output-tokens")
        prompt = [100 + (7 * i) % 1000 for i in range(input_tokens)]
        levels = []
        for batch in batches:
            _decode(rt, batch, prompt, min(4, output_tokens))  # warm-up (kernels, caches, allocator)
            seconds, steps = _decode(rt, batch, prompt, output_tokens)
            entry = {"batch": batch, "steps": steps, "decode_s": round(seconds, 6),
                     "ms_per_token": round(1000 * seconds / steps, 4),
                     "tokens_per_s": round(batch * steps / seconds, 2)}
            levels.append(entry)
            progress(f"bench --in-process: batch {batch}: {entry['ms_per_token']:.2f} ms/token, "
                     f"{entry['tokens_per_s']:.1f} tokens/s")
        described = rt.describe()
    finally:
        rt.close()
    data = {
        "schema": IN_PROCESS_SCHEMA, "kind": "in_process", "config": cfg.name, "created_at": artifacts.now_iso(),
        "runtime": described, "machine": machine_description(described),
        "settings": {"batches": list(batches), "input_tokens": input_tokens, "output_tokens": output_tokens},
        "levels": levels,
    }
    path = artifacts.artifact_paths(engines_dir, cfg.name).in_process_bench
    path.parent.mkdir(parents=True, exist_ok=True)
    artifacts.write_json_atomic(path, data)
    return path, data


def _decode(rt, batch: int, prompt: list[int], output_tokens: int) -> tuple[float, int]:
    params = SamplingParams(max_tokens=output_tokens, min_tokens=output_tokens, end_id=-1)
    ids = [f"in-process-{time.monotonic_ns()}-{i}" for i in range(batch)]
    for rid in ids:
        rt.submit(rid, prompt, params)
    counts = dict.fromkeys(ids, 0)
    started = None
    while rt.has_work():
        for event in rt.step():
            counts[event.request_id] += len(event.token_ids)
        if started is None and all(counts.values()):
            started = time.perf_counter()
    ended = time.perf_counter()
    if started is None:
        raise InputError("bench --in-process: a request produced no token.", fix="check the engine with `generate`")
    return ended - started, output_tokens - 1


def machine_description(described: dict[str, Any]) -> str:
    device = str(described.get("device", "?"))
    if device.startswith("cpu"):
        import torch

        return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads of " \
               f"{os.cpu_count()} cores)"
    return device


def read(path: Path) -> dict[str, Any] | None:
    """An in-process results file this version reads, else None."""
    from trtllm_pipeline.results import read_json

    data = read_json(path)
    if data and data.get("schema") == IN_PROCESS_SCHEMA and data.get("kind") == "in_process" \
            and isinstance(data.get("levels"), list):
        return data
    return None
