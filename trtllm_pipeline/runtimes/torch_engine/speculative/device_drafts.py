"""Prompt lookup (n-gram) drafts and greedy acceptance on the device, so that a verify step's successor can be made
without a host round trip.

``proposer.NgramProposer`` drafts on the host: every verify step's result must come back before the next step's
drafts exist, which on a small model costs more than the step itself. ``DeviceDrafts`` keeps each table row's token
history on the device and does the same work there with tensor ops of fixed shapes (shapes from the constructor's
arguments and the inputs' shapes, never from values), no host synchronisation, and in-place writes into state
tensors allocated once: ``after_step`` and ``fill_inputs`` can run chained on the stream and be captured into a CUDA
graph. The drafts are exactly ``proposer.lookup``'s (the latest earlier occurrence of the last n tokens, n from
``max_n`` down to ``min_n``, its continuation repeated periodically when cut by the history's end) and the acceptance
is exactly ``acceptance.accept_greedy``'s.

Row ``rows`` of every state tensor is a sink, and column ``max_len`` of ``history`` too: writes that must not land
(padding spans, masked-out tokens, a full history) are aimed there instead of being skipped, which would need a
value-dependent shape.
"""

from __future__ import annotations

from typing import Sequence

import torch


class DeviceDrafts:
    """Prompt lookup and greedy acceptance on the device, per table row (a request's row of the fast path)."""

    def __init__(self, rows: int, max_len: int, k: int, min_n: int, max_n: int, device: torch.device | str):
        if rows < 1 or max_len < 1 or k < 1 or not 1 <= min_n <= max_n:
            raise ValueError(f"DeviceDrafts needs rows, max_len, k >= 1 and 1 <= min_n <= max_n: got {rows=}, "
                             f"{max_len=}, {k=}, {min_n=}, {max_n=}")
        self.rows, self.max_len, self.k, self.min_n, self.max_n = rows, max_len, k, min_n, max_n
        self.device = torch.device(device)
        self.sink = rows
        self.out_width = 2 * k + 3  # count, k + 1 emitted, found, k drafts
        i64 = dict(dtype=torch.int64, device=self.device)
        self.history = torch.full((rows + 1, max_len + 1), -1, **i64)  # column max_len: the sink column
        self.length = torch.zeros(rows + 1, **i64)
        self.next_token = torch.zeros(rows + 1, **i64)
        self.next_position = torch.zeros(rows + 1, **i64)
        self.next_drafts = torch.zeros(rows + 1, k, **i64)
        self.found = torch.zeros(rows + 1, **i64)
        # constants the calls index with (made once: nothing is allocated from the host inside a captured call)
        self._j = torch.arange(k, **i64)  # draft index
        self._i = torch.arange(k + 1, **i64)  # emitted index
        self._e = torch.arange(max_len, **i64)  # where an occurrence ends

    def load(self, row: int, tokens: Sequence[int]) -> None:
        """Start table row ``row`` with ``tokens`` (prompt, and what is generated so far): its history, and its next
        step's inputs (the last token at its position, and its drafts). A host-to-device copy: once per request."""
        if not 0 <= row < self.rows:
            raise ValueError(f"row {row} is not a table row (0 .. {self.rows - 1})")
        if not 1 <= len(tokens) <= self.max_len:
            raise ValueError(f"a history of {len(tokens)} tokens does not fit a row (1 .. {self.max_len})")
        values = torch.tensor(list(tokens), dtype=torch.int64).to(self.device)
        self.history[row].fill_(-1)
        self.history[row, : len(tokens)] = values
        self.length[row] = len(tokens)
        self.next_token[row] = int(tokens[-1])
        self.next_position[row] = len(tokens) - 1
        index = torch.tensor([row], dtype=torch.int64, device=self.device)
        drafts, found = self._lookup(index, self.next_token[index])
        self.next_drafts[row] = drafts[0]
        self.found[row] = found[0]

    def after_step(self, tokens: torch.Tensor, positions: torch.Tensor, greedy: torch.Tensor, spans: torch.Tensor,
                   out: torch.Tensor) -> None:
        """Take a decode/verify step's result: per span ``(first, n, r)`` (token rows ``first ..`` hold table row
        ``r``'s last token and ``n - 1`` drafts; ``n == 0``: padding), accept greedily, append the emitted tokens to
        ``r``'s history, set its next token, position and drafts, and write ``out``'s row (``parse`` reads it).
        Fixed shapes, no host synchronisation: capturable."""
        k, sink = self.k, self.sink
        last = tokens.shape[0] - 1
        first, n, r = spans[:, 0], spans[:, 1], spans[:, 2]
        real = n > 0
        row = torch.where(real, r, sink)  # padding writes the sink, whatever its r says
        # acceptance: drafts tokens[first + 1 + j] kept while each equals the target's choice greedy[first + j]
        draft_at = (first[:, None] + 1 + self._j).clamp(0, last)
        choice_at = (first[:, None] + self._j).clamp(0, last)
        agree = (tokens[draft_at] == greedy[choice_at]) & (self._j < (n - 1)[:, None])
        a = agree.long().cumprod(1).sum(1)  # [B]
        # emitted: the kept drafts (each equal to the target's choice there), then the target's own token
        emitted_at = (first[:, None] + self._i).clamp(0, last)
        keep = (self._i <= a[:, None]) & real[:, None]  # [B, k + 1]
        emitted = torch.where(keep, greedy[emitted_at], -1)
        count = torch.where(real, a + 1, 0)
        # append to the history (past max_len, or masked out: the sink column), then the length, clamped
        start = self.length[row]
        column = torch.where(keep, start[:, None] + self._i, self.max_len).clamp(max=self.max_len)
        self.history.index_put_((row[:, None].expand_as(column), column), emitted)
        length = (start + count).clamp(max=self.max_len)
        self.length.index_put_((row,), length)
        token = greedy[(first + a).clamp(0, last)]
        self.next_token.index_put_((row,), token)
        self.next_position.index_put_((row,), positions[first.clamp(0, last)] + a + 1)
        drafts, found = self._lookup(row, token)
        self.next_drafts.index_put_((row,), drafts)
        self.found.index_put_((row,), found)
        out[:, 0] = count
        out[:, 1 : k + 2] = emitted
        out[:, k + 2] = torch.where(real, found, 0)
        out[:, k + 3 :] = torch.where(real[:, None], drafts, -1)

    def _lookup(self, row: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``proposer.lookup``'s drafts ([B, k]) for table rows ``row`` ([B]) on their histories now, and whether an
        n-gram matched ([B], 0/1); none: ``token`` ([B]) repeated. O(B * max_len * max_n), no host read."""
        max_len, k = self.max_len, self.k
        hist = self.history[row, :max_len]  # [B, max_len], a copy
        length = self.length[row]  # [B], >= 1 for a loaded row
        # matched[b, e]: how many tokens ending at e equal the history's last ones (counted up to max_n):
        # an occurrence of the last n tokens ends at e iff matched >= n
        matched = torch.zeros_like(hist)
        run = torch.ones_like(hist)
        for t in range(self.max_n):
            want = hist.gather(1, (length - 1 - t).clamp(min=0)[:, None])  # [B, 1]; t > length - 1: no valid n
            have = torch.cat([hist.new_full((hist.shape[0], t), -1), hist[:, : max_len - t]], 1)  # hist[e - t]
            run = run * ((have == want) & (self._e >= t)).long()
            matched = matched + run
        before_last = self._e[None, :] <= (length - 2)[:, None]  # something follows the occurrence
        end = torch.full_like(length, -1)  # the chosen occurrence's end; the largest n that has one wins
        for n in range(self.min_n, self.max_n + 1):
            latest = torch.where((matched >= n) & before_last, self._e, -1).amax(1)
            end = torch.where((latest >= 0) & (length - 1 >= n), latest, end)
        found = (end >= 0).long()
        start = end + 1  # the continuation's first index; cut by the end, it repeats with period length - start
        period = (length - start).clamp(min=1)
        drafts = hist.gather(1, (start[:, None] + self._j % period[:, None]).clamp(0, max_len - 1))
        drafts = torch.where(found[:, None] > 0, drafts, token[:, None].expand(-1, k))
        return drafts, found

    def fill_inputs(self, tokens: torch.Tensor, positions: torch.Tensor, sources: torch.Tensor) -> None:
        """Make a step's inputs from the rows' state on the device: per token row, ``sources`` ``r * (k + 1) + j``
        (table row ``r``'s next token when ``j == 0``, else its draft ``j - 1``; at its next position + ``j``) or -1
        (keep the row's token and position). In place, no host read: chains on a step whose results were not read."""
        width = self.k + 1
        valid = sources >= 0
        source = sources.clamp(min=0)
        r, j = (source // width).clamp(max=self.sink), source % width
        drafted = self.next_drafts[r, (j - 1).clamp(min=0)]
        tokens.copy_(torch.where(valid, torch.where(j == 0, self.next_token[r], drafted), tokens))
        positions.copy_(torch.where(valid, self.next_position[r] + j, positions))

    @staticmethod
    def parse(row: Sequence[int], k: int) -> tuple[list[int], bool, list[int]]:
        """One ``out`` row read on the host: (the emitted tokens, whether an n-gram matched, the next drafts: the
        filler, the next token repeated, when none did)."""
        count = int(row[0])
        return [int(t) for t in row[1 : 1 + count]], bool(row[k + 2]), [int(t) for t in row[k + 3 : 2 * k + 3]]
