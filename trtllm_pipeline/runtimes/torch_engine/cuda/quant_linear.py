"""Decode linears for the 4- and 8-bit weight formats: INT4-AWQ (W4A16), W4A8-AWQ, INT8 SmoothQuant (W8A8)
and INT8 weight-only (W8A16), in linear.py's style (split-K, swapped dot, float32 partials to the workspace
the next fused kernel reduces, PDL), plus a GLU variant for mlp.fc/mlp.gate. INT4-AWQ at batch 1 goes to
quant_gemv's matrix-vector kernel instead (``pick_config`` decides; ``_launch`` dispatches on the config).

Weights are read as the checkpoint stores them: no repacking, no copy.

* INT4 (``int4_awq``, ``w4a8_awq``): int8 [N/2, K], byte (j, k) holds output rows 2j (low nibble) and 2j+1
  (high nibble) as two's-complement INT4. Each packed row is K-contiguous, so the swapped dot's weight tile
  (BLOCK_N/2 packed rows x BLOCK_K bytes, 128 bytes per row) is a coalesced load. The two nibbles of a
  byte feed two dots (even and odd output rows), stored to interleaved columns of the workspace: no
  register shuffle. A nibble becomes a compute-dtype value without an integer-to-float conversion:
  ``(nibble ^ 8) | 0x4300`` is the bfloat16 bit pattern of ``136 + q`` (``0x6400`` / ``1032 + q`` in
  float16), one logic op; the 136 is taken off as 136 x the activation tile's row sum (shared by the even
  and odd rows), so ``dot(W_biased, x) - 136 * sum_k(x) = dot(q, x)`` exactly up to float32
  accumulation.
* INT8 (``int8_sq``, ``int8_wo``): int8 [N, K] as stored. SmoothQuant multiplies int8 x int8 on the
  tensor cores into int32 (exact), scaled once by ``activation scale x weight scale[n]``. Weight-only turns
  the int8 into float32 by the same kind of bit trick (``(w ^ 0x80) | 0x4B000000`` is ``2^23 + 128 + w``),
  then the compute dtype (exact).

Scales are re-laid once at load (``QuantWeight.of``) so each tile's scales are one contiguous load along N:
per-group scales [N, K/g] become [K/g, 2, N/2] for INT4 (group-major, even rows then odd rows), [slices, N]
for weight-only. When a tile's K range lies inside one group (group size a multiple of BLOCK_K: the 7B's
128), the group scale multiplies the tile's [BLOCK_N, BLOCK_M] dot result instead of every weight; smaller
groups (the tiny test model's 8) scale each weight before its dot.

Activations (``pre_quant_scale``, and the FP8 / INT8 activation quantizer) are handled inside the
consuming kernel, on each K tile of the input as it is loaded: ``x * pre_quant_scale`` rounded to the compute
dtype (the eager product, exactly), then quantized with ModelOpt's multiplier (``x * (448 / amax)``
saturated to E4M3, ``round(x * (127 / amax))`` half-to-even to [-128, 127]). The producers (RMSNorm,
attention's split combine, the SiLU gate) write the compute dtype for these kernels, and mlp.fc and mlp.gate,
whose pre-quant and activation scales differ in these exports (an unfused ``_Pair`` in the eager model), each
take their own view of the same normed input inside one GLU launch. (quant_gemv's INT4-AWQ batch-1 GEMV
instead takes its input prepared once by the producer, pre-quant scale applied: ``gemv_input``.)

W4A8 follows TensorRT-LLM's W4A8-AWQ: the INT4 values times the group scale in units of the per-tensor
``weights_scaling_factor_2`` are rounded to E4M3 in registers (ModelOpt's fake quantization of exactly
these weights), multiplied FP8 x FP8 with the FP8-quantized input, and the float32 sum is scaled once by
``activation scale x scale_2``.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import (fixed_sum, quant_gemv, quant_gemv_int8, quant_gemv_int8_ws,
                                                       quant_gemv_w4a8, quant_gemv_w4a8_mma, quant_gemv_w4a8_ws,
                                                       quant_mma_int4)
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv import int4_scales

FORMATS = ("int4_awq", "w4a8_awq", "int8_sq", "int8_wo")
FP8_MAX = 448.0
ROUND = 12582912.0  # 1.5 * 2^23: adding and subtracting it rounds a float32 below 2^22 to an integer, ties to even
ACT_NONE, ACT_FP8, ACT_INT8 = 0, 1, 2


@dataclasses.dataclass
class QuantWeight:
    """One quantized linear as the kernels read it (``of`` builds it from a ``torch_engine/model.Linear``)."""

    fmt: str
    weight: torch.Tensor  # the checkpoint's tensor: int8 [N/2, K] (INT4 pairs) or int8 [N, K]
    scales: torch.Tensor  # float32 multipliers, per tile: [G, 2, N/2] (INT4), [slices, N] (int8_wo), [N] (int8_sq)
    group: int  # input features per scale column (int8_sq: K)
    pqs: torch.Tensor | None  # [K] compute dtype, multiplies the input first
    act_q: torch.Tensor | None  # [1] float32: the activation quantizer's multiplier (448 / amax or 127 / amax)
    out_scale: torch.Tensor | None  # [1] float32: applied to the float32 sum (w4a8_awq)
    n: int
    k: int
    # INT4 at batch 1 on Hopper: ``weight`` re-laid tile by tile for quant_gemv_ws (``tile_weights``), and its
    # tiles' packed rows (None: the kernels read ``weight``)
    tiled: torch.Tensor | None = None
    tile_rows: int = 0
    # INT4-AWQ: ``scales`` in the compute dtype, whose values they are (quant_gemv_ws reads them: half the bytes)
    scales16: torch.Tensor | None = None
    # W4A8-AWQ at batch 1 (quant_gemv_w4a8.tables): per group and row the E4M3 values' integers, int32 [G, 2, 2, N/2],
    # and their power of two, float32 [G, 2, N/2] (None: not made)
    lut: torch.Tensor | None = None
    units: torch.Tensor | None = None
    # W4A8-AWQ at batch 1 on the FP8 tensor cores (quant_gemv_w4a8_mma.tables): per group and row the E4M3 magnitudes'
    # bytes, int32 [G, 2, 2, N/2] (None: not made)
    lut8: torch.Tensor | None = None

    @property
    def int4(self) -> bool:
        return self.fmt in ("int4_awq", "w4a8_awq")

    @property
    def act(self) -> int:
        return {"w4a8_awq": ACT_FP8, "int8_sq": ACT_INT8}.get(self.fmt, ACT_NONE)

    def nbytes(self, scales16: bool = False) -> int:
        """Bytes one pass over this layer reads: the packed weight and its scales (``scales16``: their 16-bit copy,
        as the warp-specialized GEMV reads them)."""
        scales = self.scales16 if scales16 and self.scales16 is not None else self.scales
        return sum(t.numel() * t.element_size() for t in (self.weight, scales, self.pqs) if t is not None)

    def rows(self, start: int, stop: int) -> "QuantWeight":
        """Output rows [start, stop) (an even start and stop for INT4): mlp.fc and mlp.gate of a fused matrix."""
        if self.int4:
            assert start % 2 == 0 and stop % 2 == 0
            weight, scales = self.weight[start // 2: stop // 2], self.scales[:, :, start // 2: stop // 2]
        elif self.fmt == "int8_wo":
            weight, scales = self.weight[start:stop], self.scales[:, start:stop]
        else:
            weight, scales = self.weight[start:stop], self.scales[start:stop]
        return dataclasses.replace(self, weight=weight, scales=scales.contiguous(), n=stop - start, tiled=None,
                                   scales16=None, lut=None, units=None, lut8=None)

    @classmethod
    def of(cls, lin) -> "QuantWeight":
        """The kernels' view of a quantized ``torch_engine/model.Linear`` (its tensors as the checkpoint stores them)."""
        fmt, w = lin.format, lin.weight
        f32 = torch.float32
        pqs = lin.pre_quant_scale.contiguous() if lin.pre_quant_scale is not None else None
        if fmt in ("int4_awq", "w4a8_awq"):
            n, k = 2 * w.shape[0], w.shape[1]
            s = lin.scales.to(f32)
            g = k // s.shape[1]
            act_q = out_scale = scales16 = None
            if fmt == "int4_awq":  # the group scale as the eager layer takes it: in the compute dtype (torch_model)
                rounded = lin.group_scales()
                step, scales16 = rounded.to(f32), _int4_layout(rounded, n)
            else:
                # 1 / (7 / (amax / 7 * 7)): the step ModelOpt's fake quantizer divides the INT4 values by
                step = 1.0 / (torch.tensor(7.0, device=s.device) / (s * 7.0))
            if fmt == "w4a8_awq":  # the INT4 step in units of the FP8 step of scale_2 (TensorRT-LLM: scales / scale_2)
                # 448 / amax exactly as torch_model.fake_fp8 computes it (a float over a tensor), so ties round alike
                q2 = FP8_MAX / (lin.scale_2.float() * FP8_MAX)
                qa = FP8_MAX / (lin.a_scale.float() * FP8_MAX)
                step = _w4a8_steps(step * q2, torch.tensor(7.0, device=s.device) / (s * 7.0), q2)
                act_q, out_scale = qa.reshape(1), ((1 / qa) * (1 / q2)).reshape(1)
            return cls(fmt, w, _int4_layout(step, n), g, pqs, act_q, out_scale, n, k, scales16=scales16)
        if fmt == "int8_sq":
            qa = torch.tensor(127.0, device=w.device) / (lin.a_scale.float() * 127.0)
            scales = (lin.scales.float() * (1 / qa)).contiguous()
            return cls(fmt, w, scales, w.shape[1], pqs, qa.reshape(1), None, w.shape[0], w.shape[1])
        if fmt == "int8_wo":
            s = lin.scales.float()
            return cls(fmt, w, s.t().contiguous(), w.shape[1] // s.shape[1], pqs, None, None, w.shape[0], w.shape[1])
        raise ValueError(f"no fast kernel for {fmt} weights")


def _w4a8_steps(step: torch.Tensor, q_scale: torch.Tensor, q2: torch.Tensor) -> torch.Tensor:
    """W4A8's per-group steps [N, G] (float32) such that E4M3(q x step), what the kernels round, is for every INT4
    value q the E4M3 of ModelOpt's ``(q / q_scale) x q2`` (torch_model's ``_dequantize``: a division, then a product).

    The kernels multiply once by ``step = (1 / q_scale) x q2``: within a float32 ulp or two of ModelOpt's value, which
    E4M3 rounds alike except at a tie. Ties are not rare: amax values of BF16 weights make steps of few significant
    bits (a random 7B-shaped layer had 0.4% of its weights in groups where q = +-3 landed on 12.5 and rounded to 13
    against ModelOpt's 12; its output 0.7% off eager's). Where a group's step misses any q, it is moved by one or two
    float32 ulps to one that rounds all sixteen alike (a group that none of those fits would keep its own: not seen;
    tests/test_w4a8_steps.py checks a layer's every weight)."""
    qs = torch.arange(-8, 8, dtype=torch.float32, device=step.device).view(16, 1, 1)

    def e4m3(v: torch.Tensor) -> torch.Tensor:
        return v.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)

    want = e4m3((qs / q_scale) * q2)
    fits = (e4m3(qs * step) == want).all(0)
    up, down = step, step
    for _ in range(2):  # one ulp, then two, each way
        if bool(fits.all()):
            break
        up, down = torch.nextafter(up, up * 2), torch.nextafter(down, down * 0)
        for moved in (up, down):
            fixed = ~fits & (e4m3(qs * moved) == want).all(0)
            step, fits = torch.where(fixed, moved, step), fits | fixed
    return step


def _int4_layout(scales: torch.Tensor, n: int) -> torch.Tensor:
    """Per-group scales [N, G] as the INT4 kernels read them: [G, 2, N/2], group-major, even rows then odd."""
    return scales.t().reshape(scales.shape[1], n // 2, 2).permute(0, 2, 1).contiguous()


def pick_config(q: QuantWeight, m: int, sm_count: int, *, glu: bool = False, splits: int | None = None,
                block_n: int | None = None, gemv: bool | None = None) -> LinearConfig:
    """INT4-AWQ at batch 1: quant_gemv's matrix-vector kernel (``gemv=False`` asks for the dot kernel; ``gemv=True``
    at M = 2-16 for its several-row kernel, which only the measured table or its switch picks: ``quant_gemm.choose``).
    Otherwise linear.py's tile rule for these layouts: 128 bytes of K per weight row and tile (INT4: 128
    inputs of a packed row pair, so BLOCK_N = 128 output rows are 8 KB per stage like FP8's 64 x 128),
    ~4 programs per SM."""
    if gemv and quant_gemv_int8.supported(q, m):  # INT8's dp4a GEMV (warp-specialized where switched on)
        if quant_gemv_int8_ws.enabled(q.fmt) and quant_gemv_int8_ws.usable(q, q.weight.device):
            return quant_gemv_int8_ws.pick_config(q, sm_count, glu=glu, splits=splits, block_n=block_n)
        return quant_gemv_int8.pick_config(q, sm_count, glu=glu, splits=splits)
    if gemv and quant_gemv_w4a8.supported(q, m):  # W4A8's table-lookup GEMV (Hopper: warp-specialized, or wgmma)
        if quant_gemv_w4a8_mma.enabled() and quant_gemv_w4a8_mma.usable(q, q.weight.device):
            return quant_gemv_w4a8_mma.pick_config(q, sm_count, glu=glu, splits=splits, block_n=block_n)
        if quant_gemv_w4a8_ws.enabled() and quant_gemv_w4a8_ws.usable(q, q.weight.device):
            return quant_gemv_w4a8_ws.pick_config(q, sm_count, glu=glu, splits=splits, block_n=block_n)
        return quant_gemv_w4a8.pick_config(q, sm_count, glu=glu, splits=splits, block_n=block_n)
    if gemv or (gemv is None and m == 1 and quant_gemv.supported(q, m)):
        return quant_gemv.pick_config(q, sm_count, glu=glu, splits=splits, block_n=block_n, m=m)
    block_m = max(16, triton.next_power_of_2(m))
    block_k = 128
    block_n = block_n or (128 if q.int4 else 64)
    tiles = triton.cdiv(q.n, block_n)
    if splits is None:
        # The 4-bit kernels are compute-bound: twice the programs, down to two K tiles each (H200 sweep,
        # run 15: qkv 10.4 -> 8.6 us, dense 8.3 -> 6.7, proj 40.4 -> 36.2 at batch 1).
        per_sm, min_iters = (8, 2) if q.int4 else (4, 4)
        splits = 1 if glu else max(1, min(triton.cdiv(q.k, block_k) // min_iters, round(per_sm * sm_count / tiles)))
    return LinearConfig(block_m, block_n, block_k, splits, 4, 3)


# ------------------------------------------------------------------------------------------ helpers


@triton.jit
def _act_tile(x_ptrs, pqs_ptrs, aq_ptr, mask, kmask, HAS_PQS: tl.constexpr, ACT: tl.constexpr,
              MASKED: tl.constexpr, COMPUTE: tl.constexpr):
    """One K tile of the input as the layer's activation quantizer leaves it: [BLOCK_M, BLOCK_K]."""
    return act_apply(x_tile(x_ptrs, mask, MASKED), pqs_values(pqs_ptrs, kmask, HAS_PQS, MASKED),
                     act_scale(aq_ptr, ACT), HAS_PQS, ACT, COMPUTE)


@triton.jit
def x_tile(x_ptrs, mask, MASKED: tl.constexpr):
    """One K tile of the input as stored (zeros past M and K where ``MASKED``)."""
    if MASKED:
        return tl.load(x_ptrs, mask=mask, other=0.0)
    return tl.load(x_ptrs)


@triton.jit
def pqs_values(pqs_ptrs, kmask, HAS_PQS: tl.constexpr, MASKED: tl.constexpr):
    """A K tile's pre-quant scales as stored ([BLOCK_K]; zeros where the layer has none), for ``act_apply``. Loaded
    apart so that a K loop can load the next tile's an iteration early (``quant_gemm``'s GEMMs): a [BLOCK_K] vector
    of 16-bit values is too narrow for the compiler's pipelined loads (cp.async takes 4 bytes a thread), and loaded
    in the iteration that used it, every K tile waited out its latency (ncu, H100 2026-12-07e: 21% of the INT4 GLU's
    stall samples at M 8 on that one load). Kept in their 16-bit type: converted where they multiply, ptxas
    makes the product one HMUL2 for two inputs (a float32 copy carried over the iteration costs an FMUL an input)."""
    if HAS_PQS:
        if MASKED:
            return tl.load(pqs_ptrs, mask=kmask, other=0.0)
        return tl.load(pqs_ptrs)
    return tl.zeros(pqs_ptrs.shape, dtype=pqs_ptrs.dtype.element_ty)


@triton.jit
def act_scale(aq_ptr, ACT: tl.constexpr):
    """The activation quantizer's float32 1 / scale (1.0 where the input is not quantized): loaded once a program."""
    if ACT != 0:
        return tl.load(aq_ptr)
    return 1.0


@triton.jit
def act_apply(x, pqs, aq, HAS_PQS: tl.constexpr, ACT: tl.constexpr, COMPUTE: tl.constexpr):
    """``x`` times the pre-quant scales (rounded to the compute dtype), then quantized to E4M3 (ACT 1) or int8 (2)."""
    if HAS_PQS:
        x = (x.to(tl.float32) * pqs.to(tl.float32)[None, :]).to(COMPUTE)
    if ACT == 1:
        x = tl.clamp(x.to(tl.float32) * aq, -448.0, 448.0).to(tl.float8e4nv, fp_downcast_rounding="rtne")
    elif ACT == 2:
        r = tl.clamp(x.to(tl.float32) * aq, -128.0, 127.0)
        x = ((r + 12582912.0) - 12582912.0).to(tl.int8)
    return x


@triton.jit
def _int4_dots(p, s_lo, s_hi, xt, acc_lo, acc_hi, A8: tl.constexpr, TILE_SCALE: tl.constexpr,
               MAGIC: tl.constexpr, OFFSET: tl.constexpr, COMPUTE: tl.constexpr):
    """Accumulate the even (low nibble) and odd (high nibble) rows of packed tile ``p`` against ``xt``.

    ``s_lo``/``s_hi``: the rows' scales, [HALF, 1] (one group per tile) or [HALF, BLOCK_K].
    """
    u = p.to(tl.uint8, bitcast=True).to(tl.int16)
    lo_bits = (u & 0xF) ^ MAGIC  # (q ^ 8) | MAGIC: the bits of OFFSET + q in the compute dtype
    hi_bits = (u >> 4) ^ MAGIC
    if A8:  # E4M3 of q x the group step in scale_2's units, as ModelOpt's fake quantizer rounds it
        lo = (lo_bits.to(COMPUTE, bitcast=True).to(tl.float32) - OFFSET) * s_lo
        hi = (hi_bits.to(COMPUTE, bitcast=True).to(tl.float32) - OFFSET) * s_hi
        lo = tl.clamp(lo, -448.0, 448.0).to(tl.float8e4nv, fp_downcast_rounding="rtne")
        hi = tl.clamp(hi, -448.0, 448.0).to(tl.float8e4nv, fp_downcast_rounding="rtne")
        acc_lo = tl.dot(lo, xt, acc_lo)
        acc_hi = tl.dot(hi, xt, acc_hi)
    elif TILE_SCALE:  # integer values on the tensor cores, the group scale on the [HALF, BLOCK_M] result
        # dot(OFFSET + q, x) - OFFSET * sum_k x: the offset's share is one row sum of the activation tile,
        # shared by the even and odd rows, instead of two more dots against a constant tile.
        corr = (-OFFSET * tl.sum(xt.to(tl.float32), axis=0))[None, :]
        t_lo = tl.dot(lo_bits.to(COMPUTE, bitcast=True), xt) + corr
        t_hi = tl.dot(hi_bits.to(COMPUTE, bitcast=True), xt) + corr
        acc_lo += t_lo * s_lo
        acc_hi += t_hi * s_hi
    else:
        lo = ((lo_bits.to(COMPUTE, bitcast=True).to(tl.float32) - OFFSET) * s_lo).to(COMPUTE)
        hi = ((hi_bits.to(COMPUTE, bitcast=True).to(tl.float32) - OFFSET) * s_hi).to(COMPUTE)
        acc_lo = tl.dot(lo, xt, acc_lo)
        acc_hi = tl.dot(hi, xt, acc_hi)
    return acc_lo, acc_hi


# ------------------------------------------------------------------------------------------ kernels


@triton.jit
def _int4_kernel(
    x_ptr, w_ptr, s_ptr, pqs_ptr, aq_ptr, osc_ptr,
    w2_ptr, s2_ptr, pqs2_ptr, aq2_ptr, osc2_ptr,
    out_ptr,
    M, N, K, G, k_iters_per_split,
    stride_xm, stride_wn, stride_sg, stride_s2, stride_os, stride_om,
    GROUP: tl.constexpr, A8: tl.constexpr, HAS_PQS: tl.constexpr, GLU: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, MASKED_X: tl.constexpr, TILE_SCALE: tl.constexpr,
    MAGIC: tl.constexpr, OFFSET: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """Split-K partials (or, with GLU, silu(fc) * gate of two matrices) of packed INT4 weights."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    HALF: tl.constexpr = BLOCK_N // 2
    ACT: tl.constexpr = 1 if A8 else 0
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rj = pid_n * HALF + tl.arange(0, HALF)  # packed rows: output rows 2 rj and 2 rj + 1
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    k0 = pid_s * k_iters_per_split * BLOCK_K
    j_ok = rj < N // 2
    m_ok = rm[:, None] < M
    w_ptrs = w_ptr + rj[:, None] * stride_wn + (k0 + rk)[None, :]
    w2_ptrs = w2_ptr + rj[:, None] * stride_wn + (k0 + rk)[None, :]
    x_ptrs = x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :]
    acc_lo = tl.zeros((HALF, BLOCK_M), dtype=tl.float32)
    acc_hi = tl.zeros((HALF, BLOCK_M), dtype=tl.float32)
    acc2_lo = tl.zeros((HALF, BLOCK_M), dtype=tl.float32)
    acc2_hi = tl.zeros((HALF, BLOCK_M), dtype=tl.float32)
    for i in range(k_iters_per_split):
        k_tile = k0 + i * BLOCK_K
        kk = k_tile + rk
        k_ok = kk < K
        x = _act_tile(x_ptrs, pqs_ptr + kk, aq_ptr, m_ok & k_ok[None, :], k_ok, HAS_PQS, ACT, MASKED_X, COMPUTE)
        if EVEN_N and EVEN_K:
            p = tl.load(w_ptrs)
        else:
            p = tl.load(w_ptrs, mask=j_ok[:, None] & k_ok[None, :], other=0)
        s_lo, s_hi = int4_scales(s_ptr, stride_sg, stride_s2, rj, kk, k_tile, j_ok, G, GROUP, TILE_SCALE)
        acc_lo, acc_hi = _int4_dots(p, s_lo, s_hi, tl.trans(x), acc_lo, acc_hi, A8, TILE_SCALE, MAGIC,
                                    OFFSET, COMPUTE)
        if GLU:
            x2 = _act_tile(x_ptrs, pqs2_ptr + kk, aq2_ptr, m_ok & k_ok[None, :], k_ok, HAS_PQS, ACT, MASKED_X, COMPUTE)
            if EVEN_N and EVEN_K:
                p2 = tl.load(w2_ptrs)
            else:
                p2 = tl.load(w2_ptrs, mask=j_ok[:, None] & k_ok[None, :], other=0)
            s2_lo, s2_hi = int4_scales(s2_ptr, stride_sg, stride_s2, rj, kk, k_tile, j_ok, G, GROUP, TILE_SCALE)
            acc2_lo, acc2_hi = _int4_dots(p2, s2_lo, s2_hi, tl.trans(x2), acc2_lo, acc2_hi, A8, TILE_SCALE,
                                          MAGIC, OFFSET, COMPUTE)
            w2_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if A8:
        acc_lo = acc_lo * tl.load(osc_ptr)
        acc_hi = acc_hi * tl.load(osc_ptr)
        if GLU:
            acc2_lo = acc2_lo * tl.load(osc2_ptr)
            acc2_hi = acc2_hi * tl.load(osc2_ptr)
    mask = j_ok[:, None] & (rm[None, :] < M)
    even = out_ptr + pid_s * stride_os + rm[None, :] * stride_om + 2 * rj[:, None]
    if GLU:
        tl.store(even, silu_mul(acc_lo, acc2_lo, COMPUTE), mask=mask)
        tl.store(even + 1, silu_mul(acc_hi, acc2_hi, COMPUTE), mask=mask)
    else:
        tl.store(even, acc_lo, mask=mask)
        tl.store(even + 1, acc_hi, mask=mask)


@triton.jit
def _int8_weight_tile(w, s, TILE_SCALE: tl.constexpr, COMPUTE: tl.constexpr):
    """int8 -> compute dtype through float32 bits: (w ^ 0x80) | 0x4B000000 is the float 2^23 + 128 + w."""
    bits = (w.to(tl.uint8, bitcast=True).to(tl.int32) ^ 0x4B000080).to(tl.float32, bitcast=True)
    v = bits - 8388736.0
    # One return after if/else: Triton's compiler (3.6, on a GPU) generates the code after an early
    # return in a constexpr branch too, so the other format's statements failed to compile; its
    # interpreter does not, so only the H200 showed it.
    if TILE_SCALE:
        tile = v.to(COMPUTE)
    else:
        tile = (v * s).to(COMPUTE)
    return tile


@triton.jit
def _int8_step(w, s_ptr, stride_sg, rn, kk, k_tile, K, n_ok, k_ok, xt, acc, A8: tl.constexpr, GROUP: tl.constexpr,
               TILE_SCALE: tl.constexpr, COMPUTE: tl.constexpr):
    if A8:  # SmoothQuant: int8 x int8 -> int32, scaled in the epilogue
        acc = tl.dot(w, xt, acc, out_dtype=tl.int32)
    elif TILE_SCALE:
        s = tl.load(s_ptr + (k_tile // GROUP) * stride_sg + rn, mask=n_ok & (k_tile < K), other=0.0)
        acc = acc + tl.dot(_int8_weight_tile(w, s, TILE_SCALE, COMPUTE), xt) * s[:, None]
    else:
        s = tl.load(s_ptr + (kk // GROUP)[None, :] * stride_sg + rn[:, None], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)
        acc = tl.dot(_int8_weight_tile(w, s, TILE_SCALE, COMPUTE), xt, acc)
    return acc  # one return (see _int8_weight_tile)


@triton.jit
def _int8_kernel(
    x_ptr, w_ptr, s_ptr, pqs_ptr, aq_ptr,
    w2_ptr, s2_ptr, pqs2_ptr, aq2_ptr,
    out_ptr,
    M, N, K, k_iters_per_split,
    stride_xm, stride_wn, stride_sg, stride_os, stride_om,
    GROUP: tl.constexpr, A8: tl.constexpr, HAS_PQS: tl.constexpr, GLU: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, MASKED_X: tl.constexpr, TILE_SCALE: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """Split-K partials (or the GLU of two matrices) of int8 [N, K] weights: SmoothQuant (A8) or weight-only."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    ACT: tl.constexpr = 2 if A8 else 0
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    k0 = pid_s * k_iters_per_split * BLOCK_K
    n_ok = rn < N
    m_ok = rm[:, None] < M
    w_ptrs = w_ptr + rn[:, None] * stride_wn + (k0 + rk)[None, :]
    w2_ptrs = w2_ptr + rn[:, None] * stride_wn + (k0 + rk)[None, :]
    x_ptrs = x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :]
    if A8:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
        acc2 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for i in range(k_iters_per_split):
        k_tile = k0 + i * BLOCK_K
        kk = k_tile + rk
        k_ok = kk < K
        x = _act_tile(x_ptrs, pqs_ptr + kk, aq_ptr, m_ok & k_ok[None, :], k_ok, HAS_PQS, ACT, MASKED_X, COMPUTE)
        if EVEN_N and EVEN_K:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0)
        acc = _int8_step(w, s_ptr, stride_sg, rn, kk, k_tile, K, n_ok, k_ok, tl.trans(x), acc, A8, GROUP, TILE_SCALE,
                         COMPUTE)
        if GLU:
            x2 = _act_tile(x_ptrs, pqs2_ptr + kk, aq2_ptr, m_ok & k_ok[None, :], k_ok, HAS_PQS, ACT, MASKED_X, COMPUTE)
            if EVEN_N and EVEN_K:
                w2 = tl.load(w2_ptrs)
            else:
                w2 = tl.load(w2_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0)
            acc2 = _int8_step(w2, s2_ptr, stride_sg, rn, kk, k_tile, K, n_ok, k_ok, tl.trans(x2), acc2, A8, GROUP,
                              TILE_SCALE, COMPUTE)
            w2_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if A8:  # activation step x weight scale[n], folded into one per-row multiplier at load
        y = acc.to(tl.float32) * tl.load(s_ptr + rn, mask=n_ok, other=0.0)[:, None]
        if GLU:
            y2 = acc2.to(tl.float32) * tl.load(s2_ptr + rn, mask=n_ok, other=0.0)[:, None]
    else:
        y = acc
        y2 = acc2
    mask = n_ok[:, None] & (rm[None, :] < M)
    out = out_ptr + pid_s * stride_os + rm[None, :] * stride_om + rn[:, None]
    if GLU:
        tl.store(out, silu_mul(y, y2, COMPUTE), mask=mask)
    else:
        tl.store(out, y, mask=mask)


# ------------------------------------------------------------------------------------------ launchers


def _magic(compute: torch.dtype) -> tuple[int, float]:
    """(bits XORed into ``nibble``, the value they add): ``(u ^ 8) | 0x4300`` is bfloat16 136 + q."""
    return (0x4308, 136.0) if compute == torch.bfloat16 else (0x6408, 1032.0)


def _launch(x, q: QuantWeight, q2: QuantWeight | None, out: torch.Tensor, cfg: LinearConfig,
            compute: torch.dtype, pdl: bool, **gemv):
    """Launches the kernel; returns Triton's handle of it (registers and spills: the benchmark reports them)."""
    if cfg.mma:  # quant_mma_int4: the GEMV's prepared rows on the INT8 tensor cores (one matrix, no GLU)
        given = {k for k, v in gemv.items() if v is not None}
        assert q2 is None and not {"x2", "prepare_out", "workspace", "fold"} & given, "one matrix, no GLU or fold"
        if isinstance(x, torch.Tensor):
            x = quant_gemv.launch_input(x, q, compute)
        return quant_mma_int4.launch(x, q, out, cfg, pdl, counters=gemv.get("counters"), clear=gemv.get("clear"))
    if cfg.gemv:
        return quant_gemv.launch(x, q, q2, out, cfg, compute, pdl, **gemv)
    if cfg.dp4a8 and cfg.ws:
        return quant_gemv_int8_ws.launch(x, q, q2, out, cfg, compute, pdl)
    if cfg.dp4a8:
        return quant_gemv_int8.launch(x, q, q2, out, cfg, compute, pdl)
    if cfg.w4a8 and cfg.lut_mma:
        return quant_gemv_w4a8_mma.launch(x, q, q2, out, cfg, compute, pdl)
    if cfg.w4a8 and cfg.ws:
        return quant_gemv_w4a8_ws.launch(x, q, q2, out, cfg, compute, pdl)
    if cfg.w4a8:
        return quant_gemv_w4a8.launch(x, q, q2, out, cfg, compute, pdl)
    m, k = x.shape
    assert k == q.k and x.stride(1) == 1
    glu = q2 is not None
    q2 = q2 or q
    k_iters = triton.cdiv(k, cfg.block_k)
    per_split = triton.cdiv(k_iters, cfg.splits)
    even_k = k % cfg.block_k == 0 and k_iters % cfg.splits == 0
    tile_scale = q.group % cfg.block_k == 0
    stride_os = 0 if glu or out.dim() == 2 else out.stride(0)
    common = dict(GROUP=q.group, A8=q.act != ACT_NONE, HAS_PQS=q.pqs is not None, GLU=glu, EVEN_M=m == cfg.block_m,
                  EVEN_K=even_k, MASKED_X=not (m == cfg.block_m and even_k), TILE_SCALE=tile_scale,
                  COMPUTE=tl_dtype(compute), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PDL=pdl,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl)
    dummy = out

    def opt(t):
        return t if t is not None else dummy

    if q.int4:
        assert cfg.block_n % 32 == 0 and q.n % 2 == 0
        magic, offset = _magic(compute)
        grid = (triton.cdiv(q.n // 2, cfg.block_n // 2), 1 if glu else cfg.splits)
        return _int4_kernel[grid](
            x, q.weight, q.scales, opt(q.pqs), opt(q.act_q), opt(q.out_scale),
            q2.weight, q2.scales, opt(q2.pqs), opt(q2.act_q), opt(q2.out_scale),
            out, m, q.n, k, q.scales.shape[0], per_split,
            x.stride(0), q.weight.stride(0), q.scales.stride(0), q.scales.stride(1), stride_os, out.stride(-2),
            EVEN_N=(q.n // 2) % (cfg.block_n // 2) == 0, MAGIC=magic, OFFSET=offset, **common,
        )
    else:
        grid = (triton.cdiv(q.n, cfg.block_n), 1 if glu else cfg.splits)
        return _int8_kernel[grid](
            x, q.weight, q.scales, opt(q.pqs), opt(q.act_q),
            q2.weight, q2.scales, opt(q2.pqs), opt(q2.act_q),
            out, m, q.n, k, per_split,
            x.stride(0), q.weight.stride(0), q.scales.stride(0) if q.scales.dim() == 2 else 0, stride_os,
            out.stride(-2), EVEN_N=q.n % cfg.block_n == 0, **common,
        )


def quant_partials(x, q: QuantWeight, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype,
                   pdl: bool = False, **gemv):
    """``out[s] = x[:, K_s] W[:, K_s]^T`` per split s of K with W as ``q`` defines it; ``out`` [splits, M, N] float32.

    ``x``: [M, K] in the compute dtype, before the pre-quant scale and the activation quantizer (applied here);
    for quant_gemv's configs it may instead be the input its producer prepared (``gemv_input.Prepared``), ``out``
    int64 accumulators [1, N] that the GEMV adds its splits into (``fixed_sum``), and ``counters`` makes the
    GEMV sum its splits into ``out[0]`` (``quant_gemv.launch``).
    """
    if cfg.gemv and fixed_sum.is_accumulator(out):
        assert out.shape[-1] >= q.n
    elif cfg.splits > 1 or out.dim() == 3:
        assert out.shape[0] >= cfg.splits
    return _launch(x, q, None, out, cfg, compute, pdl, **gemv)


def quant_glu(x, fc: QuantWeight, gate: QuantWeight, out: torch.Tensor, cfg: LinearConfig,
              compute: torch.dtype, pdl: bool = False, **gemv):
    """``out = silu(x W_fc^T) * (x W_gate^T)`` in the compute dtype; each matrix applies its own input scales.
    quant_gemv's configs also take ``x2`` (the gate's prepared input, ``x`` the fc's), ``prepare_out``, and
    ``counters`` with ``workspace`` to split K (``quant_gemv.launch``)."""
    assert fc.fmt == gate.fmt and fc.group == gate.group and fc.scales.stride() == gate.scales.stride()
    assert fc.weight.stride() == gate.weight.stride() and (fc.pqs is None) == (gate.pqs is None)
    # the GEMV may split K (its last program per row tile finishes the SiLU); the dot kernels do not
    return _launch(x, fc, gate, out, cfg if cfg.gemv else dataclasses.replace(cfg, splits=1), compute, pdl, **gemv)
