"""Stage ``serve``: a real ``tritonserver`` on the build's model repository.

TensorRT-LLM: the ``tritonserver`` on PATH (NGC ``tritonserver:<yy.mm>-trtllm-python-py3``), under
``mpirun`` with one server per rank as TensorRT-LLM's launcher starts it
(``trtllm_runtime.server_launch_command``). torch runtime: the server bundled in the
``nvidia-pytriton`` wheel, given a backend directory with the Python-backend stub for this Python,
this virtualenv first on PATH (the stub finds its interpreter there) and this interpreter's
libpython (the stub would otherwise load the system's).

The server runs in its own process group; its PID, ports and log live in
``engines/<config>/serve/``, so ``serve --stop`` finds it from another shell. Startup waits for
Triton's readiness endpoint, and a server that dies or never becomes ready is reported with the
tail of its log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path
from typing import Any

from trtllm_pipeline import artifacts, doctor
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.deploy import deploy, engine_problem
from trtllm_pipeline.errors import InputError, StageFailed, UnavailableError

log = logging.getLogger(__name__)

STATE_FILE = "server.json"
STOP_FILE = "stop-requested"  # the PID `serve --stop` stopped, so a foreground `serve` exits quietly
LOG_FILE = "tritonserver.log"
EXIT_TIMEOUT_S = 15  # Triton waits this long for in-flight requests when asked to stop
NGC_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"


@dataclasses.dataclass
class Server:
    pid: int
    runtime: str
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    log: str
    command: list[str]
    process: subprocess.Popen | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def client_host(self) -> str:
        """Where a client on this machine connects (a wildcard bind address is not an address)."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    def endpoints(self) -> list[str]:
        h = self.client_host
        return [f"HTTP     http://{h}:{self.http_port}  (POST /v2/models/ensemble/generate, /generate_stream)",
                f"gRPC     {h}:{self.grpc_port}  (model ensemble, decoupled: stream API)",
                f"metrics  http://{h}:{self.metrics_port}/metrics  (Prometheus)"]

    def state(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "process"}


@dataclasses.dataclass(frozen=True)
class Ports:
    host: str
    http: int
    grpc: int
    metrics: int

    @classmethod
    def of(cls, cfg: BuildConfig, host=None, http=None, grpc=None, metrics=None) -> "Ports":
        s = cfg.serving
        ports = cls(host or s.host, http or s.http_port, grpc or s.grpc_port, metrics or s.metrics_port)
        if len({ports.http, ports.grpc, ports.metrics}) != 3:
            raise InputError(f"the HTTP, gRPC and metrics ports must differ, got {ports.http}, {ports.grpc}, "
                             f"{ports.metrics}.", fix="give each its own port")
        return ports


# --------------------------------------------------------------------------- the launch


def launch_command(cfg: BuildConfig, runtime: str, repo_dir: Path, ports: Ports,
                   state_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The server's argument list and environment for this deployment's runtime."""
    if runtime == "tensorrt_llm":
        from trtllm_pipeline.runtimes import trtllm_runtime

        binary = doctor.tritonserver_binaries()["path"] or NGC_TRITONSERVER
        cmd = trtllm_runtime.server_launch_command(cfg, repo_dir, binary, ports.http, ports.grpc, ports.metrics,
                                                   ports.host)
        return cmd, dict(os.environ)
    binary = doctor.tritonserver_binaries()["pytriton"]
    if binary is None:
        raise UnavailableError("the torch deployment is served by the tritonserver bundled in nvidia-pytriton, "
                               "which is not installed.", fix="pip install 'nvidia-pytriton==0.7.0' (Linux)")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    cmd = [binary, f"--model-repository={repo_dir}", f"--backend-directory={state_dir / 'backends'}",
           f"--http-address={ports.host}", f"--http-port={ports.http}",
           f"--grpc-address={ports.host}", f"--grpc-port={ports.grpc}",
           f"--metrics-address={ports.host}", f"--metrics-port={ports.metrics}",
           f"--exit-timeout-secs={EXIT_TIMEOUT_S}", "--pinned-memory-pool-byte-size=0"]
    if not doctor.gpus():
        cmd.append("--allow-gpu-metrics=false")
    return cmd, env


def python_backend_dir(binary: str, state_dir: Path) -> Path:
    """``backends/python/`` holding the Python backend and the stub for this Python version.

    The bundled server looks for the stub only at ``<backend-directory>/python/``, while the wheel
    keeps one stub per Python version under ``python_backend_stubs/<version>/``.
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
    for src in (root / "backends" / "python" / "libtriton_python.so",
                root / "backends" / "python" / "triton_python_backend_utils.py", stub):
        link = target / src.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(src)
    return target


def plan(cfg: BuildConfig, *, engines_dir: str | Path = "engines", **port_args) -> list[str]:
    """What ``serve`` would run, touching nothing (the runtime of the current deployment, else auto)."""
    from trtllm_pipeline.deploy import deployment_runtime

    paths = artifacts.artifact_paths(Path(engines_dir).resolve(), cfg.name)
    ports = Ports.of(cfg, **port_args)
    deployed = artifacts.read_manifest(paths.triton_repo)
    runtime, reason = ((deployed["runtime"], "deployed") if deployed else
                       deployment_runtime(cfg, artifacts.read_manifest(paths.engine), None))
    cmd, _ = launch_command(cfg, runtime, paths.triton_repo, ports, paths.serve_state)
    lines = [f"runtime: {runtime} ({reason})", f"model repository: {paths.triton_repo}"]
    if deployed and (problem := engine_problem(cfg, deployed)):
        lines.append(f"not servable yet: {problem}")
    lines += ["launch:", "  " + shlex.join(cmd)]
    server = Server(0, runtime, ports.host, ports.http, ports.grpc, ports.metrics, "", cmd)
    return lines + ["endpoints:"] + [f"  {e}" for e in server.endpoints()]


def start(cfg: BuildConfig, *, engines_dir: str | Path = "engines", **port_args) -> Server:
    """Deploy (cached), launch the server in its own process group and wait until it is ready."""
    paths = artifacts.artifact_paths(Path(engines_dir).resolve(), cfg.name)
    running = read_state(cfg, engines_dir)
    if running is not None:
        raise InputError(f"a server for {cfg.name} is already running (pid {running.pid}, HTTP port "
                         f"{running.http_port}).", fix=f"stop it first: trtllm-pipeline serve -c {_where(cfg)} --stop")
    ports = Ports.of(cfg, **port_args)
    previous = artifacts.read_manifest(paths.triton_repo)
    deployment = deploy(cfg, engines_dir=engines_dir, runtime=previous["runtime"] if previous else None)
    if problem := engine_problem(cfg, deployment.manifest):
        raise InputError(f"cannot serve {cfg.name}: {problem}.")
    check_ports_free(ports)
    state_dir = paths.serve_state
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STOP_FILE).unlink(missing_ok=True)
    cmd, env = launch_command(cfg, deployment.runtime, deployment.repo_dir, ports, state_dir)
    if deployment.runtime == "torch":
        python_backend_dir(cmd[0], state_dir)
    log_path = state_dir / LOG_FILE
    with open(log_path, "wb") as log_file:
        # A session of its own: Ctrl-C in the terminal reaches us, not the server, which we stop in order.
        process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=state_dir, start_new_session=True)
    server = Server(process.pid, deployment.runtime, ports.host, ports.http, ports.grpc, ports.metrics,
                    str(log_path), cmd, process)
    log.info("serve: started tritonserver (pid %d, %s runtime); waiting until it is ready", process.pid,
             deployment.runtime)
    try:
        artifacts.write_json_atomic(state_dir / STATE_FILE, server.state())
        wait_ready(server, timeout_s=cfg.serving.startup_timeout_s)
    except BaseException:
        stop_server(server, state_dir)
        raise
    return server


def wait_ready(server: Server, *, timeout_s: float) -> None:
    url = f"http://{server.client_host}:{server.http_port}/v2/health/ready"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(server):
            raise StageFailed(f"tritonserver exited during startup (code {_exit_code(server)}). "
                              + _failure_summary(server.log), fix=_log_fix(server))
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:  # not listening yet, or not ready (HTTP 400)
            pass
        time.sleep(0.5)
    raise StageFailed(f"tritonserver was not ready after {timeout_s:.0f} s. Log tail ({server.log}):\n"
                      f"{log_tail(server.log)}", fix="raise serving.startup_timeout_s, or see the log")


def check_ports_free(ports: Ports) -> None:
    for name, port in (("HTTP", ports.http), ("gRPC", ports.grpc), ("metrics", ports.metrics)):
        with socket.socket(socket.AF_INET6 if ":" in ports.host else socket.AF_INET) as probe:
            # As a server binds: a port left in TIME_WAIT by a stopped server is free, a listener is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((ports.host, port))
            except OSError as exc:
                flag = {"HTTP": "--http-port", "gRPC": "--grpc-port", "metrics": "--metrics-port"}[name]
                raise InputError(f"the {name} port {port} on {ports.host} is taken ({exc.strerror}).",
                                 fix=f"stop what uses it, or choose another port with {flag}") from None


def run_until_interrupted(server: Server, *, cfg: BuildConfig, engines_dir: str | Path = "engines") -> None:
    """Foreground serving: wait for Ctrl-C (or SIGTERM), then stop the server; fail if it dies first."""
    state_dir = artifacts.artifact_paths(Path(engines_dir).resolve(), cfg.name).serve_state

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    # SIGINT too: a process started in the background by a non-interactive shell (CI, nohup ... &)
    # inherits SIGINT as *ignored*, and Python then never raises KeyboardInterrupt for it.
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while _alive(server):
            time.sleep(0.5)
    except KeyboardInterrupt:
        stop_server(server, state_dir)
        return
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    stop_server(server, state_dir)  # whatever the server left behind
    if _read_text(state_dir / STOP_FILE) == str(server.pid):
        return  # `serve --stop` from another shell
    raise StageFailed(f"tritonserver exited unexpectedly (code {_exit_code(server)}). Log tail ({server.log}):\n"
                      f"{log_tail(server.log)}", fix=_log_fix(server))


# --------------------------------------------------------------------------- stopping


def read_state(cfg: BuildConfig, engines_dir: str | Path = "engines") -> Server | None:
    """The server recorded for this config if its process is still alive (a stale record is removed)."""
    path = artifacts.artifact_paths(Path(engines_dir).resolve(), cfg.name).serve_state / STATE_FILE
    try:
        server = Server(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    if not _alive(server):
        path.unlink(missing_ok=True)
        return None
    return server


def stop(cfg: BuildConfig, *, engines_dir: str | Path = "engines") -> Server | None:
    """Stop this config's server; returns it once every process of it has exited (None: none ran)."""
    server = read_state(cfg, engines_dir)
    if server is not None:
        state_dir = artifacts.artifact_paths(Path(engines_dir).resolve(), cfg.name).serve_state
        (state_dir / STOP_FILE).write_text(str(server.pid))
        stop_server(server, state_dir)
    return server


def stop_server(server: Server, state_dir: Path) -> None:
    """SIGTERM (Triton unloads its models and exits), then SIGKILL for whatever is left of the group."""
    if _alive(server):
        _signal(server.pid, signal.SIGTERM, group=False)  # mpirun forwards it to every rank
        _wait_gone(server, EXIT_TIMEOUT_S + 15)
    if group_alive(server.pid):
        _signal(server.pid, signal.SIGTERM, group=True)
        if not _wait_for(lambda: not group_alive(server.pid), 5):
            _signal(server.pid, signal.SIGKILL, group=True)
            _wait_for(lambda: not group_alive(server.pid), 5)
    (state_dir / STATE_FILE).unlink(missing_ok=True)


def _signal(pid: int, sig: int, *, group: bool) -> None:
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(server: Server, timeout_s: float) -> None:
    if not _wait_for(lambda: not _alive(server), timeout_s):
        log.warning("serve: tritonserver (pid %d) ignored SIGTERM for %.0f s; killing it", server.pid, timeout_s)
        _signal(server.pid, signal.SIGKILL, group=True)
        _wait_for(lambda: not _alive(server), 10)


def _wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def _alive(server: Server) -> bool:
    if server.process is not None:
        return server.process.poll() is None
    try:
        # Reap it if it is our child (a server started by this process, then found via its state file).
        if os.waitpid(server.pid, os.WNOHANG)[0] == server.pid:
            return False
    except ChildProcessError:
        pass
    return artifacts.pid_alive(server.pid) and not _is_zombie(server.pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def group_alive(pgid: int) -> bool:
    """Whether any process of the server's group (ranks, Python-backend stubs) is left, zombies aside."""
    return any(_pgid(p) == pgid and not _is_zombie(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit())


def _pgid(proc: Path) -> int | None:
    try:
        return int(proc.joinpath("stat").read_text().split(") ", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def _exit_code(server: Server) -> str:
    return str(server.process.returncode) if server.process is not None else "unknown"


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def log_tail(path: str | Path, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    # Triton's CPU-only noise about CUDA drivers says nothing about why a model failed.
    useful = [line for line in text if "CUDA driver" not in line and "CudaDriverHelper" not in line]
    return "\n".join(useful[-lines:])


def _failure_summary(path: str | Path) -> str:
    """Triton's own words for each model that failed to load, else the log's tail."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    failures = dict(re.findall(r"failed to load '([^']+)' version \d+: (.*?)(?:\\n|\"$)", text, re.MULTILINE))
    if failures:
        return "".join(f"\n  {model}: {why}" for model, why in failures.items()) + f"\n(log: {path})"
    return f"Log tail ({path}):\n{log_tail(path)}"


def _log_fix(server: Server) -> str:
    text = log_tail(server.log, 200)
    if "address already in use" in text.lower():
        return "a port is taken: choose others with --http-port/--grpc-port/--metrics-port"
    return f"see {server.log} for the first error"


def _where(cfg: BuildConfig) -> str:
    return str(cfg.path or f"build_configs/{cfg.name}.yaml")
