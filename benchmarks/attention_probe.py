"""Probe (H200): one layer's decode attention, split combine and residual RMSNorm at the 7B shape, batch 1,
context 2048, launched alone (no PDL) so that Nsight Compute can profile each; prints each kernel's time by
CUDA events over 200 launches.

    ncu --kernel-name regex:... python3 benchmarks/attention_probe.py
"""

from __future__ import annotations

import torch

from trtllm_pipeline.runtimes.torch_engine.cuda import attention, gemv_input, norm

HEADS, KV, D, HIDDEN, CTX, MAX_LEN = 28, 4, 128, 3584, 2048, 4096


def main() -> None:
    dev = "cuda"
    width = (HEADS + 2 * KV) * D
    qkv = torch.randint(-2**34, 2**34, (1, width), dtype=torch.int64, device=dev)
    bias = torch.randn(width, device=dev).bfloat16()
    angles = torch.rand(MAX_LEN, D, device=dev) * 6.28
    cos, sin = angles.cos(), angles.sin()
    k_cache = torch.randn(2, KV, MAX_LEN, D, device=dev).bfloat16()
    v_cache = torch.randn(2, KV, MAX_LEN, D, device=dev).bfloat16()
    positions = torch.tensor([CTX - 1], device=dev)
    slots = torch.tensor([0], device=dev)
    splits = attention.pick_splits(1, KV, torch.cuda.get_device_properties(0).multi_processor_count)
    o = torch.empty(1, HEADS, splits, D, device=dev)
    lse = torch.empty(1, HEADS, splits, device=dev)
    out = torch.empty(1, HIDDEN, dtype=torch.bfloat16, device=dev)
    pqs = torch.rand(HIDDEN, device=dev).bfloat16() + 0.5
    prep = gemv_input.empty(1, HIDDEN, 16, pqs, dev)
    residual = torch.randn(1, HIDDEN, device=dev).bfloat16()
    hidden_sums = torch.randint(-2**34, 2**34, (1, HIDDEN), dtype=torch.int64, device=dev)
    weight = torch.rand(HIDDEN, device=dev).bfloat16()
    normed = torch.empty(1, HIDDEN, dtype=torch.bfloat16, device=dev)
    prep2 = gemv_input.empty(1, HIDDEN, 16, pqs, dev)

    def attend():
        attention.decode_attention(qkv, bias, cos, sin, k_cache, v_cache, positions, slots, o, lse, out, None,
                                   heads=HEADS, kv_heads=KV, compute=torch.bfloat16, prepared=prep)

    def rmsnorm():
        norm.residual_rmsnorm(residual, hidden_sums, weight, normed, None, 1e-6, torch.bfloat16,
                              prepared=(prep, prep2))

    for name, fn in (("attention+combine", attend), ("residual_rmsnorm", rmsnorm)):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(200):
            fn()
        end.record()
        torch.cuda.synchronize()
        print(f"{name}: {start.elapsed_time(end) / 200 * 1000:.2f} us per call (splits {splits})")


if __name__ == "__main__":
    main()
