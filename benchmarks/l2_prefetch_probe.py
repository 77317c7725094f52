"""What an L2 prefetch buys a small INT4 GEMV, and what it costs the kernel that issues it (one H200 call).

    python benchmarks/l2_prefetch_probe.py [-o results.json]

For attention.dense's and the QKV linear's 7B shapes (the warp-specialized INT4 GEMV, batch 1): the GEMV over
rotating weight copies larger than L2 (cold: every weight from DRAM, as in a decode step) and over one copy
(warm: from L2, what a perfect prefetch would give); and a launch that only prefetches one copy's weights
(runtimes/cuda/l2_prefetch.py, bulk or line by line, from 8 or 128 programs) against an empty launch: if the
prefetching launch lasts as long as DRAM takes to deliver the bytes, its programs are held until the prefetches
land, and a kernel on the step's critical path pays for them. Each time is the median over CUDA-graph replays.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_fast_path import time_graph  # noqa: E402
from quant_fast_path import GROUP, quantize_linear  # noqa: E402

from trtllm_pipeline.runtimes.cuda import l2_prefetch, quant_gemv, quant_linear  # noqa: E402
from trtllm_pipeline.runtimes.torch_model import Linear  # noqa: E402

DEV = torch.device("cuda")
L2_BYTES = 60 * 2**20


@triton.jit
def _prefetch_only(plan_ptr, REGIONS: tl.constexpr, LINES: tl.constexpr):
    if REGIONS > 0:
        l2_prefetch.prefetch(plan_ptr, REGIONS, tl.program_id(0), tl.num_programs(0), tl.arange(0, 128),
                             l2_prefetch.CHUNK, False, plan_ptr, LINES)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", default="l2_prefetch_probe.json")
    a = ap.parse_args()
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device=DEV).manual_seed(5)
    dt = torch.bfloat16
    rows = []
    for name, n, k in (("dense", 3584, 3584), ("qkv", 4608, 3584)):
        w = (torch.randn(n, k, generator=gen, device=DEV) / k**0.5).to(dt)
        t = {f"p.{s}": v for s, v in quantize_linear("int4_awq", w, 5.0, gen).items()}
        q = quant_linear.QuantWeight.of(Linear(t, "p", dt, DEV, "int4_awq", GROUP))
        copies = -(-4 * L2_BYTES // q.nbytes())
        sets = [q] + [dataclasses.replace(q, weight=q.weight.clone(), scales=q.scales.clone()) for _ in range(copies - 1)]
        cfg = quant_linear.pick_config(q, 1, sm)
        x = quant_gemv.launch_input((torch.randn(1, k, generator=gen, device=DEV) * 2).to(dt), q, dt)
        out = torch.empty(cfg.splits, 1, n, device=DEV)
        counters = torch.zeros(4096, dtype=torch.int32, device=DEV)
        plans = [l2_prefetch.plan([l2_prefetch.whole(s.weight), l2_prefetch.whole(s.scales)], DEV) for s in sets]
        it = iter(range(10**9))

        def gemv(i):
            quant_linear.quant_partials(x, sets[i % copies], out, cfg, dt, True, counters=counters)

        row = {"linear": name, "bytes": q.nbytes(), "config": str(cfg),
               "gemv_cold_us": time_graph(lambda: gemv(next(it)), 2 * copies),
               "gemv_warm_us": time_graph(lambda: gemv(0), 2 * copies),
               "empty_launch_us": time_graph(lambda: _prefetch_only[(128,)](plans[0], REGIONS=0, LINES=False), 64)}
        for lines in (False, True):
            for programs in (8, 128):
                key = f"prefetch_{'lines' if lines else 'bulk'}_{programs}_us"
                row[key] = time_graph(lambda: _prefetch_only[(programs,)](plans[next(it) % copies], REGIONS=2,
                                                                          LINES=lines), 2 * copies)

                def pair(lines=lines, programs=programs):  # the prefetch, then the GEMV on the same copy
                    i = next(it)
                    _prefetch_only[(programs,)](plans[i % copies], REGIONS=2, LINES=lines)
                    gemv(i)
                row[key.replace("_us", "_then_gemv_us")] = time_graph(pair, 2 * copies)
        rows.append(row)
        print(json.dumps(row), flush=True)
    Path(a.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=1))
    dram = 4.3e6  # bytes per microsecond at the copy bandwidth
    print(f"{'linear':6} {'MB':>5} {'DRAM us':>7} {'cold':>6} {'warm':>6} {'empty':>6} "
          + " ".join(f"{k[9:-3]:>18}" for k in rows[0] if k.startswith("prefetch")))
    for r in rows:
        print(f"{r['linear']:6} {r['bytes'] / 1e6:5.1f} {r['bytes'] / dram:7.2f} {r['gemv_cold_us']:6.2f} "
              f"{r['gemv_warm_us']:6.2f} {r['empty_launch_us']:6.2f} "
              + " ".join(f"{v:18.2f}" for k, v in r.items() if k.startswith("prefetch")))


if __name__ == "__main__":
    main()
