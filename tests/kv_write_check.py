"""Run by tests/test_fused_prefill.py in a subprocess: ``cuda/prefill.write_kv`` through Triton's interpreter against
the eager forward's index assignment, into a BF16 and an E4M3 pool, tokens scattered over shuffled blocks, the values
a strided view (as of the QKV output), the pool's other slots untouched. Prints JSON.

    python tests/kv_write_check.py
    python tests/kv_write_check.py cuda   # the compiled kernel on a GPU, against the same assignment there
"""

from __future__ import annotations

import json
import sys

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"
if DEVICE == "cpu":
    import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.cuda import prefill  # noqa: E402

KV_HEADS, D, BS, POOL, TOKENS = 2, 64, 4, 9, 13


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        qkv = torch.randn(TOKENS, 3 * KV_HEADS * D, generator=gen).to(DEVICE)
        k = qkv[:, : KV_HEADS * D].reshape(TOKENS, KV_HEADS, D).contiguous().to(dtype)
        v = qkv[:, KV_HEADS * D :].to(dtype)[:, : KV_HEADS * D].view(TOKENS, KV_HEADS, D)  # strided: row of 2 heads
        positions = torch.arange(3, 3 + TOKENS)
        table = torch.randperm(POOL - 1, generator=gen) + 1
        blocks, within = (table[positions // BS]).to(DEVICE), (positions % BS).to(DEVICE)
        pool = [torch.randn(POOL, KV_HEADS, BS, D, generator=gen).to(dtype).to(DEVICE) for _ in range(2)]
        want = [p.clone() for p in pool]
        for p, x in zip(want, (k, v)):  # (as the eager forward assigns: E4M3 as its bytes)
            as_bytes = (lambda t: t.view(torch.uint8)) if dtype == torch.float8_e4m3fn else (lambda t: t)
            as_bytes(p)[blocks, :, within] = as_bytes(x.contiguous())
        prefill.write_kv(pool[0], pool[1], blocks, within, k, v)
        rows.append({"device": DEVICE, "dtype": str(dtype), "v_strided": not v.is_contiguous(),
                     "equal": all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(pool, want))})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
