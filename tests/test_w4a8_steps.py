"""W4A8-AWQ's weights as the kernels round them (E4M3 of ``q x step``, one product) against eager's, ModelOpt's
``(q / q_scale) x q2`` (a division, then a product): equal at every weight, ties included (quant_linear._w4a8_steps).
Before it, a random layer of BF16 weights had whole groups where q = +-3 rounded to the next E4M3 value, and the GEMMs'
outputs were 0.7% off eager's (H100 2026-12-06e: W4A8 mlp.proj's candidates all at 7.3e-3, none kept)."""

import sys
from pathlib import Path

import torch

from trtllm_pipeline.runtimes.torch_engine.cuda import quant_linear
from trtllm_pipeline.runtimes.torch_engine.model import Linear, _per_group, unpack_int4_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import quant_fast_path as qf  # noqa: E402


def _layer(seed: int, n: int = 256, k: int = 1024) -> Linear:
    """A W4A8-AWQ layer of random BF16 weights, quantized as benchmarks/quant_gemm.py's are."""
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16)
    tensors = {f"p.{name}": t for name, t in qf.quantize_linear("w4a8_awq", w, 5.0, gen).items()}
    return Linear(tensors, "p", torch.bfloat16, torch.device("cpu"), "w4a8_awq", qf.GROUP)


def _kernel_weight(lin: Linear, step: torch.Tensor) -> torch.Tensor:
    """What the kernels multiply: E4M3(q x step) [N, K], in eager's units (times 1 / q2)."""
    values = unpack_int4_rows(lin.weight).float()
    q2 = quant_linear.FP8_MAX / (lin.scale_2.float() * quant_linear.FP8_MAX)
    e4m3 = (values * _per_group(step, values.shape[1])).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    return e4m3 * (1 / q2)


def test_w4a8_kernel_weights_are_eagers_at_every_weight_ties_included():
    lin = _layer(2)
    q = lin.kernel_weight()
    step = q.scales.permute(2, 1, 0).reshape(q.n, -1)  # [G, 2, N/2] -> [N, G]
    eager = lin._dequantize()
    assert torch.equal(_kernel_weight(lin, step), eager)
    # the one-product step as it was: this layer has ties it rounds the other way
    s = lin.scales.float()
    q2 = quant_linear.FP8_MAX / (lin.scale_2.float() * quant_linear.FP8_MAX)
    plain = 1.0 / (torch.tensor(7.0) / (s * 7.0)) * q2
    missed = (_kernel_weight(lin, plain) != eager).sum().item()
    assert missed > 0, "no tie in this layer: the test no longer shows what the steps fix"
    assert torch.equal(step != plain, (_kernel_weight(lin, plain) != eager).reshape(q.n, -1, qf.GROUP).any(-1))
