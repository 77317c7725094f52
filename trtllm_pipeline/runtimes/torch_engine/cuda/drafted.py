"""Prompt lookup on the device around the fast path's steps: what lets a verify step be chained like a decode step.

With drafts proposed on the host, every verify step waits for the host: its argmax read, the drafts accepted, the
next drafts looked up and the next step launched, while the GPU idles (SmolLM2-135M on the H100, 2026-12-05e: a
plain token 0.64 ms chained, a verify step ~1.3 ms unchained, so an acceptance length of 2.6 bought 1.16x). Here a
tracked request (``TorchRuntime``: greedy, nothing banned, prompt lookup) keeps its token history on the device
(``speculative.device_drafts.DeviceDrafts``, one row per table row), and two small steps run around each fast step
on the stream: before it, a chained step's rows take their token, drafts and positions from the previous step's
results (``prep``); after it, the drafts are accepted, the history grows and the next drafts are looked up
(``post``), and each tracked row's emitted tokens and next drafts come to the host by themselves (``result``),
read one step later. Each is one Triton launch (``cuda.draft_kernels``; ``DeviceDrafts``' torch methods are their
reference, and what runs where Triton cannot: a CPU without its interpreter, under a test's own step), and on CUDA
a graph of its own per bucket.

``DecodeGraphs`` holds one of these where device drafting is on (``attach_drafts``); its ``decode`` and ``verify``
take ``tracked`` per request row: 0 not tracked, 1 tracked (its tokens known on the host), 2 tracked and pending
(its tokens made on the device: the values passed for them are placeholders).
"""

from __future__ import annotations

from typing import Sequence

import torch

from trtllm_pipeline.runtimes.torch_engine.cuda import draft_kernels
from trtllm_pipeline.runtimes.torch_engine.cuda.support import interpreting
from trtllm_pipeline.runtimes.torch_engine.speculative.device_drafts import DeviceDrafts


class DraftedSteps:
    def __init__(self, buckets: Sequence[int], rows: int, *, k: int, min_n: int, max_n: int, max_len: int,
                 max_spans: int, device: torch.device, use_graphs: bool):
        self.k, self.use_graphs = k, use_graphs
        self.cuda = device.type == "cuda"
        self.kernels = self.cuda or interpreting()  # (else the torch reference: a CPU test's stand-in step)
        self.drafts = DeviceDrafts(rows, max_len, k, min_n, max_n, device)
        width = self.drafts.out_width
        # per bucket: [4, B] on the device (rows: each span's first token row, its tokens, its table row; each token
        # row's source, -1: its own), the spans' results [S, width], and two pinned host sets of the inputs. S: the
        # most spans a step has (a request each: at most max_spans)
        self.spans = {batch: min(batch, max_spans) for batch in buckets}
        self.inputs: dict[int, torch.Tensor] = {}
        self.out: dict[int, torch.Tensor] = {}
        self.staging: dict[int, list[torch.Tensor]] = {}
        for batch in buckets:
            self.inputs[batch] = self._blank(torch.zeros((4, batch), dtype=torch.long, device=device))
            self.out[batch] = torch.zeros((self.spans[batch], width), dtype=torch.long, device=device)
            self.staging[batch] = [self._blank(torch.zeros((4, batch), dtype=torch.long, pin_memory=self.cuda))
                                   for _ in range(2)]
        self.host = [torch.zeros((max(self.spans.values()), width), dtype=torch.long, pin_memory=self.cuda)
                     for _ in range(2)]
        self._read: list = [None, None]
        self.prep_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.post_graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def _blank(self, t: torch.Tensor) -> torch.Tensor:
        """Inputs that change nothing: every span padding (its table row the sink), every token row its own."""
        t[:2] = 0
        t[2] = self.drafts.sink
        t[3] = -1
        return t

    def capture(self, batch: int, buf) -> None:
        """The bucket's two small steps as graphs (on CUDA; run once first, outside the capture)."""
        if not self.use_graphs or batch in self.post_graphs:
            return
        for graphs, run in ((self.prep_graphs, self._prep), (self.post_graphs, self._post)):
            run(batch, buf)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run(batch, buf)
            graphs[batch] = graph
        torch.cuda.synchronize()

    def load(self, row: int, tokens: Sequence[int]) -> None:
        """Table row ``row``'s history: ``tokens`` (a request's prompt and what it has generated)."""
        self.drafts.load(row, tokens)

    # ---- a step --------------------------------------------------------------------------------

    def stage(self, batch: int, turn: int, spans: Sequence[tuple[int, int, int, bool]]) -> bool:
        """The step's spans (first token row, tokens, table row, pending) into this turn's pinned set and on to the
        device, behind the step's other inputs; True where some span is pending (``prep`` must run)."""
        host = self._blank(self.staging[batch][turn]).numpy()
        pending = False
        for b, (first, n, row, waiting) in enumerate(spans):
            host[0, b], host[1, b], host[2, b] = first, n, row
            if waiting:
                pending = True
                host[3, first : first + n] = [row * (self.k + 1) + j for j in range(n)]
        self.inputs[batch].copy_(self.staging[batch][turn], non_blocking=self.cuda)
        return pending

    def prep(self, batch: int, buf) -> None:
        """A chained step's pending rows take their tokens and positions from the device (after its inputs' copy)."""
        if batch in self.prep_graphs:
            self.prep_graphs[batch].replay()
        else:
            self._prep(batch, buf)

    def post(self, batch: int, buf, spans: int, turn: int) -> tuple[torch.Tensor, object | None]:
        """After the step: acceptance, history and next drafts of its spans; their results to the host behind it
        (this turn's pinned rows, and the event after which they are there: ``result``'s argument)."""
        if batch in self.post_graphs:
            self.post_graphs[batch].replay()
        else:
            self._post(batch, buf)
        host = self.host[turn][:spans]
        host.copy_(self.out[batch][:spans], non_blocking=self.cuda)
        if self.cuda:
            event = self._read[turn] = self._read[turn] or torch.cuda.Event()
            event.record()
        return host, (self._read[turn] if self.cuda else None)

    def _prep(self, batch: int, buf) -> None:
        if self.kernels:
            draft_kernels.fill_inputs(self.drafts, buf.inputs[0], buf.inputs[1], self.inputs[batch][3])
        else:
            self.drafts.fill_inputs(buf.inputs[0], buf.inputs[1], self.inputs[batch][3])

    def _post(self, batch: int, buf) -> None:
        spans = self.inputs[batch][:3, : self.spans[batch]].t()
        if self.kernels:
            draft_kernels.after_step(self.drafts, buf.inputs[0], buf.inputs[1], buf.greedy, spans, self.out[batch])
        else:
            self.drafts.after_step(buf.inputs[0], buf.inputs[1], buf.greedy, spans, self.out[batch])

    def result(self, posted: tuple[torch.Tensor, object | None]) -> list[tuple[list[int], bool, list[int]]]:
        """A step's spans' (emitted tokens, drafts found, next drafts) from what its ``post`` returned, waiting for
        that step only (not for one chained behind it)."""
        host, ready = posted
        if ready is not None:
            ready.synchronize()
        return [DeviceDrafts.parse(row, self.k) for row in host.tolist()]
