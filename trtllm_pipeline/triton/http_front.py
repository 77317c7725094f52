"""The HTTP front door: Triton's HTTP endpoint behind a validating proxy, and the server under it.

Triton 2.51 turns a generate request's JSON into tensors itself, and answers a value of the wrong
type (``"max_tokens": "ten"``, ``1.5``, an integer stop word), truncated JSON or a body that is not
an object with HTTP 500, and its required-input check misses a lacking ``text_input`` when the
request brings as many other inputs (a streamed request then gets 200 and an empty stream). So
``serve`` puts this front on the configured HTTP port and Triton's HTTP endpoint on a loopback port
behind it. The front checks ``generate`` and ``generate_stream`` bodies against the client contract
(``contract.CLIENT_INPUTS``: every field's type, the required ones, the sizes of
``contract.RequestLimits``, a body larger than any valid request refused unparsed) and answers a bad
one with 400 and a message naming the field; everything else, and every valid request, passes
through unchanged, streamed as it comes. A client that disconnects is noticed at once (its socket's
end of file) and the upstream connection closed, which Triton reports to the model as a cancelled
request. gRPC clients reach Triton directly: Triton checks their data types itself.

Run as ``python -m trtllm_pipeline.triton.http_front --listen HOST:PORT --upstream 127.0.0.1:PORT
--limits JSON -- tritonserver ...``: it binds its port first, starts the server command as its
child, forwards SIGTERM/SIGINT to it and exits with its exit status, so ``serve`` manages the two as
one process.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import math
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Collection, Iterator

from trtllm_pipeline.endpoints import allowed_host_names, header_problem, host_port
from trtllm_pipeline.runtimes.base import float32_problem
from trtllm_pipeline.triton import health, stops
from trtllm_pipeline.triton.contract import (CLIENT_INPUTS, FRONT_MODEL, REQUIRED_INPUTS, STOP_ID_PREFIX,
                                             RequestLimits)

# The generate endpoints of the models that take the client contract (the others pass through as they are).
CONTRACT_MODELS = ("ensemble", FRONT_MODEL)
ENGINE_MODEL = "tensorrt_llm"
GENERATE_PATH = re.compile(rf"^/v2/models/(?:{'|'.join(CONTRACT_MODELS)})(?:/versions/[^/?]+)?/(generate|generate_stream)"
                           r"(?:\?.*)?$")
OTHER_BODY_LIMIT = 64 * 2**20  # other endpoints (infer, repository, ...) pass through up to this
DRAIN_LIMIT = 256 * 2**20  # a body over the limit is read and dropped up to this, so the 413 reaches its client
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "content-length"}
# Triton's administrative endpoints (endpoints.RESTRICTED_APIS: Triton refuses them too): not served through the
# front at all. Registering system shared memory would let a client have the server write outputs into a file.
ADMIN_PATH = re.compile(r"^/v2/(?:systemsharedmemory|cudasharedmemory|repository|trace|logging)(?:[/?]|$)"
                        r"|^/v2/models/[^/?]+(?:/versions/[^/?]+)?/trace(?:[/?]|$)")
READY_PATH = re.compile(r"^/v2/health/ready(?:\?.*)?$|^/v2/models/[^/?]+(?:/versions/[^/?]+)?/ready(?:\?.*)?$")
# Slow clients (slowloris): every read or write on a client's socket may wait IO_TIMEOUT_S, a request's line,
# headers and body (and the idle wait before them) READ_DEADLINE_S in all, and at most MAX_CONNECTIONS
# connections are open at once (each holds a thread); one over that is answered 503 and closed.
IO_TIMEOUT_S = 10.0
# How often a generate request in flight looks whether the model it waits on was lost (health.lost: a crashed stub
# answers nothing, and Triton 2.51 leaves its requests waiting)
LOST_POLL_S = 0.5
LOST_WAIT_S = 1.0  # after a stream broke: how long a dead stub's process may take to show as gone
READ_DEADLINE_S = 20.0
MAX_CONNECTIONS = 512
TRITON_GENERATE_KEYS = {"id": str, "parameters": dict}  # the generate extension's own fields
INT32 = (-(2**31), 2**31 - 1)
UINT64 = (0, 2**64 - 1)


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


# --------------------------------------------------------------------------- the check


def _reject_constant(name: str):
    raise BadRequest(f"the body is not valid JSON: {name} is not a JSON number")


def check_generate(body: bytes, limits: RequestLimits) -> dict[str, Any]:
    """The request object of a valid generate body; BadRequest naming the first problem otherwise."""
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise BadRequest("the body is not UTF-8 JSON") from None
    except ValueError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # a body of thousands of nested brackets: no request is like that
        raise BadRequest("the body is not a request: its JSON is nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object of inputs, got a {type(data).__name__}")
    types = {name: (dtype, dims) for name, dtype, dims, _ in CLIENT_INPUTS}
    unknown = sorted(set(data) - set(types) - set(TRITON_GENERATE_KEYS))
    if unknown:
        raise BadRequest(f"unknown input(s) {', '.join(unknown)}; this model takes {', '.join(types)}")
    for name in REQUIRED_INPUTS:
        if name not in data:
            raise BadRequest(f"{name} is missing; it is required")
    for key, kind in TRITON_GENERATE_KEYS.items():
        if key in data and not isinstance(data[key], kind):
            raise BadRequest(f"{key} must be a JSON {'string' if kind is str else 'object'}")
    for name, value in data.items():
        if name in types:
            _check_value(name, value, *types[name], limits)
    return data


def _streams(data: dict[str, Any]) -> bool:
    value = data.get("stream")
    return bool(value[0] if isinstance(value, list) and value else value)


def _check_value(name: str, value: Any, dtype: str, dims: list[int], limits: RequestLimits) -> None:
    if dtype == "TYPE_STRING":
        if dims == [-1]:  # a list of strings (stop_words, bad_words); one string is a list of one
            words = [value] if isinstance(value, str) else value
            if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
                raise BadRequest(f"{name} must be a string or a list of strings, got {_shown(value)}")
            if problem := limits.words_problem(name, [_utf8(name, w) for w in words]):
                raise BadRequest(problem)
            return
        if not isinstance(value, str):
            raise BadRequest(f"{name} must be a string, got {_shown(value)}")
        if problem := limits.text_problem(name, len(_utf8(name, value))):
            raise BadRequest(problem)
        return
    if isinstance(value, list) and len(value) == 1:  # Triton takes [x] for a [1] input
        value = value[0]
    if dtype == "TYPE_BOOL":
        if not isinstance(value, bool):
            raise BadRequest(f"{name} must be true or false, got {_shown(value)}")
    elif dtype in ("TYPE_INT32", "TYPE_UINT64"):
        low, high = INT32 if dtype == "TYPE_INT32" else UINT64
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadRequest(f"{name} must be an integer, got {_shown(value)}")
        if not low <= value <= high:
            raise BadRequest(f"{name} must be from {low} to {high}, got {value}")
    elif dtype == "TYPE_FP32":
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise BadRequest(f"{name} must be a finite number, got {_shown(value)}")
        if problem := float32_problem(name, value):  # Triton takes it as a 32-bit float: no inf, no silent 0
            raise BadRequest(problem)


def _utf8(name: str, text: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (``"\\ud800"``, valid JSON but no character) is the client's error."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{name} is not valid Unicode text: a lone surrogate {text[exc.start]!a} at character "
                         f"{exc.start}") from None


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return f"{text[:40]}..." if len(text) > 43 else text


# --------------------------------------------------------------------------- the proxy


class Front(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # the listen backlog: a burst of clients connecting at once is not reset

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], limits: RequestLimits,
                 stop_address: str | None = None, *, repository: str | None = None,
                 allowed_hosts: tuple[str, ...] = ()):
        self.address_family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        super().__init__(listen, Handler)
        self.upstream, self.limits, self.stop_address = upstream, limits, stop_address
        self.repository = repository
        self._told: str | None = None  # the last reason ``lost`` gave, said once in this front's log
        self.allowed_hosts = allowed_host_names(listen[0], allowed_hosts)
        self._lock = threading.Lock()
        self._open = 0
        self._deadlines: dict[socket.socket, float] = {}
        threading.Thread(target=self._reap, name="http-front-reaper", daemon=True).start()

    def lost(self) -> str | None:
        """Why the deployment cannot serve (``health.lost``), or None; a new reason is also said in this front's log
        (a hung stub leaves no trace elsewhere: Triton logs nothing of it)."""
        why = health.lost(self.repository) if self.repository else None
        if why is not None and why != self._told:
            self._told = why
            print(f"http front: the deployment cannot serve: {why}", file=sys.stderr, flush=True)
        return why

    # ---- slow clients: a bound on connections, a deadline on reading each request ------------------

    def process_request(self, request, client_address) -> None:
        with self._lock:
            full = self._open >= MAX_CONNECTIONS
            self._open += not full
        if full:
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.reading(request, False)
            with self._lock:
                self._open -= 1

    def reading(self, connection: socket.socket, reading: bool) -> None:
        """While ``reading``, ``connection`` is closed when READ_DEADLINE_S pass (a request trickled in)."""
        with self._lock:
            if reading:
                self._deadlines[connection] = time.monotonic() + READ_DEADLINE_S
            else:
                self._deadlines.pop(connection, None)

    def _reap(self) -> None:
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            with self._lock:
                late = [c for c, deadline in self._deadlines.items() if deadline < now]
                for connection in late:
                    del self._deadlines[connection]
            for connection in late:
                try:
                    connection.shutdown(socket.SHUT_RDWR)  # its handler's read ends; the handler closes it
                except OSError:
                    pass

    def handle_error(self, request, client_address) -> None:
        """A client that goes away mid-request (reset, broken pipe, timeout) is ordinary for a server: one line in
        the log instead of socketserver's traceback; anything else keeps the traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            print(f"http front: client {client_address[0]} went away: {exc}", file=sys.stderr, flush=True)
            return
        super().handle_error(request, client_address)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY on the client's socket: a stream writes one small chunk per token, and with Nagle's algorithm a
    # chunk written while the previous one is unacknowledged waits for its ACK, which a client may delay (up to
    # 40 ms on Linux), and goes out with the next ones.
    disable_nagle_algorithm = True
    timeout = IO_TIMEOUT_S  # each read and write on the client's socket
    server: Front

    def log_message(self, format, *args):  # Triton logs requests itself; keep the log to errors
        pass

    def handle_one_request(self):
        self.server.reading(self.connection, True)  # until the body is read (``_proxy``)
        super().handle_one_request()

    def do_GET(self):
        self._proxy()

    do_HEAD = do_PUT = do_DELETE = do_OPTIONS = do_GET

    def do_POST(self):
        match = GENERATE_PATH.match(self.path)
        self._proxy(generate=match.group(1) if match else None)

    def _proxy(self, generate: str | None = None) -> None:
        limit = self.server.limits.max_body_bytes if generate else OTHER_BODY_LIMIT
        request_id = client_id = None
        stream = generate == "generate_stream"
        try:
            self._check_headers()
            body = self._body(limit)
            self.server.reading(self.connection, False)
            if ADMIN_PATH.match(self.path):
                raise BadRequest(f"{self.path.split('?')[0]} is not served: Triton's administrative APIs (shared "
                                 "memory, model loading, trace and log settings) are closed to clients", 403)
            if (why := self._engine_lost()) is not None and (generate or READY_PATH.match(self.path)):
                raise BadRequest(f"the model cannot serve: {why}", 503)
            if generate:
                data = check_generate(body, self.server.limits)
                if generate == "generate" and _streams(data):
                    raise BadRequest("stream: true needs the generate_stream endpoint (generate answers once)")
                # Always an id of the front's own, to stop the request by if its client goes away; a client's
                # own id is put back into the answers.
                client_id = data.get("id")
                request_id = data["id"] = f"{STOP_ID_PREFIX}{uuid.uuid4().hex}"
                body = json.dumps(data).encode()
        except BadRequest as exc:
            self._error(exc.status, str(exc), stream=stream)
            return
        upstream = http.client.HTTPConnection(*self.server.upstream)
        gone = _Gone(self.server.upstream, upstream, request_id, self.server.stop_address)
        # watching from before the request is sent: a non-streaming answer's headers come only when it is whole
        watcher = _ClientWatcher(self.connection, gone, self._engine_lost if generate else None)
        try:
            try:
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
                upstream.request(self.command, self.path, body=body if body or self.command == "POST" else None,
                                 headers=headers)
                response = upstream.getresponse()
            except (OSError, http.client.HTTPException):
                if watcher.client_gone:
                    self.close_connection = True
                elif (why := watcher.broken_by_loss()) is not None:
                    self._error(503, f"the model cannot serve: {why}", stream=stream)
                else:
                    self._error(503, "the server is not ready (its HTTP endpoint is not listening yet)")
                return
            rename = None if client_id is None else (json.dumps(request_id).encode(), json.dumps(client_id).encode())
            try:
                self._relay(response, rename, watcher)
            except (OSError, http.client.HTTPException):  # the client went away mid-response
                self.close_connection = True
                gone()
        finally:
            watcher.done()
            upstream.close()

    def _engine_lost(self) -> str | None:
        return self.server.lost()

    def _check_headers(self) -> None:
        """``endpoints.header_problem`` refused before the body is read (the connection is then closed)."""
        if problem := header_problem(self.command, self.headers.items(), self.server.allowed_hosts):
            self.close_connection = True
            raise BadRequest(*problem)

    def _body(self, limit: int) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raise BadRequest("send the body with a Content-Length (chunked request bodies are not taken)", 411)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if length < 0:
            raise BadRequest("Content-Length is negative")
        if length > limit:
            remaining = length if length <= DRAIN_LIMIT else 0
            while remaining > 0:  # read and dropped, unparsed, so that the client gets to read the answer
                chunk = self.rfile.read(min(1 << 20, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
            if length > DRAIN_LIMIT:
                self.close_connection = True
            raise BadRequest(f"the body is {length} bytes; requests to this server are at most {limit} bytes "
                             "(build.max_input_len allows no longer prompt)", 413)
        return self.rfile.read(length) if length else b""

    def _relay(self, response: http.client.HTTPResponse, rename: tuple[bytes, bytes] | None,
               watcher: "_ClientWatcher") -> None:
        """Triton's answer as it comes; ``rename``: (the front's id, the client's), put back where Triton echoes it.
        Where the model was lost mid-stream (``watcher``), the stream ends with that error as its last event."""
        self.send_response_only(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        length = response.getheader("Content-Length")
        if self.command == "HEAD" or response.status in (204, 304):
            self.end_headers()
            return
        if rename is not None:
            self._relay_renamed(response, length, *rename, watcher)
            return
        if length is not None:
            self.send_header("Content-Length", length)
            self.end_headers()
            remaining = int(length)
            while remaining > 0:
                chunk = response.read(min(remaining, 1 << 16))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in _arriving(response, watcher):  # as it arrives: one server-sent event per token
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self._last_chunk(watcher.lost_reason)

    def _relay_renamed(self, response: http.client.HTTPResponse, length: str | None, ours: bytes, theirs: bytes,
                       watcher: "_ClientWatcher") -> None:
        if length is not None:  # a generate answer: small, whole
            body = response.read(int(length)).replace(ours, theirs)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        pending = b""
        for chunk in _arriving(response, watcher):  # whole events (the id cannot straddle two), as they arrive
            pending += chunk
            cut = pending.rfind(b"\n\n") + 2
            if cut > 1:
                events, pending = pending[:cut].replace(ours, theirs), pending[cut:]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(events), events))
                self.wfile.flush()
        if pending:
            pending = pending.replace(ours, theirs)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(pending), pending))
        self._last_chunk(watcher.lost_reason)

    def _last_chunk(self, lost: str | None) -> None:
        """The chunked answer's end, after an error event where the model was lost mid-stream (the client reads an
        error, not a stream that merely stopped)."""
        if lost is not None:
            event = b"data: " + json.dumps({"error": f"the model cannot serve: {lost}"}).encode() + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _error(self, status: int, message: str, stream: bool = False) -> None:
        body = json.dumps({"error": message}).encode()
        if stream:  # as Triton answers generate_stream: one server-sent event
            body = b"data: " + body + b"\n\n"
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


def _arriving(response: http.client.HTTPResponse, watcher: "_ClientWatcher") -> Iterator[bytes]:
    """Triton's streamed answer as it arrives, to its end, or to where it broke because the model was lost (cut by
    the watcher, or by Triton itself: ``watcher.lost_reason`` then says why); any other broken read is raised."""
    try:
        while chunk := response.read1(1 << 16):
            yield chunk
    except (OSError, http.client.HTTPException):
        if watcher.broken_by_loss() is None:
            raise


class _Gone:
    """What the front does, once, when a client goes away mid-request: close the upstream connection
    (Triton then flags the request cancelled) and, for a request carrying the front's id, send the
    engine model TensorRT-LLM's stop request for it, which ends it at the runtime's next step whether
    it came through the BLS (whose own notice can lag under load) or the ensemble (which in Triton
    2.51 passes no cancellation on at all; its steps carry the request's id)."""

    def __init__(self, address: tuple[str, int], upstream: http.client.HTTPConnection, request_id: str | None,
                 stop_address: str | None):
        self.address, self.upstream, self.request_id = address, upstream, request_id
        self.stop_address = stop_address
        self._done = threading.Event()

    def __call__(self) -> None:
        if self._done.is_set():
            return
        self._done.set()
        if self.request_id is not None and not (self.stop_address and stops.send(self.stop_address, self.request_id)):
            threading.Thread(target=self._stop, daemon=True).start()  # no side channel: through Triton
        try:
            if self.upstream.sock is not None:
                self.upstream.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _stop(self) -> None:
        body = {"id": self.request_id, "stop": True, "input_ids": [0], "input_lengths": [1], "request_output_len": [1]}
        try:
            connection = http.client.HTTPConnection(*self.address, timeout=30)
            connection.request("POST", f"/v2/models/{ENGINE_MODEL}/generate", body=json.dumps(body),
                               headers={"Content-Type": "application/json"})
            connection.getresponse().read()
            connection.close()
        except (OSError, http.client.HTTPException):  # the server is going away too
            pass


class _ClientWatcher:
    """Calls ``gone`` as soon as the client's socket reaches end of file, so that a request whose
    client went away is stopped even while no response is being written; and, given ``lost`` (``health.lost``),
    as soon as the model the request waits on is lost (``lost_reason``): its upstream connection then ends."""

    def __init__(self, client: socket.socket, gone: _Gone, lost=None):
        self.client, self.gone, self.lost = client, gone, lost
        self.client_gone = False
        self.lost_reason: str | None = None
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            while True:
                readable, _, _ = select.select([self.client, self._stop_r], [], [],
                                               LOST_POLL_S if self.lost is not None else None)
                if self._stop_r in readable:
                    return
                if self.client in readable:
                    if self.client.recv(1, socket.MSG_PEEK) == b"":  # end of file: the client is gone
                        self.client_gone = True
                        self.gone()
                    return
                if (why := self.lost()) is not None:
                    self.lost_reason = why
                    self.gone()
                    return
        except OSError:  # either socket closed meanwhile
            pass

    def broken_by_loss(self) -> str | None:
        """After the upstream stream broke: why the model was lost, where it was (Triton 2.51 sometimes drops a
        stream when a stub dies, before this watcher's next look; a killed process closes its sockets before it shows
        as gone, so ``lost`` is asked for up to ``LOST_WAIT_S``), else None."""
        deadline = time.monotonic() + LOST_WAIT_S
        while self.lost_reason is None and not self.client_gone and self.lost is not None:
            if (why := self.lost()) is not None:
                self.lost_reason = why
            elif time.monotonic() >= deadline:
                break
            else:
                time.sleep(0.05)
        return self.lost_reason

    def done(self) -> None:
        try:
            self._stop_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=5)
        self._stop_r.close()
        self._stop_w.close()


# --------------------------------------------------------------------------- the process


def command(listen_host: str, listen_port: int, upstream_port: int, limits: dict[str, int], repository: str | Path,
            server_command: list[str], allowed_hosts: list[str] = ()) -> list[str]:
    """The command that runs ``server_command`` behind the front (``serve`` launches this)."""
    return [sys.executable, "-m", "trtllm_pipeline.triton.http_front",
            f"--listen={host_port(listen_host, listen_port)}",
            f"--upstream=127.0.0.1:{upstream_port}", f"--limits={json.dumps(limits, sort_keys=True)}",
            f"--repository={repository}", *(f"--allow-host={h}" for h in allowed_hosts), "--", *server_command]


def free_loopback_port(avoid: Collection[int | None] = ()) -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it), for Triton's HTTP endpoint behind the front; never one
    of ``avoid`` (the deployment's own ports, which may be free now only because nothing binds them yet: the OS
    once picked the metrics port, and tritonserver refused to start)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port not in avoid:
            return port


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtllm_pipeline.triton.http_front")
    parser.add_argument("--listen", required=True, help="HOST:PORT clients connect to")
    parser.add_argument("--upstream", required=True, help="HOST:PORT of Triton's own HTTP endpoint")
    parser.add_argument("--limits", required=True, help="contract.RequestLimits as JSON")
    parser.add_argument("--repository", default=None,
                        help="the model repository (its stop side channel, the engine's health marker)")
    parser.add_argument("--allow-host", action="append", default=[], help="a Host name accepted besides the "
                        "listen address, localhost and IP addresses (serving.allowed_hosts)")
    parser.add_argument("command", nargs="+", help="the server command (after --)")
    args = parser.parse_args(argv)
    limits = RequestLimits(**json.loads(args.limits))
    try:
        front = Front(_address(args.listen), _address(args.upstream), limits,
                      stops.address(args.repository) if args.repository else None, repository=args.repository,
                      allowed_hosts=tuple(args.allow_host))
    except OSError as exc:
        print(f"http front: cannot listen on {args.listen}: {exc.strerror} (address already in use?)",
              file=sys.stderr, flush=True)
        return 1
    child = subprocess.Popen(args.command)

    def forward(signum, frame):
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    threading.Thread(target=front.serve_forever, name="http-front", daemon=True).start()
    print(f"http front: {args.listen} -> Triton HTTP at {args.upstream}", file=sys.stderr, flush=True)
    code = child.wait()
    front.shutdown()
    front.server_close()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
