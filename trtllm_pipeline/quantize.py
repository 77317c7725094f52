"""Stage 1, ``quantize``: HF model -> ModelOpt PTQ -> TensorRT-LLM checkpoint (+ unified HF checkpoint).

Output: ``engines/<config>/checkpoint/`` (config.json, rank{i}.safetensors, tokenizer/, manifest)
and, for quantized formats, ``engines/<config>/hf_checkpoint/``. ``quantization.format: none``
exports the unquantized checkpoint, the BF16 baseline. The stage is cached on the hash of its
inputs (model files, dtype, quantization and parallelism sections, calibration data, ModelOpt
version); unlike TensorRT-LLM's quantize.py, which skips whenever config.json exists, a change to
any of them re-quantizes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import errno
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from trtllm_pipeline import artifacts, calibration, checkpoint
from trtllm_pipeline.config import AWQ_FORMATS, BuildConfig, QuantizationSection, check_against_model
from trtllm_pipeline.console import quiet
from trtllm_pipeline.errors import StageFailed
from trtllm_pipeline.machine import package_version
from trtllm_pipeline.model import families
from trtllm_pipeline.model.source import ResolvedModel, known_shape, resolve_model

log = logging.getLogger(__name__)

# Bump when the export or its patches change, so existing checkpoints are rebuilt.
EXPORT_REVISION = 2
FORMAT_SUMMARY = {
    "none": "no weight quantization",
    "fp8": "per-tensor E4M3 weights and activations, max calibration",
    "int4_awq": "INT4 weights per group, AWQ-lite pre-quant scales, activations in the compute dtype",
    "w4a8_awq": "INT4 weights per group with an FP8 step, AWQ-lite pre-quant scales, per-tensor FP8 activations",
    "int8_sq": "INT8 weights per channel, SmoothQuant pre-quant scales, per-tensor INT8 activations",
    "int8_wo": "INT8 weights per channel, activations in the compute dtype",
    "nvfp4": "E2M1 weights and activations in blocks of 16 with E4M3 block scales and a global scale",
}


def _settings(q: QuantizationSection) -> str:
    if q.format in AWQ_FORMATS:
        return f"; block size {q.group_size}"
    if q.format == "int8_sq":
        return f"; SmoothQuant alpha {q.effective_smoothquant_alpha:g}"
    return ""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "chat_template.jinja", "generation_config.json")


@dataclasses.dataclass
class QuantizeResult:
    checkpoint_dir: Path
    hf_checkpoint_dir: Path | None
    manifest: dict[str, Any]
    cache_hit: bool

    def summary(self) -> str:
        status = "cache hit" if self.cache_hit else "quantized"
        return f"{status}: {self.checkpoint_dir}" + (f" (+ {self.hf_checkpoint_dir})" if self.hf_checkpoint_dir else "")


def quantize(cfg: BuildConfig, *, engines_dir: str | Path = "engines", force: bool = False) -> QuantizeResult:
    """Quantize (or just convert) the config's model and export its TensorRT-LLM checkpoint."""
    paths = artifacts.artifact_paths(engines_dir, cfg.name)
    artifacts.remove_stale_in(paths.root)
    model = resolve_model(cfg.model)
    _ = model.family  # an architecture or rope scaling the runtime does not implement is refused before any work
    check_against_model(cfg, model.shape)
    inputs = _inputs(cfg, model, paths)
    inputs_hash = artifacts.fingerprint(_key(inputs))
    if not force:
        hit = _cache_hit(cfg, paths, inputs_hash)
        if hit is not None:
            log.info("quantize: cache hit for %s (inputs unchanged); %s is up to date", cfg.name, paths.checkpoint)
            return hit
    return _run(cfg, model, paths, inputs, inputs_hash)


def plan(cfg: BuildConfig, *, engines_dir: str | Path = "engines") -> list[str]:
    """What ``quantize`` would do, without downloading, loading or writing anything."""
    paths = artifacts.artifact_paths(engines_dir, cfg.name)
    q, cal = cfg.quantization, cfg.quantization.calibration
    shape = known_shape(cfg.model)
    if shape is not None:
        families.family(shape.architecture, where=f"model {cfg.model.source}")
        check_against_model(cfg, shape)
    lines = [f"model: {cfg.model.source}" + (f" @ {cfg.model.revision}" if cfg.model.revision else "")]
    if shape is not None:
        lines.append(
            f"  {shape.architecture}: {shape.num_hidden_layers} layers, {shape.num_attention_heads} heads, "
            f"{shape.num_key_value_heads} KV heads, {shape.num_params / 1e9:.2f}B parameters"
        )
    if q.needs_calibration:
        algo = q.modelopt_config or "no weight quantization"
        kv = " + FP8_KV_CFG" if q.kv_cache == "fp8" else ""
        lines.append(f"quantize: ModelOpt {algo}{kv} ({FORMAT_SUMMARY[q.format]}{_settings(q)}), dtype {cfg.dtype}")
        lines.append(
            f"  calibration: {cal.dataset}" + (f" ({cal.resolved_subset})" if cal.resolved_subset else "")
            + f", split {cal.split}, column {cal.resolved_text_column}, {cal.num_samples} samples x "
            f"{cal.max_seq_len} tokens, batch {cal.batch_size}"
        )
    else:
        lines.append(f"quantize: none (export the {cfg.dtype} weights unchanged)")
    lines.append(f"export: TensorRT-LLM checkpoint (quant_algo {q.quant_algo}), tp={cfg.parallelism.tp} "
                 f"pp={cfg.parallelism.pp} -> {paths.checkpoint}")
    if q.format == "int8_wo":
        lines.append("  weights stay in the checkpoint dtype: trtllm-build quantizes W8A16 per channel itself "
                     "(as TensorRT-LLM's own quantize.py exports int8_wo)")
    if shape is not None and _reshards(cfg, shape.num_key_value_heads):
        lines.append(f"  exported at tp=1 and split here: ModelOpt cannot replicate KV heads with per-channel scales "
                     f"({shape.num_key_value_heads} KV heads, tp={cfg.parallelism.tp})")
    if q.format != "none" and q.export_hf_checkpoint:
        lines.append(f"export: unified HF checkpoint -> {paths.hf_checkpoint}")
    existing = artifacts.read_manifest(paths.checkpoint)
    lines.append("cache: " + ("a checkpoint exists; reused if inputs are unchanged" if existing else "no checkpoint yet"))
    return lines


# --------------------------------------------------------------------------- internals


def _inputs(cfg: BuildConfig, model: ResolvedModel, paths: artifacts.ArtifactPaths) -> dict[str, Any]:
    previous = (artifacts.read_manifest(paths.checkpoint) or {}).get("inputs", {}).get("model", {}).get("files")
    files = artifacts.hash_tree(model.model_dir, previous=previous, skip=("manifest.json",))
    files = {k: v for k, v in files.items() if not k.endswith((".bin", ".pt", ".pth", ".md"))}
    return {
        "model": {"source": model.source, "revision": model.revision, "files": files,
                  "content_sha256": artifacts.content_hash(files)},
        "dtype": cfg.dtype,
        "quantization": cfg.section("quantization"),
        "parallelism": cfg.section("parallelism"),
        "calibration_data": calibration.data_fingerprint(cfg.quantization.calibration)
        if cfg.quantization.needs_calibration else None,
        "calibration_dtype": calibration_dtype(cfg) if cfg.quantization.needs_calibration else None,
        "export": {"revision": EXPORT_REVISION, "modelopt": package_version("nvidia-modelopt")},
    }


def calibration_dtype(cfg: BuildConfig) -> str:
    """The dtype the model computes in while ModelOpt calibrates: ``quantization.calibration.dtype``; ``auto``: the
    config's on a GPU, float32 on a CPU.

    A CPU without BF16 matrix units (AVX512-BF16, AMX) runs a bfloat16 matmul about 8x slower than a float32 one
    (47 ms against 6 ms for 512x576 @ 576x1536 here): AWQ's search, eleven fake-quantized forwards of every linear
    per batch, spent 87% of its time there. The algorithm and its data are unchanged; the statistics are taken in
    more precision (as the CPU runtime computes), and the export still writes ``cfg.dtype``.
    """
    import torch

    if cfg.quantization.calibration.dtype != "auto":
        return cfg.quantization.calibration.dtype
    return cfg.dtype if torch.cuda.is_available() else "float32"


def _key(inputs: dict[str, Any]) -> dict[str, Any]:
    """The hashed part of the inputs: file contents, not their timestamps."""
    key = copy.deepcopy(inputs)
    key["model"].pop("files")
    return key


def _cache_hit(cfg: BuildConfig, paths: artifacts.ArtifactPaths, inputs_hash: str) -> QuantizeResult | None:
    manifest = artifacts.read_manifest(paths.checkpoint)
    if manifest is None or manifest.get("inputs_hash") != inputs_hash:
        return None  # missing or stale: quantize
    if not artifacts.outputs_intact(paths.checkpoint, manifest):
        _report_damage(paths.checkpoint, manifest)
    hf_dir = None
    if manifest.get("hf_checkpoint"):
        hf_manifest = artifacts.cached_manifest(paths.hf_checkpoint, inputs_hash)
        if hf_manifest is None:
            return None
        hf_dir = paths.hf_checkpoint
    return QuantizeResult(paths.checkpoint, hf_dir, manifest, cache_hit=True)


def _report_damage(ckpt_dir: Path, manifest: dict[str, Any]) -> None:
    """The inputs match but the files changed after quantize wrote them: never paper over that.

    Re-quantizing silently would hide a failing disk or a bad copy; name what is wrong instead.
    """
    changed = artifacts.changed_outputs(ckpt_dir, manifest)
    if any("written as" in problem or problem == "missing" for problem in changed.values()):
        checkpoint.load_rank_files(ckpt_dir, checkpoint.read_config(ckpt_dir))  # a truncated file: file and tensor
    raise checkpoint.CheckpointError(
        f"{ckpt_dir} changed after quantize wrote it: "
        + "; ".join(f"{rel}: {problem}" for rel, problem in changed.items()) + ".",
        fix="re-run `trtllm-pipeline quantize -c CONFIG --force`",
    )


def _raise_if_disk_full(exc: Exception, out: Path) -> None:
    """An export that failed because the disk filled is the disk's problem (exit 3), not ModelOpt's: safetensors'
    writer says so in words, not as an OSError."""
    if "No space left on device" in str(exc):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out)) from None


def _run(cfg, model: ResolvedModel, paths, inputs, inputs_hash) -> QuantizeResult:
    import torch

    clock = artifacts.Stopwatch()
    q = cfg.quantization
    device = "cuda" if torch.cuda.is_available() else "cpu"
    log.info("quantize: %s -> %s (format %s, kv cache %s, tp %d, %s)", model.source, paths.checkpoint,
             q.format, q.kv_cache, cfg.parallelism.tp, device)
    # Before loading and calibrating: the checkpoint (and its HF copy) take about the source weights' size.
    weights = sum(rec["size"] for rel, rec in inputs["model"]["files"].items() if rel.endswith(".safetensors"))
    copies = 2 if q.format != "none" and q.export_hf_checkpoint else 1
    artifacts.check_room(paths.root, weights * copies, f"quantize ({cfg.name}'s checkpoint"
                         + (" and its HF copy)" if copies == 2 else ")"))
    with clock.time("load_s"):
        hf_model, tokenizer = _load(model.model_dir, inputs["calibration_dtype"] or cfg.dtype, device)
    if q.needs_calibration:
        with clock.time("calibrate_s"):
            hf_model = _calibrate(cfg, hf_model, tokenizer, device)
    write_hf = q.format != "none" and q.export_hf_checkpoint
    versions = artifacts.package_versions("torch", "transformers", "nvidia-modelopt", "datasets", "safetensors")
    common = {
        **artifacts.stage_header("quantize", cfg),
        "inputs": inputs,
        "inputs_hash": inputs_hash,
        "source": {"kind": model.kind, "model_dir": str(model.model_dir)},
        "versions": versions,
        "runtime": None,
    }
    with artifacts.atomic_dir(paths.checkpoint) as ckpt_tmp:
        with clock.time("export_trtllm_s"):
            _export_trtllm(cfg, hf_model, model, ckpt_tmp)
        hf_record = None
        if write_hf:
            with artifacts.atomic_dir(paths.hf_checkpoint) as hf_tmp, clock.time("export_hf_s"):
                _export_hf(cfg, hf_model, model, hf_tmp)
                hf_manifest = artifacts.write_manifest(hf_tmp, {**common, "stage": "quantize/hf_checkpoint",
                                                               "timings": dict(clock.timings)})
            hf_record = {"dir": str(paths.hf_checkpoint),
                         "content_sha256": artifacts.content_hash(hf_manifest["outputs"])}
        elif paths.hf_checkpoint.exists():
            shutil.rmtree(paths.hf_checkpoint)  # stale: from an earlier, quantized version of this config
        manifest = artifacts.write_manifest(ckpt_tmp, {**common, "hf_checkpoint": hf_record,
                                                       "timings": dict(clock.timings)})
    log.info("quantize: wrote %s in %.1f s", paths.checkpoint, sum(clock.timings.values()))
    return QuantizeResult(paths.checkpoint, paths.hf_checkpoint if write_hf else None, manifest, cache_hit=False)


def _load(model_dir: Path, dtype: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet():
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        # use_safetensors: never unpickle weights, whatever else the directory holds (model.source checks it has them)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), low_cpu_mem_usage=True,
                                                     use_safetensors=True)
    return model.to(device).eval(), tokenizer


def modelopt_quant_cfg(q: QuantizationSection, mtq) -> dict[str, Any]:
    """ModelOpt's own config for the format, with the config's block size, SmoothQuant alpha and KV cache."""
    if q.modelopt_config is None:  # KV-cache-only quantization: keep every weight and activation in full precision
        quant_cfg: dict[str, Any] = {"quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": "max"}
    else:
        quant_cfg = copy.deepcopy(getattr(mtq, q.modelopt_config))
    if q.format in AWQ_FORMATS:
        for entry in quant_cfg["quant_cfg"]:
            if entry.get("quantizer_name") == "*weight_quantizer":
                stages = entry["cfg"] if isinstance(entry["cfg"], list) else [entry["cfg"]]
                for stage in stages:  # W4A8: the INT4 block stage (the FP8 stage is per tensor)
                    if "block_sizes" in stage:
                        stage["block_sizes"][-1] = q.group_size
    if q.format == "int8_sq" and q.smoothquant_alpha is not None:
        quant_cfg["algorithm"] = {"method": "smoothquant", "alpha": q.smoothquant_alpha}
    if q.kv_cache == "fp8":
        quant_cfg["quant_cfg"] = list(quant_cfg["quant_cfg"]) + copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"])
    return quant_cfg


def _calibrate(cfg: BuildConfig, model, tokenizer, device: str):
    import torch
    from tqdm.auto import tqdm

    with quiet():  # ModelOpt warns about optional plugins at import time
        import modelopt.torch.quantization as mtq
    q = cfg.quantization
    quant_cfg = modelopt_quant_cfg(q, mtq)
    specials = set(tokenizer.all_special_ids)
    batches = calibration.calibration_batches(q.calibration, tokenizer, model.config.vocab_size, specials)

    def forward_loop(m) -> None:
        for batch in tqdm(batches, desc="calibrating", unit="batch", leave=False):
            m(**{k: v.to(device) for k, v in batch.items()})

    with torch.no_grad(), quiet():
        return mtq.quantize(model, quant_cfg, forward_loop)


def _export_trtllm(cfg: BuildConfig, model, source: ResolvedModel, out: Path) -> None:
    import torch

    with quiet():
        from modelopt.torch.export import export_tensorrt_llm_checkpoint
    q, tp = cfg.quantization, cfg.parallelism.tp
    hf_config = json.loads((source.model_dir / "config.json").read_text())
    _ensure_architectures(model, hf_config)
    reshard = _reshards(cfg, source.shape.num_key_value_heads)
    try:
        with quiet(), _weight_quantizers_off(model, q.format == "int8_wo"):
            export_tensorrt_llm_checkpoint(model, decoder_type=source.family.modelopt_decoder,
                                           dtype=getattr(torch, cfg.dtype), export_dir=out,
                                           inference_tensor_parallel=1 if reshard else tp,
                                           inference_pipeline_parallel=cfg.parallelism.pp)
    except Exception as exc:
        _raise_if_disk_full(exc, out)
        raise StageFailed(f"quantize: ModelOpt's TensorRT-LLM export failed: {type(exc).__name__}: {exc}",
                          fix="re-run with -v for the full trace") from exc
    written = json.loads((out / "config.json").read_text())
    fixed = checkpoint.complete_config(written, hf_config, dtype=cfg.dtype, tp=tp, pp=cfg.parallelism.pp,
                                       kv_cache_quant_algo=q.kv_cache_quant_algo, quant_algo=q.quant_algo)
    (out / "config.json").write_text(json.dumps(fixed, indent=2) + "\n")
    if reshard:
        _reshard(out, fixed, tp)
    _copy_tokenizer(source.model_dir, artifacts.checkpoint_tokenizer(out))
    # The export must match what every later stage expects; check it before it is published.
    checkpoint.load_rank_files(out, fixed)


def _reshards(cfg: BuildConfig, kv_heads: int) -> bool:
    """ModelOpt 0.47 cannot replicate KV heads whose weights carry per-channel scales (layer_utils.build_qkv
    raises NotImplementedError): int8_sq at tp above the KV heads is exported at tp=1 and split here."""
    return cfg.quantization.format == "int8_sq" and cfg.parallelism.tp > kv_heads


def _reshard(out: Path, config: dict[str, Any], tp: int) -> None:
    from safetensors.torch import load_file, save_file

    full = load_file(out / "rank0.safetensors")
    for rank, tensors in enumerate(checkpoint.shard_tensors(config, full, tp)):
        save_file(tensors, out / f"rank{rank}.safetensors")


@contextlib.contextmanager
def _weight_quantizers_off(model, off: bool):
    """int8_wo: TensorRT-LLM 1.2 quantizes W8A16 weights itself at build time and loads only unquantized
    ones (``weight_only_quantize_dict`` skips int8 tensors), so the TensorRT-LLM checkpoint carries the
    weights in the checkpoint dtype, as TensorRT-LLM's quantize.py writes it; the unified HF checkpoint
    keeps ModelOpt's INT8 weights."""
    quantizers = [m for name, m in model.named_modules()
                  if off and name.endswith("weight_quantizer") and getattr(m, "is_enabled", False)]
    for m in quantizers:
        m.disable()
    try:
        yield
    finally:
        for m in quantizers:
            m.enable()


def _in_checkpoint_dtype(model, dtype) -> None:
    """A model calibrated in float32 (``calibration_dtype``) holding its weights and pre-quant scales in the checkpoint
    dtype, as a model calibrated in that dtype holds them: ModelOpt's unified HF export writes every tensor it does
    not quantize as it finds it (its ``dtype`` argument notwithstanding); the TensorRT-LLM export casts them itself."""
    for module in model.modules():
        tensors = [p for p in module.parameters(recurse=False)]
        pre_quant_scale = getattr(module, "_pre_quant_scale", None)
        tensors += [pre_quant_scale] if pre_quant_scale is not None else []
        for tensor in tensors:
            if tensor.is_floating_point() and tensor.dtype != dtype:
                tensor.data = tensor.data.to(dtype)


def _export_hf(cfg: BuildConfig, model, source: ResolvedModel, out: Path) -> None:
    import torch

    with quiet():
        from modelopt.torch.export import export_hf_checkpoint
    _in_checkpoint_dtype(model, getattr(torch, cfg.dtype))
    try:
        with quiet():
            export_hf_checkpoint(model, dtype=getattr(torch, cfg.dtype), export_dir=out)
    except Exception as exc:
        _raise_if_disk_full(exc, out)
        raise StageFailed(f"quantize: ModelOpt's unified HF export failed: {type(exc).__name__}: {exc}",
                          fix="set quantization.export_hf_checkpoint: false to skip it") from exc
    _copy_tokenizer(source.model_dir, out)


def _ensure_architectures(model, hf_config: dict) -> None:
    # ModelOpt's HF export crashes, and its TRT-LLM export guesses QWenForCausalLM, without it.
    if not getattr(model.config, "architectures", None):
        model.config.architectures = hf_config.get("architectures") or [type(model).__name__]


def _copy_tokenizer(model_dir: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        src = model_dir / name
        if src.is_file() and not (out / name).exists():
            shutil.copyfile(src, out / name)
    if not (out / "tokenizer.json").exists():  # a slow tokenizer only: what serving loads is tokenizer.json
        from transformers import AutoTokenizer

        backend = getattr(AutoTokenizer.from_pretrained(model_dir), "backend_tokenizer", None)
        if backend is not None:
            backend.save(str(out / "tokenizer.json"))
