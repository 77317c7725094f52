"""The scheduler: each step, which requests run, how many tokens each feeds, and in which KV blocks.

A request is a list of known tokens (its prompt, then what it has generated) of which the first ``computed`` have
their K/V in the cache. Each step (``schedule``) gives every running request, in admission order, its next
tokens: one for a decoding request (its last sampled token), a chunk for a prefilling one (at most
``prefill_chunk_tokens`` prompt tokens a step over all rows, so a long prompt is spread over steps instead of
stalling the decodes), all under ``max_num_tokens`` tokens a step. Then waiting requests are admitted in order
while there is room: a free row (``max_running``, the CUDA graphs' largest batch), the token budget, and KV
blocks for the prompt and one token more (``KVCacheManager.admit``, which also reuses a cached prefix).
A request that cannot be admitted waits, in order, and is never dropped. Where a step of prompts' first chunks runs
from one prefill graph (``whole_first_chunks``), a prompt that fits a step whole is not started in the under a
quarter of a chunk a step of first chunks leaves: it waits for the next step, rather than make that step's rest
of it a later chunk (an eager forward). With the prefix cache, a request whose
next uncached prefix block a running request is computing waits until that block is cached (a shared system
prompt arriving with many requests at once is computed once, not once per request admitted in the same step),
while the requests behind it are admitted.

When a running request needs a block and the pool has none, the most recently admitted request is preempted:
its blocks are freed and it goes back to the front of the queue with everything it has generated, to be
recomputed when it is admitted again (a prefill of prompt + generated tokens, from whatever of it the prefix
cache still holds), so that its output continues exactly where it was (greedy: the same tokens).

Speculative decoding: a decoding request with drafts (``Sequence.draft``, set by the runtime before ``schedule``)
feeds its last token and as many drafts as the step's token budget has room for, in one row with KV blocks for all
of them; ``verified`` then keeps the accepted ones and rolls the table back past the rest. A tree of drafts
(``draft_parents``) is fed the same way, its nodes in order; the runtime moves the accepted path's K/V to the
positions after the last token before ``verified``.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from trtllm_pipeline.runtimes.torch_engine.kv_cache import KVCacheManager
from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow, StepPlan


@dataclasses.dataclass(eq=False)
class Sequence:
    """The scheduler's view of a request: its tokens (prompt, then generated) and how many are in the cache."""

    request_id: Any
    prompt: list[int]
    generated: list[int] = dataclasses.field(default_factory=list)
    computed: int = 0
    draft: list[int] = dataclasses.field(default_factory=list)  # tokens proposed for this step (speculation)
    draft_parents: list[int] | None = None  # a tree of drafts: each one's parent (-1: the last token; ``tree``)
    keys: list | None = None  # the prompt's full blocks' prefix-cache keys, hashed once (Scheduler._prefix_keys)
    held: bool = False  # its last token is not read yet and ends it by length: no row until then (chained steps)

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.generated)

    @property
    def decoding(self) -> bool:
        """Everything but its last sampled token is in the cache: it feeds that token next."""
        return bool(self.generated) and self.length - self.computed == 1

    def tokens(self, start: int = 0, stop: int | None = None) -> list[int]:
        """Tokens [start, stop) of prompt + generated (without joining the whole lists for a decode's one)."""
        stop = self.length if stop is None else stop
        p = len(self.prompt)
        if start >= p:
            return self.generated[start - p : stop - p]
        return self.prompt[start:stop] + (self.generated[: stop - p] if stop > p else [])


class Scheduler:
    def __init__(self, kv: KVCacheManager, *, max_running: int, max_num_tokens: int, prefill_chunk_tokens: int):
        self.kv = kv
        self.max_running = max_running
        self.max_num_tokens = max(1, max_num_tokens)
        self.prefill_chunk_tokens = max(1, prefill_chunk_tokens)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []  # admission order: the last is preempted first
        self.deferred = 0  # admissions put off because a running request was computing the same prefix
        # Prompts that fit one step whole are not split to fill a step of first chunks (``schedule``): set where a
        # step of prompts' first chunks runs from a prefill graph (the runtime's ``cuda/prefill_graphs``)
        self.whole_first_chunks = False

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget, prefill = self.max_num_tokens, self.prefill_chunk_tokens
        chunks, later = 0, False  # prefill rows planned, and whether any of them starts past position 0
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            decoding = seq.decoding  # read once: at 256 rows a step the properties' calls were a third of the plan
            n = self._take(seq, budget, prefill, decoding)
            if n == 0:
                i += 1
                continue
            lost = False
            while not self.kv.grow(seq.request_id, seq.computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                plan.preempted.append(victim.request_id)
                if lost := victim is seq:
                    break
            if not lost:
                plan.rows.append(self._row(seq, n, decoding))
                budget -= n
                prefill -= 0 if decoding else n  # a decode and its drafts are no prefill
                chunks += not decoding
                later = later or (not decoding and seq.computed > 0)
                i += 1
        # New requests only in a step that preempted none: room freed by preemption goes to the one preempted. One
        # whose prefix a running request is computing now waits for it (and later ones pass it meanwhile).
        j = 0
        while j < len(self.waiting) and not plan.preempted and len(self.running) < self.max_running and budget > 0:
            seq = self.waiting[j]
            left = min(budget, prefill)
            if self.whole_first_chunks and chunks and not later and \
                    left < min(seq.length, self.prefill_chunk_tokens // 4) and seq.length <= self.prefill_chunk_tokens:
                # A step of first chunks only runs from one prefill graph; this prompt's first part would make the
                # next step's rest of it a later chunk (an eager forward). It fits a step whole, and what this step
                # leaves is under a quarter of a chunk: it waits for the next step, and so does everything behind it
                # (in order). (With more left, splitting it keeps more of the budget than a graph step would win.)
                break
            keys = self._prefix_keys(seq)
            if keys and self.kv.waits_for_prefix(keys):
                j += 1
                self.deferred += 1
                continue
            done = self.kv.admit(seq.request_id, seq.tokens(), seq.length + 1, watermark=bool(self.running),
                                 keys=keys)
            if done is None:
                break
            del self.waiting[j]
            self.running.append(seq)
            seq.computed = done
            n = self._take(seq, budget, prefill)
            if n:
                plan.rows.append(self._row(seq, n))
                budget -= n
                prefill -= n
                chunks += 1
                later = later or done > 0
        return plan

    def _prefix_keys(self, seq: Sequence) -> list | None:
        """The keys of the full blocks of what ``seq`` would prefill (``KVCacheManager.prefix_keys`` of its tokens
        but the last), kept on it while it waits (a prompt's are hashed once); None without the prefix cache."""
        if not self.kv.enable_prefix_cache:
            return None
        if seq.generated:  # a preempted request: its tokens grew, hashed afresh (rare)
            return self.kv.prefix_keys(seq.tokens()[:-1])
        if seq.keys is None:
            seq.keys = self.kv.prefix_keys(seq.prompt[:-1])
        return seq.keys

    def _take(self, seq: Sequence, budget: int, prefill: int, decoding: bool | None = None) -> int:
        """Tokens ``seq`` feeds this step: its decode token and the drafts the budget has room for, or a chunk
        of what it has not computed yet (``decoding``: ``seq.decoding``, if the caller has it)."""
        if seq.held:
            return 0
        if seq.decoding if decoding is None else decoding:  # its last sampled token, then its drafts
            return 1 + min(len(seq.draft), budget - 1)
        return max(0, min(seq.length - seq.computed, budget, prefill))

    def _row(self, seq: Sequence, n: int, decoding: bool | None = None) -> PlanRow:
        if seq.decoding if decoding is None else decoding:  # all but its last sampled token cached: that one
            drafts = seq.draft[: n - 1]  # (a tree's first nodes are a tree: parents come first)
            parents = None if seq.draft_parents is None else [-1] + [p + 1 for p in seq.draft_parents[: n - 1]]
            return PlanRow(seq.request_id, seq.generated[-1:] + drafts, seq.computed,
                           self.kv.tables[seq.request_id], sample=True, draft=len(drafts), parents=parents)
        return PlanRow(seq.request_id, seq.tokens(seq.computed, seq.computed + n), seq.computed,
                       self.kv.tables[seq.request_id], sample=seq.computed + n == seq.length)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.preempted(seq.request_id)
        seq.computed = 0
        seq.draft, seq.draft_parents = [], None
        self.waiting.appendleft(seq)

    def advance(self, seq: Sequence, n: int, *, commit: bool = True) -> None:
        """``seq``'s row of ``n`` tokens ran: they are in the cache (full blocks keyed for the prefix cache, unless
        ``commit`` is off: tokens not known on the host yet, keyed by a later ``advance``)."""
        before, seq.computed = seq.computed, seq.computed + n
        if commit and seq.computed // self.kv.block_size > before // self.kv.block_size:
            self.kv.commit(seq.request_id, seq.tokens(0, seq.computed))

    def verified(self, seq: Sequence, fed: int) -> None:
        """``seq``'s verify row ran and kept ``fed`` of its tokens (its last token and the accepted drafts; the
        emitted tokens already appended to ``generated``): those are cached; the rejected drafts' positions are
        dropped (written, never keyed, overwritten later) and blocks wholly past the kept length freed."""
        seq.draft, seq.draft_parents = [], None
        self.advance(seq, fed)
        self.kv.trim(seq.request_id, seq.length)

    def finish(self, seq: Sequence) -> None:
        """``seq`` is done (or cancelled, or failed): its blocks go back to the pool."""
        if seq in self.running:
            self.running.remove(seq)
            self.kv.free(seq.request_id)
        elif seq in self.waiting:
            self.waiting.remove(seq)
