"""The INT4-AWQ batch-1 GEMV (runtimes/torch_engine/cuda/quant_gemv.py) at the 7B GLU and proj shapes, for Nsight Compute
(a CUDA GPU; the device tool's H200 has ncu): each config launched once to compile, then once each to be
profiled, the register-load kernels first (the driver's carveout), then Hopper's default (warp-specialized) under
the carveout the decode step pins for them (``quant_gemv.carveout``; warp-specialized: ``CARVEOUT_WS``):

    ncu --clock-control none -k regex:gemv_kernel --launch-skip 4 -c 4 --section SpeedOfLight \\
        --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \\
        --section MemoryWorkloadAnalysis python3 benchmarks/int4_gemv_ncu.py

Random weights quantized by round-to-nearest as in quant_fast_path; the inputs prepared once, and proj's
splits summed by the GEMV, as in the decode step.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quant_fast_path as qf  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv, quant_gemv_ws, quant_linear, support  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.model import Linear  # noqa: E402


def main() -> None:
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)

    def quantized(n: int, k: int) -> quant_linear.QuantWeight:
        w = (torch.randn(n, k, generator=gen, device=dev) / k**0.5).to(dt)
        t = {f"p.{s}": v for s, v in qf.quantize_linear("int4_awq", w, 5.0, gen).items()}
        return quant_linear.QuantWeight.of(Linear(t, "p", dt, dev, "int4_awq", qf.GROUP))

    sm = torch.cuda.get_device_properties(dev).multi_processor_count
    fc, gate, proj = quantized(18944, 3584), quantized(18944, 3584), quantized(3584, 18944)
    x = torch.randn(1, 3584, device=dev).to(dt)
    xs = [quant_gemv.launch_input(x, q, dt) for q in (fc, gate)]
    xp = quant_gemv.launch_input(torch.randn(1, 18944, device=dev).to(dt), proj, dt)
    act = torch.empty(1, 18944, device=dev, dtype=dt)
    counters = torch.zeros(64, dtype=torch.int32, device=dev)

    def glu(tma: bool):
        quant_linear.quant_glu(xs[0], fc, gate, act, quant_gemv.pick_config(fc, sm, glu=True, tma=tma), dt, x2=xs[1])

    def down(tma: bool):
        cfg = quant_gemv.pick_config(proj, sm, tma=tma)
        out = torch.empty(cfg.splits, 1, 3584, device=dev)
        quant_linear.quant_partials(xp, proj, out, cfg, dt, counters=counters)

    launches = [(glu, False), (down, False), (glu, True), (down, True)]
    for fn, tma in launches:  # compiled, not profiled
        fn(tma)
    torch.cuda.synchronize()
    for fn, tma in launches[:2]:
        fn(tma)
    torch.cuda.synchronize()
    percent = quant_gemv.carveout([quant_gemv.pick_config(fc, sm, glu=True, tma=True)])
    support.set_carveout((quant_gemv, quant_gemv_ws), percent)
    for fn, tma in launches[2:]:
        fn(tma)
    torch.cuda.synchronize()
    print("profiled: GLU and proj loading to registers, then GLU and proj by the copy engine (carveout "
          f"{percent}%)")


if __name__ == "__main__":
    main()
