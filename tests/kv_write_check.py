"""Run by tests/test_fused_prefill.py in a subprocess: ``cuda/prefill.write_kv`` through Triton's interpreter against
the eager forward's spelling (``kv_store``'s quantization, the index assignment, ``kv_load``'s dequantization): into a
BF16 pool and into an E4M3 pool at unit scale and at another, tokens scattered over shuffled blocks, the values a
strided view (as of the QKV output), the pool's other slots untouched, and the keys and values it returns for the
step's attention. Prints JSON.

    python tests/kv_write_check.py
    python tests/kv_write_check.py cuda   # the compiled kernel on a GPU, against the same spelling there
"""

from __future__ import annotations

import json
import sys

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"
if DEVICE == "cpu":
    import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.cuda import prefill  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.model import dequantize_fp8, quantize_fp8  # noqa: E402

KV_HEADS, D, BS, POOL, TOKENS = 2, 64, 4, 9, 13


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for pool_dtype, scale in ((torch.bfloat16, None), (torch.float8_e4m3fn, 1.0), (torch.float8_e4m3fn, 0.37)):
        qkv = (torch.randn(TOKENS, 3 * KV_HEADS * D, generator=gen) * 200).bfloat16().to(DEVICE)  # some past 448 / s
        k = qkv[:, : KV_HEADS * D].reshape(TOKENS, KV_HEADS, D).contiguous()
        v = qkv[:, KV_HEADS * D : 2 * KV_HEADS * D].view(TOKENS, KV_HEADS, D)  # strided: a view of the QKV output
        positions = torch.arange(3, 3 + TOKENS)
        table = torch.randperm(POOL - 1, generator=gen) + 1
        blocks, within = (table[positions // BS]).to(DEVICE), (positions % BS).to(DEVICE)
        pool = [torch.randn(POOL, KV_HEADS, BS, D, generator=gen).to(pool_dtype).to(DEVICE) for _ in range(2)]
        want = [p.clone() for p in pool]
        scales = {}
        stored, read = (k, v), (k, v)
        if scale is not None:
            s = torch.full((1,), scale, device=DEVICE)
            scales = {"scale": s, "inv": 1.0 / s}
            stored = tuple(quantize_fp8(x, scales["inv"][0]) for x in (k, v))  # the eager kv_store / kv_load
            read = tuple(dequantize_fp8(x, s[0], torch.bfloat16) for x in stored)
        for p, x in zip(want, stored):
            as_bytes(p)[blocks, :, within] = as_bytes(x.contiguous())
        got = prefill.write_kv(pool[0], pool[1], blocks, within, k, v, **scales)
        rows.append({"device": DEVICE, "pool": str(pool_dtype), "scale": scale, "v_strided": not v.is_contiguous(),
                     "pool_equal": all(torch.equal(as_bytes(a), as_bytes(b)) for a, b in zip(pool, want)),
                     "read_equal": all(torch.equal(a, b) for a, b in zip(got, read)),
                     "saturated": bool(scale is not None and (k.float().abs() / scale > 448).any())})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
