"""``bench --in-process``: the build's own runtime in this process, its decode timed step by step.

No server and no network between the engine and the clock: what one decode step costs at a given
batch and context, the figure the served benchmark is compared with. For each batch x context,
``batch`` requests with prompts of exactly ``context`` random tokens, each forced to
``output_tokens`` (min = max tokens, no end id); one prompt's prefill is timed on its own first.
Every step in which all rows decode is timed, the first ``warmup_steps`` dropped, the median kept.
The bytes a step must read (weights, and the KV cache up to its length) over its time give the
achieved bandwidth; over the device's copy bandwidth, measured here at the start, the fraction of
the bandwidth floor (100% would be a step that only reads its bytes once at copy speed).

Results file (JSON, ``schema`` ``inprocess-1``): ``settings``, ``runtime`` (its ``describe()``),
``copy_gbps``, and ``runs``, one per batch x context: ``decode_ms`` (median wall time per step,
the host's part included), ``decode_ms_p90``, ``graph_replay_ms`` (CUDA: the step's graph alone), ``tokens_per_s`` (batch / decode step),
``whole_s`` and ``whole_tokens_per_s`` (the batch's time from its submission to its last token, its prefill
included as in a served load, and its output tokens over that time), ``prefill_ms``, ``bytes_per_step``,
``achieved_gbps``, ``floor_ms``, ``fraction_of_floor``, ``peak_memory_gib``, ``steps_timed``; and
``rss_after``, each process's resident set size after the runs (one per tensor-parallel rank).
Numbers are the named runtime's on the named device, never another's.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from trtllm_pipeline import artifacts
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.results import INPROCESS_PREFIX, INPROCESS_SCHEMA, number_cell, runtime_line
from trtllm_pipeline.runtimes.base import Runtime, SamplingParams
from trtllm_pipeline.runtimes.engine_loop import EngineLoop
from trtllm_pipeline.runtimes.registry import load_runtime


@dataclasses.dataclass(frozen=True)
class InProcessSettings:
    batches: tuple[int, ...] = (1, 8, 32, 64)
    contexts: tuple[int, ...] = (128, 2048, 8192)
    output_tokens: int = 256
    warmup_steps: int = 16
    seed: int = 1234

    def check(self, rt: Runtime, max_input_len: int) -> None:
        """Every run fits the engine, or the error says which limit to raise."""
        if not self.batches or not self.contexts:
            raise InputError("no batch size or context length given.", fix="pass --batch 1,8 --context 128,2048")
        if min(self.batches) < 1 or min(self.contexts) < 1:
            raise InputError("--batch and --context values must be at least 1.")
        if self.output_tokens <= self.warmup_steps + 1:
            raise InputError(f"--output-tokens {self.output_tokens} leaves no timed step after "
                             f"{self.warmup_steps} warm-up steps.", fix=f"use --output-tokens {self.warmup_steps + 129} "
                             "or more (the median is then over at least 128 steps)")
        if max(self.batches) > rt.max_batch_size:
            raise InputError(f"batch {max(self.batches)} exceeds this build's build.max_batch_size {rt.max_batch_size}.",
                             fix="drop that batch, or rebuild with a larger build.max_batch_size")
        if max(self.contexts) > max_input_len:
            raise InputError(f"context {max(self.contexts)} exceeds this build's build.max_input_len {max_input_len}.",
                             fix="drop that context, or rebuild with a larger build.max_input_len")
        if max(self.contexts) + self.output_tokens > rt.max_seq_len:
            raise InputError(f"context {max(self.contexts)} + {self.output_tokens} output tokens exceeds this build's "
                             f"max_seq_len {rt.max_seq_len}.",
                             fix="use fewer --output-tokens or a shorter --context, or rebuild with a larger "
                                 "build.max_seq_len")


@dataclasses.dataclass
class InProcessResult:
    path: Path
    data: dict[str, Any]

    def table(self) -> list[str]:
        """The runs as a fixed-width table for the terminal."""
        lines = [f"{'batch':>5} {'context':>7} {'ms/step':>8} {'p90':>7} {'replay':>7} {'tokens/s':>9} {'GB/s':>6} "
                 f"{'of floor':>8} {'prefill ms':>10} {'peak GiB':>8}"]
        for r in self.data["runs"]:
            floor = None if r["fraction_of_floor"] is None else f"{100 * r['fraction_of_floor']:.0f}%"
            lines.append(f"{r['batch']:>5} {r['context']:>7} {r['decode_ms']:>8.3f} {r['decode_ms_p90']:>7.3f} "
                         f"{number_cell(r.get('graph_replay_ms'), '7.3f'):>7} "
                         f"{r['tokens_per_s']:>9.0f} {number_cell(r['achieved_gbps'], '6.0f'):>6} {floor or 'n/a':>8} "
                         f"{r['prefill_ms']:>10.1f} {number_cell(r['peak_memory_gib'], '8.2f'):>8}")
        lines.append(runtime_line(self.data["runtime"]))
        return lines


def with_batch(cfg: BuildConfig, engines_dir: str | Path, max_batch_size: int | None) -> BuildConfig:
    """``cfg`` with ``build.max_batch_size`` set for an in-process run of the torch runtime, which reads it at load
    (``bench --max-batch-size``); a TensorRT-LLM engine has its own built in: InputError."""
    if max_batch_size is None:
        return cfg
    built_for = artifacts.engine_manifest(engines_dir, cfg)["runtime"]
    if built_for != "torch":
        raise InputError(f"--max-batch-size sets the torch runtime's batch; {cfg.name} was built for {built_for}, "
                         f"whose engine has build.max_batch_size {cfg.build.max_batch_size} built in.",
                         fix="rebuild with another build.max_batch_size, or drop the option")
    return cfg.with_max_batch_size(max_batch_size)


def run_inprocess(cfg: BuildConfig, *, engines_dir: Path, settings: InProcessSettings, output: Path | None = None,
                  progress: Callable[[str], None] = print) -> InProcessResult:
    """Load the build's runtime here and time every batch x context of ``settings``; write the results."""
    rt = load_runtime(cfg, engines_dir)
    try:
        settings.check(rt, getattr(rt, "max_input_len", cfg.build.max_input_len))
        device = getattr(rt, "device", None)
        info = rt.describe()
        copy_gbps = copy_bandwidth_gbps(device)
        started = artifacts.now_iso()
        # One short request first, so one-time costs (allocator, kernel selection) time nothing.
        list(rt.stream([1] * 8, SamplingParams(max_tokens=4, end_id=-1), request_id="warm-up"))
        runs = []
        for context in settings.contexts:
            for batch in settings.batches:
                progress(f"bench --in-process: batch {batch}, context {context}, {settings.output_tokens} tokens")
                run = _run(rt, device, batch, context, settings, info, copy_gbps)
                runs.append(run)
                progress(f"  {run['decode_ms']:.3f} ms/step, {run['tokens_per_s']:.0f} tokens/s, "
                         f"prefill {run['prefill_ms']:.1f} ms")
        # Each process's resident memory once every run has filled its cache (tensor parallel: one per rank).
        rss_after = [{"rank": r["rank"], "pid": r["pid"], "rss_bytes": r.get("rss_bytes")}
                     for r in rt.describe().get("ranks", [])]
    finally:
        rt.close()
    data = {"schema": INPROCESS_SCHEMA,
            "settings": {**dataclasses.asdict(settings), "config": cfg.name, "started_at": started,
                         "finished_at": artifacts.now_iso()},
            "runtime": info, "copy_gbps": copy_gbps, "runs": runs, "rss_after": rss_after}
    path = output or (artifacts.artifact_paths(engines_dir, cfg.name).bench
                      / f"{INPROCESS_PREFIX}out{settings.output_tokens}.json")
    artifacts.write_json_atomic(path, data)
    return InProcessResult(path, data)


def _run(rt: Runtime, device, batch: int, context: int, settings: InProcessSettings, info: dict,
         copy_gbps: float | None) -> dict[str, Any]:
    import torch

    rng = random.Random(settings.seed * 1_000_003 + batch * 1009 + context)
    vocab = min(len(rt.tokenizer), getattr(rt, "vocab_size", None) or len(rt.tokenizer))
    special = set(getattr(rt.tokenizer, "all_special_ids", []))
    ids = [i for i in range(min(vocab, 50_000)) if i not in special]

    def prompt() -> list[int]:
        return [rng.choice(ids) for _ in range(context)]

    cuda = device is not None and getattr(device, "type", None) == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    # Prefill of one prompt alone: its first token, as time to first token in-process.
    start = _now(cuda)
    list(rt.stream(prompt(), SamplingParams(max_tokens=1, end_id=-1), request_id=("prefill", batch, context)))
    prefill_ms = (_now(cuda) - start) * 1000
    params = SamplingParams(max_tokens=settings.output_tokens, min_tokens=settings.output_tokens, end_id=-1)
    submitted = _now(cuda)
    for i in range(batch):
        rt.submit(("decode", i), prompt(), params)
    timer = _StepTimer(batch, _now(cuda))
    loop = EngineLoop(rt, timer)  # the loop a server drives the runtime with
    phases = rt.phase_times() if hasattr(rt, "phase_times") else {}
    while rt.has_work():
        loop.turn()
    after = rt.phase_times() if phases else {}
    whole_s = _now(cuda) - submitted  # the batch from its submission to its last token: its prefill included
    times = timer.times
    timed = times[settings.warmup_steps:] or times
    decode_ms = statistics.median(timed) * 1000
    p90 = sorted(timed)[int(0.9 * (len(timed) - 1))] * 1000
    # Bytes one step reads: every weight once, plus each row's KV cache at the median step's length.
    weights = info.get("weight_bytes")
    kv_token = info.get("kv_bytes_per_token")
    mid = context + settings.warmup_steps + len(timed) // 2
    step_bytes = weights + batch * mid * kv_token if weights and kv_token else None
    achieved = step_bytes / (decode_ms / 1000) / 1e9 if step_bytes else None
    floor_ms = step_bytes / (copy_gbps * 1e9) * 1000 if step_bytes and copy_gbps else None
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    return {"batch": batch, "context": context, "output_tokens": settings.output_tokens, "steps_timed": len(timed),
            "graph_replay_ms": _graph_replay_ms(rt, batch) if cuda else None,
            "decode_ms": decode_ms, "decode_ms_p90": p90, "tokens_per_s": batch * 1000 / decode_ms,
            "whole_s": whole_s, "whole_tokens_per_s": batch * settings.output_tokens / whole_s if whole_s > 0 else None,
            "prefill_ms": prefill_ms, "bytes_per_step": step_bytes, "achieved_gbps": achieved, "floor_ms": floor_ms,
            "fraction_of_floor": floor_ms / decode_ms if floor_ms else None, "peak_memory_gib": peak,
            # the torch runtime's steps, and those chained on the previous one's argmax (the GPU not waiting for the host)
            "steps": after.get("steps", 0) - phases.get("steps", 0) if phases else None,
            "chained_steps": after.get("chained_steps", 0) - phases.get("chained_steps", 0) if phases else None}


class _StepTimer:
    """The engine loop's host here: the requests are all submitted up front; each step is timed from one step's
    tokens reaching the host to the next's, as a streaming client sees them, once every row decodes (no device
    sync of its own: work the runtime leaves running on the device when a step returns counts as it runs)."""

    def __init__(self, batch: int, start: float):
        self.batch, self.last = batch, start
        self.decoding: set = set()
        self.times: list[float] = []

    def between_steps(self, block: bool) -> None:
        pass

    def idle(self) -> bool:
        return True

    def on_events(self, events) -> None:
        now = time.perf_counter()
        if len(self.decoding) == self.batch:
            self.times.append(now - self.last)
        self.last = now
        self.decoding.update(e.request_id for e in events)

    def on_failure(self, exc: Exception) -> None:
        raise exc


def _graph_replay_ms(rt: Runtime, batch: int) -> float | None:
    """The GPU's time per decode step without the host's (the step's CUDA graph replayed back to back), which a
    step in the loop above approaches as the host's work overlaps it; None where the runtime has no such graph."""
    time_replay = getattr(getattr(rt, "decoder", None), "time_replay", None)
    return time_replay(batch) if time_replay else None


def _now(cuda: bool) -> float:
    """A host clock reading after the device has finished what was queued (steps sync anyway)."""
    if cuda:
        import torch

        torch.cuda.synchronize()
    return time.perf_counter()


def copy_bandwidth_gbps(device, size_bytes: int = 1 << 30, repeats: int = 10) -> float | None:
    """A device-to-device copy's speed (bytes read + written per second, in GB/s); None off CUDA."""
    if device is None or getattr(device, "type", None) != "cuda":
        return None
    import torch

    src = torch.empty(size_bytes // 2, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = begin.elapsed_time(end) / 1000 / repeats
    del src, dst
    return size_bytes / seconds / 1e9
