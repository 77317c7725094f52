"""W4A8-AWQ at batch 1: a matrix-vector product by table lookup (PRMT) into the integer dot-product instruction.

quant_linear's W4A8 kernel rounds every scaled weight to E4M3 (``q x t``, t = group step / scale_2: a multiply, a
clamp and a conversion a weight) before FP8 tensor-core dots at 16 padded rows (5.27 ms a 7B step on the H200,
where INT4-AWQ's GEMV does 1.7 on the same bytes). Here (docs/perf-notes.md, "W4A8-AWQ at batch 1"):

* Per output row and scale group the weight takes at most 16 values, E4M3(q t) for q in -8..7, and all of them are
  ``c_q x u`` exactly, with c_q a signed integer of at most 120 in magnitude and u = 2^(e - 6), e the binade of the
  largest (E4M3(8t)): an E4M3 value in binade e' is a multiple of 2^(e' - 3), the smallest nonzero value lies at
  most 3 binades below the largest, and subnormals are multiples of 2^-9, which is then a multiple of u. Checked at
  load (``tables``: every group and row; a group rounded to all zeros takes u = 1) and in tests/w4a8_gemv_check.py.
* ``tables`` stores, per group and row, 8 bytes ``T = [c_8, c_1, ..., c_7]`` (c_8 = |c_-8|; c_0 is always 0) and u
  (float32). A program makes from them, once per row and tile, ``P = [0, c_1 .. c_7]`` (an AND) and ``N = [c_8, c_7
  .. c_1]`` = |c_-8| .. |c_-1| (two PRMT: E4M3 rounding is symmetric, so |c_-q| = c_q).
* A nibble becomes its integer by a byte permute: ``PRMT(P, s)`` with a word's 4 nibbles as the selectors gives
  c_q where q >= 0 and 0 where q < 0 (the selector's bit 3 replicates the picked byte's sign, and every table byte
  is below 128), ``PRMT(N, s ^ 0x8888)`` gives |c_q| where q < 0 and 0 elsewhere; ``P' - N' + 0x80808080`` (one
  IADD3) is ``c_q + 128`` in every byte, with no borrow or carry between bytes (8..248).
* The selectors come from the checkpoint's packing (byte k of packed row j: row 2j in the low nibble, 2j+1 in the
  high): ``(w & 0x0F0F) | (w >> 12 & 0xF0F0)`` (row 2j) and ``((w & 0xF0F0) | (w >> 12 & ~0xF0F0)) >> 4`` (row
  2j+1: the same shift, one LOP3 each) hold inputs 0, 2, 1, 3 of the word in selector order; the input words are
  packed in that order.
* The input: ``x x pre_quant_scale`` rounded to the compute dtype, then E4M3 of ``x x (448 / amax)`` as quant_linear's
  ``_act_tile`` rounds it, in the INT8 weight-only GEMV's in-program int16 block floating point (``gemv_input.planes``:
  a power of two per 16 inputs, a signed high-byte and an unsigned low-byte plane; E4M3's 4 significant bits are
  exact within 2^11 of a block's largest). Per block and row: 4 ``dp4a.u32.s32`` over the high plane, shifted by 8
  bits, plus the block's -128 x sum x_int, carry into 4 ``dp4a.u32.u32`` over the low plane: ``sum c x_int`` exactly
  (< 2^26), then one conversion and one multiply-add by ``2^E x u``; the output scale (activation scale x scale_2)
  once per row at the end.

The products are exact (the weights are quant_linear's E4M3 values, the inputs its FP8 input): against float32
``x @ W^T`` the only differences are float32 accumulation order and inputs below 2^-11 of their block's largest
(rounded at 2^-15 of it). Output: the float32 split-K partials of quant_linear's kernels, or for mlp.fc + mlp.gate
(K not split) ``silu(fc) * gate`` in the compute dtype, each matrix with its own input scales.

Loads go straight to registers (Triton's pipeliner stages no load that feeds no ``tl.dot``); with ``num_stages`` > 1
in the config the next K tile's are issued before a tile is computed (``pick_config``: proj and the GLU; qkv and
dense take one tile a program instead).

The decode step takes it at batch 1 by default (``TRTLLM_PIPELINE_W4A8_GEMV=0`` turns it off; on Hopper in its
warp-specialized form, quant_gemv_w4a8_ws, the same arithmetic from copy-engine stages): the random 7B's step
at context 128 on an H100 (2026-12-06f, ``pick_config``'s launches) 5.259 ms off, **3.270 on** (its first launch rule,
``legacy_config``, 4.288 against 5.248 on the H200, 2026-12-05d).
Triton's interpreter cannot run PTX: there ``dp4a`` and ``prmt`` are the same operations from shifts.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv_int8, support
from trtllm_pipeline.runtimes.torch_engine.cuda.gemv_input import planes
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv import _block_dot
from trtllm_pipeline.runtimes.torch_engine.cuda.support import interpreting

ENV = "TRTLLM_PIPELINE_W4A8_GEMV"
BLOCK_N, BLOCK_K = 256, 128  # 128 packed rows x 128 bytes: 16 KB a tile; 128 inputs: the 7B's scale group
# The GLU's rows a program: 32 (H100 2026-12-05e, benchmarks/w4a8_gemv.py, the 7B's fc + gate at batch 1: 32 rows
# 48.9 us, 64 rows 60.9, 128 rows 61.6: twice the programs hide more of each one's loads)
GLU_BLOCK_N = 32
LEGACY_GLU_BLOCK_N = 64
LONG_K_BLOCK_N = 128  # K past SHORT_K_TILES tiles (the 7B's proj): the prefetched loop at 128 registers
SHORT_K_TILES = 64
PROGRAMS_PER_SM = 8
FP8_MAX = 448.0
BIAS = tl.constexpr(-2139062144)  # 0x80808080 as an int32


def enabled() -> bool:
    """Whether the decode step takes this kernel at batch 1: unless ``$TRTLLM_PIPELINE_W4A8_GEMV`` is 0 (then
    quant_gemm's choice)."""
    return support.switch(ENV, True, "takes the W4A8 table-lookup GEMV at batch 1")


def block_inputs(group: int) -> int | None:
    """Inputs per shared exponent of the input (and per integer sum): 16, or the whole group when it is 8."""
    return 16 if group % 16 == 0 else 8 if group == 8 else None


def supported(q, m: int) -> bool:
    """W4A8-AWQ at one input row: whole 16-input blocks (or a scale group of 8), K whole groups."""
    return (m == 1 and q.fmt == "w4a8_awq" and q.n % 2 == 0 and block_inputs(q.group) is not None
            and q.k % 16 == 0 and q.k % q.group == 0)


def pick_config(q, sm_count: int, *, glu: bool = False, splits: int | None = None, block_n: int | None = None,
                block_k: int | None = None, prefetch: bool | None = None) -> LinearConfig:
    """128 inputs a tile (the 7B's scale group). K short (<= ``SHORT_K_TILES`` tiles: the 7B's qkv and dense): 256
    rows, K split for about ``PROGRAMS_PER_SM`` programs per SM, down to one tile a program (its loads all issued at
    once; programs overlap one another's latency). K long (proj): 128 rows (128 registers with the prefetch: 4
    programs an SM, 256 rows take 216), the next tile prefetched into registers while one is computed, split the
    same way. The GLU: 32 rows (timed: ``GLU_BLOCK_N``), K not split (its SiLU in the epilogue), prefetched. ``num_stages`` > 1 in the config
    is the kernel's own prefetch (Triton's pipeliner never staged these loads). Static SASS counts only
    (tools/gemv_sass.py); not timed (``legacy_config``: the first rule, for the A/B in benchmarks/w4a8_gemv.py)."""
    block_k = block_k or BLOCK_K
    k_tiles = triton.cdiv(q.k, block_k)
    if glu:
        block_n = block_n or GLU_BLOCK_N
        splits = 1
    else:
        block_n = block_n or (BLOCK_N if k_tiles <= SHORT_K_TILES else LONG_K_BLOCK_N)
        if splits is None:
            splits = pick_splits(triton.cdiv(q.n, block_n), k_tiles, sm_count)
    if prefetch is None:
        prefetch = triton.cdiv(k_tiles, splits) > 1
    return LinearConfig(1, block_n, block_k, splits, 4, 2 if prefetch else 1, w4a8=True)


def legacy_config(q, sm_count: int, *, glu: bool = False) -> LinearConfig:
    """The first rule (H200 2026-12-05d: 4.288 ms a 7B step, 26% of the floor): 256 rows (the GLU 64), K split for
    ~4 programs per SM with at least two tiles each (quant_gemv_int8.pick_splits), each tile loaded at the top of
    its iteration (no prefetch)."""
    block_n = LEGACY_GLU_BLOCK_N if glu else BLOCK_N
    splits = 1 if glu else quant_gemv_int8.pick_splits(triton.cdiv(q.n, block_n), triton.cdiv(q.k, BLOCK_K),
                                                        sm_count)
    return LinearConfig(1, block_n, BLOCK_K, splits, 4, 1, w4a8=True)


def pick_splits(tiles: int, k_tiles: int, sm_count: int) -> int:
    """K splits for about ``PROGRAMS_PER_SM`` programs per SM (at most one per K tile): a count that divides the K
    tiles where one is within 2x of that (no masked last split). The 7B on 132 SMs: qkv 28 (504 programs of one
    tile), dense 28 (392), proj 37 at 128 rows (1036 of four)."""
    want = max(1, min(k_tiles, round(PROGRAMS_PER_SM * sm_count / tiles)))
    even = [d for d in range(1, k_tiles + 1) if k_tiles % d == 0 and want / 2 <= d <= 2 * want]
    return min(even, key=lambda d: (abs(d - want), d)) if even else want


# ------------------------------------------------------------------------------------------ tables (at load)


def values(t: torch.Tensor) -> torch.Tensor:
    """E4M3(q x t) for q = -8..7 along a new last axis (float32), as quant_linear's kernel rounds each weight."""
    q = torch.arange(-8, 8, dtype=torch.float32, device=t.device)
    return (q * t.float()[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()


def integer_form(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(c [..., 16] float32, u [...] float32): ``values(t) == c x u`` with c integers, |c| <= 127 and u a power of
    two, 2^(e - 6) for e the binade of the largest magnitude (1 where every value is 0). Raises if the claim fails."""
    v = values(t)
    amax = v.abs().amax(-1)
    _, exp = torch.frexp(amax)  # amax = m 2^exp, m in [0.5, 1): the binade is exp - 1
    u = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), exp - 7), torch.ones_like(amax))
    c = v / u[..., None]
    if not (torch.equal(c, c.round()) and c.abs().max() <= 127 and torch.equal(c[..., 1:8], -c[..., 9:16].flip(-1))):
        raise ValueError("W4A8 GEMV: a group's E4M3 values are not small integers of one power of two")
    return c, u


def tables(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's tables from the step ``t`` (QuantWeight.scales of W4A8: [G, 2, N/2], group scale / scale_2 in the
    INT4 layout): int32 [G, 2, 2, N/2] (even / odd rows, then the words [c_8, c_1, c_2, c_3] and [c_4 .. c_7], byte 0
    first) and u float32 [G, 2, N/2]."""
    c, u = integer_form(t)
    b = c[..., 8:].to(torch.int32)  # c_0 .. c_7 (all >= 0)
    b[..., 0] = -c[..., 0].to(torch.int32)  # c_8 = |c_-8| in c_0's place (c_0 is 0)
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int32, device=t.device)
    lo = (b[..., 0:4] << shifts).sum(-1, dtype=torch.int32)
    hi = (b[..., 4:8] << shifts).sum(-1, dtype=torch.int32)
    return torch.stack([lo, hi], dim=2).contiguous(), u.contiguous()


def with_tables(q):
    """``q`` with its tables (``QuantWeight.lut``, ``units``): made once per weight (the decode step's buffers)."""
    if q.lut is not None:
        return q
    lut, units = tables(q.scales)
    return dataclasses.replace(q, lut=lut, units=units)


# ------------------------------------------------------------------------------------------ kernel


@triton.jit
def prmt(a, b, sel, ASM: tl.constexpr):
    """PTX ``prmt.b32`` (the default mode): byte i of the result is byte ``sel[4i+2:4i]`` of {b, a} (a: bytes 0-3),
    or, where ``sel`` bit 4i+3 is set, that byte's sign bit replicated. In the interpreter, from shifts."""
    if ASM:
        return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, sel], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        ab = (b.to(tl.int64) << 32) | (a.to(tl.int64) & 0xFFFFFFFF)
        out = tl.zeros(sel.shape, dtype=tl.int32)
        for i in tl.static_range(4):
            nib = (sel >> (4 * i)) & 0xF
            byte = ((ab >> ((nib & 7) * 8).to(tl.int64)) & 0xFF).to(tl.int32)
            byte = tl.where((nib & 8) != 0, tl.where(byte >= 128, 255, 0), byte)
            out = out | (byte << (8 * i))
        return out


@triton.jit
def bitsel(a, b, mask, ASM: tl.constexpr):
    """``(a & mask) | (b & ~mask)``: one LOP3 (written as PTX: the compiler otherwise splits it in two)."""
    if ASM:
        return tl.inline_asm_elementwise("lop3.b32 $0, $1, $2, $3, 0xE4;", "=r,r,r,r",
                                         [a, b, tl.full(a.shape, mask, tl.int32)], dtype=tl.int32, is_pure=True,
                                         pack=1)
    else:
        return (a & mask) | (b & ~mask)


@triton.jit
def _biased(p_lo, p_hi, n_lo, n_hi, sel, ASM: tl.constexpr):
    """The words' weights as ``c_q + 128`` in each byte (unsigned)."""
    pos = prmt(p_lo, p_hi, sel, ASM)
    neg = prmt(n_lo, n_hi, sel ^ 0x8888, ASM)
    return pos - neg + BIAS


@triton.jit
def _selectors(p, ASM: tl.constexpr):
    """A weight word's selectors (PRMT reads their low 16 bits): row 2j's nibbles of inputs 0, 2, 1, 3 and row
    2j + 1's, in that order. With ``t = p >> 12``: ``bitsel(p, t, 0x0F0F)`` (row 2j) and ``bitsel(p, t, 0xF0F0) >> 4``
    (its bits 4-19 hold row 2j + 1's: p's bits 4-7, t's 8-11 = p's 20-23, p's 12-15, t's 16-19 = p's 28-31): one
    shift a word fewer than shifting p by 4 and 16 for the odd row."""
    t = p >> 12
    return bitsel(p, t, 0x0F0F, ASM), bitsel(p, t, 0xF0F0, ASM) >> 4


@triton.jit
def _load_x(x_ptr, pqs_ptr, pqs2_ptr, kp, k_ok, HAS_PQS: tl.constexpr, GLU: tl.constexpr):
    """One K tile of the raw input (inputs ``kp``, in the selectors' order) and its pre-quant scales (the GLU: the
    gate's too); without them, ``x`` in their place (unused)."""
    x = tl.load(x_ptr + kp, mask=k_ok, other=0.0)
    if HAS_PQS:
        s = tl.load(pqs_ptr + kp, mask=k_ok, other=0.0)
        if GLU:
            s2 = tl.load(pqs2_ptr + kp, mask=k_ok, other=0.0)
        else:
            s2 = s
    else:
        s = x
        s2 = x
    return x, s, s2


@triton.jit
def _input(x, s, aq_ptr, k_ok, HAS_PQS: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_K: tl.constexpr,
           XB: tl.constexpr):
    """One K tile of the input (``x`` and its pre-quant scales ``s`` from ``_load_x``) as quant_linear's
    ``_act_tile`` leaves it (E4M3 of ``x x pre_quant_scale x (448 / amax)``), as int16 block floating point: planes
    [1, NB, XW], the blocks' -128 x sum x_int [1, NB] and 2^E [1, NB]."""
    NB: tl.constexpr = BLOCK_K // XB
    XW: tl.constexpr = XB // 4
    if HAS_PQS:
        x = (x.to(tl.float32) * s.to(tl.float32)).to(COMPUTE)
    v = tl.clamp(x.to(tl.float32) * tl.load(aq_ptr), -448.0, 448.0).to(tl.float8e4nv, fp_downcast_rounding="rtne")
    xh, xl, total, step = planes(tl.where(k_ok, v.to(tl.float32), 0.0), BLOCK_K, XB)
    return (tl.reshape(xh, (1, NB, XW)), tl.reshape(xl, (1, NB, XW)), (-128 * total)[None, :], step[None, :])


@triton.jit
def _load_w(w_ptr, t_ptr, u_ptr, rj, j_ok, wb, w_ok, g, g_ok, stride_wn, stride_tg, stride_t2, stride_tw, stride_ug,
            stride_u2, TILE_SCALE: tl.constexpr, EVEN: tl.constexpr):
    """One K tile of one matrix as loaded: the weight words [HALF, NB, XW] and, per parity, the tables' two words
    and unit (per row [HALF, 1, 1], or per row and input block [HALF, NB, 1] where a tile spans groups)."""
    w_ptrs = w_ptr + rj[:, None, None] * stride_wn + wb
    if EVEN:
        p = tl.load(w_ptrs)
    else:
        p = tl.load(w_ptrs, mask=j_ok[:, None, None] & w_ok, other=0)
    if TILE_SCALE:  # one group: a table per row
        tok = j_ok[:, None, None] & g_ok
    else:  # a table per row and input block [HALF, NB, 1]
        tok = j_ok[:, None, None] & g_ok[None, :, None]
        g = g[None, :, None]
    base = t_ptr + g * stride_tg + rj[:, None, None]
    ubase = u_ptr + g * stride_ug + rj[:, None, None]
    te_lo = tl.load(base, mask=tok, other=0)
    te_hi = tl.load(base + stride_tw, mask=tok, other=0)
    ue = tl.load(ubase, mask=tok, other=0.0)
    to_lo = tl.load(base + stride_t2, mask=tok, other=0)
    to_hi = tl.load(base + stride_t2 + stride_tw, mask=tok, other=0)
    uo = tl.load(ubase + stride_u2, mask=tok, other=0.0)
    return p, te_lo, te_hi, ue, to_lo, to_hi, uo


@triton.jit
def _row_tables(t_lo, t_hi, ASM: tl.constexpr):
    """One parity's P and N (lo and hi words) from its table words T = [c_8, c_1 .. c_7]."""
    n_lo = prmt(t_lo, t_hi, tl.full(t_lo.shape, 0x5670, tl.int32), ASM)  # c_8, c_7, c_6, c_5
    n_hi = prmt(t_lo, t_hi, tl.full(t_lo.shape, 0x1234, tl.int32), ASM)  # c_4, c_3, c_2, c_1
    return t_lo & -256, t_hi, n_lo, n_hi


@triton.jit
def _matrix(p, te_lo, te_hi, ue, to_lo, to_hi, uo, xh, xl, c, step, acc_e, acc_o, XW: tl.constexpr,
            ASM: tl.constexpr):
    """One K tile of one matrix (``_load_w``'s) into the even and odd rows' float32 accumulators [HALF, NB]."""
    pe_lo, pe_hi, ne_lo, ne_hi = _row_tables(te_lo, te_hi, ASM)
    po_lo, po_hi, no_lo, no_hi = _row_tables(to_lo, to_hi, ASM)
    sel_e, sel_o = _selectors(p, ASM)  # row 2j's and 2j + 1's nibbles of inputs 0, 2, 1, 3
    d_e = _biased(tl.broadcast_to(pe_lo, p.shape), tl.broadcast_to(pe_hi, p.shape), tl.broadcast_to(ne_lo, p.shape),
                  tl.broadcast_to(ne_hi, p.shape), sel_e, ASM)
    d_o = _biased(tl.broadcast_to(po_lo, p.shape), tl.broadcast_to(po_hi, p.shape), tl.broadcast_to(no_lo, p.shape),
                  tl.broadcast_to(no_hi, p.shape), sel_o, ASM)
    # per row and block sum (c_q + 128) x_int - 128 sum x_int = sum c_q x_int (INT4's dp4a chains; c: the -128 term)
    a_e = _block_dot(d_e, xh, xl, c, XW, ASM)
    a_o = _block_dot(d_o, xh, xl, c, XW, ASM)
    acc_e += a_e.to(tl.float32) * (tl.reshape(ue, (ue.shape[0], ue.shape[1])) * step)
    acc_o += a_o.to(tl.float32) * (tl.reshape(uo, (uo.shape[0], uo.shape[1])) * step)
    return acc_e, acc_o


@triton.jit
def _tile(k_tile, perm, words, rb, K, G, GROUP: tl.constexpr, XB: tl.constexpr, TILE_SCALE: tl.constexpr):
    """A K tile's input indices (selector order) and mask, weight word offsets and mask, and its group(s)."""
    kp = k_tile + perm
    wb = k_tile // 4 + words
    if TILE_SCALE:
        g = k_tile // GROUP
    else:
        g = (k_tile + rb * XB) // GROUP
    return kp, kp < K, wb, wb < K // 4, g, g < G


@triton.jit
def _w4a8_gemv_kernel(
    x_ptr, w_ptr, t_ptr, u_ptr, pqs_ptr, aq_ptr, osc_ptr, w2_ptr, t2_ptr, u2_ptr, pqs2_ptr, aq2_ptr, osc2_ptr, out_ptr,
    N, K, G, k_iters_per_split, stride_wn, stride_tg, stride_t2, stride_tw, stride_ug, stride_u2, stride_os,
    GROUP: tl.constexpr, XB: tl.constexpr, HAS_PQS: tl.constexpr, GLU: tl.constexpr, EVEN: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr, ASM: tl.constexpr,
    PDL: tl.constexpr,
):
    """Split-K partials of ``x W^T`` for one input row (or, GLU, ``silu(x W^T) * (x W2^T)`` unsplit). PREFETCH: the
    next K tile's weights, tables and raw input are loaded (into registers) before this tile is computed, so their
    memory latency overlaps its arithmetic; otherwise each tile is loaded at the top of its iteration and waited for."""
    HALF: tl.constexpr = BLOCK_N // 2
    NB: tl.constexpr = BLOCK_K // XB
    XW: tl.constexpr = XB // 4
    TILE_SCALE: tl.constexpr = GROUP % BLOCK_K == 0
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rj = pid_n * HALF + tl.arange(0, HALF)  # packed rows: output rows 2 rj and 2 rj + 1
    j_ok = rj < N // 2
    rk = tl.arange(0, BLOCK_K)
    perm = (rk & -4) | ((rk & 1) << 1) | ((rk >> 1) & 1)  # inputs 0, 2, 1, 3 of each word: the selectors' order
    rb = tl.arange(0, NB)
    words = (rb[:, None] * XW + tl.arange(0, XW)[None, :])[None]  # [1, NB, XW]
    k0 = pid_s * k_iters_per_split * BLOCK_K
    acc_e = tl.zeros((HALF, NB), dtype=tl.float32)
    acc_o = tl.zeros((HALF, NB), dtype=tl.float32)
    acc2_e = tl.zeros((HALF, NB), dtype=tl.float32)
    acc2_o = tl.zeros((HALF, NB), dtype=tl.float32)
    if PREFETCH:
        kp, k_ok, wb, w_ok, g, g_ok = _tile(k0, perm, words, rb, K, G, GROUP, XB, TILE_SCALE)
        x, s, s2 = _load_x(x_ptr, pqs_ptr, pqs2_ptr, kp, k_ok, HAS_PQS, GLU)
        p, te_lo, te_hi, ue, to_lo, to_hi, uo = _load_w(w_ptr, t_ptr, u_ptr, rj, j_ok, wb, w_ok, g, g_ok, stride_wn,
                                                        stride_tg, stride_t2, stride_tw, stride_ug, stride_u2,
                                                        TILE_SCALE, EVEN)
        p2, te2_lo, te2_hi, ue2, to2_lo, to2_hi, uo2 = p, te_lo, te_hi, ue, to_lo, to_hi, uo
        if GLU:
            p2, te2_lo, te2_hi, ue2, to2_lo, to2_hi, uo2 = _load_w(w2_ptr, t2_ptr, u2_ptr, rj, j_ok, wb, w_ok, g, g_ok,
                                                                   stride_wn, stride_tg, stride_t2, stride_tw,
                                                                   stride_ug, stride_u2, TILE_SCALE, EVEN)
        for i in range(k_iters_per_split - 1):
            # the next tile's loads first (in flight while this one is computed)
            kpn, k_okn, wbn, w_okn, gn, g_okn = _tile(k0 + (i + 1) * BLOCK_K, perm, words, rb, K, G, GROUP, XB,
                                                     TILE_SCALE)
            xn, sn, s2n = _load_x(x_ptr, pqs_ptr, pqs2_ptr, kpn, k_okn, HAS_PQS, GLU)
            pn, te_lon, te_hin, uen, to_lon, to_hin, uon = _load_w(w_ptr, t_ptr, u_ptr, rj, j_ok, wbn, w_okn, gn,
                                                                   g_okn, stride_wn, stride_tg, stride_t2, stride_tw,
                                                                   stride_ug, stride_u2, TILE_SCALE, EVEN)
            p2n, te2_lon, te2_hin, ue2n, to2_lon, to2_hin, uo2n = pn, te_lon, te_hin, uen, to_lon, to_hin, uon
            if GLU:
                p2n, te2_lon, te2_hin, ue2n, to2_lon, to2_hin, uo2n = _load_w(
                    w2_ptr, t2_ptr, u2_ptr, rj, j_ok, wbn, w_okn, gn, g_okn, stride_wn, stride_tg, stride_t2,
                    stride_tw, stride_ug, stride_u2, TILE_SCALE, EVEN)
            xh, xl, c, step = _input(x, s, aq_ptr, k_ok, HAS_PQS, COMPUTE, BLOCK_K, XB)
            acc_e, acc_o = _matrix(p, te_lo, te_hi, ue, to_lo, to_hi, uo, xh, xl, c, step, acc_e, acc_o, XW, ASM)
            if GLU:  # the gate: its own pre-quant and activation scales
                xh2, xl2, c2, step2 = _input(x, s2, aq2_ptr, k_ok, HAS_PQS, COMPUTE, BLOCK_K, XB)
                acc2_e, acc2_o = _matrix(p2, te2_lo, te2_hi, ue2, to2_lo, to2_hi, uo2, xh2, xl2, c2, step2, acc2_e,
                                         acc2_o, XW, ASM)
            k_ok, x, s, s2 = k_okn, xn, sn, s2n
            p, te_lo, te_hi, ue, to_lo, to_hi, uo = pn, te_lon, te_hin, uen, to_lon, to_hin, uon
            p2, te2_lo, te2_hi, ue2, to2_lo, to2_hi, uo2 = p2n, te2_lon, te2_hin, ue2n, to2_lon, to2_hin, uo2n
        xh, xl, c, step = _input(x, s, aq_ptr, k_ok, HAS_PQS, COMPUTE, BLOCK_K, XB)
        acc_e, acc_o = _matrix(p, te_lo, te_hi, ue, to_lo, to_hi, uo, xh, xl, c, step, acc_e, acc_o, XW, ASM)
        if GLU:
            xh2, xl2, c2, step2 = _input(x, s2, aq2_ptr, k_ok, HAS_PQS, COMPUTE, BLOCK_K, XB)
            acc2_e, acc2_o = _matrix(p2, te2_lo, te2_hi, ue2, to2_lo, to2_hi, uo2, xh2, xl2, c2, step2, acc2_e,
                                     acc2_o, XW, ASM)
    else:
        for i in range(k_iters_per_split):
            kp, k_ok, wb, w_ok, g, g_ok = _tile(k0 + i * BLOCK_K, perm, words, rb, K, G, GROUP, XB, TILE_SCALE)
            x, s, s2 = _load_x(x_ptr, pqs_ptr, pqs2_ptr, kp, k_ok, HAS_PQS, GLU)
            p, te_lo, te_hi, ue, to_lo, to_hi, uo = _load_w(w_ptr, t_ptr, u_ptr, rj, j_ok, wb, w_ok, g, g_ok,
                                                            stride_wn, stride_tg, stride_t2, stride_tw, stride_ug,
                                                            stride_u2, TILE_SCALE, EVEN)
            xh, xl, c, step = _input(x, s, aq_ptr, k_ok, HAS_PQS, COMPUTE, BLOCK_K, XB)
            acc_e, acc_o = _matrix(p, te_lo, te_hi, ue, to_lo, to_hi, uo, xh, xl, c, step, acc_e, acc_o, XW, ASM)
            if GLU:  # the gate: its own pre-quant and activation scales
                p2, te2_lo, te2_hi, ue2, to2_lo, to2_hi, uo2 = _load_w(w2_ptr, t2_ptr, u2_ptr, rj, j_ok, wb, w_ok, g,
                                                                       g_ok, stride_wn, stride_tg, stride_t2,
                                                                       stride_tw, stride_ug, stride_u2, TILE_SCALE,
                                                                       EVEN)
                xh2, xl2, c2, step2 = _input(x, s2, aq2_ptr, k_ok, HAS_PQS, COMPUTE, BLOCK_K, XB)
                acc2_e, acc2_o = _matrix(p2, te2_lo, te2_hi, ue2, to2_lo, to2_hi, uo2, xh2, xl2, c2, step2, acc2_e,
                                         acc2_o, XW, ASM)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    y = tl.reshape(tl.join(tl.sum(acc_e, axis=1), tl.sum(acc_o, axis=1)), (BLOCK_N,)) * tl.load(osc_ptr)
    if GLU:
        y2 = tl.reshape(tl.join(tl.sum(acc2_e, axis=1), tl.sum(acc2_o, axis=1)), (BLOCK_N,)) * tl.load(osc2_ptr)
        tl.store(out_ptr + rn, silu_mul(y, y2, COMPUTE), mask=n_ok)
    else:
        tl.store(out_ptr + pid_s * stride_os + rn, y, mask=n_ok)


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool):
    """``x`` [1, K] in the compute dtype (before the pre-quant scale); ``out`` [splits, 1, N] float32 partials, or
    (``q2``: the GLU's gate) [1, N] in the compute dtype. The tables are made here where ``q`` has none (the decode
    step makes them with its buffers: ``with_tables``)."""
    assert supported(q, x.shape[0]) and x.stride(1) == 1 and q.weight.is_contiguous()
    assert cfg.block_n % 2 == 0 and cfg.block_k % block_inputs(q.group) == 0
    glu = q2 is not None
    q = with_tables(q)
    q2 = with_tables(q2) if glu else q
    if glu:
        assert q2.lut.stride() == q.lut.stride() and q2.units.stride() == q.units.stride()
        assert q2.weight.stride() == q.weight.stride() and (q2.pqs is None) == (q.pqs is None)
    k_iters = triton.cdiv(q.k, cfg.block_k)
    splits = 1 if glu else cfg.splits
    per_split = triton.cdiv(k_iters, splits)
    words, words2 = q.weight.view(torch.int32), q2.weight.view(torch.int32)
    half = cfg.block_n // 2
    return _w4a8_gemv_kernel[(triton.cdiv(q.n // 2, half), splits)](
        x, words, q.lut, q.units, q.pqs if q.pqs is not None else out, q.act_q, q.out_scale,
        words2, q2.lut, q2.units, q2.pqs if q2.pqs is not None else out, q2.act_q, q2.out_scale, out,
        q.n, q.k, q.lut.shape[0], per_split, words.stride(0), q.lut.stride(0), q.lut.stride(1), q.lut.stride(2),
        q.units.stride(0), q.units.stride(1), 0 if glu or out.dim() == 2 else out.stride(0),
        GROUP=q.group, XB=block_inputs(q.group), HAS_PQS=q.pqs is not None, GLU=glu, COMPUTE=tl_dtype(compute),
        EVEN=(q.n // 2) % half == 0 and q.k % cfg.block_k == 0 and k_iters % splits == 0,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PREFETCH=cfg.num_stages > 1,
        ASM=not interpreting(), PDL=pdl, num_warps=cfg.num_warps, num_stages=1, launch_pdl=pdl,
    )
