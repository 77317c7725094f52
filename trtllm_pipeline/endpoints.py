"""Where a build is served: the ports it asks for, the record ``serve`` leaves, the address a client uses.

``serve`` writes ``engines/<config>/serve/server.json`` for the server it started; ``serve --stop``
(from another shell), ``--url default`` and ``bench -c`` read it here, so that a client finds the
server without importing the code that runs it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from trtllm_pipeline import artifacts
from trtllm_pipeline.errors import InputError

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

STATE_FILE = "server.json"
SERVER_EXIT_TIMEOUT_S = 15  # Triton waits this long for in-flight requests when asked to stop
WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # bind every interface: an address to listen on, not to connect to
# Triton's administrative APIs: registering shared memory (the server then writes outputs into a file a
# client names), loading and unloading models, tracing and logging settings. No client of this project uses
# them; Triton serves them only to requests carrying a header whose value is random per server and written
# nowhere but the server's argument list.
RESTRICTED_APIS = ("shared-memory", "model-repository", "trace", "logging")
ADMIN_HEADER = "trtllm-pipeline-admin"


BODY_TYPES = ("application/json", "application/octet-stream")  # octet-stream: Triton's binary tensors


def header_problem(method: str, headers: Iterable[tuple[str, str]], allowed_hosts: set[str] | frozenset[str]
                   ) -> tuple[str, int] | None:
    """(message, HTTP status) when a request to an HTTP front must be refused on its headers alone, else None.

    A Host that is not this server's: DNS rebinding, a web page whose own name was made to resolve to this
    machine. A body that is not JSON: a web page may send text/plain or form bodies to any address without
    asking the server, while a JSON body needs the browser's preflight, which these servers never grant. A
    Content-Length given twice, or beside a Transfer-Encoding: request smuggling.
    """
    seen: dict[str, list[str]] = {}
    for key, value in headers:
        seen.setdefault(key.lower(), []).append(value)
    host, length, encoding = seen.get("host", []), seen.get("content-length", []), seen.get("transfer-encoding", [])
    if len(host) > 1:
        return "Host is given more than once", 400
    if host and not host_allowed(host[0], allowed_hosts):
        return (f"Host {host[0][:100]!r} does not name this server; use its address (or add the name to "
                "serving.allowed_hosts)", 421)
    if len(length) > 1:
        return "Content-Length is given more than once", 400
    if length and encoding:
        return "a request has a Content-Length or a Transfer-Encoding, not both", 400
    sends_body = method.upper() in ("POST", "PUT", "PATCH") and (encoding or (length and length[0].strip() != "0"))
    kind = (seen.get("content-type") or [""])[0].split(";")[0].strip().lower()
    # tritonclient.http's infer sends binary tensors with no Content-Type but a header of Triton's own, which a
    # web page cannot add without the preflight either.
    if sends_body and kind not in BODY_TYPES and not (not kind and "inference-header-content-length" in seen):
        return f"a request body must be JSON (Content-Type: application/json), got {kind or 'no Content-Type'}", 415
    return None


def allowed_host_names(bound: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host names a front accepts besides IP addresses: the address it binds, localhost, serving.allowed_hosts."""
    return frozenset(h.lower().rstrip(".") for h in (bound, "localhost", *extra))


def host_allowed(header: str, allowed: set[str] | frozenset[str]) -> bool:
    """Whether a request's Host header names this server: an IP address (which no DNS rebinding can give),
    or a name in ``allowed`` (lower case: the bound host, localhost, serving.allowed_hosts)."""
    host = header.strip()
    if host.startswith("["):  # [::1]:8000
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return host.lower().rstrip(".") in allowed


def triton_endpoint_flags(*, http_host: str, http_port: int, host: str, grpc_port: int, metrics_port: int
                          ) -> list[str]:
    """tritonserver's address and port flags, each address spelled as its endpoint reads it. An IPv6 literal differs:
    gRPC takes it in brackets (bare, ``::1`` and the port make ``::1:8001``, which gRPC cannot resolve: the server
    exits), HTTP and metrics (libevhtp) after ``ipv6:`` (bare, evhtp reads it as an IPv4 address and binds
    255.255.255.255 without a word: seen with tritonserver 2.51)."""
    def grpc(h: str) -> str:
        return f"[{h}]" if ":" in h else h

    def evhtp(h: str) -> str:
        return f"ipv6:{h}" if ":" in h else h

    return [f"--http-address={evhtp(http_host)}", f"--http-port={http_port}",
            f"--grpc-address={grpc(host)}", f"--grpc-port={grpc_port}",
            f"--metrics-address={evhtp(host)}", f"--metrics-port={metrics_port}"]


def restricted_api_flags() -> list[str]:
    """tritonserver (2.31+) flags that close ``RESTRICTED_APIS`` over HTTP and gRPC to every client."""
    value = f"{ADMIN_HEADER}={secrets.token_hex(16)}"
    apis = ",".join(RESTRICTED_APIS)
    return [f"--http-restricted-api={apis}:{value}", f"--grpc-restricted-protocol={apis}:{value}"]


def client_host(host: str) -> str:
    """Where a client on this machine connects to a server bound to ``host``: a wildcard's loopback. ``::``'s is ::1:
    tritonserver's HTTP and metrics endpoints bound to ``::`` take IPv6 only (the other endpoints take both)."""
    return "::1" if host == "::" else "127.0.0.1" if host in WILDCARD_HOSTS else host


def host_port(host: str, port: int) -> str:
    """``HOST:PORT`` as URLs and gRPC targets read it: an IPv6 literal in brackets (``[::1]:8001``; bare, its colons
    run into the port's)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclasses.dataclass(frozen=True)
class Ports:
    host: str
    http: int
    grpc: int
    metrics: int
    http_host: str | None = None  # where Triton's HTTP endpoint binds, when not ``host`` (behind the HTTP front)
    openai: int | None = None  # the OpenAI front's port (None: no front)

    @property
    def http_bind(self) -> str:
        return self.http_host or self.host

    def triton_flags(self) -> list[str]:
        """tritonserver's flags for these endpoints (``triton_endpoint_flags``)."""
        return triton_endpoint_flags(http_host=self.http_bind, http_port=self.http, host=self.host,
                                     grpc_port=self.grpc, metrics_port=self.metrics)

    def behind_front(self, upstream_port: int) -> "Ports":
        """The ports tritonserver binds when the HTTP front holds ``http``: its HTTP endpoint on loopback."""
        return dataclasses.replace(self, http=upstream_port, http_host="127.0.0.1")

    @classmethod
    def of(cls, cfg: "BuildConfig", host=None, http=None, grpc=None, metrics=None, openai=None) -> "Ports":
        s = cfg.serving
        ports = cls(host or s.host, http or s.http_port, grpc or s.grpc_port, metrics or s.metrics_port,
                    openai=(openai or s.openai_port) if s.openai_front else None)
        taken = [ports.http, ports.grpc, ports.metrics] + ([ports.openai] if ports.openai else [])
        if len(set(taken)) != len(taken):
            raise InputError(f"the HTTP, gRPC, metrics and OpenAI ports must differ, got {', '.join(map(str, taken))}.",
                             fix="give each its own port")
        return ports

    def address(self, protocol: str) -> str:
        """HOST:PORT of the gRPC or HTTP endpoint; for ``openai``, the base URL an OpenAI client takes."""
        if protocol == "openai":
            if self.openai is None:
                raise InputError("this deployment has no OpenAI front (serving.openai_front is false).",
                                 fix="set serving.openai_front: true and serve again, or use --protocol grpc")
            return openai_base_url(client_host(self.host), self.openai)
        return host_port(client_host(self.host), self.grpc if protocol == "grpc" else self.http)


def openai_base_url(host: str, port: int) -> str:
    return f"http://{host_port(host, port)}/v1"


def chat_page_url(host: str, port: int) -> str:
    """The OpenAI front's chat page (``openai/page``), beside its ``/v1``."""
    return openai_base_url(host, port).removesuffix("/v1") + "/chat"


def is_openai_url(url: str) -> bool:
    """Whether ``url`` is an OpenAI API base URL (``http://HOST:PORT/v1``) rather than Triton's HOST:PORT."""
    return url.startswith(("http://", "https://")) and url.rstrip("/").endswith("/v1")


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
    openai_port: int | None = None  # the OpenAI front, a process of its own (None: not started)
    openai_pid: int | None = None
    openai_log: str | None = None
    ready_s: float | None = None  # from launch to ready: loading, compiling and capturing the engine included
    process: subprocess.Popen | None = dataclasses.field(default=None, repr=False, compare=False)
    openai_process: subprocess.Popen | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def client_host(self) -> str:
        return client_host(self.host)

    @property
    def ports(self) -> Ports:
        return Ports(self.host, self.http_port, self.grpc_port, self.metrics_port, openai=self.openai_port)

    def endpoints(self) -> list[str]:
        h = self.client_host
        return [f"HTTP     http://{host_port(h, self.http_port)}  (POST /v2/models/tensorrt_llm_bls/generate,"
                " /generate_stream; also ensemble)",
                f"gRPC     {host_port(h, self.grpc_port)}  (model tensorrt_llm_bls, or ensemble; decoupled: stream"
                " API)",
                f"metrics  http://{host_port(h, self.metrics_port)}/metrics  (Prometheus)"] + (
                [f"OpenAI   {openai_base_url(h, self.openai_port)}  (/models, /completions, /chat/completions)",
                 f"chat     {chat_page_url(h, self.openai_port)}  (a page to talk to the model, in a browser)"]
                if self.openai_port else [])

    def state(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("process", "openai_process")}

    def alive(self) -> bool:
        return _running(self.pid, self.process)

    def front_alive(self) -> bool:
        """Whether the OpenAI front runs (true where none was started)."""
        return self.openai_pid is None or _running(self.openai_pid, self.openai_process)


def _running(pid: int, process: subprocess.Popen | None) -> bool:
    if process is not None:
        return process.poll() is None
    try:
        # Reap it if it is our child (a server started by this process, then found via its state file).
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    return artifacts.pid_alive(pid) and not is_zombie(pid)


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
    if not server.alive() and not (server.openai_pid and server.front_alive()):  # a front left alone is stopped too
        path.unlink(missing_ok=True)
        return None
    return server


def resolve_url(url: str, protocol: str, cfg: "BuildConfig | None", engines_dir: str | Path = "engines") -> str:
    """``default`` means where ``serve`` runs ``cfg`` (its recorded server, else the config's ports); with
    ``protocol`` ``openai``, the OpenAI front's base URL (``http://HOST:PORT/v1``)."""
    if url != "default":
        return url
    if cfg is None:
        raise InputError("--url default needs -c CONFIG (whose server to use).", fix="add -c, or give --url HOST:PORT")
    running = read_state(cfg, engines_dir)
    return (running.ports if running is not None else Ports.of(cfg)).address(protocol)
