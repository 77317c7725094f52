"""What the runtime keeps for speculative decoding: the proposer, each request's draft length, the counters.

Adaptive draft length, per request (``adaptive``): it starts at ``k``; a verify step that keeps every draft sets it
back to ``k``, one that keeps some sets it to kept + 1, one that keeps none halves it. At 0 the request
drafts nothing for ``backoff`` decode steps, then probes with one draft; each fruitless probe doubles the wait (up
to ``MAX_BACKOFF``). So a request whose drafts keep missing decodes plainly nearly all the time, and one that starts
repeating its input (the lookups hitting) is back to ``k`` within a few steps. A step where the proposer had nothing
to offer (an n-gram that never occurred) costs no verify step; after ``QUIET_AFTER`` such steps in a row the request
looks again in 1, then 2, 4, up to ``MAX_QUIET`` decode steps while the lookups keep finding nothing, so that text
which never repeats decodes plainly and its steps chain (``OverlapSteps``: a step is launched on the running one's
tokens only where no request drafts next), and text that starts repeating is found within ``MAX_QUIET`` steps.
``TRTLLM_PIPELINE_SPEC_QUIET=0`` looks up at every step instead (the A/B of the H200 benchmark).

A model proposer (``Proposer.learns_across_requests``: a draft model, self-speculation) is turned down by the same
rule with two differences, because its drafts cost eager forwards (each ~650 aten ops for SmolLM2's first 7 layers,
~10 plain steps of a small model's graph on an H100) where a lookup costs microseconds: its wait grows up to the
proposer's ``max_backoff`` (512 for the draft model) instead of ``MAX_BACKOFF``, and a new request starts from the
state the last finished one ended in (its k, back-off and remaining wait) instead of at ``k``: the draft's agreement
with the target is the model pair's more than the request's text, so a useless draft found useless once is not
relearned by k, k/2, ... drafts for every request (the H100's 0.39x: 10 eager draft forwards in a 64-token request).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import DraftRequest, Proposer

FIRST_BACKOFF = 4
MAX_BACKOFF = 64
QUIET_AFTER = 2  # lookups in a row that find nothing before the request looks less often (a copy's boundary: 1-2)
MAX_QUIET = 8


@dataclasses.dataclass
class _Track:
    k: int
    wait: int = 0
    backoff: int = FIRST_BACKOFF
    idle: int = 0  # decode steps left before the next lookup, after lookups that found nothing
    quiet: int = 0  # lookups in a row that found nothing


class Speculator:
    def __init__(self, proposer: Proposer, k: int, *, adaptive: bool = True):
        self.proposer, self.k, self.adaptive = proposer, k, adaptive
        self.enabled = True  # bench's baseline turns it off on the same loaded runtime
        self.quiet_backoff = adaptive and os.environ.get("TRTLLM_PIPELINE_SPEC_QUIET", "1").strip() != "0"
        self._tracks: dict[Any, _Track] = {}
        self.max_backoff = getattr(proposer, "max_backoff", None) or MAX_BACKOFF
        # where a new request starts: fresh at k, or (a model proposer) the last finished request's state
        self._carries_over = adaptive and getattr(proposer, "learns_across_requests", False)
        self._standing: _Track | None = None
        self.draft_tokens = self.accepted_tokens = self.verify_rows = 0

    def budget(self, request_id: Any) -> int:
        """Drafts ``request_id`` may have this step (called once per decode step of a request that could draft)."""
        t = self._tracks.get(request_id)
        if t is None:
            t = self._tracks[request_id] = dataclasses.replace(self._standing) if self._standing else _Track(self.k)
        if t.idle > 0:
            t.idle -= 1
            return 0
        if t.k == 0:
            t.wait -= 1
            if t.wait > 0:
                return 0
            t.k = 1  # probe
        return t.k

    def propose(self, batch: Sequence[DraftRequest]) -> list[list[int]]:
        return self.proposer.propose(batch) if batch else []

    def drafts_next(self, request_id: Any) -> bool:
        """Whether ``request_id`` may draft at its next decode step (its next ``budget`` may be above 0): False only
        while it waits out a backoff with more than that step left, or with speculation off. A decode step whose rows
        all say False may be chained on (``OverlapSteps``): its tokens are not needed on the host to propose."""
        if not self.enabled:
            return False
        t = self._tracks.get(request_id, self._standing)  # (a request not seen yet starts from the standing state)
        return t is None or t.idle == 0 and (t.k > 0 or t.wait <= 1)

    def found_nothing(self, request_id: Any) -> None:
        """The proposer had no draft for ``request_id`` this step: from the ``QUIET_AFTER``-th in a row, look again
        only after 1, 2, 4 ... ``MAX_QUIET`` decode steps."""
        t = self._tracks.get(request_id)
        if t is not None and self.quiet_backoff:
            t.quiet += 1
            if t.quiet >= QUIET_AFTER:
                t.idle = min(MAX_QUIET, 2 ** (t.quiet - QUIET_AFTER))

    def verified(self, request_id: Any, drafted: int, accepted: int, depth: int | None = None, *,
                 adapt: bool = True, wide: bool = False) -> None:
        """A verify row of ``drafted`` tokens kept ``accepted``; ``depth``: a tree's (its longest path), which the
        adaptive length follows (a tree keeps at most its depth). ``adapt=False``: counted, the length left as it is
        (a row of filler, not of drafts: device drafting's lag). ``wide``: a row that keeps some drafts sets the
        length back to ``k``, not to kept + 1 (where a wider row costs no more: see ``DeviceDrafting``)."""
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.verify_rows += 1
        t = self._tracks.get(request_id)
        drafted = drafted if depth is None else depth
        if t is None or not self.adaptive or not adapt or drafted == 0:
            return
        t.quiet = 0  # (it found something to draft)
        if accepted == drafted:
            # straight back to k: every draft kept means the output is copying a span, and spans run on; climbing
            # by one (as before) spent a short row per token of k after each partial one. benchmarks/spec_simulate.py
            # (SmolLM2, 18 grounded prompts x 128 tokens, steps; its float32 / bf16 outputs): k 8, ngram 1..4: 1765 /
            # 1689 steps climbing by one, 1646 / 1616 going back to k; 6 random prompts: 235 / 218 either way
            t.k = self.k
            t.backoff = FIRST_BACKOFF
        elif accepted:
            t.k = self.k if wide else accepted + 1
            t.backoff = FIRST_BACKOFF
        else:
            t.k //= 2
            if t.k == 0:
                t.wait = t.backoff
                t.backoff = min(2 * t.backoff, self.max_backoff)

    def release(self, request_id: Any) -> None:
        t = self._tracks.pop(request_id, None)
        if t is not None and self._carries_over:
            # the next request goes on from here, its remaining wait included (not the lookups' quiet count: that
            # is the text's)
            self._standing = _Track(t.k, t.wait, t.backoff)
        self.proposer.release(request_id)

    def stats(self) -> dict[str, int | float]:
        """Drafted and accepted tokens, verify rows, and the mean tokens a verified row emitted (1 + accepted)."""
        return {"spec_decode_draft_tokens": self.draft_tokens, "spec_decode_accepted_tokens": self.accepted_tokens,
                "spec_decode_verify_rows": self.verify_rows,
                "spec_decode_acceptance_length": (1 + self.accepted_tokens / self.verify_rows) if self.verify_rows
                else 0.0}

    def close(self) -> None:
        self.proposer.close()
