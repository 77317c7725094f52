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

from trtllm_pipeline.openai.reasoning import PARSERS

GRACEFUL_S = 5  # in-flight requests get this long at SIGTERM; then they are cancelled upstream


def command(*, host: str, port: int, grpc_url: str, tokenizer_dir: str | Path, limits: dict, model_id: str,
            aliases: list[str], reasoning_parser: str) -> list[str]:
    """The argument list ``serve`` launches."""
    bracketed = f"[{host}]" if ":" in host else host
    cmd = [sys.executable, "-m", "trtllm_pipeline.openai.server", f"--listen={bracketed}:{port}",
           f"--triton-grpc={grpc_url}", f"--tokenizer={tokenizer_dir}", f"--limits={json.dumps(limits, sort_keys=True)}",
           f"--model-id={model_id}", f"--reasoning-parser={reasoning_parser}"]
    return cmd + [f"--alias={alias}" for alias in aliases if alias != model_id]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtllm_pipeline.openai.server")
    parser.add_argument("--listen", required=True, help="HOST:PORT the /v1 endpoints bind")
    parser.add_argument("--triton-grpc", required=True, help="HOST:PORT of Triton's gRPC endpoint")
    parser.add_argument("--tokenizer", required=True, help="the build's tokenizer directory")
    parser.add_argument("--limits", required=True, help="contract.RequestLimits as JSON (the deployment's)")
    parser.add_argument("--model-id", required=True, help="the model name /v1/models lists")
    parser.add_argument("--alias", action="append", default=[], help="another name requests may use")
    parser.add_argument("--reasoning-parser", choices=PARSERS, default="none")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    host = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
                     aliases=tuple(args.alias), reasoning_parser=args.reasoning_parser)
    print(f"openai front: http://{args.listen}/v1 -> Triton gRPC at {args.triton_grpc} (model {args.model_id}); "
          f"chat page: http://{args.listen}/chat", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=GRACEFUL_S, backlog=1024,
                            access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        upstream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
