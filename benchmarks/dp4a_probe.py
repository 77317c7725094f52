"""Throughput and latency of the integer dot-product instruction (dp4a) against IMAD and FFMA on this GPU:
each thread runs CHAINS independent accumulator chains of ITERS dependent instructions. Prints a table."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _probe(out_ptr, seed, ITERS: tl.constexpr, CHAINS: tl.constexpr, OP: tl.constexpr):
    i = tl.program_id(0) * 128 + tl.arange(0, 128)
    a = (i * 0x01010101 + seed).to(tl.int32)
    accs = tl.zeros((CHAINS, 128), dtype=tl.int32) + tl.arange(0, CHAINS)[:, None]
    f = accs.to(tl.float32)
    af = a.to(tl.float32)
    for _ in range(ITERS):
        if OP == 0:
            accs = tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a[None, :], accs, accs],
                                             dtype=tl.int32, is_pure=True, pack=1)
        elif OP == 1:
            accs = accs * a[None, :] + accs
        else:
            f = f * af[None, :] + f
    tl.store(out_ptr + i, tl.sum(accs, 0) + tl.sum(f, 0).to(tl.int32))


def main() -> None:
    dev = torch.device("cuda")
    sm = torch.cuda.get_device_properties(dev).multi_processor_count
    grid = sm * 32
    out = torch.empty(grid * 128, dtype=torch.int32, device=dev)
    iters = 4096
    print(f"{'op':6} {'chains':>6} {'ms':>8} {'Gops/s':>9} {'ops/clk/SM':>10}")
    clock = torch.cuda.clock_rate(dev) * 1e6 if hasattr(torch.cuda, "clock_rate") else 1.98e9
    for op, name in ((0, "dp4a"), (1, "imad"), (2, "ffma")):
        for chains in (1, 4, 8):
            _probe[(grid,)](out, 1, ITERS=iters, CHAINS=chains, OP=op, num_warps=4)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                _probe[(grid,)](out, 1, ITERS=iters, CHAINS=chains, OP=op, num_warps=4)
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end) / 5
            ops = grid * 128 * chains * iters
            print(f"{name:6} {chains:6} {ms:8.3f} {ops / ms / 1e6:9.0f} {ops / (ms / 1e3) / clock / sm:10.1f}")


if __name__ == "__main__":
    main()
