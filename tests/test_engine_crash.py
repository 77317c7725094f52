"""The engine model's process dies (on the H200 a segmentation fault in the stub's ``send`` did this): Triton 2.51
still says the model is ready and a streaming request waiting on it waited for ever. With ``health``'s record of
the engine's process, the waiting request ends with an error naming the crash and readiness answers 503."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import free_ports, load

from trtllm_pipeline import artifacts, serve
from trtllm_pipeline.client import ServerError, TritonClient
from trtllm_pipeline.triton import health

pytestmark = pytest.mark.slow

NAME = "tiny-qwen2-bf16-tp1"  # a config no other test serves (one server per config at a time)


def _ready_status(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_crashed_engine_process_ends_the_waiting_stream_with_the_reason_and_readiness_turns_503(built, engines_dir):
    built(NAME)
    cfg = load(NAME)
    http, grpc, metrics, openai = free_ports(4)
    server = serve.start(cfg, engines_dir=engines_dir, http=http, grpc=grpc, metrics=metrics, openai=openai)
    try:
        alive = artifacts.ArtifactPaths(engines_dir / NAME).serve_state / health.ALIVE
        pid = json.loads(alive.read_text())["pid"]
        assert b"triton_python_backend_stub" in open(f"/proc/{pid}/cmdline", "rb").read()
        address = f"127.0.0.1:{grpc}"
        with TritonClient(address) as client:
            assert client.generate("Hello", max_tokens=4)  # served before the crash
        assert _ready_status(http) == 200

        pieces, outcome = [], {}
        first = threading.Event()

        def stream() -> None:
            try:
                with TritonClient(address) as client:
                    for piece in client.stream("Once upon a time", max_tokens=400, min_tokens=400):
                        pieces.append(piece)
                        first.set()
                outcome["ended"] = "complete"
            except ServerError as exc:
                outcome["ended"] = str(exc)
            first.set()

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert first.wait(60)
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        reader.join(60)
        assert not reader.is_alive(), "the stream still waits on an engine that is gone"
        assert "engine model's process" in outcome["ended"] and f"pid {pid}" in outcome["ended"]
        assert time.monotonic() - started < 30
        assert 0 < len(pieces) < 400
        assert _ready_status(http) == 503
    finally:
        serve.stop(cfg, engines_dir=engines_dir)
    assert not serve.group_alive(server.pid)
