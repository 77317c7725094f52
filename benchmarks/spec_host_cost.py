"""Host time per step of the torch runtime outside the model (executor forward + logits), plain vs speculative.

    .venv/bin/python benchmarks/spec_host_cost.py CHECKPOINT_DIR [--profile]

CHECKPOINT_DIR: the tiny model's (``tiny-qwen2-bf16-tp1``: ``trtllm-pipeline quantize -c
build_configs/tiny-qwen2-bf16-tp1.yaml``, then ENGINES/tiny-qwen2-bf16-tp1/checkpoint). On the CPU, float32, one
thread, batch 1, 128 tokens: the median over 5 runs of each mode of a step's wall time less the model's, then per
phase (us/step); ``--profile``: cProfile's callees of the phases. On the CPU the verify step's argmax over its 1 + k
rows counts as host time (on a GPU it is the device's). Issue 35: on a GPU a step with drafts cannot be chained, so
this host time is the GPU's idle time between verify steps.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

from trtllm_pipeline.config import SpeculativeSection
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine import plan as plan_module
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime
from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import NgramProposer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from spec_oracle import Oracle  # noqa: E402

PASSAGE = list(range(3000, 3060))
# a prompt that repeats, a generated text that (tiny model) does not: lookups hit in the prompt a little
PROMPTS = [PASSAGE * 4 + [7, 8] + PASSAGE[:6]]
RUNS = 5
PHASES = ("_propose", "_settle", "_verify", "_record_verified", "_forward", "_split", "_run_eager", "_sample",
          "_record_all")


class OracleNgram(NgramProposer):
    """The real n-gram lookup (its cost counted), then ``tests/spec_oracle.Oracle``'s drafts: plain greedy's next
    tokens, every third wrong. The tiny model's own text never repeats, so a real lookup rarely hits; with these
    nearly every step verifies, with partial acceptance, rollback and the adaptive length at work."""

    oracle: Oracle | None = None

    def propose(self, batch):
        found = super().propose(batch)
        return found if self.oracle is None else self.oracle.propose(batch)


class ModelClock:
    """Seconds spent in the executor's forward and logits (the model), wrapped around both."""

    def __init__(self, rt: TorchRuntime):
        self.seconds = 0.0
        for name in ("forward", "logits"):
            setattr(rt.executor, name, self._timed(getattr(rt.executor, name)))

    def _timed(self, fn):
        def call(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t
        return call


def run(rt: TorchRuntime, clock: ModelClock, speculate: bool, tokens: int = 128) -> tuple[list[float], dict]:
    """One generation of every prompt: each step's host seconds outside the model (the prefill step left out) and
    the outputs."""
    rt.speculator.enabled = speculate
    for i, prompt in enumerate(PROMPTS):
        rt.submit(i, prompt, SamplingParams(max_tokens=tokens, end_id=-1))
    host, out, first = [], {i: [] for i in range(len(PROMPTS))}, True
    while rt.has_work():
        clock.seconds = 0.0
        t = time.perf_counter()
        events = rt.step()
        if not first:
            host.append(time.perf_counter() - t - clock.seconds)
        first = False
        for event in events:
            out[event.request_id] += event.token_ids
    return host, out


def phase_costs(rt: TorchRuntime, clock: ModelClock) -> None:
    """Microseconds per step by phase, plain and speculative (each phase's wall time, the model's included where it
    runs inside it)."""
    spent: collections.Counter = collections.Counter()

    def wrap(owner, name, key=None):
        fn = getattr(owner, name)

        def call(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key or name] += time.perf_counter() - t
        setattr(owner, name, call)

    for name in PHASES:
        wrap(rt, name)
    wrap(rt.scheduler, "schedule")
    wrap(rt.speculator, "propose", "speculator.propose")
    original = plan_module.PagedBatch.__dict__["of"]  # (the classmethod itself, put back as it was)
    wrap(plan_module.PagedBatch, "of", "PagedBatch.of")
    plan_module.PagedBatch.of = staticmethod(plan_module.PagedBatch.of)
    try:
        for speculate in (False, True):
            spent.clear()
            steps = sum(len(run(rt, clock, speculate)[0]) + 1 for _ in range(RUNS))
            print("spec" if speculate else "plain", "us/step by phase:",
                  {k: round(v / steps * 1e6) for k, v in sorted(spent.items())})
    finally:
        setattr(plan_module.PagedBatch, "of", original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="the tiny model's checkpoint directory")
    parser.add_argument("--profile", action="store_true", help="cProfile one speculative run's phases")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rt = TorchRuntime(args.checkpoint, args.checkpoint / "tokenizer", speculative=SpeculativeSection(method="ngram"),
                      max_batch_size=4, max_seq_len=1024, dtype="float32", kv_block_size=16)
    clock = ModelClock(rt)
    proposer = rt.speculator.proposer = OracleNgram()
    proposer.oracle = Oracle(run(rt, clock, False)[1])
    for _ in range(2):  # warm
        run(rt, clock, False)
        run(rt, clock, True)
    rows_before = rt.stats().get("spec_decode_verify_rows", 0)
    plain_host, spec_host = [], []
    for _ in range(RUNS):
        host, plain = run(rt, clock, False)
        plain_host += host
        host, spec = run(rt, clock, True)
        spec_host += host
    rows = rt.stats()["spec_decode_verify_rows"] - rows_before
    print(f"identical {plain == spec}; plain steps {len(plain_host) // RUNS}, spec steps {len(spec_host) // RUNS}, "
          f"verify rows/run {rows / RUNS:.0f}")
    print(f"host us/step outside the model: plain median {statistics.median(plain_host) * 1e6:.0f} mean "
          f"{statistics.mean(plain_host) * 1e6:.0f}; spec median {statistics.median(spec_host) * 1e6:.0f} mean "
          f"{statistics.mean(spec_host) * 1e6:.0f}")
    phase_costs(rt, clock)
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        run(rt, clock, True)
        profile.disable()
        pstats.Stats(profile).sort_stats("cumtime").print_callees(r"_verify|_settle|_propose|_run_eager|of\b|_sample$")


if __name__ == "__main__":
    main()
