"""The ``tensorrt_llm_pytorch`` backend: TensorRT-LLM >= 1.0's PyTorch backend on the unified HF checkpoint.

No engine is built: ``build`` checks the checkpoint ModelOpt exported (``hf_checkpoint/``; for
``format: none`` the model's own directory) against what the LLM API loads and records it.
``deploy`` writes, by ``runtime.pytorch_deploy``, a Triton ``llmapi`` model repository
(``tensorrt_llm/config.pbtxt`` and ``1/model.yaml``; upstream's ``model.py`` and ``helpers.py``
are TensorRT-LLM's, linked in at serve time from where it is installed) or a ``trtllm-serve``
launch (its ``--extra_llm_api_options`` YAML and the command). ``serve`` starts either where
TensorRT-LLM is importable and exits 3 with the way out where it is not; ``serve --dry-run``
prints the command anywhere. Both speak their own protocols (llmapi's ``text_input`` /
``sampling_param_*``; trtllm-serve is itself an OpenAI server), not the client contract, so the
OpenAI front is not put before them. The facts: ``trtllm/pytorch_deploy``.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trtllm_pipeline import artifacts
from trtllm_pipeline.endpoints import Ports
from trtllm_pipeline.errors import InputError, Problem, UnavailableError, bullets
from trtllm_pipeline.machine import NGC_TRITONSERVER, gpus, package_version, tritonserver_binaries
from trtllm_pipeline.model.source import resolve_model
from trtllm_pipeline.runtimes.trtllm import pytorch_deploy as tp
from trtllm_pipeline.runtimes.backend import Backend
from trtllm_pipeline.runtimes.base import Runtime
from trtllm_pipeline.triton import model_config as mc

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig
    from trtllm_pipeline.triton.contract import RequestLimits
    from trtllm_pipeline.triton.repository import EngineModel

MIN_VERSION = (1, 0)
INSTALL = "pip install 'tensorrt_llm>=1.0' on a Linux machine with NVIDIA GPUs (or use NGC's TensorRT-LLM container)"


class TrtllmPytorchBackend(Backend):
    name = "tensorrt_llm_pytorch"
    engines = "TensorRT-LLM PyTorch-backend deployments"
    runs = "with TensorRT-LLM's PyTorch backend (LLM API)"
    openai_front = False  # llmapi and trtllm-serve take their own requests, not tensorrt_llm_bls's

    def preflight(self, cfg: "BuildConfig") -> list[Problem]:
        """What running needs: TensorRT-LLM >= 1.0 importable, and tp x pp GPUs."""
        problems = [p for p in (version_problem(),) if p]
        found = len(gpus())
        if found < cfg.parallelism.world_size:
            problems.append(Problem(f"{cfg.parallelism.world_size} NVIDIA GPU(s) needed (tp x pp), {found} found",
                                    "run on a machine with enough GPUs"))
        return problems

    def build_problems(self, cfg: "BuildConfig") -> list[Problem]:
        return []  # no engine is built: checking the checkpoint runs anywhere; serve needs TensorRT-LLM

    def unavailable_fix(self, cfg: "BuildConfig") -> str:
        return (f"run on a machine with TensorRT-LLM >=1.0 and GPUs, or serve with the torch runtime here: "
                f"`trtllm-pipeline build -c {cfg.file_arg} --runtime torch`")

    def build(self, cfg: "BuildConfig", checkpoint_dir: Path, engine_dir: Path,
              clock: artifacts.Stopwatch) -> dict[str, Any]:
        with clock.time("validate_s"):
            found = tp.check_hf_checkpoint(cfg, hf_model_dir(cfg, checkpoint_dir))
        with artifacts.atomic_dir(engine_dir):
            pass  # no engine: the manifest names the checkpoint the LLM API loads
        return {"engine": {"kind": "none: TensorRT-LLM's PyTorch backend loads the unified HF checkpoint when "
                                   "served (no trtllm-build)", "hf_checkpoint": found}}

    def plan(self, cfg: "BuildConfig", paths: artifacts.ArtifactPaths) -> list[str]:
        model_dir = hf_model_dir(cfg, paths.checkpoint, resolve=False)
        problems = self.preflight(cfg)
        lines = [f"validate {model_dir} as TensorRT-LLM's LLM API loads it (config.json, *.safetensors, tokenizer, "
                 f"hf_quant_config.json quant_algo {tp.MODELOPT_FORMATS[cfg.quantization.format]!r}); no engine is "
                 "built",
                 "serve: " + ("TensorRT-LLM found here" if not problems else "not here:" + bullets(problems))]
        return lines + [f"launch ({cfg.runtime.pytorch_deploy}):", "  " + shlex.join(self._plan_command(cfg, paths))]

    def engine_model(self, cfg: "BuildConfig", *, engines_dir: Path, engine_dir: Path) -> "EngineModel":
        raise InputError("the tensorrt_llm_pytorch deployment has no inflight_batcher_llm tensorrt_llm model.")

    def write_repository(self, cfg: "BuildConfig", out: Path, *, engines_dir: Path, engine_dir: Path,
                         tokenizer_dir: Path, end_id: int, pad_id: int, limits: "RequestLimits") -> dict[str, Any]:
        model_dir = hf_model_dir(cfg, engine_dir.parent / "checkpoint", resolve=False)
        common = {"runtime": self.name, "flavour": cfg.runtime.pytorch_deploy, "end_id": end_id, "pad_id": pad_id,
                  "tokenizer_dir": str(tokenizer_dir), "engine_dir": str(engine_dir), "limits": limits.to_dict(),
                  "model_dir": str(model_dir)}
        if cfg.runtime.pytorch_deploy == "trtllm_serve":
            options = out / tp.EXTRA_OPTIONS
            options.write_text(yaml.safe_dump(tp.extra_llm_api_options(cfg), sort_keys=False), encoding="utf-8")
            s = cfg.serving
            argv = tp.trtllm_serve_argv(cfg, model_dir, tokenizer_dir, options, host=s.host, port=s.http_port)
            artifacts.write_json_atomic(out / tp.LAUNCH, {"argv": argv, "note": "serve replaces --host/--port"})
            return {**common, "models": [], "launch": argv}
        model = out / tp.LLMAPI_MODEL
        mc.write(model, mc.build(tp.llmapi_config()))
        (model / "1").mkdir()
        (model / "1" / tp.MODEL_YAML).write_text(yaml.safe_dump(tp.model_yaml(cfg, model_dir), sort_keys=False),
                                                 encoding="utf-8")
        return {**common, "models": [tp.LLMAPI_MODEL]}

    def ready_path(self, cfg: "BuildConfig") -> str:
        return "/health" if cfg.runtime.pytorch_deploy == "trtllm_serve" else "/v2/health/ready"

    def server_command(self, cfg: "BuildConfig", repo_dir: Path, ports: "Ports",
                       state_dir: Path) -> tuple[list[str], dict[str, str]]:
        return self._command(cfg, repo_dir, ports), dict(os.environ)

    def prepare_server(self, cfg: "BuildConfig", command: list[str], env: dict[str, str], state_dir: Path, *,
                       wheels: Path | None = None) -> None:
        """Exit 3 where TensorRT-LLM cannot run; for llmapi, link upstream's model.py and helpers.py into the
        repository's version directory."""
        if problems := self.preflight(cfg):
            raise UnavailableError(f"cannot serve {cfg.name} with TensorRT-LLM's PyTorch backend here:"
                                   + bullets(problems), fix=self.unavailable_fix(cfg))
        if cfg.runtime.pytorch_deploy == "trtllm_serve":
            return
        repo = Path(next(a for a in command if a.startswith("--model-repository=")).split("=", 1)[1])
        sources = tp.llmapi_sources(dict(os.environ))
        if sources is None:
            raise UnavailableError("the llmapi model's model.py and helpers.py (TensorRT-LLM's triton_backend/"
                                   "all_models/llmapi/tensorrt_llm/1/) are not found here.",
                                   fix=f"set {tp.LLMAPI_DIR_ENV} to that directory of your TensorRT-LLM version, or "
                                   "use runtime.pytorch_deploy: trtllm_serve")
        for name in tp.LLMAPI_SOURCES:
            link = repo / tp.LLMAPI_MODEL / "1" / name
            link.unlink(missing_ok=True)
            link.symlink_to(sources / name)

    def runtime_class(self) -> type["Runtime"]:
        return ServedOnly

    # ---- commands --------------------------------------------------------------------------------

    def _command(self, cfg: "BuildConfig", repo_dir: Path, ports: "Ports") -> list[str]:
        if cfg.runtime.pytorch_deploy == "trtllm_serve":
            launch = json.loads((repo_dir / tp.LAUNCH).read_text(encoding="utf-8"))["argv"]
            return _with_address(launch, ports.http_bind, ports.http)
        binary = tritonserver_binaries()["path"] or NGC_TRITONSERVER
        return [binary, f"--model-repository={repo_dir}", *ports.triton_flags()]

    def _plan_command(self, cfg: "BuildConfig", paths: artifacts.ArtifactPaths) -> list[str]:
        ports = Ports.of(cfg)
        if cfg.runtime.pytorch_deploy == "trtllm_serve":
            model_dir = hf_model_dir(cfg, paths.checkpoint, resolve=False)
            return tp.trtllm_serve_argv(cfg, model_dir, paths.tokenizer, paths.triton_repo / tp.EXTRA_OPTIONS,
                                        host=ports.host, port=ports.http)
        return self._command(cfg, paths.triton_repo, ports)


class ServedOnly(Runtime):
    """What ``generate``/``eval`` get in-process for this backend: a refusal naming the way that works."""

    @classmethod
    def from_engine(cls, engine_dir: Path, cfg: "BuildConfig", manifest: dict, **opts) -> "Runtime":
        raise InputError("a tensorrt_llm_pytorch build has no in-process runtime here (TensorRT-LLM's LLM API runs "
                         "it when served).", fix="serve it and pass --url, or build for --runtime torch to run it "
                         "in-process")


def hf_model_dir(cfg: "BuildConfig", checkpoint_dir: Path, *, resolve: bool = True) -> Path:
    """What the LLM API loads: the unified HF checkpoint beside the TensorRT-LLM one, or the source model."""
    if cfg.quantization.format != "none":
        if not cfg.quantization.export_hf_checkpoint:
            raise InputError("tensorrt_llm_pytorch serves the unified HF checkpoint, which "
                             "quantization.export_hf_checkpoint: false does not write.",
                             fix="set quantization.export_hf_checkpoint: true")
        return artifacts.ArtifactPaths(Path(checkpoint_dir).parent).hf_checkpoint
    return resolve_model(cfg.model).model_dir if resolve else Path(cfg.model.source)


def version_problem() -> Problem | None:
    """Why this machine's TensorRT-LLM cannot run the PyTorch backend, or None (doctor's line too)."""
    version = package_version("tensorrt_llm") or package_version("tensorrt-llm")
    if version is None:
        return Problem("TensorRT-LLM is not installed (its PyTorch backend needs >=1.0)", INSTALL)
    if _major_minor(version) < MIN_VERSION:
        return Problem(f"TensorRT-LLM {version} predates the PyTorch backend's LLM API (>=1.0)", INSTALL)
    return None


def _with_address(argv: list[str], host: str, port: int) -> list[str]:
    out = list(argv)
    out[out.index("--host") + 1], out[out.index("--port") + 1] = host, str(port)
    return out


def _major_minor(version: str) -> tuple[int, int]:
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
        return major, minor
    except ValueError:
        return (0, 0)
