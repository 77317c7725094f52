"""Starting the tensor-parallel workers, and tying their lives to the leader's.

A worker is ``python -m trtllm_pipeline.runtimes.torch_engine.tp.worker`` with an argument list (no shell), with
the leader's module search path (``PYTHONPATH``: the Triton stub that runs the leader ignores it, its
own path is set in code) and its output in a log file the leader quotes when the worker dies.

A worker dies with its leader twice over: ``PR_SET_PDEATHSIG`` (SIGKILL when the leader's thread
that started it ends; that thread is the executor's monitor, which lives as long as the group), and
its stdin, a pipe from the leader that nothing is ever written to: end of file means the leader is
gone, however it went. The rendezvous is a TCPStore on a socket bound to 127.0.0.1, port chosen by
the OS, and gloo binds to 127.0.0.1 too (``comm``): nothing listens beyond this machine.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

PR_SET_PDEATHSIG = 1


def python_executable() -> str:
    """This interpreter; inside Triton's Python stub, ``sys.executable`` may name the stub instead."""
    if Path(sys.executable).name.startswith("python") and os.access(sys.executable, os.X_OK):
        return sys.executable
    for candidate in (Path(sys.prefix) / "bin" / "python3", Path(sys.prefix) / "bin" / "python"):
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("python3") or "python3"


def listening_socket() -> socket.socket:
    """A socket on 127.0.0.1 at a port the OS picks, listening: the TCPStore serves on it (no race for the port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def spawn(argv: list[str], log_path: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    with open(log_path, "wb") as log:
        return subprocess.Popen([python_executable(), "-m", "trtllm_pipeline.runtimes.torch_engine.tp.worker", *argv],
                                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, close_fds=True)


def die_with_leader(leader_pid: int) -> None:
    """In a worker: be killed when the leader goes (PR_SET_PDEATHSIG on Linux, and end of file on stdin)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != leader_pid:  # the leader went before the signal was armed
        os._exit(3)

    def lifeline() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        os._exit(4)

    threading.Thread(target=lifeline, name="tp-lifeline", daemon=True).start()


def stopped(pid: int) -> bool:
    """Whether a process is stopped (state T: SIGSTOP; t: traced), from /proc on Linux."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def exit_description(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])
