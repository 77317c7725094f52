"""``bench --in-process --speculative METHOD``: plain decoding against speculative decoding, same runtime, same prompts.

For each workload and batch: ``batch`` greedy requests of ``output_tokens`` tokens (no end id, so both runs make
the same number), first with speculation off (the loaded runtime's speculator disabled), then on, ``repeats`` times
in turn, the fastest run of each kept (one run of 128 tokens on a small model is ~50-170 ms: a single one carries
the order it ran in and the machine's noise); output tokens/s over the whole generation (prefill included, the same
in both), the speedup, and from ``Runtime.stats()`` over the kept speculative run: tokens drafted and accepted,
verify rows, the acceptance length (mean tokens a verify row emitted: 1 + accepted / rows).
The outputs of the two runs are compared token for token (``identical``: greedy speculation must not change them).

Workloads: ``grounded``: rewrite / summarise / answer-from-passage prompts (``passages``: text shipped with the
package), through the tokenizer's chat template where it has one: the output copies from the input, where prompt
lookup pays; ``random``: prompts of random token ids, where lookups rarely hit and adaptive drafting should make
speculation cost (nearly) nothing.

Results file (JSON, ``schema`` ``speculative-1``): ``settings``, ``runtime`` (its ``describe()``), ``runs``.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path
from typing import Any, Callable

from trtllm_pipeline import artifacts
from trtllm_pipeline.bench.passages import grounded_texts
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime

SCHEMA = "speculative-1"
WORKLOADS = ("grounded", "random")
SPEC_KEYS = ("spec_decode_draft_tokens", "spec_decode_accepted_tokens", "spec_decode_verify_rows")


@dataclasses.dataclass(frozen=True)
class SpeculativeSettings:
    method: str = "ngram"
    num_draft_tokens: int = 4
    draft_checkpoint: str | None = None
    batches: tuple[int, ...] = (1,)
    workloads: tuple[str, ...] = WORKLOADS
    output_tokens: int = 128
    random_tokens: int = 256  # the random workload's prompt length (about a grounded prompt's)
    seed: int = 1234
    repeats: int = 3  # runs of each mode, alternating; the fastest of each is reported

    def runtime_overrides(self) -> dict[str, Any]:
        spec = {"method": self.method, "num_draft_tokens": self.num_draft_tokens}
        if self.draft_checkpoint:
            spec["draft_checkpoint"] = self.draft_checkpoint
        return {"speculative": spec}

    def check(self) -> None:
        if bad := [w for w in self.workloads if w not in WORKLOADS]:
            raise InputError(f"unknown workload {bad[0]!r}.", fix=f"use {', '.join(WORKLOADS)}")
        if not self.batches or min(self.batches) < 1 or self.output_tokens < 1 or self.repeats < 1:
            raise InputError("--batch values, --output-tokens and the repeats must be at least 1.")


@dataclasses.dataclass
class SpeculativeResult:
    path: Path
    data: dict[str, Any]

    def table(self) -> list[str]:
        lines = [f"{'workload':>9} {'batch':>5} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>7} "
                 f"{'accept len':>10} {'drafted':>8} {'accepted':>8} {'same':>5}"]
        for r in self.data["runs"]:
            lines.append(f"{r['workload']:>9} {r['batch']:>5} {r['plain_tokens_per_s']:>11.1f} "
                         f"{r['spec_tokens_per_s']:>10.1f} {r['speedup']:>6.2f}x {r['acceptance_length']:>10.2f} "
                         f"{r['draft_tokens']:>8} {r['accepted_tokens']:>8} {str(r['identical']):>5}")
        rt = self.data["runtime"]
        lines.append(f"runtime {rt.get('runtime')} on {rt.get('device')}; decode: {rt.get('decode_path')}; "
                     f"speculative: {rt.get('speculative')}")
        return lines


def run_speculative(cfg: BuildConfig, *, engines_dir: Path, settings: SpeculativeSettings,
                    output: Path | None = None, progress: Callable[[str], None] = print) -> SpeculativeResult:
    settings.check()
    rt = load_runtime(cfg.with_runtime(**settings.runtime_overrides()), engines_dir)
    try:
        speculator = getattr(rt, "speculator", None)
        if speculator is None:
            raise InputError(f"runtime {rt.name} has no speculative decoding.", fix="bench the torch runtime")
        if max(settings.batches) > rt.max_batch_size:
            raise InputError(f"batch {max(settings.batches)} exceeds build.max_batch_size {rt.max_batch_size}.")
        info = rt.describe()
        started = artifacts.now_iso()
        _generate(rt, [[1] * 8], 4)  # one-time costs (allocator, kernels) outside the clock
        runs = []
        for workload in settings.workloads:
            for batch in settings.batches:
                prompts = _prompts(rt, workload, batch, settings)
                plain, plain_s, spec, spec_s, delta = _best_runs(rt, speculator, prompts, settings)
                tokens = sum(len(t) for t in spec)
                rows = delta["spec_decode_verify_rows"]
                run = {"workload": workload, "batch": batch, "prompt_tokens": sum(len(p) for p in prompts) / batch,
                       "output_tokens": tokens, "plain_s": plain_s, "spec_s": spec_s,
                       "plain_tokens_per_s": sum(len(t) for t in plain) / plain_s,
                       "spec_tokens_per_s": tokens / spec_s, "speedup": plain_s / spec_s,
                       "draft_tokens": delta["spec_decode_draft_tokens"],
                       "accepted_tokens": delta["spec_decode_accepted_tokens"], "verify_rows": rows,
                       "acceptance_length": 1 + delta["spec_decode_accepted_tokens"] / rows if rows else 1.0,
                       "identical": plain == spec}
                runs.append(run)
                progress(f"bench --in-process --speculative {settings.method}: {workload}, batch {batch}: "
                         f"{run['speedup']:.2f}x, acceptance length {run['acceptance_length']:.2f}")
    finally:
        rt.close()
    data = {"schema": SCHEMA, "settings": {**dataclasses.asdict(settings), "config": cfg.name, "started_at": started,
                                           "finished_at": artifacts.now_iso()},
            "runtime": info, "runs": runs}
    path = output or (artifacts.artifact_paths(engines_dir, cfg.name).bench
                      / f"speculative-{settings.method}-k{settings.num_draft_tokens}.json")
    artifacts.write_json_atomic(path, data)
    return SpeculativeResult(path, data)


def _prompts(rt, workload: str, batch: int, settings: SpeculativeSettings) -> list[list[int]]:
    return workload_prompts(rt.tokenizer, workload, batch, seed=settings.seed + batch,
                            random_tokens=settings.random_tokens)


def workload_prompts(tok, workload: str, count: int, *, seed: int, random_tokens: int = 256) -> list[list[int]]:
    """``count`` prompts of ``workload`` as token ids: grounded ones (``grounded_texts``) through the tokenizer's chat
    template where it has one, random ones of ``random_tokens`` non-special ids drawn from ``random.Random(seed)``
    (also read by benchmarks/spec_simulate.py, so that the study replays the bench's prompts)."""
    if workload == "grounded":
        texts = grounded_texts(count)
        if getattr(tok, "chat_template", None):
            return [list(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=True,
                                                 add_generation_prompt=True)) for t in texts]
        return [tok.encode(t) for t in texts]
    rng = random.Random(seed)
    special = set(getattr(tok, "all_special_ids", []))
    ids = [i for i in range(min(len(tok), 50_000)) if i not in special]
    return [[rng.choice(ids) for _ in range(random_tokens)] for _ in range(count)]


def _best_runs(rt, speculator, prompts, settings: SpeculativeSettings):
    """(plain outputs, fastest plain seconds, speculative outputs (every run's the same, else the first that is not),
    fastest speculative seconds, that run's counter deltas): ``settings.repeats`` runs of each, in turn."""
    plain_runs, spec_runs = [], []
    for _ in range(settings.repeats):
        speculator.enabled = False
        plain_runs.append(_timed(rt, prompts, settings.output_tokens))
        speculator.enabled = True
        before = rt.stats()
        out, seconds = _timed(rt, prompts, settings.output_tokens)
        after = rt.stats()
        spec_runs.append((out, seconds, {k: after.get(k, 0) - before.get(k, 0) for k in SPEC_KEYS}))
    plain, plain_s = min(plain_runs, key=lambda r: r[1])
    _, spec_s, delta = min(spec_runs, key=lambda r: r[1])
    outputs = [r[0] for r in plain_runs + spec_runs]
    spec = next((o for o in outputs if o != plain), plain)  # ``identical`` holds only if every run gave the same
    return plain, plain_s, spec, spec_s, delta


def _timed(rt, prompts, n: int) -> tuple[list[list[int]], float]:
    _sync(rt)
    start = time.perf_counter()
    out = _generate(rt, prompts, n)
    _sync(rt)
    return out, time.perf_counter() - start


def _generate(rt, prompts, n: int) -> list[list[int]]:
    return [c.token_ids for c in rt.generate(prompts, SamplingParams(max_tokens=n, end_id=-1))]


def _sync(rt) -> None:
    device = getattr(rt, "device", None)
    if getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.synchronize(device)
