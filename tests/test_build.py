"""The build stage: torch-runtime engines here, an honest refusal (and a full plan) for TensorRT-LLM."""

from __future__ import annotations

import json
import shutil

from conftest import CONFIGS, load, run_cli
from trtllm_pipeline.artifacts import read_manifest
from trtllm_pipeline.build import build

R1_FP8_TP4 = str(CONFIGS / "r1-distill-qwen-7b-fp8-tp4.yaml")


def test_tiny_builds_with_the_torch_runtime_and_caches(built, engines_dir):
    for name in ("tiny-qwen2-bf16-tp1", "tiny-qwen2-fp8-tp1", "tiny-qwen2-fp8-tp2", "tiny-qwen2-fp8-tp4"):
        result = built(name)
        manifest = read_manifest(result.engine_dir)
        assert manifest["runtime"] == "torch" and manifest["runtime_reason"]
        assert manifest["engine"]["checkpoint_tp"] == load(name).parallelism.tp
        assert (result.engine_dir / manifest["checkpoint"]["dir"] / "config.json").is_file()
    again = build(load("tiny-qwen2-fp8-tp2"), engines_dir=engines_dir, runtime="torch")
    assert again.cache_hit and again.manifest["inputs_hash"] == built("tiny-qwen2-fp8-tp2").manifest["inputs_hash"]


def test_auto_picks_torch_here_and_says_why(quantized, tmp_path):
    # The session's quantized checkpoint copied in (found as a cache hit), not calibrated again: the build is the
    # stage under test, and it runs whole, into a directory of its own.
    source = quantized("tiny-qwen2-fp8-tp1").checkpoint_dir.parent
    for part in ("checkpoint", "hf_checkpoint"):
        shutil.copytree(source / part, tmp_path / "tiny-qwen2-fp8-tp1" / part, symlinks=True)
    proc = run_cli("build", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp1.yaml"), "--engines-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "quantize: cache hit" in proc.stderr + proc.stdout and "build: torch engine for" in proc.stderr + proc.stdout
    assert "torch runtime" in proc.stdout and "TensorRT-LLM is not installed" in proc.stdout
    assert json.loads((tmp_path / "tiny-qwen2-fp8-tp1" / "engine" / "manifest.json").read_text())["runtime"] == "torch"


def test_7b_tensorrt_llm_dry_run_prints_the_whole_plan(tmp_path):
    proc = run_cli("build", "-c", R1_FP8_TP4, "--runtime", "tensorrt_llm", "--dry-run", "--engines-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    command = next(line for line in out.splitlines() if line.strip().startswith("trtllm-build "))
    for flag in ("--low_latency_gemm_plugin fp8", "--max_batch_size 8", "--max_input_len 2048",
                 "--max_seq_len 8192", "--max_num_tokens 8192", "--kv_cache_type paged", "--workers 4"):
        assert flag in command
    assert "[quantize]" in out and "mpirun -n 4" in out
    assert out.count("-n 1 /opt/tritonserver/bin/tritonserver") == 4  # one Triton server per rank
    assert not tmp_path.joinpath("r1-distill-qwen-7b-fp8-tp4").exists()


def test_7b_tensorrt_llm_build_refuses_here_with_the_way_out(tmp_path):
    proc = run_cli("build", "-c", R1_FP8_TP4, "--engines-dir", str(tmp_path))
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert "TensorRT-LLM is not installed" in proc.stderr
    assert "--runtime torch" in proc.stderr
    assert not tmp_path.joinpath("r1-distill-qwen-7b-fp8-tp4", "engine").exists()


def test_generate_streams_the_same_text_for_every_tp(built, engines_dir):
    outputs = []
    for tp in (1, 2, 4):
        built(f"tiny-qwen2-fp8-tp{tp}")
        proc = run_cli("generate", "-c", str(CONFIGS / f"tiny-qwen2-fp8-tp{tp}.yaml"), "--engines-dir", str(engines_dir),
                       "--max-tokens", "16", "What is 2+2?")
        assert proc.returncode == 0, proc.stderr
        assert "torch runtime" in proc.stderr and "16 generated" in proc.stderr
        if tp > 1:  # runtime.tp_mode auto on CPU: one process per rank (tests/test_tensor_parallel.py)
            assert f"tensor parallel in {tp} processes" in proc.stderr, proc.stderr
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1] == outputs[2] and outputs[0].strip()


def test_generate_without_a_build_says_how(tmp_path):
    proc = run_cli("generate", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp1.yaml"), "--engines-dir", str(tmp_path), "hi")
    assert proc.returncode == 2 and "trtllm-pipeline build -c" in proc.stderr and "Traceback" not in proc.stderr
