"""The TensorRT-LLM checkpoint format (1.x): ``config.json`` plus one ``rank{i}.safetensors`` per rank.

Everything this project knows about the format lives here: the tensor names for a Qwen2 or LLaMA decoder,
the tensors each quantization format stores per linear layer (``FORMAT_TENSORS``: dtype, shape,
which dimension runs over output and which over input features), how tensor parallelism shards
them (TensorRT-LLM's rules, followed by ModelOpt's exporter), the ``config.json`` fields ModelOpt's
export leaves out, and the checks a checkpoint must pass before an engine is built from it or the
torch runtime executes it.

Sharding rules (per rank r of tp), for every tensor of a linear layer by what its dimensions index:
  column-parallel (attention.qkv, mlp.fc, mlp.gate): split along the output-feature dimension
                  (weights, biases, per-channel and per-group scales); tensors indexed only by input
                  features (AWQ / SmoothQuant pre-quant scales) and per-tensor scales are replicated.
                  attention.qkv rows are [q heads of r | k heads of r | v heads of r]; KV heads are
                  replicated when tp exceeds them (rank r holds KV head r * kv // tp).
  row-parallel (attention.dense, mlp.proj): split along the input-feature dimension (weights,
                  per-group scales, pre-quant scales); per-channel (output) and per-tensor scales are
                  replicated.
  lm_head         rows, after padding the vocabulary to a multiple of tp.
  vocab_embedding rows when use_parallel_embedding (dim 0), else replicated.
  layernorms: replicated.
Packed 4-bit weights count two features per stored element: INT4 (AWQ) packs two output rows per
byte (``(out/2, in)`` int8, row 2j in the low nibble), NVFP4 two input columns (``(out, in/2)``
uint8, column 2k in the low nibble); a split along a packed dimension is a split of its pairs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from trtllm_pipeline import artifacts
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.model import families

LINEAR_MODULES = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")
ROW_PARALLEL = ("attention.dense", "mlp.proj")  # split along input features (dim 1)
FP8_SCALES = ("weights_scaling_factor", "activation_scaling_factor")


@dataclasses.dataclass(frozen=True)
class TensorRule:
    """One tensor a quantization format stores per linear layer (``<layer>.<suffix>``).

    ``dtype``: a torch dtype name, or ``compute`` (the checkpoint's dtype). ``out_dim`` / ``in_dim``:
    the dimension that runs over output / input features (None: none does); ``out_unit`` / ``in_unit``:
    features per stored element along it (2 for packed 4-bit weights, the group size for per-group
    scales). ``scalar``: the shape of a per-tensor scale, as ModelOpt writes it.
    """

    suffix: str
    dtype: str
    out_dim: int | None = None
    in_dim: int | None = None
    out_unit: int = 1
    in_unit: int = 1
    scalar: tuple[int, ...] | None = None

    def shape(self, out_features: int, in_features: int) -> tuple[int, ...]:
        if self.scalar is not None:
            return self.scalar
        dims = {}
        if self.out_dim is not None:
            dims[self.out_dim] = out_features // self.out_unit
        if self.in_dim is not None:
            dims[self.in_dim] = in_features // self.in_unit
        return tuple(dims[d] for d in range(len(dims)))


GROUP = -1  # in_unit placeholder: the checkpoint's group size (quantization.group_size)
_WEIGHT = TensorRule("weight", "compute", out_dim=0, in_dim=1)
_PREQUANT = TensorRule("prequant_scaling_factor", "compute", in_dim=0)
# What each quant_algo stores per linear layer: ModelOpt 0.47's export (model_config_utils.pack_linear_weights,
# postprocess._split_model_config_for_tp), read by TensorRT-LLM 1.2's loader (modeling_utils.preprocess_perlayer_weights)
# as tests/fixtures/trtllm_1_2_quant_formats.json records.
FORMAT_TENSORS: dict[str | None, tuple[TensorRule, ...]] = {
    None: (_WEIGHT,),
    "FP8": (TensorRule("weight", "float8_e4m3fn", out_dim=0, in_dim=1),
            TensorRule("weights_scaling_factor", "float32", scalar=(1,)),
            TensorRule("activation_scaling_factor", "float32", scalar=(1,))),
    "W4A16_AWQ": (TensorRule("weight", "int8", out_dim=0, in_dim=1, out_unit=2),
                  TensorRule("weights_scaling_factor", "float32", out_dim=0, in_dim=1, in_unit=GROUP),
                  _PREQUANT),
    "W4A8_AWQ": (TensorRule("weight", "int8", out_dim=0, in_dim=1, out_unit=2),
                 TensorRule("weights_scaling_factor", "float32", out_dim=0, in_dim=1, in_unit=GROUP),
                 TensorRule("weights_scaling_factor_2", "float32", scalar=(1,)),
                 TensorRule("activation_scaling_factor", "float32", scalar=(1,)),
                 _PREQUANT),
    "W8A8_SQ_PER_CHANNEL": (TensorRule("weight", "int8", out_dim=0, in_dim=1),
                            TensorRule("weights_scaling_factor", "float32", out_dim=0),
                            TensorRule("activation_scaling_factor", "float32", scalar=(1,)),
                            _PREQUANT),
    # TensorRT-LLM quantizes W8A16 itself at build time (weight_only_quantize_dict), from the weights in
    # the checkpoint's dtype; its own quantize.py exports int8_wo so (quantize_by_modelopt: EMPTY_CFG).
    "W8A16": (_WEIGHT,),
    "NVFP4": (TensorRule("weight", "uint8", out_dim=0, in_dim=1, in_unit=2),
              TensorRule("weights_scaling_factor", "float8_e4m3fn", out_dim=0, in_dim=1, in_unit=GROUP),
              TensorRule("weights_scaling_factor_2", "float32", scalar=()),
              TensorRule("activation_scaling_factor", "float32", scalar=())),
}
# quant_algo -> the quantization.format that produces it
FORMAT_NAMES = {None: "none", "FP8": "fp8", "W4A16_AWQ": "int4_awq", "W4A8_AWQ": "w4a8_awq",
                "W8A8_SQ_PER_CHANNEL": "int8_sq", "W8A16": "int8_wo", "NVFP4": "nvfp4"}
# What trtllm-build adds for W8A16 (per rank, from the rank's own weights): int8 weights and one scale per
# output channel over the rank's input features; merged, a row-parallel layer has one scale per rank slice.
W8A16_BUILT = (TensorRule("weight", "int8", out_dim=0, in_dim=1),
               TensorRule("per_channel_scale", "float32", out_dim=0, in_dim=1, in_unit=0))

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
    def group_size(self) -> int | None:
        return (self.config.get("quantization") or {}).get("group_size")

    @property
    def linear_rules(self) -> tuple[TensorRule, ...]:
        if self.quant_algo not in FORMAT_TENSORS:
            raise CheckpointError(f"quant_algo {self.quant_algo!r} is not a format this pipeline reads "
                                  f"(known: {', '.join(str(k) for k in FORMAT_TENSORS)}).",
                                  fix="re-run quantize with a supported quantization.format")
        return FORMAT_TENSORS[self.quant_algo]

    def rule(self, suffix: str) -> TensorRule | None:
        for r in self.linear_rules + (W8A16_BUILT if self.quant_algo == "W8A16" else ()):
            if r.suffix == suffix:
                return r
        return None

    def linear_features(self) -> dict[str, tuple[int, int]]:
        """(output, input) features of each linear layer on one rank."""
        tp, h, hd = self.tp, self.hidden, self.head_size
        qkv_rows = (self.heads // tp + 2 * self.kv_heads_per_rank) * hd
        return {"attention.qkv": (qkv_rows, h), "attention.dense": (h, self.heads * hd // tp),
                "mlp.fc": (self.intermediate // tp, h), "mlp.gate": (self.intermediate // tp, h),
                "mlp.proj": (h, self.intermediate // tp)}

    def tensor_shape(self, rule: TensorRule, out_features: int, in_features: int) -> tuple[int, ...]:
        if rule.in_unit == GROUP:
            rule = dataclasses.replace(rule, in_unit=int(self.group_size or 0))
            if not rule.in_unit:
                raise CheckpointError(f"config.json has no quantization.group_size for {self.quant_algo}.",
                                      fix="re-run quantize with --force")
        return rule.shape(out_features, in_features)

    @property
    def attention_bias(self) -> bool:
        return families.attention_bias(self.config)

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
        features = self.linear_features()
        rules = self.linear_rules
        for i in range(self.layers):
            p = f"transformer.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "post_layernorm.weight"] = (h,)
            if self.attention_bias:
                shapes[p + "attention.qkv.bias"] = (qkv_rows,)
            for module, (n, k) in features.items():
                for rule in rules:
                    shapes[f"{p}{module}.{rule.suffix}"] = self.tensor_shape(rule, n, k)
            if self.kv_cache_quant_algo:
                shapes[p + "attention.kv_cache_scaling_factor"] = (1,)
        return shapes


# Bytes per linear-layer parameter as the engine holds them, and bytes per scale: INT4 packs two values a
# byte with a 16-bit scale per group (TensorRT-LLM casts AWQ scales to the model dtype); NVFP4 two values
# a byte with an FP8 scale per 16; INT8 and FP8 one byte with per-channel / per-tensor scales.
WEIGHT_BYTES = {"FP8": 1.0, "W4A16_AWQ": 0.5, "W4A8_AWQ": 0.5, "W8A8_SQ_PER_CHANNEL": 1.0, "W8A16": 1.0,
                "NVFP4": 0.5}


def linear_weight_bytes(quant_algo: str | None, params: int, dtype_bytes: int, group_size: int | None,
                        out_features: int = 0) -> float:
    """Bytes of ``params`` linear-layer weights in ``quant_algo`` (None: the compute dtype), scales included."""
    if quant_algo is None:
        return params * dtype_bytes
    scales = 0.0
    if quant_algo in ("W4A16_AWQ", "W4A8_AWQ"):
        scales = params / group_size * dtype_bytes
    elif quant_algo == "NVFP4":
        scales = params / group_size
    elif quant_algo in ("W8A8_SQ_PER_CHANNEL", "W8A16"):
        scales = out_features * 4
    return params * WEIGHT_BYTES[quant_algo] + scales


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
    families.check(config, where=str(path))  # an architecture or rope scaling the torch engine lacks: refused here
    return config


def complete_config(config: dict[str, Any], hf_config: dict[str, Any], *, dtype: str, tp: int, pp: int,
                    kv_cache_quant_algo: str | None, quant_algo: str | None = None) -> dict[str, Any]:
    """Fill in what ModelOpt's export leaves out or gets wrong, as TensorRT-LLM's quantize.py does.

    ModelOpt writes one config.json whose ``rank`` is the last rank it exported, omits ``qwen_type``
    (TensorRT-LLM's QWen model class needs it to pick Qwen2's layout), and with transformers 5 drops
    ``rotary_base`` and the rope scaling; ``architecture`` falls back to QWenForCausalLM without HF
    ``architectures``. ``attn_bias`` is written for every family (tests/fixtures: Qwen2 and LLaMA differ).
    """
    config = dict(config)
    arch = (hf_config.get("architectures") or [config.get("architecture")])[0]
    family = families.family(arch)
    config["architecture"] = arch
    config["attn_bias"] = family.attention_bias  # stated: QWenConfig's default is True, LLaMAConfig's False
    config["dtype"] = dtype
    config["rank"] = 0
    config["mapping"] = {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    if arch.startswith("Qwen"):
        config["qwen_type"] = {"Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2_moe",
                               "Qwen3ForCausalLM": "qwen3"}.get(arch, "qwen")
    rope_theta = hf_config.get("rope_theta") or (hf_config.get("rope_parameters") or {}).get("rope_theta")
    if rope_theta is not None:
        config["rotary_base"] = float(rope_theta)
    # TensorRT-LLM's attention reads the scaling's "type" (or "rope_type") and refuses "default" (plain rotary is
    # null); transformers 5 moved HF's rope_scaling into rope_parameters, which ModelOpt does not carry over.
    config["rotary_scaling"] = families.rope_scaling(hf_config)
    config["tie_word_embeddings"] = bool(hf_config.get("tie_word_embeddings", False))
    config["norm_epsilon"] = hf_config.get("rms_norm_eps", config.get("norm_epsilon"))
    config["intermediate_size"] = hf_config.get("intermediate_size", config.get("intermediate_size"))
    config["max_position_embeddings"] = hf_config.get("max_position_embeddings", config.get("max_position_embeddings"))
    quant = dict(config.get("quantization") or {})
    quant["kv_cache_quant_algo"] = kv_cache_quant_algo
    if quant_algo == "W8A16":  # exported unquantized; trtllm-build quantizes it (see quantize._weight_quantizers_off)
        quant["quant_algo"] = quant_algo
        quant.setdefault("exclude_modules", ["lm_head"])
    if quant.get("quant_algo") != quant_algo:
        raise CheckpointError(f"ModelOpt's export wrote quant_algo {quant.get('quant_algo')!r}, expected {quant_algo!r}.",
                              fix="check the installed nvidia-modelopt version (0.47 is tested)")
    config["quantization"] = quant
    return config


# --------------------------------------------------------------------------- loading and checks


def verify_written(ckpt_dir: Path, name: str) -> None:
    """CheckpointError naming the file and its tensors when ``name`` no longer holds what quantize wrote (its
    manifest's record: a stat when untouched, a re-hash of this file when its stat changed). A checkpoint
    without a manifest (written by another tool) is taken as it is."""
    record = ((artifacts.read_manifest(Path(ckpt_dir)) or {}).get("outputs") or {}).get(name)
    if record is None:
        return
    path = Path(ckpt_dir) / name
    try:
        resized = path.stat().st_size != record.get("size")  # truncated or missing: the load says where
    except OSError:
        return
    if not resized and (problem := artifacts.content_change_if_touched(path, record)):
        raise CheckpointError(f"{path} changed after quantize wrote it: {problem}.",
                              fix="re-run `trtllm-pipeline quantize -c CONFIG --force`")


def load_rank_files(ckpt_dir: Path, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Read every ``rank{i}.safetensors`` and check names, shapes, dtypes and scales.

    Raises ``CheckpointError`` naming the file and tensor on the first problem.
    """
    layout = CheckpointLayout(config)
    files = sorted(Path(ckpt_dir).glob("rank*.safetensors"))
    if len(files) != layout.world_size:
        raise CheckpointError(
            f"{ckpt_dir} holds {len(files)} rank files but its config.json says world_size {layout.world_size}.",
            fix="re-run quantize with --force",
        )
    return [load_rank_file(ckpt_dir, config, rank) for rank in range(layout.world_size)]


def load_rank_file(ckpt_dir: Path, config: dict[str, Any], rank: int) -> dict[str, Any]:
    """Read and check one rank's ``rank{rank}.safetensors`` (what a tensor-parallel process loads: its
    own shard only; the checks across ranks, replicated tensors identical, are the build's)."""
    import torch
    from safetensors.torch import load_file

    layout = CheckpointLayout(config)
    expected = layout.rank_shapes()
    dtypes = _expected_dtypes(layout, expected, torch)
    path = Path(ckpt_dir) / f"rank{rank}.safetensors"
    verify_written(ckpt_dir, path.name)
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
        want = dtypes[name]
        if t.dtype != want:
            raise CheckpointError(f"{path}: tensor {name} is {t.dtype}, expected {want}.",
                                  fix="re-run quantize with --force")
        if "scaling_factor" in name and not bool(torch.isfinite(t.float()).all() and (t.float() > 0).all()):
            shown = t.float().flatten()[:8].tolist()
            raise CheckpointError(f"{path}: scaling factor {name} is {shown}{'...' if t.numel() > 8 else ''}; "
                                  "it must be finite and positive.",
                                  fix="re-calibrate: re-run quantize with --force")
    return tensors


def _expected_dtypes(layout: CheckpointLayout, names, torch) -> dict[str, Any]:
    compute = getattr(torch, layout.config["dtype"])
    rules = {r.suffix: r for r in layout.linear_rules}
    out = {}
    for name in names:
        module, _, suffix = name.rpartition(".")
        rule = rules.get(suffix) if any(module.endswith(m) for m in LINEAR_MODULES) else None
        if rule is not None:
            out[name] = compute if rule.dtype == "compute" else getattr(torch, rule.dtype)
        else:
            out[name] = torch.float32 if name.endswith("kv_cache_scaling_factor") else compute
    return out


def _split_name(name: str) -> tuple[str | None, str]:
    """(linear module, tensor suffix) of a linear layer's tensor, else (None, name)."""
    module, _, suffix = name.rpartition(".")
    for m in LINEAR_MODULES:
        if module.endswith("." + m):
            return m, suffix
    return None, name


def trtllm_build_quantize(config: dict[str, Any], shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What trtllm-build computes from a W8A16 checkpoint, rank by rank: int8 weights and per-channel scales.

    TensorRT-LLM 1.2 quantizes W8A16 linears while it loads each rank (``weight_only_quantize_dict``:
    symmetric, one scale per output channel over the rank's own input features, ``max|w| / 127``;
    computed here as ModelOpt's INT8_WEIGHT_ONLY_CFG fake quant rounds, ties to even);
    the torch runtime runs those numbers. A rank's scales are stored ``(out, 1)``: merged, a
    row-parallel layer has one column of scales per rank's slice of the input features. Other formats
    are returned unchanged.
    """
    import torch

    if CheckpointLayout(config).quant_algo != "W8A16":
        return shards
    out = []
    for tensors in shards:
        tensors = dict(tensors)
        for name in list(tensors):
            module, suffix = _split_name(name)
            if module is None or suffix != "weight" or tensors[name].dtype == torch.int8:
                continue
            w = tensors[name].float()
            amax = w.abs().amax(dim=1, keepdim=True).clamp(min=2.0**-24)
            # w * (127 / amax), rounded half to even: ModelOpt's INT8 fake quant, exact ties included
            tensors[name] = (w * (torch.full_like(amax, 127.0) / amax)).round().clamp(-128, 127).to(torch.int8)
            tensors[name.removesuffix("weight") + "per_channel_scale"] = amax / 127.0
        out.append(tensors)
    return out


def merge_rank_files(config: dict[str, Any], shards: list[dict[str, Any]]) -> dict[str, Any]:
    """Reassemble TP shards into the full tensors (TensorRT-LLM names, unsharded shapes).

    Every linear-layer tensor is concatenated along the dimension its layer is split on (see the
    module docstring); replicated tensors and replicated KV heads must be identical on every rank that
    holds them: a mismatch means the shards do not come from one model and raises ``CheckpointError``.
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
        module, suffix = _split_name(name)
        rule = layout.rule(suffix) if module else None
        if module == "attention.qkv" and suffix == "bias":
            rule = TensorRule("bias", "compute", out_dim=0)
        if rule is not None and module not in ROW_PARALLEL and rule.out_dim is not None:
            if module == "attention.qkv":
                merged[name] = _merge_qkv(name, parts, rule, q_rows, kv_rows, kv_owner, layout, torch)
            else:
                merged[name] = _cat(parts, rule.out_dim, torch)
        elif rule is not None and module in ROW_PARALLEL and rule.in_dim is not None:
            merged[name] = _cat(parts, rule.in_dim, torch)
        elif name == "lm_head.weight" or (name == "transformer.vocab_embedding.weight" and layout.parallel_embedding):
            merged[name] = _cat(parts, 0, torch)[: layout.vocab]
        else:
            for rank, p in enumerate(parts[1:], start=1):
                if not torch.equal(_raw(p, torch), _raw(parts[0], torch)):
                    raise CheckpointError(f"rank{rank}.safetensors: replicated tensor {name} differs from rank 0.",
                                          fix="re-run quantize with --force")
            merged[name] = parts[0]
    return merged


def _merge_qkv(name, parts, rule: TensorRule, q_rows, kv_rows, kv_owner, layout, torch):
    """[q_r | k_r | v_r] per rank -> [q | k | v], KV heads taken once from the ranks that own them."""
    d, u = rule.out_dim, rule.out_unit
    q, kv = q_rows // u, kv_rows // u
    sl = lambda t, a, b: t.narrow(d, a, b - a)  # noqa: E731
    if layout.kv_heads < layout.tp:
        group = layout.tp // layout.kv_heads
        for r in range(layout.tp):
            owner = r - r % group
            if not torch.equal(_raw(sl(parts[r], q, parts[r].shape[d]), torch),
                               _raw(sl(parts[owner], q, parts[owner].shape[d]), torch)):
                raise CheckpointError(f"rank{r}.safetensors: replicated KV heads in {name} differ from rank{owner}.",
                                      fix="re-run quantize with --force")
    pieces = [sl(p, 0, q) for p in parts] + [sl(parts[r], q, q + kv) for r in kv_owner] \
        + [sl(parts[r], q + kv, q + 2 * kv) for r in kv_owner]
    return _cat(pieces, d, torch)


def shard_tensors(config: dict[str, Any], tensors: dict[str, Any], tp: int) -> list[dict[str, Any]]:
    """Split full (tp=1) tensors into ``tp`` ranks by the rules above: the inverse of ``merge_rank_files``.

    Used where ModelOpt's exporter stops short: it cannot replicate KV heads that carry per-channel
    scales (int8_sq at tp above the KV heads, ``layer_utils.build_qkv``), which TensorRT-LLM's own
    converters do row by row with their scales (``dup_kv_weight``).
    """
    import torch

    layout = CheckpointLayout({**config, "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1}})
    hd, heads, kv = layout.head_size, layout.heads, layout.kv_heads
    ranks: list[dict[str, Any]] = [{} for _ in range(tp)]
    for name, t in tensors.items():
        module, suffix = _split_name(name)
        rule = layout.rule(suffix) if module else None
        if module == "attention.qkv" and suffix == "bias":
            rule = TensorRule("bias", "compute", out_dim=0)
        if rule is not None and module not in ROW_PARALLEL and rule.out_dim is not None:
            d, u = rule.out_dim, rule.out_unit
            if module == "attention.qkv":
                q, k = heads * hd // u, kv * hd // u
                qs = _chunk(t.narrow(d, 0, q), tp, d, torch)
                ks, vs = (t.narrow(d, q, k), t.narrow(d, q + k, k))
                if kv >= tp:
                    ks, vs = _chunk(ks, tp, d, torch), _chunk(vs, tp, d, torch)
                else:  # rank r holds KV head r * kv // tp, as ModelOpt's and TensorRT-LLM's dup_kv_weight
                    head = hd // u
                    ks = [ks.narrow(d, (r * kv // tp) * head, head) for r in range(tp)]
                    vs = [vs.narrow(d, (r * kv // tp) * head, head) for r in range(tp)]
                parts = [_cat([qs[r], ks[r], vs[r]], d, torch) for r in range(tp)]
            else:
                parts = _chunk(t, tp, d, torch)
        elif rule is not None and module in ROW_PARALLEL and rule.in_dim is not None:
            parts = _chunk(t, tp, rule.in_dim, torch)
        elif name == "lm_head.weight" or (name == "transformer.vocab_embedding.weight" and layout.parallel_embedding):
            pad = layout.padded_vocab - t.shape[0]
            padded = torch.cat([t, t.new_zeros((pad, *t.shape[1:]))]) if pad else t
            parts = _chunk(padded, tp, 0, torch)
        else:
            parts = [t] * tp
        for r in range(tp):
            ranks[r][name] = parts[r].contiguous()
    return ranks


def _chunk(t, n, dim, torch):
    size = t.shape[dim] // n
    if size * n != t.shape[dim]:
        raise CheckpointError(f"a tensor of shape {tuple(t.shape)} cannot be split {n} ways along dim {dim}.",
                              fix="use a tp that divides the model's dimensions")
    return [t.narrow(dim, r * size, size) for r in range(n)]


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
    return config, merge_rank_files(config, trtllm_build_quantize(config, load_rank_files(ckpt_dir, config)))
