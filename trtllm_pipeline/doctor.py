"""``doctor``: what this machine can do, and which runtimes and shipped configs can run here.

The probes here are the single place that decides "is TensorRT-LLM usable", "which GPUs are
there": runtime selection and the build pre-flight use them too.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

TRTLLM_RANGE = ((1, 0), (1, 3))  # the engine flow (trtllm-build) exists in 1.0 <= v < 1.3
TRTLLM_INSTALL_HINT = ("pip install 'trtllm-pipeline[tensorrt-llm]' with NVIDIA's index, or run in the "
                       "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3 container")


@dataclasses.dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    sm: int  # compute capability as 90 for 9.0
    total_gib: float
    free_gib: float


def gpus() -> list[Gpu]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        try:
            free, total = torch.cuda.mem_get_info(i)
        except RuntimeError:
            free, total = props.total_memory, props.total_memory
        out.append(Gpu(i, props.name, props.major * 10 + props.minor, total / 2**30, free / 2**30))
    return out


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def trtllm_status() -> tuple[str | None, str | None]:
    """(version, problem): problem is None when TensorRT-LLM is importable and in the supported range."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None, f"TensorRT-LLM is not installed ({TRTLLM_INSTALL_HINT})"
    version = package_version("tensorrt_llm") or package_version("tensorrt-llm") or "unknown"
    try:
        major_minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        return version, f"cannot parse TensorRT-LLM version {version!r}"
    low, high = TRTLLM_RANGE
    if not (low <= major_minor < high):
        return version, (f"TensorRT-LLM {version} is outside >=1.0,<1.3: the trtllm-build engine flow was "
                         "removed in 1.3; install tensorrt_llm 1.2.x")
    return version, None


def tritonserver_binaries() -> dict[str, str | None]:
    """The TensorRT-LLM container's server on PATH, and the CPU-capable one bundled with PyTriton."""
    bundled = None
    spec = importlib.util.find_spec("pytriton")
    if spec and spec.submodule_search_locations:
        candidate = Path(list(spec.submodule_search_locations)[0]) / "tritonserver" / "bin" / "tritonserver"
        bundled = str(candidate) if candidate.is_file() else None
    return {"path": shutil.which("tritonserver") or (
        "/opt/tritonserver/bin/tritonserver" if Path("/opt/tritonserver/bin/tritonserver").is_file() else None),
        "pytriton": bundled}


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
        "tensorrt_llm_problem": trt_problem,
        "tritonserver": tritonserver_binaries(),
        "mpirun": shutil.which("mpirun"),
    }


def config_verdict(cfg) -> str:
    """One line: which runtime this config gets here, or why its configured one cannot run."""
    from trtllm_pipeline.runtimes import select_runtime, trtllm_runtime

    backend = cfg.runtime.backend
    if backend == "torch":
        return "torch (set in the config)"
    if backend == "auto":
        name, why = select_runtime(cfg, "auto")
        return f"{name} (auto: {why})"
    problems = trtllm_runtime.preflight(cfg)
    if not problems:
        return "tensorrt_llm: ready"
    short = "; ".join(p.split(" (")[0].split(". Fix")[0].rstrip(".") for p in problems)
    return f"tensorrt_llm: cannot run here ({short}); `--runtime torch` runs it in PyTorch instead"
