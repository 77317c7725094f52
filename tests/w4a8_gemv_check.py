"""Run by tests/test_fast_decode.py in a subprocess: W4A8-AWQ's batch-1 table-lookup GEMV (runtimes/torch_engine/cuda/
quant_gemv_w4a8.py) through Triton's interpreter, against float32 ``x @ W^T`` with W the format's dequantized weight
and x the input as its FP8 activation quantizer leaves it (tests/quant_kernel_check.py's reference). Prints JSON: one
row per case.

    python tests/w4a8_gemv_check.py
"""

from __future__ import annotations

import dataclasses
import json

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch
from quant_kernel_check import CPU, errors, glu_reference, reference_input, tensors

from trtllm_pipeline.runtimes.torch_engine.cuda import gemv_input, quant_gemv_w4a8, quant_linear
from trtllm_pipeline.runtimes.torch_engine.model import Linear


def case(kind, n, k, group, *, block_n=None, block_k=None, splits=None, prefetch=None, dtype=torch.bfloat16,
         seed=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    t, t2 = tensors("w4a8_awq", n, k, group, gen), tensors("w4a8_awq", n, k, group, gen)
    lin, lin32 = (Linear(t, "p", dt, CPU, "w4a8_awq", group) for dt in (dtype, torch.float32))
    lin2, lin2_32 = (Linear(t2, "p", dt, CPU, "w4a8_awq", group) for dt in (dtype, torch.float32))
    q, q2 = quant_linear.QuantWeight.of(lin), quant_linear.QuantWeight.of(lin2)
    x = (torch.randn(1, k, generator=gen) * 2).to(dtype)
    glu = kind == "glu"
    cfg = quant_linear.pick_config(q, 1, sm_count=4, glu=glu, splits=splits, block_n=block_n, gemv=True)
    if block_k:
        cfg = dataclasses.replace(cfg, block_k=block_k)
    if prefetch is not None:  # the kernel's own prefetch of the next K tile (num_stages > 1), or none
        cfg = dataclasses.replace(cfg, num_stages=2 if prefetch else 1)
    assert cfg.w4a8
    w = lin._dequantize()  # float32: E4M3(q x step / scale_2) x scale_2, as ModelOpt's fake quantizer computes it
    xr = reference_input(lin32, x)
    want = xr @ w.t()
    row = {"kind": kind, "n": n, "k": k, "group": group, "dtype": str(dtype).removeprefix("torch."),
           "config": [cfg.block_n, cfg.block_k, cfg.splits], "prefetch": cfg.num_stages > 1}
    # the tables' integers times their units are the kernel's weights; those are eager's dequantized weight
    qt = quant_gemv_w4a8.with_tables(q)
    c, u = quant_gemv_w4a8.integer_form(q.scales)
    vals = (c * u[..., None])  # [G, 2, N/2, 16]
    nib = torch.stack([lin.weight.view(torch.uint8) & 0xF, lin.weight.view(torch.uint8) >> 4], 0).long()  # [2,N/2,K]
    qi = torch.where(nib >= 8, nib - 16, nib) + 8
    gk = torch.arange(k) // group
    table_w = vals[gk[None, None, :], torch.arange(2)[:, None, None], torch.arange(n // 2)[None, :, None], qi]
    q2_ = quant_linear.FP8_MAX / (lin.scale_2.float() * quant_linear.FP8_MAX)  # 1 / scale_2, as eager computes it
    table_w = table_w.permute(1, 0, 2).reshape(n, k) * (1 / q2_)
    row["tables_equal_eager_weight"] = bool(torch.equal(table_w, w))
    row["tables_vs_eager_weight"] = errors(table_w, w)
    row["table_bytes"] = qt.lut.numel() * 4 + qt.units.numel() * 4
    if glu:
        act = torch.full((1, n), float("nan"), dtype=dtype)
        quant_linear.quant_glu(x, q, q2, act, cfg, dtype)
        glu_want, glu_eager = glu_reference(want, lin, lin2, lin2_32, x, dtype)
        row["kernel"] = errors(act, glu_want)
        row["eager_bf16"] = errors(glu_eager, glu_want)
        dot = torch.full_like(act, float("nan"))
        quant_linear.quant_glu(x, q, q2, dot, quant_linear.pick_config(q, 1, sm_count=4, glu=True, gemv=False), dtype)
        row["vs_dot_kernel"] = errors(act, dot)
        return row
    out = torch.full((cfg.splits, 1, n), float("nan"))
    quant_linear.quant_partials(x, q, out, cfg, dtype)
    got = out.sum(0)
    row["kernel"] = errors(got, want)
    row["eager_bf16"] = errors(lin(x), want)
    # against the input as its int16 block floating point stands for it: exact products, float32 sums
    # (the planes stand for the E4M3 values, before the activation scale)
    qa = q.act_q
    e4m3 = ((x * lin.pre_quant_scale).float() * qa).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    planes_x = gemv_input.reference(e4m3, quant_gemv_w4a8.block_inputs(group)) * (1 / qa)
    row["input_exact"] = bool(torch.equal(e4m3 * (1 / qa), xr))
    row["kernel_vs_prepared"] = errors(got, planes_x @ w.t())
    # quant_linear's FP8 tensor-core kernel (the decode step's choice without the switch) on the same input
    dot = torch.full((1, 1, n), float("nan"))
    quant_linear.quant_partials(x, q, dot, quant_linear.pick_config(q, 1, sm_count=4, gemv=False, splits=1), dtype)
    row["vs_dot_kernel"] = errors(got, dot.sum(0))
    return row


def main() -> None:
    rows = [
        case("qkv", 192, 256, 128, splits=2),  # the 7B's group: a table per row and tile, one tile a split
        case("dense", 128, 256, 128, block_n=64, splits=1),  # two tiles, the second prefetched
        case("dense", 128, 256, 128, block_n=64, splits=1, prefetch=False),  # each tile loaded in its iteration
        case("proj", 90, 384, 128, block_n=64, splits=2),  # N tail (45 packed rows), 3 tiles over 2 splits
        case("proj", 90, 384, 128, block_n=64, splits=2, prefetch=False),
        case("proj", 64, 512, 128),  # pick_config's own splits (short K): one tile a program, 4 splits
        case("glu", 96, 256, 128),  # prefetched
        case("glu", 96, 256, 128, prefetch=False),
        case("qkv", 96, 128, 8, splits=1),  # the tiny model's group of 8: a table per row and block
        case("proj", 90, 352, 8, splits=2),  # the tiny model's proj K (352: a K tail in the last tile), prefetched
        case("proj", 90, 352, 8, splits=2, prefetch=False),
        case("glu", 90, 128, 8, dtype=torch.float16),
    ]
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
