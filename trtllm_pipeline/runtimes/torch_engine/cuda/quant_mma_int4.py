"""INT4-AWQ at batch 2-16 on the INT8 tensor cores: the GEMV's prepared input against each weight unpacked once.

The several-row dp4a GEMV (``quant_gemv._int4_gemv_rows_kernel``) unpacks a weight once but pays 0.5 dp4a per
weight and row (8.5 instructions a weight at 8 rows: it loses to the bfloat16 GEMM beyond 2 rows). Here the rows'
products go to ``tl.dot`` with int8 x int8 -> int32 operands (``mma.m16n8k32.s8``), which multiplies by every row
for the price of one, and the input is the GEMV's own (``gemv_input``: int16 block floating point, one power of two
per XB = 16 inputs, a signed high-byte and an unsigned low-byte plane), so the producers (norm, attention's
combine) need no change. Off by default: ``quant_gemm.choose`` takes it only under ``ROWS_ENV`` (no GLU yet: the
fused fc + gate keeps the several-row GEMV or the GEMM).

Numerics (all integer sums exact; the result is the GEMV's up to float32 summation order):

* Weights. A packed byte holds row 2j's q in its low nibble and row 2j+1's in its high nibble, two's complement.
  ``byte & 0xF0`` read as a signed byte is exactly 16 q of row 2j+1, and ``(byte << 4)`` (the same mask after the
  shift) 16 q of row 2j: in [-128, 112], so no +8 offset and no -8 x sum(x) correction at all. With inline PTX on
  four bytes a register: one LOP3 for the odd rows, a shift and a LOP3 for the even rows (3 per 8 weights, as the
  register-load GEMV). The two output row sets are two dots against the same input (``lo``, ``hi``).
* Input. A signed int8 operand cannot hold the unsigned low byte, and no split of the int16 ``x_int`` into two
  signed bytes covers [-2^15, 2^15) (``256 h + l``, h, l in [-128, 127], stops at 32639, and bfloat16 inputs reach
  32640 = 0x7F80). So three planes, all exact and non-overflowing: ``hi`` (signed, as stored), ``lo & 0x7F`` and
  ``(lo & 0x80) >> 1`` (0 or 64), with ``x_int = 256 hi + 2 (lo & 0x80) / 2 + (lo & 0x7F)``. The dots chain in
  their int32 accumulator: ``d = dot(hi); d = dot(top, acc=d << 7); d = dot(lo7, acc=d << 1)`` = 16 sum q x_int.
  Bounds: |16 q x_int| <= 2^22, 16 inputs a block: |d| < 2^26, a multiple of 16, so its float32 value is exact.
* Block exponents. One power of two per 16 inputs, but an int8 dot needs K >= 32. Lossless anyway: the rows are
  padded to 16 (tl.dot's M) and a row M..15 costs as much as a real one, so the dot's A operand is block-diagonal:
  a K chunk of KC = 16 x NBC inputs against R = NBC x BLOCK_M rows, row (b, r) holding input row r's bytes of block b
  only (zeros elsewhere). Each of the dot's output rows is then one (block, row)'s exact integer sum, converted
  (I2F) and multiplied by its 2^E (FFMA); KC = 128 at 2 rows, 64 at 4, 32 at 8 (R = 16) and 32 at 16 (R = 32). No
  rescaling of blocks to a shared exponent: nothing lost against the GEMV.
* Scales. Where the K tile (BLOCK_K, a multiple of KC) lies in one scale group, a tile's chunks sum into a float32
  tile accumulator that one FFMA per element multiplies by the group scale into the float32 accumulator (the GEMV
  multiplies per block: the same products, another order); where a group is shorter than KC (the tiny model's
  8), per (block, row) scales multiply each chunk's result. At the end the NBC blocks of each row are summed.

Per weight (the K loop, sm_90 SASS: ``tools/gemv_sass.py --mma M --block-n 128``, mma.sync ``IMMA.16832.S8.S8``:
the dot's 16-32 rows are below wgmma's 64): unpacking ~0.375, the MMAs (3 planes x 2 row sets), and per (block,
row, output) of the dot's result two shifts, an I2F and an FFMA: 4 R / KC = BLOCK_M / 4. In all 2.44 instructions a
weight at 2 rows, 3.30 at 4, 4.85 at 8 (105 registers; the several-row GEMV: 8.5), 7.80 at 16. Not timed yet.

Outputs as the several-row GEMV: split partials [S, M, N], int64 accumulators
(``fixed_sum``), or split 0's row summed by the row tile's last program. Under Triton's interpreter (no PTX) the
nibbles come from plain int8 shifts (``ASM=False``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import fixed_sum, gemv_input, quant_gemv
from trtllm_pipeline.runtimes.torch_engine.cuda.gemv_input import width
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig
from trtllm_pipeline.runtimes.torch_engine.cuda.support import interpreting, rows_switch

# The decode step's INT8-MMA linear at batches 2..N (not the GLU), whatever quant_gemm's table says; unset or 0: off
ROWS_ENV = "TRTLLM_PIPELINE_INT4_MMA_ROWS"
MAX_ROWS = 16


def enabled(m: int) -> bool:
    """Whether ``$TRTLLM_PIPELINE_INT4_MMA_ROWS`` asks for this kernel at batch ``m`` (2..N)."""
    return rows_switch(ROWS_ENV, MAX_ROWS, "the INT4 MMA linear", m)


def supported(q, m: int) -> bool:
    return quant_gemv.supported(q, m) and 2 <= m <= MAX_ROWS


def chunk(block_m: int, xb: int) -> int:
    """Inputs per dot (KC): enough blocks that the block-diagonal operand has >= 16 rows, and >= 32 (int8 dots)."""
    return max(32, xb * triton.cdiv(16, block_m))


def config(q, m: int, sm_count: int, *, splits: int | None = None, block_n: int | None = None,
           block_k: int | None = None, num_warps: int = 4, num_stages: int = 1) -> LinearConfig:
    """Tiles (guessed, not swept): 128 output rows x 128 inputs (one scale group at the 7B's 128), split so that the
    grid is ~6 programs per SM (~8 where K is short). 128 rows: the per-tile input operand's work over more weights
    than at 64 (sm_90 SASS at 8 rows: 4.85 instructions a weight against 6.80; 256 rows 3.94 but 191 registers)."""
    if not supported(q, m):
        raise ValueError(f"the INT4 MMA linear takes 2 to {MAX_ROWS} rows of an INT4-AWQ weight, not {m} of {q.fmt}")
    block_m = triton.next_power_of_2(m)
    kc = chunk(block_m, gemv_input.block_inputs(q.group))
    block_k = block_k or max(kc, 128 if q.group % 128 == 0 else kc)
    block_n = block_n or 128
    tiles, k_tiles = triton.cdiv(q.n, block_n), triton.cdiv(q.k, block_k)
    if splits is None:
        per_sm = 8 if triton.cdiv(q.k, 128) <= 32 else 6
        splits = max(1, min(k_tiles, round(per_sm * sm_count / tiles)))
        splits = triton.cdiv(k_tiles, triton.cdiv(k_tiles, splits))
    return LinearConfig(block_m, block_n, block_k, splits, num_warps, num_stages, gemv=True, mma=True)


@triton.jit
def _nibbles(b, ASM: tl.constexpr):
    """Packed bytes [HALF, KC] (int8) -> 16 q of the even rows (low nibbles) and of the odd rows (high), int8."""
    if ASM:
        lo = tl.inline_asm_elementwise("{ .reg .b32 t; shl.b32 t, $1, 4; and.b32 $0, t, 0xF0F0F0F0; }", "=r,r", [b],
                                       dtype=tl.int8, is_pure=True, pack=4)
        hi = tl.inline_asm_elementwise("and.b32 $0, $1, 0xF0F0F0F0;", "=r,r", [b], dtype=tl.int8, is_pure=True,
                                       pack=4)
    else:
        lo = (b.to(tl.int32) << 4).to(tl.int8)  # wraps to 16 q
        hi = (b.to(tl.int32) & 0xF0).to(tl.int8)
    return lo, hi


@triton.jit
def _low_planes(xl, ASM: tl.constexpr):
    """The unsigned low bytes [R, KC] (int8) as two signed planes: ``lo & 0x7F`` and ``(lo & 0x80) / 2`` (0 or 64).
    With PTX, four bytes a register (one LOP3, and a shift and a LOP3): as int8 elementwise ops the compiler
    extracted, shifted and repacked every byte in the dot operand's layout (~3 PRMT/SHF/LOP3 a byte)."""
    if ASM:
        x7 = tl.inline_asm_elementwise("and.b32 $0, $1, 0x7F7F7F7F;", "=r,r", [xl], dtype=tl.int8, is_pure=True,
                                       pack=4)
        xt = tl.inline_asm_elementwise("{ .reg .b32 t; shr.u32 t, $1, 1; and.b32 $0, t, 0x40404040; }", "=r,r", [xl],
                                       dtype=tl.int8, is_pure=True, pack=4)
    else:
        x7 = xl & 0x7F
        xt = (xl >> 1) & 0x40
    return x7, xt


@triton.jit
def _chunk_dots(xh, xt, x7, lo, hi):
    """16 sum q x_int per (block, row) x output row of both row sets: three chained dots each (see the docstring)."""
    wl = tl.trans(lo)
    wh = tl.trans(hi)
    I32: tl.constexpr = tl.int32
    dl = tl.dot(xh, wl, out_dtype=I32)
    dl = tl.dot(x7, wl, tl.dot(xt, wl, dl << 7, out_dtype=I32) << 1, out_dtype=I32)
    dh = tl.dot(xh, wh, out_dtype=I32)
    dh = tl.dot(x7, wh, tl.dot(xt, wh, dh << 7, out_dtype=I32) << 1, out_dtype=I32)
    return dl, dh


@triton.jit
def _int4_mma_rows_kernel(
    xp_ptr, w_ptr, s_ptr, out_ptr, count_ptr, clear_ptr,
    M, N, K, G, k_iters_per_split, stride_xp, stride_wn, stride_sg, stride_s2, stride_os, stride_om, clear_n,
    GROUP: tl.constexpr, XB: tl.constexpr, EVEN: tl.constexpr, SPLITS: tl.constexpr, REDUCE: tl.constexpr,
    FIXED: tl.constexpr, CLEAR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    KC: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr,
):
    HALF: tl.constexpr = BLOCK_N // 2
    NBC: tl.constexpr = KC // XB  # blocks per dot
    R: tl.constexpr = NBC * BLOCK_M  # the dot's rows: (block, input row)
    CHUNKS: tl.constexpr = BLOCK_K // KC
    TILE_SCALE: tl.constexpr = GROUP % BLOCK_K == 0
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rj = pid_n * HALF + tl.arange(0, HALF)
    j_ok = rj < N // 2
    k0 = pid_s * k_iters_per_split * BLOCK_K
    ri = tl.arange(0, R)
    rr = ri % BLOCK_M  # input row
    rb = ri // BLOCK_M  # block within the chunk
    r_ok = rr < M
    kk = tl.arange(0, KC)
    diag = (kk[None, :] // XB) == rb[:, None]  # [R, KC]: row (b, r) sees block b only
    xbytes = xp_ptr.to(tl.pointer_type(tl.int8)) + rr[:, None] * (stride_xp * 4)  # byte k of a plane: input k
    wbytes = w_ptr.to(tl.pointer_type(tl.int8)) + rj[:, None] * (stride_wn * 4)
    acc_lo = tl.zeros((R, HALF), dtype=tl.float32)
    acc_hi = tl.zeros((R, HALF), dtype=tl.float32)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    for i in tl.range(0, k_iters_per_split, num_stages=STAGES):
        k_tile = k0 + i * BLOCK_K
        t_lo = tl.zeros((R, HALF), dtype=tl.float32)
        t_hi = tl.zeros((R, HALF), dtype=tl.float32)
        for c in tl.static_range(CHUNKS):
            cols = k_tile + c * KC + kk
            if EVEN:
                b = tl.load(wbytes + cols[None, :])
            else:
                b = tl.load(wbytes + cols[None, :], mask=j_ok[:, None] & (cols < K)[None, :], other=0)
            lo, hi = _nibbles(b, ASM)
            a_ok = diag & r_ok[:, None] & (cols < K)[None, :]
            xh = tl.load(xbytes + cols[None, :], mask=a_ok, other=0)
            xl = tl.load(xbytes + K + cols[None, :], mask=a_ok, other=0)
            x7, xt = _low_planes(xl, ASM)
            dl, dh = _chunk_dots(xh, xt, x7, lo, hi)
            blk = (k_tile + c * KC) // XB + rb  # [R]
            b_ok = r_ok & (blk < K // XB)
            # 2^E / 16 (the weights are 16 q): exact; rows past M and blocks past K read 0
            step = tl.load(xp_ptr + rr * stride_xp + K // 2 + K // XB + blk, mask=b_ok,
                           other=0).to(tl.float32, bitcast=True) * 0.0625
            if TILE_SCALE:
                t_lo += dl.to(tl.float32) * step[:, None]
                t_hi += dh.to(tl.float32) * step[:, None]
            else:  # groups shorter than the tile: each (block, row)'s own group scale
                g = (blk * XB) // GROUP
                offs = g[:, None] * stride_sg + rj[None, :]
                s_ok = b_ok[:, None] & j_ok[None, :]
                s_lo = tl.load(s_ptr + offs, mask=s_ok, other=0.0)
                s_hi = tl.load(s_ptr + offs + stride_s2, mask=s_ok, other=0.0)
                acc_lo += dl.to(tl.float32) * (step[:, None] * s_lo)
                acc_hi += dh.to(tl.float32) * (step[:, None] * s_hi)
        if TILE_SCALE:
            g = k_tile // GROUP
            ok = j_ok & (g < G)
            s_lo = tl.load(s_ptr + g * stride_sg + rj, mask=ok, other=0.0)
            s_hi = tl.load(s_ptr + g * stride_sg + stride_s2 + rj, mask=ok, other=0.0)
            acc_lo += t_lo * s_lo[None, :]
            acc_hi += t_hi * s_hi[None, :]
    if CLEAR:  # another linear's accumulators, between their last reader and their next writer (fixed_sum)
        programs = tl.num_programs(0) * tl.num_programs(1)
        fixed_sum.clear(clear_ptr, clear_n, pid_n * tl.num_programs(1) + pid_s, programs, tl.arange(0, 128))
    # each input row: its NBC blocks' sums
    y_lo = tl.sum(tl.reshape(acc_lo, (NBC, BLOCK_M, HALF)), axis=0)
    y_hi = tl.sum(tl.reshape(acc_hi, (NBC, BLOCK_M, HALF)), axis=0)
    rm = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (rm < M)[:, None] & (cols < N)[None, :]
    offs = rm[:, None] * stride_om + cols[None, :]
    y = tl.interleave(y_lo, y_hi)  # [BLOCK_M, BLOCK_N] in column order
    quant_gemv._store_partials(y, out_ptr, offs, ok, pid_n, pid_s, stride_os, count_ptr, FIXED, REDUCE, SPLITS)


def launch(x: gemv_input.Prepared, q, out: torch.Tensor, cfg: LinearConfig, pdl: bool, *,
           counters: torch.Tensor | None = None, clear: torch.Tensor | None = None):
    """``out[s, :M] = x W[:, K_s]^T`` per split (float32 [splits, M, N]), int64 accumulators [M, N] (fixed_sum), or
    with ``counters`` (int32 zeros, one per row tile, left zero) the splits summed into ``out[0]``: as the several-row
    GEMV's launch, for ``x``'s M prepared rows."""
    m, k = x.planes.shape[0], q.k
    xb = gemv_input.block_inputs(q.group)
    kc = chunk(cfg.block_m, xb)
    assert supported(q, m) and m <= cfg.block_m and x.block == xb and x.planes.shape == (m, width(k, xb))
    assert cfg.block_k % kc == 0 and cfg.block_n % 32 == 0 and x.planes.stride(1) == 1
    assert q.group % cfg.block_k == 0 or cfg.block_k == kc, "a tile spanning groups takes one chunk (KC) a tile"
    k_iters = triton.cdiv(k, cfg.block_k)
    splits = cfg.splits
    per_split = triton.cdiv(k_iters, splits)
    half = cfg.block_n // 2
    even = k % cfg.block_k == 0 and k_iters % splits == 0 and (q.n // 2) % half == 0
    words = q.weight.view(torch.int32)
    assert words.stride(1) == 1
    fixed = fixed_sum.is_accumulator(out)
    stride_os = 0 if fixed or out.dim() == 2 else out.stride(0)
    grid = (triton.cdiv(q.n // 2, half), splits)
    reduce = counters is not None and splits > 1 and not fixed
    assert not reduce or counters.dtype == torch.int32 and counters.numel() >= grid[0]
    return _int4_mma_rows_kernel[grid](
        x.planes, words, q.scales, out, counters if reduce else x.planes, clear if clear is not None else out,
        m, q.n, k, q.scales.shape[0], per_split, x.planes.stride(0), words.stride(0), q.scales.stride(0),
        q.scales.stride(1), stride_os, out.stride(-2), clear.numel() if clear is not None else 0,
        GROUP=q.group, XB=xb, EVEN=even, SPLITS=splits, REDUCE=reduce, FIXED=fixed, CLEAR=clear is not None,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, KC=kc, ASM=not interpreting(), PDL=pdl,
        STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=1, launch_pdl=pdl,
    )
