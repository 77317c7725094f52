"""Stage 1, ``quantize``: HF model -> ModelOpt PTQ -> TensorRT-LLM checkpoint (+ unified HF checkpoint).

Output: ``engines/<config>/checkpoint/`` (config.json, rank{i}.safetensors, tokenizer/, manifest)
and, for quantized formats, ``engines/<config>/hf_checkpoint/``. ``quantization.format: none``
exports the unquantized checkpoint, the BF16 baseline. The stage is cached on the hash of its
inputs (model files, dtype, quantization and parallelism sections, calibration data, ModelOpt
version); unlike TensorRT-LLM's quantize.py, which skips whenever config.json exists, a change to
any of them re-quantizes.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from trtllm_pipeline import artifacts, calibration, checkpoint
from trtllm_pipeline.config import BuildConfig, check_against_model
from trtllm_pipeline.console import quiet
from trtllm_pipeline.errors import StageFailed
from trtllm_pipeline.machine import package_version
from trtllm_pipeline.model.source import ResolvedModel, known_shape, resolve_model

log = logging.getLogger(__name__)

# Bump when the export or its patches change, so existing checkpoints are rebuilt.
EXPORT_REVISION = 1
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
        check_against_model(cfg, shape)
    lines = [f"model: {cfg.model.source}" + (f" @ {cfg.model.revision}" if cfg.model.revision else "")]
    if shape is not None:
        lines.append(
            f"  {shape.architecture}: {shape.num_hidden_layers} layers, {shape.num_attention_heads} heads, "
            f"{shape.num_key_value_heads} KV heads, {shape.num_params / 1e9:.2f}B parameters"
        )
    if q.needs_calibration:
        algo = "FP8_DEFAULT_CFG" if q.format == "fp8" else "no weight quantization"
        kv = " + FP8_KV_CFG" if q.kv_cache == "fp8" else ""
        lines.append(f"quantize: ModelOpt {algo}{kv} (per-tensor E4M3, max calibration), dtype {cfg.dtype}")
        lines.append(
            f"  calibration: {cal.dataset}" + (f" ({cal.resolved_subset})" if cal.resolved_subset else "")
            + f", split {cal.split}, column {cal.resolved_text_column}, {cal.num_samples} samples x "
            f"{cal.max_seq_len} tokens, batch {cal.batch_size}"
        )
    else:
        lines.append(f"quantize: none (export the {cfg.dtype} weights unchanged)")
    lines.append(f"export: TensorRT-LLM checkpoint, tp={cfg.parallelism.tp} pp={cfg.parallelism.pp} -> {paths.checkpoint}")
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
        "export": {"revision": EXPORT_REVISION, "modelopt": package_version("nvidia-modelopt")},
    }


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
    checkpoint.load_rank_files(ckpt_dir, checkpoint.read_config(ckpt_dir))  # raises, naming file and tensor
    changed = [rel for rel, rec in manifest["outputs"].items()
               if not (ckpt_dir / rel).is_file() or (ckpt_dir / rel).stat().st_size != rec["size"]]
    raise checkpoint.CheckpointError(
        f"{ckpt_dir}: {', '.join(changed)} changed after quantize wrote the checkpoint (size differs from its manifest).",
        fix="re-run `trtllm-pipeline quantize -c CONFIG --force`",
    )


def _run(cfg, model: ResolvedModel, paths, inputs, inputs_hash) -> QuantizeResult:
    import torch

    clock = artifacts.Stopwatch()
    q = cfg.quantization
    device = "cuda" if torch.cuda.is_available() else "cpu"
    log.info("quantize: %s -> %s (format %s, kv cache %s, tp %d, %s)", model.source, paths.checkpoint,
             q.format, q.kv_cache, cfg.parallelism.tp, device)
    with clock.time("load_s"):
        hf_model, tokenizer = _load(model.model_dir, cfg.dtype, device)
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


def _calibrate(cfg: BuildConfig, model, tokenizer, device: str):
    import torch
    from tqdm.auto import tqdm

    with quiet():  # ModelOpt warns about optional plugins at import time
        import modelopt.torch.quantization as mtq
    q = cfg.quantization
    if q.format == "fp8":
        quant_cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    else:  # KV-cache-only quantization: keep every weight and activation in full precision
        quant_cfg = {"quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": "max"}
    if q.kv_cache == "fp8":
        quant_cfg["quant_cfg"] = list(quant_cfg["quant_cfg"]) + copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"])
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
    hf_config = json.loads((source.model_dir / "config.json").read_text())
    _ensure_architectures(model, hf_config)
    try:
        with quiet():
            export_tensorrt_llm_checkpoint(model, decoder_type="qwen", dtype=getattr(torch, cfg.dtype),
                                           export_dir=out, inference_tensor_parallel=cfg.parallelism.tp,
                                           inference_pipeline_parallel=cfg.parallelism.pp)
    except Exception as exc:
        raise StageFailed(f"quantize: ModelOpt's TensorRT-LLM export failed: {type(exc).__name__}: {exc}",
                          fix="re-run with -v for the full trace; check the model is a supported Qwen2 model") from exc
    written = json.loads((out / "config.json").read_text())
    fixed = checkpoint.complete_config(written, hf_config, dtype=cfg.dtype, tp=cfg.parallelism.tp,
                                       pp=cfg.parallelism.pp,
                                       kv_cache_quant_algo=cfg.quantization.kv_cache_quant_algo)
    (out / "config.json").write_text(json.dumps(fixed, indent=2) + "\n")
    _copy_tokenizer(source.model_dir, artifacts.checkpoint_tokenizer(out))
    # The export must match what every later stage expects; check it before it is published.
    checkpoint.load_rank_files(out, fixed)


def _export_hf(cfg: BuildConfig, model, source: ResolvedModel, out: Path) -> None:
    import torch

    with quiet():
        from modelopt.torch.export import export_hf_checkpoint
    try:
        with quiet():
            export_hf_checkpoint(model, dtype=getattr(torch, cfg.dtype), export_dir=out)
    except Exception as exc:
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
