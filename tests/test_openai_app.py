"""The OpenAI front's routes, translation and reasoning split, against a stand-in for Triton (no server).

The real path (tritonserver, the torch runtime, the official ``openai`` client) is test_openai.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading

import pytest
from fastapi.testclient import TestClient

from trtllm_pipeline.model.builtin import builtin_model_dir
from trtllm_pipeline.openai import reasoning
from trtllm_pipeline.openai.app import create_app
from trtllm_pipeline.openai.protocol import OpenAIError
from trtllm_pipeline.openai.translate import triton_inputs
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.triton.contract import RequestLimits

PIECES = ["Hel", "lo", "", " wor", "ld</th", "ink>", " ok"]  # "" is a held-back piece: a token, no text
LIMITS = RequestLimits(max_input_tokens=64, max_seq_len=96, max_text_bytes=64 * 16, max_batch=8)


class StandIn:
    """Streams PIECES over and over, one token each, as tensorrt_llm_bls would; records what it was sent."""

    def __init__(self):
        self.calls, self.ready, self.cancelled = [], True, threading.Event()
        self.fail: OpenAIError | None = None

    async def check_ready(self):
        if not self.ready:
            raise OpenAIError(503, "the model is not ready yet", code="model_not_ready")

    async def stream(self, text, inputs, cancelled=None, request_id=""):
        self.calls.append((text, inputs))
        if self.fail:
            raise self.fail
        for i in range(inputs["max_tokens"]):
            if cancelled is not None and cancelled.is_set():
                self.cancelled.set()
                return
            yield PIECES[i % len(PIECES)], 1
            await asyncio.sleep(0)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(builtin_model_dir("tiny-qwen2"))


def client(tokenizer, parser="none"):
    upstream = StandIn()
    return TestClient(create_app(upstream, tokenizer, LIMITS, "tiny", aliases=("builtin:tiny-qwen2",),
                                 reasoning_parser=parser), base_url="http://127.0.0.1:8003"), upstream


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "temperature": 0}


def events(text: str) -> list:
    assert text.endswith("data: [DONE]\n\n")
    return [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")]


def test_models_and_both_endpoints_with_exact_usage(tokenizer):
    c, upstream = client(tokenizer)
    assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["tiny"]
    r = c.post("/v1/chat/completions", json=CHAT).json()
    sent, inputs = upstream.calls[-1]
    assert sent.endswith("<｜Assistant｜><think>\n")  # the chat template with its generation prompt
    assert r["usage"] == {"prompt_tokens": len(tokenizer.encode(sent)), "completion_tokens": 7, "total_tokens":
                          len(tokenizer.encode(sent)) + 7}
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "".join(PIECES)}
    assert r["choices"][0]["finish_reason"] == "length"
    assert inputs == {"max_tokens": 7, "exclude_input_in_output": True}  # greedy: no sampling inputs
    r = c.post("/v1/completions", json={"model": "builtin:tiny-qwen2", "prompt": "Hello", "max_tokens": 3}).json()
    assert r["object"] == "text_completion" and r["choices"][0]["text"] == "Hello"
    assert r["usage"]["prompt_tokens"] == len(tokenizer.encode("Hello"))


def test_streamed_deltas_concatenate_to_the_whole_and_usage_comes_last(tokenizer):
    c, _ = client(tokenizer)
    whole = c.post("/v1/chat/completions", json=CHAT).json()
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    got = events(c.post("/v1/chat/completions", json=body).text)
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"].get("content", "") for e in got if e["choices"]]
    assert "".join(deltas) == whole["choices"][0]["message"]["content"]
    assert "" not in deltas[1:-1]  # held-back pieces send no empty chunk
    assert got[-2]["choices"][0]["finish_reason"] == "length" and got[-1]["choices"] == []
    assert got[-1]["usage"] == whole["usage"]
    plain = events(c.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 4,
                                                    "stream": True}).text)
    assert "".join(e["choices"][0]["text"] for e in plain) == "Hello wor"
    assert all("usage" not in e for e in plain)  # only with stream_options.include_usage


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_continuous_usage_gives_a_chunk_for_every_token_with_the_count_so_far(tokenizer, path):
    # vLLM's stream_options.continuous_usage_stats: the held-back piece ("", a token without text) gets a chunk of
    # its own, so a client sees every token arrive; the text is the same as without it
    c, _ = client(tokenizer)
    chat = path.endswith("chat/completions")
    request = CHAT if chat else {"model": "tiny", "prompt": "Hi", "max_tokens": 7, "temperature": 0}
    plain = events(c.post(path, json={**request, "stream": True, "stream_options": {"include_usage": True}}).text)
    got = events(c.post(path, json={**request, "stream": True, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True}}).text)

    def text(chunks):
        return "".join((e["choices"][0]["delta"].get("content", "") if chat else e["choices"][0]["text"])
                       for e in chunks if e["choices"])

    assert text(got) == text(plain) == "".join(PIECES)
    streamed = [e for e in got if e["choices"]][1 if chat else 0:]  # (chat's first: the role, before any token)
    counts = [e["usage"]["completion_tokens"] for e in streamed]
    # one chunk per token (each piece is one), then the finish chunk at the same count; the usage chunk last
    assert counts == [1, 2, 3, 4, 5, 6, 7, 7] and streamed[-1]["choices"][0]["finish_reason"] == "length"
    assert all(e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + e["usage"]["completion_tokens"]
               for e in streamed)
    assert got[-1]["choices"] == [] and got[-1]["usage"] == plain[-1]["usage"]
    # without include_usage the option does nothing (vLLM's rule)
    alone = events(c.post(path, json={**request, "stream": True,
                                      "stream_options": {"continuous_usage_stats": True}}).text)
    assert all("usage" not in e for e in alone) and text(alone) == text(plain)


def test_openai_sampling_parameters_become_the_contracts_inputs(tokenizer):
    c, upstream = client(tokenizer)
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 3,
            "stop": "x", "min_tokens": 2, "ignore_eos": True}
    assert c.post("/v1/completions", json=body).status_code == 200
    assert upstream.calls[-1][1] == {"max_tokens": 5, "exclude_input_in_output": True, "min_tokens": 2,
                                     "stop_words": ["x"], "end_id": -1, "temperature": 0.7, "top_p": 0.9,
                                     "top_k": 20, "random_seed": 3}
    # OpenAI's default temperature is 1: sampling, which the contract asks for with top_p.
    assert triton_inputs(SamplingParams(max_tokens=2, temperature=1.0))["top_p"] == 1.0
    c.post("/v1/chat/completions", json={**CHAT, "max_completion_tokens": 3, "top_k": -1})
    assert upstream.calls[-1][1]["max_tokens"] == 3


@pytest.mark.parametrize(("path", "body", "status", "param", "words"), [
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages", "required"),
    ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400, "messages", "at least 1"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, 400, "max_tokens", "from 1"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 0}, 400, "max_completion_tokens", "from 1"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 200}, 400, "max_tokens", "max_seq_len"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "word " * 100}]}, 400, "messages",
     "max_input_len"),
    ("/v1/chat/completions", {**CHAT, "n": 2}, 400, "n", "n must be 1"),
    ("/v1/chat/completions", {**CHAT, "model": "gpt-4"}, 404, "model", "does not exist"),
    ("/v1/chat/completions", {**CHAT, "temperature": -1}, 400, "temperature", "temperature"),
    ("/v1/chat/completions", {**CHAT, "top_p": 0}, 400, "top_p", "top_p"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True}, 400, "logprobs", "not returned"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role", ""),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": "10"}, 400, "max_tokens", "integer"),
    ("/v1/completions", {"model": "tiny", "prompt": ["a", "b"]}, 400, "prompt", "one prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": ""}, 400, "prompt", "empty"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options", "stream: true"),
])
def test_bad_requests_are_openai_shaped_errors_naming_the_field(tokenizer, path, body, status, param, words):
    c, upstream = client(tokenizer)
    r = c.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert words in error["message"]
    assert not upstream.calls  # refused before anything went upstream
    assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # and the next request is served


def test_malformed_bodies_unknown_routes_not_ready_and_upstream_refusals(tokenizer):
    c, upstream = client(tokenizer)
    for raw in (b'{"model": "tiny", "messages": ', b"[1, 2]", b'{"model": NaN}', b"\xff"):
        r = c.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", raw
    r = c.post("/v1/completions", content=b"x" * (LIMITS.max_body_bytes + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert c.get("/v1/embeddings").status_code == 404 and "error" in c.get("/v1/embeddings").json()
    upstream.ready = False
    r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
    upstream.ready, upstream.fail = True, OpenAIError(400, "stop_words: too long")
    r = c.post("/v1/chat/completions", json={**CHAT, "stream": True})  # refused before the stream's 200
    assert r.status_code == 400 and r.json()["error"]["message"] == "stop_words: too long"


def test_reasoning_split_behind_the_switch(tokenizer):
    c, _ = client(tokenizer, parser="deepseek_r1")
    message = c.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "reasoning_content": "Hello world", "content": " ok"}
    got = events(c.post("/v1/chat/completions", json={**CHAT, "stream": True}).text)
    deltas = [e["choices"][0]["delta"] for e in got[1:-1]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Hello world"
    assert "".join(d.get("content", "") for d in deltas) == " ok"
    # Never closed: all of it is reasoning, content null (vLLM's deepseek_r1 parser).
    assert c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4}).json()["choices"][0]["message"] == \
        {"role": "assistant", "reasoning_content": "Hello wor", "content": None}


@pytest.mark.parametrize("text", ["<think>\nabc</think>\n\nanswer", "abc</think>x", "no end", "\n<think>a</thi",
                                  "a</th</think>b</think>c", "", "<thi", "</think>"])
def test_streamed_reasoning_split_equals_the_whole_however_the_text_is_cut(text):
    whole = reasoning.split("deepseek_r1", text)
    rng = random.Random(text)
    for _ in range(100):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 4))))
        splitter, thought, content = reasoning.Splitter("deepseek_r1"), "", ""
        for piece in [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])] + [None]:
            r, c = splitter.finish() if piece is None else splitter.push(piece)
            thought, content = thought + r, content + c
        assert (thought, content if splitter.closed else None) == whole
    assert reasoning.split("none", text) == (None, text)


@pytest.mark.parametrize("body, param", [
    ({"model": "tiny", "prompt": "a\ud800b"}, "prompt"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "\udc00"}]}, "messages.0.content"),
    ({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
     "messages.0.content.0.text"),
    ({"model": "tiny", "prompt": "x", "stop": ["ok", "\ud800"]}, "stop.1"),
    ({"model": "tiny", "prompt": "x", "temperature": 1e308}, "temperature"),
    ({"model": "tiny", "prompt": "x", "top_p": 1e-50}, "top_p"),
])
def test_hostile_values_are_400s_naming_the_field(tokenizer, body, param):
    """Lone surrogates (valid JSON, no character) and numbers that a 32-bit float turns into inf or 0."""
    c, upstream = client(tokenizer)
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = c.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param or param in error["message"], error
    assert not upstream.calls


def test_deep_json_wrong_content_type_and_foreign_host_are_refused(tokenizer):
    c, upstream = client(tokenizer)
    deep = b"[" * 10_000 + b"]" * 10_000
    r = c.post("/v1/completions", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    # A web page may POST text/plain anywhere without asking (no CORS preflight): refused, JSON or not.
    r = c.post("/v1/completions", content=json.dumps({"model": "tiny", "prompt": "x"}), headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    # DNS rebinding: a page's own name resolved to 127.0.0.1; its requests carry that name as Host.
    r = c.post("/v1/completions", json={"model": "tiny", "prompt": "x"}, headers={"host": "evil.example:8003"})
    assert r.status_code == 421 and "serving.allowed_hosts" in r.json()["error"]["message"]
    assert c.get("/v1/models", headers={"host": "localhost:8003"}).status_code == 200
    assert not upstream.calls


def test_a_lost_engine_makes_models_and_requests_503(tokenizer, tmp_path):
    from trtllm_pipeline.triton import health

    repo = tmp_path / "cfg" / "triton_model_repo"
    c = TestClient(create_app(StandIn(), tokenizer, LIMITS, "tiny", repository=str(repo)), base_url="http://127.0.0.1")
    assert c.get("/v1/models").status_code == 200
    health.mark_lost(repo, "the tensor-parallel group of 2 processes stopped: rank 1 was killed by SIGKILL")
    for r in (c.get("/v1/models"), c.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})):
        assert r.status_code == 503 and "killed by SIGKILL" in r.json()["error"]["message"], r.text
    health.clear(repo)
    assert c.get("/v1/models").status_code == 200


def test_the_fronts_connections_have_nagle_off():
    """The front's socket names its protocol, so that asyncio (uvicorn's transports) sets TCP_NODELAY on every
    connection: with Nagle on, a streamed chunk written while the previous one was unacknowledged waited for the
    client's delayed ACK (a kept-alive connection's second stream got its first tokens ~40 ms late, at once)."""
    import socket

    from trtllm_pipeline.openai.server import listening_socket

    async def accept_one(sock) -> int:
        accepted = asyncio.get_running_loop().create_future()

        class Recorder(asyncio.Protocol):
            def connection_made(self, transport):
                accepted.set_result(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP,
                                                                                  socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Recorder, sock=sock)
        try:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            nodelay = await asyncio.wait_for(accepted, 10)
            writer.close()
            return nodelay
        finally:
            server.close()

    sock = listening_socket("127.0.0.1")
    sock.bind(("127.0.0.1", 0))
    assert asyncio.run(accept_one(sock)) != 0
    plain = socket.socket(socket.AF_INET)  # what the front made before: protocol 0, and asyncio leaves Nagle on
    plain.bind(("127.0.0.1", 0))
    assert asyncio.run(accept_one(plain)) == 0
