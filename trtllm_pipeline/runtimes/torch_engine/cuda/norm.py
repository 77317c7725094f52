"""The residual add and RMSNorm between sublayers, fused with what surrounds them.

One program per row: it reduces the preceding linear's split-K partials (or reads their exact sum from the
linear's int64 accumulators, ``fixed_sum``), rounds them to the compute dtype (the eager GEMM's output
rounding), adds them to the residual stream (rounded again, as a bf16 add is), writes the residual back, and
emits the RMSNorm of it, FP8-quantized with the next linear's activation scale when that linear is FP8, times the
next linears' AWQ pre-quant scale when their GEMM takes it so (``scale_out``), and prepared as the INT4 GEMV's input
(``gemv_input``, with each consumer's pre-quant scale) when the next linears take it at batch 1. The first call of
a step gathers the embedding rows instead of adding partials.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import fixed_sum
from trtllm_pipeline.runtimes.torch_engine.cuda.gemv_input import Prepared, scaled_input, store_planes
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import tl_dtype


@triton.jit
def _residual_rmsnorm_kernel(
    x_ptr, x_out_ptr, part_ptr, tok_ptr, emb_ptr, w_ptr, out_ptr, out_inv_ptr, pqs_a_ptr, prep_a_ptr, pqs_b_ptr,
    prep_b_ptr, pqs_out_ptr, out2_ptr, pqs_out2_ptr,
    stride_x, stride_ps, stride_pb, stride_emb, stride_out, stride_prep,
    HIDDEN, eps,
    PARTS: tl.constexpr, FIXED: tl.constexpr, EMBED: tl.constexpr, QUANT_OUT: tl.constexpr, PREPARE: tl.constexpr,
    PQS_A: tl.constexpr,
    PQS_B: tl.constexpr, SCALE_OUT: tl.constexpr, XB: tl.constexpr, COMPUTE: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    b = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < HIDDEN
    # The norm's weight and the consumers' pre-quant scales first: no kernel writes them (so they need not wait
    # under PDL), and loaded with the partials their DRAM latency is not added after the reduction (H200, 7B
    # INT4 step without PDL: the 57 norms 192 -> 153 us, run 80)
    w, pqs_a, pqs_b = _params(w_ptr, pqs_a_ptr, pqs_b_ptr, cols, ok, PREPARE, PQS_A, PQS_B)
    pqs_out = 1.0
    pqs_out2 = 1.0
    if SCALE_OUT >= 1:
        pqs_out = tl.load(pqs_out_ptr + cols, mask=ok, other=0.0)
    if SCALE_OUT == 2:
        pqs_out2 = tl.load(pqs_out2_ptr + cols, mask=ok, other=0.0)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    if EMBED:
        token = tl.load(tok_ptr + b)
        x = tl.load(emb_ptr + token * stride_emb + cols, mask=ok, other=0.0).to(tl.float32)
    else:
        y = fixed_sum.summed(part_ptr + b * stride_pb, stride_ps, cols, ok, PARTS, FIXED)
        y = y.to(COMPUTE).to(tl.float32)
        x = tl.load(x_ptr + b * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        x = (x + y).to(COMPUTE).to(tl.float32)
    tl.store(x_out_ptr + b * stride_x + cols, x.to(COMPUTE), mask=ok)
    rstd = tl.math.rsqrt(tl.sum(x * x, 0) / HIDDEN + eps)
    h = ((x * rstd).to(COMPUTE).to(tl.float32) * w.to(tl.float32)).to(COMPUTE)
    if QUANT_OUT:
        q = tl.clamp(h.to(tl.float32) * tl.load(out_inv_ptr), -448.0, 448.0)
        tl.store(out_ptr + b * stride_out + cols, q.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=ok)
    elif SCALE_OUT >= 1:  # the GEMM's own product and rounding (quant_linear.act_apply), made once here
        tl.store(out_ptr + b * stride_out + cols, scaled_input(h, pqs_out, ok, True, COMPUTE).to(COMPUTE), mask=ok)
        if SCALE_OUT == 2:  # (mlp.gate's, where its scale is not mlp.fc's)
            tl.store(out2_ptr + b * stride_out + cols, scaled_input(h, pqs_out2, ok, True, COMPUTE).to(COMPUTE),
                     mask=ok)
    else:
        tl.store(out_ptr + b * stride_out + cols, h, mask=ok)
    if PREPARE >= 1:  # the next INT4 GEMVs' inputs (mlp.fc and mlp.gate have pre-quant scales of their own)
        store_planes(scaled_input(h, pqs_a, ok, PQS_A, COMPUTE), 0, HIDDEN, prep_a_ptr + b * stride_prep, BLOCK, XB)
    if PREPARE == 2:
        store_planes(scaled_input(h, pqs_b, ok, PQS_B, COMPUTE), 0, HIDDEN, prep_b_ptr + b * stride_prep, BLOCK, XB)


@triton.jit
def _params(w_ptr, pqs_a_ptr, pqs_b_ptr, cols, ok, PREPARE: tl.constexpr, PQS_A: tl.constexpr, PQS_B: tl.constexpr):
    """The norm's weight and the pre-quant scales of the consumers it prepares inputs for (1.0: none)."""
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    pqs_a = 1.0
    pqs_b = 1.0
    if PREPARE >= 1 and PQS_A:
        pqs_a = tl.load(pqs_a_ptr + cols, mask=ok, other=0.0)
    if PREPARE == 2 and PQS_B:
        pqs_b = tl.load(pqs_b_ptr + cols, mask=ok, other=0.0)
    return w, pqs_a, pqs_b


def residual_rmsnorm(x: torch.Tensor, partials: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor,
                     out_inv: torch.Tensor | None, eps: float, compute: torch.dtype, *,
                     tokens: torch.Tensor | None = None, embedding: torch.Tensor | None = None,
                     prepared: tuple[Prepared, ...] = (), x_out: torch.Tensor | None = None,
                     scale_out: torch.Tensor | None = None, out2: torch.Tensor | None = None,
                     scale_out2: torch.Tensor | None = None, pdl: bool = False) -> None:
    """``x += sum(partials)`` (or ``x = embedding[tokens]``), then ``out = rmsnorm(x) * weight``.

    ``x``: [B, hidden] residual stream in the compute dtype, updated in place (or written to ``x_out``, laid out
    as ``x``); ``partials``: [S, B, >= hidden]
    float32, or int64 accumulators [B, >= hidden] (``fixed_sum``); ``out``: [B, hidden], FP8 when ``out_inv``
    (1 / activation scale) is given; ``prepared``: up to two INT4 GEMV inputs to write ``out`` into as well
    (``gemv_input``); ``scale_out``: [hidden] compute dtype, the next linears' pre-quant scale, ``out`` written
    times it (rounded to the compute dtype, as their GEMM would: it then takes no scale of its own); ``out2``
    (laid out as ``out``) the same times ``scale_out2``, for a second consumer with a scale of its own.
    """
    batch, hidden = x.shape
    embed = partials is None
    fixed = False
    if not embed:
        partials, fixed = fixed_sum.as_partials(partials)
    assert len(prepared) <= 2 and all(p.k == hidden and p.block == prepared[0].block for p in prepared)
    a, b = (list(prepared) + [None, None])[:2]
    block = triton.next_power_of_2(hidden)

    def ptr(t):  # a pointer argument the kernel's flags leave unread
        return t if t is not None else x

    assert x_out is None or x_out.shape == x.shape and x_out.stride() == x.stride()
    assert scale_out is None or out_inv is None and not prepared  # (FP8 linears and the GEMV take no such input)
    assert (out2 is None) == (scale_out2 is None) and (out2 is None or scale_out is not None and
                                                       out2.shape == out.shape and out2.stride() == out.stride())
    _residual_rmsnorm_kernel[(batch,)](
        x, x if x_out is None else x_out, x if embed else partials, tokens if embed else x,
        embedding if embed else x, weight, out, ptr(out_inv), ptr(a and a.pqs), ptr(a and a.planes),
        ptr(b and b.pqs), ptr(b and b.planes), ptr(scale_out), ptr(out2), ptr(scale_out2),
        x.stride(0), 0 if embed else partials.stride(0), 0 if embed else partials.stride(1),
        embedding.stride(0) if embed else 0, out.stride(0), a.planes.stride(0) if a else 0,
        hidden, eps,
        PARTS=0 if embed else partials.shape[0], FIXED=fixed, EMBED=embed, QUANT_OUT=out_inv is not None,
        PREPARE=len(prepared),
        PQS_A=bool(a and a.pqs is not None), PQS_B=bool(b and b.pqs is not None),
        SCALE_OUT=0 if scale_out is None else 1 if out2 is None else 2,
        XB=a.block if a else 16,
        COMPUTE=tl_dtype(compute), BLOCK=block, PDL=pdl, num_warps=default_warps(hidden), launch_pdl=pdl,
    )


def default_warps(hidden: int) -> int:
    """Warps of the one program per row: at batch 1 that program is the whole kernel, reading every split's
    partial row, so it is bound by the loads one SM keeps in flight. 32 warps (4 columns per thread at the
    7B's 3584) against 8: the INT4-AWQ step (28 partials per row) 3.38 -> 3.11 ms on an H200, 16 warps 3.22."""
    return 32 if hidden >= 2048 else 4
