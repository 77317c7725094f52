"""A small OpenAI-compatible streaming server with known delays, for load-generator tests.

No vLLM or trtllm-serve runs on this machine; this serves ``/v1/models`` and a streamed
``/v1/completions`` exactly as they do (SSE over chunked HTTP/1.1, a final usage block, ``[DONE]``),
with a fixed time to first token and gap between tokens.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

FIRST_S, GAP_S = 0.03, 0.005  # time to first token and gap between tokens
HELD = 3  # stub-held: its first tokens' chunks carry no text


class StubHandler(BaseHTTPRequestHandler):
    """/v1/completions streaming one word per chunk: ``stub`` honours max_tokens, ``stub-short``
    returns half of them, ``stub-flaky`` answers every third request with HTTP 500; these send the usage once, at
    the end, as servers without vLLM's ``continuous_usage_stats`` do. ``stub-held`` has it: the usage so far on every
    chunk, and its first ``HELD`` tokens' chunks carry no text (held back, as a detokenizer holds partial UTF-8)."""

    protocol_version = "HTTP/1.1"  # chunked transfer, as real servers stream SSE
    # Nagle off, as real servers' streams have it (uvicorn, this project's fronts): on a kept-alive connection a chunk
    # would otherwise wait for the client's delayed ACK of the one before
    disable_nagle_algorithm = True
    calls = 0
    peers: set = set()  # (host, port) of each connection a request came on
    lock = threading.Lock()

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, payload: str) -> None:
        data = f"data: {payload}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        self._json(200, {"data": [{"id": "stub"}, {"id": "stub-short"}, {"id": "stub-flaky"}, {"id": "stub-held"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            type(self).calls += 1
            call = self.calls
            self.peers.add(self.client_address)
        if body["model"] == "stub-flaky" and call % 3 == 0:
            return self._json(500, {"error": "overloaded"})
        assert body["stream"] and body["stream_options"]["include_usage"]
        assert body["min_tokens"] == body["max_tokens"] and body["ignore_eos"]
        n = body["max_tokens"] // 2 if body["model"] == "stub-short" else body["max_tokens"]
        continuous = body["model"] == "stub-held" and body["stream_options"].get("continuous_usage_stats")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        time.sleep(FIRST_S)
        for k in range(n):
            if k:
                time.sleep(GAP_S)
            chunk = {"choices": [{"index": 0, "text": "" if continuous and k < HELD else " the"}]}
            if continuous:
                chunk["usage"] = {"prompt_tokens": 1, "completion_tokens": k + 1, "total_tokens": k + 2}
            self._chunk(json.dumps(chunk))
        self._chunk(json.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n}}))
        self._chunk("[DONE]")
        self.wfile.write(b"0\r\n\r\n")


class QuietServer(ThreadingHTTPServer):
    """Load generators drop connections on purpose (timeouts, cancellation): no traceback in the test output."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def stub_server() -> Iterator[str]:
    """Serve StubHandler on a free loopback port; yields ``host:port``."""
    server = QuietServer(("127.0.0.1", 0), StubHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
