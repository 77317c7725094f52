"""Run by tests/test_fast_decode.py in a subprocess: the 4/8-bit decode kernels (runtimes/torch_engine/cuda/quant_linear.py)
through Triton's interpreter against ``x @ W^T`` with W the format's float32 dequantized weight and x the input as
the format's activation quantizer leaves it (in float32 after the eager bf16 ``x * pre_quant_scale``). Prints JSON:
one row per case, with the kernel's and the eager bf16 module's relative and absolute errors.

    python tests/quant_kernel_check.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch
import torch.nn.functional as F

from trtllm_pipeline.runtimes.torch_engine.cuda import fixed_sum, gemv_input, quant_linear
from trtllm_pipeline.runtimes.torch_engine.model import Linear

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from quant_fast_path import reference_input  # noqa: E402  (the GPU benchmark checks against the same input)

CPU = torch.device("cpu")


def tensors(fmt: str, n: int, k: int, group: int, gen: torch.Generator, slices: int = 1) -> dict:
    """A checkpoint's tensors of one linear ``p`` in ``fmt``, random but plausibly scaled."""
    def rand(*shape):
        return torch.rand(*shape, generator=gen)

    t = {"p.prequant_scaling_factor": (0.5 + 1.5 * rand(k)).to(torch.bfloat16)}
    if fmt in ("int4_awq", "w4a8_awq"):
        t["p.weight"] = torch.randint(-128, 128, (n // 2, k), generator=gen, dtype=torch.int8)
        t["p.weights_scaling_factor"] = (0.5 + rand(n, k // group)) * 0.01
        if fmt == "w4a8_awq":
            t["p.weights_scaling_factor_2"] = (t["p.weights_scaling_factor"].max() * 8 / 448).reshape(1)
            t["p.activation_scaling_factor"] = torch.tensor([6.0 / 448])
    else:
        t["p.weight"] = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        if fmt == "int8_sq":
            t["p.weights_scaling_factor"] = (0.5 + rand(n)) * 0.01
            t["p.activation_scaling_factor"] = torch.tensor([5.0 / 127])
        else:
            t["p.per_channel_scale"] = (0.5 + rand(n, slices)) * 0.01
            del t["p.prequant_scaling_factor"]
    return t


def errors(got: torch.Tensor, want: torch.Tensor) -> dict:
    d = (got.float() - want.float()).abs()
    return {"rel": float(d.norm() / want.float().norm()), "max_abs": float(d.max()),
            "max_rel": float(d.max() / want.float().abs().max())}


def glu_reference(want: torch.Tensor, lin, lin2, lin2_32, x: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 silu(fc) * gate, rounded to ``dtype`` where eager rounds: fc, gate and silu(fc); eager's own GLU):
    ``want`` is fc's float32 ``x @ W^T``, the gate its own matrix with its own pre-quant / activation scales."""
    fc = want.to(dtype).float()
    gate = (reference_input(lin2_32, x) @ lin2._dequantize().t()).to(dtype).float()
    return F.silu(fc).to(dtype).float() * gate, F.silu(lin(x)) * lin2(x)


def case(fmt, m, n, k, group, *, block_n=None, block_k=None, splits=None, dtype=torch.bfloat16, slices=1, seed=0,
         gemv=None, tma=False):
    gen = torch.Generator().manual_seed(seed)
    t = tensors(fmt, n, k, group, gen, slices)
    t2 = tensors(fmt, n, k, group, gen, slices)  # the GLU's second matrix
    lin, lin32 = (Linear(t, "p", dt, CPU, fmt, group) for dt in (dtype, torch.float32))
    lin2, lin2_32 = (Linear(t2, "p", dt, CPU, fmt, group) for dt in (dtype, torch.float32))
    q, q2 = quant_linear.QuantWeight.of(lin), quant_linear.QuantWeight.of(lin2)
    x = (torch.randn(m, k, generator=gen) * 2).to(dtype)
    cfg = quant_linear.pick_config(q, m, sm_count=4, splits=splits, block_n=block_n, gemv=gemv)
    if block_k:
        cfg = dataclasses.replace(cfg, block_k=block_k)
    if tma:  # the weight tiles by the bulk tensor copy engine, three stages deep
        cfg = dataclasses.replace(cfg, tma=True, num_stages=3)
    out = torch.full((cfg.splits, m, n), float("nan"))
    quant_linear.quant_partials(x, q, out, cfg, dtype)
    # W as the runtime defines it for the compute dtype (INT4-AWQ: its scales in that dtype, Linear.group_scales)
    want = reference_input(lin32, x) @ lin._dequantize().t()
    row = {"fmt": fmt, "m": m, "n": n, "k": k, "group": q.group, "dtype": str(dtype).removeprefix("torch."),
           "config": [cfg.block_n, cfg.block_k, cfg.splits], "tile_scale": q.group % cfg.block_k == 0,
           "gemv": cfg.gemv, "tma": cfg.tma, "dp4a8": cfg.dp4a8,
           "kernel": errors(out.sum(0), want), "eager_bf16": errors(lin(x), want)}
    if cfg.gemv:  # against the input as the GEMV's int16 block floating point represents it
        planes_x = gemv_input.reference(reference_input(lin32, x), gemv_input.block_inputs(q.group))
        row["kernel_vs_prepared"] = errors(out.sum(0), planes_x @ lin._dequantize().t())
        # the splits summed by each row tile's last program, in split order: the same float32 sums
        counters = torch.zeros(8, dtype=torch.int32)
        reduced = out.clone()
        quant_linear.quant_partials(x, q, reduced, cfg, dtype, counters=counters)
        row["reduced_equals_sum"] = bool(torch.equal(reduced[0], sum(out[s] for s in range(cfg.splits))))
        row["counters_left_zero"] = bool((counters == 0).all())
        # the splits added into int64 accumulators (the decode step's default): their exact sum, rounded once
        acc = fixed_sum.accumulator(m, n, device=CPU)
        quant_linear.quant_partials(x, q, acc, cfg, dtype)
        exact = out.double().sum(0)
        bound = exact.abs() * 2**-24 + cfg.splits * 2**-32  # float32's rounding, + the cut below 2^-8 per split
        row["fixed_equals_exact_sum"] = bool(((fixed_sum.to_float(acc).double() - exact).abs() <= bound).all())
    # the GLU: silu(fc) * gate, each matrix with its own pre-quant / activation scales
    act = torch.full((m, n), float("nan"), dtype=dtype)
    quant_linear.quant_glu(x, q, q2, act, cfg, dtype)
    glu_want, glu_eager = glu_reference(want, lin, lin2, lin2_32, x, dtype)
    row["glu"] = errors(act, glu_want)
    row["glu_eager_bf16"] = errors(glu_eager, glu_want)
    if cfg.dp4a8 and fmt == "int8_wo":  # against the input as its int16 block floating point stands for it
        planes_x = gemv_input.reference(reference_input(lin32, x), 16)
        row["kernel_vs_prepared"] = errors(out.sum(0), planes_x @ lin._dequantize().t())
    elif cfg.dp4a8:  # the same int32 sums as quant_linear's tensor-core kernel: its partials and GLU, exactly
        # (the dot kernel at the GEMV's K tile and splits: each split's K range, and so its int32 sum, is the same)
        dot_cfg = dataclasses.replace(quant_linear.pick_config(q, m, sm_count=4, gemv=False), block_k=cfg.block_k,
                                      splits=cfg.splits)
        dot, dot_act = torch.full_like(out, float("nan")), torch.full_like(act, float("nan"))
        quant_linear.quant_partials(x, q, dot, dot_cfg, dtype)
        quant_linear.quant_glu(x, q, q2, dot_act, dot_cfg, dtype)
        row["equals_dot_kernel"] = bool(torch.equal(out, dot) and torch.equal(act, dot_act))
    if cfg.gemv:  # the GLU split over K: the last program per row tile sums fc and gate, then applies SiLU
        split_act, counters = torch.full_like(act, float("nan")), torch.zeros(8, dtype=torch.int32)
        workspace = torch.empty(2 * 2 * n)
        quant_linear.quant_glu(x, q, q2, split_act, dataclasses.replace(cfg, splits=2), dtype, counters=counters,
                               workspace=workspace)
        row["glu_split"] = errors(split_act, glu_want)
        row["glu_split_counters_left_zero"] = bool((counters == 0).all())
    return row


def main() -> None:
    rows = []
    for fmt in quant_linear.FORMATS:
        for m in (1, 3):
            # odd tails: N not a multiple of the tile, K not of BLOCK_K, splits that leave an empty last tile
            rows.append(case(fmt, m, 90, 160, 32, block_n=32, splits=2, slices=2))  # per-weight scales (group<BLOCK_K)
            rows.append(case(fmt, m, 90, 160, 32, block_n=32, block_k=32, splits=2))  # a group per tile
        rows.append(case(fmt, 16, 64, 256, 64, block_n=64, block_k=64, splits=3))  # EVEN_M, K splits
    rows.append(case("int4_awq", 3, 96, 128, 8, block_n=32, splits=1))  # the tiny model's group of 8
    rows.append(case("int4_awq", 3, 90, 160, 32, block_n=32, block_k=32, splits=2, dtype=torch.float16))
    # INT4-AWQ at M = 1 is the GEMV (the rows above at m=1): the tiny group, float16, and the dot it replaced
    rows.append(case("int4_awq", 1, 96, 128, 8, block_n=32, block_k=64, splits=1))
    rows.append(case("int4_awq", 1, 90, 160, 32, block_n=32, block_k=32, splits=2, dtype=torch.float16))
    rows.append(case("int4_awq", 1, 90, 160, 32, block_n=32, block_k=32, splits=2, gemv=False))
    rows.append(case("int4_awq", 1, 64, 256, 128, block_n=32, splits=2))  # the 7B's group: one scale per tile
    # the same with tiles by the copy engine (rows and inputs past the matrix come back as zeros)
    rows.append(case("int4_awq", 1, 96, 384, 128, block_n=64, splits=2, tma=True))
    rows.append(case("int4_awq", 1, 64, 256, 128, block_n=32, splits=1, tma=True))
    # INT8 SmoothQuant at M = 1 on its dp4a GEMV (quant_gemv_int8): N and K tails, split K, one split
    rows.append(case("int8_sq", 1, 90, 160, 32, splits=2, gemv=True))
    rows.append(case("int8_sq", 1, 64, 512, 32, splits=1, gemv=True))
    rows.append(case("int8_sq", 1, 130, 1000, 32, splits=3, gemv=True, dtype=torch.float16))
    # ... and weight-only, its input as int16 block floating point: per channel, and two scale slices of 256
    rows.append(case("int8_wo", 1, 90, 512, 512, splits=2, gemv=True))
    rows.append(case("int8_wo", 1, 130, 512, 256, splits=1, gemv=True, slices=2, dtype=torch.float16))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
