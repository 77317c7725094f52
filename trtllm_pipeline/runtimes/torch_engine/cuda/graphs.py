"""CUDA graphs of the decode step, one per batch bucket, replayed with the step's inputs copied in.

A decode step is ~230 small kernels; launched one by one from Python the host cannot keep up with the
GPU (17-29 ms/token at the 7B shape, against ~2 ms of GPU work). Captured once per batch size in a
CUDA graph, a step is one launch. Batches are padded up to the next bucket (powers of two up to
``max_batch_size``): padding rows decode a dummy token into a scratch cache slot that no request
owns, so they cost a little bandwidth and change nothing. Without CUDA (the Triton interpreter in the
CPU tests) the same class runs the kernels directly, so the padding logic is tested everywhere.

Look-ahead (``decode_ahead``): while a batch of greedy rows stays the same, the next step is launched before
the host has read this one's tokens, each row feeding back the token the step chose, on the device. The host's
work for a step (reading its tokens, the runtime's bookkeeping, streaming them out) then overlaps the GPU's next
step instead of sitting between steps. The tokens of every launch are copied to pinned host memory right after
its replay (``Launch.tokens`` waits on that copy's event alone, with the GIL released), so a launch ahead never
overwrites what the host has not read yet.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from typing import Sequence

import torch

from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import DecodeStep, StepBuffers

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


def padded_inputs(tokens: Sequence[int], slots: Sequence[int], positions: Sequence[int], batch: int,
                  scratch_slot: int) -> torch.Tensor:
    """[3, batch] int64 host tensor of tokens, slots and positions; padding rows use the scratch slot."""
    n = len(tokens)
    rows = torch.zeros((3, batch), dtype=torch.long)
    rows[0, :n] = torch.as_tensor(tokens, dtype=torch.long)
    rows[1, :n] = torch.as_tensor(slots, dtype=torch.long)
    rows[1, n:] = scratch_slot
    rows[2, :n] = torch.as_tensor(positions, dtype=torch.long)
    return rows


@dataclasses.dataclass
class Launch:
    """One launched step's greedy tokens, copied to pinned host memory behind it on the stream."""

    n: int  # real rows
    copy: torch.Tensor
    event: "torch.cuda.Event | None"  # None: the copy was synchronous (no CUDA)

    def tokens(self) -> list[int]:
        """Waits for this launch's copy alone (a later launch may be running), with the GIL released."""
        if self.event is not None:
            self.event.synchronize()
        return self.copy[: self.n].tolist()


class DecodeGraphs:
    """Decode steps for any batch up to ``buckets[-1]``, each bucket captured once (on CUDA)."""

    def __init__(self, step: DecodeStep, buckets: Sequence[int], scratch_slot: int, *, use_graphs: bool = True):
        self.step = step
        self.buckets = list(buckets)
        self.scratch_slot = scratch_slot
        self.use_graphs = use_graphs and step.engine.cache_k.device.type == "cuda"
        self.buffers: dict[int, StepBuffers] = {}
        self.staging: dict[int, torch.Tensor] = {}  # pinned host copies of each bucket's inputs
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.setup_seconds = 0.0
        # Each launch's greedy tokens, copied out after its replay: two pinned buffers per bucket, alternating,
        # so a launch ahead writes one while the host reads the other.
        self.readback: dict[int, list[torch.Tensor]] = {}
        self._launches = 0
        self._batch = 0  # the bucket of the last launch
        self.last: Launch | None = None  # the last launch: its rows' greedy tokens once read back

    def prepare(self) -> None:
        """Compile every kernel for every bucket and capture the graphs (once per process)."""
        start = time.perf_counter()
        for batch in reversed(self.buckets):  # largest first: later captures reuse its memory
            buf = self.buffers[batch] = self.step.buffers(batch)
            pinned = self.use_graphs  # pinned memory needs a CUDA device
            self.staging[batch] = torch.zeros((3, batch), dtype=torch.long, pin_memory=pinned)
            self.readback[batch] = [torch.zeros(batch, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
            self._fill(batch, [], [], [])
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

    def decode(self, tokens: Sequence[int], slots: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Float32 logits [len(tokens), vocab] of one decode step (a view valid until the next call)."""
        if not self.buffers:
            self.prepare()
        batch = bucket_for(len(tokens), self.buckets)
        buf = self.buffers[batch]
        self._fill(batch, tokens, slots, positions)
        self._launch(batch, len(tokens))
        return buf.logits[: len(tokens)]

    def decode_ahead(self) -> "Launch":
        """Launch the next step of the rows of the last launch, before the host has read its tokens: each row
        feeds back the token that launch chose (its argmax), one position further on, in the same slot. Right
        only where every row takes its argmax; the caller drops rows that ended meanwhile (a padding row's work
        lands in the scratch slot, a finished row's in a slot that stream order frees before any reuse)."""
        if self.last is None:
            raise RuntimeError("decode_ahead() follows a decode()")
        buf = self.buffers[self._batch]
        buf.tokens.copy_(buf.greedy)  # device to device, after the last replay in stream order
        buf.positions.add_(1)
        return self._launch(self._batch, self.last.n)

    def _launch(self, batch: int, n: int) -> "Launch":
        buf = self.buffers[batch]
        if self.use_graphs:
            self.graphs[batch].replay()
        else:
            self.step.run(buf)
        self._launches += 1
        copy = self.readback[batch][self._launches % 2]
        copy.copy_(buf.greedy, non_blocking=self.use_graphs)
        event = None
        if self.use_graphs:
            event = torch.cuda.Event()
            event.record()
        self._batch, self.last = batch, Launch(n, copy, event)
        return self.last

    def time_replay(self, batch: int, replays: int = 50) -> float | None:
        """Milliseconds per replay of the graph holding ``batch`` rows, back to back, by CUDA events (its inputs:
        the last step's, so call it with the runtime idle); None without graphs."""
        graph = self.graphs.get(bucket_for(batch, self.buckets))
        if graph is None:
            return None
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / replays

    def weight_bytes(self) -> int:
        """Bytes of weights a step reads (this engine's; a tensor-parallel rank's shard)."""
        return self.step.weight_bytes()

    def greedy(self, n: int) -> torch.Tensor:
        """The argmax tokens of the last ``decode`` of ``n`` rows, computed inside the step."""
        return self.buffers[bucket_for(n, self.buckets)].greedy[:n]

    def _fill(self, batch: int, tokens, slots, positions) -> None:
        # The previous step's tokens were read back before this one is filled, so the pinned
        # buffer is free and the copy can run asynchronously, ahead of the replay on the stream.
        staging = self.staging[batch]
        staging.copy_(padded_inputs(tokens, slots, positions, batch, self.scratch_slot))
        self.buffers[batch].inputs.copy_(staging, non_blocking=True)


def prepared(engine, buckets: Sequence[int], scratch_slot: int, *, use_graphs: bool = True,
             step: DecodeStep | None = None) -> DecodeGraphs:
    """The fast decode path over ``engine`` (or its already built ``step``), compiled and captured;
    ``decode_step.Unsupported`` if it cannot run it. A tensor-parallel rank's engine gets its collectives in
    the step, so every rank of the group must prepare, and then decode, in step with the others."""
    graphs = DecodeGraphs(step or DecodeStep(engine), buckets, scratch_slot, use_graphs=use_graphs)
    graphs.prepare()
    return graphs
