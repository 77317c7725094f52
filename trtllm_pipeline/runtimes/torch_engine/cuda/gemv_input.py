"""The INT4 GEMV's input, prepared once by the kernel that produces it: int16 block floating point in byte planes.

quant_gemv multiplies INT4 weights with the integer dot-product instruction (``dp4a``: four 8-bit products
summed into an int32, one instruction for four weights), so its input has to be integers. Each block of
XB inputs (16, or the scale group when that is smaller) shares one power of two 2^E, chosen so the block's
largest magnitude lies in [2^14, 2^15); every input becomes the integer ``x_int = x / 2^E``. A bfloat16 or
float16 input has at most 11 significant bits, so ``x_int`` is exact for every input within 2^4 (float16)
or 2^7 (bfloat16) of its block's largest, and otherwise rounded (half to even) to 2^-15 of the block's
largest magnitude: a smaller error than the compute dtype's own rounding of that largest input (2^-9).
``x_int = 256 hi + lo`` is split into a signed high byte and an unsigned low byte, four inputs to a word,
so one dp4a per plane covers a word of INT4 weights.

The values prepared are the consumer's input as the eager model computes it: ``x * pre_quant_scale``
rounded to the compute dtype. One row, int32 [``width(K, XB)``], four sections:

    XH [K/4]: high bytes of inputs 4w .. 4w+3 (byte b of word w: input 4w + b)
    XL [K/4]: low bytes, likewise
    C  [K/XB]: -8 x the block's sum of x_int (the weights' nibbles are read as q + 8: this takes the 8 off)
    E  [K/XB]: 2^E as float32 bits

The producers (``norm``, ``attention``'s combine, the GLU GEMV for mlp.proj) call ``store_planes`` on the
values they hold; ``prepare`` is the standalone kernel for an input that no fused producer wrote.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from trtllm_pipeline.runtimes.torch_engine.cuda.linear import tl_dtype

# 1.5 * 2^23: adding and subtracting it rounds a float32 below 2^22 to an integer, ties to even
ROUND = tl.constexpr(12582912.0)


@dataclasses.dataclass
class Prepared:
    """Where a producer writes one GEMV input: ``planes`` int32 [B, width(K, block)], for the consumer whose
    pre-quant scale is ``pqs`` ([K] compute dtype, or None)."""

    planes: torch.Tensor
    pqs: torch.Tensor | None
    block: int

    @property
    def k(self) -> int:
        return self.planes.shape[1] * 2 * self.block // (self.block + 4)


@dataclasses.dataclass
class NormFold:
    """The residual add and RMSNorm before a warp-specialized INT4 GEMV, done by that GEMV's own programs
    instead of a norm launch between it and the linear before (``quant_gemv_ws``, ``FOLD``).

    Each program needs only its K slice: it reads the previous linear's int64 accumulators (``fixed_sum``) and
    the residual there, adds them as the norm kernel does (each rounded to the compute dtype), and prepares
    ``x * scale`` (``scale``: the norm's weight times the GEMV's pre-quant scale, float32) as its input tile.
    The norm's ``1 / rms(x)`` multiplies the GEMV's output instead, in its reader (attention), which sums the
    K splits' ``sumsq`` first: ``(x * w) W^T / rms(x) = (x / rms(x) * w) W^T``. Exact as math, not as the
    eager model rounds it (eager rounds ``x / rms``, then ``* w``, then ``* pre_quant_scale`` to the compute
    dtype before the product: here the product takes ``x * scale`` unrounded, in the planes' 15 bits). The
    programs of the first row tile write the residual after the add to ``residual_out`` (another buffer than
    ``residual``, which every other program still reads) and their split's sum of squares to ``sumsq``."""

    sums: torch.Tensor  # int64 [1, >= K]: the previous linear's accumulators
    residual: torch.Tensor  # [1, K] compute dtype: the residual stream before the add
    residual_out: torch.Tensor  # [1, K] compute dtype: after it
    scale: torch.Tensor  # float32 [K]
    sumsq: torch.Tensor  # float32 [>= the GEMV's K splits]


def block_inputs(group: int) -> int | None:
    """Inputs per shared exponent for a scale group: 16, or the whole group when it is 4 or 8 (a block must
    lie in one group, and the GEMV chains 1, 2 or 4 words per block); None: no block fits."""
    if group % 16 == 0:
        return 16
    return group if group in (4, 8) else None


def width(k: int, block: int) -> int:
    """int32 words of one prepared row: two byte planes of K/4 words, then C and E per block."""
    return k // 2 + 2 * (k // block)


def empty(batch: int, k: int, block: int, pqs: torch.Tensor | None, device) -> Prepared:
    return Prepared(torch.empty(batch, width(k, block), dtype=torch.int32, device=device), pqs, block)


@triton.jit
def planes(v, BLOCK: tl.constexpr, XB: tl.constexpr):
    """``v`` [BLOCK] float32 as int16 block floating point: the high-byte and low-byte planes [BLOCK / 4] (four
    inputs a word), each block's sum of x_int and its 2^E [BLOCK / XB] (float32)."""
    NB: tl.constexpr = BLOCK // XB
    WB: tl.constexpr = BLOCK // 4
    vb = tl.reshape(v, (NB, XB))
    amax = tl.max(tl.abs(vb), axis=1)
    # the biased exponent of the largest magnitude; floored so that 2^E stays a normal float
    e = tl.maximum((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF, 15)
    inv = ((268 - e) << 23).to(tl.float32, bitcast=True)  # 2^(14 - (e - 127)): the largest lands in [2^14, 2^15)
    step = ((e - 14) << 23).to(tl.float32, bitcast=True)  # 2^E = 1 / inv
    xi = (((vb * inv[:, None]) + ROUND) - ROUND).to(tl.int32)  # exact power-of-two scaling, then ties to even
    sh = (tl.arange(0, 4) * 8)[None, :]
    # bytes into words: the shifted bytes do not overlap, so their sum is their OR (int32 sums wrap)
    xh = tl.sum((tl.reshape(xi >> 8, (WB, 4)) & 0xFF) << sh, axis=1)
    xl = tl.sum((tl.reshape(xi, (WB, 4)) & 0xFF) << sh, axis=1)
    return xh, xl, tl.sum(xi, axis=1), step


@triton.jit
def store_planes(v, k0, K, dst, BLOCK: tl.constexpr, XB: tl.constexpr):
    """Write inputs ``k0 .. k0 + BLOCK - 1`` of one row: ``v`` [BLOCK] float32 (zero past K), ``dst`` the row's
    first word; ``k0`` and BLOCK are multiples of XB."""
    NB: tl.constexpr = BLOCK // XB
    WB: tl.constexpr = BLOCK // 4
    xh, xl, total, step = planes(v, BLOCK, XB)
    c = -8 * total
    rw = k0 // 4 + tl.arange(0, WB)
    rb = k0 // XB + tl.arange(0, NB)
    w_ok = rw < K // 4
    b_ok = rb < K // XB
    tl.store(dst + rw, xh, mask=w_ok)
    tl.store(dst + K // 4 + rw, xl, mask=w_ok)
    tl.store(dst + K // 2 + rb, c, mask=b_ok)
    tl.store(dst + K // 2 + K // XB + rb, step.to(tl.int32, bitcast=True), mask=b_ok)


@triton.jit
def consumer_input(h, pqs_ptr, cols, ok, HAS_PQS: tl.constexpr, COMPUTE: tl.constexpr):
    """The consumer's input from a producer's compute-dtype values ``h`` at inputs ``cols``: ``h *
    pre_quant_scale`` rounded as the eager product is, in float32 (zero where not ``ok``)."""
    pqs = 1.0
    if HAS_PQS:
        pqs = tl.load(pqs_ptr + cols, mask=ok, other=0.0)
    return scaled_input(h, pqs, ok, HAS_PQS, COMPUTE)


@triton.jit
def scaled_input(h, pqs, ok, HAS_PQS: tl.constexpr, COMPUTE: tl.constexpr):
    """``consumer_input`` with the pre-quant scale's values ``pqs`` already loaded."""
    v = h.to(tl.float32)
    if HAS_PQS:
        v = (v * pqs.to(tl.float32)).to(COMPUTE).to(tl.float32)
    return tl.where(ok, v, 0.0)


@triton.jit
def _prepare_kernel(x_ptr, pqs_ptr, dst_ptr, K, stride_x, stride_d, HAS_PQS: tl.constexpr, COMPUTE: tl.constexpr,
                    BLOCK: tl.constexpr, XB: tl.constexpr):
    b = tl.program_id(0)
    k0 = tl.program_id(1) * BLOCK
    cols = k0 + tl.arange(0, BLOCK)
    ok = cols < K
    h = tl.load(x_ptr + b * stride_x + cols, mask=ok, other=0.0)
    store_planes(consumer_input(h, pqs_ptr, cols, ok, HAS_PQS, COMPUTE), k0, K, dst_ptr + b * stride_d, BLOCK, XB)


def prepare(x: torch.Tensor, dst: Prepared, compute: torch.dtype) -> Prepared:
    """Write ``x`` ([B, K] compute dtype, before the pre-quant scale) into ``dst`` (one launch)."""
    batch, k = x.shape
    assert x.stride(1) == 1 and k % dst.block == 0 and dst.planes.shape == (batch, width(k, dst.block))
    block = 256
    _prepare_kernel[(batch, triton.cdiv(k, block))](
        x, dst.pqs if dst.pqs is not None else x, dst.planes, k, x.stride(0), dst.planes.stride(0),
        HAS_PQS=dst.pqs is not None, COMPUTE=tl_dtype(compute), BLOCK=block, XB=dst.block, num_warps=4)
    return dst


def reference(x: torch.Tensor, block: int) -> torch.Tensor:
    """The values the planes stand for (``x_int * 2^E``), in float32: the tests' check of ``store_planes``."""
    xb = x.float().reshape(*x.shape[:-1], -1, block)
    amax = xb.abs().amax(-1, keepdim=True)
    e = torch.clamp(torch.frexp(amax)[1] - 1, min=15 - 127)  # floor(log2 amax), as the kernel floors it
    step = torch.pow(2.0, (e - 14).float())
    return (torch.round(xb / step) * step).reshape(x.shape)
