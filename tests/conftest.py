"""Shared fixtures: the built-in tiny model, a session-wide engines directory, the real data files.

Expensive artifacts (quantized checkpoints, built engines) are made once per session in one
engines directory and shared (under xdist once per run: each worker copies what another made, see
``made_once``); tests that change artifacts use their own ``tmp_path`` instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "build_configs"

# Generated built-in models are cached across sessions (they are deterministic); set before any
# trtllm_pipeline import so subprocesses and Triton's Python stubs inherit it.
os.environ.setdefault("TRTLLM_PIPELINE_CACHE", str(Path(tempfile.gettempdir()) / "trtllm-pipeline-test-cache"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under xdist the workers share the cores: torch's default of a thread per core in every worker (and in every
# process a test starts, servers included) oversubscribes them, and OpenMP's waiting threads spin on the cores
# the other worker needs (two tiny AWQ calibrations at once took 75 s each, against 8 s alone). Each worker's
# share instead, set before torch is imported (OpenBLAS, under numpy, reads it too).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0))
                                                     // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))


# How `make test` (-n auto --dist loadgroup) shares the tests out between xdist's workers. SPREAD_FILES: one by
# one (each runs a long subprocess of its own, Triton's interpreter, and needs only session fixtures).
# SERVER_FILES and SERVER_TESTS: all on one worker, in order, as in a single-process run: they start real servers
# (tritonserver, its Python-backend stubs, the fronts), and two workers' servers side by side once wedged a served
# model under test_openai's 32 streams (every request timed out; not understood yet, so not risked). Every other
# file runs whole on one worker, so its module fixtures (quantized builds) are made once.
SPREAD_FILES = {"test_fast_decode.py"}
SERVER_FILES = {"test_bench_triton.py", "test_chat_page.py", "test_demo.py", "test_metrics.py", "test_openai.py",
                "test_serve.py", "test_soak.py"}
SERVER_TESTS = {"test_eval.py::test_served_model_scores_like_the_engine_in_process",
                "test_tensor_parallel.py::test_served_tp2_answers_the_benchmark_then_a_killed_worker_ends_every_request_and_readiness"}
# The units started first, longest first (seconds on a 2-core machine, both workers busy), so that no long one is
# left for the end while the other worker idles; the others follow in collection order.
START_FIRST = ("servers",  # 375 s
               "test_stub_env.py",  # 70 s
               "test_tensor_parallel.py", "test_formats.py",  # 60-65 s
               "test_fast_decode.py::test_prompt_lookup_on_the_device",  # 65 s
               "test_fast_decode.py::test_fast_kernels_give_eager_greedy_tokens_int4_awq",  # 3 runtimes: 70-80 s
               "test_fast_decode.py::test_tree_verify_rows_on_the_fast_path",  # 40 s
               "test_fast_decode.py::test_int4_gemv_for_several_rows",  # 40 s
               "test_fast_decode.py::test_quant_gemm_benchmark_gemv_rows_parts",  # 26 s
               "test_fast_decode.py::test_fast_kernels_give_eager_greedy_tokens_bf16",  # 27 s
               "test_fast_decode.py::test_fast_kernels_run_tensor_parallel",  # 23 + 23 s
               "test_model_families.py",  # 45 s: the real model's GGUF converted, quantized, asked
               "test_fast_decode.py::test_fast_kernels_match_eager_accuracy_fp8",
               "test_fast_decode.py::test_speculative_verify_step",  # 40-45 s
               "test_damaged_artifacts.py", "test_build.py", "test_bench.py",  # 40 s
               "test_fast_decode.py::test_fast_kernels_match_eager_accuracy_int8_sq",
               "test_fast_decode.py::test_fast_kernels_run_the_llama_family",  # 35-40 s
               "test_engine_crash.py",  # 35 s, 15 of them its crashed server's stop (Triton's exit timeout)
               "test_architecture.py", "test_eval.py",  # 30 s
               "test_fast_decode.py",  # the others: 25 s and less
               "test_torch_runtime.py", "test_lm_eval_parity.py", "test_quantize.py", "test_trtllm_contract.py",
               "test_trtllm_pytorch.py")  # 15-25 s


def group_of(nodeid: str) -> str:
    """The work unit a test belongs to under ``--dist loadgroup`` (tests of one unit run on one worker, in order)."""
    path, _, name = nodeid.partition("::")
    file = path.rsplit("/", 1)[-1]
    if file in SPREAD_FILES:
        return nodeid
    return "servers" if file in SERVER_FILES or f"{file}::{name.split('[', 1)[0]}" in SERVER_TESTS else file


def start_rank(nodeid: str) -> int:
    path, _, name = nodeid.partition("::")
    group, test = group_of(nodeid), f"{path.rsplit('/', 1)[-1]}::{name}"
    return next((i for i, first in enumerate(START_FIRST) if group == first or test.startswith(first)),
                len(START_FIRST))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """loadgroup's scheduler, grouping by ``group_of`` rather than by xdist_group marks: with pytest 9.2 and
    pytest-xdist 3.8 the marks are silently ignored (xdist renames ``item._nodeid``, which pytest no longer
    reads: pytest-dev/pytest-xdist#1386), and every test became a unit of its own, its module and session
    fixtures made again on each worker and two session servers running side by side. The units start in
    collection order (``pytest_collection_modifyitems``), not xdist's most-tests-first."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False
    return FileGroups(config, log)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the order units start in (a stable sort: files stay in order)
        items.sort(key=lambda item: start_rank(item.nodeid))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real MMLU/GSM8K release files (``mmlu/{dev,test}``, ``gsm8k/*.jsonl``).

    Passed explicitly by `make test` (TRTLLM_PIPELINE_TEST_DATA); the product never assumes it.
    """
    value = os.environ.get("TRTLLM_PIPELINE_TEST_DATA")
    if not value or not (Path(value) / "mmlu").is_dir():
        pytest.skip("real MMLU/GSM8K data not found: set TRTLLM_PIPELINE_TEST_DATA (make test sets it)")
    return Path(value)


@pytest.fixture(scope="session")
def engines_dir(tmp_path_factory) -> Path:
    """One engines directory for the whole session: stages cache into it."""
    return tmp_path_factory.mktemp("engines")


def load(name: str):
    from trtllm_pipeline.config import load_config

    return load_config(CONFIGS / f"{name}.yaml")


@pytest.fixture(scope="session")
def artifact_store(tmp_path_factory) -> Path | None:
    """Under xdist, a folder every worker of this run sees (their base temporary folders' parent), where the first
    worker to quantize or build a config leaves a copy for the others; None in a single process."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    store = tmp_path_factory.getbasetemp().parent / "shared-artifacts"
    store.mkdir(exist_ok=True)
    return store


def made_once(store: Path | None, engines_dir: Path, name: str, parts: tuple[str, ...], make):
    """``make()``, which writes ``parts`` of ``engines_dir/name``, done once across the run's workers: each worker
    has its own engines directory (its servers and results apart), but a config quantized or built by one worker is
    copied into the next one's, where the stage finds it cached (a copy is re-hashed and taken as a cache hit, as
    test_demo's copies are). The lock makes a second worker wait for the first's copy rather than redo the work
    beside it on the same cores."""
    if store is None:
        return make()
    import fcntl
    import shutil

    with open(store / f"{name}.{'+'.join(parts)}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        for part in parts:
            if (store / name / part).is_dir() and not (engines_dir / name / part).exists():
                shutil.copytree(store / name / part, engines_dir / name / part, symlinks=True)
        result = make()
        for part in parts:
            if (engines_dir / name / part).is_dir() and not (store / name / part).exists():
                shutil.copytree(engines_dir / name / part, store / name / part, symlinks=True)
        return result


@pytest.fixture(scope="session")
def quantized(engines_dir, artifact_store):
    """``quantized("tiny-qwen2-fp8-tp2")`` -> QuantizeResult, quantized once per session (once per run under xdist:
    ``made_once``)."""
    from trtllm_pipeline.quantize import quantize

    done = {}

    def get(name: str):
        if name not in done:
            done[name] = made_once(artifact_store, engines_dir, name, ("checkpoint", "hf_checkpoint"),
                                   lambda: quantize(load(name), engines_dir=engines_dir))
        return done[name]

    return get


@pytest.fixture(scope="session")
def built(engines_dir, quantized, artifact_store):
    """``built("tiny-qwen2-fp8-tp1")`` -> BuildResult (torch runtime), built once per session (once per run under
    xdist: ``made_once``).

    The engine lives in the session's ``engines_dir``; load it with
    ``runtimes.registry.load_runtime(load(name), engines_dir)``.
    """
    from trtllm_pipeline.build import build

    done = {}

    def get(name: str):
        if name not in done:
            quantized(name)
            done[name] = made_once(artifact_store, engines_dir, name, ("engine",),
                                   lambda: build(load(name), engines_dir=engines_dir, runtime="torch"))
        return done[name]

    return get


@pytest.fixture(scope="session")
def kv_scaled(built, tmp_path_factory):
    """``kv_scaled("tiny-qwen2-bf16-fp8kv-tp1", 0.02)`` -> a copy of that build's checkpoint (an FP8 KV cache's) with
    every layer's KV scale set to 0.02. ModelOpt clamps FP8 KV scales to at least 1 (export/quant_utils.py), so the
    tiny models' are all 1; a smaller one saturates their larger keys and values and makes the scale's use show.
    ``scale`` may also be one value per layer; a build without an FP8 KV cache (``tiny-qwen2-fp8-tp1``) gets one."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    def get(name: str, scale) -> Path:
        src = built(name).engine_dir.parent / "checkpoint"
        dst = tmp_path_factory.mktemp("kv-scaled") / "checkpoint"
        shutil.copytree(src, dst)
        (dst / "manifest.json").unlink()  # a checkpoint of another tool's (quantize's record would refuse it)
        config = json.loads((dst / "config.json").read_text())
        layers = config["num_hidden_layers"]
        scales = [float(s) for s in scale] if isinstance(scale, (list, tuple)) else [float(scale)] * layers
        assert len(scales) == layers, (scales, layers)
        config["quantization"]["kv_cache_quant_algo"] = "FP8"
        (dst / "config.json").write_text(json.dumps(config, indent=2))
        for rank in dst.glob("rank*.safetensors"):
            tensors = load_file(rank)
            for i, s in enumerate(scales):
                tensors[f"transformer.layers.{i}.attention.kv_cache_scaling_factor"] = torch.tensor([s])
            save_file(tensors, rank)
        return dst

    return get


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (never assume 8000 is free), drawn below the kernel's
    ephemeral range: a port the OS handed out by ``bind(0)`` and released is soon another process's outgoing
    connection's (a parallel test's client took a server's gRPC port between the pick and its bind, 2026-12-07),
    while ports below the range are only ever taken by a bind. The OS's pick where no such port is found."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    picked: list[int] = []
    for port in random.sample(range(10000, low), min(200, max(0, low - 10000))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        picked.append(port)
        if len(picked) == n:
            return picked
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture(scope="session")
def served(built, engines_dir):
    """``served("tiny-qwen2-fp8-tp1")`` -> serve.Server: a real tritonserver on free 127.0.0.1 ports.

    Built, deployed and started once per session (about half a minute), stopped when the session
    ends. Clients connect to ``f"127.0.0.1:{server.grpc_port}"`` (or ``http_port``; OpenAI clients to
    ``f"http://127.0.0.1:{server.openai_port}/v1"``).
    """
    from trtllm_pipeline import serve

    started = {}

    def get(name: str):
        if name not in started:
            built(name)
            http, grpc, metrics, openai = free_ports(4)
            started[name] = serve.start(load(name), engines_dir=engines_dir, http=http, grpc=grpc, metrics=metrics,
                                        openai=openai)
        return started[name]

    yield get
    for name, server in started.items():
        serve.stop(load(name), engines_dir=engines_dir)
        # Stopped means gone: the server and every Python-backend stub of its process group.
        assert not serve.group_alive(server.pid), f"processes of the {name} server are left behind"
        assert serve.read_state(load(name), engines_dir) is None


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (exit codes and stderr as a user sees them)."""
    return subprocess.run(
        [sys.executable, "-m", "trtllm_pipeline", *args],
        cwd=cwd or REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout,
    )
