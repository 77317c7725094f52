"""The runtime backends, one registration line each, and how a build's runtime is chosen and loaded.

``auto`` tries the backends in registration order and takes the first whose pre-flight finds
nothing missing, so the last one registered must run anywhere (torch). Which one ran is always
recorded: the build manifest names it, and every later stage asks that backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_pipeline import artifacts
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.backend import Backend
from trtllm_pipeline.runtimes.base import Runtime
from trtllm_pipeline.runtimes.torch_engine.backend import TorchBackend
from trtllm_pipeline.runtimes.trtllm.backend import TrtllmBackend
from trtllm_pipeline.runtimes.trtllm.pytorch_backend import TrtllmPytorchBackend

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

BACKENDS: dict[str, Backend] = {b.name: b for b in (
    TrtllmBackend(),
    TrtllmPytorchBackend(),  # TensorRT-LLM 1.3+ (no engine flow), or where the engine flow cannot run
    TorchBackend(),  # runs anywhere: auto's last resort
)}


def backend(name: str) -> Backend:
    """The backend called ``name`` (a config's, a command line's or a manifest's runtime)."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise InputError(f"{name!r} is not a runtime this version knows.",
                         fix=f"use one of {', '.join(BACKENDS)} (rebuild an engine made by another version)") from None


def select_backend(cfg: "BuildConfig", requested: str | None = None) -> tuple[Backend, str]:
    """(backend, why). ``auto`` takes the first backend whose pre-flight finds no problem."""
    choice = requested or cfg.runtime.backend
    if choice != "auto":
        return backend(choice), "requested" if requested else "set in the config (runtime.backend)"
    refusal = None  # why the preferred backend cannot run here: the reason a later one is taken
    for candidate in BACKENDS.values():
        problems = candidate.preflight(cfg)
        if not problems:
            return candidate, refusal or candidate.chosen_because(cfg)
        refusal = refusal or problems[0].problem
    raise InputError(f"no runtime can run {cfg.name} here: {refusal}.")  # unreachable while torch is registered


def load_runtime(cfg: "BuildConfig", engines_dir: str | Path = "engines", runtime: str | None = None,
                 **options) -> Runtime:
    """Load the built engine of ``cfg`` with the runtime its build manifest names.

    Raises ``InputError`` (with the build command as the fix) when nothing has been built, or when
    ``runtime`` (a command line's ``--runtime``; None or ``auto``: any) is not the one it was built for.
    ``options`` go to the runtime class (the torch runtime takes ``device=``).
    """
    manifest = artifacts.engine_manifest(engines_dir, cfg)
    if runtime not in (None, "auto") and manifest["runtime"] != runtime:
        raise InputError(f"{cfg.name} was built for the {manifest['runtime']} runtime, not {runtime}.",
                         fix=f"run `trtllm-pipeline build -c {cfg.file_arg} --runtime {runtime}` first")
    directory = artifacts.artifact_paths(engines_dir, cfg.name).engine
    return backend(manifest["runtime"]).runtime_class().from_engine(directory, cfg, manifest, **options)
