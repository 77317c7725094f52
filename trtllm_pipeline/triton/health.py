"""Whether a served engine can still run: a marker the engine model writes when it cannot, read by the fronts.

Triton 2.51 has no way for a Python model to say it is no longer ready: its ``/v2/health/ready`` and
model ready endpoints stay 200 after a tensor-parallel worker of the torch runtime died, although no
request can run any more. So the engine model writes ``engine-lost.json`` (why, and the fix) into the
deployment's serve directory when its runtime is lost (``Runtime.unavailable``), and the HTTP front,
the OpenAI front and the BLS read it: readiness endpoints answer 503, new requests 503, and a BLS
request waiting on the engine ends with the error instead of waiting for responses that will not come.
``serve`` removes the marker before it starts a server.

A crash cannot write anything: the engine model's process (the Python-backend stub) dies, Triton 2.51 still
reports the model ready, and every request waiting on it waits for ever (seen on the H200: a segmentation
fault inside the stub's ``send``). So the engine model also records its process id once it is loaded
(``mark_alive``), and ``lost`` reports the engine lost when that process is gone. The deployment's other Python
models (the BLS, preprocessing, postprocessing: each instance a stub process) record theirs too (``mark_stub``): a dead
front model serves nothing either (Triton 2.51 answers its later requests "Stub process ... is not healthy", keeps it
ready, and leaves its streams in flight waiting; seen on this project's CPU machine when the BLS's stub crashed).

A hung stub is lost as surely as a dead one, and Triton 2.51 says nothing of it either. Its Python backend can deadlock
a BLS that reads a decoupled model's responses through Triton (TensorRT-LLM's engine model, or
``TRTLLM_PIPELINE_BLS_DIRECT=0``): docs/serving.md has the three threads. So each recorded stub's file is also its
heartbeat, touched every ``HEARTBEAT_S`` by a thread of the stub that needs the GIL to run, and ``lost`` reports a
model whose file is older than ``HUNG_S``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from trtllm_pipeline import artifacts

log = logging.getLogger(__name__)

MARKER = "engine-lost.json"
ALIVE = "engine-process.json"
STUBS = "stubs"  # a folder: one empty file <model>.<pid> per Python model instance's process, touched as it lives
HEARTBEAT_S = 1.0  # how often a recorded stub touches its file (a Python thread: it runs only while the GIL moves)
# A stub whose file is older than this is hung. Far above the longest a stub of this project holds the GIL for one
# call (a 570 KB prompt's tokenizing, 0.35 s on this project's CPU machine), below a client's usual 30 s timeout.
HUNG_S = 15.0


def marker(repository: str | os.PathLike, name: str = MARKER) -> Path:
    """The marker of the model repository at ``repository`` (in its build's serve directory)."""
    return artifacts.ArtifactPaths(Path(repository).resolve().parent).serve_state / name


def mark_alive(repository: str | os.PathLike) -> None:
    """Record this process as the engine's (called by the engine model once its runtime is loaded)."""
    path = marker(repository, ALIVE)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        artifacts.write_json_atomic(path, {"pid": os.getpid()})
    except OSError as exc:
        log.error("cannot write %s (%s): a crash of the engine's process will not show", path, exc)


def mark_stub(repository: str | os.PathLike, model: str) -> None:
    """Record this process as an instance of ``model`` (called by each Python model of the deployment once loaded), and
    keep its record fresh while this process runs Python: its crash and its hang then show (``lost``)."""
    path = marker(repository, STUBS) / f"{model}.{os.getpid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as exc:
        log.error("cannot write %s (%s): a crash of the %s model's process will not show", path, exc, model)
        return
    threading.Thread(target=_heartbeat, args=(path,), name=f"{model}-heartbeat", daemon=True).start()


def _heartbeat(path: Path) -> None:
    """Touch ``path`` every ``HEARTBEAT_S`` until it is gone (a later server's ``clear``)."""
    while True:
        time.sleep(HEARTBEAT_S)
        try:
            os.utime(path)
        except FileNotFoundError:
            return
        except OSError as exc:  # the record is kept; only its age stops telling
            log.error("cannot touch %s (%s): a hang of this process will show as one", path, exc)
            return


def mark_lost(repository: str | os.PathLike, message: str) -> None:
    """Record that the engine cannot run (best effort: a full disk must not hide the error it reports)."""
    path = marker(repository)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        artifacts.write_json_atomic(path, {"pid": os.getpid(), "message": message})
    except OSError as exc:
        log.error("cannot write %s (%s): readiness will not show that the engine is lost", path, exc)


def lost(repository: str | os.PathLike) -> str | None:
    """Why the engine served from ``repository`` cannot run, or None while it can (one stat while it can)."""
    try:
        data = json.loads(marker(repository).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return _process_gone(repository) or _stub_lost(repository)
    except (OSError, ValueError):
        return "the engine model reported itself lost (its marker is unreadable)"
    message = data.get("message") if isinstance(data, dict) else None
    return message if isinstance(message, str) and message else "the engine model reported itself lost"


def _process_gone(repository: str | os.PathLike) -> str | None:
    try:
        pid = int(json.loads(marker(repository, ALIVE).read_text(encoding="utf-8"))["pid"])
    except (OSError, ValueError, KeyError, TypeError):  # not loaded yet, or not the torch engine model
        return None
    if _running(pid):
        return None
    log_file = marker(repository, ALIVE).parent / "tritonserver.log"
    return (f"the engine model's process (pid {pid}) is gone: it crashed (its stack, if it left one, is in "
            f"{log_file}); restart the server: serve --stop, then serve")


def _stub_lost(repository: str | os.PathLike) -> str | None:
    """Why a recorded Python model's process cannot serve: it is gone, or hung (its record older than ``HUNG_S``)."""
    folder = marker(repository, STUBS)
    try:
        names = os.listdir(folder)
    except OSError:  # none recorded (not loaded yet, or a repository deployed before this record)
        return None
    restart = "restart the server: serve --stop, then serve"
    for name in names:
        model, _, pid = name.rpartition(".")
        if not (model and pid.isdigit()):
            continue
        if not _running(int(pid)):
            return (f"the {model} model's process (pid {pid}) is gone: it crashed (its stack, if it left one, is in "
                    f"{folder.parent / 'tritonserver.log'}); {restart}")
        try:
            age = time.time() - (folder / name).stat().st_mtime
        except FileNotFoundError:  # cleared meanwhile
            continue
        if age > HUNG_S:
            return (f"the {model} model's process (pid {pid}) has run no Python for {age:.0f} s: it is hung (Triton "
                    f"2.51's Python backend can deadlock a BLS reading its engine through Triton; docs/serving.md); "
                    f"{restart}")
    return None


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: a process that died and was not reaped yet (a zombie) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def clear(repository: str | os.PathLike, *, stubs: bool = True) -> None:
    """Forget an earlier server's records (its processes' ids may since belong to others). ``stubs=False`` (the engine
    model, loading beside the others): the other models' records stay."""
    for name in (MARKER, ALIVE):
        try:
            marker(repository, name).unlink(missing_ok=True)
        except OSError as exc:  # a read-only engines directory: then nothing could have written it either
            log.warning("cannot remove %s: %s", marker(repository, name), exc)
    if stubs:
        shutil.rmtree(marker(repository, STUBS), ignore_errors=True)
