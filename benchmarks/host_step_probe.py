"""The torch runtime's host time per step with the GPU's work taken away (issue 31): what a loaded step leaves the
GPU waiting for.

On the H200 (random 7B FP8, 256 rows a step, short contexts, 2026-12-04) a step took 12.2 ms where its kernels took
7.5 ms: the GPU waited ~40% of the time for the host, which between two steps samples, records and streams every
row's token, plans the next step and fills its inputs. Here the runtime runs as it does there (continuous batching,
the scheduler, the KV manager, ``DecodeGraphs``' table rows and inputs, sampling from the step's argmax), but its
decode step is a no-op that writes a next token per row: the time per step is host time alone, and ``--profile``
prints where it goes (cProfile, by function). Runs on the CPU, on the tiny checkpoint a test suite builds:

    python benchmarks/host_step_probe.py --checkpoint engines/tiny-qwen2-bf16-tp1/checkpoint --rows 256 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import pstats
import time
from pathlib import Path

import torch

from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import DecodeGraphs, batch_buckets, row_limit
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime


class _NoStep:
    """A decode step that runs no model: each row's next token is its token + 1 (mod the vocabulary)."""

    @dataclasses.dataclass
    class _Buffers:  # the fields of ``decode_step.StepBuffers`` that the host reads and writes
        batch: int
        inputs: torch.Tensor
        logits: torch.Tensor
        greedy: torch.Tensor
        attention_passes: int = 1

    def __init__(self, engine):
        self.engine = engine

    def buffers(self, batch: int, tables: torch.Tensor):
        # inputs: token, position, table row, ban (``StepBuffers.inputs``; the probe's requests ban nothing)
        return self._Buffers(batch, torch.zeros((4, batch), dtype=torch.long),
                             torch.zeros((batch, self.engine.embedding.shape[0])), torch.zeros(batch, dtype=torch.long))

    def run(self, buf) -> None:
        torch.remainder(buf.inputs[0] + 1, buf.logits.shape[1], out=buf.greedy)

    def weight_bytes(self) -> int:
        return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True, help="a torch-runtime checkpoint (its tokenizer beside)")
    ap.add_argument("--rows", type=int, default=256, help="requests decoding together")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=50, help="steps timed once every request decodes")
    ap.add_argument("--profile", action="store_true", help="cProfile the timed steps, top functions printed")
    ap.add_argument("--sort", default="tottime", help="the profile's order: tottime or cumulative")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    ckpt = args.checkpoint
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", device="cpu", max_batch_size=args.rows, max_seq_len=2048,
                      fast_decode=False)
    decoder = DecodeGraphs(_NoStep(rt.engine), batch_buckets(args.rows, limit=row_limit(rt.engine, 1)),
                           use_graphs=False)
    decoder.prepare()
    rt.attach_decoder(decoder)  # overlap and chaining as the runtime sets them for its own decoder
    params = SamplingParams(max_tokens=args.steps + 20, end_id=-1)
    for i in range(args.rows):
        rt.submit(i, [(7 * i + j) % 1000 + 10 for j in range(args.prompt_tokens)], params)
    while rt.scheduler.waiting or any(not r.decoding for r in rt.scheduler.running):
        rt.step()  # the prompts prefilled (eagerly: the tiny model), every request decoding after
    for _ in range(3):
        rt.step()
    profiler = cProfile.Profile() if args.profile else None
    before, chained = dict(rt.phase_s), rt.phase_rows["chained_steps"]
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    for _ in range(args.steps):
        rt.step()
    if profiler:
        profiler.disable()
    ms = (time.perf_counter() - start) * 1000 / args.steps
    phases = {k: (rt.phase_s[k] - before[k]) * 1000 / args.steps for k in before}
    chained = rt.phase_rows["chained_steps"] - chained
    print(f"host time per step at {args.rows} decoding rows (no model): {ms:.3f} ms "
          f"(plan {phases['plan']:.3f}, eager {phases['eager']:.3f}, fast {phases['fast']:.3f}; "
          f"{chained} of {args.steps} steps chained)")
    if profiler:
        stats = pstats.Stats(profiler)
        stats.sort_stats(args.sort).print_stats(30)
    if args.output:
        args.output.write_text(json.dumps({"rows": args.rows, "host_ms_per_step": ms, "phases_ms": phases,
                                           "chained_steps": chained, "steps": args.steps}, indent=1))
    rt.close()


if __name__ == "__main__":
    main()
