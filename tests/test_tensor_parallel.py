"""Tensor parallelism in the torch runtime, for real: one process per rank, gloo on 127.0.0.1, no mocks.

What holds the distributed path (``runtimes/torch_engine/tp``) to the tp=1 model: the same greedy tokens and
logits within float32 rounding (bf16 weights computed in float32, and int4_awq, whose activations
are not quantized), FP8 within its tolerance (a row-parallel partial sum rounds its last bit
differently from the whole GEMM, and an FP8 activation quantizer can turn that into one FP8 step
downstream, so FP8 tokens are compared on the shipped CLI prompt, tests/test_build.py), each rank
holding about 1/N of the weights, a killed worker failing the requests within seconds, workers that
die with their leader, and a served TP=2 model that answers the benchmark and leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from conftest import CONFIGS, REPO, free_ports, load, run_cli
from trtllm_pipeline.config import config_from_dict, load_yaml
from trtllm_pipeline.errors import UnavailableError
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

PROMPTS = [list(range(100, 164)), list(range(300, 340))]
SHARDED = ("embedding", "lm_head", "layers")  # all sharded here: the checkpoint splits the embedding too


def _open(ckpt: Path, mode: str = "distributed") -> TorchRuntime:
    return TorchRuntime(ckpt, ckpt / "tokenizer", max_batch_size=4, max_seq_len=512, dtype="float32", tp_mode=mode)


def _ckpt(built, name: str) -> Path:
    return built(name).engine_dir.parent / "checkpoint"


def _greedy(rt: TorchRuntime, n: int = 16) -> list[list[int]]:
    return [c.token_ids for c in rt.generate(PROMPTS, SamplingParams(max_tokens=n, end_id=-1))]


def _logits(rt: TorchRuntime, ids: list[int]) -> torch.Tensor:
    return rt.executor.logits(rt.hidden_states(ids))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _score(rt: TorchRuntime):
    prefix = list(range(200, 240))  # a shared prefix: computed once, copied to the other slots (copy_prefix)
    return rt.score([prefix + [5, 6], prefix + [8], prefix + [5, 6]], [[11], [12, 13], [14]])


def _sharded_bytes(rank: dict) -> int:
    return sum(rank["memory"][part] for part in SHARDED)


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an exited child nobody has reaped yet is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _workers_of(ckpt: Path) -> list[int]:
    """Tensor-parallel worker processes running this checkpoint, found in /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"trtllm_pipeline.runtimes.torch_engine.tp.worker" in argv and str(ckpt).encode() in argv and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_distributed_bf16_matches_tp1_and_each_rank_holds_its_share(built):
    ref = _open(_ckpt(built, "tiny-qwen2-bf16-tp1"), "merged")
    try:
        want_tokens, want_logits, want_scores = _greedy(ref), _logits(ref, PROMPTS[0]), _score(ref)
        (whole,) = ref.describe()["ranks"]
    finally:
        ref.close()
    for tp in (2, 4):
        ckpt = _ckpt(built, f"tiny-qwen2-bf16-tp{tp}")
        rt = _open(ckpt)
        try:
            described = rt.describe()
            assert described["tp_mode"] == "distributed" and described["world_size"] == tp
            assert len(set(rt.processes)) == tp and rt.processes[0] == os.getpid()
            assert len(_workers_of(ckpt)) == tp - 1
            assert _greedy(rt) == want_tokens
            logits = _logits(rt, PROMPTS[0])
            assert _rel(logits, want_logits) < 1e-5, _rel(logits, want_logits)
            assert torch.equal(logits.argmax(-1), want_logits.argmax(-1))
            for (got, greedy), (want, want_greedy) in zip(_score(rt), want_scores):
                assert got == pytest.approx(want, abs=1e-4) and greedy == want_greedy
            # Each rank's resident weights: about 1/tp of the whole (asserted loosely), and the RSS is measured.
            ranks = described["ranks"]
            assert [r["rank"] for r in ranks] == list(range(tp))
            for rank in ranks:
                assert _sharded_bytes(rank) < (0.6 if tp == 2 else 0.35) * _sharded_bytes(whole), rank
                assert rank["rss_bytes"] and rank["rss_bytes"] > _sharded_bytes(rank)
            assert sum(_sharded_bytes(r) for r in ranks) == pytest.approx(_sharded_bytes(whole), rel=0.02)
        finally:
            rt.close()
        assert _workers_of(ckpt) == []


def test_quantized_shards_run_with_their_own_scales(built, engines_dir):
    """FP8 (per-tensor scales in every rank file) at tp=4, and int4_awq (per-group scales split with the
    features they scale) at tp=2, each rank from its own file."""
    from trtllm_pipeline.quantize import quantize

    fp8 = _open(_ckpt(built, "tiny-qwen2-fp8-tp1"), "merged")
    try:
        fp8_logits = _logits(fp8, PROMPTS[0])
    finally:
        fp8.close()
    rt = _open(_ckpt(built, "tiny-qwen2-fp8-tp4"))
    try:
        assert rt.describe()["world_size"] == 4 and rt.describe()["weight_format"] == "fp8"
        logits = _logits(rt, PROMPTS[0])
        assert _rel(logits, fp8_logits) < 1e-2, _rel(logits, fp8_logits)  # FP8's tolerance (measured ~1e-6)
        assert torch.equal(logits[-1].argmax(), fp8_logits[-1].argmax())
    finally:
        rt.close()

    data = load_yaml(CONFIGS / "tiny-qwen2-int4-awq-tp1.yaml")
    data["parallelism"]["tp"] = 2
    int4_tp2 = quantize(config_from_dict(data, name="tiny-qwen2-int4-awq-tp2"), engines_dir=engines_dir)
    ref = _open(_ckpt(built, "tiny-qwen2-int4-awq-tp1"), "merged")
    try:
        want_tokens, want_logits = _greedy(ref, 12), _logits(ref, PROMPTS[0])
    finally:
        ref.close()
    rt = _open(int4_tp2.checkpoint_dir)
    try:
        assert rt.describe()["world_size"] == 2 and rt.describe()["weight_format"] == "int4_awq"
        assert _greedy(rt, 12) == want_tokens
        assert _rel(_logits(rt, PROMPTS[0]), want_logits) < 1e-5
    finally:
        rt.close()


def test_one_rank_runs_the_distributed_code_path(built):
    """tp_mode distributed on a tp=1 checkpoint: a group of one (on a GPU: NCCL with world size 1)."""
    ckpt = _ckpt(built, "tiny-qwen2-bf16-tp1")
    ref, rt = _open(ckpt, "merged"), _open(ckpt, "distributed")
    try:
        assert rt.describe()["tp_mode"] == "distributed" and rt.describe()["world_size"] == 1
        assert type(rt.executor).__name__ == "TpExecutor" and rt.processes == [os.getpid()]
        assert _greedy(rt) == _greedy(ref)
    finally:
        rt.close()
        ref.close()


def test_distributed_ranks_run_the_same_plan_with_prefix_reuse_and_preemption(built):
    """tp=2 with a pool too small for four requests (blocks of 4, 30 of them) and the prefix cache on: every rank
    runs the plan's rows through the same block tables, preempted requests are recomputed, and the greedy tokens
    are the merged tp=1 model's with a pool large enough for all."""
    system = list(range(1000, 1040))
    prompts = [system + list(range(2000 + 9 * i, 2006 + 9 * i)) for i in range(4)]
    params = SamplingParams(max_tokens=20, end_id=-1)
    ref = _open(_ckpt(built, "tiny-qwen2-bf16-tp1"), "merged")
    try:
        want = [c.token_ids for c in ref.generate(prompts, params)]
    finally:
        ref.close()
    rt = TorchRuntime(_ckpt(built, "tiny-qwen2-bf16-tp2"), _ckpt(built, "tiny-qwen2-bf16-tp2") / "tokenizer",
                      max_batch_size=4, max_seq_len=512, dtype="float32", tp_mode="distributed", kv_block_size=4,
                      kv_cache_blocks=30, enable_kv_cache_reuse=True)
    try:
        assert [c.token_ids for c in rt.generate(prompts[:1], params)] == want[:1]
        assert [c.token_ids for c in rt.generate(prompts, params)] == want
        stats = rt.stats()
        assert stats["preemptions"] > 0 and stats["prefix_cache_hits"] >= 3 * len(system)
    finally:
        rt.close()


def test_a_killed_worker_fails_the_requests_within_seconds(built):
    ckpt = _ckpt(built, "tiny-qwen2-bf16-tp2")
    rt = _open(ckpt)
    try:
        params = SamplingParams(max_tokens=400, end_id=-1)
        for i, prompt in enumerate(PROMPTS):
            rt.submit(i, prompt, params)
        rt.step(), rt.step()
        worker = rt.processes[1]
        os.kill(worker, signal.SIGKILL)
        start, errors = time.monotonic(), {}
        while rt.has_work() and time.monotonic() - start < 20:
            errors.update({e.request_id: e.error for e in rt.step() if e.finish_reason == "error"})
        elapsed = time.monotonic() - start
        assert set(errors) == {0, 1} and elapsed < 5, (errors, elapsed)
        assert f"worker rank 1 (pid {worker}) was killed by SIGKILL" in errors[0]
        with pytest.raises(UnavailableError, match="tensor-parallel group of 2 processes stopped") as exc:
            rt.submit(9, PROMPTS[0], params)
        assert "serve --stop" in exc.value.fix
        with pytest.raises(UnavailableError, match="worker rank 1"):
            rt.score([[1, 2]], [[3]])
    finally:
        rt.close()
    assert _workers_of(ckpt) == []


def test_workers_die_with_their_leader(built):
    ckpt = _ckpt(built, "tiny-qwen2-bf16-tp4")
    leader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime
        rt = TorchRuntime({str(ckpt)!r}, {str(ckpt / 'tokenizer')!r}, max_batch_size=2, max_seq_len=256,
                          dtype="float32", tp_mode="distributed")
        print(*rt.processes[1:], flush=True)
        time.sleep(120)
        """)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        workers = [int(p) for p in leader.stdout.readline().split()]
        assert len(workers) == 3 and all(_alive(p) for p in workers)
        leader.kill()  # SIGKILL: no atexit, no close(); PR_SET_PDEATHSIG and the stdin pipe remain
        leader.wait()
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers)
    finally:
        leader.kill()


def test_generate_runs_one_process_per_rank_and_says_so(built, engines_dir):
    built("tiny-qwen2-fp8-tp2")
    args = ("generate", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp2.yaml"), "--engines-dir", str(engines_dir),
            "--max-tokens", "8", "--raw", "--runtime", "torch", "hello")
    distributed, merged = run_cli(*args), run_cli(*args, "--tp-mode", "merged")
    assert distributed.returncode == merged.returncode == 0, distributed.stderr + merged.stderr
    assert "tensor parallel: 2 processes (gloo on 127.0.0.1), pids" in distributed.stderr
    assert "tensor parallel in 2 processes" in distributed.stderr
    assert "2 TP shards merged in one process" in merged.stderr
    assert distributed.stdout == merged.stdout and distributed.stdout.strip()


@pytest.mark.slow
def test_served_tp2_answers_the_benchmark_then_a_killed_worker_ends_every_request_and_readiness(
        built, engines_dir, tmp_path):
    """Served over two processes: the benchmark's requests; then the worker is SIGKILLed under streams through
    every path (the BLS over HTTP and gRPC, /v1 streamed and not): each ends with the error (they used to
    wait for ever), readiness turns 503 everywhere and new requests are 503s; stop leaves no process."""
    from trtllm_pipeline import bench, serve

    name = "tiny-qwen2-fp8-tp2"
    ckpt = _ckpt(built, name)
    cfg = load(name)
    http, grpc, metrics, openai = free_ports(4)
    server = serve.start(cfg, engines_dir=engines_dir, http=http, grpc=grpc, metrics=metrics, openai=openai)
    try:
        workers = _workers_of(ckpt)
        assert len(workers) == 1, "the served model (rank 0) starts its worker"
        tokenizer = bench.load_tokenizer(bench.config_tokenizer_dir(cfg, engines_dir))
        settings = bench.BenchSettings(protocol="triton-grpc", url=f"127.0.0.1:{server.grpc_port}",
                                       levels=(bench.LoadLevel(concurrency=4),), input_tokens=24, output_tokens=12,
                                       requests=8, warmup=1)
        result = bench.bench(settings, tokenizer=tokenizer, tokenizer_source="checkpoint", output=tmp_path / "b.json")
        (entry,) = result.data["summary"]
        assert entry["requests"] == 8 and entry["errors"] == 0 and entry["output_tokens_mean"] == 12
        assert all(r["output_tokens"] == 12 and len(r["token_times_ms"]) == 12 for r in result.data["requests"])
        _kill_a_worker_under_load(server, cfg.name, workers[0])
    finally:
        serve.stop(cfg, engines_dir=engines_dir)
    assert not serve.group_alive(server.pid)
    assert _workers_of(ckpt) == [] and not any(_alive(p) for p in workers)


def _kill_a_worker_under_load(server, model: str, worker: int) -> None:
    import queue
    import threading

    import requests

    from trtllm_pipeline.client import TritonClient

    base, v1 = f"http://127.0.0.1:{server.http_port}", f"http://127.0.0.1:{server.openai_port}/v1"
    long = {"max_tokens": 4000, "min_tokens": 4000}
    ended: queue.Queue = queue.Queue()
    started = threading.Barrier(5)

    def http_stream(path: str, body: dict) -> None:
        events, last = 0, b""
        with requests.post(path, json=body, stream=True, timeout=120) as response:
            for line in response.iter_lines():
                if line and line != b"data: [DONE]":
                    events, last = events + 1, line
                    if events == 3:
                        started.wait()
        ended.put((path, response.status_code, last.decode()[:300], events))

    def v1_whole() -> None:
        started.wait()
        response = requests.post(f"{v1}/completions", json={"model": model, "prompt": "hi", "max_tokens": 4000,
                                                              "min_tokens": 4000}, timeout=120)
        ended.put(("v1 whole", response.status_code, response.text[:300], 0))

    def grpc_stream() -> None:
        pieces = 0
        try:
            with TritonClient(f"127.0.0.1:{server.grpc_port}", "grpc", timeout_s=120) as client:
                for _ in client.stream_tokens("hello", threading.Event(), **long):
                    pieces += 1
                    if pieces == 3:
                        started.wait()
            ended.put(("grpc", None, "no error", pieces))
        except Exception as exc:
            ended.put(("grpc", None, str(exc)[:300], pieces))

    threads = [threading.Thread(target=http_stream, args=(f"{base}/v2/models/tensorrt_llm_bls/generate_stream",
                                                         {"text_input": "hello", "stream": True, **long})),
               threading.Thread(target=http_stream, args=(f"{v1}/completions", {"model": model, "prompt": "hi",
                                                                                 "stream": True, **long})),
               threading.Thread(target=v1_whole), threading.Thread(target=grpc_stream)]
    for t in threads:
        t.daemon = True  # a test that fails must not hang the session on them
    for t in threads:
        t.start()
    started.wait(timeout=120)  # every stream has its first tokens (the whole one is under way)
    os.kill(worker, signal.SIGKILL)
    for t in threads:
        t.join(timeout=60)
    results = [ended.get_nowait() for _ in range(ended.qsize())]
    assert len(results) == 4, results  # each ended (none waits for ever)
    for where, status, last, _ in results:
        assert "killed by SIGKILL" in last, (where, status, last)
    assert {where: status for where, status, _, _ in results}["v1 whole"] == 503
    for path in ("/v2/health/ready", "/v2/models/tensorrt_llm_bls/ready", "/v2/models/ensemble/ready"):
        assert requests.get(base + path, timeout=10).status_code == 503, path
    assert requests.get(f"{v1}/models", timeout=10).status_code == 503
    r = requests.post(f"{base}/v2/models/tensorrt_llm_bls/generate", json={"text_input": "hi", "max_tokens": 2},
                      timeout=30)
    assert r.status_code == 503 and "killed by SIGKILL" in r.json()["error"]
    r = requests.post(f"{v1}/completions", json={"model": model, "prompt": "hi", "max_tokens": 2}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"


def test_generate_refuses_a_runtime_the_engine_was_not_built_for(built, engines_dir):
    built("tiny-qwen2-fp8-tp2")
    proc = run_cli("generate", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp2.yaml"), "--engines-dir", str(engines_dir),
                   "--runtime", "tensorrt_llm", "hi")
    assert proc.returncode == 2 and "built for the torch runtime, not tensorrt_llm" in proc.stderr
    assert "--runtime tensorrt_llm" in proc.stderr and "Traceback" not in proc.stderr


def test_the_steps_collectives_benchmark_checks_its_sums_and_gathers():
    """benchmarks/tp_collectives.py (the all-reduce time per token of issue 15, on GPUs) runs the fast step's
    collectives with the runtime's Comm; on CPU (gloo, 2 ranks) its own check of every sum and gathered slice
    passes before anything is timed, and it reports each kind and the bytes a rank sends."""
    import json

    proc = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "benchmarks" / "tp_collectives.py"),
                           "--world-size", "2", "--device", "cpu", "--layers", "2", "--hidden", "64", "--vocab", "256",
                           "--batch", "1,4", "--replays", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert [b["batch"] for b in report["batches"]] == [1, 4]
    row = report["batches"][1]
    assert set(row["us_per_step"]) == {"embedding all-reduce", "4 row-parallel all-reduces", "lm_head all-gather", "all"}
    assert row["bytes_per_rank"] == {"all-reduces": 5 * 4 * 64 * 2, "all-gather": 4 * 128 * 4}
