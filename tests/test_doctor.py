"""doctor: the machine's facts, and which runtime every shipped config gets here."""

import importlib.util
import json

import pytest

from conftest import run_cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None,
                                reason="asserts what a machine without TensorRT-LLM reports")


def test_doctor_reports_this_machine_and_every_config():
    proc = run_cli("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["tensorrt_llm"] is None and "not installed" in facts["tensorrt_llm_problem"]
    assert facts["nvidia-modelopt"] and facts["tritonserver"]["pytriton"].endswith("tritonserver")
    configs = facts["configs"]
    assert configs["tiny-qwen2-fp8-tp1"].startswith("torch (auto: TensorRT-LLM is not installed")
    verdict = configs["r1-distill-qwen-7b-fp8-tp4"]
    assert "cannot run here" in verdict and "needs 4 CUDA GPU" in verdict and "--runtime torch" in verdict
    human = run_cli("doctor")
    assert human.returncode == 0 and "TensorRT-LLM" in human.stdout and "not installed" in human.stdout


def test_doctor_says_what_a_7b_needs_and_never_ready_on_a_small_cpu_machine():
    from conftest import load
    from trtllm_pipeline.doctor import Machine, config_verdict
    from trtllm_pipeline.machine import Gpu

    small = Machine(gpus=[], memory_bytes=23 * 10**9, free_disk_bytes=80 * 10**9, cores=2)  # this project's machine
    h200 = Machine(gpus=[Gpu(0, "NVIDIA H200", 90, 139.8, 139.0)], memory_bytes=128 * 10**9,
                   free_disk_bytes=500 * 10**9, cores=16)
    random_7b = load("r1-distill-qwen-7b-random-fp8-tp1")
    verdict = config_verdict(random_7b, small)
    assert verdict.startswith("torch: not ready here: needs ")
    assert "ready" not in verdict.removeprefix("torch: not ready")
    for need in ("GB of disk (80 free)", "a GPU with ~", "(none here)", "GB of memory (23 here)",
                 "s a token on 2 core"):
        assert need in verdict, need
    assert config_verdict(random_7b, h200) == "torch: ready"
    hub_7b = config_verdict(load("r1-distill-qwen-7b-fp8-tp4"), small)
    assert "`--runtime torch` runs it in PyTorch instead, but not ready here" in hub_7b and "from the hub" in hub_7b
    assert config_verdict(load("tiny-qwen2-fp8-tp1"), small).startswith("torch (auto: ")
    assert "not ready" not in config_verdict(load("tiny-qwen2-fp8-tp1"), small)
