"""Artifact directories: atomic writes, manifests, content hashes and the stage cache.

Every stage writes a directory under ``engines/<config-name>/`` and puts ``manifest.json`` in it
last. A directory without a manifest is never complete; it is built under a temporary name and
renamed into place, so an interrupted run leaves nothing a later stage could mistake for output.
A stage is a cache hit when the manifest's ``inputs_hash`` equals the hash of its current inputs
and every output file it lists is still there with its recorded size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from trtllm_pipeline.errors import InputError
from trtllm_pipeline.machine import package_version

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
_TMP_MARK = ".tmp-"


@dataclasses.dataclass(frozen=True)
class ArtifactPaths:
    """Where each stage of one build config writes, under ``<engines_dir>/<config-name>/``."""

    root: Path

    @property
    def checkpoint(self) -> Path:  # TensorRT-LLM checkpoint: config.json + rank{i}.safetensors
        return self.root / "checkpoint"

    @property
    def hf_checkpoint(self) -> Path:  # ModelOpt unified HF checkpoint (quantized formats only)
        return self.root / "hf_checkpoint"

    @property
    def tokenizer(self) -> Path:  # the build's tokenizer, exported with its checkpoint
        return checkpoint_tokenizer(self.checkpoint)

    @property
    def engine(self) -> Path:
        return self.root / "engine"

    @property
    def eval(self) -> Path:
        return self.root / "eval"

    def eval_results(self, task: str) -> Path:  # what `eval` writes and `gate` and `report` read
        return self.eval / f"{task}.json"

    @property
    def triton_repo(self) -> Path:
        return self.root / "triton_model_repo"

    @property
    def bench(self) -> Path:
        return self.root / "bench"

    @property
    def serve_state(self) -> Path:  # pid file and server log of `serve --detach`
        return self.root / "serve"


def artifact_paths(engines_dir: str | os.PathLike, config_name: str) -> ArtifactPaths:
    return ArtifactPaths(Path(engines_dir) / config_name)


def checkpoint_tokenizer(checkpoint_dir: Path) -> Path:
    """Where a checkpoint keeps the tokenizer it was exported with."""
    return Path(checkpoint_dir) / "tokenizer"


# --------------------------------------------------------------------------- hashing


def fingerprint(obj: Any) -> str:
    """sha256 of a JSON-serialisable object in canonical form (sorted keys, no whitespace)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def hash_tree(
    root: Path, *, previous: dict[str, dict] | None = None, skip: tuple[str, ...] = (MANIFEST,)
) -> dict[str, dict]:
    """``{relative path: {size, mtime_ns, sha256}}`` for every file below ``root``.

    A file whose size and mtime match ``previous`` keeps its recorded hash instead of being read
    again: re-hashing 15 GB of weights on every cache check would turn a cache hit into minutes.
    """
    previous = previous or {}
    records: dict[str, dict] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if rel in skip or any(part.startswith(".") for part in Path(rel).parts):
            continue
        st = path.stat()
        old = previous.get(rel)
        if old and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns:
            sha = old["sha256"]
        else:
            sha = file_sha256(path)
        records[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
    return records


def content_hash(records: dict[str, dict]) -> str:
    """Hash of a tree's contents (names and sha256s), independent of timestamps."""
    return fingerprint({rel: rec["sha256"] for rel, rec in records.items()})


# --------------------------------------------------------------------------- atomic writes


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A temporary name beside ``path`` to write to; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, obj: Any) -> None:
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(parent: Path) -> None:
    """Delete temporary directories left behind by runs whose process is gone."""
    if not parent.is_dir():
        return
    for entry in parent.iterdir():
        name = entry.name
        if not name.startswith(".") or _TMP_MARK not in name:
            continue
        try:
            pid = int(name.rsplit(_TMP_MARK, 1)[1].split("-")[0])
        except ValueError:
            continue
        if not pid_alive(pid):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield an empty temporary directory that replaces ``final`` only if the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final.parent)
    tmp = final.parent / f".{final.name}{_TMP_MARK}{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, final)


def replace_dir(src: Path, final: Path) -> None:
    """Move ``src`` to ``final``, replacing an existing directory with two renames."""
    if final.exists() or final.is_symlink():
        old = final.parent / f".{final.name}{_TMP_MARK}{os.getpid()}-old-{time.monotonic_ns()}"
        os.rename(final, old)
        os.rename(src, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(src, final)


# --------------------------------------------------------------------------- manifests


def package_versions(*names: str) -> dict[str, str | None]:
    return {"python": platform.python_version(),
            **{name: package_version(name) for name in ("trtllm-pipeline", *names)}}


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def stage_header(stage: str, cfg: "BuildConfig") -> dict[str, Any]:
    """The first fields of a stage's manifest: which stage wrote it, for which config."""
    return {"stage": stage, "config": {"name": cfg.name, "path": str(cfg.path) if cfg.path else None}}


def write_manifest(directory: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Hash the directory's files and write ``manifest.json``; call this last."""
    manifest = {"schema": MANIFEST_SCHEMA, **manifest}
    manifest.setdefault("created_at", now_iso())
    manifest["outputs"] = hash_tree(directory)
    write_json_atomic(directory / MANIFEST, manifest)
    return manifest


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a complete artifact directory, or None (missing, unreadable, foreign)."""
    try:
        data = json.loads((Path(directory) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        return None
    return data


def outputs_intact(directory: Path, manifest: dict[str, Any]) -> bool:
    """Every file the manifest lists exists with its recorded size (cheap; no re-hash)."""
    for rel, rec in (manifest.get("outputs") or {}).items():
        path = Path(directory) / rel
        try:
            if path.stat().st_size != rec.get("size"):
                return False
        except OSError:
            return False
    return True


def cached_manifest(directory: Path, inputs_hash: str) -> dict[str, Any] | None:
    """The manifest if ``directory`` holds complete output for exactly these inputs."""
    manifest = read_manifest(directory)
    if manifest and manifest.get("inputs_hash") == inputs_hash and outputs_intact(directory, manifest):
        return manifest
    return None


def engine_manifest(engines_dir: str | os.PathLike, cfg: "BuildConfig") -> dict[str, Any]:
    """The build manifest of ``cfg``'s engine; InputError, with the build command as the fix, when none is built."""
    directory = artifact_paths(engines_dir, cfg.name).engine
    manifest = read_manifest(directory)
    if manifest is None:
        raise InputError(f"{directory} holds no built engine for {cfg.name}.",
                         fix=f"run `trtllm-pipeline build -c {cfg.file}` first")
    return manifest


class Stopwatch:
    """Named wall-clock timings for a manifest's ``timings`` section."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def time(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = round(time.perf_counter() - start, 3)
