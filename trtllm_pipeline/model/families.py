"""Model families: what differs between the decoder architectures this project runs, in one registry.

Every stage asks here, by the checkpoint's architecture (HF ``architectures[0]``, or the TensorRT-LLM
checkpoint's ``architecture``), before it does any work: ``quantize`` (the ModelOpt export's decoder type, the
TensorRT-LLM architecture), the checkpoint checks (whether ``attention.qkv`` has a bias), and the torch engine
(its eager model, TP shard and CUDA fast path take the attention bias, the tied embedding and the rotary table
from the family). A family that is not here, or a rope scaling the runtime does not implement, is refused with
the reason (``InputError``, exit 2).

All families here are pre-norm decoders with RMSNorm, grouped-query attention with GPT-NeoX rotary embedding
(rotate halves) and a gated SiLU MLP; what differs is below. Adding one: docs/architecture.md, "A model family".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trtllm_pipeline.errors import InputError


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    name: str
    architectures: tuple[str, ...]  # HF ``architectures[0]`` values (TensorRT-LLM's checkpoint keeps the same name)
    modelopt_decoder: str  # ModelOpt's export_tensorrt_llm_checkpoint(decoder_type=...)
    attention_bias: bool  # q/k/v projections carry biases (TensorRT-LLM: ``attn_bias``; its QWen default is True)
    rope_scaling: tuple[str, ...] = ()  # rope scaling types the runtime implements besides none


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("qwen2", ("Qwen2ForCausalLM",), modelopt_decoder="qwen", attention_bias=True,
                rope_scaling=("linear",)),
    # Mistral is Llama with (in its first release) sliding-window attention, refused below when it is on.
    ModelFamily("llama", ("LlamaForCausalLM", "MistralForCausalLM"), modelopt_decoder="llama", attention_bias=False,
                rope_scaling=("linear", "llama3")),
)
BY_ARCHITECTURE = {arch: family for family in FAMILIES for arch in family.architectures}
# Rope scalings that exist but are not implemented here (each changes the rotary table with the sequence length
# or scales attention too); named so that the refusal can say what the checkpoint asks for.
UNIMPLEMENTED_ROPE = {"dynamic": "dynamic NTK (its base changes with the sequence length)",
                      "yarn": "YaRN (frequency blend plus an attention temperature)",
                      "longrope": "LongRoPE (per-frequency factors switched on the sequence length)",
                      "su": "LongRoPE", "mrope": "multimodal rope"}


def supported_architectures() -> list[str]:
    return sorted(BY_ARCHITECTURE)


def family(architecture: str | None, *, where: str = "the model") -> ModelFamily:
    """The family of ``architecture``; ``InputError`` naming it and what is supported otherwise."""
    if architecture in BY_ARCHITECTURE:
        return BY_ARCHITECTURE[architecture]
    raise InputError(f"{where} is a {architecture!r}; the torch runtime implements "
                     f"{', '.join(supported_architectures())}.",
                     fix="use a model of one of those architectures (Mistral and Llama 2/3 checkpoints are Llama)")


def rope_scaling(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """A config's rope scaling as one dict with ``rope_type`` (None: plain rotary). Reads HF's ``rope_scaling``
    (transformers 4.x and hub configs), ``rope_parameters`` (transformers 5) and TensorRT-LLM's
    ``rotary_scaling`` (``type`` or ``rope_type``, as its attention layer reads it)."""
    raw = cfg.get("rotary_scaling") or cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not raw:
        return None
    scaling = {k: v for k, v in dict(raw).items() if k not in ("rope_theta", "type")}
    kind = raw.get("rope_type") or raw.get("type") or "default"
    if kind == "default":
        return None
    return {**scaling, "rope_type": kind}


def check(cfg: dict[str, Any], *, where: str = "the model") -> ModelFamily:
    """The family of an HF ``config.json`` or a TensorRT-LLM checkpoint's config, refusing what the runtime
    does not implement: the architecture, a rope scaling type, sliding-window attention."""
    arch = cfg.get("architecture") or (cfg.get("architectures") or [None])[0]
    fam = family(arch, where=where)
    scaling = rope_scaling(cfg)
    if scaling is not None and scaling["rope_type"] not in fam.rope_scaling:
        kind = scaling["rope_type"]
        what = UNIMPLEMENTED_ROPE.get(kind, "a rope scaling this project does not know")
        raise InputError(f"{where} ({arch}) uses rope scaling {kind!r}: {what}; the torch runtime implements "
                         f"{', '.join(fam.rope_scaling) or 'none'} for {fam.name}.",
                         fix="use a checkpoint without it, or add it to model/families.py (rope_inv_freq)")
    window = cfg.get("sliding_window")
    if window and cfg.get("use_sliding_window", True) and window < int(cfg.get("max_position_embeddings") or 0):
        raise InputError(f"{where} ({arch}) uses sliding-window attention ({window} tokens); the torch runtime "
                         "attends to the whole context.", fix="use a checkpoint without a sliding window")
    return fam


def attention_bias(config: dict[str, Any]) -> bool:
    """Whether a TensorRT-LLM checkpoint's ``attention.qkv`` has a bias: its ``attn_bias``, else the family's
    (TensorRT-LLM's defaults: QWenConfig True, LLaMAConfig False)."""
    if "attn_bias" in config:
        return bool(config["attn_bias"])
    fam = BY_ARCHITECTURE.get(config.get("architecture"))
    return True if fam is None else fam.attention_bias


def rope_inv_freq(head_dim: int, base: float, scaling: dict[str, Any] | None):
    """The rotary embedding's inverse frequencies (float64, ``head_dim / 2``), with the rope scaling applied:
    ``linear`` divides every frequency by the factor (positions / factor); ``llama3`` (Llama 3.1+) divides the
    low frequencies (wavelength above ``original_max_position_embeddings / low_freq_factor``) by the factor,
    keeps the high ones (below ``/ high_freq_factor``) and blends in between, smoothly in the wavelength."""
    import torch

    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv_freq
    kind, factor = scaling["rope_type"], float(scaling.get("factor", 1.0))
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        original = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        smooth = ((original / wavelen - low) / (high - low)).clamp(0.0, 1.0)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return torch.where(wavelen > original / low, inv_freq / factor,
                           torch.where(wavelen < original / high, inv_freq, blended))
    raise InputError(f"rope scaling {kind!r} is not implemented.", fix="see model/families.py")
