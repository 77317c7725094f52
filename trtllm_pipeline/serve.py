"""Stage ``serve``: a real ``tritonserver`` on the build's model repository.

The deployment's backend says how the server is launched (``Backend.server_command``):
TensorRT-LLM's is the ``tritonserver`` on PATH under ``mpirun``, one server per rank; the torch
runtime's is the server bundled in the ``nvidia-pytriton`` wheel.

The server runs in its own process group; its PID, ports and log live in
``engines/<config>/serve/`` (``endpoints``), so ``serve --stop`` finds it from another shell.
Startup waits for Triton's readiness endpoint, and a server that dies or never becomes ready is
reported with the tail of its log.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from trtllm_pipeline import artifacts
from trtllm_pipeline.config import BuildConfig, check_against_model
from trtllm_pipeline.deploy import deploy, deployment_backend, engine_problem
from trtllm_pipeline.model.source import known_shape
from trtllm_pipeline.endpoints import (SERVER_EXIT_TIMEOUT_S, STATE_FILE, Ports, Server, client_host, host_port,
                                      is_zombie, read_state, serve_state_dir)
from trtllm_pipeline.errors import InputError, StageFailed
from trtllm_pipeline.openai import server as openai_server
from trtllm_pipeline.runtimes.backend import Backend
from trtllm_pipeline.runtimes.registry import backend
from trtllm_pipeline.triton import health, http_front, loopback

log = logging.getLogger(__name__)

STOP_FILE = "stop-requested"  # the PID `serve --stop` stopped, so a foreground `serve` exits quietly
LOG_FILE = "tritonserver.log"
OPENAI_LOG_FILE = "openai-front.log"


# --------------------------------------------------------------------------- the launch


def plan(cfg: BuildConfig, *, engines_dir: str | Path = "engines", **port_args) -> list[str]:
    """What ``serve`` would run, touching nothing (the runtime of the current deployment, else auto)."""
    if (shape := known_shape(cfg.model)) is not None:  # the checks build --dry-run makes (tp, AWQ groups)
        check_against_model(cfg, shape)
    paths = artifacts.artifact_paths(Path(engines_dir).resolve(), cfg.name)
    ports = Ports.of(cfg, **port_args)
    deployed = artifacts.read_manifest(paths.triton_repo)
    chosen, reason = ((backend(deployed["runtime"]), "deployed") if deployed else
                      deployment_backend(cfg, artifacts.read_manifest(paths.engine), None))
    inner = ports.behind_front(0) if cfg.serving.http_front else ports
    cmd, _ = chosen.server_command(cfg, paths.triton_repo, inner, paths.serve_state)
    if cfg.serving.http_front:
        limits = (deployed or {}).get("limits") or {"from": "the deployment"}
        cmd = http_front.command(ports.host, ports.http, 0, limits, paths.triton_repo, cmd, cfg.serving.allowed_hosts)
    lines = [f"runtime: {chosen.name} ({reason})", f"model repository: {paths.triton_repo}"]
    if cfg.serving.http_front:
        lines.append(f"HTTP front on {host_port(ports.host, ports.http)}: validates generate requests, Triton's HTTP "
                     "endpoint behind it on a free loopback port (shown as 0 below)")
    if deployed and (problem := engine_problem(cfg, deployed)):
        lines.append(f"not servable yet: {problem}")
    if warning := exposure_warning(ports.host):
        lines.append(f"warning: {warning}")
    lines += ["launch:", "  " + shlex.join(cmd)]
    front = openai_ports(chosen, ports)
    if front is not None:
        limits = (deployed or {}).get("limits") or {"from": "the deployment"}
        lines += ["OpenAI front (its own process):", "  " + shlex.join(openai_command(cfg, paths, front, limits))]
    server = Server(0, chosen.name, ports.host, ports.http, ports.grpc, ports.metrics, "", cmd,
                    openai_port=front.openai if front else None)
    return lines + ["endpoints:"] + [f"  {e}" for e in server.endpoints()]


def openai_ports(chosen: Backend, ports: Ports) -> Ports | None:
    """The ports with the OpenAI front's, when this deployment gets one (its backend serves the client contract)."""
    return ports if ports.openai is not None and chosen.openai_front else None


def openai_command(cfg: BuildConfig, paths: artifacts.ArtifactPaths, ports: Ports, limits: dict) -> list[str]:
    """The OpenAI front's argument list: it reaches Triton's gRPC endpoint where a local client does."""
    grpc_url = host_port(client_host(ports.host), ports.grpc)
    return openai_server.command(host=ports.host, port=ports.openai, grpc_url=grpc_url,
                                 tokenizer_dir=paths.tokenizer, limits=limits, model_id=cfg.name,
                                 aliases=[cfg.model.source], reasoning_parser=cfg.serving.openai_reasoning_parser,
                                 repository=paths.triton_repo, allowed_hosts=cfg.serving.allowed_hosts)


def start(cfg: BuildConfig, *, engines_dir: str | Path = "engines", stub_wheels: str | Path | None = None,
          interrupted: threading.Event | None = None, **port_args) -> Server:
    """Deploy (cached), launch the server in its own process group and wait until it is ready.

    ``stub_wheels``: a folder with a numpy<2 wheel for the Python-backend stub's environment, where the
    serving Python has numpy 2 and pip has no index (else $TRTLLM_PIPELINE_STUB_WHEELS, else pip's index).
    ``interrupted`` (``interrupts()``): once set, the start is abandoned, the server stopped and KeyboardInterrupt
    raised."""
    paths = artifacts.artifact_paths(Path(engines_dir).resolve(), cfg.name)
    running = read_state(cfg, engines_dir)
    if running is not None:
        raise InputError(f"a server for {cfg.name} is already running (pid {running.pid}, HTTP port "
                         f"{running.http_port}).", fix=f"stop it first: trtllm-pipeline serve -c {cfg.file_arg} --stop")
    ports = Ports.of(cfg, **port_args)
    if warning := exposure_warning(ports.host):
        log.warning("serve: %s", warning)
    previous = artifacts.read_manifest(paths.triton_repo)
    deployment = deploy(cfg, engines_dir=engines_dir, runtime=previous["runtime"] if previous else None)
    if problem := engine_problem(cfg, deployment.manifest):
        raise InputError(f"cannot serve {cfg.name}: {problem}.")
    check_ports_free(ports)
    _check_interrupted(interrupted)
    state_dir = paths.serve_state
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STOP_FILE).unlink(missing_ok=True)
    health.clear(deployment.repo_dir)  # a lost engine of an earlier server says nothing about this one
    served = backend(deployment.runtime)
    own = (ports.http, ports.grpc, ports.metrics, ports.openai)
    inner = ports.behind_front(http_front.free_loopback_port(avoid=own)) if cfg.serving.http_front else ports
    cmd, env = served.server_command(cfg, deployment.repo_dir, inner, state_dir)
    env[loopback.ADDRESS_ENV] = host_port(client_host(inner.host), inner.grpc)  # the BLS's own way to its engine model
    served.prepare_server(cfg, cmd, env, state_dir, wheels=Path(stub_wheels) if stub_wheels else None)
    # The Python models' bytecode, removed before each start. Python writes a .pyc without checking that the write
    # was whole: on a full disk a truncated one stays ("marshal data too short") and broke every later serve of
    # this repository, even after space was freed. (The Python-backend stub ignores PYTHONDONTWRITEBYTECODE.)
    for cache in (deployment.repo_dir, state_dir / "backends"):
        artifacts.remove_bytecode(cache)
    if cfg.serving.http_front:  # the front holds the HTTP port and runs the server as its child
        cmd = http_front.command(ports.host, ports.http, inner.http, deployment.manifest["limits"],
                                 deployment.repo_dir, cmd, cfg.serving.allowed_hosts)
    log_path = state_dir / LOG_FILE
    launched = time.monotonic()
    with open(log_path, "wb") as log_file:
        # A session of its own: Ctrl-C in the terminal reaches us, not the server, which we stop in order.
        process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=state_dir, start_new_session=True)
    server = Server(process.pid, deployment.runtime, ports.host, ports.http, ports.grpc, ports.metrics,
                    str(log_path), cmd, process=process)
    log.info("serve: started tritonserver (pid %d, %s runtime); waiting until it is ready", process.pid,
             deployment.runtime)
    try:
        if (front := openai_ports(served, ports)) is not None:
            server.openai_port = front.openai
            start_openai_front(server, openai_command(cfg, paths, front, deployment.manifest["limits"]), state_dir)
        artifacts.write_json_atomic(state_dir / STATE_FILE, server.state())
        wait_ready(server, timeout_s=cfg.serving.startup_timeout_s, path=served.ready_path(cfg),
                   interrupted=interrupted)
        if server.openai_port is not None:
            wait_front_ready(server, timeout_s=cfg.serving.startup_timeout_s, interrupted=interrupted)
        server.ready_s = round(time.monotonic() - launched, 1)
        artifacts.write_json_atomic(state_dir / STATE_FILE, server.state())
    except BaseException:
        stop_server(server, state_dir)
        raise
    return server


def start_openai_front(server: Server, cmd: list[str], state_dir: Path) -> None:
    """The OpenAI front in a process (and process group) of its own; it answers 503 until Triton is ready."""
    log_path = state_dir / OPENAI_LOG_FILE
    with open(log_path, "wb") as log_file:
        front = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=state_dir, start_new_session=True)
    server.openai_pid, server.openai_process, server.openai_log = front.pid, front, str(log_path)


def _check_interrupted(interrupted: threading.Event | None) -> None:
    if interrupted is not None and interrupted.is_set():
        raise KeyboardInterrupt


def wait_front_ready(server: Server, *, timeout_s: float, interrupted: threading.Event | None = None) -> None:
    url = f"http://{host_port(client_host(server.host), server.openai_port)}/health"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _check_interrupted(interrupted)
        if not server.front_alive():
            raise StageFailed(f"the OpenAI front exited during startup. Log tail ({server.openai_log}):\n"
                              f"{log_tail(server.openai_log)}", fix=_log_fix(server, server.openai_log))
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise StageFailed(f"the OpenAI front was not listening after {timeout_s:.0f} s. Log tail ({server.openai_log}):\n"
                      f"{log_tail(server.openai_log)}", fix="raise serving.startup_timeout_s, or see the log")


def exposure_warning(host: str) -> str | None:
    """What binding ``host`` exposes, when it is not loopback (Triton has no authentication)."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it resolves to whatever it resolves to
        loopback = False
    if loopback:
        return None
    where = "every network interface" if host in ("0.0.0.0", "::", "") else host
    return (f"serving on {where}: anyone who can reach this machine can use the model, and Triton has no "
            "authentication; bind 127.0.0.1 (serving.host, --host) unless that is intended")


def wait_ready(server: Server, *, timeout_s: float, path: str = "/v2/health/ready",
               interrupted: threading.Event | None = None) -> None:
    url = f"http://{host_port(server.client_host, server.http_port)}{path}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _check_interrupted(interrupted)
        if not server.alive():
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
    named = [("HTTP", ports.http), ("gRPC", ports.grpc), ("metrics", ports.metrics)]
    for name, port in named + ([("OpenAI", ports.openai)] if ports.openai else []):
        with socket.socket(socket.AF_INET6 if ":" in ports.host else socket.AF_INET) as probe:
            # As a server binds: a port left in TIME_WAIT by a stopped server is free, a listener is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((ports.host, port))
            except OSError as exc:
                flag = {"HTTP": "--http-port", "gRPC": "--grpc-port", "metrics": "--metrics-port",
                        "OpenAI": "--openai-port"}[name]
                raise InputError(f"the {name} port {port} on {ports.host} is taken ({exc.strerror}).",
                                 fix=f"stop what uses it, or choose another port with {flag}") from None


@contextlib.contextmanager
def interrupts() -> Iterator[threading.Event]:
    """An event that SIGINT (Ctrl-C) and SIGTERM set, for as long as the block runs.

    The handler only records the signal: ``start`` and ``run_until_interrupted`` look at the event at points of
    their own choosing. A handler that raised KeyboardInterrupt wherever the main thread happened to be could
    land inside ``Popen.poll`` between taking its waitpid lock and the ``try`` that releases it (the server then
    looked alive for ever: every stop waited out its timeouts and killed), in a finalizer (printed and ignored:
    the Ctrl-C lost), or in the middle of ``stop_server`` on a second Ctrl-C (the server left running); and,
    installed only after the "Ctrl-C stops it" line, a signal sent as soon as that line was read ended the command
    and left the server running in its own session. So it is installed before the server starts, and covers SIGINT
    even where it arrives ignored (a process started in the background by a non-interactive shell, CI or ``nohup ...
    &``, inherits SIGINT as ignored).
    """
    requested = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: requested.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requested
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_until_interrupted(server: Server, *, cfg: BuildConfig, engines_dir: str | Path = "engines",
                          interrupted: threading.Event) -> None:
    """Foreground serving: wait for ``interrupted`` (``interrupts()``: Ctrl-C or SIGTERM), then stop the server;
    fail if it dies first."""
    state_dir = serve_state_dir(cfg, engines_dir)
    while server.alive() and server.front_alive():
        if interrupted.wait(0.5):
            stop_server(server, state_dir)  # a second Ctrl-C only sets the event again: the stop runs to its end
            return
    front_died = server.alive()  # the loop ended with Triton running: the front is what exited
    stop_server(server, state_dir)  # whatever the server left behind
    if _read_text(state_dir / STOP_FILE) == str(server.pid):
        return  # `serve --stop` from another shell
    if front_died:
        raise StageFailed(f"the OpenAI front exited unexpectedly. Log tail ({server.openai_log}):\n"
                          f"{log_tail(server.openai_log)}", fix=_log_fix(server, server.openai_log))
    raise StageFailed(f"tritonserver exited unexpectedly (code {_exit_code(server)}). Log tail ({server.log}):\n"
                      f"{log_tail(server.log)}", fix=_log_fix(server))


# --------------------------------------------------------------------------- stopping


def stop(cfg: BuildConfig, *, engines_dir: str | Path = "engines") -> Server | None:
    """Stop this config's server; returns it once every process of it has exited (None: none ran)."""
    server = read_state(cfg, engines_dir)
    if server is not None:
        state_dir = serve_state_dir(cfg, engines_dir)
        (state_dir / STOP_FILE).write_text(str(server.pid))
        stop_server(server, state_dir)
    return server


def stop_server(server: Server, state_dir: Path) -> None:
    """The OpenAI front first (it stops taking requests), then SIGTERM to Triton (it unloads its models and
    exits), then SIGKILL for whatever is left of either group."""
    if server.openai_pid is not None:
        stop_front(server)
    if server.alive():
        _signal(server.pid, signal.SIGTERM, group=False)  # mpirun forwards it to every rank
        _wait_gone(server, SERVER_EXIT_TIMEOUT_S + 15)
    if group_alive(server.pid):
        _signal(server.pid, signal.SIGTERM, group=True)
        if not _wait_for(lambda: not group_alive(server.pid), 5):
            _signal(server.pid, signal.SIGKILL, group=True)
            _wait_for(lambda: not group_alive(server.pid), 5)
    (state_dir / STATE_FILE).unlink(missing_ok=True)


def stop_front(server: Server) -> None:
    pid = server.openai_pid
    if server.front_alive():
        _signal(pid, signal.SIGTERM, group=False)  # uvicorn: finish in-flight requests (a few seconds), then exit
        _wait_for(lambda: not server.front_alive(), openai_server.GRACEFUL_S + 10)
    if group_alive(pid):
        _signal(pid, signal.SIGKILL, group=True)
        _wait_for(lambda: not group_alive(pid), 5)


def _signal(pid: int, sig: int, *, group: bool) -> None:
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(server: Server, timeout_s: float) -> None:
    if not _wait_for(lambda: not server.alive(), timeout_s):
        log.warning("serve: tritonserver (pid %d) ignored SIGTERM for %.0f s; killing it", server.pid, timeout_s)
        _signal(server.pid, signal.SIGKILL, group=True)
        _wait_for(lambda: not server.alive(), 10)


def _wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def group_alive(pgid: int) -> bool:
    """Whether any process of the server's group (ranks, Python-backend stubs) is left, zombies aside."""
    return any(_pgid(p) == pgid and not is_zombie(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit())


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


def _log_fix(server: Server, path: str | None = None) -> str:
    text = log_tail(path or server.log, 200)
    if "address already in use" in text.lower():
        return "a port is taken: choose others with --http-port/--grpc-port/--metrics-port/--openai-port"
    return f"see {path or server.log} for the first error"


# --------------------------------------------------------------------------- what the command says


def started_lines(cfg: BuildConfig, server: Server, *, detach: bool) -> list[str]:
    ready = f"ready in {server.ready_s:.1f} s of at most {cfg.serving.startup_timeout_s:.0f}, " if server.ready_s else ""
    lines = [f"serving {cfg.name} ({server.runtime} runtime, {ready}pid {server.pid}, log {server.log}):"]
    lines += [f"  {line}" for line in server.endpoints()]
    return lines + [f"stop it with: trtllm-pipeline serve -c {cfg.file_arg} --stop" if detach else "Ctrl-C stops it."]


def stopped_line(cfg: BuildConfig, stopped: Server | None) -> str:
    return f"stopped the {cfg.name} server (pid {stopped.pid})" if stopped else f"no server is running for {cfg.name}"
