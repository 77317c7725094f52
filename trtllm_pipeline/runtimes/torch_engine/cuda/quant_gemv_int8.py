"""INT8 weights at batch 1 (SmoothQuant, weight-only): a matrix-vector product with the integer dot-product instruction.

quant_linear's kernel multiplies int8 x int8 on the tensor cores, the one input row padded to 16 and every padding
row quantized with it; on the H200 its SmoothQuant linears streamed at 1.7-2.5 TB/s where FP8's streamed the same
bytes at 2.1-3.4 (docs/perf-notes.md: the 7B step's graph replay 3.40 ms against FP8's 2.42). Here, per program
and K tile:

* The input row's tile is quantized once: ``x * pre_quant_scale`` rounded to the compute dtype, then ``round(x *
  (127 / amax))`` half to even in [-128, 127], exactly as quant_linear's ``_act_tile`` (so the int32 sums are the
  same), and packed four to an int32 word.
* The weight's int8 [N, K] is read as int32 words [N, K/4]: one ``dp4a.s32.s32`` multiplies a word's four weights with
  four inputs and adds them, so four weights cost one instruction, with nothing to unpack (INT4's GEMV spends about
  one LOP3 and one dp4a per two weights: ``quant_gemv``).
* Each program's int32 sum over its K range is exact (|w x| <= 2^14, K < 2^17); its row's ``activation step x weight
  scale[n]`` multiplies it once, into the same float32 split-K partials as quant_linear's (or, for mlp.fc + mlp.gate,
  ``silu(fc) * gate`` in the compute dtype, K not split).

Weight-only (W8A16) takes the INT4 GEMV's input form instead, made in the program from its tile: int16 block floating
point, one power of two per 16 inputs, as a signed high-byte and an unsigned low-byte plane (``gemv_input.planes``):
per block and row, 4 dp4a over the high plane, shifted by 8 bits, carry into 4 over the low plane (``sum w x_int``
exactly, < 2^26), then one conversion and one multiply-add by ``2^E x scale[n]``; half a dp4a per weight. The input's
int16 rounding (at 2^-15 of each block's largest) is the only difference from float32 ``x @ W^T``, as for INT4.

The decode step takes it at batch 1 unless ``ENV`` is 0 (``TRTLLM_PIPELINE_INT8_GEMV=0``: quant_gemm's choice). Random
7B, ``bench --in-process`` batch 1, context 128, H100 2026-12-05, the switch off -> on in one call: weight-only 4.240
-> 3.206 ms/step (80% of the floor), SmoothQuant 3.750 -> 3.568; batch 8 unchanged (4.37 / 4.14; the GEMV is batch
1's). Triton's interpreter cannot run PTX: there ``dp4a`` is the same sum from shifts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import support
from trtllm_pipeline.runtimes.torch_engine.cuda.dp4a import dp4a
from trtllm_pipeline.runtimes.torch_engine.cuda.gemv_input import planes
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv import _quarters
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.support import interpreting

ENV = "TRTLLM_PIPELINE_INT8_GEMV"
BLOCK_N, BLOCK_K = 64, 256  # 256 bytes of K per weight row and tile: 16 KB a tile, 32 registers of words a thread


def enabled() -> bool:
    """Whether the decode step takes this kernel at batch 1: unless ``$TRTLLM_PIPELINE_INT8_GEMV`` is 0 (then
    quant_gemm's choice)."""
    return support.switch(ENV, True, "takes the INT8 GEMV at batch 1")


def supported(q, m: int) -> bool:
    """INT8 weights at one input row, whose rows are whole int32 words; weight-only: whole 16-input blocks, each K
    tile inside one scale group (per channel: the group is K), and no pre-quant scale (ModelOpt's export has none)."""
    if m != 1 or q.k % 4:
        return False
    one_group = q.group == q.k or q.group % BLOCK_K == 0
    return q.fmt == "int8_sq" or q.fmt == "int8_wo" and q.k % 16 == 0 and one_group and q.pqs is None


def pick_config(q, sm_count: int, *, glu: bool = False, splits: int | None = None) -> LinearConfig:
    """64 rows x 256 inputs a tile; K split for about four programs per SM, at least two tiles each, a split count
    that divides the K tiles where one is within 2x of that (no masks: the 7B's qkv and dense take 7); the GLU is
    not split (its SiLU in the epilogue; 2 x 296 tiles of the 7B's fc and gate fill the SMs as they are)."""
    if splits is None and not glu:
        splits = pick_splits(triton.cdiv(q.n, BLOCK_N), triton.cdiv(q.k, BLOCK_K), sm_count)
    return LinearConfig(1, BLOCK_N, BLOCK_K, 1 if glu else splits, 4, 3, dp4a8=True)


def pick_splits(tiles: int, k_tiles: int, sm_count: int) -> int:
    """K splits for about four programs per SM, at least two K tiles each, a count that divides the K tiles where one
    is within 2x of that (no masked last split)."""
    want = max(1, min(k_tiles // 2, round(4 * sm_count / tiles)))
    even = [d for d in range(1, k_tiles // 2 + 1) if k_tiles % d == 0 and want / 2 <= d <= 2 * want]
    return min(even, key=lambda d: abs(d - want)) if even else want


@triton.jit
def _input_words(x_ptr, pqs_ptr, aq_ptr, kk, k_ok, HAS_PQS: tl.constexpr, COMPUTE: tl.constexpr,
                 KW: tl.constexpr):
    """One K tile of the input row quantized as quant_linear's ``_act_tile`` does, four int8 to an int32 word [KW]."""
    x = tl.load(x_ptr + kk, mask=k_ok, other=0.0)
    if HAS_PQS:
        x = (x.to(tl.float32) * tl.load(pqs_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)).to(COMPUTE)
    r = tl.clamp(x.to(tl.float32) * tl.load(aq_ptr), -128.0, 127.0)
    q = ((r + 12582912.0) - 12582912.0).to(tl.int32)  # to nearest, half to even (the 1.5 x 2^23 trick)
    b = tl.reshape(q & 0xFF, (KW, 4))
    return tl.sum(b << (tl.arange(0, 4) * 8)[None, :], axis=1)  # disjoint bytes: the sum is their OR


@triton.jit
def _weight_words(w_ptr, words, rn, n_ok, w0, KW_ALL, stride_wn, EVEN: tl.constexpr):
    """One tile of the weight as int32 words [BLOCK_N, KW]; EVEN: the tile lies inside the matrix, no masks.
    (Clamped addresses instead of masks measured worse here: the compiler then loads word by word, 34 loads a thread
    and tile instead of 10; tools/gemv_sass.py --int8.)"""
    wb = w0 + words
    w_ptrs = w_ptr + rn[:, None] * stride_wn + wb[None, :]
    if EVEN:
        w = tl.load(w_ptrs)
    else:
        w = tl.load(w_ptrs, mask=n_ok[:, None] & (wb < KW_ALL)[None, :], other=0)
    return w


@triton.jit
def _word_sums(w_ptr, words, rn, n_ok, w0, KW_ALL, stride_wn, xw, acc, EVEN: tl.constexpr, ASM: tl.constexpr):
    """``acc`` [BLOCK_N, KW] plus each weight word's dot with its input word over one tile: one dp4a per word into
    its own running sum (the sums across words are taken once, after the K loop: no shuffles inside it)."""
    w = _weight_words(w_ptr, words, rn, n_ok, w0, KW_ALL, stride_wn, EVEN)
    return dp4a(w, xw[None, :], acc, True, ASM, A_SIGNED=True)


@triton.jit
def _block_sums(w_ptr, words, rn, n_ok, w0, KW_ALL, stride_wn, xh, xl, EVEN: tl.constexpr, ASM: tl.constexpr,
                BLOCK_N: tl.constexpr, NB: tl.constexpr):
    """Weight-only: per row and 16-input block, ``sum w x_int`` in int32 [BLOCK_N, NB] over one tile (the high
    plane's chain shifted by 8 bits carries the low plane's)."""
    w = _weight_words(w_ptr, words, rn, n_ok, w0, KW_ALL, stride_wn, EVEN)
    w0_, w1_, w2_, w3_ = _quarters(tl.reshape(w, (BLOCK_N, NB, 4)))
    h0, h1, h2, h3 = _quarters(tl.reshape(xh, (1, NB, 4)))
    l0, l1, l2, l3 = _quarters(tl.reshape(xl, (1, NB, 4)))
    a = dp4a(w3_, h3, dp4a(w2_, h2, dp4a(w1_, h1, dp4a(w0_, h0, tl.zeros((BLOCK_N, NB), dtype=tl.int32), True, ASM,
                                                     A_SIGNED=True), True, ASM, A_SIGNED=True), True, ASM,
                                   A_SIGNED=True), True, ASM, A_SIGNED=True)
    a = a << 8
    return dp4a(w3_, l3, dp4a(w2_, l2, dp4a(w1_, l1, dp4a(w0_, l0, a, False, ASM, A_SIGNED=True), False, ASM,
                                            A_SIGNED=True), False, ASM, A_SIGNED=True), False, ASM, A_SIGNED=True)


@triton.jit
def _int8_gemv_kernel(
    x_ptr, w_ptr, s_ptr, pqs_ptr, aq_ptr, w2_ptr, s2_ptr, pqs2_ptr, aq2_ptr, out_ptr,
    N, K, k_iters_per_split, stride_wn, stride_os, stride_sg, GROUP,
    A8: tl.constexpr, HAS_PQS: tl.constexpr, GLU: tl.constexpr, EVEN: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr,
):
    """Split-K partials of ``x W^T`` for one input row (or, GLU, ``silu(x W^T) * (x W2^T)`` unsplit): SmoothQuant
    (A8) or weight-only."""
    KW: tl.constexpr = BLOCK_K // 4
    NB: tl.constexpr = BLOCK_K // 16
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    rk = tl.arange(0, BLOCK_K)
    words = tl.arange(0, KW)
    k0 = pid_s * k_iters_per_split * BLOCK_K
    if A8:  # each word's running int32 sum
        acc = tl.zeros((BLOCK_N, KW), dtype=tl.int32)
        acc2 = tl.zeros((BLOCK_N, KW), dtype=tl.int32)
    else:  # each 16-input block's float32 sum, its power of two and the tile's scale applied
        acc = tl.zeros((BLOCK_N, NB), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_N, NB), dtype=tl.float32)
    for i in range(k_iters_per_split):
        k_tile = k0 + i * BLOCK_K
        kk = k_tile + rk
        k_ok = kk < K
        if A8:
            xw = _input_words(x_ptr, pqs_ptr, aq_ptr, kk, k_ok, HAS_PQS, COMPUTE, KW)
            acc = _word_sums(w_ptr, words, rn, n_ok, k_tile // 4, K // 4, stride_wn, xw, acc, EVEN, ASM)
            if GLU:
                xw2 = _input_words(x_ptr, pqs2_ptr, aq2_ptr, kk, k_ok, HAS_PQS, COMPUTE, KW)
                acc2 = _word_sums(w2_ptr, words, rn, n_ok, k_tile // 4, K // 4, stride_wn, xw2, acc2, EVEN, ASM)
        else:
            x = tl.load(x_ptr + kk, mask=k_ok, other=0.0)  # (weight-only: no pre-quant scale, ``supported``)
            g = k_tile // GROUP  # the tile's scale group (supported: a tile lies in one)
            xh, xl, _, step = planes(tl.where(k_ok, x.to(tl.float32), 0.0), BLOCK_K, 16)
            s = tl.load(s_ptr + g * stride_sg + rn, mask=n_ok, other=0.0)
            v = _block_sums(w_ptr, words, rn, n_ok, k_tile // 4, K // 4, stride_wn, xh, xl, EVEN, ASM, BLOCK_N, NB)
            acc += v.to(tl.float32) * (s[:, None] * step[None, :])
            if GLU:
                s2 = tl.load(s2_ptr + g * stride_sg + rn, mask=n_ok, other=0.0)
                v2 = _block_sums(w2_ptr, words, rn, n_ok, k_tile // 4, K // 4, stride_wn, xh, xl, EVEN, ASM,
                                 BLOCK_N, NB)
                acc2 += v2.to(tl.float32) * (s2[:, None] * step[None, :])
    if A8:  # the activation step x weight scale[n], one multiplier per row (QuantWeight.of), as quant_linear's
        y = tl.sum(acc, axis=1).to(tl.float32) * tl.load(s_ptr + rn, mask=n_ok, other=0.0)
        y2 = tl.sum(acc2, axis=1).to(tl.float32) * tl.load(s2_ptr + rn, mask=n_ok, other=0.0)
    else:
        y = tl.sum(acc, axis=1)
        y2 = tl.sum(acc2, axis=1)
    if GLU:
        tl.store(out_ptr + rn, silu_mul(y, y2, COMPUTE), mask=n_ok)
    else:
        tl.store(out_ptr + pid_s * stride_os + rn, y, mask=n_ok)


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool):
    """``x`` [1, K] in the compute dtype (before the pre-quant scale); ``out`` [splits, 1, N] float32 partials, or
    (``q2``: the GLU's gate) [1, N] in the compute dtype."""
    assert supported(q, x.shape[0]) and x.stride(1) == 1 and q.weight.is_contiguous()
    glu = q2 is not None
    q2 = q2 or q
    k_iters = triton.cdiv(q.k, cfg.block_k)
    splits = 1 if glu else cfg.splits
    per_split = triton.cdiv(k_iters, splits)
    words, words2 = q.weight.view(torch.int32), q2.weight.view(torch.int32)
    dummy = out
    return _int8_gemv_kernel[(triton.cdiv(q.n, cfg.block_n), splits)](
        x, words, q.scales, q.pqs if q.pqs is not None else dummy, q.act_q if q.act_q is not None else dummy,
        words2, q2.scales, q2.pqs if q2.pqs is not None else dummy, q2.act_q if q2.act_q is not None else dummy, out,
        q.n, q.k, per_split, words.stride(0), 0 if glu or out.dim() == 2 else out.stride(0),
        q.scales.stride(0) if q.scales.dim() == 2 else 0, q.group,
        A8=q.fmt == "int8_sq", HAS_PQS=q.pqs is not None, GLU=glu, COMPUTE=tl_dtype(compute),
        EVEN=q.n % cfg.block_n == 0 and q.k % cfg.block_k == 0 and k_iters % splits == 0,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        ASM=not interpreting(), PDL=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )
