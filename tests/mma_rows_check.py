"""Run by tests/test_fast_decode.py in a subprocess: quant_mma_int4's INT4-AWQ linear on the INT8 tensor cores
(``_int4_mma_rows_kernel``) through Triton's interpreter, at M = 2, 3, 8, 16 (N 256, K 512, group 128), a tail
case (N, K off the tiles, group 32, splits) and the tiny model's group of 8. Per case, against the several-row
dp4a GEMV (``quant_gemv._int4_gemv_rows_kernel``, the same prepared input), float32 ``x @ W^T`` of the
dequantized weight, and float32 of the input as its int16 planes hold it; the int64 accumulators and the splits
summed by the last program. Prints JSON: one row per case.

    python tests/mma_rows_check.py
"""

from __future__ import annotations

import json

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch

from quant_kernel_check import errors, tensors
from trtllm_pipeline.runtimes.torch_engine.cuda import gemv_input, quant_gemv, quant_linear, quant_mma_int4
from trtllm_pipeline.runtimes.torch_engine.model import Linear

from gemv_rows_check import split_sums
from quant_fast_path import reference_input  # (quant_kernel_check put benchmarks/ on the path)

CPU = torch.device("cpu")
DT = torch.bfloat16


def case(m: int, n: int, k: int, group: int, seed: int = 0, edge: bool = False, **tiles) -> dict:
    """``edge``: the planes prepared without the pre-quant scale, so that the rows' +-7.96875 (bfloat16 255/32, each
    its block's largest) land on x_int = +-32640 (0x7F80: high byte 127, low byte 128)."""
    gen = torch.Generator().manual_seed(seed)
    t = tensors("int4_awq", n, k, group, gen)
    lin, lin32 = Linear(t, "p", DT, CPU, "int4_awq", group), Linear(t, "p", torch.float32, CPU, "int4_awq", group)
    q = quant_linear.QuantWeight.of(lin)
    x = (torch.randn(m, k, generator=gen) * 2).to(DT)
    if edge:
        x[:, ::16] = torch.tensor([7.96875, -7.96875], dtype=DT).repeat(k // 32)
    cfg = quant_mma_int4.config(q, m, 4, **tiles)
    w = lin._dequantize().t()
    xs = x.float() if edge else reference_input(lin32, x)
    want = xs @ w
    planes_want = gemv_input.reference(xs, gemv_input.block_inputs(q.group)) @ w
    if edge:
        xp = gemv_input.prepare(x, gemv_input.empty(m, k, gemv_input.block_inputs(q.group), None, CPU), DT)
    else:
        xp = quant_gemv.launch_input(x, q, DT)
    out = torch.full((cfg.splits, m, n), float("nan"))
    quant_linear.quant_partials(xp, q, out, cfg, DT)
    gcfg = quant_gemv.rows_config(q, m, 4)
    gemv = torch.full((gcfg.splits, m, n), float("nan"))
    quant_linear.quant_partials(xp, q, gemv, gcfg, DT)
    row = {"m": m, "n": n, "k": k, "group": group,
           "config": [cfg.block_m, cfg.block_n, cfg.block_k, cfg.splits, quant_mma_int4.chunk(cfg.block_m, xp.block)],
           "kernel": errors(out.sum(0), want), "kernel_vs_prepared": errors(out.sum(0), planes_want),
           "kernel_vs_gemv": errors(out.sum(0), gemv.sum(0)), "gemv_vs_prepared": errors(gemv.sum(0), planes_want),
           "inputs_at_32640": _top(xp, k)}
    if not edge:
        row["eager_bf16"] = errors(lin(x), want)
    row.update(split_sums(xp, q, cfg, out))
    return row


def _top(xp: gemv_input.Prepared, k: int) -> int:
    """How many inputs have x_int >= 32640 (high byte 127, low byte >= 128): past any split into two signed bytes."""
    hi = xp.planes[:, : k // 4].contiguous().view(torch.int8).int()
    lo = xp.planes[:, k // 4: k // 2].contiguous().view(torch.uint8).int()
    return int(((hi * 256 + lo) >= 32640).sum())


def main() -> None:
    rows = [case(m, 256, 512, 128) for m in (2, 3, 8, 16)]
    rows.append(case(3, 96, 160, 32, seed=1, splits=2))  # K not a multiple of the tile, groups of 32, splits
    rows.append(case(6, 96, 128, 8, seed=2, block_n=32))  # the tiny model's group of 8 (blocks of 8 inputs)
    rows.append(case(2, 64, 96, 8, seed=3, block_n=32))  # group 8 at 2 rows (KC 64: 8 blocks a dot)
    rows.append(case(4, 256, 384, 128, seed=5, splits=2))  # whole tiles, but a split past K (3 tiles, 2 splits)
    rows.append(case(8, 256, 512, 128, seed=4, edge=True))  # x_int = +-32640 in every block
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
