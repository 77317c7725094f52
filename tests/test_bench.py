"""The load generator: exact prompt lengths, closed and open loop, output checks and error counting.

The OpenAI protocol is exercised against a small local server that streams with known delays
(no vLLM or trtllm-serve runs here); the Triton protocols run against a real tritonserver in
test_bench_triton.py.
"""

from __future__ import annotations

import json

import pytest

from bench_stub import FIRST_S, GAP_S, HELD, StubHandler, stub_server
from conftest import CONFIGS, load, run_cli
from trtllm_pipeline import bench
from trtllm_pipeline.bench.client_processes import shares
from trtllm_pipeline.bench.protocols import connect
from trtllm_pipeline.model.builtin import builtin_model_dir
from trtllm_pipeline.errors import InputError, StageFailed, UnavailableError
from trtllm_pipeline.machine import gpus

@pytest.fixture(scope="module")
def tokenizer_dir():
    return builtin_model_dir("tiny-qwen2")


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return bench.load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def stub_url():
    with stub_server() as url:
        yield url


def settings(url, model="stub", **kw) -> bench.BenchSettings:
    base = dict(protocol="openai", url=url, model=model, levels=(bench.LoadLevel(concurrency=1),),
                input_tokens=24, output_tokens=8, requests=6, warmup=1)
    return bench.BenchSettings(**{**base, **kw})


# --------------------------------------------------------------------------- prompts


@pytest.mark.parametrize("n", [2, 17, 128, 1000])
def test_synthetic_prompts_are_exactly_n_tokens_and_distinct(tokenizer, n):
    prompts = bench.synthetic_prompts(tokenizer, 5, n, seed=7)
    assert [len(tokenizer(p)["input_ids"]) for p in prompts] == [n] * 5  # BOS included, as the server counts
    assert len(set(prompts)) == 5
    assert bench.synthetic_prompts(tokenizer, 5, n, seed=7) == prompts  # reproducible from the seed


def test_gsm8k_prompts_are_the_test_questions_in_order(data_dir):
    prompts, source = bench.dataset_prompts("gsm8k", data_dir, 3)
    first = json.loads((data_dir / "gsm8k" / "test.jsonl").read_text().splitlines()[0])["question"]
    assert prompts[0] == first and len(set(prompts)) == 3
    assert str(data_dir) in source


def test_a_prompt_without_room_for_text_is_refused(tokenizer):
    with pytest.raises(InputError, match="special token"):
        bench.synthetic_prompts(tokenizer, 1, 1, seed=0)


# --------------------------------------------------------------------------- load generation


def test_closed_loop_forced_length_and_consistent_metrics(stub_url, tokenizer, tmp_path):
    levels = (bench.LoadLevel(concurrency=1), bench.LoadLevel(concurrency=4))
    out = tmp_path / "r.json"
    result = bench.bench(settings(stub_url, levels=levels, output_tokens=10, requests=8), tokenizer=tokenizer,
                         tokenizer_source="tiny", output=out, gpus=2, gpu_hour_usd=4.0)
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(result.data))
    assert [e["concurrency"] for e in data["summary"]] == [1, 4]
    assert data["settings"]["concurrency"] == [1, 4] and data["settings"]["request_rate"] == []
    for entry in data["summary"]:
        assert entry["requests"] == 8 and entry["errors"] == 0
        assert entry["output_tokens_mean"] == 10 and entry["input_tokens_mean"] == 24
        assert entry["ttft_ms"]["p50"] >= FIRST_S * 1e3 * 0.99  # sleeps never return early: lower bounds
        assert entry["itl_ms"]["p50"] >= GAP_S * 1e3 * 0.99
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            assert set(entry[key]) == {"mean", "p50", "p90", "p99"}
            assert entry[key]["p50"] <= entry[key]["p90"] <= entry[key]["p99"]
        assert entry["output_tokens_per_s"] > 0 and entry["requests_per_s"] > 0
        assert entry["output_tokens_per_s"] == pytest.approx(10 * entry["requests_per_s"], rel=1e-2)
        assert entry["cost"]["gpus"] == 2 and entry["cost"]["gpu_hour_usd"] == 4.0
        # this process's CPU over the level (its client threads), beside the level's wall time
        assert entry["client"]["cpu_s"] > 0 and 0 < entry["client"]["cpu_share"] < 2.5
    assert len(data["requests"]) == 16  # warmup requests are not recorded
    for r in data["requests"]:
        assert r["error"] is None and r["output_tokens"] == 10 and r["output_tokens_retokenized"] == 10
        assert len(r["token_times_ms"]) == 10 and r["token_times_ms"] == sorted(r["token_times_ms"])
        assert r["e2e_ms"] == pytest.approx(r["ttft_ms"] + 9 * r["itl_ms"], rel=0.10)
        assert r["ttft_ms"] == r["token_times_ms"][0]
        # e2e runs to the stream's end: OpenAI's usage chunk, here at once after the last text (the upper bound a
        # few token gaps: a busy 2-core machine delivered it 5.2 ms late once; a wait for anything else, a close or a
        # timeout, would be far past it)
        assert r["token_times_ms"][-1] <= r["e2e_ms"] <= r["token_times_ms"][-1] + 4 * GAP_S * 1e3


def test_tokens_without_text_are_timed_where_the_server_sends_usage_on_every_chunk(stub_url, tokenizer, tmp_path):
    # vLLM's continuous_usage_stats (the bench asks for it): the first HELD tokens come without text, yet the first
    # token's time is the first chunk's, and every token has its time
    result = bench.bench(settings(stub_url, model="stub-held", output_tokens=10, requests=4, warmup=0),
                         tokenizer=tokenizer, tokenizer_source="tiny", output=tmp_path / "r.json")
    for r in result.data["requests"]:
        # (timed by text alone, 10 - HELD times, the first HELD gaps later)
        assert r["error"] is None and r["output_tokens"] == 10 and len(r["token_times_ms"]) == 10
        assert r["token_times_ms"] == sorted(r["token_times_ms"]) and r["ttft_ms"] == r["token_times_ms"][0]
        # (bounds the server's sending sets whatever the client's reading: a first chunk read late on a loaded
        # machine finds the next ones waiting, so the gaps after it can shrink below the server's)
        assert r["ttft_ms"] >= FIRST_S * 1e3 * 0.99 and r["token_times_ms"][HELD] > r["ttft_ms"]
        assert r["token_times_ms"][HELD] >= (FIRST_S + HELD * GAP_S) * 1e3 * 0.99


def test_a_client_keeps_its_connection_across_its_requests(stub_url, tokenizer, tmp_path):
    """Each stream is read to its end, past [DONE], so its connection goes back to the client's pool: four requests
    of one client on one connection, as the OpenAI SDK's (a response left unread closed its connection)."""
    StubHandler.peers.clear()
    result = bench.bench(settings(stub_url, requests=4, warmup=0), tokenizer=tokenizer, tokenizer_source="tiny",
                         output=tmp_path / "r.json")
    assert result.data["summary"][0]["requests"] == 4 and len(StubHandler.peers) == 1


def test_a_server_on_a_cpu_has_no_cost_and_queueing_levels_say_so(stub_url, tokenizer, tmp_path):
    levels = (bench.LoadLevel(concurrency=1), bench.LoadLevel(concurrency=3))
    result = bench.bench(settings(stub_url, levels=levels, requests=3, warmup=0), tokenizer=tokenizer,
                         tokenizer_source="tiny", output=tmp_path / "r.json", device="cpu", server_max_batch=2)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["settings"]["device"] == "cpu" and data["settings"]["server_max_batch_size"] == 2
    assert [e["cost"] for e in data["summary"]] == [None, None]  # as the report: n/a (CPU), never a GPU price
    assert result.cost_lines() == [
        "cost: n/a (CPU): the server computes on this machine's CPU, which a GPU-hour price does not describe"]
    low, high = data["summary"]
    assert "note" not in low
    assert high["note"].startswith("requests queue: concurrency 3 > the server's max batch size 2")


def test_the_served_device_is_the_builds_runtime_on_this_machine(tmp_path):
    from trtllm_pipeline import artifacts

    cfg = load("tiny-qwen2-fp8-tp1")
    assert bench.served_device(cfg, tmp_path) is None  # not built
    engine = artifacts.artifact_paths(tmp_path, cfg.name).engine
    engine.mkdir(parents=True)
    artifacts.write_manifest(engine, {"runtime": "torch"})
    assert bench.served_device(cfg, tmp_path) == ("cuda" if gpus() else "cpu")  # runtime.device: auto
    artifacts.write_manifest(engine, {"runtime": "tensorrt_llm"})
    assert bench.served_device(cfg, tmp_path) == "cuda"


def test_open_loop_levels(stub_url, tokenizer, tmp_path):
    levels = (bench.LoadLevel(request_rate=40.0),)
    result = bench.bench(settings(stub_url, levels=levels, requests=10), tokenizer=tokenizer, tokenizer_source="tiny",
                         output=tmp_path / "r.json")
    (entry,) = result.data["summary"]
    assert entry["request_rate"] == 40.0 and "concurrency" not in entry
    assert entry["requests"] == 10 and entry["errors"] == 0
    assert all(r["request_rate"] == 40.0 for r in result.data["requests"])


@pytest.mark.parametrize("level,jobs,processes", [(bench.LoadLevel(concurrency=64), 384, 4),
                                                   (bench.LoadLevel(concurrency=3), 10, 4),
                                                   (bench.LoadLevel(request_rate=8.0), 3, 4)])
def test_client_process_shares_cover_every_job_once_and_add_up_to_the_level(level, jobs, processes):
    parts = shares(level, list(range(jobs)), processes)
    assert sorted(i for _, positions in parts for i in positions) == list(range(jobs))
    assert len(parts) == min(processes, jobs, level.concurrency or jobs)
    if level.concurrency is not None:
        assert sum(own.concurrency for own, _ in parts) == level.concurrency
    else:
        assert sum(own.request_rate for own, _ in parts) == pytest.approx(level.request_rate)


def test_an_open_loop_level_from_two_client_processes_splits_its_rate(stub_url, tokenizer, tmp_path):
    """Two processes at 20 requests/s each make the level's 40 (Poisson processes add up); every request comes back
    under the level's key, in order, over the OpenAI protocol too."""
    levels = (bench.LoadLevel(request_rate=40.0),)
    result = bench.bench(settings(stub_url, levels=levels, requests=10, client_processes=2), tokenizer=tokenizer,
                         tokenizer_source="tiny", output=tmp_path / "r.json")
    (entry,) = result.data["summary"]
    assert entry["request_rate"] == 40.0 and entry["requests"] == 10 and entry["errors"] == 0
    assert entry["client"]["processes"] == 2
    assert [r["index"] for r in result.data["requests"]] == list(range(1, 11))  # (request 0: the warm-up)
    assert all(r["request_rate"] == 40.0 and r["output_tokens"] == 8 for r in result.data["requests"])


def test_wrong_output_lengths_are_errors_not_data(stub_url, tokenizer, tmp_path):
    out = tmp_path / "r.json"
    with pytest.raises(StageFailed, match="every request failed"):
        bench.bench(settings(stub_url, model="stub-short"), tokenizer=tokenizer, tokenizer_source="tiny", output=out)
    data = json.loads(out.read_text())  # the evidence is still written
    (entry,) = data["summary"]
    assert entry["requests"] == 0 and entry["errors"] == 6
    assert entry["ttft_ms"]["p50"] is None and entry["output_tokens_per_s"] is None and entry["cost"] is None
    assert all("returned 4 tokens, 8 were requested" in r["error"] for r in data["requests"])


def test_server_errors_are_counted(stub_url, tokenizer, tmp_path):
    StubHandler.calls = 0
    result = bench.bench(settings(stub_url, model="stub-flaky", warmup=0, requests=9), tokenizer=tokenizer,
                         tokenizer_source="tiny", output=tmp_path / "r.json")
    (entry,) = result.data["summary"]
    assert entry["errors"] == 3 and entry["requests"] == 6
    failed = [r for r in result.data["requests"] if r["error"]]
    assert len(failed) == 3 and all("HTTP 500" in r["error"] and r["ttft_ms"] is None for r in failed)


def test_connect_errors_say_what_to_do(stub_url):
    with pytest.raises(InputError, match="serves 4 models"):
        connect("openai", stub_url, None, 5)
    with pytest.raises(UnavailableError, match="no server answers"):
        connect("openai", "127.0.0.1:9", "stub", 5)
    with pytest.raises(UnavailableError, match="cannot reach a Triton server"):
        connect("triton-grpc", "127.0.0.1:9", None, 5)


def test_cli_bench_writes_results_and_prints_levels(stub_url, tokenizer_dir, tmp_path):
    out = tmp_path / "cli.json"
    proc = run_cli("bench", "--protocol", "openai", "--url", stub_url, "--model", "stub", "--tokenizer",
                   str(tokenizer_dir), "--concurrency", "1,2", "--requests", "4", "--input-tokens", "16",
                   "--output-tokens", "6", "--gpu-hour-usd", "2.5", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "c=1: 4 ok, 0 errors" in proc.stdout and "c=2: 4 ok, 0 errors" in proc.stdout
    assert "per 1M output tokens" in proc.stdout and f"results: {out}" in proc.stdout
    data = json.loads(out.read_text())
    assert data["settings"]["gpu_hour_usd"] == 2.5 and data["settings"]["gpus"] == 1


def test_cli_bench_usage_errors_exit_2(tmp_path):
    proc = run_cli("bench", "--url", "127.0.0.1:9", "-o", str(tmp_path / "x.json"))
    assert proc.returncode == 2 and "--tokenizer" in proc.stderr
    proc = run_cli("bench", "--concurrency", "1,x", "--tokenizer", "t", "-o", "x.json")
    assert proc.returncode == 2 and "comma-separated" in proc.stderr
    proc = run_cli("bench", "--in-process", "-c", "x.yaml", "--prompts", "6")  # (refused before the config is read)
    assert proc.returncode == 2 and "--prompts goes with --speculative" in proc.stderr


def test_in_process_bench_times_decode_steps_by_batch_and_context(built, engines_dir, tmp_path):
    built("tiny-qwen2-fp8-tp1")
    out = tmp_path / "inprocess.json"
    proc = run_cli("bench", "--in-process", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp1.yaml"), "--engines-dir",
                   str(engines_dir), "--batch", "1,3", "--context", "16,100", "--output-tokens", "30", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["schema"] == "inprocess-1" and data["runtime"]["runtime"] == "torch"
    assert [(r["batch"], r["context"]) for r in data["runs"]] == [(1, 16), (3, 16), (1, 100), (3, 100)]
    for r in data["runs"]:
        assert r["steps_timed"] == 30 - 1 - 16  # every all-rows decode step after the 16 warm-up ones
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * 1000 / r["decode_ms"])
        assert 0 < r["decode_ms"] <= r["decode_ms_p90"] and r["prefill_ms"] > 0
        assert r["bytes_per_step"] == data["runtime"]["weight_bytes"] + r["batch"] * (
            r["context"] + 16 + r["steps_timed"] // 2) * data["runtime"]["kv_bytes_per_token"]
        assert r["fraction_of_floor"] is None and r["peak_memory_gib"] is None  # CPU: no copy-bandwidth floor
        assert r["steps"] > r["steps_timed"] and r["chained_steps"] == 0  # CPU: no fast path, nothing chained
        # the whole batch: its prefill and all 30 steps, within which the timed steps lie (at least half of them
        # as long as their median)
        assert r["whole_tokens_per_s"] == pytest.approx(r["batch"] * 30 / r["whole_s"])
        assert r["whole_s"] * 1000 >= r["steps_timed"] // 2 * r["decode_ms"]
    assert "ms/step" in proc.stdout and "runtime torch on cpu" in proc.stdout

    too_big = run_cli("bench", "--in-process", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp1.yaml"), "--engines-dir",
                      str(engines_dir), "--batch", "64", "--context", "16", "--output-tokens", "30", "-o", str(out))
    assert too_big.returncode == 2 and "build.max_batch_size" in too_big.stderr


def test_throughput_bench_runs_requests_through_the_scheduler_and_the_shared_prefix_with_and_without_reuse(
        built, engines_dir, tmp_path):
    built("tiny-qwen2-fp8-tp1")
    out = tmp_path / "throughput.json"
    proc = run_cli("bench", "--in-process", "--throughput", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp1.yaml"),
                   "--engines-dir", str(engines_dir), "--lengths", "12/6", "--shared-prefix", "64", "--requests", "10",
                   "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["schema"] == "throughput-1" and data["reference"]["output_tokens_per_s"]["128/2048"] == 26221
    off, on = data["runs"]
    assert (off["reuse"], on["reuse"]) == (False, True) and on["same_outputs_as_without_reuse"]
    assert on["same_output_share"] == 1.0 and on["first_difference_mean"] is None
    for r in (off, on):
        assert r["output_tokens_total"] == 10 * 6 and r["requests"] == 10 and r["shared_prefix"] == 64
        assert r["output_tokens_per_s"] == pytest.approx(60 / r["seconds"])
        assert 0 < r["ttft_ms"]["p50"] <= r["ttft_ms"]["p99"] and r["itl_ms"]["p50"] > 0
        assert 0 < r["kv_usage_peak"] <= 1 and r["preemptions"] == 0
        # what the engine holds throughout (weights, embedding, KV pool); the peak above it only on a GPU
        resident = sum(data["runtime"]["ranks"][0]["memory"].values()) / 2**30
        assert resident > 0 and r["resident_gib"] == pytest.approx(resident) and r["workspace_gib"] is None
        # the host's ms a step by phase, within the step's wall time; every prompt token through the eager forward
        host = r["host_ms_per_step"]
        assert set(host) == {"plan", "eager", "fast"} and all(v >= 0 for v in host.values())
        assert 0 < sum(host.values()) <= r["wall_ms_per_step"] == pytest.approx(1000 * r["seconds"] / r["steps"])
        assert r["graph_prefills"] == 0 and r["eager_tokens"] > 0  # (no CUDA: no prefill graphs)
    assert off["prefix_cache_hits"] == 0 and on["prefix_cache_hits"] > 0  # the 64-token prompt reused
    assert "out tok/s" in proc.stdout and "reference only" in proc.stdout
    assert "12/6 with reuse: 100.0% of greedy outputs identical to those without" in proc.stdout
    from types import SimpleNamespace

    from trtllm_pipeline import report  # (its build section's throughput part reads only these files)

    section = "\n".join(report._throughput_section(SimpleNamespace(throughput=[(out, data)])))
    assert "identical to those without (12/6, runtime.batch_invariant off): 100.0%" in section
    bad = run_cli("bench", "--in-process", "--throughput", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp1.yaml"),
                  "--engines-dir", str(engines_dir), "--lengths", "12", "-o", str(out))
    assert bad.returncode == 2 and "INPUT/OUTPUT" in bad.stderr


def test_throughput_bench_takes_the_runs_batch_and_prefill_chunk(built, engines_dir, tmp_path):
    """``--max-batch-size`` and ``--prefill-chunk-tokens`` set the torch runtime's rows a step and prompt tokens a
    step for this run (the config's build.max_batch_size 8 and runtime.prefill_chunk_tokens 2048 stay in the file):
    the results say what ran. In-process options only."""
    built("tiny-qwen2-fp8-tp1")
    out = tmp_path / "throughput.json"
    cfg = str(CONFIGS / "tiny-qwen2-fp8-tp1.yaml")
    proc = run_cli("bench", "--in-process", "--throughput", "-c", cfg, "--engines-dir", str(engines_dir),
                   "--lengths", "40/3", "--requests", "7", "--max-batch-size", "3", "--prefill-chunk-tokens", "32",
                   "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["runtime"]["max_batch_size"] == 3 and data["runtime"]["prefill_chunk_tokens"] == 32
    assert data["runtime"]["kv_pool"]["tokens"] == 3 * 8192  # the CPU's pool: that many sequences of max_seq_len
    assert data["runs"][0]["output_tokens_total"] == 7 * 3
    served = run_cli("bench", "-c", cfg, "--engines-dir", str(engines_dir), "--max-batch-size", "3")
    assert served.returncode == 2 and "go with --in-process" in served.stderr


def test_long_prompt_beside_running_decodes_is_prefilled_in_chunks_while_every_decode_keeps_its_token(
        built, engines_dir, tmp_path):
    """Issue 31: a long prompt submitted beside decoding requests takes ceil(prompt / budget) steps, the budget being
    what max_num_tokens leaves beside the decodes, and every running request gets a token in each of them."""
    import math

    from trtllm_pipeline import report

    built("tiny-qwen2-fp8-tp1")
    # the same build (the config's name), run with a 16-token step so that a 200-token prompt takes many chunks
    config = tmp_path / "tiny-qwen2-fp8-tp1.yaml"
    text = (CONFIGS / "tiny-qwen2-fp8-tp1.yaml").read_text()
    assert "max_num_tokens: 8192" in text
    config.write_text(text.replace("max_num_tokens: 8192", "max_num_tokens: 16"))
    out = tmp_path / "long.json"
    proc = run_cli("bench", "--in-process", "--throughput", "-c", str(config), "--engines-dir", str(engines_dir),
                   "--lengths", "8/64", "--requests", "4", "--long-prompt", "200", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["schema"] == "throughput-1" and data["runs"] == [] and data["settings"]["long_prompt"] == 200
    lp = data["long_prompt"]
    assert (lp["prompt_tokens"], lp["decoding_requests"], lp["max_num_tokens"]) == (200, 4, 16)
    budget = 16 - 4  # the scheduler: each decode's one token first, the prefill chunk in what is left
    assert lp["chunk_budget"] == budget and lp["expected_chunks"] == math.ceil(200 / budget) == 17
    assert lp["prefill_chunks"] == lp["prefill_steps"] == 17  # admitted at once, a chunk every step
    assert lp["chunk_tokens"] == [budget] * 16 + [200 - 16 * budget]
    # never stalled: every running request got a token in every step of the prefill
    assert lp["decode_rows_without_token"] == 0 and lp["preemptions"] == 0
    assert lp["tokens_during_prefill"] == {"min": 17, "max": 17}
    assert lp["worst_gap_ms"] >= lp["p99_gap_ms"] > 0 and lp["steady_itl_ms"]["p50"] > 0
    assert lp["chunk_step_ms"]["p50"] > 0 and lp["limit_ms"] == pytest.approx(
        lp["chunk_step_ms"]["max"] + lp["steady_itl_ms"]["p50"])
    assert lp["within_one_chunk"] == (lp["worst_gap_ms"] <= lp["limit_ms"])  # the verdict, whatever the CPU's timing
    assert "long prompt: 200 tokens beside 4 decoding requests" in proc.stdout and "chunks 17 (plan 17)" in proc.stdout
    assert "17 / 17" in "\n".join(report._long_prompt_table(lp))

    for args, fix in ((("--lengths", "8/64", "--long-prompt", "200"), "--throughput"),  # without --throughput
                      (("--throughput", "--lengths", "8/64", "--long-prompt", "9000"), "--long-prompt 6144 or less"),
                      (("--throughput", "--lengths", "8/20", "--long-prompt", "200"), "--lengths 8/61 or longer")):
        bad = run_cli("bench", "--in-process", *args, "-c", str(config), "--engines-dir", str(engines_dir),
                      "-o", str(tmp_path / "bad.json"))
        assert bad.returncode == 2 and fix in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_throughput_probe_counts_overlapping_device_intervals_once():
    """benchmarks/throughput_probe.py's GPU busy share over a trace: the union of the kernels' intervals (two streams'
    overlapping ones once) over the span from the first start to the last end; an idle gap is what it leaves out."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from throughput_probe import busy_share

    assert busy_share([(0, 10), (5, 12), (20, 30)]) == (22 / 30, 30)
    assert busy_share([(3, 4), (0, 10)]) == (1.0, 10)  # nested: one interval
    assert busy_share([]) == (0.0, 0.0)
