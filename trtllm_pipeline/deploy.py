"""Stage ``deploy``: the Triton model repository of a build, ``engines/<config>/triton_model_repo/``.

TensorRT-LLM's ``inflight_batcher_llm`` layout for either runtime (see ``triton.repository``): the
models every runtime shares, and the ``tensorrt_llm`` model the runtime's backend supplies, every
parameter filled from the build config, the engine and the tokenizer. The repository can be
written before the engine exists (a TensorRT-LLM engine cannot be built on every machine): deploy
says so, and ``serve`` refuses until the engine is there. Unchanged inputs are a cache hit.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from trtllm_pipeline import artifacts
from trtllm_pipeline.config import BuildConfig, check_against_model
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.model.source import known_shape
from trtllm_pipeline.runtimes.backend import Backend
from trtllm_pipeline.runtimes.registry import backend, select_backend
from trtllm_pipeline.tokenizer import Tokenizer
from trtllm_pipeline.triton import repository
from trtllm_pipeline.triton.contract import longest_token_bytes, request_limits

log = logging.getLogger(__name__)

DEPLOY_REVISION = 3  # bump when what deploy writes changes without its inputs changing
# Without the build's tokenizer (a repository written before quantize): a bound on the bytes one token
# can stand for that no tokenizer here exceeds, so the byte limit refuses nothing the engine would take.
UNKNOWN_TOKEN_BYTES = 1024


@dataclasses.dataclass
class DeployResult:
    cfg: BuildConfig
    repo_dir: Path
    runtime: str
    reason: str
    engine_dir: Path
    engine_ready: bool
    manifest: dict[str, Any]
    cache_hit: bool

    def summary(self) -> str:
        status = "cache hit" if self.cache_hit else "deployed"
        return (f"{status}: {self.repo_dir} ({self.runtime} runtime: {self.reason}; end id "
                f"{self.manifest['end_id']}, pad id {self.manifest['pad_id']})")

    def note(self) -> str | None:
        """What still has to happen before ``serve``, if anything."""
        if self.engine_ready:
            return None
        return (f"note: the engine directory {self.engine_dir} is still empty: build it before serving "
                f"(trtllm-pipeline build -c {self.cfg.file_arg} --runtime {self.runtime}); serve refuses until then")


def deploy(cfg: BuildConfig, *, engines_dir: str | Path = "engines", runtime: str | None = None,
           force: bool = False) -> DeployResult:
    """Write (or reuse) the model repository for ``cfg`` and the runtime its engine was built for."""
    paths = artifacts.artifact_paths(Path(engines_dir).resolve(), cfg.name)
    artifacts.remove_stale_in(paths.root)
    if (shape := known_shape(cfg.model)) is not None:  # the checks quantize makes: tp against the heads, ...
        check_against_model(cfg, shape)
    engine_manifest = artifacts.read_manifest(paths.engine)
    chosen, reason = deployment_backend(cfg, engine_manifest, runtime)
    end_id, pad_id, ids_source, token_bytes = special_ids(cfg, paths.tokenizer)
    limits = request_limits(cfg, token_bytes)
    inputs = {
        "runtime": chosen.name,
        "config": {key: cfg.section(key) for key in ("build", "runtime", "serving")} | {"dtype": cfg.dtype},
        "engine": engine_manifest["inputs_hash"] if engine_manifest else None,
        "engine_dir": str(paths.engine),
        "tokenizer": {"dir": str(paths.tokenizer), "end_id": end_id, "pad_id": pad_id, "token_bytes": token_bytes},
        "models": _python_models_hash(),
        "revision": DEPLOY_REVISION,
    }
    inputs_hash = artifacts.fingerprint(inputs)
    ready = engine_manifest is not None
    if not force and (manifest := artifacts.cached_manifest(paths.triton_repo, inputs_hash)):
        log.info("deploy: cache hit for %s (%s repository, inputs unchanged)", cfg.name, chosen.name)
        return DeployResult(cfg, paths.triton_repo, chosen.name, reason, paths.engine, ready, manifest, cache_hit=True)
    with artifacts.atomic_dir(paths.triton_repo) as tmp:
        written = chosen.write_repository(cfg, tmp, engines_dir=paths.root.parent, engine_dir=paths.engine,
                                          tokenizer_dir=paths.tokenizer, end_id=end_id, pad_id=pad_id, limits=limits)
        manifest = artifacts.write_manifest(tmp, {
            **artifacts.stage_header("deploy", cfg),
            "runtime": chosen.name,
            "runtime_reason": reason,
            "tp_mode": cfg.runtime.tp_mode,  # as configured (auto resolves when the server loads the engine)
            "world_size": cfg.parallelism.tp * cfg.parallelism.pp,
            "engine_ready": ready,
            "special_ids_from": ids_source,
            **written,
            "inputs": inputs,
            "inputs_hash": inputs_hash,
            "versions": artifacts.package_versions("tritonclient", "nvidia-pytriton", "tensorrt_llm"),
        })
    log.info("deploy: wrote the %s model repository for %s in %s", chosen.name, cfg.name, paths.triton_repo)
    return DeployResult(cfg, paths.triton_repo, chosen.name, reason, paths.engine, ready, manifest, cache_hit=False)


def deployment_backend(cfg: BuildConfig, engine_manifest: dict | None, requested: str | None) -> tuple[Backend, str]:
    """The built engine's backend when there is one (a repository must serve what was built)."""
    if engine_manifest is None:
        return select_backend(cfg, requested)
    built = engine_manifest["runtime"]
    if requested in (None, "auto", built):
        return backend(built), "the runtime the engine was built for"
    raise InputError(
        f"the engine of {cfg.name} was built for the {built} runtime; a {requested} repository cannot serve it.",
        fix=f"build it for {requested} first (`trtllm-pipeline build -c {cfg.file_arg} --runtime {requested}`), "
        f"or deploy with --runtime {built}",
    )


def special_ids(cfg: BuildConfig, tokenizer_dir: Path) -> tuple[int, int, str, int]:
    """(end id, pad id, where they came from, the most bytes one token stands for): the tokenizer's,
    else the model's known EOS.

    Like TensorRT-LLM's preprocessing, a tokenizer without a pad token pads with its EOS (the
    R1-distill tokenizers name EOS as their pad token anyway).
    """
    if (tokenizer_dir / "tokenizer_config.json").is_file():
        tokenizer = artifacts.checked_tokenizer(tokenizer_dir, Tokenizer)  # as the served models load it
        end = tokenizer.eos_token_id
        return (end, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end, "tokenizer",
                longest_token_bytes(tokenizer))
    shape = known_shape(cfg.model)
    if shape is None:
        raise InputError(
            f"{tokenizer_dir} does not exist yet and the end id of {cfg.model.source} is not known here.",
            fix=f"quantize first (`trtllm-pipeline quantize -c {cfg.file_arg}`), which writes the tokenizer",
        )
    return (shape.eos_token_id, shape.eos_token_id, "model catalog (the tokenizer is written by quantize)",
            UNKNOWN_TOKEN_BYTES)


def engine_problem(cfg: BuildConfig, deployment: dict[str, Any]) -> str | None:
    """Why the deployed engine cannot be served yet, or None."""
    engine_dir = Path(deployment["engine_dir"])
    manifest = artifacts.read_manifest(engine_dir)
    if manifest is None:
        return (f"the engine directory {engine_dir} is still empty; build it with "
                f"`trtllm-pipeline build -c {cfg.file_arg} --runtime {deployment['runtime']}`")
    if manifest["inputs_hash"] != deployment["inputs"]["engine"]:
        return f"the engine in {engine_dir} changed since deploy; run `trtllm-pipeline deploy -c {cfg.file_arg}` again"
    return None


def _python_models_hash() -> str:
    """The model.py files deploy copies into the repository (the modules they import are not copied)."""
    root = repository.python_model_source("preprocessing").parent.parent
    return artifacts.fingerprint({p.relative_to(root).as_posix(): artifacts.file_sha256(p)
                                  for p in sorted(root.glob("*/model.py"))})
