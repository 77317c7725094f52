"""Run by tests/test_fast_decode.py in a subprocess: the input the wide wgmma row kernels copy (quant_rows_w4a8_mma and
quant_rows_int4_mma from 17 rows, the INT8 row kernels), made once by runtimes/torch_engine/cuda/made_input.py through
Triton's interpreter, against torch. Prints JSON: one row per case.

    python tests/rows_input_check.py
"""

from __future__ import annotations

import json

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch
from quant_kernel_check import CPU, tensors

from trtllm_pipeline.runtimes.torch_engine.cuda import made_input, quant_linear
from trtllm_pipeline.runtimes.torch_engine.model import Linear


def _weights(fmt: str, k: int, gen, dtype):
    lins = [Linear(tensors(fmt, 64, k, 128, gen), "p", dtype, CPU, fmt, 128) for _ in range(2)]
    return lins, [quant_linear.QuantWeight.of(lin) for lin in lins]


def w4a8(m: int, k: int, *, glu: bool, dtype=torch.bfloat16, seed: int = 3) -> dict:
    """Per matrix (the GLU: fc and gate, each with its own pre-quant and activation scales) E4M3 of the input at
    eager's rounding points, each word's bytes in the lookup's order (inputs 0, 2, 1, 3), then every sign flipped."""
    gen = torch.Generator().manual_seed(seed)
    lins, qs = _weights("w4a8_awq", k, gen, dtype)
    x = (torch.randn(m, k, generator=gen) * 2).to(dtype)
    made = made_input.w4a8(x, qs[0], qs[1] if glu else None, dtype)
    cols = torch.arange(k)
    order = (cols & ~3) | ((cols & 1) << 1) | ((cols >> 1) & 1)  # where input c lands
    want = []
    for lin, q in zip(lins[:2 if glu else 1], qs):
        e4m3 = ((x * lin.pre_quant_scale).float() * q.act_q).clamp(-448, 448).to(torch.float8_e4m3fn)
        placed = torch.empty(m, k, dtype=torch.uint8)
        placed[:, order] = e4m3.view(torch.uint8)
        want += [placed, placed ^ 0x80]
    got = made.view(torch.uint8).reshape(-1, m, k)
    return {"format": "w4a8_awq", "m": m, "k": k, "glu": glu, "shape": list(made.shape),
            "equal": bool(torch.equal(got, torch.stack(want)))}


def int4(m: int, k: int, nb: int, *, glu: bool, dtype=torch.bfloat16, seed: int = 4) -> dict:
    """Per matrix the input times its pre-quant scale rounded to the compute dtype, input 16 c + 4 t + 2 i + j at
    16 c + 8 j + 2 t + i (the MMA's order), and 136 x each row's sum per 128-input tile, zero past M."""
    gen = torch.Generator().manual_seed(seed)
    lins, qs = _weights("int4_awq", k, gen, dtype)
    x = (torch.randn(m, k, generator=gen) * 2).to(dtype)
    made, sums = made_input.int4(x, qs[0], qs[1] if glu else None, dtype, nb)
    cols = torch.arange(k)
    order = (cols & ~15) | ((cols & 1) << 3) | (((cols >> 2) & 3) << 1) | ((cols >> 1) & 1)
    equal, rel, past = True, 0.0, 0.0
    for j, lin in enumerate(lins[:2 if glu else 1]):
        v = x * lin.pre_quant_scale
        placed = torch.empty_like(v)
        placed[:, order] = v
        equal &= torch.equal(made[j], placed)
        want = v.float().view(m, k // 128, 128).sum(-1).t() * 136  # [K / 128, M]
        rel = max(rel, float((sums[j, :, :m] - want).abs().max() / want.abs().max()))
        past = max(past, float(sums[j, :, m:].abs().max()))
    return {"format": "int4_awq", "m": m, "k": k, "glu": glu, "shape": list(made.shape), "equal": equal,
            "sums_rel": rel, "sums_past_m": past}


def int8(m: int, k: int, *, glu: bool, dtype=torch.bfloat16, seed: int = 5) -> dict:
    """Per matrix SmoothQuant's int8 of the input: times its pre-quant scale rounded to the compute dtype, times its
    activation scale, rounded to nearest even and clamped to [-128, 127], as stored."""
    gen = torch.Generator().manual_seed(seed)
    lins, qs = _weights("int8_sq", k, gen, dtype)
    x = (torch.randn(m, k, generator=gen) * 2).to(dtype)
    made = made_input.int8(x, qs[0], qs[1] if glu else None, dtype)
    want = [torch.round((x * lin.pre_quant_scale).float() * q.act_q).clamp(-128, 127).to(torch.int8)
            for lin, q in zip(lins[:2 if glu else 1], qs)]
    return {"format": "int8_sq", "m": m, "k": k, "glu": glu, "shape": list(made.shape),
            "equal": bool(torch.equal(made, torch.stack(want)))}


def w8a16(m: int, k: int, *, dtype=torch.bfloat16, seed: int = 6) -> dict:
    """INT8 weight-only's input: each row over its power of two r (its largest magnitude in [2^e, 2^(e+1)): r =
    2^(e - 14)) in float16, input 16 c + 4 t + 2 j + i at 16 c + 8 j + 2 t + i; a row of outliers past float16's range
    and an all-zero row (r 1) among them."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=gen) * 2).to(dtype)
    x[1] *= 3e5  # past 65504: float16 as it is would overflow
    x[2] = 0
    made, r = made_input.w8a16(x)
    _, e = torch.frexp(x.float().abs().amax(1))  # amax = f 2^e, f in [0.5, 1): in [2^(e-1), 2^e)
    want_r = torch.where(x.float().abs().amax(1) > 0, torch.ldexp(torch.ones(m), e - 15), torch.ones(m))
    cols = torch.arange(k)
    order = (cols & ~15) | (((cols >> 1) & 1) << 3) | (((cols >> 2) & 3) << 1) | (cols & 1)
    placed = torch.empty(m, k, dtype=torch.float16)
    placed[:, order] = (x.float() / want_r[:, None]).to(torch.float16)
    return {"format": "int8_wo", "m": m, "k": k, "glu": False, "shape": list(made.shape),
            "equal": bool(torch.equal(made, placed) and torch.equal(r, want_r)),
            "exact": bool(torch.equal(made.float()[:, order] * r[:, None], x.float())),
            "below": float(made.float().abs().max()) < 2 ** 15}


def main() -> None:
    rows = [w4a8(5, 384, glu=False),  # a row tile's tail (5 of 8 rows), three K tiles
            w4a8(3, 256, glu=True),
            int4(21, 384, 32, glu=False),  # 21 of the MMA's 32 columns
            int4(3, 256, 8, glu=True),
            int8(1, 384, glu=False),  # batch 1 (the MMA's N 8)
            int8(6, 256, glu=True),
            w8a16(3, 1280)]  # K past made_input's 1024-input block
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
