"""cuBLAS's FP8 GEMM with and without fast accumulation at the 7B's prefill shapes: time and error (issue 31).

    python3 benchmarks/fp8_fast_accum.py -o OUT.json [--ms 2048,4096]       (h200_run.sh fp8_fast_accum)
    python3 benchmarks/fp8_fast_accum.py --dry-run -o OUT.json               (CPU, tiny shapes: every call made)

A 2048/128 step (one prompt, 127 decode rows) spent 24.2 of its 37.8 ms in cuBLAS's FP8 GEMMs on an H100
(2026-12-07d). ``torch._scaled_mm`` promotes its sums to float32 every few K blocks unless ``use_fast_accum=True``
(the whole K in the tensor cores' ~14-bit accumulator, as TensorRT-LLM's and vLLM's Hopper FP8 GEMMs run);
``TRTLLM_PIPELINE_FP8_FAST_ACCUM=1`` turns it on in the runtime. Here each linear (qkv, dense, fc + gate as one GEMM,
proj) at each M: us and TFLOP/s both ways (``gpu_fast_path.time_graph``: a CUDA graph of 20 launches over weight
copies larger than L2), and each way's relative error against float64 ``x @ W^T`` of the same E4M3 values (the
rounding to the BF16 output included), so that the speed is weighed against what it costs in accuracy. (The
2026-12-07e figures were taken as the best of 5 replays by a timer of this file's own.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtllm_pipeline.runtimes.torch_engine.model import FP8_MAX, quantize_fp8  # noqa: E402

LINEARS = (("qkv", 4608, 3584), ("dense", 3584, 3584), ("fc_gate", 2 * 18944, 3584), ("proj", 3584, 18944))
DRY_LINEARS = (("qkv", 96, 64), ("dense", 64, 64), ("fc_gate", 256, 64), ("proj", 64, 128))


def _fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` quantized per tensor to E4M3 (amax to 448, as the runtime's ``quantize_fp8``) and its float32 scale."""
    scale = (t.abs().max().float() / FP8_MAX).clamp(min=1e-12)
    return quantize_fp8(t, 1.0 / scale), scale


def _time_us(fn, device: torch.device, launches: int = 20) -> float:
    """us of one ``fn(i)`` (i: the weight copy), from a CUDA graph of ``launches`` calls (``time_graph``); on the CPU
    one call's wall clock (the dry run)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn(0)
        return (time.perf_counter() - t0) * 1e6
    from gpu_fast_path import time_graph  # (CUDA at import: the dry run never reaches here)

    it = iter(range(10**9))
    return time_graph(lambda: fn(next(it)), launches)


def rows(ms, linears, device: torch.device, l2_bytes: int = 60 * 2**20) -> list[dict]:
    gen = torch.Generator(device=device).manual_seed(5)
    out = []
    for name, n, k in linears:
        w, w_scale = _fp8(torch.randn(n, k, generator=gen, device=device) / k**0.5)
        copies = max(1, -(-4 * l2_bytes // w.numel())) if device.type == "cuda" else 1
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        for m in ms:
            x, x_scale = _fp8(torch.randn(m, k, generator=gen, device=device) * 2)
            want = (x.double() * x_scale.double()) @ (w.double() * w_scale.double()).t()
            row = {"linear": name, "m": m, "n": n, "k": k}
            for fast in (False, True):
                res = {}

                def call(i, fast=fast, res=res, ws=ws):
                    res[0] = torch._scaled_mm(x, ws[i % copies].t(), scale_a=x_scale, scale_b=w_scale,
                                              out_dtype=torch.bfloat16, use_fast_accum=fast)
                us = _time_us(call, device)
                call(0)
                err = float((res[0].double() - want).norm() / want.norm())
                key = "fast" if fast else "precise"
                row[f"{key}_us"], row[f"{key}_error"] = us, err
                row[f"{key}_tflops"] = 2 * m * n * k / (us * 1e-6) / 1e12
            row["speedup"] = row["precise_us"] / row["fast_us"]
            out.append(row)
            print(f"{name:8s} M {m:5d}: precise {row['precise_us']:8.1f} us ({row['precise_tflops']:6.1f} TFLOP/s, "
                  f"error {row['precise_error']:.2e})  fast {row['fast_us']:8.1f} us ({row['fast_tflops']:6.1f}, "
                  f"error {row['fast_error']:.2e})  {row['speedup']:.3f}x", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--ms", default="2048,2175,4096", help="GEMM rows (default: a 2,048-token prompt, with 127 "
                                                            "decode rows, two prompts)")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    args = ap.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    ms = [32, 48] if args.dry_run else [int(v) for v in args.ms.split(",")]
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "rows": rows(ms, DRY_LINEARS if args.dry_run else LINEARS, device)}
    by_m = {}
    for r in result["rows"]:
        by_m.setdefault(r["m"], [0.0, 0.0])
        by_m[r["m"]][0] += r["precise_us"]
        by_m[r["m"]][1] += r["fast_us"]
    result["layer_us"] = {m: {"precise": p, "fast": f, "speedup": p / f} for m, (p, f) in by_m.items()}
    for m, v in result["layer_us"].items():
        print(f"a layer's four GEMMs at M {m}: {v['precise']:.1f} -> {v['fast']:.1f} us ({v['speedup']:.3f}x)")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1))
    sys.exit(0)


if __name__ == "__main__":
    main()
