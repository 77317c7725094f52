"""Fast steps left running, and decode steps chained on them: the torch runtime's overlap of host and GPU.

A fast step without drafts (decodes, and short prompts' chunks as rows of it) is launched and left running
(``_launch_fast``); its tokens are read at the start of the next ``step()`` (``_settle_launched``), so the caller
handles one step's events (the engine loop detokenizes and streams them) while the GPU runs the next.

Chained, the GPU does not wait between decode steps either. With overlap alone it still waits for the host to read
one step's tokens, record them and plan and launch the next (at 256 rows: 2-3 ms of a ~10 ms step). Chained, the
next step is planned with the running one's tokens pending (``_pend``: the scheduler sees them as generated, as
``PENDING``), launched with its inputs taken on the device from the running step's argmax (``DecodeGraphs``'
``sources``), and only then are the running step's tokens read (``_settle_pending``, from their own pinned copy), so
the GPU always has the next step queued. Only where the argmax is the token (greedy rows, nothing banned:
``_launch``); a request that ended on its token (end id, a stop) had a row in the chained step, whose work is
dropped. This is vLLM v1's and SGLang's overlap scheduling, for this runtime's plan.

``OverlapSteps`` is a part of ``TorchRuntime`` (its requests, scheduler, decoder and recording), kept apart so that
the step's ordering is read in one place.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
from typing import Any

import torch

from trtllm_pipeline.runtimes.base import TokenEvent
from trtllm_pipeline.runtimes.torch_engine.executor import ExecutorLost
from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow, logit_span, rows_at

log = logging.getLogger(__name__)

# A chained step's input token before the step it comes from was read (``OverlapSteps._pend``): never fed (the
# device's argmax is), never emitted.
PENDING = -2


@dataclasses.dataclass
class LaunchedStep:
    """A fast step launched and left running (``OverlapSteps._launch``)."""

    rows: list[PlanRow]
    reqs: list[Any]
    logits: torch.Tensor  # every token row's: views of the step's buffers, valid until the next launch of its bucket
    greedy: torch.Tensor
    index: list[int]  # the token rows whose logits the rows read: each row's ``logit_span`` positions, packed
    host: torch.Tensor | None  # every token row's argmax, pinned host copy (``DecodeGraphs.greedy_host``)
    ready: Any  # the event after which ``host`` holds them (None: it does)
    chainable: bool  # the next step may take its argmax as its tokens (greedy rows, nothing banned)
    tracked: list[int] | None = None  # per row, device drafting's state (``cuda.drafted``); None: no row tracked
    posted: Any = None  # the tracked rows' results on their way to the host (``DecodeGraphs.drafts_posted``)

    def spans(self) -> list[list[int]]:
        """Each row's positions in ``index``'s token rows."""
        bounds = list(itertools.accumulate((logit_span(r) for r in self.rows), initial=0))
        return [self.index[a:b] for a, b in zip(bounds, bounds[1:])]

    @functools.cached_property
    def sampled_at(self) -> dict[Any, int]:
        """The token row of each sampling row's token (its last), by request (read by ``_chain`` and
        ``_settle_pending`` of the same step: made once)."""
        return {r.request_id: span[-1] for r, span in zip(self.rows, self.spans()) if r.sample}


def overlap_enabled() -> bool:
    """Decode steps left running across ``step()`` calls (``OverlapSteps._may_leave_running``): on unless
    ``TRTLLM_PIPELINE_OVERLAP=0`` (every step then returns its own tokens: the A/B of the benchmarks)."""
    return os.environ.get("TRTLLM_PIPELINE_OVERLAP", "1").strip() != "0"


def chaining_enabled(decoder) -> bool:
    """Decode steps chained on the running one (``OverlapSteps._chain``): where overlap is on and the decoder can
    take its tokens on the device (one rank's ``DecodeGraphs``), unless ``TRTLLM_PIPELINE_CHAIN=0`` (the A/B of the
    benchmarks). With speculation, only steps none of whose requests will draft next (``Speculator.drafts_next``)."""
    return hasattr(decoder, "greedy_host") and os.environ.get("TRTLLM_PIPELINE_CHAIN", "1").strip() != "0"


def _given(**kwargs) -> dict:
    """The keyword arguments that are not None (a decoder's optional ones, passed only when used)."""
    return {k: v for k, v in kwargs.items() if v is not None}


class OverlapSteps:
    """The launched-step and chaining half of ``TorchRuntime.step`` (see the module's docstring)."""

    def attach_decoder(self, decoder) -> None:
        """``decoder`` as the fast path, with overlap and chaining as the environment and the decoder allow (tests
        and probes swap in a decoder of their own through this, as the runtime sets its own)."""
        self.decoder = decoder
        self.overlap = decoder is not None and overlap_enabled()
        self.chaining = self.overlap and chaining_enabled(decoder)
        if hasattr(decoder, "read_back"):  # the per-step copy of the argmax to the host: only what chaining reads
            decoder.read_back = self.chaining
        self._launched: LaunchedStep | None = None  # the fast step left running
        # prompt lookup on the device: greedy requests without bans draft there and their verify steps chain
        self._attach_drafts(decoder)

    def _may_leave_running(self, rows: list[PlanRow]) -> bool:
        """Whether this step's fast rows are launched and left running, their tokens read at the start of the next
        ``step()`` (``_settle_launched``): a step without drafts (decodes, and short prompts' chunks as rows of it)
        but those drafted on the device (their acceptance is the device's too), with overlap on. The caller then
        handles the previous step's events (the engine loop detokenizes and streams them, a benchmark stamps them)
        while the GPU runs this step, instead of the GPU waiting for that work (issue 30: served ms/step toward the
        graph's replay time). A row's token then comes back one ``step()`` later; nothing else changes."""
        return bool(rows) and self.overlap and not any(
            r.draft and not self._requests[r.request_id].tracked for r in rows)

    def _launch_fast(self, rows: list[PlanRow]) -> list[TokenEvent]:
        """A fast step launched and kept for ``_settle_launched`` (or ``_pend``): no events now. A launch that raises
        runs the rows as ``_run_fast`` does, and their events come now."""
        try:
            self._launched = self._launch(rows)
        except ExecutorLost:
            raise
        except Exception:  # noqa: BLE001 - the synchronous path isolates the failing rows
            return self._isolated(self._run_fast, rows)
        return []

    def _launch(self, rows: list[PlanRow], sources: dict | None = None) -> LaunchedStep:
        """The rows launched on the fast path: a decode step, or where a short prompt's chunk is among them, a step of
        every token a row (``DecodeGraphs.verify``). ``sources``: a chained step's pending rows, by request, and the
        row of the running step's argmax each feeds on (``_chain``)."""
        reqs = [self._requests[r.request_id] for r in rows]
        args = ([r.block_table for r in rows], [r.start for r in rows], [r.request_id for r in rows])
        tracked = self._tracked(rows, reqs)
        per_token = None
        if sources:  # each token row's source: the running step's row, or -1 where the token is known
            per_token = [sources[r.request_id] if j == 0 and r.request_id in sources else -1
                         for r in rows for j in range(len(r.tokens))]
        decode = all(r.is_decode for r in rows)
        if decode:
            # (chaining: each row's end id before min_tokens, skipped by the step's own argmax, which then stays the
            # greedy token: served requests with min_tokens chain too. H200, 2026-12-05, random 7B FP8 served at
            # c=64 with min_tokens: none chained, 4.54 ms a step against 3.25 chained in-process)
            bans = [req.end_ban() for req in reqs] if self.chaining else None
            logits = self.decoder.decode([r.tokens[0] for r in rows], *args,
                                         **_given(sources=per_token, bans=bans if bans and max(bans) >= 0 else None,
                                                  tracked=tracked))
            greedy = self.decoder.greedy(len(rows))
        else:
            logits, greedy = self.decoder.verify([r.tokens for r in rows], *args,
                                                 **_given(sources=per_token, tracked=tracked))
        ends = list(itertools.accumulate(len(r.tokens) for r in rows))
        index = [p for r, end in zip(rows, ends) for p in range(end - logit_span(r), end)]
        host, ready = self.decoder.greedy_host() if self.chaining else (None, None)
        # the next step may feed this one's argmax to the device as it is: every row greedy, nothing banned that the
        # argmax did not skip (a decode step skips the end id, not bad words), and no request about to draft (drafts
        # are proposed from the tokens on the host; but a tracked request's are the device's)
        sp = self.speculator
        chainable = self.chaining and all(
            req.params.greedy and not (req.bad_ids if decode else req.may_ban()) for req in reqs) and (
            sp is None or not any(sp.drafts_next(req.request_id) for req in reqs if not req.tracked))
        posted = self.decoder.drafts_posted() if tracked else None
        return LaunchedStep(rows, reqs, logits, greedy, index, host, ready, chainable, tracked, posted)

    def _settle_launched(self) -> list[TokenEvent]:
        """The launched step's tokens (``_launch_fast``): sampled and recorded now, for the requests still there (one
        cancelled meanwhile is skipped; its row's work is dropped)."""
        if self._launched is None:
            return []
        launched, self._launched = self._launched, None
        greedy = launched.greedy
        spans = launched.spans()
        live = [i for i, (r, req) in enumerate(zip(launched.rows, launched.reqs))
                if self._requests.get(r.request_id) is req]
        if not live:  # every request cancelled: still wait for the step, whose pinned inputs the next one refills
            if greedy.device.type == "cuda":
                torch.cuda.current_stream(greedy.device).synchronize()
            return []
        rows = [launched.rows[i] for i in live]
        at = [p for i in live for p in spans[i]]
        try:
            device = self._device_results(launched.rows, launched.tracked, launched.posted)
            return self._settle(rows, rows_at(launched.logits, at), rows_at(greedy, at), device)
        except ExecutorLost:
            raise
        except Exception as exc:  # noqa: BLE001 - as ``_isolated``: the step's requests fail, the runtime goes on
            return [self._failed(self._requests[r.request_id], exc) for r in rows if r.request_id in self._requests]

    def _pend(self, launched: LaunchedStep) -> bool:
        """The running step's tokens as generated but not known (``PENDING``) and their positions as computed, so
        that the scheduler plans the next step on them; a request that its token ends by length is ``held`` (no
        row). False when no request of the step is left (nothing to chain on)."""
        live = False
        for i, (row, req) in enumerate(zip(launched.rows, launched.reqs)):
            if self._requests.get(row.request_id) is not req:
                continue  # cancelled while the step ran
            if launched.tracked and launched.tracked[i]:  # drafted on the device: as if every draft were kept
                self._pend_tracked(row, req)
                live = True
                continue
            self.scheduler.advance(req, len(row.tokens))
            if row.sample:  # (a prompt's chunk before its last samples nothing: it is only computed)
                req.generated.append(PENDING)
                req.held = len(req.generated) >= req.params.max_tokens or req.length >= self.max_seq_len
            live = True
        return live

    def _chain(self, fast: list[PlanRow], eager: list[PlanRow], launched: LaunchedStep) -> bool:
        """Launch the planned step chained on the running one, if all of it runs on the fast path and may be left
        running (no eager rows, no drafts): its requests' decode rows feed their pending tokens from the device; a
        request that joined the decodes since, or a prompt's chunk, feeds its own. A launch that raises: False, as
        for a plan that cannot chain (the caller then runs it after reading the pending tokens)."""
        if eager or not self._may_leave_running(fast):
            return False
        at = launched.sampled_at
        pending = {r.request_id: at[r.request_id] for r in fast
                   if r.tokens[0] == PENDING and not self._requests[r.request_id].tracked}
        try:
            self._launched = self._launch(fast, pending)
        except ExecutorLost:
            raise
        except Exception as exc:  # noqa: BLE001 - the synchronous path runs (and isolates) them
            log.warning("torch runtime: a chained decode step did not launch (%s: %s); running it after the "
                        "previous step's tokens", type(exc).__name__, exc)
            self._launched = None
            return False
        self.phase_rows["chained_steps"] += 1
        return True

    def _launch_eager_early(self, rows: list[PlanRow]):
        """A step that cannot chain on the running one because of its eager rows: where those are all prompts' chunks
        (nothing of them pending on the running step), their forward and logits are launched now, before the running
        step's tokens are read, and their sampling waits until the fast rows are launched too (``step``), so the GPU
        goes from the running step to the prefill to the next decode step without waiting on the host in between
        (2048/128 on an H100, 2026-12-07: the eager phase 94% of a step). Their logits in a 1-tuple (None where no
        row samples), or None: they run the usual way after the read (as do the rows where this launch raised)."""
        if not rows or any(r.is_decode or r.draft or PENDING in r.tokens for r in rows):
            return None
        try:
            return (self._eager_logits(rows),)
        except ExecutorLost:
            raise
        except Exception:  # noqa: BLE001 - the usual path runs them and isolates a failing row
            return None

    def _settle_early(self, rows: list[PlanRow], early: tuple) -> list[TokenEvent]:
        """``_launch_eager_early``'s rows sampled and recorded; if that raises, the rows run again the usual way (their
        forward rewrites the same K/V), each failing on its own."""
        try:
            return self._settle(rows, early[0])
        except ExecutorLost:
            raise
        except Exception:  # noqa: BLE001 - as ``_isolated``
            return self._isolated(self._run_eager, rows)

    def _settle_pending(self, launched: LaunchedStep) -> list[TokenEvent]:
        """The pending tokens of ``launched`` read (from its pinned copy: waiting for that step, not for a step
        chained on it) and recorded in place of ``PENDING``."""
        device = self._device_results(launched.rows, launched.tracked, launched.posted)
        if launched.ready is not None:
            launched.ready.synchronize()
        tokens = launched.host.tolist()
        at = launched.sampled_at
        events = []
        for row, req in zip(launched.rows, launched.reqs):
            if not row.sample or self._requests.get(row.request_id) is not req:
                continue  # a prompt's chunk that samples nothing, or cancelled before it was pended
            if row.request_id in device:
                events.append(self._settle_tracked(row, req, device[row.request_id], pended=True))
                continue
            req.generated.pop()
            req.held = False
            events.append(self._record(req, tokens[at[row.request_id]]))
        return events

    def _known(self, rows: list[PlanRow]) -> list[PlanRow]:
        """A plan made on pending tokens, after they were read: each decode row feeds its request's token, and the
        rows of requests that ended on it go."""
        out = []
        for row in rows:
            if row.tokens[0] == PENDING:
                req = self._requests.get(row.request_id)
                if req is None:
                    continue
                if req.tracked:
                    self._known_tracked(row, req)
                else:
                    row.tokens[0] = req.generated[-1]
            out.append(row)
        return out
