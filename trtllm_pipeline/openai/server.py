"""The OpenAI front as a process: ``python -m trtllm_pipeline.openai.server --listen HOST:PORT ...``.

``serve`` starts it beside tritonserver (its own process and process group, recorded in the serve
record, stopped by ``serve --stop``); it reaches Triton's gRPC endpoint on loopback. It binds its
port first and reports a taken one with exit status 1 before loading anything, then loads the
build's tokenizer (the chat template, exact token counts) and serves with uvicorn until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

from trtllm_pipeline.endpoints import allowed_host_names
from trtllm_pipeline.openai.reasoning import PARSERS

GRACEFUL_S = 5  # in-flight requests get this long at SIGTERM; then they are cancelled upstream
# Slow clients (slowloris): a request's line and headers must arrive within HEADER_TIMEOUT_S of the connection
# (or of the previous answer), its body within app.BODY_TIMEOUT_S; an idle connection is closed after
# KEEP_ALIVE_S; at most MAX_CONNECTIONS are open (more are closed at once), and over MAX_REQUESTS running
# requests a new one is answered 503.
HEADER_TIMEOUT_S = 20.0
KEEP_ALIVE_S = 5
MAX_CONNECTIONS = 512
MAX_REQUESTS = 512


def command(*, host: str, port: int, grpc_url: str, tokenizer_dir: str | Path, limits: dict, model_id: str,
            aliases: list[str], reasoning_parser: str, repository: str | Path | None = None,
            allowed_hosts: list[str] = ()) -> list[str]:
    """The argument list ``serve`` launches."""
    bracketed = f"[{host}]" if ":" in host else host
    cmd = [sys.executable, "-m", "trtllm_pipeline.openai.server", f"--listen={bracketed}:{port}",
           f"--triton-grpc={grpc_url}", f"--tokenizer={tokenizer_dir}", f"--limits={json.dumps(limits, sort_keys=True)}",
           f"--model-id={model_id}", f"--reasoning-parser={reasoning_parser}"]
    cmd += [f"--repository={repository}"] if repository is not None else []
    cmd += [f"--allow-host={name}" for name in allowed_hosts]
    return cmd + [f"--alias={alias}" for alias in aliases if alias != model_id]


def listening_socket(host: str) -> socket.socket:
    """The front's TCP socket, to bind. Made with its protocol named (``IPPROTO_TCP``, not the default 0): asyncio
    turns Nagle's algorithm off (TCP_NODELAY) only on connections of such a socket, and a stream writes one small
    chunk per token: with Nagle on, a chunk written while the previous one is unacknowledged waits for its ACK, which
    the client may delay up to 40 ms (Linux). Seen here: the second streamed request on a kept-alive connection got
    its response headers at 10 ms, then its first 15-19 tokens at once after ~40 ms."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtllm_pipeline.openai.server")
    parser.add_argument("--listen", required=True, help="HOST:PORT the /v1 endpoints bind")
    parser.add_argument("--triton-grpc", required=True, help="HOST:PORT of Triton's gRPC endpoint")
    parser.add_argument("--tokenizer", required=True, help="the build's tokenizer directory")
    parser.add_argument("--limits", required=True, help="contract.RequestLimits as JSON (the deployment's)")
    parser.add_argument("--model-id", required=True, help="the model name /v1/models lists")
    parser.add_argument("--alias", action="append", default=[], help="another name requests may use")
    parser.add_argument("--reasoning-parser", choices=PARSERS, default="none")
    parser.add_argument("--repository", default=None, help="the model repository (the engine's health marker)")
    parser.add_argument("--allow-host", action="append", default=[], help="a Host name accepted besides the "
                        "listen address, localhost and IP addresses (serving.allowed_hosts)")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    host = host.strip("[]")
    sock = listening_socket(host)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        print(f"openai front: cannot listen on {args.listen}: {exc.strerror} (address already in use?)",
              file=sys.stderr, flush=True)
        return 1

    import uvicorn
    from transformers import AutoTokenizer

    from trtllm_pipeline.console import quiet
    from trtllm_pipeline.openai.app import create_app
    from trtllm_pipeline.openai.upstream import Upstream
    from trtllm_pipeline.triton.contract import RequestLimits

    with quiet():
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    upstream = Upstream(args.triton_grpc)
    app = create_app(upstream, tokenizer, RequestLimits(**json.loads(args.limits)), args.model_id,
                     aliases=tuple(args.alias), reasoning_parser=args.reasoning_parser, repository=args.repository,
                     allowed_hosts=allowed_host_names(host, args.allow_host))
    print(f"openai front: http://{args.listen}/v1 -> Triton gRPC at {args.triton_grpc} (model {args.model_id}); "
          f"chat page: http://{args.listen}/chat",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=GRACEFUL_S, backlog=1024,
                            access_log=False, http=guarded_protocol(), timeout_keep_alive=KEEP_ALIVE_S,
                            limit_concurrency=MAX_REQUESTS, h11_max_incomplete_event_size=64 * 1024)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        upstream.close()
    return 0


def guarded_protocol():
    """uvicorn's h11 protocol with what it lacks against slow clients: a deadline for a request's headers (uvicorn
    times out only idle connections, and any byte resets that) and a bound on open connections."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Guarded(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > MAX_CONNECTIONS:
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            self._headers_due = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

        def _disarm(self) -> None:
            if (due := getattr(self, "_headers_due", None)) is not None:
                due.cancel()
                self._headers_due = None

        def _headers_late(self) -> None:
            if self.cycle is None or self.cycle.response_complete:  # no request under way: its headers are late
                self.transport.close()

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's headers arrived
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._disarm()
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return Guarded


if __name__ == "__main__":
    sys.exit(main())
