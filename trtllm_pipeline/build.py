"""Stage 2, ``build``: the config's engine, for the runtime that can run here.

The selected backend (``runtimes.registry.select_backend``) builds it: ``tensorrt_llm`` runs
trtllm-build from TensorRT-LLM 1.2.x (pre-flight checks first, so a missing package or an
unsuitable GPU costs seconds, not a failed build); ``torch`` takes the validated TensorRT-LLM
checkpoint itself as the engine. Either way ``engines/<config>/engine/manifest.json`` names the
runtime and why it was chosen. The quantize stage runs first; its cache decides whether the
checkpoint is reused.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from trtllm_pipeline import artifacts, quantize
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.runtimes.registry import select_backend

log = logging.getLogger(__name__)

BUILD_REVISION = 1  # bump when what a build writes changes


@dataclasses.dataclass
class BuildResult:
    engine_dir: Path
    runtime: str
    reason: str
    manifest: dict[str, Any]
    cache_hit: bool

    def summary(self) -> str:
        status = "cache hit" if self.cache_hit else "built"
        return f"{status}: {self.engine_dir} ({self.runtime} runtime: {self.reason})"


def build(cfg: BuildConfig, *, engines_dir: str | Path = "engines", runtime: str | None = None,
          force: bool = False) -> BuildResult:
    """Quantize if needed, then build the engine for the selected runtime."""
    backend, reason = select_backend(cfg, runtime)
    log.info("build: %s runtime (%s)", backend.name, reason)
    backend.require(cfg)
    ckpt = quantize.quantize(cfg, engines_dir=engines_dir)
    paths = artifacts.artifact_paths(engines_dir, cfg.name)
    artifacts.remove_stale_in(paths.root)
    inputs = {
        "runtime": backend.name,
        "checkpoint": {"inputs_hash": ckpt.manifest["inputs_hash"],
                       "content_sha256": artifacts.content_hash(ckpt.manifest["outputs"])},
        "build": cfg.section("build"),
        "revision": BUILD_REVISION,
    }
    inputs_hash = artifacts.fingerprint(inputs)
    if not force and (manifest := artifacts.cached_manifest(paths.engine, inputs_hash)):
        log.info("build: cache hit for %s (%s engine, inputs unchanged)", cfg.name, backend.name)
        return BuildResult(paths.engine, backend.name, reason, manifest, cache_hit=True)
    record = {
        **artifacts.stage_header("build", cfg),
        "runtime": backend.name,
        "runtime_reason": reason,
        # How the torch runtime runs the shards (as configured; results files say how it ran) and how many.
        "tp_mode": cfg.runtime.tp_mode,
        "world_size": cfg.parallelism.tp * cfg.parallelism.pp,
        "checkpoint": {"dir": "../checkpoint", **inputs["checkpoint"]},
        "inputs": inputs,
        "inputs_hash": inputs_hash,
        "versions": artifacts.package_versions("torch", "tensorrt_llm"),
    }
    clock = artifacts.Stopwatch()
    fields = backend.build(cfg, ckpt.checkpoint_dir, paths.engine, clock)
    manifest = artifacts.write_manifest(paths.engine, {**record, **fields, "timings": clock.timings})
    log.info("build: %s engine for %s in %s", backend.name, cfg.name, paths.engine)
    return BuildResult(paths.engine, backend.name, reason, manifest, cache_hit=False)


def plan(cfg: BuildConfig, *, engines_dir: str | Path = "engines", runtime: str | None = None) -> list[str]:
    """The whole plan (runtime choice, quantize, build, how the engine runs), touching nothing."""
    backend, reason = select_backend(cfg, runtime)
    lines = [f"runtime: {backend.name} ({reason})", ""]
    lines += ["[quantize]"] + quantize.plan(cfg, engines_dir=engines_dir) + ["", "[build]"]
    return lines + backend.plan(cfg, artifacts.artifact_paths(engines_dir, cfg.name))
