"""Weight-streaming linear layers for decode: ``x W^T`` at small M (the batch), W read once at bandwidth.

At M <= 64 a decode GEMM is a pass over the weight matrix with a few rows of activations riding
along, so what matters is keeping enough weight loads in flight on every multiprocessor. Each
program owns BLOCK_N output features and a contiguous slice of K ("split-K"), so a matrix with few
output tiles (attention.dense: 56 tiles of 64) still spreads over all 132 SMs of an H200; the
splits' float32 partial sums go to a workspace that the next fused kernel reduces (with the residual
add and RMSNorm, or as the attention kernel's Q/K/V input). Every output element is written by one
program in a fixed order, so results are deterministic (no atomics).

The dot is computed "swapped" (W tile as the left operand, X^T as the right): the weight tile fills
the tensor core's M dimension and the few activation rows pad its N dimension, the layout the FP8
tensor cores accept (both operands K-major). FP8 layers take activations already quantized with the
layer's static per-tensor scale (ModelOpt's W8A8 FP8), so the product is FP8 x FP8 with a float32
accumulator, scaled once by ``activation_scale * weight_scale``: TensorRT-LLM's FP8 GEMM.

Measured on an H200 (docs/perf-notes.md): computing the RMSNorm inside the consuming linear and
dropping split-K so the residual add could live in the epilogue was 2x slower at batch 1 (long
serial K loops per program, extra loads on the critical path), so the norm stays a kernel of its own.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@dataclasses.dataclass(frozen=True)
class LinearConfig:
    """Tile shape, split count and launch parameters of one linear kernel launch."""

    block_m: int
    block_n: int
    block_k: int
    splits: int = 1
    num_warps: int = 4
    num_stages: int = 3
    gemv: bool = False  # quant_gemv's CUDA-core matrix-vector kernel (INT4-AWQ at batch 1), not the dot
    tma: bool = False  # the GEMV's weight tiles by the bulk tensor copy engine, num_stages deep (Hopper)
    ws: bool = False  # with tma: the warp-specialized GEMV (quant_gemv_ws: one warp copies, four compute)
    gemm: bool = False  # quant_gemm's tensor-core GEMM (4/8-bit weights at M > 1, prefill)
    swap: bool = False  # with gemm: the weight tile on the MMA's M side, the input rows on its N side
    # with gemm: INT4-AWQ's group scale on each weight, not on the tile's dot result (quant_gemm's GEMM; with lut_mma
    # and made, quant_rows_int4_mma's wide form)
    scale_weights: bool = False
    library: bool = False  # BF16 / FP8 at large batches: cuBLAS (F.linear, torch._scaled_mm), not this module's kernels
    dp4a8: bool = False  # quant_gemv_int8's dp4a matrix-vector kernel (INT8 SmoothQuant at batch 1)
    w4a8: bool = False  # quant_gemv_w4a8's table-lookup dp4a matrix-vector kernel (W4A8-AWQ at batch 1)
    mma: bool = False  # with gemv: quant_mma_int4's INT8 tensor-core linear on the GEMV's prepared rows (M 2-16)
    ptx_nibbles: bool = False  # with gemm (INT4, W4A8): nibbles unpacked and scaled by PTX (quant_gemm._w4_operands)
    # with w4a8 and ws: quant_gemv_w4a8_mma (E4M3 bytes by table lookup into FP8 wgmma); with gemm: the wgmma row
    # kernels, the rows as the MMA's N (quant_gemm.ROW_KERNELS: quant_rows_int4_mma, INT4-AWQ dequantized in registers
    # into bfloat16 wgmma; quant_rows_w4a8_mma, quant_gemv_w4a8_mma's lookup; quant_rows_int8_mma, SmoothQuant's
    # weights from shared memory; quant_rows_int8wo_mma, weight-only's int8 made float16 in registers)
    lut_mma: bool = False
    # with lut_mma and gemm: the input rows made once a launch (made_input) and copied beside the weights by the
    # producer warp, not staged by every program (the INT8 row kernels always; the 4-bit row kernels from
    # support.staged_rows() + 1 rows: their wide form)
    made: bool = False
    # with lut_mma and gemm, not made: each program loads its input rows one K tile ahead, W4A8's MMA chains issued
    # before one wait (support.staged_prefetch)
    prefetch: bool = False


def pick_config(m: int, n: int, k: int, weight_bytes: int, sm_count: int, *, glu: bool = False,
                splits: int | None = None) -> LinearConfig:
    """A tile shape that streams the weight at bandwidth on Hopper (swept on an H200: perf notes).

    128 bytes of K per row and tile with three stages (small enough that several programs share an
    SM) and about four programs per SM: latency is hidden by programs in flight. Within 5% of the
    best of 11 shapes x 3 split counts for every 7B linear at batch 1 and 32.
    """
    block_m = max(16, triton.next_power_of_2(m))
    block_k = 128 // weight_bytes
    block_n = 64
    tiles = triton.cdiv(n, block_n)
    if splits is None:
        splits = 1 if glu else max(1, min(triton.cdiv(k, block_k) // 4, round(4 * sm_count / tiles)))
    return LinearConfig(block_m, block_n, block_k, splits, 4, 3)


@triton.jit
def _linear_partials_kernel(
    x_ptr, w_ptr, out_ptr, scale_ptr,
    M, N, K, k_iters_per_split,
    stride_xm, stride_wn, stride_os, stride_om,
    HAS_SCALE: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # launched early, behind the previous kernel: wait until its writes are visible
        gdc_wait()
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    k0 = pid_s * k_iters_per_split * BLOCK_K
    w_ptrs = w_ptr + rn[:, None] * stride_wn + (k0 + rk)[None, :]
    x_ptrs = x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :]
    n_ok = rn[:, None] < N
    m_ok = rm[:, None] < M
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for i in range(k_iters_per_split):
        if EVEN_K:
            w = tl.load(w_ptrs) if EVEN_N else tl.load(w_ptrs, mask=n_ok, other=0.0)
            x = tl.load(x_ptrs) if EVEN_M else tl.load(x_ptrs, mask=m_ok, other=0.0)
        else:
            k_ok = (k0 + i * BLOCK_K + rk)[None, :] < K
            w = tl.load(w_ptrs, mask=n_ok & k_ok, other=0.0)
            x = tl.load(x_ptrs, mask=m_ok & k_ok, other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if HAS_SCALE:
        acc = acc * tl.load(scale_ptr)
    out = out_ptr + pid_s * stride_os + rm[None, :] * stride_om + rn[:, None]
    tl.store(out, acc, mask=(rn[:, None] < N) & (rm[None, :] < M))


@triton.jit
def last_program(count_ptr, tile, PROGRAMS):
    """Count this program in; True for the last of ``PROGRAMS`` to arrive at counter ``tile``. The barrier orders
    every thread's stores before the release, so the last program sees all the others' stores (it reads them
    from L2: ``cache_modifier=".cg"``) and leaves the counter at zero for the next launch."""
    tl.debug_barrier()
    return tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") == PROGRAMS - 1


@triton.jit
def silu_mul(fc, gate, COMPUTE: tl.constexpr):
    """silu(fc) * gate in the compute dtype, rounded where the eager model rounds (fc, gate and silu(fc))."""
    fc = fc.to(COMPUTE).to(tl.float32)
    gate = gate.to(COMPUTE).to(tl.float32)
    act = (fc * tl.sigmoid(fc)).to(COMPUTE).to(tl.float32)
    return (act * gate).to(COMPUTE)


@triton.jit
def _glu_kernel(
    x_ptr, w_fc_ptr, w_gate_ptr, out_ptr, scale_ptr, out_inv_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_om,
    HAS_SCALE: tl.constexpr, QUANT_OUT: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """silu(x W_fc^T) * (x W_gate^T), rounded as the eager model rounds, quantized for mlp.proj."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    fc_ptrs = w_fc_ptr + rn[:, None] * stride_wn + rk[None, :]
    gate_ptrs = w_gate_ptr + rn[:, None] * stride_wn + rk[None, :]
    x_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :]
    n_ok = rn[:, None] < N
    m_ok = rm[:, None] < M
    acc_fc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            if EVEN_N:
                w_fc = tl.load(fc_ptrs)
                w_gate = tl.load(gate_ptrs)
            else:
                w_fc = tl.load(fc_ptrs, mask=n_ok, other=0.0)
                w_gate = tl.load(gate_ptrs, mask=n_ok, other=0.0)
            x = tl.load(x_ptrs) if EVEN_M else tl.load(x_ptrs, mask=m_ok, other=0.0)
        else:
            k_ok = (k + rk)[None, :] < K
            w_fc = tl.load(fc_ptrs, mask=n_ok & k_ok, other=0.0)
            w_gate = tl.load(gate_ptrs, mask=n_ok & k_ok, other=0.0)
            x = tl.load(x_ptrs, mask=m_ok & k_ok, other=0.0)
        x = tl.trans(x)
        acc_fc = tl.dot(w_fc, x, acc_fc)
        acc_gate = tl.dot(w_gate, x, acc_gate)
        fc_ptrs += BLOCK_K
        gate_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if HAS_SCALE:
        scale = tl.load(scale_ptr)
        acc_fc = acc_fc * scale
        acc_gate = acc_gate * scale
    y = silu_mul(acc_fc, acc_gate, COMPUTE)
    out = out_ptr + rm[None, :] * stride_om + rn[:, None]
    mask = (rn[:, None] < N) & (rm[None, :] < M)
    if QUANT_OUT:
        q = tl.clamp(y.to(tl.float32) * tl.load(out_inv_ptr), -448.0, 448.0)
        tl.store(out, q.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=mask)
    else:
        tl.store(out, y, mask=mask)


def linear_partials(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, out: torch.Tensor,
                    cfg: LinearConfig, pdl: bool = False) -> None:
    """``out[s] = scale * x[:, K_s] W[:, K_s]^T`` for each split s of K; ``out`` is [splits, M, N] float32."""
    m, k = x.shape
    n = weight.shape[0]
    k_iters = triton.cdiv(k, cfg.block_k)
    per_split = triton.cdiv(k_iters, cfg.splits)
    grid = (triton.cdiv(n, cfg.block_n), cfg.splits)
    _linear_partials_kernel[grid](
        x, weight, out, scale if scale is not None else out,
        m, n, k, per_split,
        x.stride(0), weight.stride(0), out.stride(0) if out.dim() == 3 else 0, out.stride(-2),
        HAS_SCALE=scale is not None, EVEN_M=m == cfg.block_m, EVEN_N=n % cfg.block_n == 0,
        EVEN_K=k % cfg.block_k == 0 and k_iters % cfg.splits == 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )


def glu(x: torch.Tensor, w_fc: torch.Tensor, w_gate: torch.Tensor, scale: torch.Tensor | None,
        out_inv: torch.Tensor | None, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype,
        pdl: bool = False) -> None:
    """``out = silu(x W_fc^T) * (x W_gate^T)``, FP8-quantized with ``out_inv`` when given."""
    m, k = x.shape
    n = w_fc.shape[0]
    _glu_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, w_fc, w_gate, out, scale if scale is not None else out, out_inv if out_inv is not None else out,
        m, n, k, x.stride(0), w_fc.stride(0), out.stride(0),
        HAS_SCALE=scale is not None, QUANT_OUT=out_inv is not None, EVEN_M=m == cfg.block_m,
        EVEN_N=n % cfg.block_n == 0, EVEN_K=k % cfg.block_k == 0, COMPUTE=tl_dtype(compute),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch (a kernel starts while the previous one drains) needs SM90+."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def tl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]
