"""Run by tests/test_fast_decode.py in a subprocess: quant_gemm's tensor-core GEMMs (runtimes/torch_engine/cuda/
quant_gemm.py) through Triton's interpreter against float32 ``x @ W^T`` (W the format's dequantized weight, x the input
as its activation quantizer leaves it), in each of their three outputs: split-K float32 partials (the decode step),
the GLU of two matrices, and ``linear`` (compute dtype, bias: what ``Linear.forward`` returns on CUDA, prefill). Both
MMA orientations (SWAP), several row tiles (M > BLOCK_M), N / K tails and scale groups smaller than, equal to and
larger than a K tile. Prints JSON: one row per case.

    python tests/quant_gemm_check.py
"""

from __future__ import annotations

import json

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch
import torch.nn.functional as F

from quant_kernel_check import errors, tensors
from quant_fast_path import reference_input
from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm, quant_linear
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig
from trtllm_pipeline.runtimes.torch_engine.model import Linear

CPU = torch.device("cpu")


def case(fmt, m, n, k, group, *, block_m=16, block_n=32, block_k=32, splits=1, swap=True, slices=1, seed=0,
         dtype=torch.bfloat16, scale_weights=False):
    gen = torch.Generator().manual_seed(seed)
    t, t2 = tensors(fmt, n, k, group, gen, slices), tensors(fmt, n, k, group, gen, slices)
    t["p.bias"] = (torch.randn(n, generator=gen) * 0.1).to(dtype)
    lin, lin32 = (Linear(t, "p", dt, CPU, fmt, group) for dt in (dtype, torch.float32))
    lin2, lin2_32 = (Linear(t2, "p", dt, CPU, fmt, group) for dt in (dtype, torch.float32))
    q, q2 = quant_linear.QuantWeight.of(lin), quant_linear.QuantWeight.of(lin2)
    x = (torch.randn(m, k, generator=gen) * 2).to(dtype)
    cfg = LinearConfig(block_m, block_n, block_k, splits, 4, 2, gemm=True, swap=swap, scale_weights=scale_weights)
    want = reference_input(lin32, x) @ lin._dequantize().t()
    out = torch.full((splits, m, n), float("nan"))
    quant_gemm.launch(x, q, None, out, cfg, dtype)
    row = {"fmt": fmt, "m": m, "n": n, "k": k, "group": q.group, "swap": swap, "splits": splits,
           "tile": [block_m, block_n, block_k], "dtype": str(dtype).removeprefix("torch."),
           # exact products where the scale goes on a tile's (or the whole sum's) dot result, or E4M3 / INT8 values
           "exact": q.group % block_k == 0 and not scale_weights or fmt in ("w4a8_awq", "int8_sq"),
           "partials": errors(out.sum(0), want), "eager_bf16": errors(F.linear(lin.quantize_input(x), lin.dequantized),
                                                                       want)}
    if splits == 1:
        y = quant_gemm.linear(x[None], q, lin.bias, dtype, cfg)[0]
        bias_want = want + lin.bias.float()
        row["linear"] = errors(y, bias_want)
        row["linear_eager_bf16"] = errors(lin(x), bias_want)
    # the GLU (split K: each split's partials to a workspace, the last program of an output tile finishing)
    act = torch.full((m, n), float("nan"), dtype=dtype)
    counters = torch.zeros(quant_gemm.glu_counters(q, m, cfg), dtype=torch.int32)
    workspace = torch.full((quant_gemm.glu_workspace(q, m, cfg),), float("nan"))
    quant_gemm.launch(x, q, q2, act, cfg, dtype, counters=counters, workspace=workspace)
    gate = (reference_input(lin2_32, x) @ lin2._dequantize().t()).to(dtype).float()
    glu_want = F.silu(want.to(dtype).float()).to(dtype).float() * gate
    row["glu"] = errors(act, glu_want)
    row["glu_eager_bf16"] = errors(F.silu(F.linear(lin.quantize_input(x), lin.dequantized))
                                   * F.linear(lin2.quantize_input(x), lin2.dequantized), glu_want)
    row["glu_counters_left"] = int(counters.abs().sum())
    return row


def library_case(fmt, m, n, k, group, kernel, *, slices=1, seed=0, dtype=torch.bfloat16):
    """``linear`` through one of quant_gemm.LINEAR_KERNELS (torch._int_mm, or the weight dequantized into the scratch
    buffer and the library GEMM: F.linear, torch._scaled_mm; both run on the CPU) against float32 ``x @ W^T + b``,
    eager's module, and the GEMM's ``linear``; or, where the kernel cannot take the shape, which kernel ran."""
    gen = torch.Generator().manual_seed(seed)
    t = tensors(fmt, n, k, group, gen, slices)
    t["p.bias"] = (torch.randn(n, generator=gen) * 0.1).to(dtype)
    lin, lin32 = (Linear(t, "p", dt, CPU, fmt, group) for dt in (dtype, torch.float32))
    q = quant_linear.QuantWeight.of(lin)
    x = (torch.randn(m, k, generator=gen) * 2).to(dtype)
    want = reference_input(lin32, x) @ lin._dequantize().t() + lin.bias.float()
    ran = quant_gemm.linear_kernel(q, m, dtype, CPU, kernel)
    row = {"fmt": fmt, "m": m, "n": n, "k": k, "group": q.group, "kernel": kernel, "ran": ran,
           "dtype": str(dtype).removeprefix("torch.")}
    y = quant_gemm.linear(x[None], q, lin.bias, dtype, kernel=kernel)[0]
    gemm = quant_gemm.linear(x[None], q, lin.bias, dtype, LinearConfig(16, 32, 32, 1, 4, 2, gemm=True))[0]
    row.update(linear=errors(y, want), linear_eager_bf16=errors(lin(x), want), dtype_out=str(y.dtype),
               vs_gemm=errors(y, gemm), equal_gemm=torch.equal(y, gemm), equal_eager=torch.equal(y, lin(x)))
    if ran == "dequant":  # the scratch buffer's weight: eager's copy's values (W4A8: E4M3 in units of scale_2)
        w = quant_gemm.dequantize(q, dtype).float()
        if fmt == "w4a8_awq":
            w = w * q.out_scale * q.act_q  # (1 / qa) (1 / q2) qa = 1 / q2: the FP8 step of scale_2
        row["weight"] = errors(w, lin._dequantize())
        row["weight_equal_eager_copy"] = torch.equal(w.to(dtype), lin.dequantized)
        row["scratch_bytes"] = quant_gemm.scratch_bytes()
    return row


def main() -> None:
    rows = []
    for fmt in quant_linear.FORMATS:
        for swap in (True, False):
            rows.append(case(fmt, 3, 90, 160, 32, swap=swap, slices=2))  # N and K tails, a group per K tile
            rows.append(case(fmt, 40, 64, 128, 64, swap=swap, block_n=32, splits=2))  # 3 row tiles, split K
        rows.append(case(fmt, 20, 64, 128, 16, swap=False, block_m=16, slices=4))  # groups smaller than a tile
    rows.append(case("int4_awq", 3, 96, 128, 8, block_n=32))  # the tiny model's group of 8
    rows.append(case("int4_awq", 33, 64, 256, 128, swap=False, block_m=32, block_n=64, block_k=64,
                     dtype=torch.float16))  # the 7B's group over two K tiles, float16
    rows.append(case("int8_wo", 17, 64, 128, 128, swap=False, dtype=torch.float16))  # the scale in the epilogue
    rows.append(case("int4_awq", 5, 64, 256, 128, block_k=64, scale_weights=True))  # the scale on each weight
    for fmt, kernel in (("int8_sq", "int_mm"), ("int4_awq", "dequant"), ("int8_wo", "dequant")):
        rows.append(library_case(fmt, 40, 96, 160, 32, kernel, slices=2))  # a group per 32 inputs, two int8_wo slices
    rows.append(library_case("w4a8_awq", 40, 64, 256, 128, "dequant"))  # the 7B's group over two K tiles
    rows.append(library_case("int4_awq", 33, 64, 256, 128, "dequant", dtype=torch.float16))  # the 7B's group, float16
    rows.append(library_case("int4_awq", 20, 90, 160, 8, "dequant"))  # an N tail (45 packed rows), groups of 8
    rows.append(library_case("int8_sq", 16, 96, 160, 32, "int_mm"))  # M = 16: cuBLAS's int8 GEMM wants M > 16
    rows.append(library_case("int8_sq", 24, 90, 160, 32, "int_mm"))  # N not a multiple of 8
    rows.append(library_case("w4a8_awq", 24, 72, 160, 32, "dequant"))  # N not a multiple of 16 (torch._scaled_mm)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
