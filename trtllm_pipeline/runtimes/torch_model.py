"""A Qwen2 decoder that executes a TensorRT-LLM checkpoint's tensors directly, in PyTorch.

The math follows the engine TensorRT-LLM builds from the same checkpoint: fused QKV with bias,
GPT-NeoX rotary embedding, grouped-query attention over a KV cache, gated SiLU MLP with
TensorRT-LLM's naming (``fc`` is the activated gate branch, ``gate`` the up projection), RMSNorm.
FP8 layers quantize their input with the calibrated per-tensor activation scale and multiply by
the FP8 weight and its per-tensor scale: on SM89+ GPUs with ``torch._scaled_mm`` (a real FP8
GEMM), elsewhere by emulation (FP8 values dequantized to the compute dtype, then a matmul), which
gives the same numbers up to accumulation order.

The KV cache is static ([slots, kv_heads, max_seq_len, head_dim] per layer) and every call is
``forward(tokens, slots, start_pos)``: prefill, decode and scoring are the same code path, and
shapes stay fixed enough for torch.compile and CUDA graphs later.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from trtllm_pipeline.checkpoint import CheckpointLayout

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_fp8(x: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """Static per-tensor E4M3 quantization in float32, saturating, as ModelOpt's fake quant does."""
    return (x.float() * inv_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


class Linear(torch.nn.Module):
    """y = x W^T + b, with W either in the compute dtype or FP8 plus per-tensor scales.

    Several prefixes are fused into one GEMM along the output dimension (as TensorRT-LLM fuses
    the MLP's fc and gate) when they share their input and their scales.
    """

    def __init__(self, tensors: dict[str, Any], prefix: str | tuple[str, ...], dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        if isinstance(prefix, tuple):
            tensors = _fused(tensors, prefix)
            prefix = prefix[0]
        weight = tensors[prefix + ".weight"]
        bias = tensors.get(prefix + ".bias")
        self.bias = bias.to(device=device, dtype=dtype) if bias is not None else None
        self.fp8 = weight.dtype == torch.float8_e4m3fn
        self.dtype = dtype
        if not self.fp8:
            self.weight = weight.to(device=device, dtype=dtype)
            return
        self.w_scale = tensors[prefix + ".weights_scaling_factor"].to(device=device, dtype=torch.float32).reshape(())
        self.a_scale = tensors[prefix + ".activation_scaling_factor"].to(device=device, dtype=torch.float32).reshape(())
        self.a_inv = 1.0 / self.a_scale
        # A real FP8 GEMM needs FP8 tensor cores (SM89+), dims in multiples of 16 and a 16-bit output.
        self.scaled_mm = (
            device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
            and all(d % 16 == 0 for d in weight.shape) and dtype in (torch.bfloat16, torch.float16)
        )
        self.weight = weight.to(device)  # FP8 (out, in), as the fast CUDA kernels and _scaled_mm read it
        # Emulation: dequantized once in float32 and rounded once, as the fake-quantized model does.
        self.dequantized = None if self.scaled_mm else (self.weight.float() * self.w_scale).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fp8:
            return F.linear(x, self.weight, self.bias)
        xq = quantize_fp8(x, self.a_inv)
        if self.scaled_mm:
            flat = xq.reshape(-1, xq.shape[-1])
            out = torch._scaled_mm(flat, self.weight.t(), scale_a=self.a_scale, scale_b=self.w_scale,
                                   bias=self.bias, out_dtype=self.dtype)
            return out.reshape(*x.shape[:-1], -1)
        return F.linear((xq.float() * self.a_scale).to(self.dtype), self.dequantized, self.bias)


def _fused(tensors: dict[str, Any], prefixes: tuple[str, ...]) -> dict[str, Any]:
    first = prefixes[0]
    for p in prefixes[1:]:
        for scale in ("weights_scaling_factor", "activation_scaling_factor"):
            a, b = tensors.get(f"{first}.{scale}"), tensors.get(f"{p}.{scale}")
            if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
                raise ValueError(f"{first} and {p} have different {scale}; they cannot share one GEMM")
    weights = [tensors[p + ".weight"] for p in prefixes]
    fused = {k: v for k, v in tensors.items() if k.startswith(first + ".") and "scaling_factor" in k}
    raw = [w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w for w in weights]
    fused[first + ".weight"] = torch.cat(raw).view(weights[0].dtype)
    return fused


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rotary_tables(max_len: int, dim: int, base: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
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


def _mlp_input_linear(tensors, prefix: str, dtype, device) -> "Linear | _Pair":
    """fc and gate as one GEMM when their scales agree (ModelOpt's export makes them agree)."""
    try:
        return Linear(tensors, (prefix + "mlp.fc", prefix + "mlp.gate"), dtype, device)
    except ValueError:
        return _Pair(Linear(tensors, prefix + "mlp.fc", dtype, device), Linear(tensors, prefix + "mlp.gate", dtype, device))


class _Pair(torch.nn.Module):
    def __init__(self, first: Linear, second: Linear):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.first(x), self.second(x)], dim=-1)


class Qwen2Engine(torch.nn.Module):
    """The network plus its static KV cache."""

    def __init__(self, config: dict[str, Any], tensors: dict[str, Any], *, device: torch.device,
                 max_slots: int, max_seq_len: int, dtype: torch.dtype | None = None):
        super().__init__()
        layout = CheckpointLayout(config)
        self.dtype = dtype or getattr(torch, config["dtype"])
        self.heads, self.kv_heads, self.head_dim = layout.heads, layout.kv_heads, layout.head_size
        self.eps = float(config.get("norm_epsilon", 1e-6))
        self.max_seq_len = max_seq_len
        dt = self.dtype
        self.embedding = tensors["transformer.vocab_embedding.weight"].to(device=device, dtype=dt)
        self.final_norm = tensors["transformer.ln_f.weight"].to(device=device, dtype=dt)
        self.lm_head = tensors["lm_head.weight"].to(device=device, dtype=dt)
        self.layers = []
        for i in range(layout.layers):
            p = f"transformer.layers.{i}."
            self.layers.append({
                "input_norm": tensors[p + "input_layernorm.weight"].to(device=device, dtype=dt),
                "post_norm": tensors[p + "post_layernorm.weight"].to(device=device, dtype=dt),
                "qkv": Linear(tensors, p + "attention.qkv", dt, device),
                "dense": Linear(tensors, p + "attention.dense", dt, device),
                "fc_gate": _mlp_input_linear(tensors, p, dt, device),
                "proj": Linear(tensors, p + "mlp.proj", dt, device),
            })
        base = float(config.get("rotary_base") or 10000.0)
        self.cos, self.sin = rotary_tables(max_seq_len, self.head_dim, base, device)
        cache_shape = (len(self.layers), max_slots, self.kv_heads, max_seq_len, self.head_dim)
        self.cache_k = torch.zeros(cache_shape, dtype=dt, device=device)
        self.cache_v = torch.zeros(cache_shape, dtype=dt, device=device)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, slots: torch.Tensor, start_pos: torch.Tensor,
                key_len: int) -> torch.Tensor:
        """Run ``tokens`` [B, T] of requests in cache ``slots`` [B] from ``start_pos`` [B].

        Writes their K/V into the cache and returns final hidden states [B, T, hidden].
        Attention covers cache positions < ``key_len`` (>= every row's start_pos + T), masked
        causally per row; positions a row has not written are never visible to it.
        """
        B, T = tokens.shape
        positions = start_pos[:, None] + torch.arange(T, device=tokens.device)[None, :]
        cos, sin = self.cos[positions], self.sin[positions]
        key_pos = torch.arange(key_len, device=tokens.device)
        visible = (key_pos[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, T, key_len]
        # An additive mask, built once: SDPA would convert a boolean one in every layer.
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=tokens.device).masked_fill_(~visible, float("-inf"))
        x = F.embedding(tokens, self.embedding)
        hd, nq, nkv = self.head_dim, self.heads, self.kv_heads
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer["input_norm"], self.eps)
            qkv = layer["qkv"](h)
            q = qkv[..., : nq * hd].view(B, T, nq, hd)
            k = qkv[..., nq * hd : (nq + nkv) * hd].view(B, T, nkv, hd)
            v = qkv[..., (nq + nkv) * hd :].view(B, T, nkv, hd)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            self.cache_k[i][slots[:, None], :, positions] = k
            self.cache_v[i][slots[:, None], :, positions] = v
            keys = self.cache_k[i][slots, :, :key_len]
            values = self.cache_v[i][slots, :, :key_len]
            attn = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask,
                                                  scale=1.0 / math.sqrt(hd), enable_gqa=True)
            x = x + layer["dense"](attn.transpose(1, 2).reshape(B, T, nq * hd))
            h = rms_norm(x, layer["post_norm"], self.eps)
            fc, gate = layer["fc_gate"](h).chunk(2, dim=-1)
            x = x + layer["proj"](F.silu(fc) * gate)
        return rms_norm(x, self.final_norm, self.eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits (TensorRT-LLM's default logits dtype): bf16 logits tie too often."""
        return F.linear(hidden.float(), self.lm_head.float()) if hidden.device.type == "cpu" else \
            F.linear(hidden, self.lm_head).float()

    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads (the embedding is gathered, not read whole)."""
        tensors = [self.final_norm, self.lm_head]
        for layer in self.layers:
            tensors += [layer["input_norm"], layer["post_norm"]]
            for key in ("qkv", "dense", "fc_gate", "proj"):
                module = layer[key]
                parts = [module.first, module.second] if isinstance(module, _Pair) else [module]
                tensors += [t for m in parts for t in (m.weight, m.bias) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one request's token occupies, over all layers (read once per decode step)."""
        return 2 * len(self.layers) * self.kv_heads * self.head_dim * self.cache_k.element_size()

    def copy_prefix(self, src_slot: int, dst_slots: torch.Tensor, length: int) -> None:
        """Share a computed prefix (e.g. MMLU's few-shot block) with other slots."""
        self.cache_k[:, dst_slots, :, :length] = self.cache_k[:, src_slot : src_slot + 1, :, :length]
        self.cache_v[:, dst_slots, :, :length] = self.cache_v[:, src_slot : src_slot + 1, :, :length]
