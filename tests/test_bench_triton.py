"""bench against a real tritonserver serving the tiny model with the torch runtime (the issue's check)."""

from __future__ import annotations

import json
import os

import pytest

from conftest import load, run_cli
from test_serve import wait_idle
from trtllm_pipeline import bench
from trtllm_pipeline.bench.client_processes import auto_processes
from trtllm_pipeline.bench.load import Job, run_level
from trtllm_pipeline.bench.protocols import connect
from trtllm_pipeline.bench.settings import LoadLevel
from trtllm_pipeline.errors import StageFailed
from trtllm_pipeline.machine import gpus

pytestmark = pytest.mark.slow
NAME = "tiny-qwen2-fp8-tp1"


def test_grpc_concurrency_1_and_8_exact_lengths_and_consistent_latency(served, engines_dir, tmp_path):
    server = served(NAME)
    # an earlier test's abandoned stream may still be stepping, its steps then counted in this test's levels (seen
    # once: 218 steps for 192 tokens at c=1): the bench starts once the engine runs no request
    assert wait_idle(server)["requests_active"] == 0, "the shared server still runs requests after 30 s"
    out = tmp_path / "bench.json"
    proc = run_cli("bench", "-c", f"build_configs/{NAME}.yaml", "--engines-dir", str(engines_dir),
                   "--concurrency", "1,8", "--requests", "8", "--warmup", "1", "--input-tokens", "48",
                   "--output-tokens", "24", "--client-processes", "2", "-o", str(out))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    data = json.loads(out.read_text())
    assert data["settings"]["url"] == f"127.0.0.1:{server.grpc_port}"  # found from the running server's state
    assert data["settings"]["protocol"] == "triton-grpc" and data["settings"]["model"] == "tensorrt_llm_bls"
    assert [e["concurrency"] for e in data["summary"]] == [1, 8]
    for entry in data["summary"]:
        assert entry["requests"] == 8 and entry["errors"] == 0
        assert entry["client"]["processes"] == min(2, entry["concurrency"])  # spawned from `python -m` too
        assert entry["output_tokens_mean"] == 24 and entry["input_tokens_mean"] == 48
        assert entry["ttft_ms"]["p50"] > 0 and entry["itl_ms"]["p50"] > 0
        assert entry["output_tokens_per_s"] > 0 and "note" not in entry  # 8 = the build's batch: nothing queues
        # The server's own counters around the level: every measured token came from one of its steps, and a
        # step carries at most the level's concurrency of them (other tests' requests may share the server).
        server = entry["server"]
        assert server["steps"] >= 23 and 1 <= server["tokens_per_step"] <= 8 and server["ms_per_step"] > 0
        # and the engine's step totals: on the CPU nothing chains and every prompt token runs eagerly, in a share
        # of the level's time that one loop cannot exceed
        if data["settings"]["device"] == "cpu":
            assert server["chained_steps"] == 0 and server["fast_prefill_chunks"] == 0
            assert server["eager_tokens"] >= 8 * 48 and 0 < server["eager_share"] <= 1.05
            # the engine's own time to first token is part of the client's (which adds the BLS and the network)
            assert 0 < server["engine_ttft_ms_mean"] <= entry["ttft_ms"]["mean"]
        # and the parts of it in front of the engine: Triton's queue for the BLS, the BLS to its send on the engine's
        # socket, the socket to the engine queueing the request (each request's inside the client's TTFT)
        assert server["triton_queue_ms_mean"] >= 0
        assert 0 < server["bls_submit_ms_mean"] < entry["ttft_ms"]["mean"]
        assert 0 <= server["engine_socket_ms_mean"] < entry["ttft_ms"]["mean"]
        assert "in front, ms: Triton queue" in proc.stdout
        assert "chained" in proc.stderr + proc.stdout
        assert "ms/step" in proc.stderr + proc.stdout
    # the server computes on this machine: on its CPU no GPU price applies (as the report says)
    assert data["settings"]["device"] == ("cuda" if gpus() else "cpu")
    if data["settings"]["device"] == "cpu":
        assert all(e["cost"] is None for e in data["summary"]) and "cost: n/a (CPU)" in proc.stdout
    else:
        assert all(e["cost"]["gpus"] == 1 for e in data["summary"])
    assert len(data["requests"]) == 16
    for r in data["requests"]:
        assert r["error"] is None
        assert r["output_tokens"] == 24 and len(r["token_times_ms"]) == 24  # one streamed response per token
        assert r["input_tokens"] == 48
        assert r["ttft_ms"] > 0 and r["itl_ms"] > 0
        assert r["e2e_ms"] == pytest.approx(r["ttft_ms"] + 23 * r["itl_ms"], rel=0.10)
        assert r["output_tokens_retokenized"] > 0  # re-encoding may merge or split: reported, not asserted


def test_http_streaming_protocol(served, engines_dir, tmp_path):
    server = served(NAME)
    cfg = load(NAME)
    tokenizer = bench.load_tokenizer(bench.config_tokenizer_dir(cfg, engines_dir))
    settings = bench.BenchSettings(protocol="triton-http", url=f"127.0.0.1:{server.http_port}",
                                   levels=(bench.LoadLevel(concurrency=2), bench.LoadLevel(request_rate=4.0)),
                                   input_tokens=32, output_tokens=12, requests=4, warmup=0)
    result = bench.bench(settings, tokenizer=tokenizer, tokenizer_source="checkpoint", output=tmp_path / "h.json")
    for entry in result.data["summary"]:
        assert entry["requests"] == 4 and entry["errors"] == 0 and entry["output_tokens_mean"] == 12
    assert all(len(r["token_times_ms"]) == 12 for r in result.data["requests"])


def test_a_level_sent_from_two_client_processes_keeps_its_concurrency_and_order(served, engines_dir):
    """``processes=2``: concurrency 4 as two processes of 2 streams each, started together; the results come back in
    job order under the level's own key, timed on one clock (the two processes' requests overlap)."""
    server = served(NAME)
    tokenizer = bench.load_tokenizer(bench.config_tokenizer_dir(load(NAME), engines_dir))
    endpoint = connect("triton-grpc", f"127.0.0.1:{server.grpc_port}", None, 120.0)
    jobs = [Job(i, f"Request {i}: tell me about the sea.", 0) for i in range(8)]
    client: dict = {}
    results = run_level(endpoint, jobs, LoadLevel(concurrency=4), 12, tokenizer, client_cpu=client, processes=2)
    assert [r.index for r in results] == list(range(8)) and all(r.level == {"concurrency": 4} for r in results)
    assert all(r.ok and r.output_tokens == 12 and len(r.token_times) == 12 for r in results)
    assert all(r.output_tokens_retokenized for r in results)  # re-encoded here, from the text the processes sent back
    assert client["processes"] == 2 and client["cpu_s"] > 0 and client["cpu_share"] > 0
    # jobs alternate between the processes (round robin): requests of both were in flight at once, never over 4
    in_flight = max(sum(r.start <= s.start < r.end for r in results) for s in results)
    assert 3 <= in_flight <= 4, [(r.start, r.end) for r in results]


def test_auto_client_processes_one_per_16_streams_within_a_quarter_of_the_cores():
    cores = len(os.sched_getaffinity(0))
    assert auto_processes(LoadLevel(concurrency=1), 32) == 1
    assert auto_processes(LoadLevel(concurrency=64), 384) == max(1, min(4, cores // 4))
    assert auto_processes(LoadLevel(concurrency=64), 2) <= 2  # never more processes than jobs


def test_server_errors_are_counted_not_hidden(served, engines_dir, tmp_path):
    """Prompts longer than the engine takes are refused by the server: every request is an error."""
    server = served(NAME)
    cfg = load(NAME)
    tokenizer = bench.load_tokenizer(bench.config_tokenizer_dir(cfg, engines_dir))
    settings = bench.BenchSettings(protocol="triton-grpc", url=f"127.0.0.1:{server.grpc_port}",
                                   levels=(bench.LoadLevel(concurrency=2),), input_tokens=cfg.build.max_input_len + 8,
                                   output_tokens=4, requests=3, warmup=0)
    out = tmp_path / "errors.json"
    with pytest.raises(StageFailed, match="every request failed"):
        bench.bench(settings, tokenizer=tokenizer, tokenizer_source="checkpoint", output=out)
    (entry,) = json.loads(out.read_text())["summary"]
    assert entry["errors"] == 3 and entry["requests"] == 0 and entry["itl_ms"]["p50"] is None
