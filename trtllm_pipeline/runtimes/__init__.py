"""Runtimes: the engines that execute a build, behind one interface (``base.Runtime``).

``tensorrt_llm``: TensorRT-LLM 1.2.x engines built by trtllm-build (NVIDIA GPUs, SM89+ for FP8).
``torch``: executes the exported TensorRT-LLM checkpoint itself in PyTorch, on CPU or CUDA; the
embedded default wherever TensorRT-LLM is not installed. Which one ran is always recorded.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_pipeline.runtimes.base import Completion, Runtime, SamplingParams, TextStream, TokenEvent

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

RUNTIME_NAMES = ("tensorrt_llm", "torch")
_CLASSES = {
    "torch": "trtllm_pipeline.runtimes.torch_runtime:TorchRuntime",
    "tensorrt_llm": "trtllm_pipeline.runtimes.trtllm_runtime:TrtllmRuntime",
}

__all__ = ["Completion", "Runtime", "SamplingParams", "TextStream", "TokenEvent", "RUNTIME_NAMES",
           "select_runtime", "runtime_class"]


def runtime_class(name: str) -> type[Runtime]:
    module, attr = _CLASSES[name].split(":")
    return getattr(importlib.import_module(module), attr)


def select_runtime(cfg: "BuildConfig", requested: str | None = None) -> tuple[str, str]:
    """(runtime name, why). ``auto`` takes TensorRT-LLM only where its pre-flight finds no problem."""
    from trtllm_pipeline import doctor
    from trtllm_pipeline.runtimes import trtllm_runtime

    choice = requested or cfg.runtime.backend
    if choice in RUNTIME_NAMES:
        return choice, "requested" if requested else "set in the config (runtime.backend)"
    problems = trtllm_runtime.preflight(cfg)
    if problems:
        return "torch", problems[0].split(" (")[0].split(". Fix")[0].rstrip(".")
    devices = doctor.gpus()[: cfg.parallelism.world_size]
    return "tensorrt_llm", f"TensorRT-LLM {doctor.trtllm_status()[0]} with {len(devices)}x {devices[0].name} (SM{devices[0].sm})"


def engine_dir(engines_dir: str | Path, cfg: "BuildConfig") -> Path:
    from trtllm_pipeline.artifacts import artifact_paths

    return artifact_paths(engines_dir, cfg.name).engine


def load_runtime(cfg: "BuildConfig", engines_dir: str | Path = "engines", **options) -> Runtime:
    """Load the built engine of ``cfg`` with the runtime its build manifest names.

    Raises ``InputError`` (with the build command as the fix) when nothing has been built.
    ``options`` go to the runtime class (the torch runtime takes ``device=``).
    """
    from trtllm_pipeline.artifacts import read_manifest
    from trtllm_pipeline.errors import InputError

    directory = engine_dir(engines_dir, cfg)
    manifest = read_manifest(directory)
    if manifest is None:
        raise InputError(
            f"{directory} holds no built engine for {cfg.name}.",
            fix=f"run `trtllm-pipeline build -c {cfg.path or cfg.name}` first",
        )
    name = manifest["runtime"]
    return runtime_class(name).from_engine(directory, cfg, manifest, **options)
