"""``builtin:tiny-qwen2``: a Qwen2ForCausalLM generated on this machine from a fixed seed.

No model hub is reachable where this project is developed and tested, so the demo and the tests
run on a model made locally: the Qwen2 architecture of DeepSeek-R1-Distill-Qwen at a few MB, with
8 attention heads and 2 KV heads (so TP=4 replicates KV heads as it does for the 1.5B model), a
real byte-level BPE tokenizer with the R1-distill special tokens and chat template, saved as an
ordinary HF model directory. Every stage treats it exactly like a downloaded checkpoint.

Weights are random (no training happens here). They are drawn with a larger spread than HF's
default init so that logits are peaked rather than flat: greedy decoding is then stable under the
small numeric differences between runtimes, as it is for a trained model.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from importlib import resources
from pathlib import Path

from trtllm_pipeline.artifacts import atomic_dir

BUILTIN_PREFIX = "builtin:"
TINY_QWEN2 = "tiny-qwen2"
TINY_QWEN2_REVISION = "v1"  # bump when the generator changes, so caches regenerate
TINY_QWEN2_SEED = 20250120
TINY_QWEN2_VOCAB_SIZE = 8192
# (token, special). Order and specialness follow DeepSeek-R1-Distill-Qwen's added tokens; the
# `<think>` pair is not special there, so it survives skip_special_tokens.
TINY_QWEN2_SPECIAL_TOKENS = [
    ("<｜end▁of▁sentence｜>", True),
    ("<｜User｜>", True),
    ("<｜Assistant｜>", True),
    ("<｜begin▁of▁sentence｜>", True),
    ("<|EOT|>", True),
    ("<think>", False),
    ("</think>", False),
]
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"

# The R1-distill conversation format: BOS, system text, `<｜User｜>` turns, `<｜Assistant｜>` turns
# closed by EOS with any reasoning before `</think>` dropped, and a generation prompt that opens
# the assistant's `<think>` block.
R1_DISTILL_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages if m['role'] == 'system' %}{{ m['content'] }}{% endfor %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
    "{% elif m['role'] == 'assistant' %}"
    "{% set content = m['content'] %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}"
)

TINY_QWEN2_ARCH = dict(
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=8192,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)

BUILTIN_MODELS = {TINY_QWEN2: TINY_QWEN2_REVISION}


def cache_root() -> Path:
    """Where generated models live: $TRTLLM_PIPELINE_CACHE, else ~/.cache/trtllm-pipeline."""
    env = os.environ.get("TRTLLM_PIPELINE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "trtllm-pipeline"


def tokenizer_asset() -> Path:
    return Path(str(resources.files("trtllm_pipeline") / "assets" / "tiny_qwen2_tokenizer.json"))


def builtin_model_dir(name: str) -> Path:
    """The generated model's directory, creating it on first use (atomically, about a second)."""
    if name not in BUILTIN_MODELS:
        raise KeyError(name)
    target = cache_root() / "models" / f"{name}-{BUILTIN_MODELS[name]}"
    if not (target / "config.json").is_file():
        with atomic_dir(target) as tmp:
            _generate_tiny_qwen2(tmp)
    return target


def _generate_tiny_qwen2(out: Path) -> None:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    shutil.copyfile(tokenizer_asset(), out / "tokenizer.json")
    # Written by hand rather than by save_pretrained: transformers 5 would record its own
    # "TokenizersBackend" class, which 4.x cannot load. PreTrainedTokenizerFast loads tokenizer.json
    # verbatim (BOS added by its post-processor, like R1-distill's tokenizer) in both.
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "model_max_length": TINY_QWEN2_ARCH["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": R1_DISTILL_CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))

    bos_id, eos_id = tokenizer.convert_tokens_to_ids([BOS, EOS])
    config = Qwen2Config(
        vocab_size=TINY_QWEN2_VOCAB_SIZE,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        architectures=["Qwen2ForCausalLM"],
        **TINY_QWEN2_ARCH,
    )
    model = Qwen2ForCausalLM(config)
    # Explicit, name-seeded init: independent of HF's init order and of transformers' version.
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            gen = torch.Generator().manual_seed(TINY_QWEN2_SEED + _stable_hash(name))
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
            elif "embed_tokens" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
            else:
                gain = 2.5 if name.startswith("lm_head") else 1.0
                param.copy_(gain / math.sqrt(param.shape[1]) * torch.randn(param.shape, generator=gen))
    model = model.to(torch.bfloat16)
    model.generation_config.bos_token_id = bos_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    model.save_pretrained(out, safe_serialization=True)
    # Keep config.json free of generator-specific noise, as a hub checkpoint would be.
    cfg = json.loads((out / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _stable_hash(name: str) -> int:
    """A seed offset per parameter name that does not change between Python processes."""
    value = 0
    for ch in name.encode():
        value = (value * 131 + ch) % 1_000_003
    return value
