"""The proposer interface, prompt lookup (n-gram), and the registry of proposers by name.

A proposer sees each decoding request's token history (prompt, then generated; ``DraftRequest``) and returns up to
``k`` draft tokens for it (fewer, or none, when it has no good guess). The drafts are a point mass: the proposer
commits to one token per position, so the target's rejection rule needs no draft distribution (``acceptance``).
Requests come in a batch so that a model-based proposer can run them together; ``release`` forgets a request.
``registry.PROPOSERS`` names them (``runtime.speculative.method``).
"""

from __future__ import annotations

import dataclasses
from array import array
from typing import Any, Iterator, Sequence


@dataclasses.dataclass
class DraftRequest:
    request_id: Any
    prompt: Sequence[int]
    generated: Sequence[int]
    k: int  # at most this many drafts


class Proposer:
    name = "proposer"
    # ``Speculator``'s turn-down: how many decode steps a request whose drafts keep missing waits at most between
    # probes (None: ``speculator.MAX_BACKOFF``), and whether a new request starts from the last finished one's state
    # (where acceptance is the proposer's more than the request's text, and each probe costs model forwards)
    max_backoff: int | None = None
    learns_across_requests = False

    def propose(self, batch: Sequence[DraftRequest]) -> list:
        """Up to ``r.k`` draft tokens for each request of ``batch``, in order (a list of tokens; a tree proposer's
        are ``tree.DraftTree``s, at most ``r.k`` deep)."""
        raise NotImplementedError

    def release(self, request_id: Any) -> None:
        """``request_id`` is finished (or preempted): drop what is kept for it."""

    def close(self) -> None:
        """Free what the proposer holds (a draft model's weights and cache)."""


class NgramProposer(Proposer):
    """Prompt lookup: the request's last ``n`` tokens (``n`` from ``max_n`` down to ``min_n``) searched for in its
    earlier history, most recent occurrence first; the tokens that followed it are the drafts. Costs no model call:
    a request whose history never repeats simply gets none (and runs as a plain decode)."""

    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 4):
        self.min_n, self.max_n = min_n, max_n
        self._history: dict[Any, array] = {}  # per request, its tokens as int32 bytes (searched in C by rfind)

    def propose(self, batch):
        return [self._lookup(r) for r in batch]

    def _lookup(self, r: DraftRequest) -> list[int]:
        return lookup(self._synced(r), r.k, self.min_n, self.max_n)

    def _synced(self, r: DraftRequest) -> array:
        """``r``'s history, brought up to its tokens now (appended to, not rebuilt, at each step)."""
        hist = self._history.setdefault(r.request_id, array("i"))
        total = len(r.prompt) + len(r.generated)
        if len(hist) > total:  # not this request's history any more (an id reused): start again
            del hist[:]
        if len(hist) < len(r.prompt):
            hist.extend(r.prompt[len(hist):])
        if len(hist) < total:
            hist.extend(r.generated[len(hist) - len(r.prompt):])
        return hist

    def release(self, request_id):
        self._history.pop(request_id, None)


def lookup(hist: array, k: int, min_n: int, max_n: int) -> list[int]:
    """The continuation (``k`` tokens) of the latest earlier occurrence of ``hist``'s last n tokens, or none."""
    for n in range(min(max_n, len(hist) - 1), min_n - 1, -1):
        start = next(occurrences(hist, n), None)
        if start is not None:
            return continuation(hist, start, k)
    return []


def occurrences(hist: array, n: int) -> Iterator[int]:
    """Where the continuations of the earlier occurrences of ``hist``'s last ``n`` tokens start, most recent first
    (an occurrence must end before the last token, so something follows it)."""
    data, size = hist.tobytes(), hist.itemsize
    total = len(hist)
    pattern = data[(total - n) * size :]
    end = (total - 1) * size
    while True:
        at = data.rfind(pattern, 0, end)  # searched in C
        if at < 0:
            return
        if at % size == 0:  # aligned on a token, not across two
            yield at // size + n
        end = at + len(pattern) - 1


def continuation(hist: array, start: int, k: int) -> list[int]:
    """``k`` tokens of ``hist`` from ``start``: cut by the history's end, the text repeats with period
    ``len(hist) - start`` since that occurrence, so the drafts go on repeating it (a looping output drafts k tokens,
    not one period)."""
    drafts = hist[start : start + k].tolist()
    period = len(hist) - start
    while len(drafts) < k:
        drafts.append(drafts[len(drafts) - period])
    return drafts
