"""A Qwen2 / Llama decoder that executes a TensorRT-LLM checkpoint's tensors directly, in PyTorch.

The math follows the engine TensorRT-LLM builds from the same checkpoint: fused QKV (with bias for Qwen2;
``model/families.py`` holds what differs between families),
GPT-NeoX rotary embedding, grouped-query attention over a KV cache, gated SiLU MLP with
TensorRT-LLM's naming (``fc`` is the activated gate branch, ``gate`` the up projection), RMSNorm.
Quantized layers (``Linear``) follow their format: FP8 quantizes the input with the calibrated
per-tensor activation scale and multiplies by the FP8 weight and its per-tensor scale, on SM89+ GPUs
with ``torch._scaled_mm`` (a real FP8 GEMM); INT4-AWQ, W4A8-AWQ, INT8 SmoothQuant and INT8 weight-only run
on CUDA through ``cuda/quant_gemm``'s tensor-core GEMMs from the stored weights (no dequantized copy is kept on
a GPU); on the CPU, and for NVFP4, they run by emulation: the stored weights dequantized as the format defines
them (INT4 groups with their scales, SmoothQuant and INT8 per-channel scales, NVFP4's two-level scales), the
input multiplied by its pre-quant scale and quantized as the format's activation quantizer does, then a
compute-dtype matmul (on a GPU with the dequantized weight made per call, never kept).
That gives the numbers of ModelOpt's fake-quantized model, up to accumulation order; but INT4-AWQ's group
scales are taken in the compute dtype, as TensorRT-LLM holds them (``Linear.group_scales``: ~1e-3 from the
fake-quantized model's linears).

The KV cache is paged: a pool of blocks ([num_blocks, kv_heads, block_size, head_dim] per layer; a block's
keys of one head are one contiguous run, which is what the decode kernel's tiles read), handed out by
``kv_cache.KVCacheManager``; every call is ``forward(batch)`` with a ``plan.PagedBatch`` (rows of any start
and length packed together, each with its block table): prefill chunks, decodes and scoring are the same code
path. ``forward_contiguous`` keeps the unpaged math (one sequence, no cache) as the reference the paged path
is checked against.

With ``quantization.kv_cache: fp8`` (the checkpoint's ``kv_cache_quant_algo`` FP8, a calibrated
``attention.kv_cache_scaling_factor`` per layer, as TensorRT-LLM's engine and ``trtllm-bench`` keep it) the pool
holds E4M3 keys and values, ``x / scale`` saturated to +-448: half the bytes a token takes, so twice the tokens in
the same memory and half the bytes a decode step's attention reads. Every attention reads keys and values as the
cache holds them (``dequantize_fp8``), the step's own new ones included, so a prompt gives the same numbers
whatever its chunking and whichever path (eager, fused prefill, the fast step) computed it.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.nn.functional as F

from trtllm_pipeline.checkpoint import FORMAT_NAMES, CheckpointLayout
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.torch_engine import switches
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch, row_ancestors
from trtllm_pipeline.model import families

log = logging.getLogger(__name__)

FP8_MAX = 448.0  # largest finite float8_e4m3fn
INT8_MIN, INT8_MAX = -128, 127
NVFP4_BLOCK = 16
# E2M1 (FP4) magnitudes by the low three bits of a nibble (bit 3 is the sign), and the midpoints between
# them: a value on a midpoint rounds to the neighbour with an even mantissa (0.75 -> 1, 1.25 -> 1, ...).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_ROUND_UP = (0.75, 1.75, 3.5)


def quantize_fp8(x: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """Static per-tensor E4M3 quantization in float32, saturating, as ModelOpt's fake quant does."""
    return (x.float() * inv_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """E4M3 values times their float32 ``scale``, rounded to ``dtype``: what an FP8 KV cache's reader sees (the
    decode kernel rounds each loaded key and value the same way before its dots)."""
    return (q.float() * scale).to(dtype)


def fake_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per-tensor E4M3 fake quantization with the checkpoint's ``scale`` (amax / 448), float32, computed
    with ModelOpt's own operations (``x * (448 / amax)``, then ``* (1 / that)``) so exact ties round alike."""
    amax = scale.float() * FP8_MAX
    q_scale = FP8_MAX / amax
    return (x.float() * q_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * (1 / q_scale)


def fake_int8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Static per-tensor INT8 (SmoothQuant activations) with the checkpoint's ``scale`` (amax / 127):
    ``round(x * (127 / amax))`` half to even, [-128, 127], then ``/ (127 / amax)``, as ModelOpt computes it."""
    q_scale = torch.tensor(float(INT8_MAX), device=x.device) / (scale.float() * INT8_MAX)
    return (x.float() * q_scale).round().clamp(INT8_MIN, INT8_MAX) / q_scale


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to the nearest E2M1 value (saturating at +-6), ties to even, as ModelOpt's NVFP4QTensor."""
    a = x.abs()
    bounds = torch.tensor(E2M1_BOUNDS, device=x.device)
    idx = torch.bucketize(a, bounds)  # bounds[i-1] < a <= bounds[i] -> i
    for tie in E2M1_ROUND_UP:
        idx = idx + (a == tie)
    return torch.tensor(E2M1_VALUES, device=x.device)[idx] * torch.where(x < 0, -1.0, 1.0)


def fake_nvfp4(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """NVFP4 activations: per 16 inputs an E4M3 scale (block amax / 6, in units of the calibrated global
    scale), the values rounded to E2M1. float32 in, float32 out (NVFP4QTensor.quantize + dequantize)."""
    blocks = x.float().reshape(*x.shape[:-1], -1, NVFP4_BLOCK)
    scale = blocks.abs().amax(-1, keepdim=True) / (6.0 * global_scale)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    scale = scale.clamp(2.0**-9, FP8_MAX).to(torch.float8_e4m3fn).float() * global_scale
    return (round_e2m1(blocks / scale) * scale).reshape(x.shape)


def unpack_int4_rows(packed: torch.Tensor) -> torch.Tensor:
    """(N/2, K) int8, row 2j in the low nibble and row 2j+1 in the high one (two's complement) -> (N, K) int8."""
    p = packed.view(torch.uint8).to(torch.int16)
    low, high = p & 0xF, p >> 4
    rows = torch.stack([low, high], dim=1).reshape(-1, packed.shape[1])
    return torch.where(rows > 7, rows - 16, rows).to(torch.int8)


def unpack_fp4_cols(packed: torch.Tensor) -> torch.Tensor:
    """(N, K/2) uint8, column 2k in the low nibble -> (N, K) float32 E2M1 values."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    values = torch.tensor(E2M1_VALUES, device=packed.device)[codes & 7]
    return torch.where(codes >= 8, -values, values)


# the formats whose CUDA forward is quant_gemm's GEMM (cuda/quant_linear.FORMATS)
GEMM_FORMATS = ("int4_awq", "w4a8_awq", "int8_sq", "int8_wo")


def _per_group(scales: torch.Tensor, in_features: int) -> torch.Tensor:
    """(N, G) scales -> (N, K): each applies to its K / G consecutive input features."""
    return scales.float().repeat_interleave(in_features // scales.shape[1], dim=1)


class Linear(torch.nn.Module):
    """y = x W^T + b for every weight format a TensorRT-LLM checkpoint holds.

    The seam for fast kernels: a quantized layer keeps its weights and scales exactly as the
    checkpoint stores them (TP shards merged). On the CPU it keeps a ``dequantized`` (out, in) copy in the
    compute dtype too, which the emulation multiplies with (dequantized once in float32, rounded once: the
    reference the kernels are checked against); on CUDA ``dequantized`` is None (``KEEP_DEQUANTIZED`` keeps it,
    for the benchmark's before/after) and the layer runs ``cuda/quant_gemm``'s GEMMs on ``kernel_weight()``.

    ``format``      none | fp8 | int4_awq | w4a8_awq | int8_sq | int8_wo | nvfp4
    ``weight``      as stored: compute dtype (none); float8_e4m3fn (out, in) (fp8); int8 (out/2, in), two
                    INT4 per byte, row 2j in the low nibble (int4_awq, w4a8_awq); int8 (out, in) (int8_sq,
                    int8_wo: the int8 values trtllm-build computes from the checkpoint); uint8 (out, in/2),
                    two E2M1 per byte, column 2k in the low nibble (nvfp4). ``qweight`` is the same tensor.
    ``scales``      float32 (out, in/group) per-group (AWQ); float32 (out,) per output channel (int8_sq);
                    float32 (out, slices) per output channel and rank slice of the input (int8_wo);
                    float8_e4m3fn (out, in/16) per block (nvfp4). FP8 keeps ``w_scale`` (per tensor).
    ``scale_2``     float32 per-tensor second-level weight scale (w4a8_awq: the FP8 step of the INT4
                    values; nvfp4: the global scale the block scales are in units of), else None.
    ``a_scale``     float32 per-tensor activation scale (fp8, w4a8_awq, int8_sq; nvfp4: the global scale
                    of the dynamic per-block activation scales), ``a_inv`` its reciprocal, else None.
    ``pre_quant_scale``  (in,) compute dtype, multiplies the input first (AWQ, SmoothQuant), else None.
    ``group_size``  input features per weight scale (AWQ block, 16 for nvfp4), else None.

    Several prefixes are fused into one GEMM along the output dimension (as TensorRT-LLM fuses the
    MLP's fc and gate) when they share their input: their per-tensor and per-input tensors must agree.
    """

    # Keep the dequantized copy on CUDA too (the old memory: benchmarks/quant_gemm.py measures before and after)
    KEEP_DEQUANTIZED = False

    def __init__(self, tensors: dict[str, Any], prefix: str | tuple[str, ...], dtype: torch.dtype,
                 device: torch.device, fmt: str = "none", group_size: int | None = None):
        super().__init__()
        if isinstance(prefix, tuple):
            tensors = _fused(tensors, prefix)
            prefix = prefix[0]
        get = lambda name: tensors.get(f"{prefix}.{name}")  # noqa: E731
        weight = get("weight")
        bias = get("bias")
        self.format = fmt if weight.dtype != torch.float8_e4m3fn else "fp8"
        self.bias = bias.to(device=device, dtype=dtype) if bias is not None else None
        self.fp8 = self.format == "fp8"
        self.dtype = dtype
        self.group_size = group_size if self.format in ("int4_awq", "w4a8_awq", "nvfp4") else None
        self.scaled_mm = self.gemm = False
        self.invariant = False  # ``Qwen2Engine.make_batch_invariant``: one GEMM shape whatever the rows
        self.fast_accum = False  # FP8 by cuBLAS: the whole K in the tensor cores' accumulator (switches.fp8_fast_accum)
        self._kernel_weight = None
        keep = device.type != "cuda" or self.KEEP_DEQUANTIZED
        self.scales = self.scale_2 = self.a_scale = self.a_inv = self.pre_quant_scale = self.dequantized = None
        if self.format == "none":
            self.weight = weight.to(device=device, dtype=dtype)
            return
        f32 = lambda t: None if t is None else t.to(device=device, dtype=torch.float32)  # noqa: E731
        self.weight = self.qweight = weight.to(device)
        pre = get("prequant_scaling_factor")
        self.pre_quant_scale = pre.to(device=device, dtype=dtype) if pre is not None else None
        if self.fp8:
            self.w_scale = f32(get("weights_scaling_factor")).reshape(())
            self.a_scale = f32(get("activation_scaling_factor")).reshape(())
            self.a_inv = 1.0 / self.a_scale
            # A real FP8 GEMM needs FP8 tensor cores (SM89+), dims in multiples of 16 and a 16-bit output.
            self.scaled_mm = (
                device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
                and all(d % 16 == 0 for d in weight.shape) and dtype in (torch.bfloat16, torch.float16)
            )
            self.fast_accum = self.scaled_mm and switches.fp8_fast_accum()
            # Emulation: dequantized once in float32 and rounded once, as the fake-quantized model does.
            self.dequantized = self._dequantize().to(dtype) if keep and not self.scaled_mm else None
            return
        self.scales = get("per_channel_scale") if self.format == "int8_wo" else get("weights_scaling_factor")
        self.scales = self.scales.to(device)
        if get("weights_scaling_factor_2") is not None:
            self.scale_2 = f32(get("weights_scaling_factor_2")).reshape(())
        if get("activation_scaling_factor") is not None:
            self.a_scale = f32(get("activation_scaling_factor")).reshape(())
            self.a_inv = 1.0 / self.a_scale
        self.gemm = device.type == "cuda" and self.format in GEMM_FORMATS and dtype in (torch.bfloat16, torch.float16) \
            and (self.format != "w4a8_awq" or torch.cuda.get_device_capability(device) >= (8, 9))  # FP8 tensor cores
        self.dequantized = self._dequantize().to(dtype) if keep else None

    def group_scales(self) -> torch.Tensor:
        """INT4-AWQ's per-group scales (the checkpoint's amax / 7, float32) in the compute dtype, as TensorRT-LLM
        holds them (``WeightOnlyGroupwiseQuantLinear``'s ``weights_scaling_factor`` has the model's dtype, and
        ``postprocess_weight_only_groupwise`` casts the checkpoint's to it): the weight is the INT4 values times
        these. They differ from ModelOpt's float32 step by its rounding to the compute dtype (2^-9 relative in
        bfloat16), so a linear's output differs from the fake-quantized model's by ~1e-3."""
        return self.scales.to(self.dtype)

    def _dequantize(self) -> torch.Tensor:
        """The weight as the format defines it, in float32."""
        w, s = self.weight, self.scales
        if self.format == "fp8":
            return w.float() * self.w_scale
        if self.format == "int4_awq":
            values = unpack_int4_rows(w).float()
            return values * _per_group(self.group_scales(), values.shape[1])
        if self.format == "w4a8_awq":
            values = unpack_int4_rows(w).float()
            # q / (7 / amax), as ModelOpt's fake quantizer computes it (the checkpoint stores amax / 7)
            q_scale = torch.tensor(7.0, device=w.device) / (_per_group(s, values.shape[1]) * 7.0)
            # the INT4 values are stepped in FP8 with the second-level scale
            return fake_fp8(values / q_scale, self.scale_2)
        if self.format == "int8_sq":
            return w.float() * s.float()[:, None]
        if self.format == "int8_wo":
            return w.float() * _per_group(s, w.shape[1])
        if self.format == "nvfp4":
            values = unpack_fp4_cols(w)
            return values * _per_group(s, values.shape[1]) * self.scale_2
        raise ValueError(f"no emulation for weight format {self.format!r}")

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """The input as the layer's activation quantizer leaves it (pre-quant scale first), compute dtype."""
        if self.pre_quant_scale is not None:
            x = x * self.pre_quant_scale
        if self.format == "fp8":
            return (quantize_fp8(x, self.a_inv).float() * self.a_scale).to(self.dtype)
        if self.format == "w4a8_awq":
            return fake_fp8(x, self.a_scale).to(self.dtype)
        if self.format == "int8_sq":
            return fake_int8(x, self.a_scale).to(self.dtype)
        if self.format == "nvfp4":
            return fake_nvfp4(x, self.a_scale).to(self.dtype)
        return x

    def _fp8_weight(self) -> torch.Tensor:
        """An FP8 layer's weight for a compute-dtype matmul: the kept copy, else made for this call."""
        return self.dequantized if self.dequantized is not None else self._dequantize().to(self.dtype)

    def kernel_weight(self):
        """The CUDA kernels' view of this layer (``cuda/quant_linear.QuantWeight``: the stored tensors, scales re-laid
        once), made on first use and shared by the prefill GEMMs and the decode step."""
        if self._kernel_weight is None:
            from trtllm_pipeline.runtimes.torch_engine.cuda.quant_linear import QuantWeight  # Triton: on first use

            self._kernel_weight = QuantWeight.of(self)
        return self._kernel_weight

    def step_tensors(self) -> list[torch.Tensor]:
        """The tensors one pass of this layer reads: the dequantized copy where it multiplies with one, else the
        stored weight (and its scales, pre-quant scale) and bias."""
        if self.dequantized is not None and not self.fp8:
            tensors = [self.dequantized]
        else:
            tensors = [self.weight, self.scales, self.pre_quant_scale]
        return [t for t in (*tensors, self.bias) if t is not None]

    def describe(self) -> str:
        if self.invariant:
            return f"cuda/invariant_gemm ({self.format}: one tile shape whatever the rows)"
        if self.format == "none":
            return "dense matmul"
        if self.scaled_mm:
            return "torch._scaled_mm (FP8 tensor cores)"
        if self.gemm and self.dequantized is None:
            return f"quant_gemm ({self.format}: tensor-core GEMM from the stored weights)"
        return f"emulated ({self.format}: dequantized weights, quantized inputs where the format has them, " \
               "compute-dtype matmul)"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in the compute dtype; or, for an FP8 layer, already quantized by its producer with this layer's
        activation scale (``cuda/prefill``'s norm and gate kernels), which is what its own quantizer would make."""
        if self.invariant:
            return self._invariant(x)
        if self.format == "none":
            return F.linear(x, self.weight, self.bias)
        if x.dtype == torch.float8_e4m3fn and not self.scaled_mm:
            assert self.fp8, "only an FP8 layer takes FP8 input"
            return F.linear((x.float() * self.a_scale).to(self.dtype), self._fp8_weight(), self.bias)
        if self.scaled_mm:
            xq = x if x.dtype == torch.float8_e4m3fn else quantize_fp8(x, self.a_inv)
            flat = xq.reshape(-1, xq.shape[-1])
            out = torch._scaled_mm(flat, self.weight.t(), scale_a=self.a_scale, scale_b=self.w_scale,
                                   bias=self.bias, out_dtype=self.dtype, use_fast_accum=self.fast_accum)
            return out.reshape(*x.shape[:-1], -1)
        if self.dequantized is not None:
            return F.linear(self.quantize_input(x), self.dequantized, self.bias)
        if self.gemm:
            from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm  # Triton: on first use

            return quant_gemm.linear(x, self.kernel_weight(), self.bias, self.dtype)
        # NVFP4 (no Hopper kernel), FP8 without FP8 tensor cores: the dequantized weight made for this call only
        return F.linear(self.quantize_input(x), self._dequantize().to(self.dtype), self.bias)

    def _invariant(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` through ``cuda/invariant_gemm``: each row's sums the same whatever other rows share the call
        (cuBLAS and quant_gemm pick tiles and splits by M). FP8 on the FP8 tensor cores from the stored weight; the
        other quantized formats by their emulation (the weight dequantized for this call, the input quantized as the
        format's activation quantizer does): slow, and only for this mode."""
        from trtllm_pipeline.runtimes.torch_engine.cuda.invariant_gemm import gemm  # Triton: on first use

        flat = x.reshape(-1, x.shape[-1])
        if self.format == "none":
            out = gemm(flat, self.weight, bias=self.bias, out_dtype=self.dtype)
        elif self.fp8:
            inv = None if flat.dtype == torch.float8_e4m3fn else self.a_inv
            out = gemm(flat, self.weight, bias=self.bias, x_scale=self.a_scale, w_scale=self.w_scale, x_inv=inv,
                       out_dtype=self.dtype)
        else:
            weight = self.dequantized if self.dequantized is not None else self._dequantize().to(self.dtype)
            out = gemm(self.quantize_input(flat), weight, bias=self.bias, out_dtype=self.dtype)
        return out.reshape(*x.shape[:-1], out.shape[-1])


# Tensors of a linear layer indexed by output features: concatenated when layers are fused.
_PER_OUTPUT = ("weight", "weights_scaling_factor", "per_channel_scale", "bias")


def _fused(tensors: dict[str, Any], prefixes: tuple[str, ...]) -> dict[str, Any]:
    first = prefixes[0]
    suffixes = {k[len(first) + 1:] for k in tensors if k.startswith(first + ".")}
    fused = {}
    for suffix in sorted(suffixes):
        parts = [tensors.get(f"{p}.{suffix}") for p in prefixes]
        if any(t is None for t in parts):
            raise ValueError(f"{first} and {prefixes[1:]} do not all have {suffix}; they cannot share one GEMM")
        per_output = suffix in _PER_OUTPUT and not (suffix == "weights_scaling_factor" and parts[0].numel() == 1)
        if per_output:
            raw = [t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in parts]
            fused[f"{first}.{suffix}"] = torch.cat(raw).view(parts[0].dtype)
            continue
        for p, t in zip(prefixes[1:], parts[1:]):
            if not torch.equal(t, parts[0]):
                raise ValueError(f"{first} and {p} have different {suffix}; they cannot share one GEMM")
        fused[f"{first}.{suffix}"] = parts[0]
    return fused


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rotary_tables(max_len: int, dim: int, base: float, device,
                  scaling: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin [max_len, dim] float32 of the rotary embedding, its frequencies scaled as the model family
    defines (``families.rope_inv_freq``: the checkpoint's ``rotary_scaling``)."""
    inv_freq = families.rope_inv_freq(dim, base, scaling)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX style (rotate halves). x: [B, T, heads, d]; cos/sin: [B, T, d]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    xf = x.float()
    return (xf * cos[:, :, None] + rotated.float() * sin[:, :, None]).to(x.dtype)


def _mlp_input_linear(tensors, prefix: str, dtype, device, fmt: str, group: int | None) -> "Linear | _Pair":
    """fc and gate as one GEMM when their scales agree (ModelOpt's export makes them agree)."""
    try:
        return Linear(tensors, (prefix + "mlp.fc", prefix + "mlp.gate"), dtype, device, fmt, group)
    except ValueError:
        return _Pair(Linear(tensors, prefix + "mlp.fc", dtype, device, fmt, group),
                     Linear(tensors, prefix + "mlp.gate", dtype, device, fmt, group))


class _Pair(torch.nn.Module):
    def __init__(self, first: Linear, second: Linear):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self.halves(x), dim=-1)

    def halves(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The two outputs apart (the fused prefill's GLU reads them so, without the concatenation's copy)."""
        return self.first(x), self.second(x)


# Rows of lm_head made float32 at a time where no GEMM with a float32 output is at hand (a 7B's 152k x 3584 weight
# whole would be a 2.2 GB copy per call)
LOGITS_CHUNK_ROWS = 16384


def float32_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``hidden @ weight^T`` as float32 logits, from float32 products of the compute-dtype values, never rounded to
    the compute dtype on the way. Rounded to bfloat16 (cuBLAS's output in that dtype), an MMLU answer letter's logit
    near 20 moves in steps of 0.125: on the H100 every GPU bfloat16 log-likelihood was such a step apart from its
    item's others, and near-equal logits tied (2026-12-05e). CUDA: cuBLAS's GEMM with a float32 output
    (``torch.mm(..., out_dtype=)``), else float32 copies of ``LOGITS_CHUNK_ROWS`` vocabulary rows at a time; the CPU:
    one float32 GEMM, as before."""
    if hidden.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.linear(hidden, weight)
    if hidden.device.type != "cuda":  # the reference: one float32 GEMM (CPU models are small)
        return F.linear(hidden.float(), weight.float())
    if hidden.dtype == weight.dtype:
        try:
            flat = hidden.reshape(-1, hidden.shape[-1])
            return torch.mm(flat, weight.t(), out_dtype=torch.float32).reshape(*hidden.shape[:-1], weight.shape[0])
        except (RuntimeError, TypeError):  # a torch without the float32-output GEMM for this dtype
            pass
    x = hidden.float()
    return torch.cat([F.linear(x, weight[i: i + LOGITS_CHUNK_ROWS].float())
                      for i in range(0, weight.shape[0], LOGITS_CHUNK_ROWS)], dim=-1)


class Qwen2Engine(torch.nn.Module):
    """The network plus its paged KV pool, whole on one device (TP shards merged).

    ``runtimes/torch_engine/tp/sharded_model.ShardedQwen2Engine`` is one rank's shard of it; the hooks it overrides
    are ``_local_heads``, ``_row_linear``, ``_embed`` and ``logits``.
    """

    # On CUDA, ``forward`` runs the layers with their elementwise work fused (``cuda/prefill``: H200, random 7B,
    # a 2048-token prefill took 62 ms in PyTorch operations where its FP8 GEMMs take ~14); False: ``_layers``
    FUSED_LAYERS = True

    def __init__(self, config: dict[str, Any], tensors: dict[str, Any], *, device: torch.device,
                 max_seq_len: int, max_slots: int | None = None, num_blocks: int | None = None,
                 block_size: int = 32, dtype: torch.dtype | None = None):
        """The KV pool: ``num_blocks`` blocks of ``block_size`` tokens; or, given ``max_slots``, enough for that many
        sequences of ``max_seq_len`` with a fixed table each (``slot_tables``: benchmarks and checks that think in
        slots); or neither: no pool until ``allocate_kv`` (the runtime sizes it from the memory left after the
        weights)."""
        super().__init__()
        layout = CheckpointLayout(config)
        # What differs between families (model/families.py): the qkv bias is whatever the checkpoint holds (Linear
        # takes none), the rotary table is the family's, a tied lm_head shares the embedding's storage.
        self.family = families.check(config, where="the checkpoint")
        self.dtype = dtype or getattr(torch, config["dtype"])
        self.heads, self.kv_heads = self._local_heads(layout)
        self.head_dim = layout.head_size
        self.eps = float(config.get("norm_epsilon", 1e-6))
        self.max_seq_len = max_seq_len
        self.device = torch.device(device)
        dt = self.dtype
        self.embedding = tensors["transformer.vocab_embedding.weight"].to(device=device, dtype=dt)
        self.final_norm = tensors["transformer.ln_f.weight"].to(device=device, dtype=dt)
        self.lm_head = tensors["lm_head.weight"].to(device=device, dtype=dt)
        if config.get("tie_word_embeddings") and torch.equal(self.lm_head, self.embedding):
            self.lm_head = self.embedding  # TensorRT-LLM's checkpoint stores the tied head twice; held once here
        self.format = FORMAT_NAMES.get(layout.quant_algo, str(layout.quant_algo))
        fmt, group = self.format, layout.group_size
        self.layers = []
        for i in range(layout.layers):
            p = f"transformer.layers.{i}."
            self.layers.append({
                "input_norm": tensors[p + "input_layernorm.weight"].to(device=device, dtype=dt),
                "post_norm": tensors[p + "post_layernorm.weight"].to(device=device, dtype=dt),
                "qkv": Linear(tensors, p + "attention.qkv", dt, device, fmt, group),
                "dense": self._row_linear(tensors, p + "attention.dense", dt, device, fmt, group),
                "fc_gate": _mlp_input_linear(tensors, p, dt, device, fmt, group),
                "proj": self._row_linear(tensors, p + "mlp.proj", dt, device, fmt, group),
            })
        base = float(config.get("rotary_base") or 10000.0)
        self.cos, self.sin = rotary_tables(max_seq_len, self.head_dim, base, device, families.rope_scaling(config))
        self.kv_scale = self.kv_inv = None  # float32 [layers]: an FP8 KV cache's dequantization scales, 1 / them
        if layout.kv_cache_quant_algo == "FP8":
            scales = [tensors[f"transformer.layers.{i}.attention.kv_cache_scaling_factor"].float().reshape(())
                      for i in range(layout.layers)]
            self.kv_scale = torch.stack(scales).to(device)
            self.kv_inv = 1.0 / self.kv_scale
        elif layout.kv_cache_quant_algo is not None:
            raise InputError(f"the checkpoint's KV cache is {layout.kv_cache_quant_algo}; the torch runtime keeps "
                             "it in FP8 or the compute dtype.", fix="quantize with quantization.kv_cache: fp8 or none")
        # ModelOpt clamps FP8 KV scales to at least 1 (export/quant_utils.py): all 1 unless a layer's keys or values
        # pass 448, and then E4M3 converts to the compute dtype exactly, with no multiply (the decode kernel's case)
        self.kv_unit_scale = self.kv_scale is not None and bool((self.kv_scale == 1).all())
        self.kv_dtype = torch.float8_e4m3fn if self.kv_scale is not None else self.dtype
        self.block_size, self.slot_blocks = block_size, -(-max_seq_len // block_size)
        self.paged_prefill_rows = switches.paged_prefill_rows()  # (``_PagedAttention``'s kernel rows)
        self.batch_invariant = False  # ``make_batch_invariant``
        self._paged_kernel_refused = False  # (``paged_kernel_usable`` said why once)
        self.cache_k = self.cache_v = None
        if max_slots is not None and num_blocks is None:
            num_blocks = 1 + max_slots * self.slot_blocks
        if num_blocks is not None:
            self.allocate_kv(num_blocks, block_size)

    def _local_heads(self, layout: CheckpointLayout) -> tuple[int, int]:
        """(query heads, KV heads) this engine computes: all of them."""
        return layout.heads, layout.kv_heads

    def _row_linear(self, tensors, prefix: str, dtype, device, fmt: str, group: int | None) -> "Linear":
        """attention.dense and mlp.proj (row-parallel under TP)."""
        return Linear(tensors, prefix, dtype, device, fmt, group)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.embedding)

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """The KV pool, zeroed: ``num_blocks`` blocks (block 0 the null block) of ``block_size`` tokens per layer."""
        self.cache_k = self.cache_v = None  # the old pool goes first
        self.block_size = block_size
        self.slot_blocks = -(-self.max_seq_len // block_size)
        shape = (len(self.layers), num_blocks, self.kv_heads, block_size, self.head_dim)
        # (zeroed as bytes, then viewed: an E4M3 zero is the zero byte, and byte kernels exist on every device)
        self.cache_k = torch.zeros(shape, dtype=_byte_type(self.kv_dtype), device=self.device).view(self.kv_dtype)
        self.cache_v = torch.zeros(shape, dtype=_byte_type(self.kv_dtype), device=self.device).view(self.kv_dtype)

    @property
    def num_blocks(self) -> int:
        return 0 if self.cache_k is None else self.cache_k.shape[1]

    def kv_store(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Keys or values as layer ``layer``'s cache stores them (FP8: ``x / scale``, saturated, to E4M3)."""
        return x if self.kv_scale is None else quantize_fp8(x, self.kv_inv[layer])

    def kv_load(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Keys or values read from layer ``layer``'s cache, in the compute dtype."""
        return x if self.kv_scale is None else dequantize_fp8(x, self.kv_scale[layer], self.dtype)

    def slot_tables(self, slots) -> list[list[int]]:
        """Fixed block tables of "slots" (an engine built with ``max_slots``): slot s owns its own run of blocks."""
        w = self.slot_blocks
        return [list(range(1 + int(s) * w, 1 + (int(s) + 1) * w)) for s in slots]

    @torch.inference_mode()
    def forward(self, batch) -> torch.Tensor:
        """Run ``batch`` (a ``plan.PagedBatch`` on this device): each row's tokens at positions ``start ..``,
        their K/V written through its block table; attention over the row's positions up to each token (keys
        read through the table). Returns final hidden states [N, hidden], the rows' tokens packed."""
        positions, attend = self.paged(batch)
        return self.layers_of(batch.tokens, positions, attend)

    def fused(self) -> bool:
        """Whether ``forward`` runs ``cuda/prefill``'s fused layers (CUDA, 16-bit compute) or ``_layers``."""
        return self.FUSED_LAYERS and self.device.type == "cuda" and self.dtype in (torch.bfloat16, torch.float16)

    def layers_of(self, tokens: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
        """The network over packed ``tokens`` at ``positions`` as ``forward`` runs it (fused where ``fused``)."""
        if self.fused():
            from trtllm_pipeline.runtimes.torch_engine.cuda import prefill  # Triton: on first use

            return prefill.layers(self, tokens, positions, attend)
        return self._layers(tokens, positions, attend)

    def paged(self, batch):
        """``batch``'s token positions [N] and the ``attend`` that writes their K/V through the block tables and
        attends over each row's positions (``_layers``'s hook)."""
        lengths, starts = batch.lengths.tolist(), batch.starts.tolist()  # one sync: the rows' shapes
        dev, bs = batch.tokens.device, self.block_size
        rows = torch.repeat_interleave(torch.arange(len(lengths), device=dev), batch.lengths)
        first = torch.cumsum(batch.lengths, 0) - batch.lengths
        positions = batch.starts[rows] + torch.arange(rows.shape[0], device=dev) - first[rows]
        if positions.numel() and int(positions.max()) >= self.max_seq_len:
            raise ValueError(f"a position exceeds this engine's max_seq_len {self.max_seq_len}")
        blocks, within = batch.block_tables[rows, positions // bs], positions % bs
        trees = _trees(batch.parents, lengths)
        attention = self.paged_attention(batch.block_tables, starts, lengths, trees)
        if trees:  # a tree row's token is rotated at the position of its depth (its K/V written at its row index)
            positions = positions - _depth_gaps(trees, lengths).to(dev)
        return positions, self.attend_through(blocks, within, attention)

    def paged_attention(self, tables: torch.Tensor, starts: list[int], lengths: list[int], trees=None):
        """The attention of one step's rows (``_PagedAttention``: its index tensors made now, on these shapes)."""
        return _PagedAttention(self, tables, starts, lengths, trees)

    def attend_through(self, blocks: torch.Tensor, within: torch.Tensor, attention):
        """``_layers``' ``attend``: each token's K/V written at (``blocks``, ``within``) of the pool, then
        ``attention`` (``paged_attention``'s) over them."""

        write = None
        if self.fused():  # one Triton launch for both, not two index assignments (and an E4M3 pool's casts)
            from trtllm_pipeline.runtimes.torch_engine.cuda.prefill import write_kv as write

        def attend(i: int, q, k, v):
            if write is not None:  # (an E4M3 pool's quantization and its readers' values in the same launch)
                scales = {} if self.kv_scale is None else {"scale": self.kv_scale[i : i + 1],
                                                           "inv": self.kv_inv[i : i + 1]}
                return attention(i, q, *write(self.cache_k[i], self.cache_v[i], blocks, within, k, v, **scales))
            k, v = self.kv_store(i, k), self.kv_store(i, v)
            _as_bytes(self.cache_k[i])[blocks, :, within] = _as_bytes(k)
            _as_bytes(self.cache_v[i])[blocks, :, within] = _as_bytes(v)
            return attention(i, q, self.kv_load(i, k), self.kv_load(i, v))

        return attend

    @torch.inference_mode()
    def move_kv(self, table: list[int], sources: list[int], destinations: list[int]) -> None:
        """Positions ``sources`` of the sequence whose blocks are ``table`` copied to ``destinations`` in every layer
        (a tree row's accepted path into consecutive positions; every source is read before any is written)."""
        bs, dev = self.block_size, self.device
        t = torch.tensor(table, dtype=torch.long, device=dev)
        src, dst = (torch.tensor(x, dtype=torch.long, device=dev) for x in (sources, destinations))
        for cache in (self.cache_k, self.cache_v):
            c = _as_bytes(cache)  # [layers, blocks, kv_heads, block_size, D]
            c[:, t[dst // bs], :, dst % bs] = c[:, t[src // bs], :, src % bs]

    def forward_slots(self, tokens: torch.Tensor, slots, starts, key_len: int | None = None) -> torch.Tensor:
        """``tokens`` [B, T] of fixed-table slots (an engine built with ``max_slots``) from positions ``starts``:
        hidden states [B, T, hidden]. For benchmarks and checks that think in slots (``key_len``: ignored)."""
        b, t = tokens.shape
        slots, starts = [int(s) for s in slots], [int(s) for s in starts]
        rows = [(tokens[i].tolist(), starts[i], table) for i, table in enumerate(self.slot_tables(slots))]
        return self(PagedBatch.of(rows).to(self.device)).view(b, t, -1)

    @torch.inference_mode()
    def forward_contiguous(self, tokens: torch.Tensor) -> torch.Tensor:
        """One sequence ``tokens`` [T] from position 0, attention over its own K/V, no cache: the unpaged math the
        paged path must reproduce (tests). Hidden states [T, hidden]."""
        positions = torch.arange(tokens.shape[0], device=tokens.device)

        def attend(i: int, q, k, v):
            k, v = self.kv_load(i, self.kv_store(i, k)), self.kv_load(i, self.kv_store(i, v))  # as a cache holds them
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                 v.transpose(0, 1)[None], is_causal=True,
                                                 scale=1.0 / math.sqrt(self.head_dim), enable_gqa=True)
            return out[0].transpose(0, 1).reshape(tokens.shape[0], -1)

        return self._layers(tokens, positions, attend)

    def _layers(self, tokens: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
        """The network over packed tokens [N] at ``positions`` [N]; ``attend(layer, q, k, v)`` (rotated q [N, heads,
        D], k and v [N, kv_heads, D]) gives the attention output [N, heads * D]."""
        cos, sin = self.cos[positions][None], self.sin[positions][None]
        x = self._embed(tokens[None])
        for i in range(len(self.layers)):
            x = self._layer(i, x, cos, sin, attend)
        return rms_norm(x, self.final_norm, self.eps)[0]

    def _layer(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
        """Layer ``i`` on the residual stream ``x`` [1, N, hidden]: the stream leaving it."""
        layer, n = self.layers[i], x.shape[1]
        hd, nq, nkv = self.head_dim, self.heads, self.kv_heads
        h = rms_norm(x, layer["input_norm"], self.eps)
        qkv = layer["qkv"](h)
        q = qkv[..., : nq * hd].view(1, n, nq, hd)
        k = qkv[..., nq * hd : (nq + nkv) * hd].view(1, n, nkv, hd)
        v = qkv[..., (nq + nkv) * hd :].view(1, n, nkv, hd)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        x = x + layer["dense"](attend(i, q[0], k[0], v[0])[None])
        h = rms_norm(x, layer["post_norm"], self.eps)
        fc, gate = layer["fc_gate"](h).chunk(2, dim=-1)
        return x + layer["proj"](F.silu(fc) * gate)

    @torch.inference_mode()
    def residual_streams(self, batch, points) -> torch.Tensor:
        """The residual stream entering layer ``j`` for each ``j`` of ``points`` (``j == len(self.layers)``: leaving
        the last layer, before the final norm; 0: the embedding), for ``batch``'s packed tokens, concatenated in the
        order of ``points``: [N, len(points) * hidden]. The layers run eagerly (K/V written through the block tables as
        ``forward`` writes them), and only as far as the last point. What an EAGLE-3 draft head reads
        (``speculative/eagle3.py``)."""
        positions, attend = self.paged(batch)
        cos, sin = self.cos[positions][None], self.sin[positions][None]
        x = self._embed(batch.tokens[None])
        taken, last = {}, max(points)
        for i in range(last):
            if i in points:
                taken[i] = x
            x = self._layer(i, x, cos, sin, attend)
        taken[last] = x
        return torch.cat([taken[j][0] for j in points], dim=-1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits (TensorRT-LLM's default logits dtype): bf16 logits tie too often."""
        if self.batch_invariant:
            from trtllm_pipeline.runtimes.torch_engine.cuda.invariant_gemm import gemm  # Triton: on first use

            flat = hidden.reshape(-1, hidden.shape[-1])
            return gemm(flat, self.lm_head, out_dtype=torch.float32).reshape(*hidden.shape[:-1], -1)
        return float32_logits(hidden, self.lm_head)

    def paged_kernel_usable(self) -> bool:
        """Whether ``cuda/paged_prefill``'s kernel launches for this engine on its device (tried once; on the CPU the
        interpreter's checks run it as it is). Where it does not, said once, and the SDPA paths attend."""
        if self.device.type != "cuda":
            return True
        from trtllm_pipeline.runtimes.torch_engine.cuda import paged_prefill  # Triton: on first use

        why = paged_prefill.trial(self.heads, self.kv_heads, self.head_dim, self.block_size, self.dtype,
                                  self.kv_dtype, self.device, self.kv_unit_scale)
        if why and not self._paged_kernel_refused:
            self._paged_kernel_refused = True
            log.warning("the paged prefill attention kernel does not run on this GPU (%s); later prefill chunks attend "
                        "through gathered blocks and SDPA", why)
        return why is None

    def _invariant_gemm_refusal(self) -> str | None:
        """Why ``cuda/invariant_gemm`` does not launch here for this engine's weights and logits, or None."""
        from trtllm_pipeline.runtimes.torch_engine.cuda import invariant_gemm  # Triton: on first use

        weights = {torch.float8_e4m3fn if layer[name].format == "fp8" else self.dtype
                   for layer in self.layers[:1] for name in ("qkv", "dense", "proj")}
        for w_dtype, out in [(w, self.dtype) for w in sorted(weights, key=str)] + [(self.dtype, torch.float32)]:
            why = invariant_gemm.trial(w_dtype, self.dtype, out, self.device)
            if why:
                return f"its GEMM does not run on this GPU ({why})"
        return None

    def make_batch_invariant(self) -> None:
        """From now on every row of a step is computed as it would be in any other step (``runtime.batch_invariant``):
        the linears and the logits through ``cuda/invariant_gemm`` (one GEMM shape whatever M), every row's attention
        through ``cuda/paged_prefill``'s kernel (a query's keys in the same tiles whatever its chunk); the norms,
        rotary, gate and K/V write kernels already go row by row. Refused (InputError) where a part cannot be so."""
        from trtllm_pipeline.runtimes.torch_engine.cuda import paged_prefill  # Triton: on first use

        why = None
        if self.dtype not in (torch.bfloat16, torch.float16):
            why = f"it computes in {str(self.dtype).removeprefix('torch.')}, the kernels in bfloat16 or float16"
        elif self.head_dim not in paged_prefill.CONFIGS:
            why = f"its heads are {self.head_dim} wide; the attention kernel takes {sorted(paged_prefill.CONFIGS)}"
        elif self.block_size & (self.block_size - 1):
            why = f"its KV blocks hold {self.block_size} tokens; the attention kernel takes a power of two"
        elif not self.paged_kernel_usable():
            why = "the attention kernel does not run on this GPU (the log says why)"
        elif self.device.type == "cuda":
            why = self._invariant_gemm_refusal()
        if why:
            raise InputError(f"runtime.batch_invariant cannot run this engine: {why}.",
                             fix="turn runtime.batch_invariant off, or set runtime.compute_dtype / kv_block_size")
        self.batch_invariant, self.paged_prefill_rows = True, "all"
        for layer in self.layers:
            for name in ("qkv", "dense", "fc_gate", "proj"):
                module = layer[name]
                for linear in (module.first, module.second) if isinstance(module, _Pair) else (module,):
                    linear.invariant = True

    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads (the embedding is gathered, not read whole)."""
        tensors = [self.final_norm, self.lm_head]
        for layer in self.layers:
            tensors += [layer["input_norm"], layer["post_norm"]]
            for key in ("qkv", "dense", "fc_gate", "proj"):
                module = layer[key]
                parts = [module.first, module.second] if isinstance(module, _Pair) else [module]
                tensors += [t for m in parts for t in m.step_tensors()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this engine keeps resident, by part (each storage counted once): ``embedding``,
        ``lm_head``, ``layers`` (every linear's stored and dequantized tensors, norms), ``other`` (final
        norm, rotary tables) and ``kv_cache``; what a TP rank holds of the model."""
        seen: set[int] = set()
        out = dict.fromkeys(("embedding", "lm_head", "layers", "other", "kv_cache"), 0)

        def add(part: str, value) -> None:
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    out[part] += storage.nbytes()
            elif isinstance(value, torch.nn.Module):
                for item in [*vars(value).values(), *value._modules.values()]:
                    add(part, item)

        add("embedding", self.embedding)
        add("lm_head", self.lm_head)
        for layer in self.layers:
            for item in layer.values():
                add("layers", item)
        for item in (self.final_norm, self.cos, self.sin):
            add("other", item)
        for item in (self.cache_k, self.cache_v):
            if item is not None:
                add("kv_cache", item)
        return out

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one request's token occupies, over all layers (read once per decode step)."""
        return 2 * len(self.layers) * self.kv_heads * self.head_dim * self.kv_dtype.itemsize


class _PagedAttention:
    """One step's attention through block tables, the same for every layer. Where the engine runs its fused layers
    (CUDA), the rows ``engine.paged_prefill_rows`` names (by default later chunks and single-token rows) attend in
    one launch of ``cuda/paged_prefill``'s kernel, every key read through the row's table. The others: the rows of
    one token (decodes) batched in one call over their gathered keys; the longer rows (prefill chunks) in groups of
    similar length (the next power of two), each group one call over its rows padded to its longest. A group of
    first chunks attends to this step's own keys and values (causal: a row's padding sits after its last query, so
    no real query sees it); a group of later chunks (a prefix cached, or a long prompt's next chunk) gathers its rows'
    keys through their tables under a mask of each query's visible positions. Per-row calls cost ~10 launches
    a row and layer: at 64 prompts a step that is what the step took (H200, random 7B, issue 31)."""

    # The kernel where the engine is not fused too (the interpreter's checks on the CPU)
    FORCE_KERNEL = False

    def __init__(self, engine: Qwen2Engine, tables: torch.Tensor, starts: list[int], lengths: list[int],
                 trees: dict[int, list[int]] | None = None):
        """``trees``: row -> its tokens' ancestor bitmasks (``tree.row_ancestors``), for tree verify rows."""
        self.engine, self.tables, self.starts, self.lengths = engine, tables, starts, lengths
        self.trees = trees or {}
        dev, bs = tables.device, engine.block_size
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        self.offsets = offsets
        self.kernel_tiles, taken = self._kernel_tiles()
        decodes = [r for r, n in enumerate(lengths) if n == 1 and r not in taken]
        self.decodes = torch.tensor(decodes, dtype=torch.long, device=dev)
        self.decode_tokens = torch.tensor([offsets[r] for r in decodes], dtype=torch.long, device=dev)
        if decodes:
            span = max(starts[r] for r in decodes) + 1
            self.decode_blocks = -(-span // bs)
            keys = torch.arange(self.decode_blocks * bs, device=dev)
            visible = keys[None, :] <= torch.tensor([starts[r] for r in decodes], device=dev)[:, None]
            self.decode_mask = _additive(visible[:, None, None, :], engine.dtype)  # [Bd, 1, 1, L]
        groups: dict[tuple[bool, int], list[int]] = {}
        for r, n in enumerate(lengths):
            if n > 1 and r not in taken:
                # (a tree row reads its keys through its table, under its mask: a later chunk's way)
                groups.setdefault((starts[r] > 0 or r in self.trees, 1 << (n - 1).bit_length()), []).append(r)
        self.groups = [self._group(rows, later) for (later, _), rows in sorted(groups.items())]

    def _kernel_tiles(self) -> tuple[torch.Tensor | None, set[int]]:
        """The paged prefill kernel's tile map for the rows it takes here, and those rows (none where the engine is
        not fused, or its heads, dtype or blocks are not the kernel's; never a tree row, whose mask it lacks)."""
        e, which = self.engine, self.engine.paged_prefill_rows
        if which == "none" or not (e.fused() or e.batch_invariant or self.FORCE_KERNEL) \
                or e.dtype not in (torch.bfloat16, torch.float16):
            return None, set()
        from trtllm_pipeline.runtimes.torch_engine.cuda import paged_prefill  # Triton: on first use

        if e.head_dim not in paged_prefill.CONFIGS or e.block_size & (e.block_size - 1) or not e.paged_kernel_usable():
            return None, set()
        rows = [r for r, n in enumerate(self.lengths) if r not in self.trees and n > 0
                and (which == "all" or n == 1 or self.starts[r] > 0)]
        if not rows:
            return None, set()
        group = e.heads // e.kv_heads
        queries = paged_prefill.launch_config(e.head_dim, group).block_m // group
        return paged_prefill.tile_map(self.starts, self.lengths, queries, self.tables.device, rows=rows), set(rows)

    def _group(self, rows: list[int], later: bool) -> dict:
        """Index tensors of one group: its rows' tokens padded to the longest (``pad``: packed index per padded
        slot, -1 for padding), the real slots and their packed tokens; for later chunks the padded block tables and
        the additive mask of what each query sees."""
        dev, bs = self.tables.device, self.engine.block_size
        width = max(self.lengths[r] for r in rows)
        pad = torch.full((len(rows), width), -1, dtype=torch.long)
        for i, r in enumerate(rows):
            pad[i, : self.lengths[r]] = torch.arange(self.offsets[r], self.offsets[r + 1])
        group = {"rows": len(rows), "width": width}
        first, last = self.offsets[rows[0]], self.offsets[rows[-1] + 1]
        # every row as long as the widest and nothing between them (a prefill graph's R x L): one slice. (The span's
        # length alone would not say it: rows of 5 and 7 around another row's 2 span 14 = 2 x 7.)
        if all(self.lengths[r] == width for r in rows) and last - first == len(rows) * width:
            group["span"] = (first, last)
        pad = pad.reshape(-1).to(dev)
        real = torch.nonzero(pad >= 0).reshape(-1)
        group.update(pad=pad.clamp(min=0), real=real, tokens=pad[real])
        if later:
            span = max(self.starts[r] + self.lengths[r] for r in rows)
            blocks = -(-span // bs)
            group["tables"] = self.tables[torch.tensor(rows, device=dev), :blocks]
            keys = torch.arange(blocks * bs, device=dev)
            queries = torch.tensor([self.starts[r] for r in rows], device=dev)[:, None] + \
                torch.arange(width, device=dev)[None, :]  # [R, width] positions (padding: past the row's end)
            visible = keys[None, None, :] <= queries[:, :, None]  # [R, width, keys]
            for i, r in enumerate(rows):
                if r in self.trees:  # the row's own positions: its ancestors and itself only
                    n, start = self.lengths[r], self.starts[r]
                    bits = torch.tensor([[(m >> j) & 1 for j in range(n)] for m in self.trees[r]], dtype=torch.bool)
                    visible[i, :n, start : start + n] = bits.to(dev)
            group["mask"] = _additive(visible, self.engine.dtype)[:, None]
        return group

    def _gather(self, layer: int, cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        """[rows, W] block ids -> the rows' keys (or values) of ``layer`` [rows, kv_heads, W * block_size, D], in the
        compute dtype."""
        g = self.engine.kv_load(layer, _as_bytes(cache[layer])[tables].view(cache.dtype))  # [rows, W, kv_heads, bs, D]
        return g.transpose(1, 2).reshape(g.shape[0], g.shape[2], -1, g.shape[-1])

    def __call__(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention output [N, heads * D] for the packed rotated ``q`` [N, heads, D] and this step's own ``k``,
        ``v`` [N, kv_heads, D] (already written to the cache)."""
        e = self.engine
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)
        scale = 1.0 / math.sqrt(e.head_dim)
        if self.kernel_tiles is not None:  # (this step's k and v are in the pool already: the kernel reads them there)
            from trtllm_pipeline.runtimes.torch_engine.cuda.paged_prefill import prefill_attention

            fp8 = e.kv_scale is not None
            prefill_attention(q, e.cache_k[i], e.cache_v[i], self.tables, None, None, scale=scale,
                              kv_scale=e.kv_scale[i : i + 1] if fp8 else None, kv_unit=fp8 and e.kv_unit_scale,
                              out=out, tiles=self.kernel_tiles)
        if self.decodes.numel():
            tables = self.tables[self.decodes, : self.decode_blocks]
            kd, vd = self._gather(i, e.cache_k, tables), self._gather(i, e.cache_v, tables)
            qd = q[self.decode_tokens][:, :, None]  # [Bd, heads, 1, D]
            o = _masked_attention(qd, kd, vd, self.decode_mask, scale)
            out[self.decode_tokens] = o.reshape(o.shape[0], -1)
        for g in self.groups:
            r, w, span = g["rows"], g["width"], g.get("span")

            def padded(x: torch.Tensor) -> torch.Tensor:  # [N, h, D] -> [R, h, width, D]
                # (a span: the same values without a gather's copy; contiguous as a gather's would be, for the
                # attention kernel's choice: v is a view of the QKV output)
                x = x[span[0] : span[1]].contiguous() if span else x[g["pad"]]
                return x.view(r, w, x.shape[1], x.shape[2]).transpose(1, 2)

            if "mask" in g:
                kg = self._gather(i, e.cache_k, g["tables"])
                vg = self._gather(i, e.cache_v, g["tables"])
                o = _masked_attention(padded(q), kg, vg, g["mask"], scale)
            else:
                o = F.scaled_dot_product_attention(padded(q), padded(k), padded(v), is_causal=True, scale=scale,
                                                   enable_gqa=True)
            o = o.transpose(1, 2).reshape(r * w, -1)
            if span == (0, out.shape[0]):  # the step's only rows (a prefill graph's): o is the output
                return o
            if span:
                out[span[0] : span[1]] = o
            else:
                out[g["tokens"]] = o[g["real"]]
        return out


def _trees(parents: torch.Tensor | None, lengths: list[int]) -> dict[int, list[int]]:
    """Row -> ancestor bitmasks of each tree row of a batch (``PagedBatch.parents``); plain rows (chains) left out."""
    if parents is None:
        return {}
    flat, out, at = parents.tolist(), {}, 0
    for r, n in enumerate(lengths):
        mine = flat[at : at + n]
        at += n
        if mine != list(range(-1, n - 1)):
            out[r] = row_ancestors(mine)
    return out


def _depth_gaps(trees: dict[int, list[int]], lengths: list[int]) -> torch.Tensor:
    """[N]: each packed token's row index minus its depth (0 outside tree rows): what its position drops by."""
    gaps = []
    for r, n in enumerate(lengths):
        if r in trees:  # depth = ancestors - 1: the bitmask counts the token itself
            gaps += [j - (bin(m).count("1") - 1) for j, m in enumerate(trees[r])]
        else:
            gaps += [0] * n
    return torch.tensor(gaps, dtype=torch.long)


def _byte_type(dtype: torch.dtype) -> torch.dtype:
    return torch.uint8 if dtype == torch.float8_e4m3fn else dtype


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    """An E4M3 tensor as its bytes, for indexing (PyTorch's index kernels do not all take float8 on every device);
    any other tensor as it is."""
    return x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """SDPA under an additive mask with grouped KV heads. On CUDA the KV heads are repeated for their query heads
    first: SDPA's memory-efficient kernel takes a mask but not ``enable_gqa`` (only flash and math do, and flash
    takes no mask), so with ``enable_gqa`` a masked call falls to the math backend, which materializes every
    score in float32 ([rows, heads, queries, keys]: 1.9 GB a layer for an 8k prompt's last 2k chunk; H200, random
    7B: that chunk's step took 1.07 s). Repeated, the efficient kernel runs it (the repeat: 2 x 58 MB a layer
    there). The CPU keeps the math backend, whose ``enable_gqa`` repeats the same way."""
    if q.device.type == "cuda" and k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as the additive one SDPA takes as is (a boolean one it converts in every layer)."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
