"""INT4-AWQ at batch 1: a matrix-vector product with the integer dot-product instruction, not a padded tensor-core dot.

At M = 1 quant_linear's swapped dot pads the activation to 16 columns and sends each unpacked weight tile
through shared memory to the dot-operand layout (0.65-0.9 TB/s on the H200). A float32 CUDA-core GEMV
(this module before: a nibble to float32 by LOP3 + FADD, then FFMA) spent 5.2-8.3 instructions per weight
and stayed issue-bound at 1.4 TB/s (docs/perf-notes.md). Here four weights cost about one instruction:

* The input comes prepared by the kernel that produced it (``gemv_input``): int16 block floating point,
  one power of two per 16 inputs, split into a signed high-byte plane and an unsigned low-byte plane, four
  inputs per int32 word, with each block's -8 x sum. No per-program pre-quant multiply or rounding.
* The packed weight is read as int32 words: byte b of a word holds rows 2j (low nibble) and 2j+1 (high
  nibble) at input 4w + b. ``(word & 0x0F0F0F0F) ^ 0x08080808`` is row 2j's four q + 8 as unsigned bytes (one
  LOP3; the constants come in as registers so mask and XOR fuse), ``word >> 4`` first for row 2j+1.
* ``dp4a`` multiplies a word's four bytes with the input word's and adds the int32 accumulator: per block
  of 4 words, a chain over the high plane, shifted by 8 bits, carries into the chain over the low plane,
  starting from the block's -8 x sum, so the int32 result is ``sum q x_int`` exactly (< 2^22).
* Per block and row, one I2F and one FFMA: the result times the group scale times the block's 2^E into
  the float32 accumulators, summed over K at the end. On Hopper the weight tiles and the input's two byte
  planes (one box) come by the bulk tensor copy engine into shared memory, the compiler's pipeline keeping
  two tiles in flight while one is computed (``TMA``; the decode step pins one shared-memory carveout on its
  layer kernels, ``carveout``), and row 2j+1's nibbles are used in place, as 16 (q + 8), with no shift; by
  default the warp-specialized kernel of ``quant_gemv_ws`` does the same work there. Elsewhere loads go
  straight to registers, the next tile's issued before this one is computed where K is long (``pick_config``).
* Split K, the row tile's last program (an acquire/release counter) sums the splits' partials in split
  order into the first, so the next kernel reads one row; the GLU split the same way finishes SiLU there.

The products are exact; the input's int16 rounding (exact within 2^7 of a block's largest bfloat16, else at
2^-15 of it) is the only difference from the float32 ``x @ W^T`` (1e-5 relative, a hundredth of eager's own
error). Output: the same float32 split-K partials (or, for mlp.fc + mlp.gate, ``silu(fc) * gate``, and then
mlp.proj's prepared input) as quant_linear's kernels. Only INT4-AWQ (W4A16) takes it: W4A8 rounds every scaled
weight to E4M3 (the tensor cores' operand). At M = 2-16 ``_int4_gemv_rows_kernel`` unpacks each weight tile once
and applies it to every row (dp4a per row: the rows' cost grows by 0.5 dp4a a weight each, so past a few rows the
tensor cores' GEMM, which multiplies by the rows for free, wins); the decode step takes it only where quant_gemm's
measured table says so, or under ``ROWS_ENV``. Triton's interpreter cannot run PTX, so there ``dp4a`` is the same
sum from shifts (``ASM=False``); ``tools/gemv_sass.py`` counts the GPU's instructions on a CPU machine.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.torch_engine.cuda import fixed_sum, gemv_input, quant_gemv_ws
from trtllm_pipeline.runtimes.torch_engine.cuda.dp4a import dp4a
from trtllm_pipeline.runtimes.torch_engine.cuda.gemv_input import consumer_input, store_planes, width
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, last_program, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.support import interpreting


@triton.jit
def _quarters(t):
    """The 4 entries of the last axis of ``t`` [A, B, 4] (a thread holds them: one 16-byte load) as 4 [A, B]; or
    of [R, A, B, 4] as 4 [R, A, B] (the several-row GEMV's input rows, or its one unpacked tile with R = 1)."""
    if len(t.shape) == 3:
        t02, t13 = tl.split(tl.reshape(t, (t.shape[0], t.shape[1], 2, 2)))
    else:
        t02, t13 = tl.split(tl.reshape(t, (t.shape[0], t.shape[1], t.shape[2], 2, 2)))
    t0, t2 = tl.split(t02)
    t1, t3 = tl.split(t13)
    return t0, t1, t2, t3


@triton.jit
def _block_dot(u, xh, xl, c, XW: tl.constexpr, ASM: tl.constexpr):
    """Per row and input block, ``sum (q + 8) x_int - 8 sum x_int = sum q x_int`` exactly in int32.

    ``u`` [HALF, NB, XW]: the nibbles q + 8 of one output row as bytes (a word: 4 inputs); ``xh``/``xl`` [1, NB,
    XW]: the input's byte planes; ``c`` [1, NB]: the block's -8 sum x_int. The high plane's chain is shifted by 8 bits
    and then carries the low plane's (|result| < 2^22: the later float conversion is exact).

    Several input rows (``_int4_gemv_rows_kernel``): ``u`` [1, HALF, NB, XW], the tile unpacked once, against
    ``xh``/``xl`` [R, 1, NB, XW] and ``c`` [R, 1, NB]; dp4a broadcasts the unpacked words over the R rows, so the
    result [R, HALF, NB] costs each weight word its LOP3 once and one dp4a per row and plane."""
    if len(u.shape) == 3:
        zero = tl.zeros((u.shape[0], u.shape[1]), dtype=tl.int32)
    else:
        zero = tl.zeros((xh.shape[0], u.shape[1], u.shape[2]), dtype=tl.int32)
    if XW == 4:
        u0, u1, u2, u3 = _quarters(u)
        h0, h1, h2, h3 = _quarters(xh)
        l0, l1, l2, l3 = _quarters(xl)
        a = dp4a(u3, h3, dp4a(u2, h2, dp4a(u1, h1, dp4a(u0, h0, zero, True, ASM), True, ASM), True, ASM), True, ASM)
        a = (a << 8) + c
        a = dp4a(u3, l3, dp4a(u2, l2, dp4a(u1, l1, dp4a(u0, l0, a, False, ASM), False, ASM), False, ASM), False,
                 ASM)
    else:  # XW == 2: blocks of 8 inputs (a scale group of 8)
        u0, u1 = tl.split(u)
        h0, h1 = tl.split(xh)
        l0, l1 = tl.split(xl)
        a = dp4a(u1, h1, dp4a(u0, h0, zero, True, ASM), True, ASM)
        a = (a << 8) + c
        a = dp4a(u1, l1, dp4a(u0, l0, a, False, ASM), False, ASM)
    return a


@triton.jit
def int4_scales(s_ptr, stride_sg, stride_s2, rj, kk, k_tile, j_ok, G, GROUP: tl.constexpr, TILE_SCALE: tl.constexpr):
    """The scales of packed rows ``rj`` (even rows, odd rows) for a K tile: [HALF, 1] when the tile lies in one
    group, else one per input ``kk`` (quant_linear: every input of the tile; here: each input block's first).
    Scales are laid [G, 2, N/2] (``QuantWeight.of``)."""
    if TILE_SCALE:
        g = k_tile // GROUP
        ok = j_ok & (g < G)
        s_lo = tl.load(s_ptr + g * stride_sg + rj, mask=ok, other=0.0)[:, None]
        s_hi = tl.load(s_ptr + g * stride_sg + stride_s2 + rj, mask=ok, other=0.0)[:, None]
    else:
        g = kk // GROUP
        ok = j_ok[:, None] & (g < G)[None, :]
        offs = g[None, :] * stride_sg + rj[:, None]
        s_lo = tl.load(s_ptr + offs, mask=ok, other=0.0)
        s_hi = tl.load(s_ptr + offs + stride_s2, mask=ok, other=0.0)
    return s_lo, s_hi


@triton.jit
def _load_weights(w_ptr, s_ptr, rj, j_ok, words, rb, k_tile, K, G, stride_wn, stride_sg, stride_s2,
                  GROUP: tl.constexpr, XB: tl.constexpr, EVEN: tl.constexpr, TILE_SCALE: tl.constexpr):
    """One K tile of one matrix: packed words [HALF, NB, XW] and scales ([HALF, 1] or [HALF, NB])."""
    wb = k_tile // 4 + words
    w_ptrs = w_ptr + rj[:, None, None] * stride_wn + wb[None]
    if EVEN:
        p = tl.load(w_ptrs)
    else:
        p = tl.load(w_ptrs, mask=j_ok[:, None, None] & (wb < K // 4)[None], other=0)
    s_lo, s_hi = int4_scales(s_ptr, stride_sg, stride_s2, rj, k_tile + rb * XB, k_tile, j_ok, G, GROUP, TILE_SCALE)
    return p, s_lo, s_hi


@triton.jit
def _load_input(xp_ptr, words, rb, k_tile, K, XB: tl.constexpr, EVEN: tl.constexpr):
    """The same K tile of the prepared input: byte planes [1, NB, XW], block sums and powers of two [1, NB]."""
    wb = k_tile // 4 + words
    kb = k_tile + rb * XB  # each block's first input
    if EVEN:
        xh = tl.load(xp_ptr + wb)[None]
        xl = tl.load(xp_ptr + K // 4 + wb)[None]
    else:
        w_ok = wb < K // 4
        xh = tl.load(xp_ptr + wb, mask=w_ok, other=0)[None]
        xl = tl.load(xp_ptr + K // 4 + wb, mask=w_ok, other=0)[None]
    b_ok = kb < K
    c = tl.load(xp_ptr + K // 2 + kb // XB, mask=b_ok, other=0)[None, :]
    step = tl.load(xp_ptr + K // 2 + K // XB + kb // XB, mask=b_ok, other=0).to(tl.float32, bitcast=True)[None, :]
    return xh, xl, c, step


@triton.jit
def _copied_tile(w_desc, x_desc, row0, k_tile, HALF: tl.constexpr, BLOCK_K: tl.constexpr, XB: tl.constexpr):
    """One K tile by the bulk tensor copy engine (``TMA``; rows and inputs past the matrix read as zeros): the
    packed words [HALF, NB, XW] and the input's two byte planes [1, NB, XW] (one box of two rows)."""
    NB: tl.constexpr = BLOCK_K // XB
    XW: tl.constexpr = XB // 4
    p = w_desc.load([row0, k_tile // 4]).reshape(HALF, NB, XW)
    xh, xl = tl.split(tl.permute(x_desc.load([0, k_tile // 4]), (1, 0)))
    return p, xh.reshape(1, NB, XW), xl.reshape(1, NB, XW)


@triton.jit
def _tile_terms(s_ptr, xp_ptr, rc, rb, k_tile, K, G, stride_sg, stride_s2, GROUP: tl.constexpr, XB: tl.constexpr):
    """A copy-engine K tile's small terms by pointer (the compiler's pipeline makes them shared-memory copies):
    the even and odd rows' scales [HALF, 1] (``rc``: rows clamped into the matrix, whose weights past it read
    as zeros) and the input's block sums and powers of two [1, NB] (zero sums past K, where the planes read as
    zeros). Clamped addresses rather than masks, and the two planes in one box: the GLU's loop per thread and
    tile 389 -> 346 instructions (tools/gemv_sass.py)."""
    g = tl.minimum(k_tile // GROUP, G - 1)
    s = s_ptr + g * stride_sg + rc
    s_lo = tl.load(s)[:, None]
    s_hi = tl.load(s + stride_s2)[:, None]
    kb = k_tile // XB + rb
    kc = tl.minimum(kb, K // XB - 1)
    c = tl.where(kb < K // XB, tl.load(xp_ptr + K // 2 + kc), 0)[None, :]
    step = tl.load(xp_ptr + K // 2 + K // XB + kc).to(tl.float32, bitcast=True)[None, :]
    return s_lo, s_hi, c, step


@triton.jit
def _accumulate(p, s_lo, s_hi, xh, xl, c, step, acc_lo, acc_hi, masks, XB: tl.constexpr, ASM: tl.constexpr,
                HIGH_IN_PLACE: tl.constexpr = False):
    """One loaded tile into the float32 accumulators [HALF, NB] of its even and odd rows (``masks``: the
    nibbles' masks and XORs, low then high, as run-time values)."""
    m_nib, m_xor, m_nib_hi, m_xor_hi = masks
    # a byte holds rows 2j (low nibble) and 2j + 1 (high nibble); one LOP3 each: mask, then XOR 8 (q + 8)
    v_lo = _block_dot((p & m_nib) ^ m_xor, xh, xl, c, XB // 4, ASM)
    if HIGH_IN_PLACE:
        # row 2j + 1 left in the high nibble, as bytes 16 (q + 8): no shift, sums 16 times row 2j's kind, so the
        # block's -8 sum is taken 16 times and its power of two a 16th (the int32 sums stay below 2^26 and are
        # multiples of 16, so their float32 conversion is exact: the same numbers as shifting first). Copy-engine
        # loops only: in the register-load ones the extra live values cost registers (proj 128 -> 142).
        v_hi = _block_dot((p & m_nib_hi) ^ m_xor_hi, xh, xl, c << 4, XB // 4, ASM)
        step_hi = step * 0.0625
    else:
        v_hi = _block_dot(((p >> 4) & m_nib) ^ m_xor, xh, xl, c, XB // 4, ASM)
        step_hi = step
    acc_lo += v_lo.to(tl.float32) * (s_lo * step)
    acc_hi += v_hi.to(tl.float32) * (s_hi * step_hi)
    return acc_lo, acc_hi


@triton.jit
def _tile_coords(N, k_iters_per_split, XB: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A program's tile: its packed weight rows ``rj`` (output rows 2 rj and 2 rj + 1) and which of them exist, its
    K tile's input blocks ``rb`` and words ([NB, XW]: the tile's words, block by block), and where its K split
    starts; with the program's ids."""
    HALF: tl.constexpr = BLOCK_N // 2
    XW: tl.constexpr = XB // 4
    NB: tl.constexpr = BLOCK_K // XB
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rj = pid_n * HALF + tl.arange(0, HALF)
    rb = tl.arange(0, NB)
    words = rb[:, None] * XW + tl.arange(0, XW)[None, :]
    return pid_n, pid_s, rj, rj < N // 2, rb, words, pid_s * k_iters_per_split * BLOCK_K


@triton.jit
def _store_partials(y, out_ptr, offs, ok, pid_n, pid_s, stride_os, count_ptr, FIXED: tl.constexpr,
                    REDUCE: tl.constexpr, SPLITS: tl.constexpr):
    """A program's split-K partial ``y`` at ``offs``: added into the int64 accumulators (FIXED: the splits' exact
    sum, whatever order they finish in), or stored as its split's row, summed into split 0's by the row tile's last
    program (REDUCE)."""
    if FIXED:
        fixed_sum.add(out_ptr + offs, y, ok)
    else:
        tl.store(out_ptr + pid_s * stride_os + offs, y, mask=ok)
        if REDUCE and last_program(count_ptr, pid_n, SPLITS):
            tl.store(out_ptr + offs, _split_sum(out_ptr, stride_os, offs, ok, SPLITS), mask=ok)
            tl.store(count_ptr + pid_n, 0)


@triton.jit
def _int4_gemv_kernel(
    xp_ptr, w_ptr, s_ptr, xp2_ptr, w2_ptr, s2_ptr, out_ptr, pqs_out_ptr, xp_out_ptr, count_ptr, ws_ptr, clear_ptr,
    w_desc, w2_desc, x_desc, x2_desc,
    N, K, G, k_iters_per_split, stride_wn, stride_sg, stride_s2, stride_os, clear_n,
    m_nib, m_xor, m_nib_hi, m_xor_hi,
    GROUP: tl.constexpr, XB: tl.constexpr, GLU: tl.constexpr, EVEN: tl.constexpr, TILE_SCALE: tl.constexpr,
    PREPARE_OUT: tl.constexpr, HAS_PQS_OUT: tl.constexpr, XB_OUT: tl.constexpr, SPLITS: tl.constexpr,
    REDUCE: tl.constexpr, FIXED: tl.constexpr, CLEAR: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr, SINGLE: tl.constexpr, EARLY: tl.constexpr, ASM: tl.constexpr,
    PDL: tl.constexpr, TMA: tl.constexpr, STAGES: tl.constexpr,
):
    """Split-K partials of ``x W^T`` for one prepared input row, with FIXED added into int64 accumulators
    (fixed_sum), with REDUCE summed into split 0's row by the row tile's last program (or, with GLU,
    silu(fc) * gate of two matrices, and with PREPARE_OUT that result prepared for the next GEMV too)."""
    HALF: tl.constexpr = BLOCK_N // 2
    NB: tl.constexpr = BLOCK_K // XB
    pid_n, pid_s, rj, j_ok, rb, words, k0 = _tile_coords(N, k_iters_per_split, XB, BLOCK_N, BLOCK_K)
    acc_lo = tl.zeros((HALF, NB), dtype=tl.float32)
    acc_hi = tl.zeros((HALF, NB), dtype=tl.float32)
    acc2_lo = tl.zeros((HALF, NB), dtype=tl.float32)
    acc2_hi = tl.zeros((HALF, NB), dtype=tl.float32)
    masks = (m_nib, m_xor, m_nib_hi, m_xor_hi)
    if TMA:  # tiles by descriptor: the compiler's pipeline keeps STAGES - 1 of them in flight
        # (the first tiles' weights fetched into L2 before the PDL wait measured no faster: runs 48, 52; nor did
        # the scales by plain loads a tile ahead, with or without an L2 prefetch: run 59)
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        rc = tl.minimum(rj, N // 2 - 1)
        for i in tl.range(0, k_iters_per_split, num_stages=STAGES):
            k_tile = k0 + i * BLOCK_K
            p, xh, xl = _copied_tile(w_desc, x_desc, pid_n * HALF, k_tile, HALF, BLOCK_K, XB)
            s_lo, s_hi, c, step = _tile_terms(s_ptr, xp_ptr, rc, rb, k_tile, K, G, stride_sg, stride_s2, GROUP, XB)
            acc_lo, acc_hi = _accumulate(p, s_lo, s_hi, xh, xl, c, step, acc_lo, acc_hi, masks, XB, ASM, True)
            if GLU:
                p2, xh2, xl2 = _copied_tile(w2_desc, x2_desc, pid_n * HALF, k_tile, HALF, BLOCK_K, XB)
                s2_lo, s2_hi, c2, step2 = _tile_terms(s2_ptr, xp2_ptr, rc, rb, k_tile, K, G, stride_sg, stride_s2,
                                                      GROUP, XB)
                acc2_lo, acc2_hi = _accumulate(p2, s2_lo, s2_hi, xh2, xl2, c2, step2, acc2_lo, acc2_hi, masks, XB,
                                               ASM, True)
    else:
        # Weights and scales do not depend on the previous kernel: under PDL (EARLY) the first tile's are loaded
        # before waiting for it, so their DRAM latency overlaps its tail. Only the prepared input is waited for.
        if PDL and not EARLY:
            gdc_wait()
            gdc_launch_dependents()
        w = _load_weights(w_ptr, s_ptr, rj, j_ok, words, rb, k0, K, G, stride_wn, stride_sg, stride_s2, GROUP, XB,
                          EVEN, TILE_SCALE)
        if GLU:
            w2 = _load_weights(w2_ptr, s2_ptr, rj, j_ok, words, rb, k0, K, G, stride_wn, stride_sg, stride_s2, GROUP,
                               XB, EVEN, TILE_SCALE)
        if PDL and EARLY:
            gdc_wait()
            gdc_launch_dependents()
        x = _load_input(xp_ptr, words, rb, k0, K, XB, EVEN)
        if GLU:
            x2 = _load_input(xp2_ptr, words, rb, k0, K, XB, EVEN)
        # Loads go straight to registers (no cp.async through shared memory: pick_config); with PREFETCH the next
        # tile's are issued before this tile is computed, so they are in flight meanwhile (the last tile peeled).
        if SINGLE:  # one K tile per program (qkv, dense at the 7B's K): no loop
            acc_lo, acc_hi = _accumulate(*w, *x, acc_lo, acc_hi, masks, XB, ASM)
            if GLU:
                acc2_lo, acc2_hi = _accumulate(*w2, *x2, acc2_lo, acc2_hi, masks, XB, ASM)
        elif PREFETCH:
            for i in range(k_iters_per_split - 1):
                k_next = k0 + (i + 1) * BLOCK_K
                wn = _load_weights(w_ptr, s_ptr, rj, j_ok, words, rb, k_next, K, G, stride_wn, stride_sg, stride_s2,
                                   GROUP, XB, EVEN, TILE_SCALE)
                xn = _load_input(xp_ptr, words, rb, k_next, K, XB, EVEN)
                if GLU:
                    wn2 = _load_weights(w2_ptr, s2_ptr, rj, j_ok, words, rb, k_next, K, G, stride_wn, stride_sg,
                                        stride_s2, GROUP, XB, EVEN, TILE_SCALE)
                    xn2 = _load_input(xp2_ptr, words, rb, k_next, K, XB, EVEN)
                acc_lo, acc_hi = _accumulate(*w, *x, acc_lo, acc_hi, masks, XB, ASM)
                w = wn
                x = xn
                if GLU:
                    acc2_lo, acc2_hi = _accumulate(*w2, *x2, acc2_lo, acc2_hi, masks, XB, ASM)
                    w2 = wn2
                    x2 = xn2
            acc_lo, acc_hi = _accumulate(*w, *x, acc_lo, acc_hi, masks, XB, ASM)
            if GLU:
                acc2_lo, acc2_hi = _accumulate(*w2, *x2, acc2_lo, acc2_hi, masks, XB, ASM)
        else:  # the first tile (loaded above), then each tile loaded at the top of its iteration
            acc_lo, acc_hi = _accumulate(*w, *x, acc_lo, acc_hi, masks, XB, ASM)
            if GLU:
                acc2_lo, acc2_hi = _accumulate(*w2, *x2, acc2_lo, acc2_hi, masks, XB, ASM)
            for i in range(1, k_iters_per_split):
                k_tile = k0 + i * BLOCK_K
                wi = _load_weights(w_ptr, s_ptr, rj, j_ok, words, rb, k_tile, K, G, stride_wn, stride_sg, stride_s2,
                                   GROUP, XB, EVEN, TILE_SCALE)
                xi = _load_input(xp_ptr, words, rb, k_tile, K, XB, EVEN)
                acc_lo, acc_hi = _accumulate(*wi, *xi, acc_lo, acc_hi, masks, XB, ASM)
                if GLU:
                    wi2 = _load_weights(w2_ptr, s2_ptr, rj, j_ok, words, rb, k_tile, K, G, stride_wn, stride_sg,
                                        stride_s2, GROUP, XB, EVEN, TILE_SCALE)
                    xi2 = _load_input(xp2_ptr, words, rb, k_tile, K, XB, EVEN)
                    acc2_lo, acc2_hi = _accumulate(*wi2, *xi2, acc2_lo, acc2_hi, masks, XB, ASM)
    if CLEAR:  # another linear's accumulators, between their last reader and their next writer (fixed_sum)
        programs = tl.num_programs(0) * tl.num_programs(1)
        fixed_sum.clear(clear_ptr, clear_n, pid_n * tl.num_programs(1) + pid_s, programs, tl.arange(0, 128))
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    # this program's rows in column order: [BLOCK_N]
    y = tl.interleave(tl.sum(acc_lo, axis=1), tl.sum(acc_hi, axis=1))
    if GLU:
        y2 = tl.interleave(tl.sum(acc2_lo, axis=1), tl.sum(acc2_hi, axis=1))
        if SPLITS > 1:  # fc and gate partials to the workspace; the row tile's last program finishes
            tl.store(ws_ptr + pid_s * 2 * N + cols, y, mask=ok)
            tl.store(ws_ptr + pid_s * 2 * N + N + cols, y2, mask=ok)
            if last_program(count_ptr, pid_n, SPLITS):
                y = _split_sum(ws_ptr, 2 * N, cols, ok, SPLITS)
                y2 = _split_sum(ws_ptr + N, 2 * N, cols, ok, SPLITS)
                _glu_out(y, y2, pid_n * BLOCK_N, cols, ok, N, out_ptr, pqs_out_ptr, xp_out_ptr, PREPARE_OUT,
                         HAS_PQS_OUT, XB_OUT, COMPUTE, BLOCK_N)
                tl.store(count_ptr + pid_n, 0)
        else:
            _glu_out(y, y2, pid_n * BLOCK_N, cols, ok, N, out_ptr, pqs_out_ptr, xp_out_ptr, PREPARE_OUT, HAS_PQS_OUT,
                     XB_OUT, COMPUTE, BLOCK_N)
    else:
        _store_partials(y, out_ptr, cols, ok, pid_n, pid_s, stride_os, count_ptr, FIXED, REDUCE, SPLITS)


@triton.jit
def _split_sum(ptr, stride, cols, ok, SPLITS: tl.constexpr):
    """The partials at ``ptr + s * stride + cols`` summed in split order: the same float32 sums whichever
    program comes last (read from L2: other SMs wrote them)."""
    total = tl.zeros(cols.shape, dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        total += tl.load(ptr + s * stride + cols, mask=ok, other=0.0, cache_modifier=".cg")
    return total


@triton.jit
def _glu_out(fc, gate, c0, cols, ok, N, out_ptr, pqs_out_ptr, xp_out_ptr, PREPARE_OUT: tl.constexpr,
             HAS_PQS_OUT: tl.constexpr, XB_OUT: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_N: tl.constexpr):
    """silu(fc) * gate of the row tile from output ``c0``, and (PREPARE_OUT) those BLOCK_N outputs, whole input
    blocks of mlp.proj, prepared as its GEMV's input."""
    act = silu_mul(fc, gate, COMPUTE)
    tl.store(out_ptr + cols, act, mask=ok)
    if PREPARE_OUT:
        v = consumer_input(act, pqs_out_ptr, cols, ok, HAS_PQS_OUT, COMPUTE)
        store_planes(v, c0, N, xp_out_ptr, BLOCK_N, XB_OUT)


@triton.jit
def _load_rows_input(xp_ptr, stride_xp, rm, m_ok, words, rb, k_tile, K, XB: tl.constexpr):
    """``_load_input`` for the prepared rows ``rm`` (``stride_xp`` words apart; rows past M read as zeros, so their
    sums and powers of two are 0 and they add nothing): planes [BLOCK_M, 1, NB, XW], sums and 2^E [BLOCK_M, 1, NB]."""
    wb = (k_tile // 4 + words)[None]
    kb = ((k_tile + rb * XB) // XB)[None]
    row = xp_ptr + rm[:, None] * stride_xp  # [BLOCK_M, 1]
    w_ok = m_ok[:, None, None] & (wb < K // 4)
    b_ok = m_ok[:, None] & (kb < K // XB)
    xh = tl.load(row[:, :, None] + wb, mask=w_ok, other=0)[:, None]
    xl = tl.load(row[:, :, None] + K // 4 + wb, mask=w_ok, other=0)[:, None]
    c = tl.load(row + K // 2 + kb, mask=b_ok, other=0)[:, None]
    step = tl.load(row + K // 2 + K // XB + kb, mask=b_ok, other=0).to(tl.float32, bitcast=True)[:, None]
    return xh, xl, c, step


@triton.jit
def _rows_tile(w_ptr, s_ptr, xp_ptr, stride_xp, rm, m_ok, rj, j_ok, words, rb, k_tile, K, G, stride_wn, stride_sg,
               stride_s2, acc_lo, acc_hi, masks, GROUP: tl.constexpr, XB: tl.constexpr, EVEN: tl.constexpr,
               TILE_SCALE: tl.constexpr, ASM: tl.constexpr):
    """One K tile of one matrix into the rows' accumulators [BLOCK_M, HALF, NB]: the weight words and scales loaded
    once (``_load_weights``, as batch 1 loads them), a leading axis of 1 that the rows' input broadcasts over."""
    p, s_lo, s_hi = _load_weights(w_ptr, s_ptr, rj, j_ok, words, rb, k_tile, K, G, stride_wn, stride_sg, stride_s2,
                                  GROUP, XB, EVEN, TILE_SCALE)
    xh, xl, c, step = _load_rows_input(xp_ptr, stride_xp, rm, m_ok, words, rb, k_tile, K, XB)
    return _accumulate(p[None], s_lo[None], s_hi[None], xh, xl, c, step, acc_lo, acc_hi, masks, XB, ASM)


@triton.jit
def _row(y, rm, r: tl.constexpr):
    """Row ``r`` of ``y`` [BLOCK_M, BLOCK_N] as [BLOCK_N] (the other rows' entries summed in as zeros)."""
    return tl.sum(tl.where(rm[:, None] == r, y, 0.0), axis=0)


@triton.jit
def _int4_gemv_rows_kernel(
    xp_ptr, w_ptr, s_ptr, xp2_ptr, w2_ptr, s2_ptr, out_ptr, pqs_out_ptr, xp_out_ptr, count_ptr, clear_ptr,
    M, N, K, G, k_iters_per_split, stride_xp, stride_wn, stride_sg, stride_s2, stride_os, stride_om, stride_xo,
    clear_n, m_nib, m_xor, m_nib_hi, m_xor_hi,
    GROUP: tl.constexpr, XB: tl.constexpr, GLU: tl.constexpr, EVEN: tl.constexpr, TILE_SCALE: tl.constexpr,
    PREPARE_OUT: tl.constexpr, HAS_PQS_OUT: tl.constexpr, XB_OUT: tl.constexpr, SPLITS: tl.constexpr,
    REDUCE: tl.constexpr, FIXED: tl.constexpr, CLEAR: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr,
):
    """``_int4_gemv_kernel`` for M <= BLOCK_M prepared input rows (``rows_config``): each program unpacks its weight
    tile once per K tile and applies it to every row (dp4a per row against the same unpacked words), BLOCK_M
    accumulators per output row. Per row, the same integer sums and float32 operations in the same order as batch
    1's register-load kernel at the same tiles, so each row's partials are that kernel's bit for bit. Outputs
    [.., M, N] (``stride_om`` between rows): split partials, int64 accumulators (FIXED), split 0's row summed by
    the row tile's last program (REDUCE), or with GLU (K not split) silu(fc) * gate per row, and with PREPARE_OUT
    each row prepared for mlp.proj's GEMV (``stride_xo`` words apart)."""
    HALF: tl.constexpr = BLOCK_N // 2
    NB: tl.constexpr = BLOCK_K // XB
    pid_n, pid_s, rj, j_ok, rb, words, k0 = _tile_coords(N, k_iters_per_split, XB, BLOCK_N, BLOCK_K)
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    acc_lo = tl.zeros((BLOCK_M, HALF, NB), dtype=tl.float32)
    acc_hi = tl.zeros((BLOCK_M, HALF, NB), dtype=tl.float32)
    acc2_lo = tl.zeros((BLOCK_M, HALF, NB), dtype=tl.float32)
    acc2_hi = tl.zeros((BLOCK_M, HALF, NB), dtype=tl.float32)
    masks = (m_nib, m_xor, m_nib_hi, m_xor_hi)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    # STAGES 1: loads straight to registers, as batch 1's register kernel (pick_config); more: the compiler's
    # pipeline through shared memory (the H200 sweep compares them: the rows' planes are M times batch 1's)
    for i in tl.range(0, k_iters_per_split, num_stages=STAGES):
        k_tile = k0 + i * BLOCK_K
        acc_lo, acc_hi = _rows_tile(w_ptr, s_ptr, xp_ptr, stride_xp, rm, m_ok, rj, j_ok, words, rb, k_tile, K, G,
                                    stride_wn, stride_sg, stride_s2, acc_lo, acc_hi, masks, GROUP, XB, EVEN,
                                    TILE_SCALE, ASM)
        if GLU:
            acc2_lo, acc2_hi = _rows_tile(w2_ptr, s2_ptr, xp2_ptr, stride_xp, rm, m_ok, rj, j_ok, words, rb, k_tile,
                                          K, G, stride_wn, stride_sg, stride_s2, acc2_lo, acc2_hi, masks, GROUP, XB,
                                          EVEN, TILE_SCALE, ASM)
    if CLEAR:  # another linear's accumulators, between their last reader and their next writer (fixed_sum)
        programs = tl.num_programs(0) * tl.num_programs(1)
        fixed_sum.clear(clear_ptr, clear_n, pid_n * tl.num_programs(1) + pid_s, programs, tl.arange(0, 128))
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = m_ok[:, None] & (cols < N)[None, :]
    offs = rm[:, None] * stride_om + cols[None, :]
    y = tl.interleave(tl.sum(acc_lo, axis=2), tl.sum(acc_hi, axis=2))  # [BLOCK_M, BLOCK_N] in column order
    if GLU:
        y2 = tl.interleave(tl.sum(acc2_lo, axis=2), tl.sum(acc2_hi, axis=2))
        for r in tl.static_range(BLOCK_M):  # batch 1's epilogue per row (SiLU, the proj input's blocks)
            if r < M:
                _glu_out(_row(y, rm, r), _row(y2, rm, r), pid_n * BLOCK_N, cols, cols < N, N,
                         out_ptr + r * stride_om, pqs_out_ptr, xp_out_ptr + r * stride_xo, PREPARE_OUT, HAS_PQS_OUT,
                         XB_OUT, COMPUTE, BLOCK_N)
    else:
        _store_partials(y, out_ptr, offs, ok, pid_n, pid_s, stride_os, count_ptr, FIXED, REDUCE, SPLITS)


# Under PDL, which programs load their first weight tile before waiting for the previous kernel: "all",
# "loops" (those with more than one K tile: the others' registers go 56 -> 136 with it), "none" (the
# benchmark's variants compare them).
EARLY_WEIGHTS = "all"

# The shared-memory carveout (percent of the SM's maximum) the decode step pins on its layer kernels when its
# GEMVs take copy-engine tiles. An SM changes its L1 / shared-memory split only when idle, and the driver picks
# each kernel's by its own needs: copy-engine GEMVs between kernels that want no shared memory left PDL's
# overlap to reconfigurations (H200, 7B step: 2.41 ms with the driver's choices, 2.32 without PDL; pinned
# at 16-25%: 2.21-2.27, the 64 KB split; 35-50% (100 KB): 2.38; 0-10%: 3.4; the register kernels under
# any pinned split: 2.83-3.11 against 2.45). None: the driver's choice.
CARVEOUT = 25
# The same for the warp-specialized GEMVs (quant_gemv_ws): 35% (100 KB: three of their three-stage programs per
# SM; H200, 7B step: 1.94 ms, 44% 1.96, 50% with four stages 1.99; run 70)
CARVEOUT_WS = 35
# The warp-specialized kernels that make their input in shared memory (quant_gemv_w4a8_ws, quant_gemv_w4a8_mma,
# quant_gemv_int8_ws) or copy their input rows (quant_gemm.ROW_KERNELS): 58% (132 KB): three programs an SM of W4A8's
# linears (up to 35 KB: the tables beside each stage's words), two of its GLU at 128 rows (58 KB: two inputs made;
# sm_90 compile). Not timed
# against others yet
CARVEOUT_WS_MADE = 58

# On Hopper, the warp-specialized GEMV (quant_gemv_ws) where its tiles fit; False: this module's copy-engine
# kernel (the benchmark's "tma" variant compares them)
WARP_SPECIALIZED = True

# the nibble bytes' mask and the XOR that turns two's-complement q into q + 8, for the low nibbles and (as
# int32: 0xF0F0F0F0, 0x80808080) the high ones (passed at run time: as registers ptxas fuses each pair into one
# LOP3; as immediates it emits two)
MASK_NIBBLES, XOR_EIGHT, MASK_HIGH, XOR_HIGH = 0x0F0F0F0F, 0x08080808, -0x0F0F0F10, -0x80000000 + 0x00808080


# The most rows one GEMV launch takes (``_int4_gemv_rows_kernel``: BLOCK_M accumulators per output row; past ~16
# rows the tensor cores' GEMM multiplies each weight by the rows for free, and the rows' registers run out)
MAX_ROWS = 16
# The decode step's GEMV at every batch up to this many rows, whatever quant_gemm's measured table says (the H200
# A/B before the table has M > 1 GEMV rows: TRTLLM_PIPELINE_INT4_GEMV_MAX_ROWS=16); unset or 0: the table decides
ROWS_ENV = "TRTLLM_PIPELINE_INT4_GEMV_MAX_ROWS"


def supported(q, m: int) -> bool:
    """Whether ``q`` at batch ``m`` can take the GEMV: INT4-AWQ, 1 to MAX_ROWS rows, and input blocks inside scale
    groups. (Whether the decode step takes it at M > 1 is ``quant_gemm.choose``'s: the measured table, or
    ``forced``.)"""
    return (q.fmt == "int4_awq" and 1 <= m <= MAX_ROWS and gemv_input.block_inputs(q.group) is not None
            and q.k % q.group == 0)


def forced(m: int) -> bool:
    """Whether ``$TRTLLM_PIPELINE_INT4_GEMV_MAX_ROWS`` asks for the GEMV at batch ``m`` regardless of the table."""
    value = os.environ.get(ROWS_ENV, "").strip() or "0"
    if not value.isdigit() or int(value) > MAX_ROWS:
        raise InputError(f"{ROWS_ENV}={value!r} is not a batch size the INT4 GEMV takes.",
                         fix=f"set it to a batch size from 0 (off: the measured table decides) to {MAX_ROWS} (the "
                             "GEMV's most rows), or unset it")
    return m <= int(value)


def rows_config(q, m: int, sm_count: int, *, glu: bool = False, splits: int | None = None,
                block_n: int | None = None, block_k: int | None = None, num_stages: int = 1) -> LinearConfig:
    """The several-row GEMV's tiles at batch ``m`` (``_int4_gemv_rows_kernel``; not yet swept on an H200: the
    benchmark's ``gemv_rows`` variants time others). BLOCK_M = m rounded up to a power of two. Batch 1's register
    kernel's shapes (``pick_config``), with fewer output rows per program as BLOCK_M grows so that its
    accumulators stay at batch 1's 256-row tile's registers (BLOCK_M x BLOCK_N/2 x blocks: 2048 floats a matrix):
    qkv, dense and proj 128 inputs a tile, 256 / BLOCK_M x 2 output rows (32 at 16 rows), split so that the grid
    is ~8 (K short) or ~6 programs per SM; the GLU 16 rows x 256 inputs, K not split (its epilogue writes whole
    rows)."""
    if not supported(q, m):
        raise ValueError(f"the INT4 GEMV takes 1 to {MAX_ROWS} rows of an INT4-AWQ weight, not {m} of {q.fmt}")
    block_m = triton.next_power_of_2(m)
    block_k = block_k or (256 if glu else 128)
    block_n = block_n or (16 if glu else max(32, 512 // block_m))
    tiles, k_tiles = triton.cdiv(q.n, block_n), triton.cdiv(q.k, block_k)
    if glu:
        splits = 1
    elif splits is None:
        per_sm = 8 if triton.cdiv(q.k, 128) <= 32 else 6
        splits = max(1, min(k_tiles, round(per_sm * sm_count / tiles)))
        splits = triton.cdiv(k_tiles, triton.cdiv(k_tiles, splits))  # no split left without tiles
    return LinearConfig(block_m, block_n, block_k, splits, 4, num_stages, gemv=True)


def pick_config(q, sm_count: int, *, glu: bool = False, splits: int | None = None, block_n: int | None = None,
                block_k: int | None = None, tma: bool | None = None, m: int = 1) -> LinearConfig:
    """The best of H200 sweeps of the dp4a kernel (docs/perf-notes.md). On Hopper (``tma`` None: where the
    weight's device has the bulk tensor copy engine, and the shape fits it: ``tma_fits``) the weight tiles
    come by the copy engine, three stages deep (runs 45-51): 128 x 128 tiles split so that the grid is ~3
    programs per SM (the 7B's proj 14 splits, dense 14, qkv 10), the GLU 64 x 128 unsplit (296 programs).
    The decode step then pins one shared-memory carveout for its layer kernels (``carveout``). Where its
    tiles fit (``quant_gemv_ws.fits``) the warp-specialized kernel takes the same tiles and stages
    (``WARP_SPECIALIZED``; the GLU unsplit).

    Otherwise loads go straight to registers (cp.async through shared memory made the kernel L1-bound: the
    input planes read back by every thread), 4 warps (runs 33-38):

    * qkv, dense (K short: the 7B's 3584, 28 tiles of 128 inputs): 256 output rows x 128 inputs (one scale
      group, so the scale goes on the per-block sums; 8 rows of a thread share each input block), one K tile
      per program, split so that the grid is ~8 programs per SM;
    * proj (K long: 148 tiles): 128 rows x 128 inputs, the next tile prefetched into registers while one is
      computed (``num_stages=2``: 19.7 against 24.5 us), ~6 programs per SM (28 splits of 5-6 tiles);
    * the GLU: 16 rows x 256 inputs, K not split (splitting it, with the last program applying SiLU, measured
      slower at every tile tried), 1184 programs for the 7B's 18944 rows (48 registers).

    ``m`` > 1: the several-row kernel's tiles (``rows_config``)."""
    if m > 1:
        return rows_config(q, m, sm_count, glu=glu, splits=splits, block_n=block_n, block_k=block_k)
    if tma is None:
        tma = copy_engine(q.weight.device)
    if tma:
        cfg = LinearConfig(1, block_n or (64 if glu else 128), block_k or 128, 1, 4, 3, gemv=True, tma=True)
        if tma_fits(q, cfg):
            tiles, k_tiles = triton.cdiv(q.n, cfg.block_n), triton.cdiv(q.k, cfg.block_k)
            if splits is None:
                splits = 1 if glu else max(1, min(k_tiles, round(3 * sm_count / tiles)))
                splits = triton.cdiv(k_tiles, triton.cdiv(k_tiles, splits))  # no split left without tiles
            cfg = dataclasses.replace(cfg, splits=splits)
            ws_fits = cfg.block_k == 128 and quant_gemv_ws.fits(q, cfg.block_n) and not (glu and splits > 1)
            if WARP_SPECIALIZED and ws_fits:
                cfg = dataclasses.replace(cfg, ws=True)  # three stages: 26-28 KB, three programs per SM
                # under CARVEOUT_WS (two stages under CARVEOUT: 2.00 ms against 1.94, run 70)
            return cfg
    short = triton.cdiv(q.k, 128) <= 32  # in 128-input tiles
    block_n = block_n or (16 if glu else 256 if short else 128)
    block_k = block_k or (256 if glu else 128)
    tiles = triton.cdiv(q.n, block_n)
    k_tiles = triton.cdiv(q.k, block_k)
    if splits is None:
        splits = 1 if glu else max(1, min(k_tiles, round((8 if short else 6) * sm_count / tiles)))
    return LinearConfig(1, block_n, block_k, splits, 4, 1 if short or glu else 2, gemv=True)


def int4_ws(cfg: LinearConfig) -> bool:
    """Whether ``cfg`` is INT4-AWQ's warp-specialized GEMV (quant_gemv_ws), not W4A8's or INT8's (quant_gemv_w4a8_ws,
    quant_gemv_w4a8_mma, quant_gemv_int8_ws) or the wgmma row kernels (quant_gemm.ROW_KERNELS),
    which take the raw input rows and make their own."""
    return cfg.ws and not (cfg.w4a8 or cfg.dp4a8 or cfg.lut_mma)


def carveout(configs) -> int | None:
    """The carveout the decode step pins for a step of these linear configs: CARVEOUT_WS_MADE with W4A8's or INT8's
    warp-specialized GEMVs, CARVEOUT_WS with INT4's, CARVEOUT with the copy-engine ones, None (the driver's choice
    per kernel) otherwise."""
    if any(c.ws and not int4_ws(c) for c in configs):
        return CARVEOUT_WS_MADE
    if any(c.ws for c in configs):
        return CARVEOUT_WS
    return CARVEOUT if any(c.tma for c in configs) else None


def copy_engine(device: torch.device) -> bool:
    """Whether ``device`` has the bulk tensor copy engine (TMA: SM90 and newer)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def tma_fits(q, cfg: LinearConfig) -> bool:
    """Whether ``q``'s GEMV can take ``cfg``'s tiles from the copy engine: each K tile inside one scale group,
    every row stride a multiple of 16 bytes (packed words: K bytes, scales: 2N, the prepared input's planes),
    and each box (a stage's buffer) a multiple of 128 bytes, the shared-memory alignment it writes to: the
    input planes' BLOCK_K / 4 words."""
    xb = gemv_input.block_inputs(q.group)
    return (q.group % cfg.block_k == 0 and cfg.block_k % 128 == 0 and q.k % 16 == 0 and q.n % 8 == 0
            and width(q.k, xb) % 4 == 0)


def row_tiles(q, cfg: LinearConfig) -> int:
    """Programs along N: how many split counters a reducing launch takes."""
    return triton.cdiv(q.n, cfg.block_n)


def glu_workspace(q, cfg: LinearConfig) -> int:
    """float32 elements a split GLU launch needs for its fc and gate partials."""
    return cfg.splits * 2 * q.n


def prepared_input(q, batch: int = 1) -> gemv_input.Prepared:
    """An empty prepared input for ``q``: the buffer a producer fills for this GEMV."""
    return gemv_input.empty(batch, q.k, gemv_input.block_inputs(q.group), q.pqs, q.weight.device)


def launch_input(x: torch.Tensor, q, compute: torch.dtype) -> gemv_input.Prepared:
    """``x`` ([1, K] compute dtype, before the pre-quant scale) prepared for ``q`` by the standalone kernel."""
    return gemv_input.prepare(x, prepared_input(q, x.shape[0]), compute)


def launch(x, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool, *,
           x2: gemv_input.Prepared | None = None, prepare_out: gemv_input.Prepared | None = None,
           counters: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
           clear: torch.Tensor | None = None, fold: gemv_input.NormFold | None = None):
    """``out[s] = x W[:, K_s]^T`` per split (float32 [splits, 1, N]), or with ``q2`` ``out = silu(x W^T) *
    (x W2^T)`` (compute dtype [1, N]; ``prepare_out``: also written there as the next GEMV's input).

    An int64 ``out`` ([1, N] zeros): the splits' partials are added into it exactly, in any order (fixed_sum),
    so the consumer reads one row instead of every split's. Or ``counters``, int32 zeros, one per row tile
    (``row_tiles``; left zero again): the splits are summed into ``out[0]`` by each row tile's last program.
    The GLU splits K only with ``counters`` and a float32 ``workspace`` of ``glu_workspace`` elements: its
    last program per row tile sums fc and gate there, then applies SiLU. ``clear``: int64 accumulators of another
    linear that the launch sets to zero (``fixed_sum.clear``; after its PDL wait). ``fold``: the residual add and
    RMSNorm before the GEMV made by its own programs (``gemv_input.NormFold``; the warp-specialized kernel only).

    ``x``: the input as its producer prepared it for ``q`` (``gemv_input.Prepared``; ``x2`` for ``q2``), or a
    [1, K] compute-dtype tensor before the pre-quant scale, which is prepared here first (one more launch).

    A several-row config (``rows_config``, ``cfg.block_m`` > 1) takes M <= BLOCK_M rows the same way: inputs [M, K]
    or prepared [M, width], outputs [splits, M, N], int64 [M, N], or the GLU's [M, N] (``_launch_rows``)."""
    if isinstance(x, torch.Tensor):
        assert x.shape[0] <= cfg.block_m, f"{x.shape[0]} rows for a GEMV config of {cfg.block_m} (rows_config)"
        x, x2 = launch_input(x, q, compute), q2 and launch_input(x, q2, compute)
    fixed = fixed_sum.is_accumulator(out)
    assert not fixed or q2 is None and out.numel() >= q.n, "int64 accumulators take a split GEMV's whole output"
    if cfg.block_m > 1:
        assert fold is None and not cfg.ws and not cfg.tma, "the several-row GEMV loads its tiles to registers"
        return _launch_rows(x, q, q2, out, cfg, compute, pdl, x2, prepare_out, counters, clear)
    if cfg.ws:
        return quant_gemv_ws.launch(x, q, q2, out, cfg, compute, pdl, x2=x2, prepare_out=prepare_out,
                                    counters=counters, clear=clear, fold=fold,
                                    masks=(MASK_NIBBLES, XOR_EIGHT, MASK_HIGH, XOR_HIGH))
    assert fold is None, "only the warp-specialized GEMV folds the norm in"
    glu = q2 is not None
    x2, q2 = (x2, q2) if glu else (x, q)
    k = q.k
    xb = gemv_input.block_inputs(q.group)
    assert supported(q, 1) and x.block == x2.block == xb and x.planes.shape == x2.planes.shape == (1, width(k, xb))
    assert cfg.block_k % xb == 0 and cfg.block_n % 2 == 0
    k_iters = triton.cdiv(k, cfg.block_k)
    splits = cfg.splits if not glu or (counters is not None and workspace is not None) else 1
    per_split = triton.cdiv(k_iters, splits)
    half = cfg.block_n // 2
    even = k % cfg.block_k == 0 and k_iters % splits == 0 and (q.n // 2) % half == 0
    words, words2 = q.weight.view(torch.int32), q2.weight.view(torch.int32)
    assert words.stride() == words2.stride() and words.stride(1) == 1
    stride_os = 0 if glu or fixed or out.dim() == 2 else out.stride(0)
    if prepare_out is not None:
        assert glu and cfg.block_n % prepare_out.block == 0 and prepare_out.k == q.n
    dst = prepare_out or x
    grid = (triton.cdiv(q.n // 2, half), splits)
    reduce = counters is not None and splits > 1 and not fixed
    assert not reduce or counters.dtype == torch.int32 and counters.numel() >= grid[0]
    assert not (glu and reduce) or workspace.numel() >= glu_workspace(q, cfg)
    if cfg.tma:  # descriptors by tile: the packed words, the input planes' words (a [1, width] matrix)
        assert tma_fits(q, cfg), "copy-engine tiles: inside one scale group, 128-byte boxes, 16-byte row strides"
        descs = [TensorDescriptor.from_tensor(t, [half, cfg.block_k // 4]) for t in (words, words2)]
        descs += [TensorDescriptor.from_tensor(p.planes[0, :k // 2].view(2, k // 4), [2, cfg.block_k // 4])
                  for p in (x, x2)]
    else:
        descs = [None] * 4
    return _int4_gemv_kernel[grid](
        x.planes, words, q.scales, x2.planes, words2, q2.scales, out,
        dst.pqs if dst.pqs is not None else out, dst.planes, counters if reduce else dst.planes,
        workspace if glu and reduce else out, clear if clear is not None else out, *descs,
        q.n, k, q.scales.shape[0], per_split, words.stride(0), q.scales.stride(0), q.scales.stride(1), stride_os,
        clear.numel() if clear is not None else 0,
        MASK_NIBBLES, XOR_EIGHT, MASK_HIGH, XOR_HIGH,
        GROUP=q.group, XB=xb, GLU=glu, EVEN=even, TILE_SCALE=q.group % cfg.block_k == 0,
        PREPARE_OUT=prepare_out is not None, HAS_PQS_OUT=dst.pqs is not None, XB_OUT=dst.block, SPLITS=splits,
        REDUCE=reduce, FIXED=fixed, CLEAR=clear is not None,
        COMPUTE=tl_dtype(compute), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        PREFETCH=cfg.num_stages > 1 and not cfg.tma,
        SINGLE=per_split == 1, EARLY=EARLY_WEIGHTS == "all" or EARLY_WEIGHTS == "loops" and per_split > 1,
        ASM=not interpreting(), PDL=pdl, TMA=cfg.tma, STAGES=cfg.num_stages,  num_warps=cfg.num_warps, num_stages=1,
        launch_pdl=pdl,
    )


def _launch_rows(x: gemv_input.Prepared, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype,
                 pdl: bool, x2: gemv_input.Prepared | None, prepare_out: gemv_input.Prepared | None,
                 counters: torch.Tensor | None, clear: torch.Tensor | None):
    """``launch`` of ``_int4_gemv_rows_kernel`` for ``x``'s M prepared rows (the GLU's K unsplit: ``rows_config``)."""
    glu = q2 is not None
    x2, q2 = (x2, q2) if glu else (x, q)
    m, k = x.planes.shape[0], q.k
    xb = gemv_input.block_inputs(q.group)
    assert supported(q, m) and m <= cfg.block_m and x.block == x2.block == xb
    assert x.planes.shape == x2.planes.shape == (m, width(k, xb)) and x.planes.stride() == x2.planes.stride()
    assert cfg.block_k % xb == 0 and cfg.block_n % 2 == 0
    assert not (glu and cfg.splits > 1), "the several-row GLU does not split K: take rows_config's splits (1)"
    k_iters = triton.cdiv(k, cfg.block_k)
    splits = cfg.splits
    per_split = triton.cdiv(k_iters, splits)
    half = cfg.block_n // 2
    even = k % cfg.block_k == 0 and k_iters % splits == 0 and (q.n // 2) % half == 0
    words, words2 = q.weight.view(torch.int32), q2.weight.view(torch.int32)
    assert words.stride() == words2.stride() and words.stride(1) == 1
    fixed = fixed_sum.is_accumulator(out)
    stride_os = 0 if glu or fixed or out.dim() == 2 else out.stride(0)
    if prepare_out is not None:
        assert glu and cfg.block_n % prepare_out.block == 0 and prepare_out.k == q.n
        assert prepare_out.planes.shape[0] >= m
    dst = prepare_out or x
    grid = (triton.cdiv(q.n // 2, half), splits)
    reduce = counters is not None and splits > 1 and not fixed
    assert not reduce or counters.dtype == torch.int32 and counters.numel() >= grid[0]
    return _int4_gemv_rows_kernel[grid](
        x.planes, words, q.scales, x2.planes, words2, q2.scales, out,
        dst.pqs if dst.pqs is not None else out, dst.planes, counters if reduce else dst.planes,
        clear if clear is not None else out,
        m, q.n, k, q.scales.shape[0], per_split, x.planes.stride(0), words.stride(0), q.scales.stride(0),
        q.scales.stride(1), stride_os, out.stride(-2), dst.planes.stride(0), clear.numel() if clear is not None else 0,
        MASK_NIBBLES, XOR_EIGHT, MASK_HIGH, XOR_HIGH,
        GROUP=q.group, XB=xb, GLU=glu, EVEN=even, TILE_SCALE=q.group % cfg.block_k == 0,
        PREPARE_OUT=prepare_out is not None, HAS_PQS_OUT=dst.pqs is not None, XB_OUT=dst.block, SPLITS=splits,
        REDUCE=reduce, FIXED=fixed, CLEAR=clear is not None, COMPUTE=tl_dtype(compute), BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, ASM=not interpreting(), PDL=pdl, STAGES=cfg.num_stages,
        num_warps=cfg.num_warps, num_stages=1, launch_pdl=pdl,
    )
