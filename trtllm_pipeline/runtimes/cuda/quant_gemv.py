"""INT4-AWQ at batch 1: a matrix-vector product on the CUDA cores instead of a padded tensor-core dot.

At M = 1 quant_linear's swapped dot pads the activation to 16 columns and sends each unpacked weight tile
through shared memory to the dot-operand layout; the H200 showed those kernels compute-bound at 0.65-0.9
TB/s (docs/perf-notes.md). Here a weight costs three instructions and stays in its thread's registers:

* The packed weight is read as int32 words: 4 bytes of K of one packed row, 8 nibbles (rows 2j and 2j+1 at
  4 consecutive inputs). A nibble at bits SH..SH+3 (SH <= 16) becomes float32 without a conversion:
  ``(word & 0xF << SH) ^ magic`` sets the exponent to 2^(23 - SH), whose last-place unit is 2^-SH, so the
  nibble's bits read as the integer q + 8 on top of 2^(23 - SH) (one LOP3); minus 2^(23 - SH) + 8 it is q
  exactly (one FADD); one FFMA with the input. The three top nibbles (bits 20-31) overlap the exponent,
  so they are taken from ``word >> 12`` (one shift per 8 weights).
* A word's 4 inputs lie in one scale group (groups are multiples of 4), so the group scale multiplies the
  per-word sum (one FFMA per 4 weights); the float32 accumulators are summed over K at the end.
* The K loop asks for software pipelining (``tl.range(num_stages=...)``): Triton stages the weight tiles
  through shared memory with cp.async, which it does unasked only for loads that feed a dot.

No rounding the dot kernel does not do: ``q * x`` products and float32 sums, the group scale on a partial
sum. Output: the same float32 split-K partials (or, for mlp.fc + mlp.gate, ``silu(fc) * gate``) as
quant_linear's kernels, so the fused kernels that reduce them do not change. Only INT4-AWQ (W4A16) at
M = 1 takes it: W4A8 rounds every scaled weight to E4M3 (the tensor cores' operand), and batches above 1
multiply each weight by several rows, which the tensor cores do for free.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.cuda.linear import LinearConfig, silu_mul, tl_dtype


@triton.jit
def _nibble(src, magic, SH: tl.constexpr):
    """q in float32 for the two's-complement nibble q at bits SH..SH+3 of each int32 of ``src``.

    ``magic`` (MAGICS) sets the float's exponent to 2^(23 - SH), whose unit in the last place is 2^-SH, so
    the nibble's bits read as the integer q + 8 on top of 2^(23 - SH). It comes in at run time: as an opaque
    register the mask and the XOR are one LOP3 (a LOP3 takes one immediate; with both constants known the
    compilers emit two)."""
    bits = (src & (0xF << SH)) ^ magic
    return bits.to(tl.float32, bitcast=True) - ((1 << (23 - SH)) + 8.0)


@triton.jit
def _x_slice(x_ptr, pqs_ptr, kw, ok, B: tl.constexpr, HAS_PQS: tl.constexpr, COMPUTE: tl.constexpr):
    """Input ``4 w + B`` of each word w of the tile, as the eager model sees it: ``x * pre_quant_scale``
    rounded to the compute dtype, in float32."""
    x = tl.load(x_ptr + kw + B, mask=ok, other=0.0)
    if HAS_PQS:
        x = (x.to(tl.float32) * tl.load(pqs_ptr + kw + B, mask=ok, other=0.0).to(tl.float32)).to(COMPUTE)
    return x.to(tl.float32)


@triton.jit
def _tile(p, x0, x1, x2, x3, m0, m4, m8, m12, m16):
    """(even rows, odd rows) of one packed tile against the tile's inputs: ``sum_b q[., 4w + b] x[4w + b]``
    per word w, [HALF, WORDS] each; ``m<SH>``: the XOR constant of the nibble at bit SH."""
    ph = p >> 12  # bits 20-31 down to 8-19 (the sign bits it shifts in are masked off)
    lo = (_nibble(p, m0, 0) * x0[None, :] + _nibble(p, m8, 8) * x1[None, :] + _nibble(p, m16, 16) * x2[None, :]
          + _nibble(ph, m12, 12) * x3[None, :])
    hi = (_nibble(p, m4, 4) * x0[None, :] + _nibble(p, m12, 12) * x1[None, :] + _nibble(ph, m8, 8) * x2[None, :]
          + _nibble(ph, m16, 16) * x3[None, :])
    return lo, hi


@triton.jit
def int4_scales(s_ptr, stride_sg, stride_s2, rj, kk, k_tile, j_ok, G, GROUP: tl.constexpr, TILE_SCALE: tl.constexpr):
    """The scales of packed rows ``rj`` (even rows, odd rows) for a K tile: [HALF, 1] when the tile lies in one
    group, else one per input ``kk`` (quant_linear: every input of the tile; here: each word's first input).
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
def _load(w_ptrs, s_ptr, stride_sg, stride_s2, rj, kw, k_tile, j_ok, ok, G, GROUP: tl.constexpr,
          EVEN: tl.constexpr, TILE_SCALE: tl.constexpr):
    """One tile's packed words and the rows' scales (``ok``: the tile's words that exist)."""
    if EVEN:
        p = tl.load(w_ptrs)
    else:
        p = tl.load(w_ptrs, mask=j_ok[:, None] & ok[None, :], other=0)
    s_lo, s_hi = int4_scales(s_ptr, stride_sg, stride_s2, rj, kw, k_tile, j_ok, G, GROUP, TILE_SCALE)
    return p, s_lo, s_hi


@triton.jit
def _accumulate(p, s_lo, s_hi, x_ptr, pqs_ptr, kw, ok, acc_lo, acc_hi, m0, m4, m8, m12, m16, HAS_PQS: tl.constexpr,
                COMPUTE: tl.constexpr):
    x0 = _x_slice(x_ptr, pqs_ptr, kw, ok, 0, HAS_PQS, COMPUTE)
    x1 = _x_slice(x_ptr, pqs_ptr, kw, ok, 1, HAS_PQS, COMPUTE)
    x2 = _x_slice(x_ptr, pqs_ptr, kw, ok, 2, HAS_PQS, COMPUTE)
    x3 = _x_slice(x_ptr, pqs_ptr, kw, ok, 3, HAS_PQS, COMPUTE)
    lo, hi = _tile(p, x0, x1, x2, x3, m0, m4, m8, m12, m16)
    return acc_lo + lo * s_lo, acc_hi + hi * s_hi


@triton.jit
def _int4_gemv_kernel(
    x_ptr, w_ptr, s_ptr, pqs_ptr, w2_ptr, s2_ptr, pqs2_ptr, out_ptr,
    N, K, G, k_iters_per_split, stride_wn, stride_sg, stride_s2, stride_os,
    m0, m4, m8, m12, m16,
    GROUP: tl.constexpr, HAS_PQS: tl.constexpr, GLU: tl.constexpr, EVEN: tl.constexpr, TILE_SCALE: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
):
    """Split-K partials of ``x W^T`` for one input row (or, with GLU, silu(fc) * gate of two matrices)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    HALF: tl.constexpr = BLOCK_N // 2
    WORDS: tl.constexpr = BLOCK_K // 4
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rj = pid_n * HALF + tl.arange(0, HALF)  # packed rows: output rows 2 rj and 2 rj + 1
    rw = tl.arange(0, WORDS)
    k0 = pid_s * k_iters_per_split * BLOCK_K
    j_ok = rj < N // 2
    w_ptrs = w_ptr + rj[:, None] * stride_wn + (k0 // 4 + rw)[None, :]
    w2_ptrs = w2_ptr + rj[:, None] * stride_wn + (k0 // 4 + rw)[None, :]
    acc_lo = tl.zeros((HALF, WORDS), dtype=tl.float32)
    acc_hi = tl.zeros((HALF, WORDS), dtype=tl.float32)
    acc2_lo = tl.zeros((HALF, WORDS), dtype=tl.float32)
    acc2_hi = tl.zeros((HALF, WORDS), dtype=tl.float32)
    # num_stages on the loop: Triton's pipeliner then stages these loads through shared memory with cp.async
    # (it does so unasked only for loads that feed a dot), so tiles stay in flight while one is computed.
    for i in tl.range(k_iters_per_split, num_stages=STAGES):
        k_tile = k0 + i * BLOCK_K
        kw = k_tile + 4 * rw  # the first input of each word of the tile
        ok = kw < K
        p, s_lo, s_hi = _load(w_ptrs, s_ptr, stride_sg, stride_s2, rj, kw, k_tile, j_ok, ok, G, GROUP, EVEN, TILE_SCALE)
        acc_lo, acc_hi = _accumulate(p, s_lo, s_hi, x_ptr, pqs_ptr, kw, ok, acc_lo, acc_hi, m0, m4, m8, m12, m16,
                                     HAS_PQS, COMPUTE)
        if GLU:
            p2, s2_lo, s2_hi = _load(w2_ptrs, s2_ptr, stride_sg, stride_s2, rj, kw, k_tile, j_ok, ok, G, GROUP, EVEN,
                                     TILE_SCALE)
            acc2_lo, acc2_hi = _accumulate(p2, s2_lo, s2_hi, x_ptr, pqs2_ptr, kw, ok, acc2_lo, acc2_hi, m0, m4, m8,
                                           m12, m16, HAS_PQS, COMPUTE)
            w2_ptrs += WORDS
        w_ptrs += WORDS
    lo = tl.sum(acc_lo, axis=1)
    hi = tl.sum(acc_hi, axis=1)
    even = out_ptr + pid_s * stride_os + 2 * rj
    if GLU:
        tl.store(even, silu_mul(lo, tl.sum(acc2_lo, axis=1), COMPUTE), mask=j_ok)
        tl.store(even + 1, silu_mul(hi, tl.sum(acc2_hi, axis=1), COMPUTE), mask=j_ok)
    else:
        tl.store(even, lo, mask=j_ok)
        tl.store(even + 1, hi, mask=j_ok)


# _nibble's XOR constants by bit position SH: exponent 150 - SH (the float 2^(23 - SH)), and the nibble's sign
# bit flipped (q + 8 in [0, 15])
MAGICS = tuple((150 - sh) << 23 | 8 << sh for sh in (0, 4, 8, 12, 16))


def supported(q, m: int) -> bool:
    """Whether ``q`` at batch ``m`` can take the GEMV: INT4-AWQ, one row, whole words and groups of words."""
    return q.fmt == "int4_awq" and m == 1 and q.k % 4 == 0 and q.group % 4 == 0


def pick_config(q, sm_count: int, *, glu: bool = False, splits: int | None = None, block_n: int | None = None,
                block_k: int | None = None) -> LinearConfig:
    """The best of an H200 sweep (run 6 of docs/perf-notes.md, ~25 tiles, warps and stages per 7B shape; these
    kernels run at a few warps per scheduler, so fewer registers per thread often win):

    * K short (qkv, dense: the 7B's 3584 is 28 tiles of 128): 256 output rows x 128 inputs (one scale
      group of 128, so the scale goes on the per-word sums) with 8 warps, one K tile per program, up to ~8
      programs per SM;
    * K long (proj: 148 tiles): 128 rows x 128 inputs, 4 warps, about 3 programs per SM (one wave at ~146
      registers), so each reduces 10 or more tiles before its partial goes to the workspace;
    * the GLU cannot split K (SiLU in its epilogue): 16 rows x 256 inputs, 1184 programs for the 7B's 18944
      rows (71 registers: seven programs per SM; 64-row tiles left SMs idle)."""
    short = triton.cdiv(q.k, 128) <= 32  # in 128-input tiles
    warps = 8 if short and not glu else 4
    block_n = block_n or (16 if glu else 256 if short else 128)
    block_k = block_k or (256 if glu else 128)
    tiles = triton.cdiv(q.n, block_n)
    k_tiles = triton.cdiv(q.k, block_k)
    if splits is None:
        splits = 1 if glu else max(1, min(k_tiles, round((8 if short else 3) * sm_count / tiles)))
    return LinearConfig(1, block_n, block_k, splits, warps, 3, gemv=True)


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool):
    """``out[s] = x W[:, K_s]^T`` per split (float32 [splits, 1, N]), or with ``q2`` ``out = silu(x W^T) *
    (x W2^T)`` (compute dtype [1, N]). ``x``: [1, K] in the compute dtype, before the pre-quant scale."""
    m, k = x.shape
    assert m == 1 and supported(q, m) and x.stride(1) == 1 and cfg.block_k % 4 == 0 and cfg.block_n % 2 == 0
    glu = q2 is not None
    q2 = q2 or q
    k_iters = triton.cdiv(k, cfg.block_k)
    splits = 1 if glu else cfg.splits
    per_split = triton.cdiv(k_iters, splits)
    half = cfg.block_n // 2
    even = k % cfg.block_k == 0 and k_iters % splits == 0 and (q.n // 2) % half == 0
    words, words2 = q.weight.view(torch.int32), q2.weight.view(torch.int32)
    assert words.stride() == words2.stride() and words.stride(1) == 1
    stride_os = 0 if glu or out.dim() == 2 else out.stride(0)
    pqs = q.pqs if q.pqs is not None else out
    pqs2 = q2.pqs if q2.pqs is not None else out
    grid = (triton.cdiv(q.n // 2, half), splits)
    return _int4_gemv_kernel[grid](
        x, words, q.scales, pqs, words2, q2.scales, pqs2, out,
        q.n, k, q.scales.shape[0], per_split, words.stride(0), q.scales.stride(0), q.scales.stride(1), stride_os,
        *MAGICS,
        GROUP=q.group, HAS_PQS=q.pqs is not None, GLU=glu, EVEN=even, TILE_SCALE=q.group % cfg.block_k == 0,
        COMPUTE=tl_dtype(compute), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, STAGES=cfg.num_stages, PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )
