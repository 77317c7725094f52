"""The torch backend: the validated TensorRT-LLM checkpoint is the engine, run in PyTorch on CPU or CUDA.

Building checks every shard (names, shapes, dtypes, finite positive scales) and records it; the
Triton ``tensorrt_llm`` model is a decoupled Python model running ``TorchRuntime``
(``triton.torch_repo``), served by the tritonserver bundled with nvidia-pytriton. The runtime
itself is ``torch_engine/runtime`` and ``torch_engine/model``; this module is only the glue the stages ask.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_pipeline import artifacts, checkpoint
from trtllm_pipeline.endpoints import SERVER_EXIT_TIMEOUT_S, restricted_api_flags
from trtllm_pipeline.errors import UnavailableError
from trtllm_pipeline.machine import gpus, tritonserver_binaries
from trtllm_pipeline.runtimes.backend import Backend
from trtllm_pipeline.triton import stub_env, torch_repo
from trtllm_pipeline.triton.repository import EngineModel

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig
    from trtllm_pipeline.endpoints import Ports
    from trtllm_pipeline.runtimes.base import Runtime


class TorchBackend(Backend):
    name = "torch"
    engines = "torch-runtime engines"
    runs = "in PyTorch"

    def chosen_because(self, cfg: "BuildConfig") -> str:
        return "the checkpoint run in PyTorch, which runs on any machine"

    def build(self, cfg: "BuildConfig", checkpoint_dir: Path, engine_dir: Path,
              clock: artifacts.Stopwatch) -> dict[str, Any]:
        with clock.time("validate_s"):
            config = checkpoint.read_config(checkpoint_dir)
            checkpoint.merge_rank_files(config, checkpoint.load_rank_files(checkpoint_dir, config))
        layout = checkpoint.CheckpointLayout(config)
        with artifacts.atomic_dir(engine_dir):
            pass  # the engine is the checkpoint: the directory holds only the manifest naming it
        return {"engine": {"kind": "torch runtime: the validated TensorRT-LLM checkpoint, run in PyTorch",
                           "checkpoint_tp": layout.tp, "dtype": config["dtype"], "quant_algo": layout.quant_algo,
                           "kv_cache_quant_algo": layout.kv_cache_quant_algo}}

    def plan(self, cfg: "BuildConfig", paths: artifacts.ArtifactPaths) -> list[str]:
        return [
            f"validate the checkpoint shards in {paths.checkpoint} (names, shapes, dtypes, scales)",
            f"engine: {paths.engine}/manifest.json naming the checkpoint; the torch runtime runs its "
            f"{cfg.parallelism.tp} TP shard(s) on {cfg.runtime.device} with runtime.tp_mode {cfg.runtime.tp_mode} "
            "(distributed: one process per rank; merged: one process)",
        ]

    def engine_model(self, cfg: "BuildConfig", *, engines_dir: Path, engine_dir: Path) -> EngineModel:
        return EngineModel(torch_repo.model_config(cfg, engines_dir=engines_dir), python_model="tensorrt_llm_torch",
                           streams_text=True, write_files=functools.partial(torch_repo.write_build_config, cfg))

    def server_command(self, cfg: "BuildConfig", repo_dir: Path, ports: "Ports",
                       state_dir: Path) -> tuple[list[str], dict[str, str]]:
        """The tritonserver bundled with nvidia-pytriton, given a backend directory with the Python-backend
        stub for this Python, this virtualenv first on PATH (the stub finds its interpreter there) and this
        interpreter's libpython (the stub would otherwise load the system's)."""
        binary = tritonserver_binaries()["pytriton"]
        if binary is None:
            raise UnavailableError("the torch deployment is served by the tritonserver bundled in nvidia-pytriton, "
                                   "which is not installed.", fix="pip install 'nvidia-pytriton==0.7.0' (Linux)")
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
        cmd = [binary, f"--model-repository={repo_dir}", f"--backend-directory={state_dir / 'backends'}",
               *ports.triton_flags(),
               f"--exit-timeout-secs={SERVER_EXIT_TIMEOUT_S}", "--pinned-memory-pool-byte-size=0",
               # deploy writes every config.pbtxt whole: completing them would start one more Python-backend
               # stub per model, importing its model.py (torch, transformers) only to be asked for nothing
               "--disable-auto-complete-config", *restricted_api_flags()]
        if not gpus():
            cmd.append("--allow-gpu-metrics=false")
        if verbose := os.environ.get("TRTLLM_PIPELINE_TRITON_LOG_VERBOSE", "").strip():  # diagnosis: each request logged
            cmd.append(f"--log-verbose={int(verbose)}")
        return cmd, env

    def prepare_server(self, cfg: "BuildConfig", command: list[str], env: dict[str, str], state_dir: Path, *,
                       wheels: Path | None = None) -> None:
        """The backend directory with the stub; where the serving Python has numpy 2, the stub's numpy<2
        environment (``triton.stub_env``, made once) first on the server's PATH: the stub takes its
        interpreter, and with it its site-packages, from the first ``python3`` there."""
        stub = stub_env.ensure(stub_env.wheels_dir(wheels)) if stub_env.needed() else None
        if stub is not None:
            env["PATH"] = os.pathsep.join([str(stub.bin), env.get("PATH", "")])
        python_backend_dir(command[0], state_dir, keep_first=stub.site_packages if stub else None)

    def runtime_class(self) -> type["Runtime"]:
        # Imported when an engine is loaded, not when a command starts: it imports torch.
        from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

        return TorchRuntime


def python_backend_dir(binary: str, state_dir: Path, keep_first: Path | None = None) -> Path:
    """``backends/python/`` holding the Python backend and the stub for this Python version.

    The bundled server looks for the stub only at ``<backend-directory>/python/``, while the wheel
    keeps one stub per Python version under ``python_backend_stubs/<version>/``. ``keep_first``: the
    stub environment's site-packages, which stays ahead of the serving process's path.
    """
    root = Path(binary).resolve().parents[1]
    stub = root / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / \
        "triton_python_backend_stub"
    if not stub.is_file():
        raise UnavailableError(f"nvidia-pytriton has no Python-backend stub for Python "
                               f"{sys.version_info.major}.{sys.version_info.minor} ({stub}).",
                               fix="use a Python version the wheel ships a stub for (3.8-3.13)")
    target = state_dir / "backends" / "python"
    target.mkdir(parents=True, exist_ok=True)
    for src in (root / "backends" / "python" / "libtriton_python.so", stub):
        link = target / src.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(src)
    write_sys_path_module(target, keep_first)
    write_backend_utils(target, root / "backends" / "python" / "triton_python_backend_utils.py")
    return target


SYS_PATH_MODULE = "serving_sys_path"


def write_sys_path_module(backend_dir: Path, keep_first: Path | None = None) -> Path:
    """A module that gives the Python models this process's module search path.

    The Python backend's stub configures its interpreter in isolation: it ignores PYTHONPATH (seen
    with the tritonserver 2.51 of nvidia-pytriton 0.7.0), so packages found only through it, as on a
    machine where the wheels were unpacked instead of installed, would not import in the models. The
    backend directory is on the stub's path; each model imports this module before anything else.
    The entries go first, or right after ``keep_first`` (the stub environment's numpy<2) where given.
    A crash, or SIGUSR1, writes every thread's stack to the stub's stderr, the server's log.
    """
    entries = [entry for entry in sys.path if entry]
    first = str(keep_first) if keep_first else None
    path = backend_dir / f"{SYS_PATH_MODULE}.py"
    with artifacts.atomic_file(path) as tmp:
        tmp.write_text(
            '"""Written by `trtllm-pipeline serve`: the module search path of the process that started '
            'this server."""\n\nimport faulthandler\nimport signal\nimport sys\n\n'
            "# A stub that crashes leaves its threads' Python stacks in the server's log; `kill -USR1 <stub pid>`\n"
            "# writes them there too (a request that never returns)\n"
            "faulthandler.enable(all_threads=True)\n"
            "faulthandler.register(signal.SIGUSR1, all_threads=True)\n\n"
            f"_AT = sys.path.index({first!r}) + 1 if {first!r} in sys.path else 0\n"
            f"for _entry in reversed({entries!r}):\n"
            "    if _entry not in sys.path:\n"
            "        sys.path.insert(_AT, _entry)\n", encoding="utf-8")
    return path


def write_backend_utils(backend_dir: Path, original: Path) -> Path:
    """``triton_python_backend_utils`` that sets the module path before running Triton's own module.

    The stub imports this module (from the backend directory) before any model, and it imports
    numpy: on the stub's own path that may be another numpy than the serving process's (a
    virtualenv's numpy 2 behind a numpy 1 on PYTHONPATH). Giving it the serving process's path first
    makes the stub's numpy the serving process's, or, with the stub environment, that environment's
    numpy<2 (``triton.stub_env``), which stays first.
    """
    path = backend_dir / original.name
    if path.is_symlink():
        path.unlink()
    with artifacts.atomic_file(path) as tmp:
        tmp.write_text(
            '"""Written by `trtllm-pipeline serve`: Triton\'s module, run after the serving process\'s module '
            'path is set (the stub imports numpy through it)."""\n\n'
            f"import {SYS_PATH_MODULE}  # noqa: F401\n\n"
            f"_ORIGINAL = {str(original)!r}\n"
            "with open(_ORIGINAL, encoding='utf-8') as _file:\n"
            "    exec(compile(_file.read(), _ORIGINAL, 'exec'))\n", encoding="utf-8")
    return path
