"""Run by tests/test_fast_decode.py in a subprocess: quant_gemv's INT4 GEMV for several rows
(``_int4_gemv_rows_kernel``) through Triton's interpreter, at M = 1, 2, 3, 5, 8, 16. Per case, against float32
``x @ W^T`` of the dequantized weight (and of the input as its int16 planes hold it), and against the batch-1
kernel at the same tiles run row by row: the partials, the int64 accumulators, the splits summed by the last
program, and the GLU with mlp.proj's prepared input. Prints JSON: one row per case.

    python tests/gemv_rows_check.py
"""

from __future__ import annotations

import dataclasses
import json

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch
import torch.nn.functional as F

from quant_kernel_check import errors, tensors
from trtllm_pipeline.runtimes.torch_engine.cuda import fixed_sum, gemv_input, quant_gemv, quant_linear
from trtllm_pipeline.runtimes.torch_engine.model import Linear

from quant_fast_path import reference_input  # (quant_kernel_check put benchmarks/ on the path)

CPU = torch.device("cpu")
DT = torch.bfloat16


def _linear(n: int, k: int, group: int, gen: torch.Generator):
    t = tensors("int4_awq", n, k, group, gen)
    return Linear(t, "p", DT, CPU, "int4_awq", group), Linear(t, "p", torch.float32, CPU, "int4_awq", group)


def _prepared(x: torch.Tensor, q) -> gemv_input.Prepared:
    return quant_gemv.launch_input(x, q, DT)


def _batch1(cfg):
    """Batch 1's register-load kernel at the several-row config's tiles (the same sums in the same order)."""
    return dataclasses.replace(cfg, block_m=1)


def _by_rows(fn, m: int) -> list:
    return [fn(r) for r in range(m)]


def case(m: int, n: int, k: int, group: int, seed: int = 0, **tiles) -> dict:
    gen = torch.Generator().manual_seed(seed)
    (lin, lin32), (lin2, lin2_32) = _linear(n, k, group, gen), _linear(n, k, group, gen)
    q, q2 = quant_linear.QuantWeight.of(lin), quant_linear.QuantWeight.of(lin2)
    x = (torch.randn(m, k, generator=gen) * 2).to(DT)
    cfg = quant_gemv.pick_config(q, 4, m=m, **tiles) if m > 1 else quant_gemv.pick_config(q, 4, tma=False, **tiles)
    one = _batch1(cfg)
    w = lin._dequantize().t()
    want = reference_input(lin32, x) @ w
    planes_want = gemv_input.reference(reference_input(lin32, x), gemv_input.block_inputs(q.group)) @ w
    xp = _prepared(x, q)
    out = torch.full((cfg.splits, m, n), float("nan"))
    quant_linear.quant_partials(xp, q, out, cfg, DT)
    rows1 = torch.stack(_by_rows(lambda r: _partials_1(x[r:r + 1], q, one), m), 1)
    row = {"m": m, "n": n, "k": k, "group": group, "config": [cfg.block_m, cfg.block_n, cfg.block_k, cfg.splits],
           "kernel": errors(out.sum(0), want), "kernel_vs_prepared": errors(out.sum(0), planes_want),
           "eager_bf16": errors(lin(x), want), "partials_equal_batch1": bool(torch.equal(out, rows1))}
    row.update(split_sums(xp, q, cfg, out))
    row.update(_glu(x, q, q2, lin, lin2, lin32, lin2_32, m, n))
    return row


def _partials_1(x1: torch.Tensor, q, cfg) -> torch.Tensor:
    out = torch.full((cfg.splits, 1, q.n), float("nan"))
    quant_linear.quant_partials(x1, q, out, cfg, DT)
    return out[:, 0]


def _glu(x, q, q2, lin, lin2, lin32, lin2_32, m: int, n: int) -> dict:
    """silu(fc) * gate per row with mlp.proj's input prepared from it (block 16: a proj of K = n), against float32
    and against batch 1's GLU kernel row by row (its act and its prepared planes; none where N is not whole
    input blocks)."""
    cfg = quant_gemv.pick_config(q, 4, glu=True, m=m) if m > 1 else quant_gemv.pick_config(q, 4, glu=True, tma=False)
    one = _batch1(cfg)
    xb = gemv_input.block_inputs(q.group)
    act, proj_in = torch.full((m, n), float("nan"), dtype=DT), gemv_input.empty(m, n, xb, None, CPU)
    if n % xb:
        proj_in = None
    quant_linear.quant_glu(_prepared(x, q), q, q2, act, cfg, DT, x2=_prepared(x, q2), prepare_out=proj_in)
    fc = (reference_input(lin32, x) @ lin._dequantize().t()).to(DT).float()
    gate = (reference_input(lin2_32, x) @ lin2._dequantize().t()).to(DT).float()
    want = F.silu(fc).to(DT).float() * gate
    same_act, same_planes = True, True
    for r in range(m):
        a1, p1 = torch.empty((1, n), dtype=DT), proj_in and gemv_input.empty(1, n, xb, None, CPU)
        quant_linear.quant_glu(_prepared(x[r:r + 1], q), q, q2, a1, one, DT, x2=_prepared(x[r:r + 1], q2),
                               prepare_out=p1)
        same_act &= bool(torch.equal(a1[0], act[r]))
        same_planes &= proj_in is None or bool(torch.equal(p1.planes[0], proj_in.planes[r]))
    if proj_in is None:
        return {"glu": errors(act, want), "glu_eager_bf16": errors(F.silu(lin(x)) * lin2(x), want),
                "glu_equal_batch1": same_act}
    return {"glu_config": [cfg.block_m, cfg.block_n, cfg.block_k, cfg.splits], "glu": errors(act, want),
            "glu_eager_bf16": errors(F.silu(lin(x)) * lin2(x), want), "glu_equal_batch1": same_act,
            "proj_input_equal_batch1": same_planes,
            "proj_input": errors(gemv_input.reference(act, xb), _planes_values(proj_in, n, xb))}


def _planes_values(p: gemv_input.Prepared, k: int, xb: int) -> torch.Tensor:
    """The values prepared planes stand for: sum of (256 hi + lo) 2^E per input (the GEMV's view of them)."""
    words = p.planes
    hi = words[:, : k // 4].contiguous().view(torch.int8).reshape(-1, k).float()
    lo = words[:, k // 4: k // 2].contiguous().view(torch.uint8).reshape(-1, k).float()
    step = words[:, k // 2 + k // xb:].contiguous().view(torch.float32)
    return (256 * hi + lo) * step.repeat_interleave(xb, dim=1)


def split_sums(xp, q, cfg, out: torch.Tensor) -> dict:
    """The kernel's other two outputs against its partials ``out`` [splits, M, N] (also mma_rows_check's): the int64
    accumulators (the splits' exact sum, rounded once: each split cut below 2^-32), and the splits summed into split 0
    by each row tile's last program, in split order, its counters left at zero."""
    m, n = out.shape[1], out.shape[2]
    acc = fixed_sum.accumulator(m, n, device=CPU)
    quant_linear.quant_partials(xp, q, acc, cfg, DT)
    exact = out.double().sum(0)
    bound = exact.abs() * 2**-24 + cfg.splits * 2**-32
    counters, reduced = torch.zeros(quant_gemv.row_tiles(q, cfg), dtype=torch.int32), out.clone()
    quant_linear.quant_partials(xp, q, reduced, cfg, DT, counters=counters)
    return {"fixed_equals_exact_sum": bool(((fixed_sum.to_float(acc).double() - exact).abs() <= bound).all()),
            "reduced_equals_sum": bool(torch.equal(reduced[0], sum(out[s] for s in range(cfg.splits)))),
            "counters_left_zero": bool((counters == 0).all())}


def main() -> None:
    rows = [case(m, 256, 512, 128) for m in (1, 2, 3, 5, 8, 16)]
    # tails: N not a multiple of the tile, K not of BLOCK_K, scales per input block (group 32 < BLOCK_K), an
    # empty last split
    rows.append(case(3, 90, 160, 32, seed=1, splits=2))
    rows.append(case(6, 96, 128, 8, seed=2, block_n=32))  # the tiny model's group of 8 (blocks of 8 inputs)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
