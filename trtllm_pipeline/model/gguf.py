"""GGUF files as a model source: ``model.source: gguf:PATH`` (a ``.gguf`` file, or a directory holding one).

A GGUF file (llama.cpp's format, how much of the open-model world shares models) is converted once through
transformers (``from_pretrained(dir, gguf_file=...)``, which dequantizes every tensor) into an ordinary HF model
directory in the cache: ``model.safetensors`` in float32 (the dequantized values exactly: a Q4_1 weight is
``d * q + m`` with 16-bit ``d`` and ``m``, which bfloat16 cannot hold), ``config.json``, the tokenizer with its
chat template, and a ``manifest.json`` that records the file, its sha256 and its own quantization (the HF
weights are its dequantized values, so a "BF16 baseline" built from it carries the GGUF's quantization error).
The cache is keyed by the file's sha256: another file, or the same name with other bytes, converts anew.

Checked before any conversion, each an exit 2 naming the file: not a GGUF file (magic), truncated or unreadable
(its header and tensor table must fit the file), an architecture the torch runtime does not implement
(``model.families``).
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

from trtllm_pipeline.artifacts import atomic_dir, file_sha256, package_versions, write_manifest
from trtllm_pipeline.errors import InputError, UnavailableError

GGUF_PREFIX = "gguf:"
GGUF_MAGIC = b"GGUF"
CONVERT_REVISION = "v1"  # bump when the conversion changes, so cached conversions are redone
# llama.cpp's general.architecture -> the HF architecture transformers converts it to (families that run here)
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
FIX = "point model.source at an intact .gguf file (llama.cpp's format), e.g. gguf:/models/name.Q4_K_M.gguf"


def find_gguf(path: Path) -> Path:
    """The .gguf file ``path`` names: itself, or the one .gguf in the directory."""
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            what = "no .gguf file" if not found else f"{len(found)} .gguf files ({', '.join(p.name for p in found[:3])})"
            raise InputError(f"model.source: {path} holds {what}.", fix="name the file: gguf:DIR/NAME.gguf")
        return found[0]
    if not path.is_file():
        raise InputError(f"model.source: {path} does not exist.", fix=FIX)
    return path


def inspect(path: Path) -> dict[str, Any]:
    """The GGUF's header facts (architecture, quantization, shape), checked: raises ``InputError`` naming the file
    and what is wrong (not GGUF, truncated, unsupported architecture); ``UnavailableError`` without ``gguf``."""
    from trtllm_pipeline.model import families

    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise InputError(f"model.source: {path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}).",
                         fix=FIX)
    try:
        import gguf
    except ImportError:
        raise UnavailableError("reading GGUF files needs the `gguf` and `accelerate` packages.",
                               fix="pip install gguf accelerate (`make setup` installs them)") from None
    try:
        reader = gguf.GGUFReader(path)
        fields = {name: field.contents() for name, field in reader.fields.items()
                  if not name.startswith("tokenizer.ggml.") or name.endswith("_id")}
        tensor_types = collections.Counter(t.tensor_type.name for t in reader.tensors)
        end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    except Exception as exc:  # the reader's own errors: a short read, a bad offset, a value it cannot parse
        raise InputError(f"model.source: {path} is not a readable GGUF file ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); truncated or damaged?",
                         fix=FIX) from None
    size = path.stat().st_size
    if end > size:
        raise InputError(f"model.source: {path} is truncated: its tensors end at byte {end:,}, the file has {size:,}.",
                         fix=FIX)
    arch = fields.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise InputError(f"model.source: {path} holds a {arch!r} model; the GGUF import converts "
                         f"{', '.join(sorted(GGUF_ARCHITECTURES))} (the families the torch runtime implements: "
                         f"{', '.join(families.supported_architectures())}).", fix="use a model of one of those families")
    file_type = fields.get("general.file_type")
    try:
        file_type_name = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        file_type_name = str(file_type)
    return {"architecture": arch, "hf_architecture": GGUF_ARCHITECTURES[arch], "name": fields.get("general.name"),
            "file_type": file_type_name, "tensor_types": dict(sorted(tensor_types.items())),
            "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": fields.get("tokenizer.ggml.eos_token_id"),
            "pad_token_id": fields.get("tokenizer.ggml.padding_token_id"),
            "unk_token_id": fields.get("tokenizer.ggml.unknown_token_id"),
            "context_length": fields.get(f"{arch}.context_length"), "size": size}


def cache_dir_for(path: Path, cache_models: Path, sha256: str) -> Path:
    return cache_models / f"gguf-{path.stem}-{sha256[:16]}-{CONVERT_REVISION}"


def converted_dir(path: Path, cache_models: Path, *, extra: dict[str, Any] | None = None) -> Path:
    """The HF model directory converted from the GGUF file ``path`` (converting it on first use); ``extra`` goes
    into its manifest (e.g. the package that shipped the file)."""
    gguf_file = find_gguf(path.expanduser().resolve())
    facts = inspect(gguf_file)
    sha = file_sha256(gguf_file)
    target = cache_dir_for(gguf_file, cache_models, sha)
    if (target / "manifest.json").is_file():
        return target
    with atomic_dir(target) as tmp:
        _convert(gguf_file, facts, tmp)
        write_manifest(tmp, {"stage": "model/gguf", "gguf": {"path": str(gguf_file), "sha256": sha, **facts},
                             "weights": "the GGUF's tensors dequantized by transformers, float32",
                             "versions": package_versions("transformers", "gguf", "torch"), **(extra or {})})
    return target


def _convert(gguf_file: Path, facts: dict[str, Any], out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from trtllm_pipeline.console import quiet

    try:
        import accelerate  # noqa: F401  (transformers' GGUF loading needs it)
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise UnavailableError("converting a GGUF file needs the `gguf` and `accelerate` packages.",
                               fix="pip install gguf accelerate (`make setup` installs them)") from None
    try:
        with quiet():
            tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
            model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name,
                                                         dtype=torch.float32)
    except Exception as exc:
        raise InputError(f"model.source: transformers cannot convert {gguf_file} ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}).", fix=FIX) from None
    # The state dict, not save_pretrained: some transformers 5.x releases refuse to save a GGUF-loaded model.
    # Tied embeddings are saved once, as the hub's checkpoints are (lm_head.weight is the embedding).
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.update(architectures=[facts["hf_architecture"]], torch_dtype="float32")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if facts.get(key) is not None:
            config[key] = int(facts[key])
    config.pop("_name_or_path", None)
    config.pop("transformers_version", None)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    (out / "generation_config.json").write_text(json.dumps({**generation, "do_sample": False}, indent=2) + "\n")
    _write_tokenizer(tokenizer, facts, config, out)


def _write_tokenizer(tokenizer, facts: dict[str, Any], config: dict[str, Any], out: Path) -> None:
    """tokenizer.json as transformers converted it, and a tokenizer_config.json written here: the special tokens
    by the GGUF's own ids (transformers 5.14 takes the BOS for the EOS), the chat template inside it (so 4.x
    reads it too), ``PreTrainedTokenizerFast`` (a class both 4.x and 5.x load), no clean-up of spaces (it
    corrupts byte-level BPE text)."""
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    token = lambda key: tokenizer.convert_ids_to_tokens(int(facts[key])) if facts.get(key) is not None else None  # noqa: E731
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "pad_token": token("pad_token_id") or token("eos_token_id"),
        "unk_token": token("unk_token_id"),
        "model_max_length": int(facts.get("context_length") or config.get("max_position_embeddings") or 4096),
        "clean_up_tokenization_spaces": False,
        "chat_template": tokenizer.chat_template,
    }
    tokenizer_config = {k: v for k, v in tokenizer_config.items() if v is not None}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
