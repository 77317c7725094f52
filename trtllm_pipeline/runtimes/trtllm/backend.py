"""The TensorRT-LLM backend: trtllm-build engines, served by TensorRT-LLM's C++ Triton backend under mpirun.

The parts, one concern each: ``trtllm/preflight`` (can this machine do it, and the memory
estimate), ``trtllm/commands`` (the command lines), ``trtllm/build`` (running trtllm-build),
``trtllm/runtime`` (the engine in-process) and ``triton.trtllm_repo`` (the repository's
``tensorrt_llm`` model). This module is the glue the stages ask.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_pipeline import artifacts
from trtllm_pipeline.errors import Problem
from trtllm_pipeline.machine import NGC_TRITONSERVER, gpus, trtllm_status, tritonserver_binaries
from trtllm_pipeline.model.source import known_shape
from trtllm_pipeline.runtimes.backend import Backend
from trtllm_pipeline.runtimes.trtllm.build import build_engine
from trtllm_pipeline.runtimes.trtllm.commands import (build_notes, engine_run_command, generate_argv, quoted,
                                                      server_launch_command, trtllm_build_command)
from trtllm_pipeline.runtimes.trtllm.preflight import estimate_memory, memory_line, preflight
from trtllm_pipeline.runtimes.trtllm.runtime import TrtllmRuntime
from trtllm_pipeline.triton import trtllm_repo
from trtllm_pipeline.triton.repository import EngineModel

if TYPE_CHECKING:
    from trtllm_pipeline.artifacts import Stopwatch
    from trtllm_pipeline.config import BuildConfig
    from trtllm_pipeline.endpoints import Ports


class TrtllmBackend(Backend):
    name = "tensorrt_llm"
    engines = "TensorRT-LLM engines"
    runs = "with TensorRT-LLM"

    def preflight(self, cfg: "BuildConfig") -> list[Problem]:
        return preflight(cfg)

    def chosen_because(self, cfg: "BuildConfig") -> str:
        devices = gpus()[: cfg.parallelism.world_size]
        return f"TensorRT-LLM {trtllm_status()[0]} with {len(devices)}x {devices[0].name} (SM{devices[0].sm})"

    def unavailable_fix(self, cfg: "BuildConfig") -> str:
        return (f"run on a machine that has them, or build for the torch runtime instead (the FP8 checkpoint run "
                f"in PyTorch, CPU or CUDA): `trtllm-pipeline build -c {cfg.file_arg} --runtime torch` (with make: "
                "RUNTIME=torch, which first fetches the model's checkpoint from the hub if it is not here: "
                "ALLOW_DOWNLOAD=1); on a machine without a GPU, MODEL=tiny-qwen2 is what runs (the same make target "
                "with MODEL=tiny-qwen2, or `make demo`)")

    def build(self, cfg: "BuildConfig", checkpoint_dir: Path, engine_dir: Path, clock: "Stopwatch") -> dict[str, Any]:
        with clock.time("trtllm_build_s"):
            return build_engine(cfg, checkpoint_dir, engine_dir)

    def plan(self, cfg: "BuildConfig", paths: artifacts.ArtifactPaths) -> list[str]:
        return plan(cfg, paths.checkpoint, paths.engine)

    def engine_model(self, cfg: "BuildConfig", *, engines_dir: Path, engine_dir: Path) -> EngineModel:
        return EngineModel(trtllm_repo.model_config(cfg, engine_dir=engine_dir))

    def server_command(self, cfg: "BuildConfig", repo_dir: Path, ports: "Ports",
                       state_dir: Path) -> tuple[list[str], dict[str, str]]:
        """The tritonserver on PATH (NGC ``tritonserver:<yy.mm>-trtllm-python-py3``), one per rank under mpirun."""
        binary = tritonserver_binaries()["path"] or NGC_TRITONSERVER
        return server_launch_command(cfg, repo_dir, binary, ports.http, ports.grpc, ports.metrics,
                                     ports.host, http_host=ports.http_bind), dict(os.environ)

    def runtime_class(self) -> type[TrtllmRuntime]:
        return TrtllmRuntime


def plan(cfg: "BuildConfig", checkpoint_dir: Path, engine_dir: Path) -> list[str]:
    """Dry-run lines: pre-flight verdicts, the trtllm-build command, how the engine runs and is served."""
    problems = preflight(cfg)
    lines = ["pre-flight: " + ("ok" if not problems else f"{len(problems)} problem(s) on this machine")]
    lines += [f"  - {p}" for p in problems]
    lines += ["trtllm-build:", "  " + quoted(trtllm_build_command(cfg, checkpoint_dir, engine_dir))]
    lines += [f"  {cfg.quantization.format}: {note}" for note in build_notes(cfg)]
    lines.append(f"  expect: {engine_dir}/config.json (pretrained_config, build_config) and "
                 + ", ".join(f"rank{r}.engine" for r in range(cfg.parallelism.world_size)))
    run = engine_run_command(cfg, engine_dir, generate_argv(cfg))
    lines += ["run in-process (one MPI rank per GPU):", "  " + quoted(run)]
    repo = artifacts.ArtifactPaths(Path(engine_dir).parent).triton_repo
    s = cfg.serving
    serve = server_launch_command(cfg, repo, NGC_TRITONSERVER, s.http_port, s.grpc_port,
                                  s.metrics_port, s.host)
    lines += ["serve with Triton:", "  " + quoted(serve)]
    shape = known_shape(cfg.model)
    lines.append(memory_line(estimate_memory(cfg, shape)) if shape else
                 "memory: model shape unknown here (not downloaded, not in the catalog); no estimate")
    return lines
