"""The OpenAI front of a real deployment (tritonserver, the tiny FP8 model, torch runtime) driven by the
official ``openai`` client: the session's served fixture, no server of its own."""

from __future__ import annotations

import threading
import time

import openai
import pytest
import requests
from conftest import REPO, load, run_cli
from test_serve import post_stream_then_close, runtime_metrics, wait_idle

from trtllm_pipeline import bench
from trtllm_pipeline.chat import encode_prompt
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime

pytestmark = pytest.mark.slow

NAME = "tiny-qwen2-fp8-tp1"
QUESTION = "What is 2+2?"


@pytest.fixture(scope="module")
def server(served):
    return served(NAME)


@pytest.fixture(scope="module")
def base_url(server) -> str:
    return f"http://127.0.0.1:{server.openai_port}/v1"


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def chat(client, **kw):
    return client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTION}], **kw)


def test_streamed_chat_equals_the_whole_answer_and_in_process_generate(server, client, engines_dir):
    assert [m.id for m in client.models.list()] == [NAME]
    whole = chat(client, max_tokens=24, temperature=0)
    deltas, usage = [], None
    for chunk in chat(client, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            deltas.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(deltas) == whole.choices[0].message.content and len(deltas) > 1
    assert usage.completion_tokens == whole.usage.completion_tokens
    runtime = load_runtime(load(NAME), engines_dir)
    try:  # the same ids and text as `generate` in-process: the template applied the same way, tokens counted exactly
        ids = encode_prompt(runtime.tokenizer, QUESTION, raw=False)
        expected = runtime.generate([ids], SamplingParams(max_tokens=24))[0]
    finally:
        runtime.close()
    assert whole.choices[0].message.content == expected.text
    assert whole.usage.prompt_tokens == usage.prompt_tokens == len(ids)
    assert whole.usage.completion_tokens == len(expected.token_ids)
    assert whole.choices[0].finish_reason == ("length" if len(expected.token_ids) == 24 else "stop")


def test_forced_length_gives_exact_usage_streamed_and_not(client):
    forced = {"max_tokens": 16, "extra_body": {"min_tokens": 16, "ignore_eos": True}}
    assert chat(client, temperature=0, **forced).usage.completion_tokens == 16
    last = list(client.completions.create(model=NAME, prompt="Hello", stream=True, temperature=0.8, seed=5,
                                          stream_options={"include_usage": True}, **forced))[-1]
    assert last.usage.completion_tokens == 16 and last.usage.prompt_tokens == 2
    sampled = client.completions.create(model=NAME, prompt="Hello", temperature=0.8, seed=5, top_p=0.95, **forced)
    again = client.completions.create(model=NAME, prompt="Hello", temperature=0.8, seed=5, top_p=0.95, **forced)
    assert sampled.choices[0].text == again.choices[0].text  # seeded sampling is reproducible
    assert sampled.choices[0].finish_reason == "length"


def test_bad_requests_are_4xx_with_a_message_and_the_server_keeps_serving(server, client, base_url):
    cfg = load(NAME)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        chat(client, max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="max_input_len"):
        client.completions.create(model=NAME, prompt="hello " * (cfg.build.max_input_len + 10), max_tokens=4)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        chat(client, n=2)
    url = f"{base_url}/chat/completions"
    missing = requests.post(url, json={"model": NAME, "max_tokens": 4}, timeout=30)
    malformed = requests.post(url, data=b'{"model": "x", "messages": [', headers={"Content-Type": "application/json"},
                              timeout=30)
    for response, words in ((missing, "messages"), (malformed, "not valid JSON")):
        assert response.status_code == 400 and words in response.json()["error"]["message"]
    assert chat(client, max_tokens=4, temperature=0).usage.completion_tokens >= 1  # still serving


def test_thirty_two_concurrent_streams_complete(client):
    results, errors = {}, []

    def one(i: int) -> None:
        try:
            stream = client.completions.create(model=NAME, prompt=f"Story number {i}:", max_tokens=12, temperature=0,
                                               stream=True, stream_options={"include_usage": True},
                                               extra_body={"min_tokens": 12})
            chunks = list(stream)
            results[i] = ("".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage.completion_tokens)
        except Exception as exc:  # reported below
            errors.append((i, exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and len(results) == 32
    assert {tokens for _, tokens in results.values()} == {12}
    alone = client.completions.create(model=NAME, prompt="Story number 5:", max_tokens=12, temperature=0,
                                      extra_body={"min_tokens": 12})
    assert results[5][0] == alone.choices[0].text  # batching changed nothing


def test_a_client_that_disconnects_mid_stream_cancels_its_triton_request(server):
    before = wait_idle(server)
    body = {"model": NAME, "prompt": "Hello", "max_tokens": 2000, "min_tokens": 2000, "stream": True, "temperature": 0}
    post_stream_then_close(server.openai_port, "/v1/completions", body, 3)
    gone = time.monotonic()
    after = wait_idle(server, timeout=10)
    assert after["requests_active"] == 0 and time.monotonic() - gone < 5
    assert after["requests_cancelled_total"] == before["requests_cancelled_total"] + 1
    assert after["generated_tokens_total"] - before["generated_tokens_total"] < 200  # not its 2000 tokens
    assert runtime_metrics(server)["requests_failed_total"] == before["requests_failed_total"]


def test_generate_url_takes_the_openai_base_url(server, base_url, engines_dir):
    config = str(REPO / "build_configs" / f"{NAME}.yaml")
    args = ["generate", QUESTION, "-c", config, "--engines-dir", str(engines_dir), "--max-tokens", "16"]
    local = run_cli(*args)
    served = run_cli(*args, "--url", base_url)
    assert local.returncode == served.returncode == 0, served.stderr
    assert served.stdout == local.stdout and f"served by {base_url} (openai)" in served.stderr
    default = run_cli(*args, "--url", "default", "--protocol", "openai")
    assert default.returncode == 0 and default.stdout == local.stdout, default.stderr


def test_bench_openai_gives_the_lengths_of_triton_grpc_on_the_same_server(server, base_url, engines_dir, tmp_path):
    """The same server through both fronts: equal output lengths (checked per request); the timings go to a
    benchmark JSON (benchmarks/results/openai-vs-grpc-tiny-cpu.json), not into this test."""
    cfg = load(NAME)
    tokenizer = bench.load_tokenizer(bench.config_tokenizer_dir(cfg, engines_dir))
    summaries = {}
    for protocol, url in (("triton-grpc", f"127.0.0.1:{server.grpc_port}"), ("openai", base_url)):
        settings = bench.BenchSettings(protocol=protocol, url=url, levels=(bench.LoadLevel(concurrency=4),),
                                       input_tokens=32, output_tokens=16, requests=8, warmup=1)
        result = bench.bench(settings, tokenizer=tokenizer, tokenizer_source="checkpoint",
                             output=tmp_path / f"{protocol}.json")
        (summaries[protocol],) = result.data["summary"]
        assert all(r["output_tokens"] == 16 and r["error"] is None for r in result.data["requests"])
        # every token timed, over either front (the OpenAI front's continuous_usage_stats: a chunk for each, also for
        # the random model's tokens whose text it holds back as incomplete UTF-8)
        assert all(len(r["token_times_ms"]) == 16 for r in result.data["requests"]), protocol
    for entry in summaries.values():
        assert entry["requests"] == 8 and entry["errors"] == 0 and entry["output_tokens_mean"] == 16
        assert entry["ttft_ms"]["p50"] > 0 and entry["itl_ms"]["p50"] > 0
    assert summaries["openai"]["input_tokens_mean"] == summaries["triton-grpc"]["input_tokens_mean"] == 32


def test_eval_url_takes_the_openai_base_url_for_generation_tasks(server, base_url, engines_dir, data_dir, tmp_path):
    from test_eval import FP8, tiny

    from trtllm_pipeline.eval import evaluate

    assert FP8 == NAME
    cfg = tiny(FP8, gsm8k_max_new_tokens=8)
    (remote,) = evaluate(cfg, engines_dir=engines_dir, tasks=["gsm8k"], limit=4, data_dir=data_dir, url=base_url)
    (local,) = evaluate(cfg, engines_dir=engines_dir, tasks=["gsm8k"], limit=4, data_dir=data_dir, output=tmp_path)
    assert remote.results["runtime_info"] == {"runtime": "served", "url": base_url, "protocol": "openai"}
    for r, l in zip(remote.results["items"], local.results["items"]):
        assert (r["id"], r["prompt_sha256"], r["output"], r["finish_reason"]) == \
            (l["id"], l["prompt_sha256"], l["output"], l["finish_reason"])
