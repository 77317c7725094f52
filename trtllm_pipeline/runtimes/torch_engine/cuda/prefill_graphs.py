"""A prompt's first prefill chunk from a CUDA graph: the eager forward without its host launches.

The fused eager forward (``cuda/prefill``) launches ~15 kernels and GEMMs a layer from Python. On the H200 (random 7B
FP8, 2026-12-04c) a 2048-token prompt took 31.8 ms of which its kernels were ~25 ms, and a short one ~27 ms of host
launches whatever its length: the host, not the GPU, set the time, and a loaded engine's long prompts (2048/128:
2,635 output tokens/s against TensorRT-LLM's 3,538) spent it once per prompt. Here the first chunk of one prompt
(position 0: nothing cached before it) runs from a graph captured per length bucket, its tokens padded to the
bucket: the padding comes after the prompt's last token, so causal attention keeps it from every real token, and its
K/V lands past the prompt (in the request's last block, rewritten by the next token before anything reads it, or in
the null block where the table has no block). Later chunks, several rows a step and tree rows keep the eager
forward. The graphs share one memory pool (captured largest first; they never run at once). Without CUDA (the CPU
tests) the same class runs the forward directly, padding and all.
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


class PrefillGraphs:
    def __init__(self, engine, buckets: Sequence[int], *, use_graphs: bool = True):
        self.engine, self.buckets = engine, sorted(buckets)
        self.use_graphs = use_graphs and engine.device.type == "cuda"
        dev = engine.device
        self.tokens = torch.zeros(self.buckets[-1], dtype=torch.long, device=dev)
        self.table = torch.zeros((1, engine.slot_blocks), dtype=torch.long, device=dev)  # null block past the prompt's
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # each graph's hidden states [bucket, hidden]
        self.runs = {length: self._runner(length) for length in self.buckets}
        self.setup_seconds = 0.0

    def prepare(self) -> None:
        """Each bucket run once (its kernels compiled), then captured, largest first (later captures reuse its
        memory)."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        for length in reversed(self.buckets):
            run = self.runs[length]
            run()
            if not self.use_graphs:
                continue
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[length] = run()
            self.graphs[length] = graph
        if self.use_graphs:
            torch.cuda.synchronize()
        self.setup_seconds = time.perf_counter() - start
        log.info("prefill graphs: first chunks of up to %s tokens captured in %.1f s", self.buckets,
                 self.setup_seconds)

    def _runner(self, length: int):
        """The forward of ``length`` tokens at positions 0 .. length - 1 over the static inputs, as one callable
        (its index tensors made now, outside any capture)."""
        e, dev, bs = self.engine, self.engine.device, self.engine.block_size
        positions = torch.arange(length, device=dev)
        slot_block, within = positions // bs, positions % bs
        attention = e.paged_attention(self.table, [0], [length])
        tokens = self.tokens[:length]

        def run() -> torch.Tensor:
            blocks = self.table[0, slot_block]  # (on the device, from the table copied in: captured)
            return e.layers_of(tokens, positions, e.attend_through(blocks, within, attention))

        return run

    def bucket(self, n: int) -> int | None:
        """The bucket a first chunk of ``n`` tokens runs in, None past the largest."""
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def forward(self, tokens: Sequence[int], table: Sequence[int]) -> torch.Tensor:
        """Hidden states [len(tokens), hidden] of a prompt's first chunk ``tokens`` (positions 0 ..), its K/V written
        through the block ``table``; a view of the graph's output, valid until the next ``forward``."""
        n, length = len(tokens), self.bucket(len(tokens))
        self.tokens[:n].copy_(torch.tensor(list(tokens), dtype=torch.long), non_blocking=True)
        self.tokens[n:length].zero_()
        self.table.zero_()
        self.table[0, : len(table)].copy_(torch.tensor(list(table), dtype=torch.long), non_blocking=True)
        if self.use_graphs:
            self.graphs[length].replay()
            return self.outputs[length][:n]
        return self.runs[length]()[:n]
