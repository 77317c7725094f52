"""Single-token rows at any positions (decodes) from CUDA graphs of the eager forward: ``runtime.batch_invariant``'s
decode steps without their host launches.

In the batch-invariant mode every step is the eager forward (the fast path's kernels pick their shapes by the batch,
which is what that mode must not do), and its host launches (~15 a layer, ~27 ms a step for the 7B) then set a
decode step's time, where its kernels take a few. Here a step of R single-token rows runs from a graph captured
per bucket (powers of two up to the engine's batch): the tokens, positions and block tables are static inputs, and so
is the tile map of ``cuda/paged_prefill``'s kernel, which attends every row (the mode's ``paged_prefill_rows`` is
``all``): one entry a row, (row, row, its position, 1), zeros for the padding rows, which store nothing. A padding
row's K/V lands in the null block (its table row is zeros). The kernels are the eager forward's, and each row's
numbers do not depend on the bucket (the invariant GEMM's tiles and the attention's key tiles are fixed), so the
graph's hidden states are the eager forward's bit for bit. Without CUDA (the interpreter's checks) the same class
runs the forward directly, padding and all.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import torch

from trtllm_pipeline.runtimes.torch_engine.cuda.prefill_graphs import Staging

log = logging.getLogger(__name__)


class RowGraphs:
    def __init__(self, engine, max_rows: int, *, use_graphs: bool = True):
        if engine.paged_prefill_rows != "all":
            raise ValueError("row graphs attend every row through the paged kernel: make the engine batch-invariant")
        self.engine = engine
        self.buckets = [1]  # powers of two up to the first that holds ``max_rows``
        while self.buckets[-1] < max_rows:
            self.buckets.append(self.buckets[-1] * 2)
        self.max_rows = self.buckets[-1]
        self.use_graphs = use_graphs and engine.device.type == "cuda"
        dev, n = engine.device, self.max_rows
        self.tokens = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.table = torch.zeros((n, engine.slot_blocks), dtype=torch.long, device=dev)
        self.tiles = torch.zeros((n, 4), dtype=torch.int32, device=dev)
        self._staging = Staging({"tokens": self.tokens, "positions": self.positions, "table": self.table,
                                 "tiles": self.tiles}, pin=self.use_graphs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.output: torch.Tensor | None = None
        self.runs = {b: self._runner(b) for b in self.buckets}
        self.setup_seconds = 0.0

    def _runner(self, rows: int):
        """The forward of ``rows`` single-token rows over the static inputs, as one callable (its index tensors made
        now, outside any capture)."""
        e = self.engine
        attention = e.paged_attention(self.table[:rows], [0] * rows, [1] * rows)
        attention.kernel_tiles = self.tiles[:rows]  # (every row the kernel's: its map filled per step)
        index = torch.arange(rows, device=e.device)
        tokens, positions = self.tokens[:rows], self.positions[:rows]

        def run() -> torch.Tensor:
            blocks = self.table[index, positions // e.block_size]  # (on the device, from the tables copied in)
            within = positions % e.block_size
            return e.layers_of(tokens, positions, e.attend_through(blocks, within, attention))

        return run

    def prepare(self) -> None:
        """Each bucket run once (its kernels compiled), then captured, largest first (the others reuse its memory)."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        for rows in sorted(self.buckets, reverse=True):
            out = self.runs[rows]()
            if not self.use_graphs:
                continue
            if self.output is None:
                self.output = torch.empty_like(out)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.output[:rows].copy_(self.runs[rows]())
            self.graphs[rows] = graph
        if self.use_graphs:
            torch.cuda.synchronize()
        self.setup_seconds = time.perf_counter() - start
        log.info("batch-invariant decode graphs: buckets %s captured in %.1f s", self.buckets, self.setup_seconds)

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def forward(self, rows: Sequence[tuple[int, int, Sequence[int]]]) -> torch.Tensor:
        """Hidden states [len(rows), hidden] of single-token rows, each ``(token, position, block table)``, its K/V
        written through that table. A tensor of its own (the graph's output is rewritten by the next call). At most
        ``max_rows`` rows."""
        n = len(rows)
        bucket = self.bucket(n)
        host = self._staging.host()
        for t in host.values():
            t[:bucket].zero_()
        positions = [p for _, p, _ in rows]
        width = max(len(t) for _, _, t in rows)
        host["tokens"][:n] = torch.tensor([t for t, _, _ in rows], dtype=torch.long)
        host["positions"][:n] = torch.tensor(positions, dtype=torch.long)
        host["table"][:n, :width] = torch.tensor([list(t) + [0] * (width - len(t)) for _, _, t in rows],
                                                 dtype=torch.long)
        host["tiles"][:n] = torch.tensor([(i, i, p, 1) for i, p in enumerate(positions)], dtype=torch.int32)
        self._staging.send(dict.fromkeys(host, bucket))
        if self.use_graphs:
            self.graphs[bucket].replay()
            return self.output[:n].clone()
        return self.runs[bucket]()[:n]
