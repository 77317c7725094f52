"""The host's half of prompt lookup on the device (``cuda/drafted``): which requests draft there, how a step chained
on theirs is planned, and how their results are settled.

A greedy request without bans, under prompt lookup, on one rank with chaining on, is *tracked* once its history is
loaded into its table row on the device (``_drafts_for``). From then on every fast step it is in accepts its drafts,
grows its history and looks up its next drafts there, and its results (emitted tokens, whether the lookup found
anything, the next drafts) come to the host behind the step. So a step may be launched on a tracked row's running
step like a decode step on a decode's (``OverlapSteps._chain``): ``_pend_tracked`` takes the row as keeping every
draft (the most it can keep: the blocks planned on that cover what it kept; no prefix-cache key is made from tokens
not known yet), and ``_settle_tracked`` reads what was kept one step later, undoes the rest and records the tokens.
A tracked request that runs through the eager model (its history there misses that step) or is preempted (its table
row goes) is loaded again before it next drafts. ``TRTLLM_PIPELINE_SPEC_DEVICE=0`` keeps every draft on the host.

The lag has two costs the settling undoes (``lag_rules_enabled``). A row planned on pending tokens takes the
speculator's width before the last step is told, and where the lookup after that step found nothing the device fills
it with the last token repeated: that row's rejection is the filler's, not the drafts', so it leaves the width as it
is (told as a miss it halved k, and the next real drafts came in a short row). And at batch 1, a partial row sets the
width back to k, not to kept + 1: a verify row of 1 + k tokens costs about what a shorter one does there (SmolLM2 on
the H100: 1.13-1.15x a 1-token step for any k up to 8), and under the lag kept + 1 reached the row two steps on,
after the span it fitted had moved. ``benchmarks/spec_device_replay.py`` (cached SmolLM2 outputs): together 1.6-6.7%
fewer plain steps' cost on every workload; either alone can lose. A step of several requests keeps kept + 1 (its
verify rows are b x (1 + k) wide: cost growing with the width). ``TRTLLM_PIPELINE_SPEC_LAG_RULES=0``: neither (the
A/B).

``DeviceDrafting`` is a part of ``TorchRuntime`` (its requests, scheduler, speculator and decoder), kept apart as
``OverlapSteps`` is.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from trtllm_pipeline.runtimes.base import TokenEvent
from trtllm_pipeline.runtimes.torch_engine.overlap import PENDING
from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow

log = logging.getLogger(__name__)


def lag_rules_enabled() -> bool:
    """The settling's two rules for device drafting's lag (the module's docstring), unless
    ``TRTLLM_PIPELINE_SPEC_LAG_RULES=0``."""
    return os.environ.get("TRTLLM_PIPELINE_SPEC_LAG_RULES", "1").strip() != "0"


def device_drafting_enabled() -> bool:
    """Prompt lookup on the device for greedy requests (``cuda.drafted``), so that verify steps chain too: on where
    chaining is, unless ``TRTLLM_PIPELINE_SPEC_DEVICE=0`` (drafts from the host at every step: the A/B)."""
    return os.environ.get("TRTLLM_PIPELINE_SPEC_DEVICE", "1").strip() != "0"


class DeviceDrafting:
    """Device drafting's half of ``TorchRuntime`` (see the module's docstring)."""

    def _attach_drafts(self, decoder) -> None:
        """Set ``device_drafting`` for ``decoder`` (``OverlapSteps.attach_decoder``): on where it chains, can draft
        (``DecodeGraphs.attach_drafts``) and the proposer is prompt lookup (linear); its set-up failing leaves the
        drafts on the host, said in the log."""
        from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import NgramProposer

        sp = getattr(self, "speculator", None)
        self.device_drafting = bool(self.chaining and sp is not None and type(sp.proposer) is NgramProposer
                                    and hasattr(decoder, "attach_drafts") and device_drafting_enabled())
        self.lag_rules = lag_rules_enabled()
        if not self.device_drafting:
            return
        try:
            decoder.attach_drafts(sp.k, sp.proposer.min_n, sp.proposer.max_n, self.max_seq_len, self.max_batch_size)
        except Exception as exc:  # noqa: BLE001 - speed only: drafts from the host, verify steps unchained
            log.warning("prompt lookup on the device is off (%s: %s); drafts come from the host",
                        type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
            self.device_drafting = False

    def _drafts_for(self, req, k: int, pending: bool) -> bool:
        """``req``'s drafts from the device (``req.draft``: ``k`` placeholders while its running step's results are
        pending, else the drafts read back with them), tracking it first where it may be (its history loaded); False
        where its drafts come from the host instead (untracked, or tracked but nothing read back yet)."""
        if not req.tracked and not pending and self.device_drafting and req.params.greedy and not req.may_ban():
            self.decoder.load_history(req.request_id, req.prompt + req.generated)
            req.tracked, req.device_next = True, None
        if not req.tracked or not (pending or req.device_next is not None):
            return False
        req.draft = [PENDING] * k if pending else req.device_next[:k]
        return True

    def _untrack(self, request_ids) -> None:
        """These requests' histories on the device missed a step (an eager forward) or went with their table rows
        (preemption): loaded again before they next draft."""
        for request_id in request_ids:
            req = self._requests.get(request_id)
            if req is not None:
                req.tracked = False

    def _tracked(self, rows: list[PlanRow], reqs: list) -> list[int] | None:
        """Per row, device drafting's state (``cuda.drafted``): 0 not tracked, 1 tracked, 2 tracked and pending (its
        token and drafts are the device's); None where no row is tracked."""
        if not self.device_drafting:
            return None
        states = [(2 if row.tokens[0] == PENDING else 1) if req.tracked else 0 for row, req in zip(rows, reqs)]
        return states if any(states) else None

    def _device_results(self, rows: list[PlanRow], tracked: list[int] | None, posted) -> dict[Any, tuple]:
        """The tracked rows' (emitted tokens, drafts found, next drafts) by request, read from the device (waiting
        for that step only); {} where none was tracked."""
        if not tracked:
            return {}
        ids = [row.request_id for row, state in zip(rows, tracked) if state]
        return dict(zip(ids, self.decoder.drafted.result(posted)))

    def _pend_tracked(self, row: PlanRow, req) -> None:
        """A tracked row's running step taken as keeping every draft (the most it can: the blocks planned on it
        cover what it kept), its tokens ``PENDING``, no prefix-cache key made from them (``_settle_tracked`` sets
        what was kept)."""
        n = len(row.tokens)
        self.scheduler.advance(req, n, commit=False)
        req.generated.extend([PENDING] * n)
        req.held = len(req.generated) >= req.params.max_tokens or req.length >= self.max_seq_len

    def _known_tracked(self, row: PlanRow, req) -> None:
        """A row planned on a tracked request's pending tokens, after they were read (the chained launch did not
        happen): its token, the drafts the device looked up after them, and its true start."""
        drafts = (req.device_next or [])[: len(row.tokens) - 1]
        row.tokens, row.draft, row.start = [req.generated[-1], *drafts], len(drafts), req.computed

    def _settle_tracked(self, row: PlanRow, req, result, *, pended: bool) -> TokenEvent:
        """A tracked row's step as the device settled it (``result``: emitted tokens, drafts found, next drafts): the
        speculator told, the tokens recorded one by one (the request may end at any), the cache keeping what was
        kept. ``pended``: the row was taken as keeping every draft (``_pend_tracked``) and a step chained on it may
        be running now: that is undone first, and no block is given back (the running step may write past the kept
        length)."""
        emitted, found, drafts = result
        n = len(row.tokens)
        # the row's drafts were the filler where the lookup before it found nothing (a row is all drafts or all
        # filler: a found continuation repeats to k); known only for a pended row (else its drafts were read first)
        filler = pended and req.device_next == []
        preempted = False
        if pended:
            del req.generated[-n:]
            req.held = False
            preempted = req.computed < n  # (preemption set it to 0; it is recomputed from its tokens later)
            if not preempted:
                req.computed -= n
        sp = self.speculator
        if n > 1:
            rules = self.lag_rules
            sp.verified(req.request_id, n - 1, len(emitted) - 1, adapt=not (rules and filler),
                        wide=rules and len(self.scheduler.running) == 1)
        if not found:
            sp.found_nothing(req.request_id)
        req.device_next = drafts if found else []
        event = self._record_run(req, emitted)
        if event.finish_reason:
            return event
        if not preempted:
            self.scheduler.advance(req, len(emitted))
            if not pended:
                self.kv.trim(req.request_id, req.length)
        return event
