"""Where a build is served: the ports it asks for, the record ``serve`` leaves, the address a client uses.

``serve`` writes ``engines/<config>/serve/server.json`` for the server it started; ``serve --stop``
(from another shell), ``--url default`` and ``bench -c`` read it here, so that a client finds the
server without importing the code that runs it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_pipeline import artifacts
from trtllm_pipeline.errors import InputError

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

STATE_FILE = "server.json"
SERVER_EXIT_TIMEOUT_S = 15  # Triton waits this long for in-flight requests when asked to stop
WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # bind every interface: an address to listen on, not to connect to


def client_host(host: str) -> str:
    """Where a client on this machine connects to a server bound to ``host``."""
    return "127.0.0.1" if host in WILDCARD_HOSTS else host


@dataclasses.dataclass(frozen=True)
class Ports:
    host: str
    http: int
    grpc: int
    metrics: int
    http_host: str | None = None  # where Triton's HTTP endpoint binds, when not ``host`` (behind the HTTP front)

    @property
    def http_bind(self) -> str:
        return self.http_host or self.host

    def behind_front(self, upstream_port: int) -> "Ports":
        """The ports tritonserver binds when the HTTP front holds ``http``: its HTTP endpoint on loopback."""
        return dataclasses.replace(self, http=upstream_port, http_host="127.0.0.1")

    @classmethod
    def of(cls, cfg: "BuildConfig", host=None, http=None, grpc=None, metrics=None) -> "Ports":
        s = cfg.serving
        ports = cls(host or s.host, http or s.http_port, grpc or s.grpc_port, metrics or s.metrics_port)
        if len({ports.http, ports.grpc, ports.metrics}) != 3:
            raise InputError(f"the HTTP, gRPC and metrics ports must differ, got {ports.http}, {ports.grpc}, "
                             f"{ports.metrics}.", fix="give each its own port")
        return ports

    def address(self, protocol: str) -> str:
        """HOST:PORT of the gRPC or HTTP endpoint."""
        return f"{client_host(self.host)}:{self.grpc if protocol == 'grpc' else self.http}"


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
        return client_host(self.host)

    @property
    def ports(self) -> Ports:
        return Ports(self.host, self.http_port, self.grpc_port, self.metrics_port)

    def endpoints(self) -> list[str]:
        h = self.client_host
        return [f"HTTP     http://{h}:{self.http_port}  (POST /v2/models/tensorrt_llm_bls/generate, /generate_stream;"
                " also ensemble)",
                f"gRPC     {h}:{self.grpc_port}  (model tensorrt_llm_bls, or ensemble; decoupled: stream API)",
                f"metrics  http://{h}:{self.metrics_port}/metrics  (Prometheus)"]

    def state(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "process"}

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        try:
            # Reap it if it is our child (a server started by this process, then found via its state file).
            if os.waitpid(self.pid, os.WNOHANG)[0] == self.pid:
                return False
        except ChildProcessError:
            pass
        return artifacts.pid_alive(self.pid) and not is_zombie(self.pid)


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def serve_state_dir(cfg: "BuildConfig", engines_dir: str | Path) -> Path:
    """Where ``serve`` keeps the record, log and Python-backend links of ``cfg``'s server."""
    return artifacts.artifact_paths(Path(engines_dir).resolve(), cfg.name).serve_state


def read_state(cfg: "BuildConfig", engines_dir: str | Path = "engines") -> Server | None:
    """The server recorded for this config if its process is still alive (a stale record is removed)."""
    path = serve_state_dir(cfg, engines_dir) / STATE_FILE
    try:
        server = Server(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    if not server.alive():
        path.unlink(missing_ok=True)
        return None
    return server


def resolve_url(url: str, protocol: str, cfg: "BuildConfig | None", engines_dir: str | Path = "engines") -> str:
    """``default`` means where ``serve`` runs ``cfg`` (its recorded server, else the config's ports)."""
    if url != "default":
        return url
    if cfg is None:
        raise InputError("--url default needs -c CONFIG (whose server to use).", fix="add -c, or give --url HOST:PORT")
    running = read_state(cfg, engines_dir)
    return (running.ports if running is not None else Ports.of(cfg)).address(protocol)
