"""Stage 2, ``build``: the config's engine, for the runtime that can run here.

``tensorrt_llm``: trtllm-build from TensorRT-LLM 1.2.x (pre-flight checks first, so a missing
package or an unsuitable GPU costs seconds, not a failed build). ``torch``: the engine is the
validated TensorRT-LLM checkpoint itself; building checks every shard (names, shapes, dtypes,
finite positive scales) and records it. Either way ``engines/<config>/engine/manifest.json``
names the runtime and why it was chosen. The quantize stage runs first; its cache decides
whether the checkpoint is reused.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from trtllm_pipeline import artifacts, checkpoint, quantize
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.errors import UnavailableError
from trtllm_pipeline.runtimes import select_runtime

log = logging.getLogger(__name__)

BUILD_REVISION = 1  # bump when what a build writes changes


@dataclasses.dataclass
class BuildResult:
    engine_dir: Path
    runtime: str
    reason: str
    manifest: dict[str, Any]
    cache_hit: bool


def build(cfg: BuildConfig, *, engines_dir: str | Path = "engines", runtime: str | None = None,
          force: bool = False) -> BuildResult:
    """Quantize if needed, then build the engine for the selected runtime."""
    name, reason = select_runtime(cfg, runtime)
    log.info("build: %s runtime (%s)", name, reason)
    if name == "tensorrt_llm":
        _require_trtllm(cfg)
    ckpt = quantize.quantize(cfg, engines_dir=engines_dir)
    paths = artifacts.artifact_paths(engines_dir, cfg.name)
    inputs = {
        "runtime": name,
        "checkpoint": {"inputs_hash": ckpt.manifest["inputs_hash"],
                       "content_sha256": artifacts.content_hash(ckpt.manifest["outputs"])},
        "build": cfg.section("build"),
        "revision": BUILD_REVISION,
    }
    inputs_hash = artifacts.fingerprint(inputs)
    if not force and (manifest := artifacts.cached_manifest(paths.engine, inputs_hash)):
        log.info("build: cache hit for %s (%s engine, inputs unchanged)", cfg.name, name)
        return BuildResult(paths.engine, name, reason, manifest, cache_hit=True)
    record = {
        "stage": "build",
        "config": {"name": cfg.name, "path": str(cfg.path) if cfg.path else None},
        "runtime": name,
        "runtime_reason": reason,
        "checkpoint": {"dir": "../checkpoint", **inputs["checkpoint"]},
        "inputs": inputs,
        "inputs_hash": inputs_hash,
        "versions": artifacts.package_versions("torch", "tensorrt_llm"),
    }
    clock = artifacts.Stopwatch()
    if name == "torch":
        with clock.time("validate_s"):
            config = checkpoint.read_config(ckpt.checkpoint_dir)
            checkpoint.merge_rank_files(config, checkpoint.load_rank_files(ckpt.checkpoint_dir, config))
        layout = checkpoint.CheckpointLayout(config)
        record["engine"] = {"kind": "torch runtime: the validated TensorRT-LLM checkpoint, run in PyTorch",
                            "checkpoint_tp": layout.tp, "dtype": config["dtype"], "quant_algo": layout.quant_algo,
                            "kv_cache_quant_algo": layout.kv_cache_quant_algo}
        with artifacts.atomic_dir(paths.engine) as tmp:
            manifest = artifacts.write_manifest(tmp, {**record, "timings": clock.timings})
    else:
        from trtllm_pipeline.runtimes import trtllm_runtime

        with clock.time("trtllm_build_s"):
            fields = trtllm_runtime.build_engine(cfg, ckpt.checkpoint_dir, paths.engine)
        manifest = artifacts.write_manifest(paths.engine, {**record, **fields, "timings": clock.timings})
    log.info("build: %s engine for %s in %s", name, cfg.name, paths.engine)
    return BuildResult(paths.engine, name, reason, manifest, cache_hit=False)


def plan(cfg: BuildConfig, *, engines_dir: str | Path = "engines", runtime: str | None = None) -> list[str]:
    """The whole plan (runtime choice, quantize, build, how the engine runs), touching nothing."""
    name, reason = select_runtime(cfg, runtime)
    paths = artifacts.artifact_paths(engines_dir, cfg.name)
    lines = [f"runtime: {name} ({reason})", ""]
    lines += ["[quantize]"] + quantize.plan(cfg, engines_dir=engines_dir) + ["", "[build]"]
    if name == "torch":
        lines += [
            f"validate the checkpoint shards in {paths.checkpoint} (names, shapes, dtypes, scales)",
            f"engine: {paths.engine}/manifest.json naming the checkpoint; the torch runtime merges the "
            f"{cfg.parallelism.tp} TP shard(s) and runs them on one device ({cfg.runtime.device})",
        ]
    else:
        from trtllm_pipeline.runtimes import trtllm_runtime

        lines += trtllm_runtime.plan(cfg, paths.checkpoint, paths.engine)
    return lines


def _require_trtllm(cfg: BuildConfig) -> None:
    from trtllm_pipeline.runtimes import trtllm_runtime

    problems = trtllm_runtime.preflight(cfg)
    if problems:
        where = cfg.path or f"build_configs/{cfg.name}.yaml"
        raise UnavailableError(
            f"cannot build TensorRT-LLM engines for {cfg.name} on this machine:\n  - " + "\n  - ".join(problems),
            fix=f"run on a machine that has them, or build for the torch runtime instead (the FP8 checkpoint run "
            f"in PyTorch, CPU or CUDA): `trtllm-pipeline build -c {where} --runtime torch` (with make: RUNTIME=torch; "
            "MODEL=tiny-qwen2 runs the whole pipeline on any machine)",
        )
