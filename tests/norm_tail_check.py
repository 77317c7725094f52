"""Run by tests/test_fast_decode.py in a subprocess: the batch-1 INT4 GEMV with the residual add + RMSNorm as
its tail (``norm.NormTail``), through Triton's interpreter, against the same GEMV followed by the standalone
norm launch: residual, normed row and the consumers' prepared inputs, bit for bit. Prints JSON, one row per
case (one or two consumers, or none as before lm_head).

    python tests/norm_tail_check.py
"""

from __future__ import annotations

import json

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch

from quant_kernel_check import tensors
from trtllm_pipeline.runtimes.cuda import gemv_input, norm, quant_gemv, quant_linear
from trtllm_pipeline.runtimes.torch_model import Linear

DT, HIDDEN, K, GROUP = torch.bfloat16, 256, 512, 128


def case(consumers: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    q = quant_linear.QuantWeight.of(Linear(tensors("int4_awq", HIDDEN, K, GROUP, gen), "p", DT, torch.device("cpu"),
                                           "int4_awq", GROUP))
    cfg = quant_gemv.pick_config(q, 4, tma=False, block_n=128)  # two row tiles, K split
    assert quant_gemv.reduces(q, cfg) and quant_gemv.row_tiles(q, cfg) == 2, cfg
    x = quant_gemv.launch_input(torch.randn(1, K, generator=gen).to(DT), q, DT)
    residual = torch.randn(1, HIDDEN, generator=gen).to(DT)
    weight = (1 + 0.1 * torch.randn(HIDDEN, generator=gen)).to(DT)
    pqs = [(0.5 + torch.rand(HIDDEN, generator=gen)).to(DT) for _ in range(consumers)]
    results = []
    for fused in (False, True):
        counters = torch.zeros(quant_gemv.row_tiles(q, cfg) + 1, dtype=torch.int32)
        out = torch.empty(cfg.splits, 1, HIDDEN)
        res, normed = residual.clone(), torch.empty(1, HIDDEN, dtype=DT)
        prepared = tuple(gemv_input.empty(1, HIDDEN, 16, p, "cpu") for p in pqs)
        tail = norm.NormTail(res, weight, normed, 1e-6, prepared, counters[-1:]) if fused else None
        quant_gemv.launch(x, q, None, out, cfg, DT, False, counters=counters, norm_tail=tail)
        if not fused:
            norm.residual_rmsnorm(res, out[:1], weight, normed, None, 1e-6, DT, prepared=prepared)
        results.append((res, normed, [p.planes for p in prepared], counters))
    (r0, n0, p0, _), (r1, n1, p1, c1) = results
    return {"consumers": consumers, "residual_equal": torch.equal(r0, r1), "normed_equal": torch.equal(n0, n1),
            "planes_equal": all(torch.equal(a, b) for a, b in zip(p0, p1)), "counters_zero": not c1.any().item(),
            "residual_changed": not torch.equal(r1, residual)}


def main() -> None:
    print(json.dumps([case(consumers, seed) for seed, consumers in enumerate((0, 1, 2))]))


if __name__ == "__main__":
    main()
