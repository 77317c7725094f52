"""Resolve a config's ``model.source`` to a local HF model directory.

Four kinds of source, all ending as an ordinary HF directory that later stages treat alike:
a hub id (downloaded with huggingface_hub into HF_HOME's cache, honouring HF_HUB_OFFLINE),
a local directory, ``gguf:PATH`` (converted once into the cache, see ``model.gguf``), or
``builtin:<name>`` (generated or converted here, see ``model.builtin``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_pipeline.errors import ConfigError, InputError, UnavailableError
from trtllm_pipeline.model import builtin, families, gguf
from trtllm_pipeline.model.catalog import KNOWN_MODELS, ModelShape

if TYPE_CHECKING:
    from trtllm_pipeline.config import ModelSection

log = logging.getLogger(__name__)

# What a causal-LM checkpoint needs; never *.bin (pickle) nor *.py (remote code).
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
# Where transformers looks for safetensors weights (from_pretrained(..., use_safetensors=True)).
SAFETENSORS_WEIGHTS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
# A download above this many bytes is said first and needs consent (a 7B checkpoint is 15 GB).
ASK_ABOVE_BYTES = 2 * 10**9
# 1: download without asking (what --allow-download sets); 0: refuse without asking (make's default);
# unset: ask on a terminal, refuse elsewhere.
ALLOW_DOWNLOAD_ENV = "TRTLLM_PIPELINE_ALLOW_DOWNLOAD"


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    source: str
    kind: str  # "hub" | "local" | "builtin" | "gguf"
    model_dir: Path
    revision: str | None = None

    @property
    def shape(self) -> ModelShape:
        return ModelShape.from_model_dir(self.model_dir)

    @property
    def family(self) -> families.ModelFamily:
        """The model's family (``model.families``); refuses an architecture or rope scaling the runtime lacks."""
        return families.check(json.loads((self.model_dir / "config.json").read_text()),
                              where=f"model {self.source}")


def resolve_model(model: "ModelSection") -> ResolvedModel:
    """Return the model's directory, downloading or generating it when needed."""
    if model.is_builtin:
        name = model.source.removeprefix(builtin.BUILTIN_PREFIX)
        if name not in builtin.BUILTIN_MODELS:
            raise ConfigError(
                f"model.source: unknown built-in model {model.source!r}.",
                fix=f"use one of {', '.join('builtin:' + n for n in builtin.BUILTIN_MODELS)}",
            )
        return ResolvedModel(model.source, "builtin", builtin.builtin_model_dir(name))
    if model.is_gguf:
        path = Path(os.path.expanduser(model.source.removeprefix(gguf.GGUF_PREFIX)))
        return ResolvedModel(model.source, "gguf", gguf.converted_dir(path, builtin.cache_root() / "models"))
    if model.is_local:
        path = Path(os.path.expanduser(model.source)).resolve()
        _check_local_dir(path)
        return ResolvedModel(model.source, "local", path)
    return ResolvedModel(model.source, "hub", _download(model.source, model.revision), model.revision)


def known_shape(model: "ModelSection") -> ModelShape | None:
    """The model's architecture without downloading anything, when it can be known."""
    if model.is_builtin:
        name = model.source.removeprefix(builtin.BUILTIN_PREFIX)
        return builtin.builtin_shape(name) if name in builtin.BUILTIN_MODELS else None
    if model.is_gguf:
        return None  # known once converted (resolve_model)
    if model.is_local:
        path = Path(os.path.expanduser(model.source))
        return ModelShape.from_model_dir(path) if (path / "config.json").is_file() else None
    cached = _cached_snapshot(model.source, model.revision)
    if cached is not None:
        return ModelShape.from_model_dir(cached)
    return KNOWN_MODELS.get(model.source)


def fetch_needed(model: "ModelSection") -> str | None:
    """What resolving the model would first do on this machine: ``download`` (hub, not cached), ``generate``
    (a built-in not generated yet), or None (already here: a cached snapshot, a local directory)."""
    if model.is_builtin:
        name = model.source.removeprefix(builtin.BUILTIN_PREFIX)
        known = name in builtin.BUILTIN_MODELS
        return "generate" if known and not (builtin.builtin_model_path(name) / "config.json").is_file() else None
    if model.is_local:
        return None
    return "download" if _cached_snapshot(model.source, model.revision) is None else None


def _check_local_dir(path: Path) -> None:
    """An HF model directory whose weights are safetensors, the only weights ever loaded: its
    model.safetensors, or the shards its model.safetensors.index.json names. Pickled weights beside
    them are ignored (and said so); a directory with only pickles is refused."""
    if not path.is_dir():
        raise InputError(f"model.source: {path} is not a directory.", fix="point it at an HF model directory")
    if not (path / "config.json").is_file():
        raise InputError(f"model.source: {path} has no config.json; it is not an HF model directory.",
                         fix="point it at the directory holding config.json and *.safetensors")
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    fix = "convert the weights to safetensors, e.g. save_pretrained(..., safe_serialization=True)"
    index = path / SAFETENSORS_INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise InputError(f"model.source: {index} is not a safetensors index (a JSON weight_map).", fix=fix) from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise InputError(f"model.source: {path} lacks the safetensors shards {missing[:3]} its index names.",
                             fix="copy the whole model directory") from None
    elif not (path / SAFETENSORS_WEIGHTS).is_file():
        others = sorted(p.name for p in path.glob("*.safetensors"))
        found = [f"its *.safetensors ({', '.join(others[:3])}) are not the model's weights"] if others else []
        if pickles:
            found.append(f"it has only pickled weights ({', '.join(pickles[:3])}), which are never loaded")
        found = "; ".join(found) or "it has no weights"
        raise InputError(f"model.source: {path} has no {SAFETENSORS_WEIGHTS} nor {SAFETENSORS_INDEX}: {found}.", fix=fix)
    if pickles:
        log.warning("model.source: ignoring pickled files in %s (%s): only safetensors weights are loaded",
                    path, ", ".join(pickles))


def _cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except Exception:  # not cached (or the id is malformed): there is simply no local copy
        return None


def _download(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    cached = _cached_snapshot(repo_id, revision)
    if cached is not None:
        return cached
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise UnavailableError(
            f"model.source: {repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set.",
            fix=f"download it where the hub is reachable (`hf download {shlex.quote(repo_id)}`) with the same HF_HOME, "
            "or set model.source to a local model directory",
        )
    _consent_to_download(repo_id, revision)
    log.info("downloading %s from the Hugging Face hub into %s", repo_id, _hf_home())
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS))
    except GatedRepoError:
        raise UnavailableError(f"model.source: {repo_id} is gated on the hub.",
                               fix="accept its licence on huggingface.co and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise InputError(f"model.source: {repo_id} does not exist on the hub (or is private).",
                         fix="check the id, or set HF_TOKEN for a private model") from None
    except RevisionNotFoundError:
        raise InputError(f"model.revision: {revision!r} does not exist for {repo_id}.",
                         fix="use an existing branch, tag or commit") from None
    except Exception as exc:
        raise UnavailableError(
            f"model.source: cannot download {repo_id} from the Hugging Face hub "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}).",
            fix="check network access to huggingface.co (or HF_ENDPOINT), or copy the model here and set "
            "model.source to its directory, or pre-fill HF_HOME and set HF_HUB_OFFLINE=1",
        ) from None


def _consent_to_download(repo_id: str, revision: str | None) -> None:
    """Say how much a large download is and where it goes; go on only with consent (flag, env or a yes)."""
    size = download_size(repo_id, revision)
    if size is None or size <= ASK_ABOVE_BYTES:  # None: the hub did not answer, so the download cannot start either
        return
    from huggingface_hub import constants

    cache = Path(constants.HF_HUB_CACHE)
    existing = next((p for p in (cache, *cache.parents) if p.exists()), None)
    free = f", {shutil.disk_usage(existing).free / 1e9:.0f} GB free there" if existing else ""
    message = (f"model.source: {repo_id} is not in the local Hugging Face cache; fetching it downloads about "
               f"{size / 1e9:.1f} GB into {cache}{free}.")
    setting = os.environ.get(ALLOW_DOWNLOAD_ENV, "").strip().lower()
    if setting in ("1", "true", "yes"):
        log.warning("%s (%s=1)", message, ALLOW_DOWNLOAD_ENV)
        return
    if setting == "" and sys.stdin.isatty() and sys.stderr.isatty():
        print(message, file=sys.stderr)
        if input("Download it? [y/N] ").strip().lower() in ("y", "yes"):
            return
    raise InputError(
        f"{message} Not started: a download this large needs consent.",
        fix=f"pass --allow-download (`trtllm-pipeline --allow-download <stage> ...`; make: ALLOW_DOWNLOAD=1; or set "
        f"{ALLOW_DOWNLOAD_ENV}=1), or run the built-in tiny model instead (make: MODEL=tiny-qwen2; "
        "model.source: builtin:tiny-qwen2), which is what runs on a machine without a GPU",
    )


def download_size(repo_id: str, revision: str | None) -> int | None:
    """Bytes a download of ``repo_id`` fetches: the catalog's weights (bf16, as published) offline, else the
    hub's file sizes for the patterns fetched; None when neither says."""
    shape = KNOWN_MODELS.get(repo_id)
    if shape is not None:
        return shape.num_params * 2
    try:
        from huggingface_hub import HfApi

        files = HfApi().model_info(repo_id, revision=revision, files_metadata=True).siblings or []
    except Exception:  # unreachable hub or unknown id: the download itself reports it
        return None
    return sum(f.size or 0 for f in files if any(fnmatch.fnmatch(f.rfilename, p) for p in HUB_PATTERNS))


def _hf_home() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HOME)
