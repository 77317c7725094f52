"""Stage ``doctor``: what this machine can do, and which runtime each shipped config gets here.

It only presents: the facts come from ``machine`` and the verdicts from the runtime backends'
own pre-flight checks (``runtimes.registry``), the same ones ``build`` and ``--runtime auto`` use.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

from trtllm_pipeline.config import BuildConfig, load_config
from trtllm_pipeline.errors import PipelineError
from trtllm_pipeline.machine import Gpu, gpus, package_version, trtllm_status, tritonserver_binaries
from trtllm_pipeline.model.source import fetch_needed, known_shape
from trtllm_pipeline.runtimes.registry import BACKENDS, select_backend
from trtllm_pipeline.runtimes.trtllm.preflight import estimate_memory
from trtllm_pipeline.runtimes.trtllm.pytorch_backend import version_problem
from trtllm_pipeline.triton import stub_env

# The torch runtime on a CPU computes in float32 and reads every weight once a token; at this assumed memory
# bandwidth (a server CPU's order) a model whose float32 weights take longer than PRACTICAL_S_PER_TOKEN to read
# is not called ready on a machine without a GPU.
CPU_READ_BYTES_PER_S = 20e9
PRACTICAL_S_PER_TOKEN = 1.0
GB = 1e9


@dataclasses.dataclass(frozen=True)
class Needs:
    """What running a config with the torch runtime takes (estimates from the model's shape, before any work)."""

    fetch: str | None  # "download" / "generate": the model is not on this machine yet
    model_bytes: int  # the model's weights as published or generated (bf16)
    disk_bytes: int  # what is not here yet: the model, the checkpoint, the unified HF checkpoint
    memory_bytes: int  # host memory to run it on a CPU: float32 copies of the weights beside the checkpoint
    gpu_bytes: int  # memory of each GPU to run it on CUDA: its rank's weights and KV cache
    cpu_s_per_token: float  # reading the float32 weights once at CPU_READ_BYTES_PER_S


def torch_needs(cfg: BuildConfig) -> Needs | None:
    """The torch runtime's needs for ``cfg`` (None: the model's shape cannot be known without downloading it)."""
    shape = known_shape(cfg.model)
    if shape is None:
        return None
    memory = estimate_memory(cfg, shape)
    ranks = cfg.parallelism.world_size
    checkpoint = memory["weights_bytes"] * ranks
    fetch = fetch_needed(cfg.model)
    model_bytes = shape.num_params * 2
    exports = 2 if cfg.quantization.export_hf_checkpoint and cfg.quantization.format != "none" else 1
    return Needs(fetch=fetch, model_bytes=model_bytes, disk_bytes=(model_bytes if fetch else 0) + exports * checkpoint,
                 memory_bytes=shape.num_params * 4 + checkpoint,
                 gpu_bytes=memory["weights_bytes"] + memory["kv_cache_bytes"],
                 cpu_s_per_token=shape.num_params * 4 / CPU_READ_BYTES_PER_S)


@dataclasses.dataclass(frozen=True)
class Machine:
    gpus: list[Gpu]
    memory_bytes: int
    free_disk_bytes: int
    cores: int

    @classmethod
    def here(cls, devices: list[Gpu] | None = None) -> "Machine":
        return cls(gpus() if devices is None else devices, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                   shutil.disk_usage(Path.cwd()).free, len(os.sched_getaffinity(0)))


def practical(needs: Needs, machine: Machine, ranks: int) -> bool:
    """Whether the torch runtime runs a config usefully on ``machine``: the disk for what it writes, and GPUs
    that hold each rank (one GPU holding it merged will do), else the memory and the speed on the CPU."""
    if needs.disk_bytes > machine.free_disk_bytes:
        return False
    fitting = [g for g in machine.gpus if g.total_gib * 2**30 >= needs.gpu_bytes]
    if len(fitting) >= ranks or (fitting and len(machine.gpus) < ranks):
        return True
    return needs.memory_bytes <= machine.memory_bytes and needs.cpu_s_per_token <= PRACTICAL_S_PER_TOKEN


def needs_note(cfg: BuildConfig, machine: Machine) -> str | None:
    """``not ready here: needs ...`` for a config the torch runtime cannot run usefully on ``machine``."""
    needs = torch_needs(cfg)
    if needs is None or practical(needs, machine, cfg.parallelism.world_size):
        return None
    fetch = {"download": f"a {needs.model_bytes / GB:.1f} GB download from the hub, ",
             "generate": f"{needs.model_bytes / GB:.1f} GB of random weights generated, "}.get(needs.fetch, "")
    gpus_here = f"{len(machine.gpus)} here" if machine.gpus else "none here"
    return (f"not ready here: needs {fetch}~{needs.disk_bytes / GB:.0f} GB of disk ({machine.free_disk_bytes / GB:.0f} "
            f"free), a GPU with ~{needs.gpu_bytes / GB:.0f} GB per rank ({gpus_here}); on this CPU instead "
            f"~{needs.memory_bytes / GB:.0f} GB of memory ({machine.memory_bytes / GB:.0f} here), "
            f"~{needs.cpu_s_per_token:.1f} s a token on {machine.cores} core(s) and hours to quantize")


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


def config_verdict(cfg: BuildConfig, machine: Machine | None = None) -> str:
    """One line: which runtime this config gets here, or why its configured one cannot run; for the torch
    runtime (which runs anywhere) whether it is practical here, with what the config needs when not."""
    machine = machine or Machine.here()
    fallback = list(BACKENDS.values())[-1]  # registered last: runs anywhere
    backend, why = select_backend(cfg)
    note = needs_note(cfg, machine) if backend is fallback or cfg.runtime.backend != "auto" else None
    if cfg.runtime.backend == "auto":
        return f"{backend.name} (auto: {why})" + (f": {note}" if note else "")
    problems = backend.preflight(cfg)
    if not problems:
        return f"{backend.name}: " + (note if backend is fallback and note else "ready")
    short = "; ".join(p.problem for p in problems)
    return (f"{backend.name}: cannot run here ({short}); `--runtime {fallback.name}` runs it {fallback.runs} instead"
            + (f", but {note}" if note else ""))


def facts(configs_dir: Path) -> dict[str, Any]:
    """``report()`` plus the verdict of every config in ``configs_dir`` (``invalid: ...`` for a broken one)."""
    out = report()
    machine = Machine.here()
    verdicts = {}
    for path in sorted(configs_dir.glob("*.yaml")) if configs_dir.is_dir() else []:
        try:
            verdicts[path.stem] = config_verdict(load_config(path), machine)
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
