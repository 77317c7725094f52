"""A short soak of the served tiny model (loopback): valid streams, malformed and poison requests, and
clients that go away, all at once. The 60 s, 64-stream version is ``benchmarks/soak.py``."""

from __future__ import annotations

import sys
import time
import urllib.request

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import soak  # noqa: E402  (benchmarks/soak.py: the driver both share)

pytestmark = pytest.mark.slow

SECONDS = 25  # the whole test stays well under 90 s


def test_soak_valid_streams_beside_malformed_poison_and_disconnects(served):
    server = served("tiny-qwen2-fp8-tp1")
    target = soak.Target("127.0.0.1", server.http_port, server.grpc_port, server.metrics_port)
    run = soak.Soak(target, streams=32, malformed=0.2, disconnect_every=2.0, lengths=(8, 48))
    before = run.wait_idle()
    start = time.monotonic()
    run.phase(SECONDS, name="soak", hostile=True)
    after = run.wait_idle(timeout=30)
    figures = run.figures()
    assert time.monotonic() - start < 80

    valid = figures["soak"]
    assert valid["valid_requests"] >= 32 and valid["valid_lost"] == 0, [  # each got all its tokens
        (v["protocol"], v["model"], v["error"]) for v in valid["lost_examples"]]
    malformed = figures["malformed"]
    assert malformed["requests"] >= 10 and malformed["refused_pct"] == 100.0, malformed["not_refused"]
    assert {"5 MB prompt", "NaN temperature", "truncated JSON"} <= set(malformed["kinds"])
    gone = figures["disconnects"]
    assert gone["count"] >= 5 and gone["freed"] == gone["count"], gone
    # Steps counted while the front notices a closed socket: on two loaded cores the tiny model's ms steps run on
    # while it waits for CPU (p50 4 with a second test run beside this one; 3 alone and on the H200's soak), so the
    # step bound has room; the seconds are the bound that holds anywhere
    assert gone["seconds_to_free"]["p99"] < 2.0 and gone["steps_to_free"]["p50"] <= 6, gone
    assert not figures["errors"]
    # Healthy afterwards: ready, nothing left running, no request failed inside a step.
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v2/health/ready", timeout=5) as response:
        assert response.status == 200
    assert after["requests_active"] == 0
    assert after["requests_failed_total"] == before["requests_failed_total"]
