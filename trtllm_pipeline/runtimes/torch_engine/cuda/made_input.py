"""The input rows the wide wgmma kernels copy, made once a launch by one small kernel (Triton; runs in the interpreter).

From 17 rows quant_rows_w4a8_mma and quant_rows_int4_mma, and at every batch the INT8 row kernels, take their B operand
(the input rows, the MMA's N) from a tensor their producer warp copies beside the weights, instead of each program
quantizing the same rows again: N / 64 programs along the output would each repeat the work. Each function here makes
that tensor for one matrix or, with ``q2`` (the GLU's gate, its own pre-quant and activation scales), for two, at the
rounding points of eager's model (quant_linear's ``_act_tile``: the pre-quant scale's product rounded to the compute
dtype, then the activation quantizer), in the order the kernel's MMA reads:

* ``w4a8``: E4M3 bytes [matrices, 2, M, K], each word's inputs in the lookups' byte order (0, 2, 1, 3), the second
  copy with every sign bit flipped (the q < 0 lookups multiply it: quant_gemv_w4a8_mma).
* ``int8``: SmoothQuant's int8 [matrices, M, K] as stored (its weights are the MMA's A operand as they are).
* ``int4``: the input times its pre-quant scale [matrices, M, K] in the compute dtype, input 16 c + 4 t + 2 i + j at
  16 c + 8 j + 2 t + i (the order of quant_rows_int4_mma's register-made A pairs), and 136 x each row's sum per K tile
  [matrices, K / 128, NB] float32, zero past M (what its 136 + q weights add to a tile's products).
* ``w8a16``: INT8 weight-only's float16 [M, K], each row over a power of two r that keeps it below 2^15 (exact), input
  16 c + 4 t + 2 j + i at 16 c + 8 j + 2 t + i (quant_rows_int8wo_mma's float16 pairs), and r [M] (one input: no
  pre-quant scale).

Under PDL each waits for the kernel before it (its x) and lets the next launch at once: the wide kernels wait for this
one before they copy the input.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda.linear import tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_linear import ACT_FP8, ACT_INT8, _act_tile


@triton.jit
def _quantized_kernel(x_ptr, pqs_ptr, aq_ptr, pqs2_ptr, aq2_ptr, out_ptr, M, K, stride_xm, MATS: tl.constexpr,
                      ACT: tl.constexpr, LOOKUP_ORDER: tl.constexpr, SIGNS: tl.constexpr, HAS_PQS: tl.constexpr,
                      COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr, PDL: tl.constexpr):
    """One [BLOCK_M, 128] tile of the input rows as each matrix's activation quantizer leaves it (``_act_tile``:
    E4M3 for ACT 1, int8 for 2), its bytes into ``out`` [MATS, SIGNS, M, K]: at the lookup's byte order
    (``LOOKUP_ORDER``: bits 0 and 1 of the column swapped) or as they are, the second sign each sign bit flipped."""
    if PDL:  # x is the previous kernel's output; the next kernel waits for this one before it reads ``out``
        gdc_wait()
        gdc_launch_dependents()
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * 128 + tl.arange(0, 128)
    k_ok = rk < K
    mask = (rm[:, None] < M) & k_ok[None, :]
    if LOOKUP_ORDER:
        cols = (rk & ~3) | ((rk & 1) << 1) | ((rk >> 1) & 1)
    else:
        cols = rk
    ptrs = out_ptr + rm[:, None] * K + cols[None, :]
    x_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :]
    for j in tl.static_range(MATS):
        if j == 0:
            pqs, aq = pqs_ptr, aq_ptr
        else:  # the GLU's gate: its own pre-quant and activation scales
            pqs, aq = pqs2_ptr, aq2_ptr
        b = _act_tile(x_ptrs, pqs + rk, aq, mask, k_ok, HAS_PQS, ACT, True, COMPUTE).to(tl.int8, bitcast=True)
        tl.store(ptrs + (SIGNS * j) * M * K, b, mask=mask)
        if SIGNS == 2:
            tl.store(ptrs + (2 * j + 1) * M * K, b ^ -128, mask=mask)


def _quantized(x: torch.Tensor, q, q2, compute: torch.dtype, pdl: bool, act: int, lookup_order: bool,
               signs: int) -> torch.Tensor:
    m, k = x.shape
    mats = 1 if q2 is None else 2
    q2 = q2 or q
    out = torch.empty(mats, signs, m, k, dtype=torch.int8, device=x.device)
    block_m = min(64, triton.next_power_of_2(m))
    _quantized_kernel[(triton.cdiv(m, block_m), triton.cdiv(k, 128))](
        x, q.pqs if q.pqs is not None else x, q.act_q, q2.pqs if q2.pqs is not None else x, q2.act_q, out, m, k,
        x.stride(0), MATS=mats, ACT=act, LOOKUP_ORDER=lookup_order, SIGNS=signs, HAS_PQS=q.pqs is not None,
        COMPUTE=tl_dtype(compute), BLOCK_M=block_m, PDL=pdl, num_warps=4, launch_pdl=pdl)
    return out


def w4a8(x: torch.Tensor, q, q2, compute: torch.dtype, pdl: bool = False) -> torch.Tensor:
    """``x`` [M, K] as W4A8's E4M3 bytes: int8 [matrices, 2, M, K], the input and its negation, words in the
    lookup's byte order."""
    return _quantized(x, q, q2, compute, pdl, ACT_FP8, True, 2)


def int8(x: torch.Tensor, q, q2, compute: torch.dtype, pdl: bool = False) -> torch.Tensor:
    """``x`` [M, K] as SmoothQuant's int8: [matrices, M, K]."""
    return _quantized(x, q, q2, compute, pdl, ACT_INT8, False, 1)[:, 0]


@triton.jit
def _int4_kernel(x_ptr, pqs_ptr, pqs2_ptr, out_ptr, off_ptr, M, K, stride_xm, MATS: tl.constexpr,
                 HAS_PQS: tl.constexpr, COMPUTE: tl.constexpr, NB: tl.constexpr, SUMS: tl.constexpr,
                 PDL: tl.constexpr):
    """K tile ``program_id(0)`` of the input rows for each matrix: times its pre-quant scale rounded to the compute
    dtype, stored into ``out`` [MATS, M, K] in the MMA's input order (input 16 c + 4 t + 2 i + j at 16 c + 8 j + 2 t +
    i: quant_rows_int4_mma's ``_stage_input``'s), and (SUMS) 136 x each row's sum into ``off`` [MATS, K / 128, NB]
    (zeros past M)."""
    if PDL:  # x is the previous kernel's output; the next kernel waits for this one before it reads ``out``
        gdc_wait()
        gdc_launch_dependents()
    kt = tl.program_id(0)
    rm = tl.arange(0, NB)
    rk = kt * 128 + tl.arange(0, 128)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=mask, other=0.0)
    order = (rk & ~15) | ((rk & 1) << 3) | (((rk >> 2) & 3) << 1) | ((rk >> 1) & 1)
    for j in tl.static_range(MATS):
        v = x
        if HAS_PQS:
            if j == 0:
                pqs = tl.load(pqs_ptr + rk)
            else:  # the GLU's gate: its own pre-quant scale
                pqs = tl.load(pqs2_ptr + rk)
            v = (x.to(tl.float32) * pqs.to(tl.float32)[None, :]).to(COMPUTE)
        tl.store(out_ptr + j * M * K + rm[:, None] * K + order[None, :], v, mask=mask)
        if SUMS:
            tl.store(off_ptr + (j * tl.num_programs(0) + kt) * NB + rm, tl.sum(v.to(tl.float32), axis=1) * 136.0)


def int4(x: torch.Tensor, q, q2, compute: torch.dtype, nb: int, pdl: bool = False, sums: bool = True):
    """``x`` [M, K] as INT4-AWQ's B operands: ([matrices, M, K] in the compute dtype, in the MMA's input order;
    float32 [matrices, K / 128, ``nb``]: 136 x each row's sum per K tile, zero past M; not written without ``sums``,
    which the wide kernel's scaled form does not read)."""
    m, k = x.shape
    mats = 1 if q2 is None else 2
    q2 = q2 or q
    out = torch.empty(mats, m, k, dtype=compute, device=x.device)
    row_sums = torch.empty(mats, k // 128, nb, device=x.device)
    _int4_kernel[(k // 128,)](x, q.pqs if q.pqs is not None else x, q2.pqs if q2.pqs is not None else x, out, row_sums,
                              m, k, x.stride(0), MATS=mats, HAS_PQS=q.pqs is not None, COMPUTE=tl_dtype(compute),
                              NB=nb, SUMS=sums, PDL=pdl, num_warps=4, launch_pdl=pdl)
    return out, row_sums


@triton.jit
def _w8a16_kernel(x_ptr, out_ptr, r_ptr, K, stride_xm, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """Row ``program_id(0)`` of the input, all of it at once (BLOCK_K >= K: one load, no loop between the largest
    value and the stores): its largest magnitude's power of two r (2^(e - 14) for a largest value in [2^e, 2^(e+1));
    1 for rows whose values are all below 2^-112), and x / r in float16 (exact: a power of two, under 2^15) into
    ``out`` in the MMA's input order (input 16 c + 4 t + 2 j + i at 16 c + 8 j + 2 t + i: quant_rows_int8wo_mma's
    ``_operand``)."""
    if PDL:  # x is the previous kernel's output; the next kernel waits for this one before it reads ``out``
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0)
    rk = tl.arange(0, BLOCK_K)
    ok = rk < K
    x = tl.load(x_ptr + row * stride_xm + rk, mask=ok, other=0.0).to(tl.float32)
    exponent = (tl.max(tl.abs(x), axis=0).to(tl.int32, bitcast=True) >> 23) & 0xFF  # the float32 field: e + 127
    scaled = exponent >= 15  # r's field e + 113 at least 1 (a normal float32)
    r = tl.where(scaled, ((exponent - 14) << 23).to(tl.float32, bitcast=True), 1.0)
    inverse = tl.where(scaled, ((268 - exponent) << 23).to(tl.float32, bitcast=True), 1.0)  # 2^(14 - e)
    tl.store(r_ptr + row, r)
    order = (rk & ~15) | (((rk >> 1) & 1) << 3) | (((rk >> 2) & 3) << 1) | (rk & 1)
    tl.store(out_ptr + row * K + order, (x * inverse).to(tl.float16), mask=ok)


def w8a16(x: torch.Tensor, pdl: bool = False):
    """``x`` [M, K] as INT8 weight-only's B operand: (float16 [M, K], x / r in the MMA's input order; float32 [M], each
    row's power of two r). One program a row holding all of it (the 7B's K 18944: 16 warps, 64 values a thread)."""
    m, k = x.shape
    out = torch.empty(m, k, dtype=torch.float16, device=x.device)
    r = torch.empty(m, dtype=torch.float32, device=x.device)
    block_k = triton.next_power_of_2(k)
    _w8a16_kernel[(m,)](x, out, r, k, x.stride(0), BLOCK_K=block_k, PDL=pdl, num_warps=min(16, max(4, block_k // 2048)),
                        launch_pdl=pdl)
    return out, r
