"""Tensor-core GEMMs for the 4- and 8-bit weight formats at M > 1: decode batches and prefill, from the stored weights.

One program computes a [BLOCK_M, BLOCK_N] output tile over a slice of K (split-K where the grid is short), so the
same kernels serve a decode batch (M 2-64, the float32 split-K partials the decode step's next kernel reduces, or
the GLU of mlp.fc/mlp.gate) and prefill (M in the thousands, ``linear``: the compute dtype with the bias, what
``torch_engine/model.Linear.forward`` returns on CUDA, so no dequantized copy of a weight is ever kept there).

* **W4A16** (``int4_awq``): the checkpoint's int8 [N/2, K], output rows 2j and 2j+1 in the low and high nibble of
  byte (j, k). That layout is already what a tile wants: a [BLOCK_N/2, BLOCK_K] load of packed rows is K-contiguous
  and coalesced, and its two nibble planes are two [BLOCK_N/2, BLOCK_K] operands of the MMA (even and odd output
  rows), re-interleaved once in the epilogue (``tl.interleave``) instead of per weight. So nothing is repacked (the
  batch-1 GEMV reads the same bytes: a repacked copy would be a second copy of every weight). A nibble becomes a
  bfloat16 without a conversion instruction: ``(nibble ^ 8) | 0x4300`` is the bits of ``136 + q``. Where a K tile
  lies inside one scale group (the 7B's 128), the MMA multiplies these integer values and the [BLOCK_M, BLOCK_N/2]
  result takes ``- 136 * rowsum(x)`` and the group scale (``POST_SCALE``: two operations per weight before the MMA,
  the scale once per output and tile; exact products, but a fresh MMA result per tile); otherwise
  (``LinearConfig.scale_weights``, or groups smaller than a tile) each weight is scaled first and rounded to the
  compute dtype, as the eager model's dequantized copy is, and the MMAs chain on one accumulator.
* **W4A8** (``w4a8_awq``): ``q x group step`` in units of ``weights_scaling_factor_2``, rounded to E4M3 in registers
  (ModelOpt's fake-quantized weight exactly), FP8 x FP8 on the FP8 tensor cores against the FP8-quantized input; the
  float32 sum scaled once by ``activation scale x scale_2``.
* **W8A8** (``int8_sq``): int8 x int8 -> int32 on the tensor cores (exact), scaled in the epilogue by the folded
  ``weight scale[n] / (127 / amax)``.
* **W8A16** (``int8_wo``): ``(w ^ 0x80) | 0x4B000000`` is the float32 ``2^23 + 128 + w`` (no int-to-float
  conversion), the exact integer in the compute dtype into the MMA; the per-channel scale on the sum (one slice:
  in the epilogue; TP slices: per K tile).

The input's pre-quant scale and activation quantizer are applied per K tile as it is loaded (quant_linear's
``_act_tile``: the eager rounding points exactly). ``SWAP`` puts the weight tile on the MMA's M side and the input
rows on its N side (the decode kernels' orientation: at a few rows the weight fills the 64-row wgmma and the
batch pads its 8-256 wide N) instead of the input on M (prefill's).

The tile per (format, M, N, K) comes from a measured table (``TABLE``, written by ``benchmarks/quant_gemm.py`` on
an H200: ``quant_gemm_table.json`` beside this module, or ``$TRTLLM_PIPELINE_GEMM_TABLE``) that also says where the
batch-1 GEMV or the older dot kernel is faster; ``default_config`` where the table has no entry.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv, quant_linear
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv import int4_scales
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_linear import _act_tile, _magic

TABLE = Path(__file__).with_name("quant_gemm_table.json")
TABLE_ENV = "TRTLLM_PIPELINE_GEMM_TABLE"
GROUP_M = tl.constexpr(8)  # output row tiles per band of the launch order (prefill: a band's weight tiles stay in L2)
# a table entry's kernel: this module's GEMM, quant_gemv's batch-1 GEMV, or quant_linear's older dot kernel
KERNELS = ("gemm", "gemv", "dot")


# ------------------------------------------------------------------------------------------ helpers


@triton.jit
def _mma(w, x, acc, SWAP: tl.constexpr, OUT: tl.constexpr = tl.float32):
    """``acc + w x^T`` for a weight tile ``w`` [R, BK] and an input tile ``x`` [BM, BK]: [R, BM] (SWAP) or [BM, R]."""
    if SWAP:
        out = tl.dot(w, tl.trans(x), acc, out_dtype=OUT)
    else:
        out = tl.dot(x, tl.trans(w), acc, out_dtype=OUT)
    return out


@triton.jit
def _per_row(v, SWAP: tl.constexpr):
    """A per-output-row column ``v`` [R, 1] laid as the accumulator's output axis."""
    if SWAP:
        out = v
    else:
        out = tl.trans(v)
    return out


@triton.jit
def _per_input(v, SWAP: tl.constexpr):
    """A per-input-row vector ``v`` [BM] laid as the accumulator's input-row axis."""
    if SWAP:
        out = v[None, :]
    else:
        out = v[:, None]
    return out


@triton.jit
def _tile_ids(M, N_TILES, BLOCK_M: tl.constexpr):
    """(row tile, column tile) of this program: bands of GROUP_M row tiles walk the columns together."""
    pid = tl.program_id(0)
    m_tiles = tl.cdiv(M, BLOCK_M)
    band = GROUP_M * N_TILES
    first = (pid // band) * GROUP_M
    rows = tl.minimum(m_tiles - first, GROUP_M)
    return first + (pid % band) % rows, (pid % band) // rows


@triton.jit
def _w4_operands(p, s_lo, s_hi, POST_SCALE: tl.constexpr, A8: tl.constexpr, MAGIC: tl.constexpr,
                 OFFSET: tl.constexpr, COMPUTE: tl.constexpr):
    """The even (low nibble) and odd (high nibble) rows of packed tile ``p`` as MMA operands: ``OFFSET + q`` in the
    compute dtype (POST_SCALE), E4M3 of ``q x step`` (A8), or ``q x scale`` rounded to the compute dtype."""
    u = p.to(tl.uint8, bitcast=True).to(tl.int16)
    lo = ((u & 0xF) ^ MAGIC).to(COMPUTE, bitcast=True)
    hi = ((u >> 4) ^ MAGIC).to(COMPUTE, bitcast=True)
    if POST_SCALE:
        out_lo, out_hi = lo, hi
    else:
        f_lo = (lo.to(tl.float32) - OFFSET) * s_lo
        f_hi = (hi.to(tl.float32) - OFFSET) * s_hi
        if A8:
            out_lo = tl.clamp(f_lo, -448.0, 448.0).to(tl.float8e4nv, fp_downcast_rounding="rtne")
            out_hi = tl.clamp(f_hi, -448.0, 448.0).to(tl.float8e4nv, fp_downcast_rounding="rtne")
        else:
            out_lo, out_hi = f_lo.to(COMPUTE), f_hi.to(COMPUTE)
    return out_lo, out_hi


@triton.jit
def _w4_step(w_ptrs, s_ptr, x, rj, kk, k_tile, j_ok, k_ok, G, stride_sg, stride_s2, acc_lo, acc_hi,
             GROUP: tl.constexpr, ONE_GROUP: tl.constexpr, POST_SCALE: tl.constexpr, A8: tl.constexpr,
             LOAD_MASK: tl.constexpr, SWAP: tl.constexpr, MAGIC: tl.constexpr, OFFSET: tl.constexpr,
             COMPUTE: tl.constexpr):
    """One K tile of one packed matrix into its even- and odd-row accumulators."""
    if LOAD_MASK:
        p = tl.load(w_ptrs, mask=j_ok[:, None] & k_ok[None, :], other=0)
    else:
        p = tl.load(w_ptrs)
    s_lo, s_hi = int4_scales(s_ptr, stride_sg, stride_s2, rj, kk, k_tile, j_ok, G, GROUP, ONE_GROUP)
    lo, hi = _w4_operands(p, s_lo, s_hi, POST_SCALE, A8, MAGIC, OFFSET, COMPUTE)
    if POST_SCALE:
        # dot(OFFSET + q, x) - OFFSET * sum_k x, then the rows' group scale on the tile's [rows, inputs] result
        corr = _per_input(-OFFSET * tl.sum(x.to(tl.float32), axis=1), SWAP)
        acc_lo += (_mma(lo, x, None, SWAP) + corr) * _per_row(s_lo, SWAP)
        acc_hi += (_mma(hi, x, None, SWAP) + corr) * _per_row(s_hi, SWAP)
    else:
        acc_lo = _mma(lo, x, acc_lo, SWAP)
        acc_hi = _mma(hi, x, acc_hi, SWAP)
    return acc_lo, acc_hi


@triton.jit
def _w4_out(acc_lo, acc_hi, osc_ptr, A8: tl.constexpr, SWAP: tl.constexpr):
    """[BLOCK_M, BLOCK_N] float32 of the even and odd rows' accumulators, output rows back in their order."""
    if A8:
        acc_lo = acc_lo * tl.load(osc_ptr)
        acc_hi = acc_hi * tl.load(osc_ptr)
    if SWAP:
        acc_lo = tl.trans(acc_lo)
        acc_hi = tl.trans(acc_hi)
    return tl.interleave(acc_lo, acc_hi)


@triton.jit
def _store(y, y2, bias_ptr, out_ptr, rm, rn, M, N, pid_s, stride_os, stride_om, HAS_BIAS: tl.constexpr,
           PARTIALS: tl.constexpr, GLU: tl.constexpr, COMPUTE: tl.constexpr):
    """The epilogue: float32 split-K partials (``out[pid_s]``), silu(y) * y2 (GLU), or y + bias, compute dtype."""
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if PARTIALS:
        tl.store(out_ptr + pid_s * stride_os + rm[:, None] * stride_om + rn[None, :], y, mask=mask)
    elif GLU:
        tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], silu_mul(y, y2, COMPUTE), mask=mask)
    else:
        if HAS_BIAS:  # added to the float32 sum, rounded once (as cuBLAS's bias epilogue under F.linear)
            y = y + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], y.to(COMPUTE), mask=mask)


# ------------------------------------------------------------------------------------------ kernels


@triton.jit
def _w4_gemm_kernel(
    x_ptr, w_ptr, s_ptr, pqs_ptr, aq_ptr, osc_ptr,
    w2_ptr, s2_ptr, pqs2_ptr, aq2_ptr, osc2_ptr,
    bias_ptr, out_ptr,
    M, N, K, G, k_iters_per_split,
    stride_xm, stride_wn, stride_sg, stride_s2, stride_os, stride_om,
    GROUP: tl.constexpr, A8: tl.constexpr, HAS_PQS: tl.constexpr, GLU: tl.constexpr, HAS_BIAS: tl.constexpr,
    PARTIALS: tl.constexpr, ONE_GROUP: tl.constexpr, POST_SCALE: tl.constexpr, EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_M: tl.constexpr, SWAP: tl.constexpr, MAGIC: tl.constexpr, OFFSET: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """x [M, K] times packed INT4 [N/2, K]^T (and, GLU, a second matrix): one output tile over one K split."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    HALF: tl.constexpr = BLOCK_N // 2
    ACT: tl.constexpr = 1 if A8 else 0
    pid_m, pid_n = _tile_ids(M, tl.cdiv(N, BLOCK_N), BLOCK_M)
    pid_s = tl.program_id(1)
    rj = pid_n * HALF + tl.arange(0, HALF)  # packed rows: output rows 2 rj and 2 rj + 1
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    k0 = pid_s * k_iters_per_split * BLOCK_K
    j_ok = rj < N // 2
    m_ok = rm[:, None] < M
    w_ptrs = w_ptr + rj[:, None] * stride_wn + (k0 + rk)[None, :]
    w2_ptrs = w2_ptr + rj[:, None] * stride_wn + (k0 + rk)[None, :]
    x_ptrs = x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :]
    if SWAP:
        acc_lo = tl.zeros((HALF, BLOCK_M), dtype=tl.float32)
    else:
        acc_lo = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    acc_hi = tl.zeros_like(acc_lo)
    acc2_lo = tl.zeros_like(acc_lo)
    acc2_hi = tl.zeros_like(acc_lo)
    for i in range(k_iters_per_split):
        k_tile = k0 + i * BLOCK_K
        kk = k_tile + rk
        k_ok = kk < K
        x = _act_tile(x_ptrs, pqs_ptr + kk, aq_ptr, m_ok & k_ok[None, :], k_ok, HAS_PQS, ACT,
                      not (EVEN_M and EVEN_K), COMPUTE)
        acc_lo, acc_hi = _w4_step(w_ptrs, s_ptr, x, rj, kk, k_tile, j_ok, k_ok, G, stride_sg, stride_s2, acc_lo,
                                  acc_hi, GROUP, ONE_GROUP, POST_SCALE, A8, not (EVEN_N and EVEN_K), SWAP, MAGIC,
                                  OFFSET, COMPUTE)
        if GLU:
            x2 = _act_tile(x_ptrs, pqs2_ptr + kk, aq2_ptr, m_ok & k_ok[None, :], k_ok, HAS_PQS, ACT,
                           not (EVEN_M and EVEN_K), COMPUTE)
            acc2_lo, acc2_hi = _w4_step(w2_ptrs, s2_ptr, x2, rj, kk, k_tile, j_ok, k_ok, G, stride_sg, stride_s2,
                                        acc2_lo, acc2_hi, GROUP, ONE_GROUP, POST_SCALE, A8, not (EVEN_N and EVEN_K),
                                        SWAP, MAGIC, OFFSET, COMPUTE)
            w2_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    y = _w4_out(acc_lo, acc_hi, osc_ptr, A8, SWAP)
    y2 = y
    if GLU:
        y2 = _w4_out(acc2_lo, acc2_hi, osc2_ptr, A8, SWAP)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _store(y, y2, bias_ptr, out_ptr, rm, rn, M, N, pid_s, stride_os, stride_om, HAS_BIAS, PARTIALS, GLU, COMPUTE)


@triton.jit
def _w8_step(w_ptrs, s_ptr, x, rn, kk, k_tile, n_ok, k_ok, stride_sg, acc, GROUP: tl.constexpr, A8: tl.constexpr,
             SCALE_AT: tl.constexpr, LOAD_MASK: tl.constexpr, SWAP: tl.constexpr, COMPUTE: tl.constexpr):
    """One K tile of one int8 [N, K] matrix. SCALE_AT: 0 in the epilogue (or SmoothQuant's int32 dot), 1 on the
    tile's dot result (one scale group per tile), 2 on each weight (groups smaller than a tile)."""
    if LOAD_MASK:
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0)
    else:
        w = tl.load(w_ptrs)
    if A8:
        acc = _mma(w, x, acc, SWAP, tl.int32)
    else:
        # (w ^ 0x80) | 0x4B000000: the float32 2^23 + 128 + w
        v = (w.to(tl.uint8, bitcast=True).to(tl.int32) ^ 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
        if SCALE_AT == 0:
            acc = _mma(v.to(COMPUTE), x, acc, SWAP)
        elif SCALE_AT == 1:
            s = tl.load(s_ptr + (k_tile // GROUP) * stride_sg + rn, mask=n_ok, other=0.0)[:, None]
            acc += _mma(v.to(COMPUTE), x, None, SWAP) * _per_row(s, SWAP)
        else:
            s = tl.load(s_ptr + (kk // GROUP)[None, :] * stride_sg + rn[:, None], mask=n_ok[:, None] & k_ok[None, :],
                        other=0.0)
            acc = _mma((v * s).to(COMPUTE), x, acc, SWAP)
    return acc


@triton.jit
def _w8_out(acc, s_ptr, rn, n_ok, A8: tl.constexpr, SCALE_AT: tl.constexpr, SWAP: tl.constexpr):
    if A8 or SCALE_AT == 0:  # SmoothQuant's folded scale, or weight-only's per-channel scale
        acc = acc.to(tl.float32) * _per_row(tl.load(s_ptr + rn, mask=n_ok, other=0.0)[:, None], SWAP)
    if SWAP:
        acc = tl.trans(acc)
    return acc


@triton.jit
def _w8_gemm_kernel(
    x_ptr, w_ptr, s_ptr, pqs_ptr, aq_ptr,
    w2_ptr, s2_ptr, pqs2_ptr, aq2_ptr,
    bias_ptr, out_ptr,
    M, N, K, k_iters_per_split,
    stride_xm, stride_wn, stride_sg, stride_os, stride_om,
    GROUP: tl.constexpr, A8: tl.constexpr, HAS_PQS: tl.constexpr, GLU: tl.constexpr, HAS_BIAS: tl.constexpr,
    PARTIALS: tl.constexpr, SCALE_AT: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    EVEN_M: tl.constexpr, SWAP: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """x [M, K] times int8 [N, K]^T: SmoothQuant (A8: int8 x int8 -> int32) or weight-only (bf16/fp16 MMA)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    ACT: tl.constexpr = 2 if A8 else 0
    pid_m, pid_n = _tile_ids(M, tl.cdiv(N, BLOCK_N), BLOCK_M)
    pid_s = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    k0 = pid_s * k_iters_per_split * BLOCK_K
    n_ok = rn < N
    m_ok = rm[:, None] < M
    w_ptrs = w_ptr + rn[:, None] * stride_wn + (k0 + rk)[None, :]
    w2_ptrs = w2_ptr + rn[:, None] * stride_wn + (k0 + rk)[None, :]
    x_ptrs = x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :]
    acc_dtype = tl.int32 if A8 else tl.float32
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=acc_dtype)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=acc_dtype)
    acc2 = tl.zeros_like(acc)
    for i in range(k_iters_per_split):
        k_tile = k0 + i * BLOCK_K
        kk = k_tile + rk
        k_ok = kk < K
        x = _act_tile(x_ptrs, pqs_ptr + kk, aq_ptr, m_ok & k_ok[None, :], k_ok, HAS_PQS, ACT,
                      not (EVEN_M and EVEN_K), COMPUTE)
        acc = _w8_step(w_ptrs, s_ptr, x, rn, kk, k_tile, n_ok, k_ok, stride_sg, acc, GROUP, A8, SCALE_AT,
                       not (EVEN_N and EVEN_K), SWAP, COMPUTE)
        if GLU:
            x2 = _act_tile(x_ptrs, pqs2_ptr + kk, aq2_ptr, m_ok & k_ok[None, :], k_ok, HAS_PQS, ACT,
                           not (EVEN_M and EVEN_K), COMPUTE)
            acc2 = _w8_step(w2_ptrs, s2_ptr, x2, rn, kk, k_tile, n_ok, k_ok, stride_sg, acc2, GROUP, A8, SCALE_AT,
                            not (EVEN_N and EVEN_K), SWAP, COMPUTE)
            w2_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    y = _w8_out(acc, s_ptr, rn, n_ok, A8, SCALE_AT, SWAP)
    y2 = y
    if GLU:
        y2 = _w8_out(acc2, s2_ptr, rn, n_ok, A8, SCALE_AT, SWAP)
    _store(y, y2, bias_ptr, out_ptr, rm, rn, M, N, pid_s, stride_os, stride_om, HAS_BIAS, PARTIALS, GLU, COMPUTE)


# ------------------------------------------------------------------------------------------ launchers


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool = False,
           bias: torch.Tensor | None = None):
    """``x`` [M, K] (compute dtype, before the pre-quant scale and activation quantizer: applied here) times ``q``'s
    weight. ``out``: [splits, M, N] float32 partials (3 dimensions, or 2 with one split), or with ``q2`` the GLU
    ``silu(x W^T) * (x W2^T)`` [M, N] in the compute dtype, or (``out`` in the compute dtype) ``x W^T + bias``.
    Returns Triton's handle of the launch."""
    m, k = x.shape
    assert k == q.k and x.stride(1) == 1 and cfg.gemm
    glu = q2 is not None
    if glu:  # the second matrix is read with the first one's strides and flags
        assert q2.fmt == q.fmt and q2.group == q.group and q2.scales.stride() == q.scales.stride()
        assert q2.weight.stride() == q.weight.stride() and (q2.pqs is None) == (q.pqs is None)
    partials = out.dtype == torch.float32 and not glu
    assert partials or cfg.splits == 1, "split K needs float32 partials"
    q2 = q2 or q
    k_iters = triton.cdiv(k, cfg.block_k)
    per_split = triton.cdiv(k_iters, cfg.splits)
    dummy = out

    def opt(t):
        return t if t is not None else dummy

    common = dict(GROUP=q.group, A8=q.act != 0, HAS_PQS=q.pqs is not None, GLU=glu, HAS_BIAS=bias is not None,
                  PARTIALS=partials, EVEN_K=k % cfg.block_k == 0 and k_iters % cfg.splits == 0,
                  EVEN_M=m % cfg.block_m == 0, SWAP=cfg.swap, COMPUTE=tl_dtype(compute), BLOCK_M=cfg.block_m,
                  BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PDL=pdl, num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages, launch_pdl=pdl)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(q.n, cfg.block_n), cfg.splits)
    stride_os = out.stride(0) if partials and out.dim() == 3 else 0
    if q.int4:
        magic, offset = _magic(compute)
        one_group = q.group % cfg.block_k == 0
        return _w4_gemm_kernel[grid](
            x, q.weight, q.scales, opt(q.pqs), opt(q.act_q), opt(q.out_scale),
            q2.weight, q2.scales, opt(q2.pqs), opt(q2.act_q), opt(q2.out_scale),
            opt(bias), out, m, q.n, k, q.scales.shape[0], per_split,
            x.stride(0), q.weight.stride(0), q.scales.stride(0), q.scales.stride(1), stride_os, out.stride(-2),
            ONE_GROUP=one_group, POST_SCALE=one_group and q.act == 0 and not cfg.scale_weights, EVEN_N=(q.n // 2) % (cfg.block_n // 2) == 0,
            MAGIC=magic, OFFSET=offset, **common)
    # int8_wo with one scale per output row over the program's whole K range: in the epilogue
    scale_at = 0 if q.act != 0 or q.group >= k else 1 if q.group % cfg.block_k == 0 else 2
    return _w8_gemm_kernel[grid](
        x, q.weight, q.scales, opt(q.pqs), opt(q.act_q),
        q2.weight, q2.scales, opt(q2.pqs), opt(q2.act_q),
        opt(bias), out, m, q.n, k, per_split,
        x.stride(0), q.weight.stride(0), q.scales.stride(0) if q.scales.dim() == 2 else 0, stride_os,
        out.stride(-2), SCALE_AT=scale_at, EVEN_N=q.n % cfg.block_n == 0, **common)


def linear(x: torch.Tensor, q, bias: torch.Tensor | None, compute: torch.dtype,
           cfg: LinearConfig | None = None) -> torch.Tensor:
    """``x W^T + b`` in the compute dtype for any leading shape of ``x`` (prefill, eager decode): the GEMM from the
    stored weights, tiles from the table. Split K goes through float32 partials summed here."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    m = flat.shape[0]
    cfg = cfg or pick_config(q, m, _sm_count(x.device))
    if cfg.splits == 1:
        out = torch.empty(m, q.n, dtype=compute, device=x.device)
        launch(flat, q, None, out, cfg, compute, bias=bias)
    else:
        partials = torch.empty(cfg.splits, m, q.n, dtype=torch.float32, device=x.device)
        launch(flat, q, None, partials, cfg, compute)
        summed = partials.sum(0)
        out = (summed if bias is None else summed + bias.float()).to(compute)
    return out.reshape(*x.shape[:-1], q.n)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


# ------------------------------------------------------------------------------------------ configs


def default_config(q, m: int, sm_count: int, *, glu: bool = False) -> LinearConfig:
    """Tiles where the table has none. Decode batches (M <= 64): the weight on the MMA's M side (SWAP), 128 output
    rows x 128 inputs (INT4: 8 KB of packed weight per stage; INT8: 64 rows, 8 KB), split K as the dot kernels
    are (INT4 ~8 programs per SM and at least 2 K tiles per split, INT8 ~4 and 4). Prefill: 128 x 128 output tiles, 64 inputs per stage, 8 warps."""
    if m <= 64:
        block_m = max(16, triton.next_power_of_2(m))
        block_n = 128 if q.int4 else 64
        tiles = triton.cdiv(q.n, block_n)
        k_tiles = triton.cdiv(q.k, 128)
        per_sm, min_iters = (8, 2) if q.int4 else (4, 4)  # quant_linear.pick_config's (H200, run 15)
        splits = 1 if glu else max(1, min(k_tiles // min_iters, round(per_sm * sm_count / tiles)))
        splits = triton.cdiv(k_tiles, triton.cdiv(k_tiles, splits))  # no split left without tiles
        return LinearConfig(block_m, block_n, 128, splits, 4, 3, gemm=True, swap=True)
    return LinearConfig(128, 128, 64, 1, 8, 3, gemm=True)


def _load_table(path: Path) -> dict:
    """{(format, n, k, glu): [(m, kernel, config or None), ...] sorted by m} of a table file."""
    entries: dict = {}
    for e in json.loads(path.read_text())["entries"]:
        cfg = None
        if e["kernel"] == "gemm":
            bm, bn, bk, splits, warps, stages, swap, scale_weights = e["config"]
            cfg = LinearConfig(bm, bn, bk, splits, warps, stages, gemm=True, swap=bool(swap),
                               scale_weights=bool(scale_weights))
        entries.setdefault((e["format"], e["n"], e["k"], bool(e["glu"])), []).append((e["m"], e["kernel"], cfg))
    return {key: sorted(rows, key=lambda r: r[0]) for key, rows in entries.items()}


@functools.lru_cache(maxsize=None)
def _table(path: str) -> dict:
    p = Path(path)
    return _load_table(p) if p.is_file() else {}


def measured(fmt: str, m: int, n: int, k: int, glu: bool) -> tuple[str, LinearConfig | None] | None:
    """(kernel, GEMM config or None) the table measured fastest for this shape at the smallest measured M >= ``m``
    (the largest past it); None where the table has no such shape, or ``m`` is 1 and batch 1 was not measured."""
    rows = _table(os.environ.get(TABLE_ENV) or str(TABLE)).get((fmt, n, k, glu))
    if not rows or m == 1 and rows[0][0] != 1:
        return None
    _, kernel, cfg = next((r for r in rows if r[0] >= m), rows[-1])
    return kernel, cfg


def pick_config(q, m: int, sm_count: int, *, glu: bool = False) -> LinearConfig:
    """This GEMM's tiles for ``q`` at M = ``m``: the table's (``measured``) where it chose the GEMM, else
    ``default_config``."""
    choice = measured(q.fmt, m, q.n, q.k, glu)
    if choice is not None and choice[1] is not None:
        return choice[1]
    return default_config(q, m, sm_count, glu=glu)


def choose(q, m: int, sm_count: int, *, glu: bool = False) -> LinearConfig:
    """The decode step's kernel for ``q`` at batch ``m``: what the table measured fastest (this GEMM, quant_gemv's
    GEMV, or quant_linear's dot kernel); without an entry, the GEMV where it runs (INT4-AWQ at batch 1), else
    this GEMM."""
    choice = measured(q.fmt, m, q.n, q.k, glu)
    kernel, cfg = choice if choice is not None else ("gemv" if quant_gemv.supported(q, m) else "gemm", None)
    if kernel == "gemv" and quant_gemv.supported(q, m):
        return quant_linear.pick_config(q, m, sm_count, glu=glu)
    if kernel == "dot":
        return quant_linear.pick_config(q, m, sm_count, glu=glu, gemv=False)
    return cfg or default_config(q, m, sm_count, glu=glu)
