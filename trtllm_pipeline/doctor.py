"""Stage ``doctor``: what this machine can do, and which runtime each shipped config gets here.

It only presents: the facts come from ``machine`` and the verdicts from the runtime backends'
own pre-flight checks (``runtimes.registry``), the same ones ``build`` and ``--runtime auto`` use.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

from trtllm_pipeline.config import BuildConfig, load_config
from trtllm_pipeline.errors import PipelineError
from trtllm_pipeline.machine import gpus, package_version, trtllm_status, tritonserver_binaries
from trtllm_pipeline.runtimes.registry import BACKENDS, select_backend
from trtllm_pipeline.runtimes.trtllm.pytorch_backend import version_problem
from trtllm_pipeline.triton import stub_env


def report() -> dict[str, Any]:
    import torch

    devices = gpus()
    trt_version, trt_problem = trtllm_status()
    return {
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})",
        "gpus": [dataclasses.asdict(g) for g in devices],
        "nvidia-modelopt": package_version("nvidia-modelopt"),
        "transformers": package_version("transformers"),
        "datasets": package_version("datasets"),
        "tensorrt_llm": trt_version,
        "tensorrt_llm_problem": str(trt_problem) if trt_problem else None,
        "tensorrt_llm_pytorch_problem": str(problem) if (problem := version_problem()) else None,
        "tritonserver": tritonserver_binaries(),
        "numpy": package_version("numpy"),
        "stub_numpy": stub_env.describe(stub_env.wheels_dir()),
        "mpirun": shutil.which("mpirun"),
    }


def config_verdict(cfg: BuildConfig) -> str:
    """One line: which runtime this config gets here, or why its configured one cannot run."""
    backend, why = select_backend(cfg)
    if cfg.runtime.backend == "auto":
        return f"{backend.name} (auto: {why})"
    problems = backend.preflight(cfg)
    if not problems:
        return f"{backend.name}: ready"
    fallback = list(BACKENDS.values())[-1]  # registered last: runs anywhere
    short = "; ".join(p.problem for p in problems)
    return f"{backend.name}: cannot run here ({short}); `--runtime {fallback.name}` runs it {fallback.runs} instead"


def facts(configs_dir: Path) -> dict[str, Any]:
    """``report()`` plus the verdict of every config in ``configs_dir`` (``invalid: ...`` for a broken one)."""
    out = report()
    verdicts = {}
    for path in sorted(configs_dir.glob("*.yaml")) if configs_dir.is_dir() else []:
        try:
            verdicts[path.stem] = config_verdict(load_config(path))
        except PipelineError as exc:
            verdicts[path.stem] = f"invalid: {exc.message}"
    out["configs"] = verdicts
    return out


def format_facts(facts: dict[str, Any], *, as_json: bool = False) -> list[str]:
    """The lines ``doctor`` prints: a table of facts and one verdict per config, or the facts as JSON."""
    if as_json:
        return [json.dumps(facts, indent=2)]
    devices = facts["gpus"]
    rows = [
        ("python", facts["python"]),
        ("platform", facts["platform"]),
        ("torch", facts["torch"]),
        ("GPUs", "; ".join(f"{g['index']}: {g['name']} SM{g['sm']} {g['total_gib']:.0f} GiB ({g['free_gib']:.0f} free)"
                           for g in devices) or "none"),
        ("nvidia-modelopt", facts["nvidia-modelopt"] or "not installed"),
        ("transformers", facts["transformers"] or "not installed"),
        ("datasets", facts["datasets"] or "not installed"),
        ("TensorRT-LLM", facts["tensorrt_llm"] or "not installed"),
        ("tritonserver (PATH)", facts["tritonserver"]["path"] or "not found"),
        ("tritonserver (PyTriton)", facts["tritonserver"]["pytriton"] or "not found"),
        ("numpy", facts["numpy"]),
        ("numpy in Triton's stub", facts["stub_numpy"]),
        ("mpirun", facts["mpirun"] or "not found"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{key:<{width}}  {value}" for key, value in rows]
    runtimes = ["torch (CPU" + (", CUDA)" if devices else ")")]
    runtimes.append("tensorrt_llm" if not facts["tensorrt_llm_problem"] else
                    f"tensorrt_llm unavailable: {facts['tensorrt_llm_problem']}")
    runtimes.append("tensorrt_llm_pytorch" if not facts["tensorrt_llm_pytorch_problem"] else
                    f"tensorrt_llm_pytorch unavailable: {facts['tensorrt_llm_pytorch_problem']}")
    lines.append(f"{'runtimes':<{width}}  " + "; ".join(runtimes))
    if facts["configs"]:
        lines.append("\nconfigs (the runtime each gets on this machine):")
        lines += [f"  {name:<34} {verdict}" for name, verdict in facts["configs"].items()]
    return lines
