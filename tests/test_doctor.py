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
