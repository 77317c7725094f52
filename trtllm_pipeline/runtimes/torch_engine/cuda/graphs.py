"""CUDA graphs of the decode step, one per batch bucket, replayed with the step's inputs copied in.

A decode step is ~230 small kernels; launched one by one from Python the host cannot keep up with the
GPU (17-29 ms/token at the 7B shape, against ~2 ms of GPU work). Captured once per batch size in a
CUDA graph, a step is one launch. Batches are padded up to the next bucket (powers of two up to
``max_batch_size``): padding rows decode a dummy token at position 0 of the null block (``kv_cache``), which
no request owns, so they cost a little bandwidth and change nothing. Each row's block table is a column of the
step's inputs ([2 + W, B]: tokens, positions, tables of W = max_seq_len / block size entries), copied in with
them in one transfer. Without CUDA (the Triton interpreter in the
CPU tests) the same class runs the kernels directly, so the padding logic is tested everywhere.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import Sequence

import torch

from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import DecodeStep, StepBuffers
from trtllm_pipeline.runtimes.torch_engine.plan import decode_inputs

log = logging.getLogger(__name__)


def batch_buckets(max_batch_size: int, sizes: Sequence[int] | None = None) -> list[int]:
    """The batch sizes to capture: ``sizes`` if given, else powers of two, always up to the maximum."""
    if sizes:
        chosen = {int(s) for s in sizes if 1 <= int(s) <= max_batch_size}
    else:
        chosen = {1 << i for i in range(max_batch_size.bit_length()) if 1 << i <= max_batch_size}
    chosen.add(max_batch_size)
    return sorted(chosen)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``n`` rows."""
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"{n} rows exceed the largest captured batch {buckets[-1]}")
    return buckets[i]


class DecodeGraphs:
    """Decode steps for any batch up to ``buckets[-1]``, each bucket captured once (on CUDA)."""

    def __init__(self, step: DecodeStep, buckets: Sequence[int], *, use_graphs: bool = True):
        self.step = step
        self.buckets = list(buckets)
        self.width = step.engine.slot_blocks  # block table entries a row can have (max_seq_len / block size)
        self.use_graphs = use_graphs and step.engine.device.type == "cuda"
        self.buffers: dict[int, StepBuffers] = {}
        self.staging: dict[int, torch.Tensor] = {}  # pinned host copies of each bucket's inputs
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.setup_seconds = 0.0

    def prepare(self) -> None:
        """Compile every kernel for every bucket and capture the graphs (once per process)."""
        start = time.perf_counter()
        for batch in reversed(self.buckets):  # largest first: later captures reuse its memory
            buf = self.buffers[batch] = self.step.buffers(batch)
            pinned = self.use_graphs  # pinned memory needs a CUDA device
            self.staging[batch] = torch.zeros((2 + self.width, batch), dtype=torch.long, pin_memory=pinned)
            self._fill(batch, torch.zeros((2 + self.width, 0), dtype=torch.long))
            self.step.run(buf)  # compiles the kernels outside the capture
            if self.use_graphs:
                self.step.pin_carveout(buf)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self.step.run(buf)
                self.graphs[batch] = graph
        if self.use_graphs:
            torch.cuda.synchronize()
        self.setup_seconds = time.perf_counter() - start
        log.info("fast decode path ready: %d batch buckets %s, %s, in %.1f s", len(self.buckets), self.buckets,
                 "CUDA graphs" if self.use_graphs else "direct launches", self.setup_seconds)

    def decode(self, tokens: Sequence[int], tables: Sequence[Sequence[int]], positions: Sequence[int]) -> torch.Tensor:
        """Float32 logits [len(tokens), vocab] of one decode step: row i's token at ``positions[i]``, its K/V in
        the blocks ``tables[i]`` (a view valid until the next call)."""
        return self.decode_padded(decode_inputs(tokens, tables, positions, len(tokens), self.width))

    def decode_padded(self, rows: torch.Tensor) -> torch.Tensor:
        """``decode`` of the inputs as ``plan.decode_inputs`` lays them out ([2 + width, n] int64)."""
        if not self.buffers:
            self.prepare()
        n = rows.shape[1]
        batch = bucket_for(n, self.buckets)
        buf = self.buffers[batch]
        self._fill(batch, rows)
        if self.use_graphs:
            self.graphs[batch].replay()
        else:
            self.step.run(buf)
        return buf.logits[:n]

    def weight_bytes(self) -> int:
        """Bytes of weights a step reads (this engine's; a tensor-parallel rank's shard)."""
        return self.step.weight_bytes()

    def greedy(self, n: int) -> torch.Tensor:
        """The argmax tokens of the last ``decode`` of ``n`` rows, computed inside the step."""
        return self.buffers[bucket_for(n, self.buckets)].greedy[:n]

    def _fill(self, batch: int, rows: torch.Tensor) -> None:
        # The previous step's tokens were read back before this one is filled, so the pinned
        # buffer is free and the copy can run asynchronously, ahead of the replay on the stream.
        staging = self.staging[batch]
        staging[:, rows.shape[1] :] = 0  # padding rows: token 0 at position 0 of the null block
        staging[:, : rows.shape[1]] = rows
        self.buffers[batch].inputs.copy_(staging, non_blocking=True)


def prepared(engine, buckets: Sequence[int], *, use_graphs: bool = True,
             step: DecodeStep | None = None) -> DecodeGraphs:
    """The fast decode path over ``engine`` (or its already built ``step``), compiled and captured;
    ``decode_step.Unsupported`` if it cannot run it. A tensor-parallel rank's engine gets its collectives in
    the step, so every rank of the group must prepare, and then decode, in step with the others."""
    graphs = DecodeGraphs(step or DecodeStep(engine), buckets, use_graphs=use_graphs)
    graphs.prepare()
    return graphs
