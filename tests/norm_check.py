"""Run by tests/test_fast_decode.py in a subprocess: the residual add + RMSNorm kernel (runtimes/torch_engine/cuda/norm.py)
through Triton's interpreter, reading a linear's int64 accumulators (fixed_sum) and writing the residual after the
add into another buffer (``x_out``, as the decode step does when its norms are folded into the GEMVs), against
the eager model's roundings computed by torch. Prints JSON.

    python tests/norm_check.py
"""

from __future__ import annotations

import json

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch

from trtllm_pipeline.runtimes.torch_engine.cuda import fixed_sum, norm

HIDDEN, EPS = 96, 1e-6


def main() -> None:
    gen = torch.Generator().manual_seed(5)
    residual = torch.randn(1, HIDDEN, generator=gen).bfloat16()
    y = torch.randn(1, HIDDEN, generator=gen)
    units = torch.round(y.double() * 2.0**32).long()  # the linear's output as its accumulators hold it
    weight = (torch.rand(HIDDEN, generator=gen) + 0.5).bfloat16()
    before = residual.clone()
    x_out = torch.empty_like(residual)
    out = torch.empty_like(residual)
    assert fixed_sum.is_accumulator(units)
    norm.residual_rmsnorm(residual, units, weight, out, None, EPS, torch.bfloat16, x_out=x_out)
    x = (residual.float() + fixed_sum.to_float(units).bfloat16().float()).bfloat16()  # each rounded as eager
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
    expected = ((x.float() * rstd).bfloat16().float() * weight.float()).bfloat16()
    print(json.dumps({"x_out_is_the_sum": torch.equal(x_out, x), "residual_untouched": torch.equal(residual, before),
                      "normed_max_diff": (out.float() - expected.float()).abs().max().item(),
                      "normed_max": expected.float().abs().max().item()}))


if __name__ == "__main__":
    main()
