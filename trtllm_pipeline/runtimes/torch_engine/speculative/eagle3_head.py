"""The EAGLE-3 draft head as a small eager module: one Llama decoder layer over (token embedding, hidden state).

Its layout and forward are the ones traced in ``eagle3_checkpoint`` (SafeAILab/EAGLE ``eagle/model/cnets.py`` @
148042c5fed07822194a49b027c897c9c5494b0e, ``LlamaDecoderLayeremb.forward`` and ``Model.forward``; SGLang's
``llama_eagle3.py`` @ d737979cbd17c6162f39c1953cfa72d3d23cc0d0 computes the same): at each position

    e = RMSNorm_in(embed(token))                     the token's embedding (target vocabulary)
    g = RMSNorm_hidden(hidden)                       hidden: fc(target streams), or the head's own last output
    x = hidden + o_proj(attention(q/k/v over [e, g]))   GQA with rotary, causal over the head's own KV
    out = x + down(silu(gate(RMSNorm_post(x))) * up(RMSNorm_post(x)))
    logits = lm_head(RMSNorm_final(out))             over the draft vocabulary; d -> target id d + d2t[d]

``out`` (before the final norm) is the hidden input of the next draft step. The residual is the raw ``hidden``,
not its norm (the ``norm_before_residual`` variant is refused by the reader). The KV of the head is kept per request
by the caller (``HeadCache``): contiguous, positions 0.. of the head's own sequence.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trtllm_pipeline.runtimes.torch_engine.model import apply_rotary, rms_norm, rotary_tables
from trtllm_pipeline.runtimes.torch_engine.speculative.eagle3_checkpoint import Eagle3Spec, draft_targets


class HeadCache:
    """One request's keys and values in the head ([capacity, kv_heads, D] each), grown by doubling."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, capacity: int = 64):
        self.k = torch.zeros(capacity, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def put(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """``k``, ``v`` [T, kv_heads, D] at positions ``start ..``; what lies past them is stale (never read)."""
        end = start + k.shape[0]
        if end > self.k.shape[0]:
            size = max(end, 2 * self.k.shape[0])
            grown_k = self.k.new_zeros(size, *self.k.shape[1:])
            grown_v = self.v.new_zeros(size, *self.v.shape[1:])
            grown_k[:start], grown_v[:start] = self.k[:start], self.v[:start]
            self.k, self.v = grown_k, grown_v
        self.k[start:end], self.v[start:end] = k, v


class Eagle3Head(torch.nn.Module):
    """The head's weights in the compute dtype, on the target's device: q/k/v fused into one matrix, gate/up into
    another. ``embedding``: the target's (shared, as EAGLE and SGLang share it, where the widths agree);
    ``target_lm_head``: the target's, drafting where the checkpoint has no ``lm_head`` (``spec.head_from_target``)."""

    def __init__(self, spec: Eagle3Spec, tensors: dict[str, torch.Tensor], *, embedding: torch.Tensor,
                 target_lm_head: torch.Tensor, max_seq_len: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.spec, self.dtype, self.device = spec, dtype, torch.device(device)
        self.heads, self.kv_heads, self.head_dim, self.eps = spec.heads, spec.kv_heads, spec.head_dim, spec.eps
        put = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
        p = "midlayer."
        self.fc = put(tensors["fc.weight"])
        self.fc_bias = put(tensors["fc.bias"]) if "fc.bias" in tensors else None
        self.input_norm = put(tensors[p + "input_layernorm.weight"])
        self.hidden_norm = put(tensors[p + "hidden_norm.weight"])
        self.qkv = put(torch.cat([tensors[p + f"self_attn.{x}_proj.weight"] for x in "qkv"]))
        self.o_proj = put(tensors[p + "self_attn.o_proj.weight"])
        self.post_norm = put(tensors[p + "post_attention_layernorm.weight"])
        self.gate_up = put(torch.cat([tensors[p + "mlp.gate_proj.weight"], tensors[p + "mlp.up_proj.weight"]]))
        self.down = put(tensors[p + "mlp.down_proj.weight"])
        self.final_norm = put(tensors["norm.weight"])
        # the embedding: the target's where the widths agree (EAGLE loads it from the target and freezes it; SGLang's
        # worker shares it), else the checkpoint's own (the reader requires it then)
        own = tensors.get("embed_tokens.weight")
        self.embedding = embedding if spec.hidden == spec.target_hidden or own is None else put(own)
        if "lm_head.weight" in tensors:
            self.lm_head = put(tensors["lm_head.weight"])
        else:
            self.lm_head = self.embedding if spec.tie_word_embeddings else target_lm_head
        self.targets = draft_targets(spec, tensors).to(device)  # draft id -> target id
        self.cos, self.sin = rotary_tables(max_seq_len, spec.head_dim, spec.rope_base, device, spec.rope_scaling)

    def fuse(self, streams: torch.Tensor) -> torch.Tensor:
        """The target's captured streams [N, points x H_t] to the head's hidden input [N, H] (``fc``)."""
        return F.linear(streams.to(self.dtype), self.fc, self.fc_bias)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, start: int, cache: HeadCache) -> torch.Tensor:
        """The layer over ``tokens`` [T] (target ids) with their ``hidden`` [T, H] at positions ``start ..``, their K/V
        written into ``cache`` and attention over positions 0 .. each one: the outputs before the final norm [T, H]."""
        t, hd, nq, nkv = tokens.shape[0], self.head_dim, self.heads, self.kv_heads
        positions = torch.arange(start, start + t, device=self.device)
        cos, sin = self.cos[positions][None], self.sin[positions][None]
        e = rms_norm(F.embedding(tokens, self.embedding), self.input_norm, self.eps)
        g = rms_norm(hidden, self.hidden_norm, self.eps)
        qkv = F.linear(torch.cat([e, g], dim=-1), self.qkv)
        q = qkv[:, : nq * hd].view(1, t, nq, hd)
        k = qkv[:, nq * hd : (nq + nkv) * hd].view(1, t, nkv, hd)
        v = qkv[:, (nq + nkv) * hd :].view(t, nkv, hd)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        cache.put(start, k[0], v)
        keys, values = cache.k[: start + t].transpose(0, 1)[None], cache.v[: start + t].transpose(0, 1)[None]
        visible = torch.arange(start + t, device=self.device)[None, :] <= positions[:, None]  # [T, start + T]
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=visible,
                                              scale=1.0 / math.sqrt(hd), enable_gqa=True)
        x = hidden + F.linear(attn.transpose(1, 2).reshape(t, nq * hd), self.o_proj)
        gate, up = F.linear(rms_norm(x, self.post_norm, self.eps), self.gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.down)

    def draft(self, out: torch.Tensor) -> torch.Tensor:
        """The greedy draft after each row of ``out`` [N, H], as target ids [N] (the draft vocabulary's argmax, mapped
        through ``d2t``). Float32 logits on the CPU, as the target's (``Qwen2Engine.logits``)."""
        h = rms_norm(out, self.final_norm, self.eps)
        logits = F.linear(h.float(), self.lm_head.float()) if h.device.type == "cpu" else F.linear(h, self.lm_head)
        return self.targets[logits.argmax(-1)]

    def new_cache(self) -> HeadCache:
        return HeadCache(self.kv_heads, self.head_dim, self.dtype, self.device)

