"""A real tritonserver serving the tiny FP8 model (torch runtime): generation, streaming, bad requests, lifecycle."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import requests
from conftest import REPO, free_ports, load, run_cli

from trtllm_pipeline import serve
from trtllm_pipeline.client import ServerError, TritonClient
from trtllm_pipeline.errors import StageFailed
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime

pytestmark = pytest.mark.slow

NAME = "tiny-qwen2-fp8-tp1"
SPLIT_PROMPT = "Café au lait 0"
PROMPTS = [SPLIT_PROMPT, "The capital of France is"]
# Prompts whose greedy output may hold a lone byte token, which TextStream holds back (an empty streamed
# piece). Which ones do depends on the CPU's float rounding (the tiny model's weights are random), so the
# test takes the first that does here.
SPLIT_CANDIDATES = (SPLIT_PROMPT, "Café au lait 2", "Grüße aus München", "Zürich 0", "日本語 0")


@pytest.fixture(scope="module")
def server(served):
    return served(NAME)


@pytest.fixture(scope="module")
def runtime(server, engines_dir):
    rt = load_runtime(load(NAME), engines_dir)
    yield rt
    rt.close()


def in_process(runtime, prompt: str, **params):
    ids = runtime.tokenizer.encode(prompt, add_special_tokens=True)  # `generate --raw`: what the server sends
    return runtime.generate([ids], SamplingParams(**params))[0]


def url(server, protocol: str) -> str:
    return f"127.0.0.1:{server.grpc_port if protocol == 'grpc' else server.http_port}"


def ready(server) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v2/health/ready", timeout=5) as response:
        return response.status == 200


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_generate_equals_in_process_generate(server, runtime, protocol):
    with TritonClient(url(server, protocol), protocol) as client:
        for prompt in PROMPTS:
            expected = in_process(runtime, prompt, max_tokens=24)
            assert client.generate(prompt, max_tokens=24) == expected.text
            assert len(expected.token_ids) > 1


@pytest.fixture(scope="module")
def split_prompt(runtime) -> str:
    found = [p for p in SPLIT_CANDIDATES if "\ufffd" in in_process(runtime, p, max_tokens=40).text]
    assert found, "no candidate prompt's greedy output holds a lone byte token here: add one to SPLIT_CANDIDATES"
    return found[0]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_streamed_pieces_are_one_token_each_and_concatenate_to_the_text(server, runtime, split_prompt, protocol):
    expected = in_process(runtime, split_prompt, max_tokens=40)
    with TritonClient(url(server, protocol), protocol) as client:
        pieces = list(client.stream(split_prompt, max_tokens=40))
        whole = client.generate(split_prompt, max_tokens=40)
    assert len(pieces) == len(expected.token_ids) > 1  # one streamed response per generated token
    assert "".join(pieces) == whole == expected.text
    assert "" in pieces and "\ufffd" in expected.text  # the held-back byte arrived with the next token


def test_stop_words_and_forced_length_match_in_process(server, runtime):
    full = in_process(runtime, PROMPTS[1], max_tokens=24).text
    stop = full[8:12]
    expected = in_process(runtime, PROMPTS[1], max_tokens=24, stop_words=(stop,))
    with TritonClient(url(server, "grpc")) as client:
        assert client.generate(PROMPTS[1], max_tokens=24, stop_words=[stop]) == expected.text
        assert "".join(client.stream(PROMPTS[1], max_tokens=24, stop_words=[stop])) == expected.text
        assert stop not in expected.text and full.startswith(expected.text)
        pieces = list(client.stream(PROMPTS[0], max_tokens=12, min_tokens=12))
    assert len(pieces) == 12


def test_seeded_sampling_matches_in_process(server, runtime):
    expected = in_process(runtime, PROMPTS[1], max_tokens=16, temperature=0.8, top_k=20, seed=7)
    with TritonClient(url(server, "http"), "http") as client:
        sampled = client.generate(PROMPTS[1], max_tokens=16, temperature=0.8, top_k=20, random_seed=7)
        assert sampled == expected.text
        assert sampled != client.generate(PROMPTS[1], max_tokens=16)  # it did sample


def test_cli_generate_url_default_equals_in_process_generate(server, engines_dir):
    config = str(REPO / "build_configs" / f"{NAME}.yaml")
    args = ["generate", "What is 2+2?", "-c", config, "--engines-dir", str(engines_dir), "--max-tokens", "16"]
    local = run_cli(*args)
    served = run_cli(*args, "--url", "default")  # the chat template applied client-side, the session server found
    assert local.returncode == served.returncode == 0, served.stderr
    assert served.stdout == local.stdout and len(served.stdout.strip()) > 0
    assert f"served by 127.0.0.1:{server.grpc_port} (grpc); 16 streamed responses" in served.stderr


def test_sixteen_concurrent_streams_all_complete_correctly(server, runtime):
    prompts = [f"Story number {i}:" for i in range(16)]
    expected = {p: in_process(runtime, p, max_tokens=20).text for p in prompts}
    results, errors = {}, []

    def worker(i, prompt):
        protocol = "grpc" if i % 2 else "http"
        try:
            with TritonClient(url(server, protocol), protocol) as client:
                results[prompt] = list(client.stream(prompt, max_tokens=20))
        except Exception as exc:  # reported below with the prompt
            errors.append((prompt, exc))

    threads = [threading.Thread(target=worker, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    assert {p: "".join(pieces) for p, pieces in results.items()} == expected
    assert all(len(pieces) > 1 for pieces in results.values())


def generate_json(server, body: dict) -> dict:
    return requests.post(f"http://127.0.0.1:{server.http_port}/v2/models/ensemble/generate", json=body,
                         timeout=60).json()


def grpc_error(server, inputs: list[tuple[str, np.ndarray, str]]) -> str:
    import tritonclient.grpc as grpcclient

    tensors = []
    for name, array, datatype in inputs:
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    errors = []
    client = grpcclient.InferenceServerClient(url(server, "grpc"))
    client.start_stream(callback=lambda result, error: errors.append(error))
    client.async_stream_infer("ensemble", tensors)
    deadline = time.monotonic() + 30
    while not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    client.stop_stream()
    assert errors and errors[0] is not None, "the bad request was answered without an error"
    return errors[0].message()


BAD_JSON = [
    ({"max_tokens": 4}, "text_input"),
    ({"text_input": "hi", "max_tokens": 0}, "at least 1"),
    ({"text_input": "hi", "max_tokens": 10**6}, "max_seq_len"),
    ({"text_input": "hi", "max_tokens": "four"}, "parse"),
    ({"text_input": "hi", "max_tokens": 4, "temperature": "hot"}, "parse"),
    ({"text_input": "", "max_tokens": 4}, "empty"),
    ({"text_input": "word " * 7000, "max_tokens": 4}, "at most 6144"),
]


@pytest.mark.parametrize(("body", "message"), BAD_JSON, ids=[m for _, m in BAD_JSON])
def test_bad_http_requests_get_an_error_and_the_server_stays_ready(server, body, message):
    answer = generate_json(server, body)
    assert message in answer.get("error", ""), answer
    assert ready(server)


def test_bad_grpc_requests_get_an_error_and_the_server_stays_ready(server):
    text = np.array([[b"hi"]], dtype=object)
    wrong_type = grpc_error(server, [("text_input", text, "BYTES"),
                                     ("max_tokens", np.array([[4.0]], dtype=np.float32), "FP32")])
    assert "data-type is 'FP32'" in wrong_type
    too_big = grpc_error(server, [("text_input", np.array([[b"hi"]] * 9, dtype=object), "BYTES"),
                                  ("max_tokens", np.array([[4]] * 9, dtype=np.int32), "INT32")])
    assert "batch-size must be <= 8" in too_big
    with TritonClient(url(server, "grpc")) as client:
        with pytest.raises(ServerError, match="empty"):
            client.generate("", max_tokens=3)
    assert ready(server)


def test_clients_that_disconnect_mid_stream_leave_the_server_healthy(server, runtime):
    with TritonClient(url(server, "grpc")) as client:
        stream = client.stream(PROMPTS[1], max_tokens=200)
        next(stream)
        stream.close()  # cancels the request and closes the gRPC stream
    response = requests.post(f"http://127.0.0.1:{server.http_port}/v2/models/ensemble/generate_stream",
                             json={"text_input": PROMPTS[1], "max_tokens": 200, "stream": True}, stream=True,
                             timeout=60)
    next(response.iter_lines())
    response.close()  # drops the HTTP connection mid-stream
    assert ready(server)
    with TritonClient(url(server, "http"), "http") as client:
        assert client.generate(PROMPTS[1], max_tokens=24) == in_process(runtime, PROMPTS[1], max_tokens=24).text


def test_score_choices_uses_generation_logits_like_runtime_score(server, runtime):
    prompt = "The answer is"
    choices = [runtime.tokenizer.encode(f" {letter}", add_special_tokens=False)[-1] for letter in "ABCD"]
    context = runtime.tokenizer.encode(prompt, add_special_tokens=True)
    expected = [lp for lp, _ in runtime.score([context] * 4, [[c] for c in choices])]
    for protocol in ("grpc", "http"):
        with TritonClient(url(server, protocol), protocol) as client:
            assert client.score_choices(prompt, choices) == pytest.approx(expected, abs=1e-4)


def test_bls_model_streams_the_same_text(server):
    with TritonClient(url(server, "grpc"), model="tensorrt_llm_bls") as bls, TritonClient(url(server, "grpc")) as ens:
        pieces = list(bls.stream(SPLIT_PROMPT, max_tokens=30))
        assert "".join(pieces) == bls.generate(SPLIT_PROMPT, max_tokens=30) == ens.generate(SPLIT_PROMPT, max_tokens=30)
        assert len(pieces) > 1


def test_metrics_stay_on_the_metrics_port(server):
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    assert 'nv_inference_request_success{model="ensemble"' in text
    assert "nv_inference_request_success" not in requests.get(f"http://127.0.0.1:{server.http_port}/metrics",
                                                               timeout=10).text


# --------------------------------------------------------------------------- lifecycle (its own server)

LIFECYCLE = "tiny-qwen2-bf16-tp1"  # not the session server's config: one server per config at a time


def test_taken_port_detach_and_stop(built, engines_dir):
    built(LIFECYCLE)
    config = str(REPO / "build_configs" / f"{LIFECYCLE}.yaml")
    http, grpc, metrics = free_ports(3)
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", grpc))
        squatter.listen()
        taken = run_cli("serve", "-c", config, "--engines-dir", str(engines_dir), *ports, "--detach")
    assert taken.returncode == 2 and f"gRPC port {grpc}" in taken.stderr and "--grpc-port" in taken.stderr
    started = run_cli("serve", "-c", config, "--engines-dir", str(engines_dir), *ports, "--detach")
    assert started.returncode == 0, started.stderr
    assert f"http://127.0.0.1:{http}" in started.stdout and f"127.0.0.1:{metrics}/metrics" in started.stdout
    state = serve.read_state(load(LIFECYCLE), engines_dir)
    try:
        again = run_cli("serve", "-c", config, "--engines-dir", str(engines_dir), *ports, "--detach")
        assert again.returncode == 2 and "already running" in again.stderr
        with TritonClient(f"127.0.0.1:{grpc}") as client:
            assert client.generate("hello", max_tokens=4)
    finally:
        stopped = run_cli("serve", "-c", config, "--engines-dir", str(engines_dir), "--stop")
    assert stopped.returncode == 0 and f"pid {state.pid}" in stopped.stdout
    assert not serve.group_alive(state.pid)  # --stop returned once every process of the server had exited
    assert "no server is running" in run_cli("serve", "-c", config, "--engines-dir", str(engines_dir), "--stop").stdout


def test_foreground_serve_stops_on_ctrl_c(built, engines_dir):
    built(LIFECYCLE)
    http, grpc, metrics = free_ports(3)
    cli = subprocess.Popen(
        [sys.executable, "-m", "trtllm_pipeline", "serve", "-c", str(REPO / "build_configs" / f"{LIFECYCLE}.yaml"),
         "--engines-dir", str(engines_dir), "--http-port", str(http), "--grpc-port", str(grpc),
         "--metrics-port", str(metrics)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in cli.stdout:
            if "Ctrl-C stops it" in line:
                break
        state = serve.read_state(load(LIFECYCLE), engines_dir)
        assert state is not None and ready(state)
        cli.send_signal(signal.SIGINT)
        try:
            out, err = cli.communicate(timeout=120)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"serve did not stop within 120 s of SIGINT; its stderr: {exc.stderr!r}; server log tail:\n"
                        f"{serve.log_tail(state.log)}")
    finally:
        if cli.poll() is None:
            cli.kill()
            serve.stop(load(LIFECYCLE), engines_dir=engines_dir)  # the server has its own session: stop it too
    assert cli.returncode == 0, err
    assert "stopped" in out
    assert not serve.group_alive(state.pid)
    assert serve.read_state(load(LIFECYCLE), engines_dir) is None


def test_a_server_that_cannot_load_its_model_is_reported_and_cleaned_up(built, engines_dir, tmp_path):
    built(NAME)
    shutil.copytree(engines_dir / NAME, tmp_path / NAME, ignore=shutil.ignore_patterns("serve", "triton_model_repo"))
    (tmp_path / NAME / "checkpoint" / "rank0.safetensors").write_bytes(b"truncated")
    http, grpc, metrics = free_ports(3)
    with pytest.raises(StageFailed, match=r"tensorrt_llm: .*rank0\.safetensors is unreadable") as failure:
        serve.start(load(NAME), engines_dir=tmp_path, http=http, grpc=grpc, metrics=metrics)
    assert "exited during startup" in failure.value.message
    assert serve.read_state(load(NAME), tmp_path) is None
    assert not processes_mentioning(str(tmp_path))  # neither the server nor a Python-backend stub is left


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (the server names its repository, the stubs their model.py)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                found.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return found


def test_python_models_see_the_serving_module_path_that_the_stub_ignores(tmp_path):
    # The Python backend's stub ignores PYTHONPATH, as `python -I` does: packages only on it (a GPU
    # machine with unpacked wheels) reach the models through the module serve writes beside the stub.
    only_here = tmp_path / "on-pythonpath-only"
    only_here.mkdir()
    (only_here / "marker_package_xyz.py").write_text("VALUE = 42\n")
    backend = tmp_path / "backends" / "python"
    backend.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(only_here), os.environ.get("PYTHONPATH", "")])}
    write = ("from pathlib import Path; from trtllm_pipeline.runtimes.torch_backend import write_sys_path_module; "
             f"write_sys_path_module(Path({str(backend)!r}))")
    assert subprocess.run([sys.executable, "-c", write], env=env).returncode == 0
    stub_like = f"import sys; sys.path.insert(0, {str(backend)!r}); import serving_sys_path, marker_package_xyz; " \
                "print(marker_package_xyz.VALUE)"
    isolated = subprocess.run([sys.executable, "-I", "-c", stub_like], env=env, capture_output=True, text=True)
    assert isolated.returncode == 0 and isolated.stdout.strip() == "42", isolated.stderr
    without = subprocess.run([sys.executable, "-I", "-c", "import marker_package_xyz"], env=env, capture_output=True)
    assert without.returncode != 0  # isolated, as the stub is, it would not be found
