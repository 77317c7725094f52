"""Run by tests/test_invariant_gemm.py in a subprocess: ``cuda/invariant_gemm`` through Triton's interpreter, or with
``cuda`` compiled on a GPU. Prints JSON (the last line).

Quantization: ``invariant_gemm.quantize`` against ``model.quantize_fp8`` byte for byte, over random values at several
magnitudes and the edges of E4M3 (zeros of both signs, subnormals, every tie between neighbours, the saturation
point and past it, infinities); NaN only as NaN in, an E4M3 NaN out (torch keeps a NaN's sign, the GPU's
conversion may not).

Accuracy: against float64 of the very operands the kernel multiplies (BF16 / FP16 inputs; for an E4M3 weight the
input as ``quantize_fp8`` leaves it, E4M3 weights, ``x_scale * w_scale`` and the bias in float64), with bias and
without, N and K not multiples of the tiles (the K tail tile), at the module's launch shapes and at a small one with
many tiles (more than one band of GROUP_M row tiles; on a GPU it runs mma.sync, not wgmma). The bound:
``|out - ref| <= u (|ref| + e) + e`` where ``u`` is the output's unit roundoff (2^-8 bfloat16, 2^-11 float16, 2^-24
float32) and ``e = c * mass`` the float32 sums' error, ``mass = sum |x w| * scales + |bias|``, ``c = (K + 4) 2^-24``
(K float32 adds, the scale products and the bias add). An FP8 dot on a GPU sums products in the tensor cores' own
accumulator (~14 bits kept: DeepSeek-V3, section 3.3.2; assumed 2^-13 of the running sum per 32-deep MMA), so there
``c`` gains 2^-13 x (MMAs summed there before a float32 add: 4 a promoted 128-deep tile, K / 32 unpromoted): an
assumption about the hardware the ``cuda`` run tests, not a documented figure. ``bound_ratio``: the largest
``|out - ref|`` over that bound (<= 1 passes); ``max_ulp``: the largest error in units of the output's last place at
``ref`` for 16-bit outputs (informational: <= 0.5 is correctly rounded; the interpreter's dots sum each tile's exact
products in float64).

Invariance: the rows of one random x computed in calls of M = 1, 7, 64, 130 rows (on a GPU also 2,049 and 4,096, at
the 7B's shapes) that start at row 0, at row 37 and at the end of the largest call's x (``MAX_M + 77`` rows, so every
placement puts a row at another offset inside its tile and among other rows, or the clamped copies past M), and
once with x as [2, 3, K] (a leading shape) and one row as [K]: every row bitwise equal to the same row of the largest
call. The control: the largest call again at half the launch shape's BLOCK_K (twice it for an FP8 tile of 32: a
GPU's FP8 dot takes no K of 16), another order of the sums, gives rows that differ
(``rows_differing_at_other_block_k``), so the comparison can see a change of order. (Under the interpreter
invariance holds by construction, a dot's rows summed independently; the code paths are what it checks: clamped
rows and columns, tails, bands. The GPU's own MMAs are the ``cuda`` mode's.)

    python tests/invariant_gemm_check.py
    python tests/invariant_gemm_check.py cuda   # the compiled kernels on a GPU (Hopper: the wgmma launch shapes)
"""

from __future__ import annotations

import importlib
import json
import sys
import time

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"
if DEVICE == "cpu":
    importlib.import_module("triton_interpreter")  # (before any kernel module is imported)
import torch  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.cuda import invariant_gemm  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.model import quantize_fp8  # noqa: E402

FP8 = torch.float8_e4m3fn
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
UNIT_ROUNDOFF = {BF16: 2.0**-8, FP16: 2.0**-11, FP32: 2.0**-24}
MANTISSA_BITS = {BF16: 7, FP16: 10, FP32: 23}
INT_VIEW = {BF16: torch.int16, FP16: torch.int16, FP32: torch.int32}
# Many tiles under the interpreter: 16-row tiles give 13 of them at 207 rows, past one band of GROUP_M = 8.
SMALL = invariant_gemm.LaunchConfig(block_m=16, block_n=32, block_k=32, warps=4, stages=1)
FAST_FP8 = invariant_gemm.FP8_CONFIG._replace(promote=False)
INTERPRETER_MS = (1, 7, 64, 130)
GPU_MS = (1, 7, 64, 130, 2049, 4096)
OFFSET = 37  # a placement whose rows sit at other offsets inside their 16-, 64- and 128-row tiles
EXTRA_ROWS = 77
# The 7B's linears (K, N): qkv, dense, fc + gate, proj; and lm_head (float32 logits)
LINEARS_7B = ((3584, 4608), (3584, 3584), (3584, 37888), (18944, 3584))
LM_HEAD_7B = (3584, 152064)


def randn(gen: torch.Generator, *shape: int, std: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=DEVICE) * std


def operands(gen: torch.Generator, m: int, n: int, k: int, fp8: bool, x_dtype: torch.dtype, bias: bool) -> dict:
    """x, weight, bias, scales as a linear layer holds them. FP8: the activation scale makes ~3% of x saturate (x
    ~ N(0, 2^2) over 0.01 x 448), the weight E4M3 of N(0, 64^2) (subnormals to saturation) with a per-tensor scale."""
    compute = FP16 if x_dtype == FP16 else BF16
    x = randn(gen, m, k, std=2.0).to(compute)
    ops = {"bias": randn(gen, n).to(compute) if bias else None}
    if fp8:
        ops["weight"] = randn(gen, n, k, std=64.0).clamp(-448, 448).to(FP8)
        ops["x_scale"] = torch.tensor(0.01, device=DEVICE)
        ops["w_scale"] = torch.tensor(0.37 / 64 / k**0.5, device=DEVICE)
        ops["x_inv"] = 1.0 / ops["x_scale"]  # as Linear.a_inv
        ops["x"] = quantize_fp8(x, ops["x_inv"]) if x_dtype == FP8 else x
    else:
        ops["weight"] = randn(gen, n, k, std=k**-0.5).to(compute)
        ops["x"] = x
    return ops


def call(ops: dict, x: torch.Tensor, out_dtype: torch.dtype, config: invariant_gemm.LaunchConfig | None):
    fp8 = ops["weight"].dtype == FP8
    kwargs = {k: ops[k] for k in ("x_scale", "w_scale")} if fp8 else {}
    if fp8 and x.dtype != FP8:
        kwargs["x_inv"] = ops["x_inv"]
    return invariant_gemm.gemm(x, ops["weight"], bias=ops["bias"], out_dtype=out_dtype, config=config, **kwargs)


def quantize_check(gen: torch.Generator) -> dict:
    """``quantize`` against ``quantize_fp8``: random values at several magnitudes and E4M3's edges, bf16 and fp16."""
    e4m3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()
    finite = torch.sort(e4m3[e4m3.isfinite() & (e4m3 >= 0)]).values
    ties = (finite[1:] + finite[:-1]) / 2  # every midpoint: to the even neighbour
    edges = torch.cat([finite, ties, finite * 1.0001, ties * 0.9999, torch.tensor([448.0, 464.0, 480.0, 1e4, 2.0**-10,
                                                                                   2.0**-11, 3 * 2.0**-11])])
    edges = torch.cat([edges, -edges, torch.tensor([0.0, -0.0, float("inf"), float("-inf")])]).to(DEVICE)
    equal = total = 0
    for dtype in (BF16, FP16):
        for x, inv in ((edges.to(dtype), torch.tensor(1.0, device=DEVICE)),  # (the edges exact in the compute dtype)
                       (randn(gen, 37, 96, std=3.0).to(dtype), torch.tensor(1 / 0.01, device=DEVICE)),
                       (randn(gen, 5, 1024, std=0.02).to(dtype), torch.tensor(1 / 0.37, device=DEVICE)),
                       (randn(gen, 3, 128, std=100.0).to(dtype), torch.tensor(1 / 0.5, device=DEVICE))):
            mine, ref = invariant_gemm.quantize(x, inv).view(torch.uint8), quantize_fp8(x, inv).view(torch.uint8)
            equal += int((mine == ref).sum())
            total += ref.numel()
    nan = torch.tensor([float("nan"), -float("nan"), 1.0], device=DEVICE, dtype=BF16)
    out = invariant_gemm.quantize(nan, torch.tensor(1.0, device=DEVICE)).float()
    return {"equal": equal, "total": total, "nan_in_nan_out": bool(out[:2].isnan().all() and out[2] == 1.0)}


def accuracy(gen: torch.Generator, m: int, n: int, k: int, w_dtype: torch.dtype, x_dtype: torch.dtype,
             out_dtype: torch.dtype, bias: bool, config: invariant_gemm.LaunchConfig | None) -> dict:
    fp8 = w_dtype == FP8
    ops = operands(gen, m, n, k, fp8, x_dtype, bias)
    out = call(ops, ops["x"], out_dtype, config).double()
    x = ops["x"]
    quantized_equal = None
    if fp8:
        xq = quantize_fp8(x, ops["x_inv"]) if x.dtype != FP8 else x
        if x.dtype != FP8:  # what the GEMM multiplies: quantize's bytes, which must be quantize_fp8's
            mine = invariant_gemm.quantize(x, ops["x_inv"])
            quantized_equal = bool(torch.equal(mine.view(torch.uint8), xq.view(torch.uint8)))
        x = xq
        scale = ops["x_scale"].double() * ops["w_scale"].double()
    else:
        scale = torch.tensor(1.0, dtype=torch.float64, device=DEVICE)
    xd, wd = x.double(), ops["weight"].double()
    ref = (xd @ wd.T) * scale
    mass = (xd.abs() @ wd.abs().T) * scale
    if ops["bias"] is not None:
        ref, mass = ref + ops["bias"].double(), mass + ops["bias"].double().abs()
    cfg = config or invariant_gemm.launch_config(ops["x"].dtype, w_dtype, out_dtype)
    c = (k + 4) * 2.0**-24
    if fp8 and DEVICE != "cpu":  # 2^-13 of the running sum per 32-deep MMA, restarted per K tile where promoted
        promoted = cfg.promote and cfg.block_m >= 64  # (SMALL's 16 rows: mma.sync, which Triton does not promote)
        c += 2.0**-13 * (cfg.block_k if promoted else k) / 32
    u = UNIT_ROUNDOFF[out_dtype]
    err = (out - ref).abs()
    bound = u * (ref.abs() + c * mass) + c * mass
    ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref.abs().clamp_min(2.0**-120)).exponent - 1
                      - MANTISSA_BITS[out_dtype])
    return {"m": m, "n": n, "k": k, "weight": str(w_dtype), "x": str(ops["x"].dtype), "out": str(out_dtype),
            "bias": bias, "config": cfg._asdict(), "finite": bool(out.isfinite().all()),
            "quantized_equal": quantized_equal, "rel_err": (err.norm() / ref.norm()).item(),
            "bound_ratio": (err / (bound + 1e-300)).max().item(),
            "max_ulp": None if out_dtype == FP32 else (err / ulp).max().item()}


def invariance(gen: torch.Generator, n: int, k: int, w_dtype: torch.dtype, x_dtype: torch.dtype,
               out_dtype: torch.dtype, bias: bool, config: invariant_gemm.LaunchConfig | None,
               ms: tuple[int, ...]) -> dict:
    fp8 = w_dtype == FP8
    big = max(ms) + EXTRA_ROWS
    ops = operands(gen, big, n, k, fp8, x_dtype, bias)
    x = ops["x"]
    whole = call(ops, x, out_dtype, config)
    view = INT_VIEW[out_dtype]

    def equal_rows(y: torch.Tensor, start: int) -> int:
        return int((y.view(view) == whole[start: start + y.shape[0]].view(view)).all(-1).sum())

    per_m = {}
    for m in ms:
        starts = sorted({0, min(OFFSET, big - m), big - m})
        equal = sum(equal_rows(call(ops, x[s: s + m], out_dtype, config), s) for s in starts)
        per_m[str(m)] = [equal, m * len(starts)]
    leading = call(ops, x[:6].reshape(2, 3, k), out_dtype, config).reshape(6, n)
    per_m["2x3"] = [equal_rows(leading, 0), 6]
    one = call(ops, x[OFFSET], out_dtype, config)  # a single row as [K]
    per_m["[K]"] = [equal_rows(one[None], OFFSET), 1]
    cfg = config or invariant_gemm.launch_config(x.dtype, w_dtype, out_dtype)
    # The control: the same rows under another BLOCK_K (the sums' order) do differ, so equal rows above mean something
    # (twice it where half is under the 32 an FP8 dot takes on a GPU: Triton refuses a K of 16 there)
    other = cfg._replace(block_k=cfg.block_k // 2 if cfg.block_k // 2 >= 32 or not fp8 else cfg.block_k * 2)
    control = big - equal_rows(call(ops, x, out_dtype, other), 0)
    return {"n": n, "k": k, "weight": str(w_dtype), "x": str(x.dtype), "out": str(out_dtype), "bias": bias,
            "config": cfg._asdict(), "largest": big, "rows": per_m, "rows_differing_at_other_block_k": control, "other_block_k": other.block_k,
            "equal": sum(e for e, _ in per_m.values()), "total": sum(t for _, t in per_m.values()),
            "finite": bool(whole.isfinite().all())}


def main() -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    t0 = time.time()
    quant = quantize_check(gen)
    acc = []
    for config in (None, SMALL):
        acc.append(accuracy(gen, 37, 96, 80, BF16, BF16, BF16, True, config))  # a K tail (80 = 64 + 16; 32 x 2.5)
        acc.append(accuracy(gen, 37, 96, 208, FP8, BF16, BF16, True, config))  # E4M3 weight, x quantized here
    acc.append(accuracy(gen, 19, 64, 128, FP16, FP16, FP16, False, None))
    acc.append(accuracy(gen, 21, 200, 256, BF16, BF16, FP32, False, None))  # float32 logits
    acc.append(accuracy(gen, 16, 64, 128, FP8, FP8, BF16, True, None))  # x quantized by its producer
    acc.append(accuracy(gen, 23, 80, 256, FP8, FP16, FP16, False, None))
    acc.append(accuracy(gen, 9, 72, 128, FP8, BF16, FP32, True, None))
    acc.append(accuracy(gen, 30, 96, 256, FP8, BF16, BF16, True, FAST_FP8))  # fast accumulation (no promotion)
    inv = [invariance(gen, 192, 256, BF16, BF16, BF16, True, None, INTERPRETER_MS),
           invariance(gen, 80, 96, BF16, BF16, BF16, True, SMALL, INTERPRETER_MS),
           invariance(gen, 200, 256, BF16, BF16, FP32, False, None, INTERPRETER_MS),
           invariance(gen, 192, 256, FP8, BF16, BF16, True, None, INTERPRETER_MS),
           invariance(gen, 144, 208, FP8, FP8, BF16, False, None, INTERPRETER_MS),
           invariance(gen, 80, 96, FP8, BF16, FP16, True, SMALL, INTERPRETER_MS)]
    if DEVICE != "cpu":  # the GPU's own dots at the 7B's shapes and the prefill sizes
        for k, n in LINEARS_7B:
            for w_dtype in (BF16, FP8):
                acc.append(accuracy(gen, 64, n, k, w_dtype, BF16, BF16, True, None))
                inv.append(invariance(gen, n, k, w_dtype, BF16, BF16, True, None, GPU_MS))
            inv.append(invariance(gen, n, k, FP8, BF16, BF16, True, FAST_FP8, GPU_MS))
        k, n = LM_HEAD_7B
        acc.append(accuracy(gen, 64, n, k, BF16, BF16, FP32, False, None))
        inv.append(invariance(gen, n, k, BF16, BF16, FP32, False, None, GPU_MS))
    print(json.dumps({"device": DEVICE, "quantize": quant, "accuracy": acc, "invariance": inv,
                      "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
