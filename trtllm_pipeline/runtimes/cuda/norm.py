"""The residual add and RMSNorm between sublayers, fused with what surrounds them.

One program per row: it reduces the preceding linear's split-K partials, rounds them to the
compute dtype (the eager GEMM's output rounding), adds them to the residual stream (rounded again,
as a bf16 add is), writes the residual back, and emits the RMSNorm of it, FP8-quantized with the
next linear's activation scale when that linear is FP8, and prepared as the INT4 GEMV's input
(``gemv_input``, with each consumer's pre-quant scale) when the next linears take it at batch 1. The
first call of a step gathers the embedding rows instead of adding partials.

At batch 1 the INT4 GEMV that produces the row (attention.dense, mlp.proj) can run all of this as its tail
instead (``NormTail``, ``gemv_tail``): its last program, once every row tile has summed its splits, so that the
next GEMV follows it directly in the PDL chain (a small kernel between two GEMVs costs the chain their
overlap, not its work: docs/perf-notes.md, runs 83-89).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.cuda.gemv_input import Prepared, scaled_input, store_planes
from trtllm_pipeline.runtimes.cuda.linear import tl_dtype


@triton.jit
def _residual_rmsnorm_kernel(
    x_ptr, part_ptr, tok_ptr, emb_ptr, w_ptr, out_ptr, out_inv_ptr, pqs_a_ptr, prep_a_ptr, pqs_b_ptr, prep_b_ptr,
    stride_x, stride_ps, stride_pb, stride_emb, stride_out, stride_prep,
    HIDDEN, eps,
    PARTS: tl.constexpr, EMBED: tl.constexpr, QUANT_OUT: tl.constexpr, PREPARE: tl.constexpr, PQS_A: tl.constexpr,
    PQS_B: tl.constexpr, XB: tl.constexpr, COMPUTE: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    b = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < HIDDEN
    # The norm's weight and the consumers' pre-quant scales first: no kernel writes them (so they need not wait
    # under PDL), and loaded with the partials their DRAM latency is not added after the reduction (H200, 7B
    # INT4 step without PDL: the 57 norms 192 -> 153 us, run 80)
    w, pqs_a, pqs_b = _params(w_ptr, pqs_a_ptr, pqs_b_ptr, cols, ok, PREPARE, PQS_A, PQS_B)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    if EMBED:
        token = tl.load(tok_ptr + b)
        x = tl.load(emb_ptr + token * stride_emb + cols, mask=ok, other=0.0).to(tl.float32)
    else:
        y = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in tl.static_range(PARTS):
            y += tl.load(part_ptr + s * stride_ps + b * stride_pb + cols, mask=ok, other=0.0)
        x = add_residual(x_ptr + b * stride_x, y, cols, ok, COMPUTE)
    norm_out(x, w, pqs_a, pqs_b, x_ptr + b * stride_x, out_ptr + b * stride_out, out_inv_ptr,
             prep_a_ptr + b * stride_prep, prep_b_ptr + b * stride_prep, cols, ok, HIDDEN, eps, QUANT_OUT, PREPARE,
             PQS_A, PQS_B, XB, COMPUTE, BLOCK)


@triton.jit
def add_residual(x_ptr, y, cols, ok, COMPUTE: tl.constexpr):
    """The residual stream at ``cols`` plus a linear's float32 output ``y``, rounded as eager rounds them (the
    GEMM's output to the compute dtype, then the bf16 add)."""
    y = y.to(COMPUTE).to(tl.float32)
    x = tl.load(x_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    return (x + y).to(COMPUTE).to(tl.float32)


@triton.jit
def norm_out(x, w, pqs_a, pqs_b, x_ptr, out_ptr, out_inv_ptr, prep_a_ptr, prep_b_ptr, cols, ok, HIDDEN, eps,
             QUANT_OUT: tl.constexpr, PREPARE: tl.constexpr, PQS_A: tl.constexpr, PQS_B: tl.constexpr,
             XB: tl.constexpr, COMPUTE: tl.constexpr, BLOCK: tl.constexpr):
    """One row's new residual ``x`` (float32 [BLOCK] at ``cols``, the whole row) written back, and its RMSNorm
    times ``w`` to ``out`` (FP8 with QUANT_OUT) and to PREPARE consumers' GEMV inputs. No ``arange``: the
    fused GEMVs (Triton and Gluon) run it as their last program's tail."""
    tl.store(x_ptr + cols, x.to(COMPUTE), mask=ok)
    rstd = tl.math.rsqrt(tl.sum(x * x, 0) / HIDDEN + eps)
    h = ((x * rstd).to(COMPUTE).to(tl.float32) * w.to(tl.float32)).to(COMPUTE)
    if QUANT_OUT:
        q = tl.clamp(h.to(tl.float32) * tl.load(out_inv_ptr), -448.0, 448.0)
        tl.store(out_ptr + cols, q.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=ok)
    else:
        tl.store(out_ptr + cols, h, mask=ok)
    if PREPARE >= 1:  # the next INT4 GEMVs' inputs (mlp.fc and mlp.gate have pre-quant scales of their own)
        store_planes(scaled_input(h, pqs_a, ok, PQS_A, COMPUTE), cols, HIDDEN, prep_a_ptr, BLOCK, XB)
    if PREPARE == 2:
        store_planes(scaled_input(h, pqs_b, ok, PQS_B, COMPUTE), cols, HIDDEN, prep_b_ptr, BLOCK, XB)


@triton.jit
def gemv_tail(out_ptr, x_ptr, w_ptr, nout_ptr, pqs_a_ptr, prep_a_ptr, pqs_b_ptr, prep_b_ptr, cols, ok, HIDDEN, eps,
              PREPARE: tl.constexpr, PQS_A: tl.constexpr, PQS_B: tl.constexpr, XB: tl.constexpr,
              COMPUTE: tl.constexpr, BLOCK: tl.constexpr):
    """The residual add and RMSNorm of a batch-1 row as the tail of the GEMV that produced it (``NormTail``),
    run by its last program once every row tile has summed its splits into ``out``."""
    w, pqs_a, pqs_b = _params(w_ptr, pqs_a_ptr, pqs_b_ptr, cols, ok, PREPARE, PQS_A, PQS_B)
    y = tl.load(out_ptr + cols, mask=ok, other=0.0, cache_modifier=".cg")  # other SMs' sums: from L2
    x = add_residual(x_ptr, y, cols, ok, COMPUTE)
    norm_out(x, w, pqs_a, pqs_b, x_ptr, nout_ptr, nout_ptr, prep_a_ptr, prep_b_ptr, cols, ok, HIDDEN, eps, False,
             PREPARE, PQS_A, PQS_B, XB, COMPUTE, BLOCK)


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
                     prepared: tuple[Prepared, ...] = (), pdl: bool = False) -> None:
    """``x += sum(partials)`` (or ``x = embedding[tokens]``), then ``out = rmsnorm(x) * weight``.

    ``x``: [B, hidden] residual stream in the compute dtype, updated in place; ``partials``:
    [S, B, >= hidden] float32; ``out``: [B, hidden], FP8 when ``out_inv`` (1 / activation scale) is given;
    ``prepared``: up to two INT4 GEMV inputs to write ``out`` into as well (``gemv_input``).
    """
    batch, hidden = x.shape
    embed = partials is None
    assert len(prepared) <= 2 and all(p.k == hidden and p.block == prepared[0].block for p in prepared)
    a, b = (list(prepared) + [None, None])[:2]
    block = triton.next_power_of_2(hidden)

    def ptr(t):  # a pointer argument the kernel's flags leave unread
        return t if t is not None else x

    _residual_rmsnorm_kernel[(batch,)](
        x, x if embed else partials, tokens if embed else x, embedding if embed else x, weight, out, ptr(out_inv),
        ptr(a and a.pqs), ptr(a and a.planes), ptr(b and b.pqs), ptr(b and b.planes),
        x.stride(0), 0 if embed else partials.stride(0), 0 if embed else partials.stride(1),
        embedding.stride(0) if embed else 0, out.stride(0), a.planes.stride(0) if a else 0,
        hidden, eps,
        PARTS=0 if embed else partials.shape[0], EMBED=embed, QUANT_OUT=out_inv is not None, PREPARE=len(prepared),
        PQS_A=bool(a and a.pqs is not None), PQS_B=bool(b and b.pqs is not None), XB=a.block if a else 16,
        COMPUTE=tl_dtype(compute), BLOCK=block, PDL=pdl, num_warps=default_warps(hidden), launch_pdl=pdl,
    )


def default_warps(hidden: int) -> int:
    """Warps of the one program per row: at batch 1 that program is the whole kernel, reading every split's
    partial row, so it is bound by the loads one SM keeps in flight. 32 warps (4 columns per thread at the
    7B's 3584) against 8: the INT4-AWQ step (28 partials per row) 3.38 -> 3.11 ms on an H200, 16 warps 3.22."""
    return 32 if hidden >= 2048 else 4


@dataclasses.dataclass
class NormTail:
    """``residual_rmsnorm`` of one row (batch 1) for the INT4 GEMV producing its linear output to run as its tail
    (``gemv_tail``): ``residual`` [1, hidden] updated in place, ``out`` [1, hidden] the normed row in the compute
    dtype, ``prepared`` up to two consumers' GEMV inputs, ``done`` an int32 zero counting the GEMV's row tiles
    (left zero)."""

    residual: torch.Tensor
    weight: torch.Tensor
    out: torch.Tensor
    eps: float
    prepared: tuple[Prepared, ...]
    done: torch.Tensor

    @staticmethod
    def launch_args(tail: "NormTail | None", dummy: torch.Tensor, tiles: int, min_block: int = 16) -> tuple[list, dict]:
        """The GEMV kernels' tail arguments: (done, residual, weight, out, pqs_a, prep_a, pqs_b, prep_b, eps) and
        their constexprs for a launch of ``tiles`` row tiles; placeholders and NORM=False without a tail."""
        if tail is None:
            return [dummy] * 8 + [0.0], dict(NORM=False, NORM_TILES=1, NORM_PREPARE=0, NORM_PQS_A=False,
                                             NORM_PQS_B=False, NORM_XB=16, NORM_BLOCK=16)
        hidden = tail.residual.shape[1]
        assert tail.residual.shape[0] == 1 and len(tail.prepared) <= 2
        assert all(p.k == hidden and p.block == tail.prepared[0].block for p in tail.prepared)
        a, b = (list(tail.prepared) + [None, None])[:2]

        def ptr(t):
            return t if t is not None else dummy

        return ([tail.done, tail.residual, tail.weight, tail.out, ptr(a and a.pqs), ptr(a and a.planes),
                 ptr(b and b.pqs), ptr(b and b.planes), tail.eps],
                dict(NORM=True, NORM_TILES=tiles, NORM_PREPARE=len(tail.prepared),
                     NORM_PQS_A=bool(a and a.pqs is not None), NORM_PQS_B=bool(b and b.pqs is not None),
                     NORM_XB=a.block if a else 16, NORM_BLOCK=max(min_block, triton.next_power_of_2(hidden))))
