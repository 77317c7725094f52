"""Facts about this machine: its GPUs, its packages, its TensorRT-LLM and its tritonserver binaries.

The single place that decides "is TensorRT-LLM usable here" and "which GPUs are there": runtime
selection, the build pre-flight, serving and ``doctor`` (which only presents them) all ask here.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import shutil
from pathlib import Path

from trtllm_pipeline.errors import Problem

TRTLLM_RANGE = ((1, 0), (1, 3))  # the engine flow (trtllm-build) exists in 1.0 <= v < 1.3
TRTLLM_INSTALL_HINT = ("pip install 'trtllm-pipeline[tensorrt-llm]' with NVIDIA's index, or run in the "
                       "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3 container")
NGC_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"  # where the TensorRT-LLM container keeps it


@dataclasses.dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    sm: int  # compute capability as 90 for 9.0
    total_gib: float
    free_gib: float


def cuda_available() -> bool:
    """Whether torch sees a CUDA device here (where the torch runtime's ``device: auto`` goes)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def gpus() -> list[Gpu]:
    if not cuda_available():
        return []
    import torch

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


def trtllm_status() -> tuple[str | None, Problem | None]:
    """(version, problem): problem is None when TensorRT-LLM is importable and in the supported range."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None, Problem("TensorRT-LLM is not installed", TRTLLM_INSTALL_HINT)
    version = package_version("tensorrt_llm") or package_version("tensorrt-llm") or "unknown"
    try:
        major_minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        return version, Problem(f"cannot parse TensorRT-LLM version {version!r}", "install tensorrt_llm 1.2.x")
    low, high = TRTLLM_RANGE
    if not (low <= major_minor < high):
        return version, Problem(f"TensorRT-LLM {version} is outside >=1.0,<1.3: the trtllm-build engine flow was "
                                "removed in 1.3", "install tensorrt_llm 1.2.x")
    return version, None


def tritonserver_binaries() -> dict[str, str | None]:
    """The TensorRT-LLM container's server on PATH, and the CPU-capable one bundled with PyTriton."""
    bundled = None
    spec = importlib.util.find_spec("pytriton")
    if spec and spec.submodule_search_locations:
        candidate = Path(list(spec.submodule_search_locations)[0]) / "tritonserver" / "bin" / "tritonserver"
        bundled = str(candidate) if candidate.is_file() else None
    return {"path": shutil.which("tritonserver") or (NGC_TRITONSERVER if Path(NGC_TRITONSERVER).is_file() else None),
            "pytriton": bundled}
