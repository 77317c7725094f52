"""Artifact directories: atomic writes, manifests, content hashes and the stage cache.

Every stage writes a directory under ``engines/<config-name>/`` and puts ``manifest.json`` in it
last. A directory without a manifest is never complete; it is built under a temporary name and
renamed into place, so an interrupted run leaves nothing a later stage could mistake for output.
A stage is a cache hit when the manifest's ``inputs_hash`` equals the hash of its current inputs
and every output file it lists still holds what was written (``changed_outputs``).
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
from typing import TYPE_CHECKING, Any, Callable, Iterator

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


TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def checked_tokenizer(directory: str | os.PathLike, load: Callable[[str], Any]) -> Any:
    """``load(directory)`` (the tokenizer loader in use), after checking its JSON files; InputError (exit 2)
    naming the file that is empty, not JSON or does not load, instead of the loader's internal error."""
    directory = Path(directory)
    for name in TOKENIZER_JSON:
        path = directory / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_bytes())
        except (ValueError, UnicodeDecodeError) as exc:
            raise InputError(f"{path} is damaged: {'it is empty' if path.stat().st_size == 0 else f'not JSON ({exc})'}.",
                             fix="export the tokenizer again: re-run quantize with --force") from None
        except OSError as exc:
            raise InputError(f"{path} cannot be read ({exc.strerror}).") from None
        if not isinstance(data, dict):
            raise InputError(f"{path} is damaged: a JSON {type(data).__name__}, not a tokenizer's object.",
                             fix="export the tokenizer again: re-run quantize with --force")
    try:
        return load(str(directory))
    except Exception as exc:  # the loader's own words, with the directory it could not load
        raise InputError(f"the tokenizer in {directory} does not load: {type(exc).__name__}: {str(exc)[:300]}",
                         fix="export the tokenizer again: re-run quantize with --force") from None


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


def safetensors_digests(path: Path) -> tuple[str, dict[str, str]]:
    """The file's sha256 and each tensor's (its bytes), read once: a changed file can then be reported with
    the tensors that changed. A file that is not a well-formed safetensors file gets the file's hash only."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        head = f.read(8)
        digest.update(head)
        size = int.from_bytes(head, "little") if len(head) == 8 else -1
        header = f.read(size) if 0 <= size <= 100 * 2**20 else b""
        digest.update(header)
        try:
            entries = json.loads(header) if header else {}
            spans = sorted((int(v["data_offsets"][0]), int(v["data_offsets"][1]), k) for k, v in entries.items()
                           if k != "__metadata__")
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            spans = []
        tensors, at = {}, 0
        for start, end, name in spans:
            if start != at or end < start:  # not laid out end to end: hash the rest as the file's only
                break
            part = hashlib.sha256()
            remaining = end - start
            while remaining > 0:
                chunk = f.read(min(1 << 22, remaining))
                if not chunk:
                    break
                part.update(chunk)
                digest.update(chunk)
                remaining -= len(chunk)
            tensors[name], at = part.hexdigest(), end
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest(), tensors


def _stat_key(st: os.stat_result) -> dict[str, int]:
    """What the cache compares instead of reading a file again. ctime and inode too: a same-size overwrite with
    its mtime put back (touch -d) still moves ctime, which no unprivileged process can set."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def _file_record(path: Path, st: os.stat_result) -> dict[str, Any]:
    if path.suffix == ".safetensors":
        sha, tensors = safetensors_digests(path)
        return {**_stat_key(st), "sha256": sha, "tensors": tensors}
    return {**_stat_key(st), "sha256": file_sha256(path)}


def _unchanged(st: os.stat_result, record: dict[str, Any]) -> bool:
    """The stat is as recorded (a record written before ctime and inode were kept compares size and mtime)."""
    return all(record.get(key, value) == value for key, value in _stat_key(st).items()) and "mtime_ns" in record


def hash_tree(
    root: Path, *, previous: dict[str, dict] | None = None, skip: tuple[str, ...] = (MANIFEST,)
) -> dict[str, dict]:
    """``{relative path: {size, mtime_ns, ctime_ns, ino, sha256[, tensors]}}`` for every file below ``root``.

    A file whose size, mtime, ctime and inode match ``previous`` keeps its recorded hash instead of being
    read again: re-hashing 15 GB of weights on every cache check would turn a cache hit into minutes.
    """
    previous = previous or {}
    records: dict[str, dict] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if rel in skip or any(part.startswith(".") for part in Path(rel).parts):
            continue
        st = path.stat()
        old = previous.get(rel)
        records[rel] = dict(old) if old and _unchanged(st, old) and "sha256" in old else _file_record(path, st)
    return records


def changed_outputs(directory: Path, manifest: dict[str, Any]) -> dict[str, str]:
    """``{relative path: what changed}`` for the files the manifest lists whose contents are not what was written.

    A file whose size, mtime, ctime and inode are as recorded is taken as unchanged (a stat, no read); any
    other is read and its sha256 compared (about 1.5 GB/s on one core: a 15 GB checkpoint copied elsewhere
    costs some 10 s once per check). So a same-size overwrite is caught even with its mtime restored.
    """
    changed = {}
    for rel, record in (manifest.get("outputs") or {}).items():
        path = Path(directory) / rel
        try:
            st = path.stat()
        except OSError:
            changed[rel] = "missing"
            continue
        if st.st_size != record.get("size"):
            changed[rel] = f"{st.st_size} bytes, written as {record.get('size')}"
        elif problem := content_change_if_touched(path, record, st):
            changed[rel] = problem
    return changed


def content_change_if_touched(path: Path, record: dict[str, Any], st: os.stat_result | None = None) -> str | None:
    """``content_change`` for a file whose stat is not the recorded one; None, unread, for one whose stat is."""
    return None if _unchanged(st or path.stat(), record) else content_change(path, record)


def content_change(path: Path, record: dict[str, Any]) -> str | None:
    """How ``path``'s bytes differ from ``record`` (naming the tensors of a safetensors file), or None."""
    if "tensors" in record:
        sha, tensors = safetensors_digests(path)
        if sha == record.get("sha256"):
            return None
        differ = sorted(name for name, digest in record["tensors"].items() if tensors.get(name) != digest)
        shown = ", ".join(differ[:5]) + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")
        return f"tensor {shown} changed" if differ else "its header changed"
    if record.get("sha256") is None or file_sha256(path) == record["sha256"]:
        return None
    return "its contents changed (same size)"


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


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds), from /proc; None where that cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def remove_stale_temporaries(parent: Path) -> None:
    """Delete temporary files and directories left behind by runs that were killed: their process is
    gone, or its PID now belongs to a process that started after the temporary was last written."""
    if not parent.is_dir():
        return
    for entry in parent.iterdir():
        name = entry.name
        if not name.startswith(".") or _TMP_MARK not in name:
            continue
        try:
            pid = int(name.rsplit(_TMP_MARK, 1)[1].split("-")[0])
            written = entry.lstat().st_mtime
        except (ValueError, OSError):
            continue
        started = process_start_time(pid) if pid_alive(pid) else None
        if not pid_alive(pid) or (started is not None and started > written + 2):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


def remove_stale_in(root: Path) -> None:
    """Stale temporaries of killed runs in a build's directory and its stages' directories (a stage
    calls this when it starts, so a killed run's leftovers go on the next run, cache hit or not)."""
    root = Path(root)
    if root.is_dir():
        remove_stale_temporaries(root)
        for child in root.iterdir():
            if child.is_dir() and not child.name.startswith("."):
                remove_stale_temporaries(child)


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


def check_room(directory: Path, need_bytes: int, what: str) -> None:
    """InputError (exit 2), before any work, when ``directory`` cannot be written or holds less free space
    than ``need_bytes``: a stage that would fail at its end after minutes of work says so at once."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe{_TMP_MARK}{os.getpid()}"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as exc:
        raise InputError(f"{directory} is not writable ({exc.strerror}); {what} writes there.",
                         fix="choose another --engines-dir, or make this one writable") from None
    free = shutil.disk_usage(directory).free
    if free < need_bytes:
        raise InputError(f"{directory} has {free / 2**20:.1f} MiB free; {what} needs about {need_bytes / 2**20:.1f} MiB.",
                         fix="free space there, or choose another --engines-dir") from None


def remove_bytecode(root: Path) -> None:
    """Remove every ``__pycache__`` below ``root`` (Python compiles the sources again)."""
    for cache in sorted(Path(root).rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache, ignore_errors=True)


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
    """Every file the manifest lists holds what was written (``changed_outputs``: a stat each, a re-hash only
    of a file whose stat changed)."""
    return not changed_outputs(directory, manifest)


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
                         fix=f"run `trtllm-pipeline build -c {cfg.file_arg}` first")
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
