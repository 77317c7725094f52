"""The INT4-AWQ batch-1 GEMV (runtimes/cuda/quant_gemv.py) at the 7B GLU and proj shapes, three launches each,
for Nsight Compute (a CUDA GPU; the device tool's H200 has ncu):

    ncu --clock-control none -k regex:_int4_gemv -c 3 --launch-skip 2 --section SpeedOfLight \\
        --section WarpStateStats --section SchedulerStats --section Occupancy python3 benchmarks/int4_gemv_ncu.py

Random weights quantized by round-to-nearest as in quant_fast_path; the kernels' default tiles, and the
GLU at 64 rows (the default before run 21, whose grid was 0.6 of a wave) for comparison.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quant_fast_path as qf  # noqa: E402

from trtllm_pipeline.runtimes.cuda import quant_gemv, quant_linear  # noqa: E402
from trtllm_pipeline.runtimes.torch_model import Linear  # noqa: E402


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
    act = torch.empty(1, 18944, device=dev, dtype=dt)
    for cfg in (quant_gemv.pick_config(fc, sm, glu=True), quant_gemv.pick_config(fc, sm, glu=True, block_n=64)):
        for _ in range(3):
            quant_linear.quant_glu(x, fc, gate, act, cfg, dt)
    cfg = quant_gemv.pick_config(proj, sm)
    out = torch.empty(cfg.splits, 1, 3584, device=dev)
    for _ in range(3):
        quant_linear.quant_partials(torch.randn(1, 18944, device=dev).to(dt), proj, out, cfg, dt)
    torch.cuda.synchronize()
    print("launched: GLU default, GLU 64 rows, proj default (3 each)")


if __name__ == "__main__":
    main()
