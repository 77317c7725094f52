"""Architecture facts of the models this project targets, for checks that must work offline.

Config validation (TP against heads), memory estimates and the Triton end id need the model's
shape before any weights exist on this machine. Once a model directory is present its own
``config.json`` is read instead (``ModelShape.from_hf_config``); the catalog is only the fallback
for hub ids that have not been downloaded. Values from the models' published HF configs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ModelShape:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    eos_token_id: int
    bos_token_id: int | None = None
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_params(self) -> int:
        """Parameter count of the decoder (biases on q/k/v where its family has them, untied or tied head)."""
        from trtllm_pipeline.model.families import BY_ARCHITECTURE

        h, i, kv = self.hidden_size, self.intermediate_size, self.num_key_value_heads * self.head_dim
        family = BY_ARCHITECTURE.get(self.architecture)
        biases = h + 2 * kv if family is None or family.attention_bias else 0
        per_layer = h * h + 2 * h * kv + biases + h * h + 3 * h * i + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + embeddings + h

    def kv_bytes_per_token(self, bytes_per_elem: float) -> float:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * bytes_per_elem

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "ModelShape":
        eos = cfg.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0]
        return cls(
            architecture=(cfg.get("architectures") or ["?"])[0],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            vocab_size=cfg["vocab_size"],
            max_position_embeddings=cfg.get("max_position_embeddings", 32768),
            rope_theta=float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            eos_token_id=int(eos) if eos is not None else -1,
            bos_token_id=cfg.get("bos_token_id"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> "ModelShape":
        return cls.from_hf_config(json.loads((Path(model_dir) / "config.json").read_text()))


KNOWN_MODELS: dict[str, ModelShape] = {
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": ModelShape(
        architecture="Qwen2ForCausalLM",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        max_position_embeddings=131072,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        eos_token_id=151643,
        bos_token_id=151646,
    ),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": ModelShape(
        architecture="Qwen2ForCausalLM",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=131072,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        eos_token_id=151643,
        bos_token_id=151646,
    ),
    # The real model `builtin:smollm2-135m-instruct` converts from its GGUF (model.builtin), known before converting.
    "HuggingFaceTB/SmolLM2-135M-Instruct": ModelShape(
        architecture="LlamaForCausalLM",
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        eos_token_id=2,
        bos_token_id=1,
        tie_word_embeddings=True,
    ),
}


# The published TensorRT-LLM recipe for DeepSeek-R1-Distill-Qwen-7B on one H200 (four for TP=4):
# decode ms per output token at batch 1. The figures this project's builds are compared with in the
# report; published by NVIDIA, never measured here.
REFERENCE_RECIPE_MS_PER_TOKEN: tuple[tuple[str, float], ...] = (
    ("BF16", 11.35),
    ("FP8", 6.68),
    ("FP8 + low-latency GEMM plugin", 5.05),
    ("FP8, TP=4", 3.15),
)
