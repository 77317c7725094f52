"""A served build with speculation on (n-gram lookup), then the end of its engine's process.

Speculation served: the same greedy text as plain decoding and the engine metrics count what was drafted and
accepted. The crash (on the H200 a segmentation fault in the stub's ``send`` did this): Triton 2.51 still says
the model is ready and a streaming request waiting on it waited for ever; with ``health``'s record of the
engine's process the waiting request ends with an error naming the crash and readiness answers 503 (the BLS
reads its engine stream on the engine model's socket, triton/direct.py: the crash closes it). Served as on a GPU
(the outbox's thread, coalesced streams; the crash test last: tests of a file run in order, on one worker); a
second server of the plain build keeps the BLS's requests on Triton's path, as TensorRT-LLM's engine model has it."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
import requests
import yaml
from conftest import CONFIGS, free_ports, load

from trtllm_pipeline import artifacts, serve
from trtllm_pipeline.build import build
from trtllm_pipeline.client import ServerError, TritonClient
from trtllm_pipeline.config import config_from_dict
from trtllm_pipeline.quantize import quantize
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime
from trtllm_pipeline.triton import health, loopback

pytestmark = pytest.mark.slow

PLAIN = "tiny-qwen2-bf16-tp1"
NAME = "tiny-qwen2-bf16-ngram-tp1"  # served by no other test (one server per config at a time)
CHURNED = "tiny-qwen2-bf16-churned-tp1"  # the plain build again, for a server that may be left hung
# Repeats, so that prompt lookup finds continuations; the tiny random model's greedy text loops too.
PROMPTS = ["one two three four five six one two three four five six one two three",
           "Café au lait 0", "a b c d a b c d a b c d a b", "Story number 1:"]
TOKENS = 160  # long enough for the lookups to find repeats (in-process: ~40 drafted, ~17 accepted)


def _variant(name: str, engines_dir, tmp_path_factory, **runtime):
    """The plain build's config under ``name`` (its own engine directory, so its own server), ``runtime`` added."""
    data = yaml.safe_load((CONFIGS / f"{PLAIN}.yaml").read_text())
    data["runtime"].update(runtime)
    path = tmp_path_factory.mktemp(name) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = config_from_dict(data, name=name, path=path)
    quantize(cfg, engines_dir=engines_dir)
    build(cfg, engines_dir=engines_dir, runtime="torch")
    return cfg


@pytest.fixture(scope="module")
def spec_cfg(built, engines_dir, tmp_path_factory):
    built(PLAIN)  # the plain build: the reference text (the same built-in weights)
    return _variant(NAME, engines_dir, tmp_path_factory, speculative={"method": "ngram", "num_draft_tokens": 4})


# Served as on a GPU: responses sent by the outbox's own thread, a stream's waiting tokens joined into one response.
GPU_LIKE = {"TRTLLM_PIPELINE_OUTBOX_THREAD": "1", "TRTLLM_PIPELINE_STREAM_COALESCE": "1"}
THROUGH_TRITON = {**GPU_LIKE, "TRTLLM_PIPELINE_BLS_DIRECT": "0"}


def _start(cfg, engines_dir, env: dict[str, str]):
    http, grpc, metrics, openai = free_ports(4)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the server's processes inherit them
    try:
        return serve.start(cfg, engines_dir=engines_dir, http=http, grpc=grpc, metrics=metrics, openai=openai)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def server(spec_cfg, engines_dir):
    started = _start(spec_cfg, engines_dir, GPU_LIKE)
    yield started
    serve.stop(spec_cfg, engines_dir=engines_dir)
    assert not serve.group_alive(started.pid)


@pytest.fixture(scope="module")
def through_triton(built, engines_dir):
    """The plain build served as on a GPU with the BLS's requests through Triton, as with TensorRT-LLM's engine
    model (no socket of the torch engine's: ``TRTLLM_PIPELINE_BLS_DIRECT=0``)."""
    built(PLAIN)
    started = _start(load(PLAIN), engines_dir, THROUGH_TRITON)
    yield started
    serve.stop(load(PLAIN), engines_dir=engines_dir)
    assert not serve.group_alive(started.pid)


@pytest.fixture(scope="module")
def churned_cfg(engines_dir, tmp_path_factory):
    return _variant(CHURNED, engines_dir, tmp_path_factory)


@pytest.fixture(params=["loopback", "exec"])
def churned(request, churned_cfg, engines_dir):
    """(path, config, server) as ``through_triton``, of a build of its own, its BLS reading the engine by gRPC to its
    own server (``triton/loopback.py``, the default) or by Triton's BLS ``exec()`` (``TRTLLM_PIPELINE_BLS_LOOPBACK=0``,
    which may leave it hung)."""
    env = {**THROUGH_TRITON, loopback.SWITCH_ENV: "1" if request.param == "loopback" else "0"}
    started = _start(churned_cfg, engines_dir, env)
    yield request.param, churned_cfg, started
    serve.stop(churned_cfg, engines_dir=engines_dir)
    assert not serve.group_alive(started.pid)


def _all_at_once(fn, args, timeout_s: float) -> None:
    """``fn(a)`` for each of ``args``, each in a thread of its own, all started before any is awaited."""
    threads = [threading.Thread(target=fn, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)


def _engine_metrics(server) -> dict[str, float]:
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    return {k: float(v) for k, v in re.findall(r"^trtllm_pipeline:(\w+)\{[^}]*\} (\S+)$", text, re.MULTILINE)}


def _ready_status(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_speculation_served_gives_plain_greedy_text_and_the_metrics_count_drafts(server, engines_dir):
    plain = load_runtime(load(PLAIN), engines_dir)
    try:
        expected = {p: plain.generate([plain.tokenizer.encode(p, add_special_tokens=True)],
                                      SamplingParams(max_tokens=TOKENS, end_id=-1))[0].text for p in PROMPTS}
    finally:
        plain.close()
    got = {}

    def ask(prompt: str) -> None:  # all at once: speculating rows in one batch
        with TritonClient(f"127.0.0.1:{server.grpc_port}") as client:
            # end_id -1: never ends early, as in-process (the plain reference above is the same)
            got[prompt] = "".join(client.stream(prompt, max_tokens=TOKENS, end_id=-1))

    _all_at_once(ask, PROMPTS, 120)
    assert got == expected
    deadline = time.monotonic() + 10  # the engine's metrics reach Triton batched, ~10 times a second
    while (m := _engine_metrics(server)).get("spec_decode_num_draft_tokens_total", 0) == 0:
        assert time.monotonic() < deadline, {k: v for k, v in m.items() if "spec" in k}
        time.sleep(0.2)
    assert 0 < m["spec_decode_num_accepted_tokens_total"] <= m["spec_decode_num_draft_tokens_total"]
    assert m["spec_decode_num_verify_rows_total"] > 0 and m["spec_decode_acceptance_length"] >= 1


def test_the_bls_through_triton_streams_sixteen_requests_at_once_with_plain_greedy_text(through_triton, engines_dir):
    """The path TensorRT-LLM's engine model takes (Triton's BLS requests, the empty first response that frees the
    exec() thread), still right under concurrency: every stream in-process generate's text, and Triton counted a
    tensorrt_llm request for each (the socket path counts none: test_serve)."""
    prompts = [f"{p} {i}" for i in range(4) for p in PROMPTS]
    plain = load_runtime(load(PLAIN), engines_dir)
    try:
        expected = {p: plain.generate([plain.tokenizer.encode(p, add_special_tokens=True)],
                                      SamplingParams(max_tokens=24, end_id=-1))[0].text for p in prompts}
    finally:
        plain.close()
    before = _engine_requests(through_triton)
    got = {}

    def ask(prompt: str) -> None:
        with TritonClient(f"127.0.0.1:{through_triton.grpc_port}") as client:
            got[prompt] = "".join(client.stream(prompt, max_tokens=24, end_id=-1))

    _all_at_once(ask, prompts, 120)
    assert got == expected
    assert _engine_requests(through_triton) - before == len(prompts)


def test_the_bls_through_triton_lives_through_hundreds_of_short_streams(churned, engines_dir):
    """Triton 2.51's stub frees a finished BLS response iterator on its cleanup thread, without the GIL, where Python
    let go of it first; its responses' numpy arrays went with it and corrupted the heap. Before the BLS kept its
    iterators a while (``LINGER_S``), three CPU servers of three on this path died within 80-250 such requests
    ("malloc(): unaligned fastbin chunk detected"; every later request: "Stub process ... is not healthy"); without
    the lingering this test's 600 requests caught the crash in about half of its runs.

    The same stub can also deadlock there (docs/serving.md: a thread whose exec() returned, the stub's response thread
    and a thread reading another request's responses; a clean clone's suite hung so once in 600 requests, and a
    GIL-bound stub after 249-3,115). Nothing in the BLS can prevent it, so by default it reads its engine over gRPC
    from its own server instead (``triton/loopback.py``: no response iterator at all; the same GIL-bound stub took 600
    of 600 twice): there every stream must end whole. On ``exec()``, where a hang strikes, what is asserted is that it
    shows: health.lost names the hung BLS (the fronts then answer 503 with it), where Triton keeps the model ready."""
    path, cfg, server = churned
    errors, done = [], []

    def ask(worker: int) -> None:
        with TritonClient(f"127.0.0.1:{server.grpc_port}", timeout_s=30) as client:
            for i in range(100):
                try:
                    done.append("".join(client.stream(f"{PROMPTS[(worker + i) % len(PROMPTS)]} {i}", max_tokens=6,
                                                      end_id=-1)))
                except ServerError as exc:
                    errors.append(str(exc))
                    return

    _all_at_once(ask, range(6), 300)
    log = open(server.log, errors="replace").read()
    assert ("go by gRPC to" if path == "loopback" else f"go by exec() ({loopback.SWITCH_ENV}=0)") in log
    for crash in ("Fatal Python error", "malloc(): ", "Stub process"):
        assert crash not in log, log[log.index(crash):][:3000]
    if errors and path == "exec":  # only a hang, and then one that shows
        assert all(e.startswith("no response from") for e in errors), errors
        repository = artifacts.ArtifactPaths(engines_dir / cfg.name).triton_repo
        deadline = time.monotonic() + health.HUNG_S + 5
        while (why := health.lost(repository)) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert why is not None and "tensorrt_llm_bls model's process" in why and "it is hung" in why, why
        return
    assert errors == [] and len(done) == 600 and all(done), errors[:3]


def test_a_crashed_front_model_turns_readiness_503_and_names_it(through_triton, engines_dir):
    """Every Python model's stub records its process (health.mark_stub); when one dies (here the BLS, killed), the
    HTTP front's readiness and its new requests answer 503 naming that model (said once in the log), as for the engine's
    process: Triton 2.51 itself keeps the model ready and answers "Stub process ... is not healthy". The last test of
    this server."""
    stubs = artifacts.ArtifactPaths(engines_dir / PLAIN).serve_state / health.STUBS
    recorded = {name.rpartition(".")[0]: int(name.rpartition(".")[2]) for name in os.listdir(stubs)}
    assert set(recorded) == {"tensorrt_llm_bls", "preprocessing", "postprocessing"}
    pid = recorded["tensorrt_llm_bls"]
    assert b"triton_python_backend_stub" in open(f"/proc/{pid}/cmdline", "rb").read()
    assert _ready_status(through_triton.http_port) == 200
    # a stream in flight through the HTTP front: it ends with the reason, not silence
    stream = requests.post(f"http://127.0.0.1:{through_triton.http_port}/v2/models/tensorrt_llm_bls/generate_stream",
                           json={"text_input": "Once upon a time", "max_tokens": 400, "min_tokens": 400,
                                 "stream": True}, stream=True, timeout=30)
    events = stream.iter_lines()
    assert next(e for e in events if e.startswith(b"data:"))  # the first token came
    # and one through the OpenAI front (Triton's gRPC behind it)
    chat = requests.post(f"http://127.0.0.1:{through_triton.openai_port}/v1/completions", stream=True, timeout=30,
                         json={"model": PLAIN, "prompt": "Once upon a time", "max_tokens": 400, "min_tokens": 400,
                               "stream": True})
    chunks = chat.iter_lines()
    assert next(e for e in chunks if e.startswith(b"data:"))
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    rest = [e for e in events if e.startswith(b"data:")]  # to the end of the stream
    assert time.monotonic() - killed < 10
    assert len(rest) < 398 and f"tensorrt_llm_bls model's process (pid {pid}) is gone" in rest[-1].decode(), rest[-3:]
    rest = [e for e in chunks if e.startswith(b"data:")]
    assert time.monotonic() - killed < 10 and rest[-1] == b"data: [DONE]"
    assert f"tensorrt_llm_bls model's process (pid {pid}) is gone" in rest[-2].decode(), rest[-3:]
    deadline = time.monotonic() + 10
    while _ready_status(through_triton.http_port) != 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ready_status(through_triton.http_port) == 503
    answer = requests.post(f"http://127.0.0.1:{through_triton.http_port}/v2/models/tensorrt_llm_bls/generate",
                           json={"text_input": "hi", "max_tokens": 4}, timeout=30)
    assert answer.status_code == 503
    assert f"tensorrt_llm_bls model's process (pid {pid}) is gone" in answer.text, answer.text
    # and said once in the server's log, by the front (Triton's own lines say nothing of a hung stub)
    log = open(through_triton.log, errors="replace").read()
    assert log.count(f"http front: the deployment cannot serve: the tensorrt_llm_bls model's process (pid {pid})") == 1


def _engine_requests(server) -> float:
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    return float(re.search(r'^nv_inference_count{model="tensorrt_llm",version="1"} (\S+)$', text, re.M).group(1))


def test_a_crashed_engine_process_ends_the_waiting_stream_with_the_reason_and_readiness_turns_503(
        server, engines_dir):
    alive = artifacts.ArtifactPaths(engines_dir / NAME).serve_state / health.ALIVE
    pid = json.loads(alive.read_text())["pid"]
    assert b"triton_python_backend_stub" in open(f"/proc/{pid}/cmdline", "rb").read()
    address = f"127.0.0.1:{server.grpc_port}"
    assert _ready_status(server.http_port) == 200
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
    assert _ready_status(server.http_port) == 503
