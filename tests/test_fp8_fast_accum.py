"""``TRTLLM_PIPELINE_FP8_FAST_ACCUM``: cuBLAS's FP8 GEMMs with the whole K in the tensor cores' accumulator (a GPU
A/B), inert where no FP8 GEMM runs, and the benchmark that weighs its speed against its error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from trtllm_pipeline.runtimes.torch_engine import switches
from trtllm_pipeline.runtimes.torch_engine.model import Linear

TESTS = Path(__file__).resolve().parent


def test_the_switch_is_off_unless_set_to_one(monkeypatch):
    monkeypatch.delenv("TRTLLM_PIPELINE_FP8_FAST_ACCUM", raising=False)
    assert not switches.fp8_fast_accum()
    for value, on in (("1", True), ("0", False), ("", False), ("yes", False)):
        monkeypatch.setenv("TRTLLM_PIPELINE_FP8_FAST_ACCUM", value)
        assert switches.fp8_fast_accum() is on


def test_an_fp8_linear_takes_it_only_where_cublas_runs_its_gemm(monkeypatch):
    """On the CPU an FP8 layer is emulated (no ``torch._scaled_mm``), so the switch changes nothing there: same
    output bits with it on and off."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(32, 64, generator=gen) / 8
    tensors = {"p.weight": (w / (w.abs().max() / 448)).to(torch.float8_e4m3fn),
               "p.weights_scaling_factor": (w.abs().max() / 448).reshape(1),
               "p.activation_scaling_factor": torch.tensor([0.02])}
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    outs = []
    for value in ("0", "1"):
        monkeypatch.setenv("TRTLLM_PIPELINE_FP8_FAST_ACCUM", value)
        lin = Linear(tensors, "p", torch.bfloat16, torch.device("cpu"))
        assert lin.fp8 and not lin.scaled_mm and not lin.fast_accum
        outs.append(lin(x))
    assert torch.equal(outs[0], outs[1])


def test_the_gpu_benchmark_runs_its_code_paths_on_the_cpu(tmp_path):
    """``benchmarks/fp8_fast_accum.py --dry-run``: every linear at two M both ways, timed and compared with float64
    (on the CPU both ways are the same product: the errors are the BF16 output's rounding)."""
    out = tmp_path / "fa.json"
    proc = subprocess.run([sys.executable, str(TESTS.parent / "benchmarks" / "fp8_fast_accum.py"), "--dry-run",
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert {row["linear"] for row in r["rows"]} == {"qkv", "dense", "fc_gate", "proj"} and len(r["rows"]) == 8
    assert all(row["precise_error"] < 4e-3 and row["fast_error"] < 4e-3 for row in r["rows"]), r["rows"]
    assert set(r["layer_us"]) == {"32", "48"}
