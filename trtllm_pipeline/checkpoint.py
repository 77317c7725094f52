"""The TensorRT-LLM checkpoint format (1.x): ``config.json`` plus one ``rank{i}.safetensors`` per rank.

Everything this project knows about the format lives here: the tensor names for a Qwen2 decoder,
how tensor parallelism shards them (TensorRT-LLM's rules, followed by ModelOpt's exporter), the
``config.json`` fields ModelOpt's export leaves out, and the checks a checkpoint must pass before
an engine is built from it or the torch runtime executes it.

Sharding rules (per rank r of tp):
  attention.qkv   rows: [q heads of r | k heads of r | v heads of r]; KV heads are replicated
                  when tp exceeds them (rank r holds KV head r * kv // tp); bias likewise.
  attention.dense columns (row-parallel: input features split).
  mlp.fc, mlp.gate rows (column-parallel); mlp.proj columns (row-parallel).
  lm_head         rows, after padding the vocabulary to a multiple of tp.
  vocab_embedding rows when use_parallel_embedding (dim 0), else replicated.
  layernorms and per-tensor scaling factors: replicated.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from trtllm_pipeline.errors import InputError

LINEAR_MODULES = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")
ROW_PARALLEL = ("attention.dense", "mlp.proj")  # split along input features (dim 1)
FP8_SCALES = ("weights_scaling_factor", "activation_scaling_factor")

# HF Qwen2 module -> TensorRT-LLM module. Note fc is the *gate* (activated) branch, gate is *up*.
HF_TO_TRTLLM = {
    "self_attn.o_proj": "attention.dense",
    "mlp.gate_proj": "mlp.fc",
    "mlp.up_proj": "mlp.gate",
    "mlp.down_proj": "mlp.proj",
    "input_layernorm": "input_layernorm",
    "post_attention_layernorm": "post_layernorm",
}


class CheckpointError(InputError):
    """A checkpoint file is missing, truncated or does not match its config."""


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
    """Shapes implied by a checkpoint's config.json."""

    config: dict[str, Any]

    @property
    def tp(self) -> int:
        return int(self.config.get("mapping", {}).get("tp_size", 1))

    @property
    def pp(self) -> int:
        return int(self.config.get("mapping", {}).get("pp_size", 1))

    @property
    def world_size(self) -> int:
        return int(self.config.get("mapping", {}).get("world_size", self.tp * self.pp))

    @property
    def hidden(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def heads(self) -> int:
        return int(self.config["num_attention_heads"])

    @property
    def kv_heads(self) -> int:
        return int(self.config.get("num_key_value_heads") or self.heads)

    @property
    def head_size(self) -> int:
        return int(self.config.get("head_size") or self.hidden // self.heads)

    @property
    def intermediate(self) -> int:
        return int(self.config["intermediate_size"])

    @property
    def layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def vocab(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def padded_vocab(self) -> int:
        return math.ceil(self.vocab / self.tp) * self.tp

    @property
    def kv_heads_per_rank(self) -> int:
        return max(1, self.kv_heads // self.tp)

    @property
    def quant_algo(self) -> str | None:
        return (self.config.get("quantization") or {}).get("quant_algo")

    @property
    def kv_cache_quant_algo(self) -> str | None:
        return (self.config.get("quantization") or {}).get("kv_cache_quant_algo")

    @property
    def exclude_modules(self) -> list[str]:
        return list((self.config.get("quantization") or {}).get("exclude_modules") or [])

    @property
    def parallel_embedding(self) -> bool:
        return bool(self.config.get("use_parallel_embedding")) and self.tp > 1

    def rank_shapes(self) -> dict[str, tuple[int, ...]]:
        """Expected shape of every tensor in one rank's file (all ranks have the same shapes)."""
        tp, h, hd = self.tp, self.hidden, self.head_size
        qkv_rows = (self.heads // tp + 2 * self.kv_heads_per_rank) * hd
        vocab_rows = self.padded_vocab // tp
        shapes: dict[str, tuple[int, ...]] = {
            "transformer.vocab_embedding.weight": (vocab_rows if self.parallel_embedding else self.vocab, h),
            "transformer.ln_f.weight": (h,),
            "lm_head.weight": (vocab_rows, h),
        }
        linear = {
            "attention.qkv": (qkv_rows, h),
            "attention.dense": (h, self.heads * hd // tp),
            "mlp.fc": (self.intermediate // tp, h),
            "mlp.gate": (self.intermediate // tp, h),
            "mlp.proj": (h, self.intermediate // tp),
        }
        for i in range(self.layers):
            p = f"transformer.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "post_layernorm.weight"] = (h,)
            shapes[p + "attention.qkv.bias"] = (qkv_rows,)
            for module, shape in linear.items():
                shapes[p + module + ".weight"] = shape
                if self.quant_algo == "FP8":
                    for scale in FP8_SCALES:
                        shapes[f"{p}{module}.{scale}"] = (1,)
            if self.kv_cache_quant_algo:
                shapes[p + "attention.kv_cache_scaling_factor"] = (1,)
        return shapes


# --------------------------------------------------------------------------- config.json


def read_config(ckpt_dir: Path) -> dict[str, Any]:
    path = Path(ckpt_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing; {ckpt_dir} is not a TensorRT-LLM checkpoint.",
                              fix="run `trtllm-pipeline quantize -c CONFIG` to produce it") from None
    except ValueError as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}).", fix="re-run quantize with --force") from None
    missing = [k for k in ("architecture", "dtype", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "vocab_size", "mapping") if k not in config]
    if missing:
        raise CheckpointError(f"{path} lacks required fields {missing}.", fix="re-run quantize with --force")
    return config


def complete_config(config: dict[str, Any], hf_config: dict[str, Any], *, dtype: str, tp: int, pp: int,
                    kv_cache_quant_algo: str | None) -> dict[str, Any]:
    """Fill in what ModelOpt's export leaves out or gets wrong, as TensorRT-LLM's quantize.py does.

    ModelOpt writes one config.json whose ``rank`` is the last rank it exported, omits ``qwen_type``
    (TensorRT-LLM's QWen model class needs it to pick Qwen2's layout), and with transformers 5 drops
    ``rotary_base``; ``architecture`` falls back to QWenForCausalLM without HF ``architectures``.
    """
    config = dict(config)
    arch = (hf_config.get("architectures") or [config.get("architecture")])[0]
    config["architecture"] = arch
    config["dtype"] = dtype
    config["rank"] = 0
    config["mapping"] = {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    if arch.startswith("Qwen"):
        config["qwen_type"] = {"Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2_moe",
                               "Qwen3ForCausalLM": "qwen3"}.get(arch, "qwen")
    rope_theta = hf_config.get("rope_theta") or (hf_config.get("rope_parameters") or {}).get("rope_theta")
    if rope_theta is not None:
        config["rotary_base"] = float(rope_theta)
    config["rotary_scaling"] = hf_config.get("rope_scaling")
    config["norm_epsilon"] = hf_config.get("rms_norm_eps", config.get("norm_epsilon"))
    config["intermediate_size"] = hf_config.get("intermediate_size", config.get("intermediate_size"))
    config["max_position_embeddings"] = hf_config.get("max_position_embeddings", config.get("max_position_embeddings"))
    quant = dict(config.get("quantization") or {})
    quant["kv_cache_quant_algo"] = kv_cache_quant_algo
    config["quantization"] = quant
    return config


# --------------------------------------------------------------------------- loading and checks


def load_rank_files(ckpt_dir: Path, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Read every ``rank{i}.safetensors`` and check names, shapes, dtypes and scales.

    Raises ``CheckpointError`` naming the file and tensor on the first problem.
    """
    import torch
    from safetensors.torch import load_file

    layout = CheckpointLayout(config)
    expected = layout.rank_shapes()
    fp8 = layout.quant_algo == "FP8"
    dtype = getattr(torch, config["dtype"])
    files = sorted(Path(ckpt_dir).glob("rank*.safetensors"))
    if len(files) != layout.world_size:
        raise CheckpointError(
            f"{ckpt_dir} holds {len(files)} rank files but its config.json says world_size {layout.world_size}.",
            fix="re-run quantize with --force",
        )
    shards = []
    for rank in range(layout.world_size):
        path = Path(ckpt_dir) / f"rank{rank}.safetensors"
        try:
            tensors = load_file(path)
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing.", fix="re-run quantize with --force") from None
        except Exception as exc:
            raise CheckpointError(f"{path} is unreadable or truncated ({exc}).",
                                  fix="re-run quantize with --force") from None
        for name, shape in expected.items():
            if name not in tensors:
                raise CheckpointError(f"{path}: tensor {name} is missing.", fix="re-run quantize with --force")
            t = tensors[name]
            if tuple(t.shape) != shape:
                raise CheckpointError(
                    f"{path}: tensor {name} has shape {tuple(t.shape)}, expected {shape} for tp={layout.tp}.",
                    fix="re-run quantize with --force",
                )
            want = _expected_dtype(name, fp8, dtype, torch)
            if t.dtype != want:
                raise CheckpointError(f"{path}: tensor {name} is {t.dtype}, expected {want}.",
                                      fix="re-run quantize with --force")
            if name.endswith("scaling_factor") and not bool(torch.isfinite(t).all() and (t > 0).all()):
                raise CheckpointError(f"{path}: scaling factor {name} is {t.tolist()}; it must be finite and positive.",
                                      fix="re-calibrate: re-run quantize with --force")
        shards.append(tensors)
    return shards


def _expected_dtype(name: str, fp8: bool, dtype, torch):
    if name.endswith("scaling_factor"):
        return torch.float32
    if fp8 and name.endswith(".weight") and any(f".{m}.weight" in name for m in LINEAR_MODULES):
        return torch.float8_e4m3fn
    return dtype


def merge_rank_files(config: dict[str, Any], shards: list[dict[str, Any]]) -> dict[str, Any]:
    """Reassemble TP shards into the full tensors (TensorRT-LLM names, unsharded shapes).

    Replicated tensors and replicated KV heads must be identical on every rank that holds them;
    a mismatch means the shards do not come from one model and raises ``CheckpointError``.
    """
    import torch

    layout = CheckpointLayout(config)
    tp, hd = layout.tp, layout.head_size
    if tp == 1:
        return dict(shards[0])
    q_rows, kv_rows = layout.heads // tp * hd, layout.kv_heads_per_rank * hd
    kv_owner = [r for r in range(tp) if layout.kv_heads >= tp or (r * layout.kv_heads) % tp == 0]
    merged: dict[str, Any] = {}
    for name in shards[0]:
        parts = [s[name] for s in shards]
        if name.endswith(("attention.qkv.weight", "attention.qkv.bias")):
            q = [p[:q_rows] for p in parts]
            k = [parts[r][q_rows : q_rows + kv_rows] for r in kv_owner]
            v = [parts[r][q_rows + kv_rows :] for r in kv_owner]
            _check_replicas(name, parts, q_rows, kv_rows, layout, torch)
            merged[name] = torch.cat(_as_bytes(q + k + v, torch)).view(parts[0].dtype)
        elif any(name.endswith(f"{m}.weight") for m in ROW_PARALLEL):
            merged[name] = _cat(parts, 1, torch)
        elif any(name.endswith(f"{m}.weight") for m in ("mlp.fc", "mlp.gate")):
            merged[name] = _cat(parts, 0, torch)
        elif name == "lm_head.weight" or (name == "transformer.vocab_embedding.weight" and layout.parallel_embedding):
            merged[name] = _cat(parts, 0, torch)[: layout.vocab]
        else:
            for rank, p in enumerate(parts[1:], start=1):
                if not torch.equal(_raw(p, torch), _raw(parts[0], torch)):
                    raise CheckpointError(f"rank{rank}.safetensors: replicated tensor {name} differs from rank 0.",
                                          fix="re-run quantize with --force")
            merged[name] = parts[0]
    return merged


def _check_replicas(name, parts, q_rows, kv_rows, layout, torch) -> None:
    if layout.kv_heads >= layout.tp:
        return
    group = layout.tp // layout.kv_heads
    for r in range(layout.tp):
        owner = r - r % group
        if not torch.equal(_raw(parts[r][q_rows:], torch), _raw(parts[owner][q_rows:], torch)):
            raise CheckpointError(f"rank{r}.safetensors: replicated KV heads in {name} differ from rank{owner}.",
                                  fix="re-run quantize with --force")


def _raw(t, torch):
    """View FP8 tensors as bytes: some torch builds cannot compare or concatenate float8."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _as_bytes(parts, torch):
    return [_raw(p, torch) for p in parts]


def _cat(parts, dim, torch):
    return torch.cat(_as_bytes(parts, torch), dim=dim).view(parts[0].dtype)


def load_checkpoint(ckpt_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Config and full (merged) tensors of a checked checkpoint."""
    config = read_config(ckpt_dir)
    return config, merge_rank_files(config, load_rank_files(ckpt_dir, config))
