"""The one interface a runtime backend fills in: how a build is made, served and run for that runtime.

A backend is a plug-in: the ``build``, ``deploy`` and ``serve`` stages ask the selected backend
(``registry.select_backend``, or the backend the engine's manifest names) and never test its name.
Each backend module fills in this class and registers one instance in ``registry.BACKENDS``:

* ``preflight`` -- why this machine cannot build and run a config: ``Problem(problem, fix)`` pairs.
* ``build`` -- the engine directory from the validated TensorRT-LLM checkpoint.
* ``plan`` -- what ``build`` would do, for ``build --dry-run``.
* ``engine_model`` -- the Triton repository's ``tensorrt_llm`` model (the repository's flavour).
* ``server_command`` / ``prepare_server`` -- how ``serve`` launches tritonserver on that repository.
* ``runtime_class`` -- the ``Runtime`` that runs the engine in-process (``generate``, ``eval``).
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from trtllm_pipeline.errors import Problem, UnavailableError, bullets
from trtllm_pipeline.triton import repository

if TYPE_CHECKING:
    from trtllm_pipeline.artifacts import ArtifactPaths, Stopwatch
    from trtllm_pipeline.config import BuildConfig
    from trtllm_pipeline.endpoints import Ports
    from trtllm_pipeline.runtimes.base import Runtime
    from trtllm_pipeline.triton.contract import RequestLimits
    from trtllm_pipeline.triton.repository import EngineModel


class Backend(abc.ABC):
    name: ClassVar[str]  # as runtime.backend, --runtime and every manifest's "runtime" name it
    engines: ClassVar[str]  # what it builds, for messages: "TensorRT-LLM engines"
    runs: ClassVar[str]  # how it runs a build, for messages: "in PyTorch"
    # Whether its deployment takes the client contract (tensorrt_llm_bls), which the OpenAI front translates to.
    openai_front: ClassVar[bool] = True

    def preflight(self, cfg: "BuildConfig") -> list[Problem]:
        """Why this machine cannot build and run ``cfg`` with this backend; empty when it can."""
        return []

    def chosen_because(self, cfg: "BuildConfig") -> str:
        """Why ``--runtime auto`` takes this backend (asked only when its pre-flight is clean)."""
        return "its pre-flight finds nothing missing here"

    def unavailable_fix(self, cfg: "BuildConfig") -> str | None:
        """What to do when the pre-flight finds problems (another runtime, another machine)."""
        return None

    def build_problems(self, cfg: "BuildConfig") -> list[Problem]:
        """What stops ``build`` here (the pre-flight, unless building needs less than running)."""
        return self.preflight(cfg)

    def require(self, cfg: "BuildConfig") -> None:
        """UnavailableError (exit 3) listing the problems that stop ``build``, before any work is spent."""
        problems = self.build_problems(cfg)
        if problems:
            raise UnavailableError(f"cannot build {self.engines} for {cfg.name} on this machine:" + bullets(problems),
                                   fix=self.unavailable_fix(cfg))

    @abc.abstractmethod
    def build(self, cfg: "BuildConfig", checkpoint_dir: Path, engine_dir: Path, clock: "Stopwatch") -> dict[str, Any]:
        """Write ``engine_dir`` (atomically, every file but the manifest) and return the manifest fields it adds."""

    @abc.abstractmethod
    def plan(self, cfg: "BuildConfig", paths: "ArtifactPaths") -> list[str]:
        """The ``[build]`` lines of ``build --dry-run``: what ``build`` would run, touching nothing."""

    @abc.abstractmethod
    def engine_model(self, cfg: "BuildConfig", *, engines_dir: Path, engine_dir: Path) -> "EngineModel":
        """The Triton repository's ``tensorrt_llm`` model that serves this backend's engine."""

    def write_repository(self, cfg: "BuildConfig", out: Path, *, engines_dir: Path, engine_dir: Path,
                         tokenizer_dir: Path, end_id: int, pad_id: int, limits: "RequestLimits") -> dict[str, Any]:
        """Write what ``serve`` runs into ``out`` (deploy's directory) and return the manifest fields it adds;
        by default TensorRT-LLM's inflight_batcher_llm repository around ``engine_model``."""
        engine = self.engine_model(cfg, engines_dir=engines_dir, engine_dir=engine_dir)
        return repository.write_repository(cfg, self.name, engine, out, engine_dir=engine_dir,
                                           tokenizer_dir=tokenizer_dir, end_id=end_id, pad_id=pad_id, limits=limits)

    def ready_path(self, cfg: "BuildConfig") -> str:
        """Where on the HTTP port ``serve`` asks whether the server is ready (Triton's readiness endpoint)."""
        return "/v2/health/ready"

    @abc.abstractmethod
    def server_command(self, cfg: "BuildConfig", repo_dir: Path, ports: "Ports",
                       state_dir: Path) -> tuple[list[str], dict[str, str]]:
        """The tritonserver argument list and environment for a repository of this backend."""

    def prepare_server(self, cfg: "BuildConfig", command: list[str], env: dict[str, str], state_dir: Path, *,
                       wheels: Path | None = None) -> None:
        """Set up what the server command needs on disk, just before it starts (not for a dry run), adjusting
        its environment ``env`` in place; raise UnavailableError (exit 3) where this machine cannot run it.
        ``wheels``: a folder of wheels for what the server needs installed (offline machines)."""

    @abc.abstractmethod
    def runtime_class(self) -> type["Runtime"]:
        """The runtime that loads this backend's engine in-process (``from_engine``)."""
