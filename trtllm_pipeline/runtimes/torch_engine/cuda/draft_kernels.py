"""``DeviceDrafts.after_step`` and ``DeviceDrafts.fill_inputs`` as one Triton launch each, on the same state tensors
in place, with the same results.

The torch versions are fixed-shape tensor ops: ~65 tiny kernels for ``after_step`` and ~10 for ``fill_inputs``,
100-150 us a step on a GPU, beside a 0.64 ms decode step of a small model. Here ``after_step`` is one program per
span (acceptance by scalar loads, the append, then the n-gram scan over the updated history in BLOCK-wide chunks up
to the row's length, not max_len) and ``fill_inputs`` one program per BLOCK token rows. Neither wrapper reads a
value on the host or allocates: both can be captured in a CUDA graph. The torch methods stay the reference
(tests/draft_kernels_check.py compares the two).

One difference nothing can see: emitted tokens past a full history are dropped here, where the torch version aims
them at the sink column ``max_len`` (a scratch column no lookup reads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_pipeline.runtimes.torch_engine.speculative.device_drafts import DeviceDrafts

BLOCK = 1024  # history positions an after_step program scans per iteration
FILL_BLOCK = 128  # token rows per fill_inputs program


@triton.jit
def _after_step_kernel(tokens_ptr, positions_ptr, greedy_ptr, spans_ptr, out_ptr, hist_ptr, length_ptr,
                       next_token_ptr, next_position_ptr, next_drafts_ptr, found_ptr,
                       stride_tok, stride_pos, stride_greedy, stride_span, stride_field, stride_out, stride_out_col,
                       stride_hist, stride_drafts, last, sink,
                       MAX_LEN: tl.constexpr, K: tl.constexpr, MIN_N: tl.constexpr, MAX_N: tl.constexpr,
                       K_POW: tl.constexpr, EMIT_POW: tl.constexpr, N_POW: tl.constexpr, BLOCK: tl.constexpr):
    span = tl.program_id(0)
    first = tl.load(spans_ptr + span * stride_span)
    n = tl.load(spans_ptr + span * stride_span + stride_field)
    r = tl.load(spans_ptr + span * stride_span + 2 * stride_field)
    real = n > 0
    # padding works on the sink row, as the torch version does (its length stays 0: nothing is appended there);
    # a negative r counts from the end, as torch's indexing does
    row = tl.where(real, r, sink)
    row = tl.where(row < 0, row + sink + 1, row)
    # every token-row index clamped to [0, last] as the torch version's gathers are: same values for any span
    first_at = tl.minimum(tl.maximum(first, 0), last)

    # acceptance: draft first + 1 + j kept while it and every earlier one equal the target's choice at first + j
    a = first * 0
    going = real
    for j in tl.static_range(K):
        draft = tl.load(tokens_ptr + tl.minimum(tl.maximum(first + 1 + j, 0), last) * stride_tok)
        choice = tl.load(greedy_ptr + tl.minimum(tl.maximum(first + j, 0), last) * stride_greedy)
        going = going & (draft == choice) & (j < n - 1)
        a += going.to(tl.int64)

    # emitted: the kept drafts (equal to the target's choices there), then the target's own token
    i = tl.arange(0, EMIT_POW)
    in_emit = i < K + 1  # EMIT_POW: k + 1 rounded up to a power of two
    emitted_at = tl.minimum(tl.maximum(first + i, 0), last)
    keep = (i <= a) & real & in_emit
    emitted = tl.where(keep, tl.load(greedy_ptr + emitted_at * stride_greedy, mask=in_emit, other=-1), -1)
    count = tl.where(real, a + 1, 0)
    hist_row = hist_ptr + row * stride_hist
    start = tl.load(length_ptr + row)
    column = start + i
    tl.store(hist_row + column, emitted, mask=keep & (column < MAX_LEN))  # past a full history: dropped
    length = tl.minimum(start + count, MAX_LEN)
    tl.store(length_ptr + row, length)
    token = tl.load(greedy_ptr + tl.minimum(tl.maximum(first + a, 0), last) * stride_greedy)
    tl.store(next_token_ptr + row, token)
    tl.store(next_position_ptr + row, tl.load(positions_ptr + first_at * stride_pos) + a + 1)
    # the scan below reads what other threads of this program have just stored
    tl.debug_barrier()

    # n-gram lookup over the updated history: for each n in MIN_N .. MAX_N, the latest end e <= length - 2 of an
    # occurrence of the last n tokens (matched[e] >= n: the tokens ending at e equal the last ones, counted up to
    # MAX_N); the largest n with one wins
    ns = MIN_N + tl.arange(0, N_POW)
    latest = tl.full([N_POW], -1, tl.int64)
    for base in range(0, length - 1, BLOCK):
        e = base + tl.arange(0, BLOCK).to(tl.int64)
        before_last = e <= length - 2  # something follows the occurrence
        run = before_last
        matched = tl.zeros([BLOCK], tl.int32)
        for t in tl.static_range(MAX_N):
            want = tl.load(hist_row + tl.maximum(length - 1 - t, 0))  # t > length - 1: no n that uses it is valid
            have = tl.load(hist_row + e - t, mask=before_last & (e >= t), other=-1)
            run = run & (e >= t) & (have == want)
            matched += run.to(tl.int32)
        hit = (matched[:, None] >= ns[None, :]) & before_last[:, None]
        latest = tl.maximum(latest, tl.max(tl.where(hit, e[:, None], -1), 0))
    usable = (latest >= 0) & (ns <= MAX_N) & (ns <= length - 1)
    best_n = tl.max(tl.where(usable, ns, -1), 0)
    end = tl.max(tl.where(ns == best_n, latest, -1), 0)  # -1: no n matched
    found = (end >= 0).to(tl.int64)

    # drafts: the continuation after the occurrence, repeated with period length - start where the history ends it;
    # none found: the next token repeated
    j = tl.arange(0, K_POW)
    in_k = j < K
    begin = end + 1
    period = tl.maximum(length - begin, 1)
    at = tl.minimum(tl.maximum(begin + j % period, 0), MAX_LEN - 1)
    drafts = tl.load(hist_row + at, mask=in_k, other=-1)
    drafts = tl.where(found > 0, drafts, token)
    tl.store(next_drafts_ptr + row * stride_drafts + j, drafts, mask=in_k)
    tl.store(found_ptr + row, found)

    # out's row: count, k + 1 emitted (-1 past the count), found, k drafts (padding: 0, -1 ..., 0, -1 ...)
    out_row = out_ptr + span * stride_out
    tl.store(out_row, count)
    tl.store(out_row + (1 + i) * stride_out_col, emitted, mask=in_emit)
    tl.store(out_row + (K + 2) * stride_out_col, tl.where(real, found, 0))
    tl.store(out_row + (K + 3 + j) * stride_out_col, tl.where(real, drafts, -1), mask=in_k)


@triton.jit
def _fill_inputs_kernel(tokens_ptr, positions_ptr, sources_ptr, next_token_ptr, next_position_ptr, next_drafts_ptr,
                        T, stride_tok, stride_pos, stride_src, stride_drafts, sink,
                        K: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_t = rows < T
    source = tl.load(sources_ptr + rows * stride_src, mask=in_t, other=-1)
    valid = source >= 0
    s = tl.maximum(source, 0)
    r = tl.minimum(s // (K + 1), sink)
    j = s % (K + 1)
    # every load is masked to the rows that take it: -1 rows keep their token and position untouched
    drafted = tl.load(next_drafts_ptr + r * stride_drafts + tl.maximum(j - 1, 0), mask=valid & in_t & (j > 0))
    next_token = tl.load(next_token_ptr + r, mask=valid & in_t & (j == 0))
    position = tl.load(next_position_ptr + r, mask=valid & in_t) + j
    tl.store(tokens_ptr + rows * stride_tok, tl.where(j == 0, next_token, drafted), mask=valid & in_t)
    tl.store(positions_ptr + rows * stride_pos, position, mask=valid & in_t)


def after_step(d: DeviceDrafts, tokens: torch.Tensor, positions: torch.Tensor, greedy: torch.Tensor,
               spans: torch.Tensor, out: torch.Tensor, block: int = BLOCK) -> None:
    """``d.after_step(tokens, positions, greedy, spans, out)`` in one launch (one program per span): same arguments
    (``spans`` [S, 3] of any strides), same in-place effects. ``block``: history positions scanned per iteration
    (a power of two; small only to keep the interpreter's tests quick). No host read: capturable."""
    spans_n = spans.shape[0]
    if spans_n == 0:
        return
    assert spans.shape[1] == 3 and out.shape == (spans_n, d.out_width)
    _after_step_kernel[(spans_n,)](
        tokens, positions, greedy, spans, out, d.history, d.length, d.next_token, d.next_position, d.next_drafts,
        d.found, tokens.stride(0), positions.stride(0), greedy.stride(0), spans.stride(0), spans.stride(1),
        out.stride(0), out.stride(1), d.history.stride(0), d.next_drafts.stride(0), tokens.shape[0] - 1, d.sink,
        MAX_LEN=d.max_len, K=d.k, MIN_N=d.min_n, MAX_N=d.max_n, K_POW=triton.next_power_of_2(d.k),
        EMIT_POW=triton.next_power_of_2(d.k + 1), N_POW=triton.next_power_of_2(d.max_n - d.min_n + 1), BLOCK=block)


def fill_inputs(d: DeviceDrafts, tokens: torch.Tensor, positions: torch.Tensor, sources: torch.Tensor,
                block: int = FILL_BLOCK) -> None:
    """``d.fill_inputs(tokens, positions, sources)`` in one launch: same arguments, same in-place effects. No host
    read: capturable."""
    rows = tokens.shape[0]
    if rows == 0:
        return
    assert positions.shape[0] == rows and sources.shape[0] == rows
    _fill_inputs_kernel[(triton.cdiv(rows, block),)](
        tokens, positions, sources, d.next_token, d.next_position, d.next_drafts, rows, tokens.stride(0),
        positions.stride(0), sources.stride(0), d.next_drafts.stride(0), d.sink, K=d.k, BLOCK=block)
