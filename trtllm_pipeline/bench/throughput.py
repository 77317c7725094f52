"""``bench --in-process --throughput``: N requests submitted at once through the runtime's own scheduler.

For each input/output length pair, ``requests`` prompts of exactly that many random tokens, each forced to its
output length (min = max tokens, no end id), all submitted before the first step; the runtime's scheduler
admits, batches, chunks, preempts as it would under load, and this loop only steps it and stamps each token.
Reported per run: output tokens/s and requests/s over the whole run (first submit to last token), TTFT and ITL
percentiles (ms; ITL: gaps between a request's consecutive tokens), the KV pool's usage (mean and peak over the
steps), preemptions, prefix-cache hits, peak GPU memory. The shared-prefix workload (``shared_prefix`` > 0): every
prompt is one common system prompt of that many tokens then distinct question tokens (the input length), run
without and then with the prefix cache (the torch runtime toggles it between the two runs), outputs compared.

The long-prompt workload (``long_prompt`` > 0, issue 31: a long prompt arriving must never stall the running
decodes by more than one chunk's time), instead of the runs above: ``requests`` requests of the one length pair
(at most the engine's batch less one: the long prompt needs a row) decode; once every one has its first token and
``LONG_WARMUP_STEPS`` more steps ran, ``LONG_STEADY_STEPS`` steps of steady decode are timed, then one prompt of
``long_prompt`` random tokens is submitted and the engine stepped until its first token. Every running request's
inter-token gaps (host clock, as each step hands its tokens out: on CUDA after the step's sync, what a client
sees) are kept: the steady ITL p50 before the long prompt, the worst and p99 gap while it was prefilled (from its
submit to its first token), the steps and chunks its prefill took (the torch scheduler's ``computed`` read before
and after each step) against ``ceil(prompt / chunk budget)``, where the budget is what a step leaves a prefill
beside the decodes (``min(max_num_tokens - decodes, prefill_chunk_tokens)``), the p50 time of the steps that
carried a chunk, the request-steps in which a running request got no token, and the verdict
``worst gap <= longest chunk step + steady ITL p50`` (a gap no longer than one chunk's step). The prefix cache is
off for it (random prompts hit nothing; its chunk count stays the plan's).

Results file (JSON, ``schema`` ``throughput-1``): ``settings``, ``runtime`` (its ``describe()``), ``runs`` (empty
with ``long_prompt``), ``long_prompt`` (only then: ``_long_prompt_run``'s figures), and ``reference``:
TensorRT-LLM's published figures for Llama-3.1-8B FP8 on one H200 (labelled: another model and engine, for scale
only).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from pathlib import Path
from typing import Any, Callable

from trtllm_pipeline import artifacts
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.results import THROUGHPUT_PREFIX, THROUGHPUT_SCHEMA, runtime_line
from trtllm_pipeline.runtimes.base import Runtime, SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime

# TensorRT-LLM perf-overview, trtllm-bench, Llama-3.1-8B FP8 on one H200: output tokens/s by (input, output).
REFERENCE = {"source": "TensorRT-LLM perf-overview (trtllm-bench), Llama-3.1-8B FP8, 1x H200",
             "output_tokens_per_s": {"128/2048": 26221, "500/2000": 20770, "1000/1000": 17744, "2048/2048": 12194,
                                     "2048/128": 3538}}

LONG_WARMUP_STEPS = 4  # long-prompt workload: steps after every decode's first token before the steady window
LONG_STEADY_STEPS = 32  # steps of steady decode timed before the long prompt is submitted


@dataclasses.dataclass(frozen=True)
class ThroughputSettings:
    lengths: tuple[tuple[int, int], ...] = ((128, 128),)
    requests: int = 64
    shared_prefix: int = 0  # tokens of a common system prompt before each prompt's own input tokens
    long_prompt: int = 0  # tokens of one prompt submitted beside the decodes (the long-prompt workload), 0: none
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
        if self.long_prompt:
            self._check_long_prompt(rt)

    def _check_long_prompt(self, rt: Runtime) -> None:
        if len(self.lengths) != 1:
            raise InputError(f"--long-prompt runs beside one --lengths pair (the decodes); {len(self.lengths)} given.",
                             fix="pass one pair, e.g. --lengths 128/512")
        if self.shared_prefix:
            raise InputError("--long-prompt and --shared-prefix are separate workloads.", fix="drop one of them")
        max_input = getattr(rt, "max_input_len", rt.max_seq_len - 1)
        limit = min(max_input, rt.max_seq_len - 1)
        if self.long_prompt > limit:
            raise InputError(f"--long-prompt {self.long_prompt}: this build takes prompts of at most {limit} tokens "
                             f"(build.max_input_len {max_input}; max_seq_len {rt.max_seq_len} less one output token).",
                             fix=f"use --long-prompt {limit} or less, or rebuild with larger build.max_input_len and "
                                 "build.max_seq_len")
        if rt.max_batch_size < 2:
            raise InputError("--long-prompt needs a row beside at least one decoding request; this build's "
                             "build.max_batch_size is 1.", fix="rebuild with build.max_batch_size 2 or more")
        (inp, out), decodes = self.lengths[0], long_prompt_decodes(rt, self.requests)
        budget = chunk_budget(rt, decodes)
        if budget is not None and budget < 1:
            raise InputError(f"{decodes} decoding requests fill this build's build.max_num_tokens: no step would "
                             "carry any of the long prompt.", fix="pass fewer --requests")
        steps = LONG_WARMUP_STEPS + LONG_STEADY_STEPS + (math.ceil(self.long_prompt / budget) if budget else 0) + 2
        if out < steps:
            raise InputError(f"--lengths {inp}/{out}: the decodes would end before the long prompt's prefill does "
                             f"(they need {steps} output tokens).", fix=f"use --lengths {inp}/{steps} or longer")


def long_prompt_decodes(rt: Runtime, requests: int) -> int:
    """Decoding requests beside the long prompt: ``requests``, at most the engine's batch less the long prompt's row."""
    return max(1, min(requests, rt.max_batch_size - 1))


def chunk_budget(rt: Runtime, decodes: int) -> int | None:
    """Prompt tokens one step gives a prefill beside ``decodes`` one-token decodes (the torch scheduler: decodes
    first, in admission order, then prefill chunks up to ``prefill_chunk_tokens``, all under ``max_num_tokens``);
    None for a runtime without that scheduler."""
    sched = getattr(rt, "scheduler", None)
    if sched is None or not hasattr(sched, "max_num_tokens"):
        return None
    return min(sched.max_num_tokens - decodes, sched.prefill_chunk_tokens)


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
    if not data["runs"]:  # the long-prompt workload alone
        return long_prompt_lines(data.get("long_prompt")) + [runtime_line(data["runtime"])]
    lines = [f"{'in/out':>10} {'reqs':>5} {'prefix':>8} {'out tok/s':>10} {'req/s':>7} {'TTFT p50':>9} "
             f"{'p99':>8} {'ITL p50':>8} {'p99':>7} {'KV peak':>7} {'preempt':>7} {'peak GiB':>8} {'+GiB':>5} "
             f"{'TRT-LLM*':>9}"]
    for r in data["runs"]:
        pair = f"{r['input_tokens']}/{r['output_tokens']}"
        prefix = "-" if not r["shared_prefix"] else f"{r['shared_prefix']}{'+reuse' if r['reuse'] else ''}"
        lines.append(f"{pair:>10} {r['requests']:>5} {prefix:>8} {r['output_tokens_per_s']:>10.0f} "
                     f"{r['requests_per_s']:>7.2f} {r['ttft_ms']['p50']:>9.1f} {r['ttft_ms']['p99']:>8.1f} "
                     f"{r['itl_ms']['p50']:>8.2f} {r['itl_ms']['p99']:>7.2f} "
                     f"{cell(r['kv_usage_peak'] and 100 * r['kv_usage_peak'], '6.0f'):>6}% {cell(r['preemptions'], 'd'):>7} "
                     f"{cell(r['peak_memory_gib'], '8.2f'):>8} {cell(r.get('workspace_gib'), '5.2f'):>5} "
                     f"{cell(ref.get(pair), 'd'):>9}")
    lines += agreement_lines(data["runs"])
    lines.append(runtime_line(data["runtime"]))
    if any(r.get("workspace_gib") is not None for r in data["runs"]):
        lines.append("+GiB: the peak above what the engine holds throughout (weights with the embedding, KV pool)")
    if ref:
        lines.append(f"* reference only, another model and engine: {data['reference']['source']}")
    return lines


def agreement_lines(runs: list[dict[str, Any]]) -> list[str]:
    """Per run with the prefix cache, how many greedy outputs equal those without it (``_agreement``)."""
    lines = []
    for r in runs:
        share = r.get("same_output_share")
        if share is None:
            continue
        parts = r.get("first_difference_mean")
        lines.append(f"{r['input_tokens']}/{r['output_tokens']} with reuse: {share:.1%} of greedy outputs identical "
                     "to those without" + (f" (the others part at token {parts:.1f} on average)" if parts else ""))
    return lines


def long_prompt_lines(lp: dict[str, Any] | None) -> list[str]:
    """The long-prompt workload's figures, a few lines for the terminal (none without it)."""
    if not lp:
        return []

    def ms(value, spec=".1f"):
        return "n/a" if value is None else format(value, spec)

    chunks = "n/a" if lp["prefill_chunks"] is None else f"{lp['prefill_chunks']} (plan {lp['expected_chunks']})"
    skipped = lp["decode_rows_without_token"]
    verdict = "yes" if lp["within_one_chunk"] else "no"
    return [f"long prompt: {lp['prompt_tokens']} tokens beside {lp['decoding_requests']} decoding requests "
            f"({lp['input_tokens']}/{lp['output_tokens']}); chunk budget {ms(lp['chunk_budget'], 'd')} tokens a step "
            f"(max_num_tokens {ms(lp['max_num_tokens'], 'd')}, "
            f"prefill_chunk_tokens {ms(lp['prefill_chunk_tokens'], 'd')})",
            f"  prefill: {lp['prefill_steps']} steps, chunks {chunks}, TTFT {ms(lp['ttft_ms'])} ms; "
            f"chunk step p50 {ms(lp['chunk_step_ms']['p50'])} ms (max {ms(lp['chunk_step_ms']['max'])})",
            f"  running requests: steady ITL p50 {ms(lp['steady_itl_ms']['p50'], '.2f')} ms; during the prefill "
            f"worst gap {ms(lp['worst_gap_ms'])} ms, p99 {ms(lp['gap_ms']['p99'])} ms; fewest tokens "
            f"{lp['tokens_during_prefill']['min']} over its {lp['prefill_steps']} steps"
            + (f", {skipped} request-steps without a token" if skipped else ", a token every step"),
            f"  worst gap <= longest chunk step + steady ITL ({ms(lp['limit_ms'])} ms): {verdict}"]


def run_throughput(cfg: BuildConfig, *, engines_dir: Path, settings: ThroughputSettings, output: Path | None = None,
                   progress: Callable[[str], None] = print) -> ThroughputResult:
    """Load the build's runtime here, run every workload of ``settings`` through its scheduler, write the results."""
    rt = load_runtime(cfg, engines_dir)
    try:
        settings.check(rt)
        info = rt.describe()
        started = artifacts.now_iso()
        list(rt.stream([1] * 8, SamplingParams(max_tokens=4, end_id=-1), request_id="warm-up"))
        runs, long_prompt = [], None
        if settings.long_prompt:
            (inp, out), = settings.lengths
            progress(f"bench --throughput: a {settings.long_prompt}-token prompt beside "
                     f"{long_prompt_decodes(rt, settings.requests)} requests decoding {inp}/{out}")
            long_prompt = _long_prompt_run(rt, inp, out, settings)
            progress(f"  its prefill took {long_prompt['prefill_steps']} steps")
        for inp, out in ([] if settings.long_prompt else settings.lengths):
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
                on.update(_agreement(on.pop("_outputs"), off.pop("_outputs")))
        resident = resident_gib(info)
        for run in runs:
            run.pop("_outputs", None)
            run["resident_gib"] = resident
            run["workspace_gib"] = (run["peak_memory_gib"] - resident
                                    if run["peak_memory_gib"] is not None and resident is not None else None)
    finally:
        rt.close()
    data = {"schema": THROUGHPUT_SCHEMA,
            "settings": {**dataclasses.asdict(settings), "config": cfg.name, "started_at": started,
                         "finished_at": artifacts.now_iso()},
            "runtime": info, "runs": runs, **({"long_prompt": long_prompt} if long_prompt else {}),
            "reference": REFERENCE}
    name = "-".join(f"{i}x{o}" for i, o in settings.lengths)[:80]
    suffix = "-prefix" if settings.shared_prefix else f"-long{settings.long_prompt}" if settings.long_prompt else ""
    path = output or (artifacts.artifact_paths(engines_dir, cfg.name).bench / f"{THROUGHPUT_PREFIX}{name}{suffix}.json")
    artifacts.write_json_atomic(path, data)
    return ThroughputResult(path, data)


def resident_gib(info: dict[str, Any]) -> float | None:
    """GiB the engine holds on its (first) device for the whole run: weights, embedding included, and the KV pool
    (``memory`` of rank 0). The issue's memory goal reads a run's peak against it: at most 2 GiB more."""
    ranks = info.get("ranks") or []
    memory = ranks[0].get("memory") if ranks else None
    return sum(memory.values()) / 2**30 if memory else None


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
    ids = _token_ids(rt)
    system = [rng.choice(ids) for _ in range(settings.shared_prefix)]
    prompts = [system + [rng.choice(ids) for _ in range(inp)] for _ in range(settings.requests)]
    device = getattr(rt, "device", None)
    cuda = getattr(device, "type", None) == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    was = _set_reuse(rt, reuse)
    before = {**(rt.stats() if hasattr(rt, "stats") else {}), **_phases(rt)}
    params = SamplingParams(max_tokens=out, min_tokens=out, end_id=-1)
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        rt.submit(("tp", i), p, params)
    stamps: dict[Any, list[float]] = {("tp", i): [] for i in range(len(prompts))}
    outputs: dict[Any, list[int]] = {k: [] for k in stamps}
    usage: list[float] = []
    while rt.has_work():
        _step(rt, stamps, outputs)
        if hasattr(rt, "stats"):
            usage.append(rt.stats().get("kv_cache_usage", 0.0))
    wall = time.perf_counter() - start
    after = {**(rt.stats() if hasattr(rt, "stats") else {}), **_phases(rt)}
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
            # engine steps, and those launched chained on the previous one's argmax (the GPU never waiting on the host)
            "steps": delta("steps"), "chained_steps": delta("chained_steps"), **_step_times(delta, wall),
            "_outputs": [outputs[k] for k in sorted(outputs, key=lambda k: k[1])]}


def _step_times(delta: Callable[[str], Any], wall: float) -> dict[str, Any]:
    """Where a step's wall time went on the host (the torch runtime's ``phase_times``), in ms a step: ``plan``
    (drafts, schedule), ``eager`` (prefill chunks' forwards and their sampling, which waits for the device), ``fast``
    (launching the fast rows and waiting for their tokens); the rest of ``wall`` is this loop's and the events'. Also
    the prompts' first chunks run from a prefill graph and the tokens through the eager forward. Empty for another
    runtime."""
    steps = delta("steps")
    if not steps:
        return {}
    return {"wall_ms_per_step": 1000 * wall / steps,
            "host_ms_per_step": {k: 1000 * delta(f"{k}_s") / steps for k in ("plan", "eager", "fast")},
            "graph_prefills": delta("graph_prefills"), "eager_tokens": delta("eager_tokens")}


def _phases(rt: Runtime) -> dict[str, float]:
    """The torch runtime's step counts (``phase_times``); empty for another runtime."""
    return rt.phase_times() if hasattr(rt, "phase_times") else {}


def _token_ids(rt: Runtime) -> list[int]:
    """The ids random prompts are drawn from: the vocabulary (its first 50,000) less the special tokens."""
    vocab = min(len(rt.tokenizer), getattr(rt, "vocab_size", None) or len(rt.tokenizer))
    special = set(getattr(rt.tokenizer, "all_special_ids", []))
    return [i for i in range(min(vocab, 50_000)) if i not in special]


def _step(rt: Runtime, stamps: dict[Any, list[float]], outputs: dict[Any, list[int]]) -> tuple[float, set]:
    """One step of the runtime: each request's new tokens recorded and stamped with the host clock as the step
    hands them out. Returns that time and the requests that got a token."""
    events = rt.step()
    now = time.perf_counter()
    got = set()
    for e in events:
        if e.finish_reason == "error":
            raise RuntimeError(f"request {e.request_id} failed: {e.error}")
        if e.token_ids:
            stamps.setdefault(e.request_id, []).append(now)
            outputs.setdefault(e.request_id, []).extend(e.token_ids)
            got.add(e.request_id)
    return now, got


def _computed(rt: Runtime, request_id: Any) -> int | None:
    """Prompt tokens of ``request_id`` in the torch runtime's cache (0 while it waits); None for another runtime."""
    sched = getattr(rt, "scheduler", None)
    if sched is None or not hasattr(sched, "running"):
        return None
    return next((seq.computed for seq in sched.running if seq.request_id == request_id), 0)


def _long_prompt_run(rt: Runtime, inp: int, out: int, settings: ThroughputSettings) -> dict[str, Any]:
    """Decodes at steady state, then one long prompt: the running requests' gaps while it is prefilled."""
    rng = random.Random(settings.seed * 1_000_003 + inp * 1009 + out + settings.long_prompt * 7)
    ids = _token_ids(rt)
    n = long_prompt_decodes(rt, settings.requests)
    decodes = [("lp", i) for i in range(n)]
    prompts = [[rng.choice(ids) for _ in range(inp)] for _ in decodes]
    long_id, long_tokens = ("long-prompt",), [rng.choice(ids) for _ in range(settings.long_prompt)]
    stamps: dict[Any, list[float]] = {r: [] for r in decodes}
    outputs: dict[Any, list[int]] = {r: [] for r in decodes}
    was = _set_reuse(rt, False)
    try:
        params = SamplingParams(max_tokens=out, min_tokens=out, end_id=-1)
        for rid, p in zip(decodes, prompts):
            rt.submit(rid, p, params)
        # steady decode: every request has its first token, then the warm-up steps, then the timed ones
        while any(not stamps[r] for r in decodes) and rt.has_work():
            _step(rt, stamps, outputs)
        steady_from = None
        for i in range(LONG_WARMUP_STEPS + LONG_STEADY_STEPS):
            now, _ = _step(rt, stamps, outputs)
            if i == LONG_WARMUP_STEPS - 1:
                steady_from = now
        before = rt.stats() if hasattr(rt, "stats") else {}
        running = [r for r in decodes if len(outputs[r]) < out]
        submitted = time.perf_counter()
        rt.submit(long_id, long_tokens, SamplingParams(max_tokens=1, min_tokens=1, end_id=-1))
        steps = []  # (seconds, prompt tokens it carried or None, running requests that got no token)
        while not stamps.get(long_id):
            if not rt.has_work():
                raise RuntimeError("the long prompt ended without a token")
            active = {r for r in running if len(outputs[r]) < out}
            done = _computed(rt, long_id)
            t0 = time.perf_counter()
            now, got = _step(rt, stamps, outputs)
            # the prompt tokens this step cached (all the rest when its token came; 0 if it was preempted)
            chunk = None if done is None else max(0, (len(long_tokens) if long_id in got
                                                      else _computed(rt, long_id)) - done)
            steps.append((now - t0, chunk, len(active - got)))
        first = stamps[long_id][0]
        after = rt.stats() if hasattr(rt, "stats") else {}
    finally:
        for rid in decodes + [long_id]:
            rt.cancel(rid)
        while rt.has_work():
            rt.step()
        _set_reuse(rt, was)

    def gaps(lo: float, hi: float) -> list[float]:
        return [(b - a) * 1000 for r in running for a, b in zip(stamps[r], stamps[r][1:]) if lo < b <= hi]

    steady, during = gaps(steady_from, submitted), gaps(submitted, first)
    known = all(c is not None for _, c, _ in steps)
    chunk_steps = [s for s, c, _ in steps if c] if known else [s for s, _, _ in steps]
    chunk_ms = [1000 * s for s in chunk_steps]  # in step order
    step_p50 = percentiles(chunk_ms)["p50"]
    sched = getattr(rt, "scheduler", None)
    budget = chunk_budget(rt, len(running))
    steady_p50 = percentiles(steady)["p50"]
    worst = max(during, default=None)
    # one chunk's time: the longest step that carried a chunk (later chunks attend over the earlier ones, so they
    # cost more than the first: the p50 undercounts them), plus a steady token's time for the gap's ends
    longest = max(chunk_ms, default=None)
    limit = longest + steady_p50 if longest is not None and steady_p50 is not None else None
    counts = [sum(1 for b in stamps[r] if submitted < b <= first) for r in running]
    return {"prompt_tokens": len(long_tokens), "input_tokens": inp, "output_tokens": out,
            "decoding_requests": len(running),
            "max_num_tokens": getattr(sched, "max_num_tokens", None),
            "prefill_chunk_tokens": getattr(sched, "prefill_chunk_tokens", None), "chunk_budget": budget,
            "expected_chunks": math.ceil(len(long_tokens) / budget) if budget and budget > 0 else None,
            "prefill_steps": len(steps), "prefill_chunks": sum(1 for _, c, _ in steps if c) if known else None,
            "chunk_tokens": [c for _, c, _ in steps if c] if known else None,
            "ttft_ms": (first - submitted) * 1000, "steady_steps": LONG_STEADY_STEPS,
            "steady_itl_ms": percentiles(steady), "gap_ms": {**percentiles(during), "max": worst},
            "worst_gap_ms": worst, "p99_gap_ms": percentiles(during)["p99"],
            "chunk_step_ms": {"p50": step_p50, "max": max(chunk_ms, default=None), "all": chunk_ms},
            "tokens_during_prefill": {"min": min(counts, default=None), "max": max(counts, default=None)},
            "decode_rows_without_token": sum(m for _, _, m in steps),
            "preemptions": (after["preemptions"] - before["preemptions"]
                            if "preemptions" in after and "preemptions" in before else None),
            "limit_ms": limit, "within_one_chunk": worst is not None and limit is not None and worst <= limit}


def _agreement(with_reuse: list[list[int]], without: list[list[int]]) -> dict[str, Any]:
    """How far the greedy outputs with the prefix cache agree with those without: all identical, the share of
    identical requests, and where the others part (mean index of the first differing token). Low-precision K/V
    computed in other batch shapes can flip a near tie of a model's logits (a random model's, often), so the share
    says more than the one flag."""
    same = [a == b for a, b in zip(with_reuse, without)]
    parts = [next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) for a, b, s in zip(with_reuse, without, same)
             if not s and any(x != y for x, y in zip(a, b))]
    return {"same_outputs_as_without_reuse": all(same), "same_output_share": sum(same) / len(same) if same else None,
            "first_difference_mean": sum(parts) / len(parts) if parts else None}


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50 / p90 / p99 (nearest rank) and the mean of ``values``; None each when there are none."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "mean": sum(s) / len(s)}
