"""``bench --in-process --throughput``: N requests submitted at once through the runtime's own scheduler.

For each input/output length pair, ``requests`` prompts of exactly that many random tokens, each forced to its
output length (min = max tokens, no end id), all submitted before the first step; the runtime's scheduler
admits, batches, chunks, preempts as it would under load, and this loop only steps it and stamps each token.
Reported per run: output tokens/s and requests/s over the whole run (first submit to last token), TTFT and ITL
percentiles (ms; ITL: gaps between a request's consecutive tokens), the KV pool's usage (mean and peak over the
steps), preemptions, prefix-cache hits, peak GPU memory. The shared-prefix workload (``shared_prefix`` > 0): every
prompt is one common system prompt of that many tokens then distinct question tokens (the input length), run
without and then with the prefix cache (the torch runtime toggles it between the two runs), outputs compared.

Results file (JSON, ``schema`` ``throughput-1``): ``settings``, ``runtime`` (its ``describe()``), ``runs``, and
``reference``: TensorRT-LLM's published figures for Llama-3.1-8B FP8 on one H200 (labelled: another model and
engine, for scale only).
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path
from typing import Any, Callable

from trtllm_pipeline import artifacts
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.results import THROUGHPUT_PREFIX, THROUGHPUT_SCHEMA
from trtllm_pipeline.runtimes.base import Runtime, SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime

# TensorRT-LLM perf-overview, trtllm-bench, Llama-3.1-8B FP8 on one H200: output tokens/s by (input, output).
REFERENCE = {"source": "TensorRT-LLM perf-overview (trtllm-bench), Llama-3.1-8B FP8, 1x H200",
             "output_tokens_per_s": {"128/2048": 26221, "500/2000": 20770, "1000/1000": 17744, "2048/2048": 12194,
                                     "2048/128": 3538}}


@dataclasses.dataclass(frozen=True)
class ThroughputSettings:
    lengths: tuple[tuple[int, int], ...] = ((128, 128),)
    requests: int = 64
    shared_prefix: int = 0  # tokens of a common system prompt before each prompt's own input tokens
    seed: int = 1234

    def check(self, rt: Runtime) -> None:
        if not self.lengths:
            raise InputError("no input/output length pair given.", fix="pass --lengths 128/2048,2048/128")
        for inp, out in self.lengths:
            total = self.shared_prefix + inp + out
            if inp < 1 or out < 1:
                raise InputError(f"--lengths {inp}/{out}: both lengths must be at least 1.")
            if total > rt.max_seq_len:
                raise InputError(f"{self.shared_prefix} shared + {inp} input + {out} output tokens exceed this "
                                 f"build's max_seq_len {rt.max_seq_len}.",
                                 fix="shorten the pair, or rebuild with a larger build.max_seq_len")


@dataclasses.dataclass
class ThroughputResult:
    path: Path
    data: dict[str, Any]

    def table(self) -> list[str]:
        return throughput_table(self.data)


def throughput_table(data: dict[str, Any]) -> list[str]:
    """The runs as a fixed-width table, each beside the published reference row of its lengths (if any)."""
    def cell(value, spec):
        return "n/a" if value is None else format(value, spec)

    ref = data.get("reference", {}).get("output_tokens_per_s", {})
    lines = [f"{'in/out':>10} {'reqs':>5} {'prefix':>8} {'out tok/s':>10} {'req/s':>7} {'TTFT p50':>9} "
             f"{'p99':>8} {'ITL p50':>8} {'p99':>7} {'KV peak':>7} {'preempt':>7} {'peak GiB':>8} {'TRT-LLM*':>9}"]
    for r in data["runs"]:
        pair = f"{r['input_tokens']}/{r['output_tokens']}"
        prefix = "-" if not r["shared_prefix"] else f"{r['shared_prefix']}{'+reuse' if r['reuse'] else ''}"
        lines.append(f"{pair:>10} {r['requests']:>5} {prefix:>8} {r['output_tokens_per_s']:>10.0f} "
                     f"{r['requests_per_s']:>7.2f} {r['ttft_ms']['p50']:>9.1f} {r['ttft_ms']['p99']:>8.1f} "
                     f"{r['itl_ms']['p50']:>8.2f} {r['itl_ms']['p99']:>7.2f} "
                     f"{cell(r['kv_usage_peak'] and 100 * r['kv_usage_peak'], '6.0f'):>6}% {cell(r['preemptions'], 'd'):>7} "
                     f"{cell(r['peak_memory_gib'], '8.2f'):>8} {cell(ref.get(pair), 'd'):>9}")
    rt = data["runtime"]
    lines.append(f"runtime {rt.get('runtime')} on {rt.get('device')}, {rt.get('quant_algo') or rt.get('dtype')}; "
                 f"decode: {rt.get('decode_path', 'n/a')}")
    if ref:
        lines.append(f"* reference only, another model and engine: {data['reference']['source']}")
    return lines


def run_throughput(cfg: BuildConfig, *, engines_dir: Path, settings: ThroughputSettings, output: Path | None = None,
                   progress: Callable[[str], None] = print) -> ThroughputResult:
    """Load the build's runtime here, run every workload of ``settings`` through its scheduler, write the results."""
    rt = load_runtime(cfg, engines_dir)
    try:
        settings.check(rt)
        info = rt.describe()
        started = artifacts.now_iso()
        list(rt.stream([1] * 8, SamplingParams(max_tokens=4, end_id=-1), request_id="warm-up"))
        runs = []
        for inp, out in settings.lengths:
            for reuse in ((None,) if not settings.shared_prefix else (False, True)):
                progress(f"bench --throughput: {settings.requests} requests of {inp}/{out} tokens"
                         + (f", {settings.shared_prefix}-token shared prefix, reuse {'on' if reuse else 'off'}"
                            if settings.shared_prefix else ""))
                run = _run(rt, inp, out, settings, reuse)
                runs.append(run)
                progress(f"  {run['output_tokens_per_s']:.0f} output tokens/s, TTFT p50 {run['ttft_ms']['p50']:.1f} ms, "
                         f"{run['preemptions']} preemptions")
        if settings.shared_prefix:
            for off, on in zip(runs[::2], runs[1::2]):
                on["same_outputs_as_without_reuse"] = on.pop("_outputs") == off.pop("_outputs")
        for run in runs:
            run.pop("_outputs", None)
    finally:
        rt.close()
    data = {"schema": THROUGHPUT_SCHEMA,
            "settings": {**dataclasses.asdict(settings), "config": cfg.name, "started_at": started,
                         "finished_at": artifacts.now_iso()},
            "runtime": info, "runs": runs, "reference": REFERENCE}
    name = "-".join(f"{i}x{o}" for i, o in settings.lengths)[:80]
    path = output or (artifacts.artifact_paths(engines_dir, cfg.name).bench
                      / f"{THROUGHPUT_PREFIX}{name}{'-prefix' if settings.shared_prefix else ''}.json")
    artifacts.write_json_atomic(path, data)
    return ThroughputResult(path, data)


def _set_reuse(rt: Runtime, reuse: bool | None) -> bool | None:
    """Turn the torch runtime's prefix cache on or off (None: leave it); returns what it was."""
    kv = getattr(rt, "kv", None)
    if kv is None:
        return None
    was = kv.enable_prefix_cache
    if reuse is not None:
        kv.enable_prefix_cache = reuse
    return was


def _run(rt: Runtime, inp: int, out: int, settings: ThroughputSettings, reuse: bool | None) -> dict[str, Any]:
    import torch

    rng = random.Random(settings.seed * 1_000_003 + inp * 1009 + out)
    vocab = min(len(rt.tokenizer), getattr(rt, "vocab_size", None) or len(rt.tokenizer))
    special = set(getattr(rt.tokenizer, "all_special_ids", []))
    ids = [i for i in range(min(vocab, 50_000)) if i not in special]
    system = [rng.choice(ids) for _ in range(settings.shared_prefix)]
    prompts = [system + [rng.choice(ids) for _ in range(inp)] for _ in range(settings.requests)]
    device = getattr(rt, "device", None)
    cuda = getattr(device, "type", None) == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    was = _set_reuse(rt, reuse)
    before = rt.stats() if hasattr(rt, "stats") else {}
    params = SamplingParams(max_tokens=out, min_tokens=out, end_id=-1)
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        rt.submit(("tp", i), p, params)
    stamps: dict[Any, list[float]] = {("tp", i): [] for i in range(len(prompts))}
    outputs: dict[Any, list[int]] = {k: [] for k in stamps}
    usage: list[float] = []
    while rt.has_work():
        events = rt.step()
        now = time.perf_counter()
        for e in events:
            if e.finish_reason == "error":
                raise RuntimeError(f"request {e.request_id} failed: {e.error}")
            if e.token_ids:
                stamps[e.request_id].append(now)
                outputs[e.request_id] += e.token_ids
        if hasattr(rt, "stats"):
            usage.append(rt.stats().get("kv_cache_usage", 0.0))
    wall = time.perf_counter() - start
    after = rt.stats() if hasattr(rt, "stats") else {}
    _set_reuse(rt, was)
    total = sum(len(o) for o in outputs.values())
    ttft = [(s[0] - start) * 1000 for s in stamps.values() if s]
    itl = [(b - a) * 1000 for s in stamps.values() for a, b in zip(s, s[1:])]
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None

    def delta(key):
        return after[key] - before[key] if key in after and key in before else None

    return {"input_tokens": inp, "output_tokens": out, "requests": len(prompts), "shared_prefix": settings.shared_prefix,
            "reuse": reuse, "seconds": wall, "output_tokens_total": total,
            "output_tokens_per_s": total / wall, "requests_per_s": len(prompts) / wall,
            "ttft_ms": percentiles(ttft), "itl_ms": percentiles(itl), "itl_max_ms": max(itl, default=None),
            "kv_usage_mean": sum(usage) / len(usage) if usage else None, "kv_usage_peak": max(usage, default=None),
            "preemptions": delta("preemptions"), "prefix_cache_hits": delta("prefix_cache_hits"),
            "prefix_cache_queries": delta("prefix_cache_queries"), "peak_memory_gib": peak,
            "_outputs": [outputs[k] for k in sorted(outputs, key=lambda k: k[1])]}


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50 / p90 / p99 (nearest rank) and the mean of ``values``; None each when there are none."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "mean": sum(s) / len(s)}
