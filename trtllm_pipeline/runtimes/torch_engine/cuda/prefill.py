"""The eager forward's layers over many tokens (prefill chunks, eager decodes) with the elementwise work fused.

``Qwen2Engine._layers`` spells each layer in PyTorch operations: its RMSNorm, rotary embedding, FP8 input
quantization and SiLU gate are some fifty launches a layer, most of them passes in float32 over [tokens, hidden]
or [tokens, intermediate] (the FP8 quantization of mlp.proj's input alone moves ~1 GB a layer at 2048 tokens).
On an H200 a 2048-token prefill of the random 7B took 62 ms (FP8 and BF16 alike) where its GEMMs take ~14 ms
(FP8; ``benchmarks/quant_gemm.py``'s M=2048 rows), and a short prompt's prefill is launch-bound.

Here a layer is: the residual add + RMSNorm (``norm``'s kernel, which also quantizes its output for an FP8
consumer), the QKV GEMM, one kernel that rotates q and k, attention (the engine's ``attend``; its output quantized in
one pass for an FP8 attention.dense), attention.dense,
the residual add + RMSNorm, the fc/gate GEMM, one kernel for the SiLU gate (quantized for an FP8 mlp.proj), and
mlp.proj. The GEMMs are the layers' own modules (cuBLAS, ``torch._scaled_mm``, ``quant_gemm``; tensor parallel's
row-parallel all-reduce included), so every format and rank runs here. The rounding points are eager's: each
kernel rounds where the PyTorch operations it replaces round, so the two agree up to accumulation order (checked
through Triton's interpreter in ``tests/prefill_check.py``). The CPU keeps the PyTorch spelling (the reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_pipeline.runtimes.torch_engine.cuda import norm
from trtllm_pipeline.runtimes.torch_engine.cuda.attention import _to_e4m3
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import tl_dtype


@triton.jit
def _rope_kernel(qkv_ptr, stride_qkv, pos_ptr, cos_ptr, sin_ptr, stride_rot, q_ptr, k_ptr,
                 H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, COMPUTE: tl.constexpr):
    """One token's query and key heads rotated (GPT-NeoX halves) in float32, rounded to the compute dtype."""
    t = tl.program_id(0)
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, D)
    half: tl.constexpr = D // 2
    partner = (d + half) % D
    sign = tl.where(d < half, -1.0, 1.0)
    ok = (heads < H + KVH)[:, None]
    pos = tl.load(pos_ptr + t)
    cos = tl.load(cos_ptr + pos * stride_rot + d)[None, :]
    sin = tl.load(sin_ptr + pos * stride_rot + d)[None, :]
    row = qkv_ptr + t * stride_qkv + heads[:, None] * D
    x = tl.load(row + d[None, :], mask=ok, other=0.0).to(tl.float32)
    xr = tl.load(row + partner[None, :], mask=ok, other=0.0).to(tl.float32) * sign[None, :]
    y = (x * cos + xr * sin).to(COMPUTE)
    is_q = (heads < H)[:, None]
    tl.store(q_ptr + t * (H * D) + heads[:, None] * D + d[None, :], y, mask=is_q)
    tl.store(k_ptr + t * (KVH * D) + (heads[:, None] - H) * D + d[None, :], y, mask=ok & ~is_q)


@triton.jit
def _silu_gate_kernel(fc_ptr, stride_fc, gate_ptr, stride_gate, out_ptr, stride_out, inv_ptr, INTER,
                      QUANT: tl.constexpr, COMPUTE: tl.constexpr, BLOCK: tl.constexpr):
    """silu(fc) * gate for one token's block of columns, rounded as eager's two bf16 operations round; FP8 with
    the consumer's activation scale when QUANT."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < INTER
    fc = tl.load(fc_ptr + t * stride_fc + cols, mask=ok, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + t * stride_gate + cols, mask=ok, other=0.0).to(tl.float32)
    act = (fc / (1.0 + tl.exp(-fc))).to(COMPUTE).to(tl.float32)
    y = (act * gate).to(COMPUTE)
    if QUANT:
        q = tl.clamp(y.to(tl.float32) * tl.load(inv_ptr), -448.0, 448.0)
        tl.store(out_ptr + t * stride_out + cols, q.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=ok)
    else:
        tl.store(out_ptr + t * stride_out + cols, y, mask=ok)


@triton.jit
def _quantize_kernel(x_ptr, stride_x, out_ptr, stride_out, inv_ptr, COLS, BLOCK: tl.constexpr):
    """One row's block of columns times the activation scale's inverse in float32, saturated, to FP8 (E4M3, round
    to nearest even): ``model.quantize_fp8`` in one pass instead of four."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < COLS
    x = tl.load(x_ptr + t * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    q = tl.clamp(x * tl.load(inv_ptr), -448.0, 448.0)
    tl.store(out_ptr + t * stride_out + cols, q.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=ok)


@triton.jit
def _kv_tile(src_ptr, stride_t, stride_h, cache_ptr, read_ptr, dst, read, t, h, d, ok, scale, inv,
             FP8: tl.constexpr):
    """One token's keys (or values) to the pool at ``dst``; FP8: stored as E4M3 (``x * inv``, saturated, to nearest
    even: the eager ``quantize_fp8``) and what a reader sees (times ``scale``, rounded: ``dequantize_fp8``) at
    ``read_ptr + read``."""
    x = tl.load(src_ptr + t * stride_t + h * stride_h + d, mask=ok)
    if FP8:
        q = _to_e4m3(x, inv)
        tl.store(cache_ptr + dst, q, mask=ok)
        tl.store(read_ptr + read, (q.to(tl.float32) * scale).to(x.dtype), mask=ok)
    else:
        tl.store(cache_ptr + dst, x, mask=ok)


@triton.jit
def _kv_write_kernel(k_ptr, v_ptr, stride_kt, stride_kh, stride_vt, stride_vh, kc_ptr, vc_ptr, stride_cb, stride_ch,
                     stride_ct, blocks_ptr, within_ptr, kr_ptr, vr_ptr, scale_ptr, inv_ptr, KVH: tl.constexpr,
                     D: tl.constexpr, BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """One token's keys and values [KVH, D] to its slot of the paged pool: block ``blocks[t]``, row ``within[t]``."""
    t = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, D)[None, :]
    ok = (h < KVH) & (d < D)  # (the full tile's shape: the interpreter cannot store through a broadcast mask)
    dst = tl.load(blocks_ptr + t) * stride_cb + h * stride_ch + tl.load(within_ptr + t) * stride_ct + d
    read = (t * KVH + h) * D + d  # (the returned [N, KVH, D] tensors, contiguous)
    scale, inv = 1.0, 1.0
    if FP8:
        scale, inv = tl.load(scale_ptr), tl.load(inv_ptr)
    _kv_tile(k_ptr, stride_kt, stride_kh, kc_ptr, kr_ptr, dst, read, t, h, d, ok, scale, inv, FP8)
    _kv_tile(v_ptr, stride_vt, stride_vh, vc_ptr, vr_ptr, dst, read, t, h, d, ok, scale, inv, FP8)


def write_kv(cache_k: torch.Tensor, cache_v: torch.Tensor, blocks: torch.Tensor, within: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor, scale: torch.Tensor | None = None,
             inv: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``cache[blocks[t], :, within[t]] = k[t]`` (and v) for every token t in one launch: one layer's pool
    [num_blocks, kv_heads, block_size, D], ``k`` / ``v`` [N, kv_heads, D] in the compute dtype (v may be a view of
    the QKV output). An E4M3 pool (``scale`` / ``inv``: the layer's float32 dequantization scale and its inverse, one
    element each) stores them quantized as ``model.quantize_fp8`` does. Returns the keys and values as the pool's
    readers see them (an E4M3 pool's: dequantized, as ``model.dequantize_fp8``; else ``k`` and ``v``), for this
    step's attention. The eager spelling took two index assignments a layer (~17 us each at 2,048 BF16 tokens: 0.95
    ms of a ~30 ms prefill on an H100, 2026-12-07) and, over an E4M3 pool, ~8 more elementwise launches."""
    n, kvh, d = k.shape
    assert k.stride(2) == 1 and v.stride(2) == 1 and cache_k.stride() == cache_v.stride() and cache_k.stride(3) == 1
    fp8 = cache_k.dtype == torch.float8_e4m3fn
    assert fp8 == (scale is not None and inv is not None), "an E4M3 pool comes with its scale"
    k_read, v_read = (torch.empty((n, kvh, d), dtype=k.dtype, device=k.device) for _ in range(2)) if fp8 else (k, v)
    if n:
        _kv_write_kernel[(n,)](k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1), cache_k, cache_v,
                               cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), blocks, within, k_read, v_read,
                               scale if fp8 else k, inv if fp8 else k, KVH=kvh, D=d,
                               BLOCK_H=triton.next_power_of_2(kvh), FP8=fp8)
    return k_read, v_read


SILU_BLOCK = 1024


def quantize_fp8(x: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """``x`` [N, K] (compute dtype) quantized for an FP8 linear whose activation scale's inverse is ``inv``."""
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    if x.shape[0]:
        _quantize_kernel[(x.shape[0], triton.cdiv(x.shape[1], SILU_BLOCK))](
            x, x.stride(0), out, out.stride(0), inv, x.shape[1], BLOCK=SILU_BLOCK)
    return out


def silu_gate(fc_gate: torch.Tensor | tuple[torch.Tensor, torch.Tensor], out: torch.Tensor,
              inv: torch.Tensor | None) -> None:
    """``out`` [N, I] = silu(fc) * gate of ``fc_gate`` [N, 2 I] (fc's columns first), or of the pair (fc, gate) [N,
    I] each, in the compute dtype, or FP8 with ``inv`` (the consumer's 1 / activation scale); eager's rounding (the
    decode step's cuBLAS GLU too)."""
    n, inter = out.shape
    fc, gate = fc_gate if isinstance(fc_gate, tuple) else (fc_gate[:, :inter], fc_gate[:, inter:])
    assert fc.stride(1) == gate.stride(1) == 1 and fc.shape == gate.shape == out.shape
    if n:
        _silu_gate_kernel[(n, triton.cdiv(inter, SILU_BLOCK))](
            fc, fc.stride(0), gate, gate.stride(0), out, out.stride(0), inv if inv is not None else fc, inter,
            QUANT=inv is not None, COMPUTE=tl_dtype(fc.dtype), BLOCK=SILU_BLOCK)


def _fp8_input(module) -> torch.Tensor | None:
    """The activation quantizer's 1 / scale when ``module`` is one FP8 linear (its producer then hands it FP8
    input, as its own quantizer would make it), else None (the module quantizes, if at all, itself; an unfused
    fc / gate pair has no ``fp8`` of its own: its halves may differ in scale). Read by attribute: the model
    module imports this one."""
    return module.a_inv if getattr(module, "fp8", False) else None


def _normed(engine, x, partial, weight, consumer, *, tokens=None) -> torch.Tensor:
    """``x += partial`` in place (or x as is, ``tokens`` given: the first layer), then the RMSNorm of x for
    ``consumer`` (FP8 where it is an FP8 linear)."""
    inv = _fp8_input(consumer)
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn if inv is not None else x.dtype, device=x.device)
    if partial is None:  # the norm kernel's gather mode, gathering each row from itself: a plain norm
        norm.residual_rmsnorm(x, None, weight, out, inv, engine.eps, engine.dtype, tokens=tokens, embedding=x)
    else:
        norm.residual_rmsnorm(x, partial.contiguous()[None], weight, out, inv, engine.eps, engine.dtype)
    return out


def layers(engine, tokens: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
    """``Qwen2Engine._layers`` with the fused kernels: final hidden states [N, hidden] of packed ``tokens`` [N] at
    ``positions`` [N]; ``attend(layer, q, k, v)`` as there."""
    n = tokens.shape[0]
    if n == 0:  # no launch takes an empty grid
        return engine._layers(tokens, positions, attend)
    hd, nq, nkv = engine.head_dim, engine.heads, engine.kv_heads
    compute = tl_dtype(engine.dtype)
    x = engine._embed(tokens[None])[0].contiguous()
    rows = torch.arange(n, device=x.device)
    partial = None
    block_h = triton.next_power_of_2(nq + nkv)
    for i, layer in enumerate(engine.layers):
        h = _normed(engine, x, partial, layer["input_norm"], layer["qkv"], tokens=rows)
        qkv = layer["qkv"](h).contiguous()
        q = torch.empty(n, nq, hd, dtype=engine.dtype, device=x.device)
        k = torch.empty(n, nkv, hd, dtype=engine.dtype, device=x.device)
        _rope_kernel[(n,)](qkv, qkv.stride(0), positions, engine.cos, engine.sin, engine.cos.stride(0), q, k,
                           H=nq, KVH=nkv, D=hd, BLOCK_H=block_h, COMPUTE=compute)
        v = qkv[:, (nq + nkv) * hd:].view(n, nkv, hd)
        attended = attend(i, q, k, v)
        inv = _fp8_input(layer["dense"])
        attended = layer["dense"](attended if inv is None else quantize_fp8(attended, inv))
        h = _normed(engine, x, attended, layer["post_norm"], layer["fc_gate"])
        # an unfused fc / gate pair (their AWQ pre-quant scales differ) as its two outputs, not concatenated: the
        # copy was 2.9 ms of an INT4 7B's 59 ms prefill of 2,048 tokens (H100 2026-12-07f)
        pair = getattr(layer["fc_gate"], "halves", None)
        fc_gate = tuple(t.contiguous() for t in pair(h)) if pair else layer["fc_gate"](h).contiguous()
        inter = fc_gate[0].shape[1] if pair else fc_gate.shape[1] // 2
        inv = _fp8_input(layer["proj"])
        act = torch.empty(n, inter, dtype=torch.float8_e4m3fn if inv is not None else engine.dtype, device=x.device)
        silu_gate(fc_gate, act, inv)
        partial = layer["proj"](act)
    final = torch.empty_like(x)
    norm.residual_rmsnorm(x, partial.contiguous()[None], engine.final_norm, final, None, engine.eps, engine.dtype)
    return final
