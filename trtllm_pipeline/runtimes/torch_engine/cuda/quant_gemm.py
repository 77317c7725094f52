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

At prefill sizes (``linear``) the table can also choose a library GEMM (``LINEAR_KERNELS``), where the H200 measured
ours far from it (M 2048: INT4-AWQ glu 1032 us against BF16 F.linear's 354; SmoothQuant glu 608 against
``torch._int_mm``'s 377):

* ``int_mm`` (``int8_sq``): the input quantized by one kernel (``_act_tile``: the GEMM's rounding points), cuBLAS's
  int8 x int8 -> int32 ``torch._int_mm``, and one epilogue kernel (the folded scale, the bias, the compute dtype):
  the GEMM's output exactly, the same int32 sums. cuBLAS wants M > 16 and K, N multiples of 8 (``int_mm_supported``).
* ``dequant`` (``int4_awq``, ``w4a8_awq``, ``int8_wo``): the layer's weight dequantized by one kernel into a scratch
  buffer (``scratch``: ONE per device and stream, grown to the largest layer and reused by every layer; no
  layer keeps a dequantized copy), then the library GEMM on it: W4A16 and W8A16 ``F.linear`` of the compute-dtype
  weight (eager's copy's values and product exactly), W4A8 ``torch._scaled_mm`` of the E4M3 weight (the values the
  GEMM rounds in registers) against the FP8-quantized input. One extra pass over the weight (INT4 7B glu: 34 MB read,
  136 MB written: ~40 us at the H200's copy bandwidth, an estimate) buys cuBLAS's tensor-core rate over M rows.

The decode step launches only this module's kernels (and quant_linear's): where the table's winner is one of these,
its entry keeps the fastest kernel the step can launch (``step_kernel``, ``step_config``) and ``choose`` takes that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import (quant_gemv, quant_gemv_int8, quant_gemv_w4a8, quant_linear,
                                                       quant_mma_int4, quant_rows_int4_mma, quant_rows_int8_mma,
                                                       quant_rows_int8wo_mma, quant_rows_w4a8_mma)
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, last_program, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv import int4_scales
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_linear import (_act_tile, _magic, act_apply, act_scale,
                                                                    pqs_values, x_tile)
from trtllm_pipeline.runtimes.torch_engine.cuda.support import interpreting

TABLE = Path(__file__).with_name("quant_gemm_table.json")
TABLE_ENV = "TRTLLM_PIPELINE_GEMM_TABLE"
GROUP_M = tl.constexpr(8)  # output row tiles per band of the launch order (prefill: a band's weight tiles stay in L2)
# a table entry's kernel: this module's GEMM, quant_gemv's batch-1 GEMV, quant_linear's older dot kernel, or (``linear``
# only, prefill) torch._int_mm / the dequantized weight into a library GEMM
KERNELS = ("gemm", "gemv", "dot", "int_mm", "dequant")
LINEAR_KERNELS = ("int_mm", "dequant")
STEP_KERNELS = ("gemm", "gemv", "dot")
# the Gluon wgmma row kernels by format (``LinearConfig.lut_mma`` with ``gemm``), each behind its own switch
ROW_KERNELS = {"int4_awq": quant_rows_int4_mma, "w4a8_awq": quant_rows_w4a8_mma, "int8_sq": quant_rows_int8_mma,
               "int8_wo": quant_rows_int8wo_mma}


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


def _unpack_ptx(magic: int) -> str:
    """PTX for ``tl.inline_asm_elementwise(pack=2)``: two packed bytes (the low half of $2) -> their low nibbles'
    ``magic ^ nibble`` as one register of two 16-bit floats ($0) and their high nibbles' ($1), element order kept: a
    PRMT puts byte 1 in the upper half, one LOP3 masks and XORs a pair, a shift brings the high nibbles down (4
    instructions for 4 weights). Two bytes, not four: in the dot operand's layout a thread's bytes come in K-pairs,
    and four a register cost a PRMT more each to gather (sm_90 SASS of a reduced kernel: 433 against 545 a K tile). As
    int8 elementwise ops the compiler widens every byte to a register and packs the halves back (PRMT, IMAD, SHF: ~2
    instructions a weight in the 7B GLU's K loop at M 8, tools/gemm_sass.py; with the float32 scaling after it 7.6)."""
    m = f"0x{magic:04X}{magic:04X}"
    return ("{ .reg .b32 t, z; mov.b32 z, 0; prmt.b32 t, $2, z, 0x4140; "
            f"lop3.b32 $0, t, 0x000F000F, {m}, 0x6A; shr.u32 t, t, 4; lop3.b32 $1, t, 0x000F000F, {m}, 0x6A; }}")


UNPACK_PTX_BF16 = tl.constexpr(_unpack_ptx(0x4308))  # bfloat16 128 + (nibble ^ 8) = 136 + q (``_magic``)
UNPACK_PTX_F16 = tl.constexpr(_unpack_ptx(0x6408))  # float16 1024 + (nibble ^ 8) = 1032 + q


def _unpack_f32_ptx() -> str:
    """PTX (pack=4): four packed bytes ($8) -> the float32 bits of ``2^23 + (nibble ^ 8)`` = ``2^23 + 8 + q`` of their
    low nibbles ($0-$3) and of their high nibbles ($4-$7), element order kept: a shift and a LOP3 a weight (W4A8's
    float32 path; through the 16-bit values and a widening it was ~2.5 a weight). Four bytes: W4A8's operand is
    E4M3, whose layout holds a thread's bytes in fours along K (two at a time: 6.9 instructions a weight, not 6.0)."""
    ops = []
    for i in range(4):
        if i:
            ops.append(f"shr.u32 t, $8, {8 * i}; lop3.b32 ${i}, t, 0xF, 0x4B000008, 0x6A;")
        else:
            ops.append("lop3.b32 $0, $8, 0xF, 0x4B000008, 0x6A;")
        ops.append(f"shr.u32 t, $8, {8 * i + 4}; lop3.b32 ${4 + i}, t, 0xF, 0x4B000008, 0x6A;")
    return "{ .reg .b32 t; " + " ".join(ops) + " }"


UNPACK_PTX_F32 = tl.constexpr(_unpack_f32_ptx())
F32_OFFSET = tl.constexpr(8388616.0)  # 2^23 + 8: what ``UNPACK_PTX_F32``'s values carry beside q
# Four float32 ($1-$4) -> four E4M3 in one register ($0), rounded to nearest even and saturated at +-448 (ModelOpt's
# clamp): two a conversion (cvt puts its first operand in the upper byte)
TO_E4M3_PTX = tl.constexpr("{ .reg .b16 l, h; cvt.rn.satfinite.e4m3x2.f32 l, $2, $1; "
                           "cvt.rn.satfinite.e4m3x2.f32 h, $4, $3; mov.b32 $0, {l, h}; }")


@triton.jit
def _nibbles(p, MAGIC: tl.constexpr, COMPUTE: tl.constexpr, PTX: tl.constexpr):
    """Packed tile ``p`` (int8) -> ``OFFSET + q`` of its low nibbles (even rows) and high nibbles (odd rows), in the
    compute dtype: by PTX two bytes at a time (``PTX``: CUDA only), else as int16 elementwise ops."""
    if PTX:
        if MAGIC == 0x4308:
            lo, hi = tl.inline_asm_elementwise(UNPACK_PTX_BF16, "=r,=r,r", [p], dtype=(tl.bfloat16, tl.bfloat16),
                                               is_pure=True, pack=2)
        else:
            lo, hi = tl.inline_asm_elementwise(UNPACK_PTX_F16, "=r,=r,r", [p], dtype=(tl.float16, tl.float16),
                                               is_pure=True, pack=2)
    else:
        u = p.to(tl.uint8, bitcast=True).to(tl.int16)
        lo = ((u & 0xF) ^ MAGIC).to(COMPUTE, bitcast=True)
        hi = ((u >> 4) ^ MAGIC).to(COMPUTE, bitcast=True)
    return lo, hi


@triton.jit
def _w4_operands(p, s_lo, s_hi, POST_SCALE: tl.constexpr, A8: tl.constexpr, MAGIC: tl.constexpr,
                 OFFSET: tl.constexpr, COMPUTE: tl.constexpr, PTX: tl.constexpr):
    """The even (low nibble) and odd (high nibble) rows of packed tile ``p`` as MMA operands: ``OFFSET + q`` in the
    compute dtype (POST_SCALE), E4M3 of ``q x step`` (A8), or ``q x scale`` rounded to the compute dtype."""
    if PTX and A8:
        # W4A8 on CUDA: the nibbles straight to float32 (2^23 + 8 + q), q x step as below, and E4M3 by saturating
        # conversions, two an instruction (the clamp's FMNMX pair a weight gone): the same E4M3 values
        l32, h32 = tl.inline_asm_elementwise(UNPACK_PTX_F32, "=r,=r,=r,=r,=r,=r,=r,=r,r", [p],
                                             dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
        out_lo = tl.inline_asm_elementwise(TO_E4M3_PTX, "=r,r,r,r,r", [(l32 - F32_OFFSET) * s_lo],
                                           dtype=tl.float8e4nv, is_pure=True, pack=4)
        out_hi = tl.inline_asm_elementwise(TO_E4M3_PTX, "=r,r,r,r,r", [(h32 - F32_OFFSET) * s_hi],
                                           dtype=tl.float8e4nv, is_pure=True, pack=4)
    else:
        lo, hi = _nibbles(p, MAGIC, COMPUTE, PTX)
        if POST_SCALE:
            out_lo, out_hi = lo, hi
        elif PTX:
            # INT4-AWQ: q x s in the compute dtype, two weights an instruction on sm_90 (HADD2, HMUL2; in float32 it
            # is FADD, FMUL and a conversion a weight: most of the 7.6 -> 3.5 instructions a weight of the 7B GLU's K
            # loop at M 8, tools/gemm_sass.py). The same values: ``lo - OFFSET`` is q exactly, and q x s rounded once
            # is what float32's exact q x s rounds to, since an INT4-AWQ scale holds a compute-dtype value
            # (``QuantWeight.of``). With PTX only: Triton's interpreter computes 16-bit float arithmetic wrongly (and
            # makes no such constant), so this path is checked on a GPU (the sweep's error column) before a table
            # takes it.
            out_lo = (lo - OFFSET) * s_lo.to(COMPUTE)
            out_hi = (hi - OFFSET) * s_hi.to(COMPUTE)
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
             COMPUTE: tl.constexpr, PTX: tl.constexpr):
    """One K tile of one packed matrix into its even- and odd-row accumulators."""
    if LOAD_MASK:
        p = tl.load(w_ptrs, mask=j_ok[:, None] & k_ok[None, :], other=0)
    else:
        p = tl.load(w_ptrs)
    s_lo, s_hi = int4_scales(s_ptr, stride_sg, stride_s2, rj, kk, k_tile, j_ok, G, GROUP, ONE_GROUP)
    lo, hi = _w4_operands(p, s_lo, s_hi, POST_SCALE, A8, MAGIC, OFFSET, COMPUTE, PTX)
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
def _store(y, y2, bias_ptr, out_ptr, ws_ptr, count_ptr, rm, rn, M, N, pid_s, stride_os, stride_om,
           HAS_BIAS: tl.constexpr, PARTIALS: tl.constexpr, GLU: tl.constexpr, GLU_SPLITS: tl.constexpr,
           COMPUTE: tl.constexpr):
    """The epilogue: float32 split-K partials (``out[pid_s]``), silu(y) * y2 (GLU, split or not), or y + bias,
    compute dtype."""
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if PARTIALS:
        tl.store(out_ptr + pid_s * stride_os + rm[:, None] * stride_om + rn[None, :], y, mask=mask)
    elif GLU and GLU_SPLITS > 1:
        # fc's and gate's partials side by side in the workspace [GLU_SPLITS, M, 2N]; the output tile's last program
        # sums them in split order (the same sums whichever program comes last) and applies the GLU
        part = ws_ptr + rm[:, None] * (2 * N) + rn[None, :]
        tl.store(part + pid_s * M * 2 * N, y, mask=mask)
        tl.store(part + pid_s * M * 2 * N + N, y2, mask=mask)
        if last_program(count_ptr, tl.program_id(0), GLU_SPLITS):
            fc = tl.zeros_like(y)
            gate = tl.zeros_like(y2)
            for s in tl.static_range(GLU_SPLITS):
                fc += tl.load(part + s * M * 2 * N, mask=mask, other=0.0, cache_modifier=".cg")
                gate += tl.load(part + s * M * 2 * N + N, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], silu_mul(fc, gate, COMPUTE), mask=mask)
            tl.store(count_ptr + tl.program_id(0), 0)
    elif GLU:
        tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], silu_mul(y, y2, COMPUTE), mask=mask)
    else:
        if HAS_BIAS:  # added to the float32 sum, rounded once (as cuBLAS's bias epilogue under F.linear)
            y = y + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], y.to(COMPUTE), mask=mask)


# ------------------------------------------------------------------------------------------ kernels


@triton.jit
def _w4_gemm_kernel(
    x_ptr, x2_ptr, w_ptr, s_ptr, pqs_ptr, aq_ptr, osc_ptr,
    w2_ptr, s2_ptr, pqs2_ptr, aq2_ptr, osc2_ptr,
    bias_ptr, out_ptr, ws_ptr, count_ptr,
    M, N, K, G, k_iters_per_split,
    stride_xm, stride_wn, stride_sg, stride_s2, stride_os, stride_om,
    GROUP: tl.constexpr, A8: tl.constexpr, HAS_PQS: tl.constexpr, GLU: tl.constexpr, HAS_BIAS: tl.constexpr,
    PARTIALS: tl.constexpr, GLU_SPLITS: tl.constexpr, ONE_GROUP: tl.constexpr, POST_SCALE: tl.constexpr,
    EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, EVEN_M: tl.constexpr, SWAP: tl.constexpr, MAGIC: tl.constexpr,
    OFFSET: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr, PTX: tl.constexpr = False, X2: tl.constexpr = False,
):
    """x [M, K] times packed INT4 [N/2, K]^T (and, GLU, a second matrix, of x2 where X2): one output tile over one K
    split."""
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
    x2_ptrs = x2_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :]
    if SWAP:
        acc_lo = tl.zeros((HALF, BLOCK_M), dtype=tl.float32)
    else:
        acc_lo = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    acc_hi = tl.zeros_like(acc_lo)
    acc2_lo = tl.zeros_like(acc_lo)
    acc2_hi = tl.zeros_like(acc_lo)
    # the input's scales ahead of the loop, each K tile's pre-quant scales an iteration early (``pqs_values``)
    aq, aq2 = act_scale(aq_ptr, ACT), act_scale(aq2_ptr, ACT if GLU else 0)
    pq = pqs_values(pqs_ptr + k0 + rk, k0 + rk < K, HAS_PQS, True)
    pq2 = pqs_values(pqs2_ptr + k0 + rk, k0 + rk < K, HAS_PQS and GLU, True)
    for i in range(k_iters_per_split):
        k_tile = k0 + i * BLOCK_K
        kk = k_tile + rk
        k_ok = kk < K
        pq_next = pqs_values(pqs_ptr + kk + BLOCK_K, kk + BLOCK_K < K, HAS_PQS, True)
        xr = x_tile(x_ptrs, m_ok & k_ok[None, :], not (EVEN_M and EVEN_K))
        x = act_apply(xr, pq, aq, HAS_PQS, ACT, COMPUTE)
        acc_lo, acc_hi = _w4_step(w_ptrs, s_ptr, x, rj, kk, k_tile, j_ok, k_ok, G, stride_sg, stride_s2, acc_lo,
                                  acc_hi, GROUP, ONE_GROUP, POST_SCALE, A8, not (EVEN_N and EVEN_K), SWAP, MAGIC,
                                  OFFSET, COMPUTE, PTX)
        if GLU:
            pq2_next = pqs_values(pqs2_ptr + kk + BLOCK_K, kk + BLOCK_K < K, HAS_PQS, True)
            if X2:  # the gate's own input (its producer applied each matrix's pre-quant scale)
                x2 = act_apply(x_tile(x2_ptrs, m_ok & k_ok[None, :], not (EVEN_M and EVEN_K)), pq2, aq2, HAS_PQS, ACT,
                               COMPUTE)
                x2_ptrs += BLOCK_K
            else:
                x2 = act_apply(xr, pq2, aq2, HAS_PQS, ACT, COMPUTE)
            acc2_lo, acc2_hi = _w4_step(w2_ptrs, s2_ptr, x2, rj, kk, k_tile, j_ok, k_ok, G, stride_sg, stride_s2,
                                        acc2_lo, acc2_hi, GROUP, ONE_GROUP, POST_SCALE, A8, not (EVEN_N and EVEN_K),
                                        SWAP, MAGIC, OFFSET, COMPUTE, PTX)
            pq2 = pq2_next
            w2_ptrs += BLOCK_K
        pq = pq_next
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    y = _w4_out(acc_lo, acc_hi, osc_ptr, A8, SWAP)
    y2 = y
    if GLU:
        y2 = _w4_out(acc2_lo, acc2_hi, osc2_ptr, A8, SWAP)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _store(y, y2, bias_ptr, out_ptr, ws_ptr, count_ptr, rm, rn, M, N, pid_s, stride_os, stride_om, HAS_BIAS,
           PARTIALS, GLU, GLU_SPLITS, COMPUTE)


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
    bias_ptr, out_ptr, ws_ptr, count_ptr,
    M, N, K, k_iters_per_split,
    stride_xm, stride_wn, stride_sg, stride_os, stride_om,
    GROUP: tl.constexpr, A8: tl.constexpr, HAS_PQS: tl.constexpr, GLU: tl.constexpr, HAS_BIAS: tl.constexpr,
    PARTIALS: tl.constexpr, GLU_SPLITS: tl.constexpr, SCALE_AT: tl.constexpr, EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_M: tl.constexpr, SWAP: tl.constexpr, COMPUTE: tl.constexpr,
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
    # as the INT4 GEMM: the input's scales ahead of the loop, the pre-quant scales an iteration early
    aq, aq2 = act_scale(aq_ptr, ACT), act_scale(aq2_ptr, ACT if GLU else 0)
    pq = pqs_values(pqs_ptr + k0 + rk, k0 + rk < K, HAS_PQS, True)
    pq2 = pqs_values(pqs2_ptr + k0 + rk, k0 + rk < K, HAS_PQS and GLU, True)
    for i in range(k_iters_per_split):
        k_tile = k0 + i * BLOCK_K
        kk = k_tile + rk
        k_ok = kk < K
        pq_next = pqs_values(pqs_ptr + kk + BLOCK_K, kk + BLOCK_K < K, HAS_PQS, True)
        xr = x_tile(x_ptrs, m_ok & k_ok[None, :], not (EVEN_M and EVEN_K))
        x = act_apply(xr, pq, aq, HAS_PQS, ACT, COMPUTE)
        acc = _w8_step(w_ptrs, s_ptr, x, rn, kk, k_tile, n_ok, k_ok, stride_sg, acc, GROUP, A8, SCALE_AT,
                       not (EVEN_N and EVEN_K), SWAP, COMPUTE)
        if GLU:
            pq2_next = pqs_values(pqs2_ptr + kk + BLOCK_K, kk + BLOCK_K < K, HAS_PQS, True)
            x2 = act_apply(xr, pq2, aq2, HAS_PQS, ACT, COMPUTE)
            acc2 = _w8_step(w2_ptrs, s2_ptr, x2, rn, kk, k_tile, n_ok, k_ok, stride_sg, acc2, GROUP, A8, SCALE_AT,
                            not (EVEN_N and EVEN_K), SWAP, COMPUTE)
            pq2 = pq2_next
            w2_ptrs += BLOCK_K
        pq = pq_next
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    y = _w8_out(acc, s_ptr, rn, n_ok, A8, SCALE_AT, SWAP)
    y2 = y
    if GLU:
        y2 = _w8_out(acc2, s2_ptr, rn, n_ok, A8, SCALE_AT, SWAP)
    _store(y, y2, bias_ptr, out_ptr, ws_ptr, count_ptr, rm, rn, M, N, pid_s, stride_os, stride_om, HAS_BIAS,
           PARTIALS, GLU, GLU_SPLITS, COMPUTE)


@triton.jit
def _act_kernel(x_ptr, pqs_ptr, aq_ptr, out_ptr, M, K, stride_xm, stride_om, HAS_PQS: tl.constexpr,
                ACT: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """The input as the GEMMs load it (``_act_tile``: pre-quant scale, activation quantizer), stored: [M, K]."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = rk < K
    mask = (rm[:, None] < M) & k_ok[None, :]
    x = _act_tile(x_ptr + rm[:, None] * stride_xm + rk[None, :], pqs_ptr + rk, aq_ptr, mask, k_ok, HAS_PQS, ACT,
                  True, COMPUTE)
    tl.store(out_ptr + rm[:, None] * stride_om + rk[None, :], x, mask=mask)


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, out_ptr, N, K, G, stride_wn, stride_sg, stride_s2, stride_on,
                    INT4: tl.constexpr, A8: tl.constexpr, GROUP: tl.constexpr, ONE_GROUP: tl.constexpr,
                    MAGIC: tl.constexpr, OFFSET: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """One [BLOCK_R, BLOCK_K] tile of stored rows (INT4: packed rows, two output rows each) as the GEMM's
    scale-on-each-weight path makes its operands: ``q x scale`` rounded to the compute dtype (INT4-AWQ, as eager's
    copy), E4M3 of ``q x step`` (W4A8), ``w x scale[slice]`` rounded (INT8 weight-only, as eager's copy)."""
    rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    k_tile = tl.program_id(1) * BLOCK_K
    rk = k_tile + tl.arange(0, BLOCK_K)
    k_ok = rk < K
    if INT4:
        r_ok = rr < N // 2
        mask = r_ok[:, None] & k_ok[None, :]
        p = tl.load(w_ptr + rr[:, None] * stride_wn + rk[None, :], mask=mask, other=0)
        s_lo, s_hi = int4_scales(s_ptr, stride_sg, stride_s2, rr, rk, k_tile, r_ok, G, GROUP, ONE_GROUP)
        lo, hi = _w4_operands(p, s_lo, s_hi, False, A8, MAGIC, OFFSET, COMPUTE, False)
        tl.store(out_ptr + (2 * rr)[:, None] * stride_on + rk[None, :], lo, mask=mask)
        tl.store(out_ptr + (2 * rr + 1)[:, None] * stride_on + rk[None, :], hi, mask=mask)
    else:
        r_ok = rr < N
        mask = r_ok[:, None] & k_ok[None, :]
        w = tl.load(w_ptr + rr[:, None] * stride_wn + rk[None, :], mask=mask, other=0)
        s = tl.load(s_ptr + (rk // GROUP)[None, :] * stride_sg + rr[:, None], mask=mask, other=0.0)
        tl.store(out_ptr + rr[:, None] * stride_on + rk[None, :], (w.to(tl.float32) * s).to(COMPUTE), mask=mask)


@triton.jit
def _int_mm_out_kernel(acc_ptr, s_ptr, bias_ptr, out_ptr, M, N, stride_am, stride_om, HAS_BIAS: tl.constexpr,
                       COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """torch._int_mm's int32 [M, N] as the SmoothQuant GEMM's epilogue finishes its sums (``_w8_out``, ``_store``)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.load(acc_ptr + rm[:, None] * stride_am + rn[None, :], mask=(rm[:, None] < M) & n_ok[None, :], other=0)
    y = acc.to(tl.float32) * tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
    _store(y, y, bias_ptr, out_ptr, out_ptr, out_ptr, rm, rn, M, N, 0, 0, stride_om, HAS_BIAS, False, False, 1, COMPUTE)


# ------------------------------------------------------------------------------------------ launchers


class SharedMemoryExceeded(RuntimeError):
    """A GEMM's tiles asked for more shared memory than the GPU has (Triton's OutOfResources, with the tiles named)."""


@contextlib.contextmanager
def _tiles_named(q, cfg: LinearConfig):
    """Triton's OutOfResources at a launch (compiled at the first one) as an error naming the tiles and the shape
    that asked for it: ``fit`` should have kept them within the device's shared memory. The runtime decodes eagerly
    when the fast path's warm-up meets it (``TorchRuntime._fast_decoder``)."""
    try:
        yield
    except triton.runtime.errors.OutOfResources as e:
        raise SharedMemoryExceeded(
            f"quant_gemm: {q.fmt} N {q.n} K {q.k} group {q.group} at {cfg} needs more than this GPU has: {e}. Fix: "
            f"lower quant_gemm.smem_estimate's bound for these tiles (``fit`` picks by it), or give a measured table "
            f"without them (${TABLE_ENV})") from e


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool = False,
           bias: torch.Tensor | None = None, counters: torch.Tensor | None = None,
           workspace: torch.Tensor | None = None, x2: torch.Tensor | None = None):
    """``x`` [M, K] (compute dtype, before the pre-quant scale and activation quantizer: applied here) times ``q``'s
    weight (with ``q2``, INT4 formats: ``x2``, laid out as ``x``, is the second matrix's own input; else ``x``).
    ``out``: [splits, M, N] float32 partials (3 dimensions, or 2 with one split), or with ``q2`` the GLU
    ``silu(x W^T) * (x W2^T)`` [M, N] in the compute dtype, or (``out`` in the compute dtype) ``x W^T + bias``.
    The GLU splits K only with ``counters`` (int32 zeros, ``glu_counters`` of them; left zero) and a float32
    ``workspace`` of ``glu_workspace`` elements (its epilogue forbids float32 partials to the consumer).
    Returns Triton's handle of the launch."""
    if cfg.lut_mma:  # the wgmma row kernels (quant_rows_*_mma; only where switched on)
        assert x2 is None and bias is None, "the wgmma row kernels take one input and no bias"
        return ROW_KERNELS[q.fmt].launch(x, q, q2, out, cfg, compute, pdl)
    m, k = x.shape
    assert k == q.k and x.stride(1) == 1 and cfg.gemm
    glu = q2 is not None
    assert x2 is None or glu and q.int4 and x2.shape == x.shape and x2.stride() == x.stride()
    if glu:  # the second matrix is read with the first one's strides and flags
        assert q2.fmt == q.fmt and q2.group == q.group and q2.scales.stride() == q.scales.stride()
        assert q2.weight.stride() == q.weight.stride() and (q2.pqs is None) == (q.pqs is None)
    partials = out.dtype == torch.float32 and not glu
    glu_splits = cfg.splits if glu else 1
    assert partials or cfg.splits == 1 or glu, "split K needs float32 partials"
    if glu_splits > 1:
        assert counters is not None and counters.dtype == torch.int32 and counters.numel() >= glu_counters(q, m, cfg)
        assert workspace is not None and workspace.numel() >= glu_workspace(q, m, cfg)
    q2 = q2 or q
    k_iters = triton.cdiv(k, cfg.block_k)
    per_split = triton.cdiv(k_iters, cfg.splits)
    dummy = out

    def opt(t):
        return t if t is not None else dummy

    common = dict(GROUP=q.group, A8=q.act != 0, HAS_PQS=q.pqs is not None, GLU=glu, HAS_BIAS=bias is not None,
                  PARTIALS=partials, GLU_SPLITS=glu_splits, EVEN_K=k % cfg.block_k == 0 and k_iters % cfg.splits == 0,
                  EVEN_M=m % cfg.block_m == 0, SWAP=cfg.swap, COMPUTE=tl_dtype(compute), BLOCK_M=cfg.block_m,
                  BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PDL=pdl, num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages, launch_pdl=pdl)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(q.n, cfg.block_n), cfg.splits)
    stride_os = out.stride(0) if partials and out.dim() == 3 else 0
    with _tiles_named(q, cfg):
        if q.int4:
            magic, offset = _magic(compute)
            one_group = q.group % cfg.block_k == 0
            return _w4_gemm_kernel[grid](
                x, x if x2 is None else x2, q.weight, q.scales, opt(q.pqs), opt(q.act_q), opt(q.out_scale),
                q2.weight, q2.scales, opt(q2.pqs), opt(q2.act_q), opt(q2.out_scale),
                opt(bias), out, opt(workspace), opt(counters), m, q.n, k, q.scales.shape[0], per_split,
                x.stride(0), q.weight.stride(0), q.scales.stride(0), q.scales.stride(1), stride_os, out.stride(-2),
                ONE_GROUP=one_group, POST_SCALE=one_group and q.act == 0 and not cfg.scale_weights,
                EVEN_N=(q.n // 2) % (cfg.block_n // 2) == 0,
                MAGIC=magic, OFFSET=offset, PTX=cfg.ptx_nibbles and not interpreting(), X2=x2 is not None, **common)
        # int8_wo with one scale per output row over the program's whole K range: in the epilogue
        scale_at = 0 if q.act != 0 or q.group >= k else 1 if q.group % cfg.block_k == 0 else 2
        return _w8_gemm_kernel[grid](
            x, q.weight, q.scales, opt(q.pqs), opt(q.act_q),
            q2.weight, q2.scales, opt(q2.pqs), opt(q2.act_q),
            opt(bias), out, opt(workspace), opt(counters), m, q.n, k, per_split,
            x.stride(0), q.weight.stride(0), q.scales.stride(0) if q.scales.dim() == 2 else 0, stride_os,
            out.stride(-2), SCALE_AT=scale_at, EVEN_N=q.n % cfg.block_n == 0, **common)


def glu_counters(q, m: int, cfg: LinearConfig) -> int:
    """A split GLU's counters: one per output tile."""
    return triton.cdiv(m, cfg.block_m) * triton.cdiv(q.n, cfg.block_n)


def glu_workspace(q, m: int, cfg: LinearConfig) -> int:
    """A split GLU's float32 workspace: each split's fc and gate partials, [splits, M, 2N]."""
    return cfg.splits * m * 2 * q.n


def linear(x: torch.Tensor, q, bias: torch.Tensor | None, compute: torch.dtype,
           cfg: LinearConfig | None = None, kernel: str | None = None) -> torch.Tensor:
    """``x W^T + b`` in the compute dtype for any leading shape of ``x`` (prefill, eager decode): the kernel the
    table measured fastest for this M (``linear_kernel``: the GEMM from the stored weights, tiles from the table,
    or one of ``LINEAR_KERNELS``); ``cfg``: this GEMM at these tiles; ``kernel``: that kernel (where it can run).
    Split K goes through float32 partials summed here."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    m = flat.shape[0]
    if cfg is None:
        kernel = linear_kernel(q, m, compute, flat.device, kernel)
        if kernel == "int_mm":
            return int_mm_linear(flat, q, bias, compute).reshape(*x.shape[:-1], q.n)
        if kernel == "dequant":
            return dequant_linear(flat, q, bias, compute).reshape(*x.shape[:-1], q.n)
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


# ------------------------------------------------------------------------------------------ library GEMMs


def int_mm_supported(q, m: int) -> bool:
    """Where ``int_mm`` runs: SmoothQuant, and cuBLAS's int8 GEMM's shapes (M > 16, K and N multiples of 8)."""
    return q.fmt == "int8_sq" and m > 16 and q.k % 8 == 0 and q.n % 8 == 0


def dequant_supported(q, compute: torch.dtype) -> bool:
    """Where ``dequant`` runs: INT4-AWQ and INT8 weight-only (F.linear), W4A8-AWQ where torch._scaled_mm takes its
    shapes (K and N multiples of 16; a 16-bit output)."""
    if q.fmt in ("int4_awq", "int8_wo"):
        return True
    return q.fmt == "w4a8_awq" and q.k % 16 == 0 and q.n % 16 == 0 and compute in (torch.bfloat16, torch.float16)


def linear_kernel(q, m: int, compute: torch.dtype, device: torch.device, kernel: str | None = None) -> str:
    """``linear``'s kernel for ``q`` at M = ``m``: ``kernel`` or else the table's, where it runs ("gemm" where the
    table has no entry, chose a decode kernel, or chose a library GEMM whose shapes this is not; under CUDA-graph
    capture too, where the scratch buffer must not be allocated)."""
    if kernel is None:
        choice = measured(q.fmt, m, q.n, q.k, False)
        kernel = choice[0] if choice is not None else "gemm"
    if kernel == "int_mm" and int_mm_supported(q, m) or kernel == "dequant" and dequant_supported(q, compute):
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            return kernel
    return "gemm"


def quantize_input(x: torch.Tensor, q, compute: torch.dtype) -> torch.Tensor:
    """``x`` [M, K] as the GEMMs' ``_act_tile`` leaves it: times the pre-quant scale (rounded to the compute dtype),
    then int8 (SmoothQuant) or E4M3 (W4A8); ``x`` itself where the layer has neither."""
    act = q.act
    if q.pqs is None and act == 0:
        return x
    m, k = x.shape
    dtype = {0: compute, 1: torch.float8_e4m3fn, 2: torch.int8}[act]
    out = torch.empty(m, k, dtype=dtype, device=x.device)
    block_m, block_k = 32, 128
    _act_kernel[(triton.cdiv(m, block_m), triton.cdiv(k, block_k))](
        x, q.pqs if q.pqs is not None else x, q.act_q if q.act_q is not None else x, out, m, k, x.stride(0),
        out.stride(0), HAS_PQS=q.pqs is not None, ACT=act, COMPUTE=tl_dtype(compute), BLOCK_M=block_m,
        BLOCK_K=block_k, num_warps=4)
    return out


_SCRATCH: dict = {}  # (device, stream) -> the dequantized weights' byte buffer (``scratch``)


def scratch(nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 buffer of at least ``nbytes`` for this device and stream: ONE per (device, stream), grown to the
    largest layer it was asked for, reused by every later call (each call's work is ordered on its stream). Not
    grown under CUDA-graph capture (the buffer would live in the graph's pool)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < nbytes:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("quant_gemm.scratch: not grown under CUDA-graph capture; run the call once first")
        _SCRATCH.pop(key, None)
        del buf  # the smaller buffer goes back to the allocator before the larger one is taken
        buf = _SCRATCH[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return buf[:nbytes]


def scratch_bytes() -> int:
    """Bytes the scratch buffers hold (every device and stream)."""
    return sum(b.numel() for b in _SCRATCH.values())


def release_scratch() -> None:
    """Free the scratch buffers (the next ``dequant`` call takes one again)."""
    _SCRATCH.clear()


def dequantize(q, compute: torch.dtype) -> torch.Tensor:
    """``q``'s weight [N, K] as the ``dequant`` kernel multiplies it, in the scratch buffer (valid until the next
    call on this stream): compute dtype (INT4-AWQ, INT8 weight-only), E4M3 in units of scale_2 (W4A8-AWQ)."""
    n, k = q.n, q.k
    dtype = torch.float8_e4m3fn if q.act == 1 else compute
    out = scratch(n * k * dtype.itemsize, q.weight.device).view(dtype).view(n, k)
    block_r, block_k = 64, 128  # INT4: 8 KB of packed weight in, 32 KB of bfloat16 out per program
    rows = n // 2 if q.int4 else n
    magic, offset = _magic(compute)
    s = q.scales
    _dequant_kernel[(triton.cdiv(rows, block_r), triton.cdiv(k, block_k))](
        q.weight, s, out, n, k, s.shape[0], q.weight.stride(0), s.stride(0) if s.dim() > 1 else 0,
        s.stride(1) if q.int4 else 0, out.stride(0), INT4=q.int4, A8=q.act == 1, GROUP=q.group,
        ONE_GROUP=q.group % block_k == 0, MAGIC=magic, OFFSET=offset, COMPUTE=tl_dtype(compute), BLOCK_R=block_r,
        BLOCK_K=block_k, num_warps=4)
    return out


def dequant_linear(x: torch.Tensor, q, bias: torch.Tensor | None, compute: torch.dtype) -> torch.Tensor:
    """The ``dequant`` kernel: ``x`` [M, K] (compute dtype) times ``q``'s weight dequantized into the scratch
    buffer, by F.linear (INT4-AWQ, INT8 weight-only: eager's product on eager's copy's values) or by
    torch._scaled_mm of the E4M3 weight and the FP8-quantized input, scaled once by ``activation scale x
    scale_2`` (W4A8-AWQ); [M, N] in the compute dtype, bias added."""
    xq = quantize_input(x, q, compute)
    w = dequantize(q, compute)
    if q.act == 1:  # one float32 scale on the sum, as the GEMM's (per-tensor scales: 0-dim, as Linear's FP8 call)
        one = torch.ones((), dtype=torch.float32, device=x.device)
        return torch._scaled_mm(xq, w.t(), scale_a=q.out_scale.reshape(()), scale_b=one, bias=bias,
                                out_dtype=compute)
    return F.linear(xq, w, bias)


def int_mm_linear(x: torch.Tensor, q, bias: torch.Tensor | None, compute: torch.dtype) -> torch.Tensor:
    """The ``int_mm`` kernel (SmoothQuant): ``x`` [M, K] quantized to int8 as the GEMM does, cuBLAS's int8 x int8
    -> int32 (``torch._int_mm``), the folded per-channel scale and the bias in the GEMM's epilogue: [M, N] in the
    compute dtype, the GEMM's output exactly."""
    m = x.shape[0]
    acc = torch._int_mm(quantize_input(x, q, compute), q.weight.t())
    out = torch.empty(m, q.n, dtype=compute, device=x.device)
    block_m, block_n = 32, 128
    _int_mm_out_kernel[(triton.cdiv(m, block_m), triton.cdiv(q.n, block_n))](
        acc, q.scales, bias if bias is not None else out, out, m, q.n, acc.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, COMPUTE=tl_dtype(compute), BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4)
    return out


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


# ------------------------------------------------------------------------------------------ configs


def default_config(q, m: int, sm_count: int, *, glu: bool = False) -> LinearConfig:
    """Tiles where the table has none. Decode batches (M <= 64): the weight on the MMA's M side (SWAP), 128 output
    rows x 128 inputs (INT4: 8 KB of packed weight per stage; INT8: 64 rows, 8 KB), split K as the dot kernels
    are (INT4 ~8 programs per SM and at least 2 K tiles per split, INT8 ~4 and 4). Prefill: 128 x 128 output
    tiles, 64 inputs per stage, 8 warps; INT4-AWQ with its group scale on each weight, which the H200 measured
    faster at every 7B shape past M 64 (M 2048: glu 1032 us against 1730 with the scale on each tile's dot result,
    proj 1186 against 1998, qkv 291 against 479, dense 233 against 386)."""
    if m <= 64:
        block_m = max(16, triton.next_power_of_2(m))
        block_n = 128 if q.int4 else 64
        tiles = triton.cdiv(q.n, block_n)
        k_tiles = triton.cdiv(q.k, 128)
        per_sm, min_iters = (8, 2) if q.int4 else (4, 4)  # quant_linear.pick_config's (H200, run 15)
        splits = 1 if glu else max(1, min(k_tiles // min_iters, round(per_sm * sm_count / tiles)))
        splits = triton.cdiv(k_tiles, triton.cdiv(k_tiles, splits))  # no split left without tiles
        return LinearConfig(block_m, block_n, 128, splits, 4, 3, gemm=True, swap=True)
    return LinearConfig(128, 128, 64, 1, 8, 3, gemm=True, scale_weights=q.fmt == "int4_awq")


# Shared memory one block may use: the device's opt-in limit, this where no device is asked (CPU, tests): sm_90's
# (H100, H200), the GPU the table was measured on.
SMEM_LIMIT_SM90 = 232448
SMEM_MIN_BLOCK_K = 32  # the narrowest K tile ``fit`` tries (FP8 and int8 MMAs take K in steps of 32)


@functools.lru_cache(maxsize=None)
def smem_limit(device: torch.device) -> int:
    """Bytes of shared memory a block may use on ``device`` (``SMEM_LIMIT_SM90`` off CUDA)."""
    if device.type != "cuda":
        return SMEM_LIMIT_SM90
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def smem_estimate(q, cfg: LinearConfig, *, glu: bool = False) -> int:
    """An upper bound on the shared memory of this module's GEMM for ``q`` at ``cfg``: ``num_stages`` copies of one K
    tile's loads per matrix (GLU: two, each with its own view of the input). The input tile [BLOCK_M, BLOCK_K]; the
    weight tile (INT4: BLOCK_N/2 packed rows); and the scales: one per output row where a K tile lies inside one
    scale group, else one float32 per WEIGHT ([BLOCK_N, BLOCK_K]: 16x the INT4 tile's bytes), which is what
    overflowed on SmolLM2 (group 64 under the default 128-wide K tile: GLU at batch 2-8, 307,200 bytes for an H200's
    232,448; quant_linear's dot kernel asks the same there). Checked against Triton's own count for sm_90, this
    GEMM's and the dot kernel's (tests/test_fast_decode.py): never below it; up to ~2x above (two stages), so ``fit``
    may give up a config that would just fit, never take one that does not."""
    act_bytes = 1 if q.act != 0 else 2  # FP8 / int8 input, else the compute dtype
    x = cfg.block_m * cfg.block_k * act_bytes
    w = (cfg.block_n // 2 if q.int4 else cfg.block_n) * cfg.block_k
    if q.int4:  # ONE_GROUP in launch
        per_weight = q.group % cfg.block_k != 0
    else:  # SCALE_AT 2 in launch
        per_weight = q.act == 0 and q.group < q.k and q.group % cfg.block_k != 0
    scales = cfg.block_n * cfg.block_k * 4 if per_weight else cfg.block_n * 4
    return cfg.num_stages * (2 if glu else 1) * (x + w + scales)


def fit(q, cfg: LinearConfig, limit: int, *, glu: bool = False) -> LinearConfig:
    """``cfg``, or where its shared memory (``smem_estimate``) passes ``limit``, the nearest config that fits: the K
    tile halved first (it keeps the pipeline's depth, and at INT4 groups smaller than the tile it trades the per-weight
    scales for per-row ones), then one stage fewer with the K tile back to its width. A table measured on one GPU and
    model (the 7B's group 128) thus never hands another shape or device a launch it cannot make."""
    for stages in range(cfg.num_stages, 0, -1):
        block_k = cfg.block_k
        while block_k >= min(SMEM_MIN_BLOCK_K, cfg.block_k):
            candidate = dataclasses.replace(cfg, block_k=block_k, num_stages=stages)
            if smem_estimate(q, candidate, glu=glu) <= limit:
                return candidate
            block_k //= 2
    raise ValueError(f"quant_gemm: no tiles of {cfg} fit {limit} bytes of shared memory for {q.fmt} "
                     f"N {q.n} K {q.k} group {q.group}")


def _config(c, kernel: str = "gemm") -> LinearConfig | None:
    """A table entry's config ([block_m, block_n, block_k, splits, warps, stages, swap, scale_weights] and, in
    tables since 2026-12-06, ptx_nibbles) for its kernel: the GEMM's, or the several-row GEMV's tiles
    (``quant_gemv.rows_config``'s fields; swap and scale_weights 0)."""
    if c is None:
        return None
    bm, bn, bk, splits, warps, stages, swap, scale_weights, *ptx = c
    if kernel == "gemv":
        return LinearConfig(bm, bn, bk, splits, warps, stages, gemv=True)
    return LinearConfig(bm, bn, bk, splits, warps, stages, gemm=True, swap=bool(swap),
                        scale_weights=bool(scale_weights), ptx_nibbles=bool(ptx and ptx[0]))


def _load_table(path: Path) -> dict:
    """{(format, n, k, glu): [(m, kernel, config or None, step kernel, step config or None), ...] sorted by m} of a
    table file. The step kernel is what the decode step launches: the entry's own kernel, or where that is one of
    ``LINEAR_KERNELS`` the entry's ``step_kernel`` (the fastest of ``STEP_KERNELS``; "gemm" where none)."""
    entries: dict = {}
    for e in json.loads(path.read_text())["entries"]:
        kernel = e["kernel"]
        # (a GEMV entry's config: the several-row kernel's measured tiles at M > 1; none at batch 1)
        cfg = _config(e.get("config"), kernel) if kernel == "gemm" or kernel == "gemv" and e["m"] > 1 else None
        if kernel in LINEAR_KERNELS:
            step = e.get("step_kernel", "gemm")
            step_cfg = _config(e.get("step_config"), step)
        else:
            step, step_cfg = kernel, cfg
        row = (e["m"], kernel, cfg, step, step_cfg)
        entries.setdefault((e["format"], e["n"], e["k"], bool(e["glu"])), []).append(row)
    return {key: sorted(rows, key=lambda r: r[0]) for key, rows in entries.items()}


@functools.lru_cache(maxsize=None)
def _table(path: str) -> dict:
    p = Path(path)
    return _load_table(p) if p.is_file() else {}


def measured(fmt: str, m: int, n: int, k: int, glu: bool, *, step: bool = False
             ) -> tuple[str, LinearConfig | None] | None:
    """(kernel, GEMM config or None) the table measured fastest for this shape at the smallest measured M >= ``m``
    (the largest past it); None where the table has no such shape, or ``m`` is 1 and batch 1 was not measured.
    ``step``: among the kernels the decode step launches (``STEP_KERNELS``). A shape the table lacks whose half it
    has (N / 2, the same K) takes the half's entry: fc and gate as one weight (model._mlp_input_linear, wherever
    their scales agree: INT8 weight-only's per-channel scales always do; AWQ's and SmoothQuant's pre-quant scales
    differ) are the GLU's two measured matrices stacked, and twice the rows take the same kernel (without it,
    weight-only's prefill of 2,048 tokens ran its GLU through this GEMM at default tiles: 65.3 ms against BF16's 47.9
    on an H100, 2026-12-08, where its four measured linears add 1.26x)."""
    table = _table(os.environ.get(TABLE_ENV) or str(TABLE))
    rows = table.get((fmt, n, k, glu)) or (table.get((fmt, n // 2, k, glu)) if n % 2 == 0 else None)
    if not rows or m == 1 and rows[0][0] != 1:
        return None
    _, kernel, cfg, step_kernel, step_cfg = next((r for r in rows if r[0] >= m), rows[-1])
    return (step_kernel, step_cfg) if step else (kernel, cfg)


def pick_config(q, m: int, sm_count: int, *, glu: bool = False) -> LinearConfig:
    """This GEMM's tiles for ``q`` at M = ``m``: the table's (``measured``) where it chose the GEMM (or, where a
    library GEMM won, measured the GEMM fastest of the step's kernels), else ``default_config``; either ``fit`` to the
    device's shared memory. A row whose step kernel is the GEMV or the dot kernel carries that kernel's tiles, which
    this GEMM cannot take (the eager INT4 decode of 2 rows asserted in ``launch``: H100 2026-12-07)."""
    choice = measured(q.fmt, m, q.n, q.k, glu, step=True)
    taken = choice is not None and choice[0] == "gemm" and choice[1] is not None
    cfg = choice[1] if taken else default_config(q, m, sm_count, glu=glu)
    return fit(q, cfg, smem_limit(q.weight.device), glu=glu)


def choose(q, m: int, sm_count: int, *, glu: bool = False) -> LinearConfig:
    """The decode step's kernel for ``q`` at batch ``m``: what the table measured fastest of those it launches (this
    GEMM, quant_gemv's GEMV, or quant_linear's dot kernel; not ``LINEAR_KERNELS``); without an entry, the GEMV at
    INT4-AWQ batch 1, else this GEMM (its tiles, or the dot kernel's, ``fit`` to the device's shared memory). The
    GEMV at batch 2-16 (its several-row kernel) only where the table measured it fastest for that M, at the table's
    tiles where it has them, or where ``$TRTLLM_PIPELINE_INT4_GEMV_MAX_ROWS`` asks for it (``quant_gemv.forced``). Before
    all of these, ``$TRTLLM_PIPELINE_INT4_WGMMA_ROWS=N`` / ``$TRTLLM_PIPELINE_W4A8_WGMMA_ROWS=N`` /
    ``$TRTLLM_PIPELINE_INT8_WGMMA_ROWS=N`` / ``$TRTLLM_PIPELINE_INT8WO_WGMMA_ROWS=N`` take the wgmma row kernels
    (``ROW_KERNELS``) at batch 2..N (unset: each module's ``DEFAULT_ROWS``, what an H100 measured faster: INT8 64,
    W4A8 8, INT4 off), and ``$TRTLLM_PIPELINE_INT4_MMA_ROWS=N`` quant_mma_int4's INT8 tensor-core linear (not the GLU;
    off unless set)."""
    rows = ROW_KERNELS.get(q.fmt)
    if rows is not None and rows.enabled(m) and rows.supported(q, m):  # the wgmma row kernels, where switched on
        return rows.pick_config(q, m, sm_count, glu=glu)
    if quant_gemv_int8.supported(q, m) and quant_gemv_int8.enabled():  # INT8's dp4a GEMV at batch 1
        return quant_linear.pick_config(q, m, sm_count, glu=glu, gemv=True)
    if quant_gemv_w4a8.supported(q, m) and quant_gemv_w4a8.enabled():  # W4A8's table GEMV at batch 1 (default on)
        return quant_linear.pick_config(q, m, sm_count, glu=glu, gemv=True)
    if not glu and quant_mma_int4.supported(q, m) and quant_mma_int4.enabled(m):  # INT8 tensor cores: only when asked
        return quant_mma_int4.config(q, m, sm_count)
    choice = measured(q.fmt, m, q.n, q.k, glu, step=True)
    if quant_gemv.supported(q, m) and quant_gemv.forced(m):
        choice = ("gemv", None)
    kernel, cfg = choice if choice is not None else ("gemv" if m == 1 and quant_gemv.supported(q, m) else "gemm",
                                                     None)
    if kernel == "gemv" and quant_gemv.supported(q, m):
        if cfg is not None and cfg.block_m >= m:  # the several-row GEMV's measured tiles
            return cfg
        return quant_linear.pick_config(q, m, sm_count, glu=glu, gemv=True)
    if kernel == "dot":  # quant_linear's kernel loads the same tiles: the same bound holds (tests/test_fast_decode.py)
        return fit(q, quant_linear.pick_config(q, m, sm_count, glu=glu, gemv=False), smem_limit(q.weight.device),
                   glu=glu)
    return fit(q, cfg or default_config(q, m, sm_count, glu=glu), smem_limit(q.weight.device), glu=glu)
