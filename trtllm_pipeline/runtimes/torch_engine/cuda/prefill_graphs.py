"""Prompts' first prefill chunks from CUDA graphs: the eager forward without its host launches.

The fused eager forward (``cuda/prefill``) launches ~15 kernels and GEMMs a layer from Python. On the H200 (random 7B
FP8, 2026-12-04c) a 2048-token prompt took 31.8 ms of which its kernels were ~25 ms, and a short one ~27 ms of host
launches whatever its length: the host, not the GPU, set the time, and a loaded engine's long prompts (2048/128:
2,635 output tokens/s against TensorRT-LLM's 3,538) spent it once per prompt. Here a step whose rows are all prompts'
first chunks (position 0: nothing cached before them) runs from a graph captured per shape, R rows of a length
bucket L (``shapes``: one row of every bucket, and 2, 4, 8 .. rows of the buckets whose R x L tokens the largest
bucket holds), each row's tokens padded to L and the rows to R: a row's padding comes after its last token, so
causal attention keeps it from every real token, and its K/V lands past the prompt (in the request's last block,
rewritten by the next token before anything reads it, or in the null block where the table has no block); a padding
row's K/V all lands in the null block. Several prompts a step (``runtime.prefill_chunk_tokens`` above one prompt's
length) then cost their kernels' time, where the eager forward of two 2048-token prompts took ~35 ms a prompt
against the graph's ~30 for one (H100, 2026-12-07). Later chunks and tree rows keep the eager forward. The graphs
share one memory pool (captured largest first; they never run at once). Without CUDA (the CPU tests) the same class
runs the forward directly, padding and all.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import Sequence

import torch

log = logging.getLogger(__name__)

# chunk lengths captured (those up to the runtime's prefill chunk): a chunk pads up to the next one (<= 1.5x the work)
BUCKETS = (256, 512, 768, 1024, 1536, 2048, 3072, 4096)


def buckets_for(chunk_tokens: int) -> list[int]:
    """The buckets a runtime prefilling ``chunk_tokens`` a step at most needs: every one below it, and the first at or
    above it (a longer chunk than the largest bucket runs eagerly)."""
    below = [b for b in BUCKETS if b < chunk_tokens]
    above = [b for b in BUCKETS if b >= chunk_tokens][:1]
    return below + above


def shapes_of(buckets: Sequence[int]) -> list[tuple[int, int]]:
    """(rows, length) shapes to capture for length ``buckets``: one row of each, and 2, 4, 8 .. rows of a bucket while
    rows x length stays within the largest bucket (the most tokens a step prefills from a graph)."""
    cap = max(buckets)
    return sorted({(rows, length) for length in buckets for rows in (1 << i for i in range(cap.bit_length()))
                   if rows * length <= cap})


class Staging:
    """A graph's static device inputs filled from host twins, pinned on CUDA: a copy from pageable memory waits for
    the stream's queued work, which would hold a forward launched behind the running decode step
    (``OverlapSteps._launch_eager_early``) until that step is done. ``host()`` waits for the last ``send``'s copies
    out of the twins (an event), then hands them to be filled; ``send`` copies the given extents in."""

    def __init__(self, buffers: dict[str, torch.Tensor], pin: bool):
        self.device = buffers
        self._host = {name: torch.zeros(t.shape, dtype=t.dtype, pin_memory=pin) for name, t in buffers.items()}
        self._sent = torch.cuda.Event() if pin else None

    def host(self) -> dict[str, torch.Tensor]:
        if self._sent is not None:
            self._sent.synchronize()
        return self._host

    def send(self, extents: dict[str, int]) -> None:
        """Each named buffer's first ``extents[name]`` rows from its twin, without waiting for the stream."""
        for name, rows in extents.items():
            self.device[name][:rows].copy_(self._host[name][:rows], non_blocking=True)
        if self._sent is not None:
            self._sent.record()


class PrefillGraphs:
    def __init__(self, engine, buckets: Sequence[int], *, use_graphs: bool = True):
        self.engine, self.buckets = engine, sorted(buckets)
        self.shapes = shapes_of(self.buckets)
        self.use_graphs = use_graphs and engine.device.type == "cuda"
        dev = engine.device
        rows = max(r for r, _ in self.shapes)
        self.tokens = torch.zeros(max(r * n for r, n in self.shapes), dtype=torch.long, device=dev)
        self.table = torch.zeros((rows, engine.slot_blocks), dtype=torch.long, device=dev)  # null block past a prompt
        self._staging = Staging({"tokens": self.tokens, "table": self.table}, pin=self.use_graphs)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        # every graph's hidden states [rows x length, hidden], copied here in the graph: one buffer, not one per shape
        # (which the pool would keep apart: ~0.3 GB of the 7B's at 4,096 tokens a chunk)
        self.output: torch.Tensor | None = None
        self.runs = {shape: self._runner(*shape) for shape in self.shapes}
        self.setup_seconds = 0.0

    def prepare(self) -> None:
        """Each shape run once (its kernels compiled), then captured, most tokens first (later captures reuse its
        memory)."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        for shape in sorted(self.shapes, key=lambda s: (s[0] * s[1], s[0]), reverse=True):
            run = self.runs[shape]
            out = run()
            if not self.use_graphs:
                continue
            if self.output is None:  # (the first shape has the most tokens)
                self.output = torch.empty_like(out)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.output[: out.shape[0]].copy_(run())
            self.graphs[shape] = graph
        if self.use_graphs:
            torch.cuda.synchronize()
        self.setup_seconds = time.perf_counter() - start
        log.info("prefill graphs: first chunks of up to %s tokens (%d shapes, up to %d rows) captured in %.1f s",
                 self.buckets, len(self.shapes), self.table.shape[0], self.setup_seconds)

    def _runner(self, rows: int, length: int):
        """The forward of ``rows`` rows of ``length`` tokens each at positions 0 .. length - 1 over the static inputs,
        as one callable (its index tensors made now, outside any capture)."""
        e, dev, bs = self.engine, self.engine.device, self.engine.block_size
        positions = torch.arange(length, device=dev).repeat(rows)
        slot_block, within = positions // bs, positions % bs
        row_of = torch.arange(rows, device=dev).repeat_interleave(length)  # each token's table row
        attention = e.paged_attention(self.table[:rows], [0] * rows, [length] * rows)
        tokens = self.tokens[: rows * length]

        def run() -> torch.Tensor:
            blocks = self.table[row_of, slot_block]  # (on the device, from the tables copied in: captured)
            return e.layers_of(tokens, positions, e.attend_through(blocks, within, attention))

        return run

    def bucket(self, n: int) -> int | None:
        """The bucket a first chunk of ``n`` tokens runs in, None past the largest."""
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def shape_for(self, lengths: Sequence[int]) -> tuple[int, int] | None:
        """The captured shape that first chunks of ``lengths`` tokens run in: the fewest tokens (then rows) with a row
        for each and a length for the longest; None if none holds them."""
        fits = [(r, n) for r, n in self.shapes if r >= len(lengths) and n >= max(lengths)]
        return min(fits, key=lambda s: (s[0] * s[1], s[0])) if fits else None

    def forward(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> torch.Tensor:
        """Hidden states [total tokens, hidden] of first chunks (positions 0 ..), packed in row order: each row's
        ``(tokens, block table)``, its K/V written through that table. A tensor of its own (the graph's output is
        rewritten by the next ``forward``). Call with a ``shape_for`` the rows fit."""
        shape = self.shape_for([len(tokens) for tokens, _ in rows])
        count, length = shape
        host = self._staging.host()
        tokens = host["tokens"][: count * length].view(count, length)
        tables = host["table"][:count]
        tokens.zero_()
        tables.zero_()
        for i, (toks, table) in enumerate(rows):
            tokens[i, : len(toks)] = torch.as_tensor(toks, dtype=torch.long)
            tables[i, : len(table)] = torch.as_tensor(table, dtype=torch.long)
        self._staging.send({"tokens": count * length, "table": count})
        if self.use_graphs:
            self.graphs[shape].replay()
            out = self.output
        else:
            out = self.runs[shape]()
        if len(rows) == 1:
            return out[: len(rows[0][0])].clone()
        return torch.cat([out[i * length : i * length + len(toks)] for i, (toks, _) in enumerate(rows)])
