"""A batch-invariant GEMM: ``y = x W^T (+ bias)`` where a row's output bits do not depend on M or on the other rows.

Why (issue 31): greedy outputs with the prefix cache must equal those without, but cuBLAS picks its algorithm, tiles
and split-K by shape, so the same token's row summed in a GEMM of another M rounds differently. The batch-invariant
runtime mode routes every linear layer of the eager forward, and the logits, through ``gemm`` instead. Hence:

- one launch shape per (x dtype, weight dtype, out dtype) (``launch_config``), never chosen by M, N or K: BLOCK_K
  sets the order of a row's sums and BLOCK_M / BLOCK_N / warps / stages set the MMA instruction and its layouts;
- the K loop runs from 0 up in BLOCK_K steps into one float32 accumulator per output: no split-K, no stream-K;
- M is passed unspecialized (``do_not_specialize``): Triton makes an int argument equal to 1 a constant (and notes
  divisibility by 16), which would compile M = 1 (decode) as another kernel. N and K stay specialized: they are
  fixed per layer. Rows past M and columns past N are read as copies of the last row / column (clamped indices,
  never stored) rather than masked, so the loads are the same for every M too; a row of the MMA never mixes with
  another row, so what sits in the tile's other rows (copies, other tokens) changes none of a row's bits;
- floating-point contraction is off (``enable_fp_fusion=False``). Not needed for invariance (the epilogue is the
  same instructions for every row and M), but with it the output is exactly ``round(fl(fl(acc * s) + bias))``,
  the rounding a float64 reference's bound assumes, and the same whichever LLVM / ptxas contracts what.

E4M3 weights (``model.Linear``'s fp8 format, per-tensor ``w_scale``): a compute-dtype x is first quantized by
``quantize`` (one elementwise pass, bit-identical to ``model.quantize_fp8``: ``x * inv`` in float32, saturated to
+-448, rounded to nearest even to E4M3), then FP8 x FP8 on the FP8 tensor cores. The tensor cores' FP8 accumulator
keeps only ~14 bits (DeepSeek-V3's report, section 3.3.2), and Triton's default on sm_90 lets the whole K run in it
(as ``torch._scaled_mm(use_fast_accum=True)``); here each K tile's products are summed there (from 0) and added to
the float32 accumulator with an ordinary add (``max_num_imprecise_acc=BLOCK_K``), as cuBLAS without fast
accumulation (``_scaled_mm``'s default) promotes. The epilogue is ``acc * (x_scale * w_scale)`` (the two float32
scales multiplied first, once, then the sum by their product), ``+ bias`` in float32, rounded once to ``out_dtype``:
``torch._scaled_mm(xq, W.t(), x_scale, w_scale, bias, out_dtype)``'s definition. cuBLAS's own order of the scale
multiplications is not documented, so outputs may differ from its in the last bit; invariance is the requirement.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from trtllm_pipeline.runtimes.torch_engine.cuda.support import interpreting

FP8 = torch.float8_e4m3fn
COMPUTE_DTYPES = (torch.bfloat16, torch.float16)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
QUANT_BLOCK = 1024  # elements a program of the quantization pass


class LaunchConfig(NamedTuple):
    block_m: int  # the MMA's M: >= 64 on Hopper, so every M (1 included) runs the same wgmma instruction
    block_n: int
    block_k: int  # the K step: part of every output's rounding (and FP8's promotion interval)
    warps: int
    stages: int
    group_m: int = 8  # row tiles per band of the launch order (L2 reuse of a band's weight tiles); no effect on bits
    # FP8: each K tile's sum promoted to the float32 accumulator (cuBLAS without fast accumulation, _scaled_mm's
    # default); False: the whole K in the tensor cores' FP8 accumulator (use_fast_accum=True; faster: no wait for
    # the MMAs before the adds each K tile, which ptxas injects, C7517). Invariant either way.
    promote: bool = True


# Not timed yet (no GPU in this session: benchmarks/invariant_gemm.py times them). Chosen from Triton's Hopper
# tutorials and cuBLAS's usual 128 x 128 tiles: two warpgroups of m64 wgmma on a 128-row tile, 64 float32
# accumulators a thread (FP8: 64 more for the promoted partial sums), 128 bytes of K per row and stage (one 128-byte
# swizzled shared-memory row: BF16 64, E4M3 128 elements), 4 stages of 32 KB (A 16 KB + B 16 KB) = 128 KB of the
# SM's 228 KB, which leaves room for the epilogue's layout conversion (a 128 x 128 float32 tile, 64 KB, for the
# logits). 128 x 128 rather than 128 x 256: the 7B's narrow layers (N 3584, 4608) get 28-36 column tiles, so at
# prefill sizes (M 2048: 16 row tiles) 448-576 tiles fill 132 SMs in ~3.5-4.5 waves instead of 1.7-2.2 with a
# ragged last one. The same tile for the float32 output (lm_head): the main loop is the BF16 one.
BF16_CONFIG = LaunchConfig(block_m=128, block_n=128, block_k=64, warps=8, stages=4)
FP8_CONFIG = LaunchConfig(block_m=128, block_n=128, block_k=128, warps=8, stages=4)


def launch_config(x_dtype: torch.dtype, w_dtype: torch.dtype, out_dtype: torch.dtype) -> LaunchConfig:
    """The one launch shape for these dtypes (``x_dtype``: the input as given; a compute-dtype input of an E4M3
    weight is quantized first and runs the FP8 shape). Raises ValueError for a combination ``gemm`` does not take."""
    _check_dtypes(x_dtype, w_dtype, out_dtype)
    return FP8_CONFIG if w_dtype == FP8 else BF16_CONFIG


def _check_dtypes(x_dtype: torch.dtype, w_dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"the invariant GEMM writes bfloat16, float16 or float32, not {out_dtype}")
    if w_dtype == FP8:
        if x_dtype not in (FP8, *COMPUTE_DTYPES):
            raise ValueError(f"an E4M3 weight takes float8_e4m3fn, bfloat16 or float16 input, not {x_dtype}")
    elif w_dtype in COMPUTE_DTYPES:
        if x_dtype != w_dtype:
            raise ValueError(f"a {w_dtype} weight takes {w_dtype} input, not {x_dtype}")
    else:
        raise ValueError(f"the invariant GEMM takes bfloat16, float16 or float8_e4m3fn weights, not {w_dtype}")


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, inv_ptr, n, BLOCK: tl.constexpr):
    """``model.quantize_fp8`` elementwise: float32 ``x * inv``, clamped to +-448 (NaN kept, as torch's clamp keeps
    it), rounded to nearest even E4M3."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    x = tl.load(x_ptr + offs, mask=live, other=0.0)
    y = tl.clamp(x.to(tl.float32) * tl.load(inv_ptr), -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
    tl.store(q_ptr + offs, y.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=live)


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(x_ptr, w_ptr, out_ptr, bias_ptr, x_scale_ptr, w_scale_ptr, M, N, K, stride_xm, stride_wn,
                 stride_om, HAS_BIAS: tl.constexpr, FP8_DOT: tl.constexpr, EVEN_K: tl.constexpr,
                 PROMOTE: tl.constexpr, OUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # (row tile, column tile): bands of GROUP_M row tiles walk the columns together. Which program computes a tile
    # depends on M; what the tile computes does not.
    pid = tl.program_id(0)
    m_tiles = tl.cdiv(M, BLOCK_M)
    band = GROUP_M * tl.cdiv(N, BLOCK_N)
    first = (pid // band) * GROUP_M
    rows = tl.minimum(m_tiles - first, GROUP_M)
    pid_m = first + (pid % band) % rows
    pid_n = (pid % band) // rows

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Past M / N: the last row / column again (read, never stored), so no load depends on M through a mask.
    # int64 offsets: M x K and N x K pass 2^31 at long prompts and the vocabulary.
    x_ptrs = x_ptr + tl.minimum(rm, M - 1).to(tl.int64)[:, None] * stride_xm + rk[None, :]
    w_ptrs = w_ptr + tl.minimum(rn, N - 1).to(tl.int64)[:, None] * stride_wn + rk[None, :]
    # (K > 0, as gemm checks: without it LLVM keeps a zero-trip path that zeroes the accumulator outside the loop,
    # and ptxas serializes the wgmmas over it: C7515, seen with the float32 output)
    tl.assume(K > 0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):  # from 0 up, every row's sums in the same order
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:  # (K fixed per layer: the same masks for every M) the tail tile's missing K read as 0
            live = rk[None, :] < K - k
            a = tl.load(x_ptrs, mask=live, other=0.0)
            b = tl.load(w_ptrs, mask=live, other=0.0)
        if FP8_DOT and PROMOTE:  # a K tile's products in the FP8 accumulator from 0, then one float32 add
            acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=BLOCK_K)
        else:
            acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    if FP8_DOT:  # the scales' product first (float32), then the sums by it
        acc = acc * (tl.load(x_scale_ptr) * tl.load(w_scale_ptr))
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + tl.minimum(rn, N - 1)).to(tl.float32)[None, :]
    keep = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :], acc.to(OUT), mask=keep)


_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def _scalar(value: torch.Tensor | float, name: str, device: torch.device) -> torch.Tensor:
    """A per-tensor scale as the kernel reads it: one float32 element on ``device``."""
    if not isinstance(value, torch.Tensor):
        return torch.tensor([float(value)], dtype=torch.float32, device=device)
    if value.numel() != 1 or value.dtype != torch.float32 or value.device != device:
        raise ValueError(f"{name} must be one float32 element on {device}, not {value.dtype} "
                         f"{tuple(value.shape)} on {value.device}")
    return value.reshape(1)


def _check_device(*tensors: torch.Tensor) -> None:
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        raise ValueError(f"all tensors must be on one device, not {sorted({str(t.device) for t in tensors})}")
    if device.type != "cuda" and not interpreting():
        raise ValueError(f"the invariant GEMM runs on CUDA (or Triton's interpreter), not {device}")


def quantize(x: torch.Tensor, x_inv: torch.Tensor | float) -> torch.Tensor:
    """``model.quantize_fp8(x, x_inv)`` in one launch: E4M3 of ``x`` (bfloat16 / float16 / float32, any shape) times
    the float32 inverse scale, saturated at +-448. Elementwise, so a row's bytes never depend on the other rows."""
    if x.dtype not in (*COMPUTE_DTYPES, torch.float32):
        raise ValueError(f"quantize takes bfloat16, float16 or float32, not {x.dtype}")
    _check_device(x)
    inv = _scalar(x_inv, "x_inv", x.device)
    x = x.contiguous()
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    if x.numel():
        _quantize_kernel[(triton.cdiv(x.numel(), QUANT_BLOCK),)](x, q, inv, x.numel(), BLOCK=QUANT_BLOCK)
    return q


def gemm(x: torch.Tensor, weight: torch.Tensor, *, bias: torch.Tensor | None = None,
         x_scale: torch.Tensor | float | None = None, w_scale: torch.Tensor | float | None = None,
         x_inv: torch.Tensor | float | None = None, out_dtype: torch.dtype, out: torch.Tensor | None = None,
         config: LaunchConfig | None = None) -> torch.Tensor:
    """``x W^T (+ bias)`` as [..., N] ``out_dtype``, each row's bits independent of the rows computed with it.

    ``x``: [..., K], K a multiple of 16, contiguous along K (other layouts are copied). ``weight``: [N, K] rows
    contiguous along K, as ``model.Linear.weight`` stores it.

    - bfloat16 / float16 weight: ``x`` of the same dtype; float32 sums of the exact products, ``+ bias`` in float32,
      rounded once to ``out_dtype`` (the compute dtype, or float32 for logits: not rounded at all).
    - float8_e4m3fn weight (``Linear``'s fp8): ``x_scale`` and ``w_scale`` the per-tensor float32 scales (tensors of
      one element on x's device, as ``Linear.a_scale`` / ``w_scale``, or Python floats). ``x`` E4M3 (already
      quantized with x_scale), or bfloat16 / float16 quantized here as ``model.quantize_fp8(x, x_inv)`` does
      (``x_inv`` defaults to ``1.0 / x_scale``, which is how ``Linear.a_inv`` is made); then ``acc * (x_scale *
      w_scale) + bias`` in float32, rounded once to ``out_dtype``: ``torch._scaled_mm``'s definition.

    ``bias``: [N] of any float dtype (added as float32), or None. ``out``: an [M, N] ``out_dtype`` buffer, rows
    contiguous, to write into (M: the rows of ``x``). ``config``: another launch shape (a check's or a benchmark's;
    it changes the outputs' rounding: an engine keeps ``launch_config``'s). Refuses (ValueError) what it does not
    compute.
    """
    if x.dim() < 1 or weight.dim() != 2:
        raise ValueError(f"x must be [..., K] and weight [N, K], not {tuple(x.shape)} and {tuple(weight.shape)}")
    _check_dtypes(x.dtype, weight.dtype, out_dtype)
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) is not the weight's K ({k})")
    if k % 16 or k == 0 or n == 0:
        raise ValueError(f"the invariant GEMM needs K a positive multiple of 16 and N > 0, not K {k}, N {n}")
    if weight.stride(1) != 1:
        raise ValueError("the weight's rows must be contiguous along K")
    fp8 = weight.dtype == FP8
    if fp8 and (x_scale is None or w_scale is None):
        raise ValueError("an E4M3 weight needs x_scale and w_scale (per-tensor float32)")
    if not fp8 and (x_scale is not None or w_scale is not None or x_inv is not None):
        raise ValueError(f"scales are for an E4M3 weight; a {weight.dtype} weight takes none")
    if fp8 and x.dtype == FP8 and x_inv is not None:
        raise ValueError("x_inv quantizes a compute-dtype input; this x is E4M3 already")
    if bias is not None and (bias.shape != (n,) or not bias.is_floating_point() or bias.dtype == FP8):
        raise ValueError(f"bias must be [{n}] float, not {tuple(bias.shape)} {bias.dtype}")
    m = x.numel() // k
    if out is not None and (out.shape != (m, n) or out.dtype != out_dtype or out.stride(1) != 1
                            or out.device != x.device):
        raise ValueError(f"out must be [{m}, {n}] {out_dtype} on {x.device}, rows contiguous")
    if fp8:
        x_scale, w_scale = _scalar(x_scale, "x_scale", x.device), _scalar(w_scale, "w_scale", x.device)
        if x_inv is not None:
            x_inv = _scalar(x_inv, "x_inv", x.device)
    _check_device(x, weight, *(t for t in (bias, out) if t is not None))
    cfg = config or launch_config(x.dtype, weight.dtype, out_dtype)

    flat = x.reshape(m, k)
    if flat.stride(1) != 1:
        flat = flat.contiguous()
    if fp8 and flat.dtype != FP8:
        flat = quantize(flat, x_inv if x_inv is not None else 1.0 / x_scale)
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=x.device)
    if bias is not None:
        bias = bias.contiguous()
    if m:
        grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
        _gemm_kernel[grid](
            flat, weight, out, bias if bias is not None else out, x_scale if fp8 else out, w_scale if fp8 else out,
            m, n, k, flat.stride(0), weight.stride(0), out.stride(0), HAS_BIAS=bias is not None, FP8_DOT=fp8,
            PROMOTE=cfg.promote, EVEN_K=k % cfg.block_k == 0, OUT=_TL[out_dtype], BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, num_warps=cfg.warps,
            num_stages=cfg.stages, enable_fp_fusion=False)
    return out.reshape(*x.shape[:-1], n)


def trial(w_dtype: torch.dtype, compute: torch.dtype, out_dtype: torch.dtype, device: torch.device) -> str | None:
    """None where ``gemm`` compiles and launches for a ``w_dtype`` weight (an E4M3 one from a ``compute`` input, its
    quantization pass included) on ``device``, else why not: its tiles hold 128 KB of shared memory, which a GPU
    smaller than Hopper's refuses at the first launch; ``runtime.batch_invariant`` is then refused at load, not at
    every request's first step."""
    try:
        x = torch.zeros(1, 16, dtype=compute, device=device)
        w = torch.zeros(16, 16, dtype=compute, device=device).to(w_dtype)
        scales = dict(x_scale=1.0, w_scale=1.0) if w_dtype == FP8 else {}
        gemm(x, w, out_dtype=out_dtype, **scales)
        return None
    except Exception as exc:  # noqa: BLE001 - any refusal (resources, compilation) means: not on this device
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first}"
