"""Run by tests/test_fast_decode.py in a subprocess: the decode attention kernel (and its split combine)
through Triton's interpreter, against attention computed in float64 by torch, at positions where the new
token opens a tile, closes one, sits alone in the last tile of its split, or is the only key, its keys read
through a shuffled block table (blocks of 16 in a pool); and once with the
projection as int64 accumulators of the unnormalized input whose 1 / rms the kernel applies (the input norm
folded into the QKV GEMV, gemv_input.NormFold); and over an E4M3 cache with bfloat16 and with float16 dots.
Prints JSON.

    python tests/attention_check.py
"""

from __future__ import annotations

import json

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch

from trtllm_pipeline.runtimes.torch_engine.cuda import attention, fixed_sum

HEADS, KV_HEADS, D, SPLITS, MAX_LEN = 8, 2, 128, 4, 320
BS, POOL = 16, 24  # KV blocks of 16 tokens (a 64-key tile spans four), a pool of 24 with null block 0


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rotated = torch.cat([-x[..., D // 2:], x[..., : D // 2]], -1)
    return (x * cos + rotated * sin).bfloat16().double()


def reference(qkv, cos, sin, k_cache, v_cache, pos: int) -> torch.Tensor:
    """The new token's attention output over keys 0..pos of sequence 1 (contiguous), the new key and value at pos
    (an E4M3 cache's: rounded to E4M3, as the kernel stores and reads them at unit scale)."""
    stored = (lambda t: t.to(torch.float8_e4m3fn).double()) if k_cache.dtype == torch.float8_e4m3fn else (lambda t: t)
    x = qkv[0, 0].view(HEADS + 2 * KV_HEADS, D).bfloat16().double()
    q = rope(x[:HEADS], cos[pos].double(), sin[pos].double())
    k = rope(x[HEADS:HEADS + KV_HEADS], cos[pos].double(), sin[pos].double())
    keys, values = k_cache[1, :, : pos + 1].double(), v_cache[1, :, : pos + 1].double()
    keys[:, pos], values[:, pos] = stored(k), stored(x[HEADS + KV_HEADS:].bfloat16().double())
    group = HEADS // KV_HEADS
    out = [torch.softmax(q[h] @ keys[h // group].T / D**0.5, -1) @ values[h // group] for h in range(HEADS)]
    return torch.cat(out)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    angles = torch.rand(MAX_LEN, D, generator=gen) * 6.28
    cos, sin = angles.cos(), angles.sin()
    rows = []
    # length 1; the new token opening a tile; closing one; alone in its split's last tile (65 = 64 + 1 keys);
    # a long range of two tiles per split
    for pos in (0, 64, 127, 64 * SPLITS, 300):
        qkv = torch.randn(1, 1, (HEADS + 2 * KV_HEADS) * D, generator=gen)
        row, written, new_key = run_case(gen, cos, sin, pos, qkv, qkv)
        rows.append({**row, "cache_written": torch.equal(written, new_key)})
    # the loaded engine's tiles of 32 keys (attention.LOADED_BLOCK_T, from LOADED_ROWS rows a step): opening a tile,
    # alone in its split's last tile, two tiles per split
    for pos in (32, 32 * SPLITS, 300):
        qkv = torch.randn(1, 1, (HEADS + 2 * KV_HEADS) * D, generator=gen)
        row, written, new_key = run_case(gen, cos, sin, pos, qkv, qkv, block_t=attention.LOADED_BLOCK_T)
        rows.append({**row, "block_t": attention.LOADED_BLOCK_T, "cache_written": torch.equal(written, new_key)})
    rows.append(folded_norm(gen, cos, sin))
    # an E4M3 cache at unit scale (ModelOpt's), at the FP8 pool's loaded tile (LOADED_FP8_BLOCK_T), with bfloat16 and
    # with float16 dots (attention.FP8_DOTS_F16): both within the output's rounding of float64 attention over the stored values
    module_dots = attention.FP8_DOTS_F16
    for f16 in (False, True):
        attention.FP8_DOTS_F16 = f16
        qkv = torch.randn(1, 1, (HEADS + 2 * KV_HEADS) * D, generator=gen)
        one = torch.ones(1)
        row, written, new_key = run_case(gen, cos, sin, 300, qkv, qkv, block_t=attention.LOADED_FP8_BLOCK_T, fp8=True,
                                         kv_scale=one, kv_inv=one, kv_unit=True)
        rows.append({**row, "kv": "fp8", "dots": "f16" if f16 else "bf16",
                     "cache_written": torch.equal(written, new_key.to(torch.float8_e4m3fn).double())})
    attention.FP8_DOTS_F16 = module_dots
    rows.append(single_split(gen, cos, sin))
    print(json.dumps(rows))


def single_split(gen: torch.Generator, cos: torch.Tensor, sin: torch.Tensor, pos: int = 200) -> dict:
    """One key-range split: the kernel stores the output itself (``DIRECT_SINGLE_SPLIT``) and, off, the combine does:
    the same bits, as it is (bfloat16) and as attention.dense's E4M3 input (``out_inv``); both near float64's."""
    qkv = torch.randn(1, 1, (HEADS + 2 * KV_HEADS) * D, generator=gen)
    k_cache = torch.randn(2, KV_HEADS, MAX_LEN, D, generator=gen).bfloat16()
    v_cache = torch.randn(2, KV_HEADS, MAX_LEN, D, generator=gen).bfloat16()
    expected = reference(qkv, cos, sin, k_cache, v_cache, pos)
    table = torch.arange(1, MAX_LEN // BS + 1)
    outs = {}
    for direct in (True, False):
        attention.DIRECT_SINGLE_SPLIT = direct
        for quant in (False, True):
            k_pool = torch.zeros(POOL, KV_HEADS, BS, D, dtype=torch.bfloat16)
            v_pool = torch.zeros_like(k_pool)
            for j, block in enumerate(table.tolist()):
                k_pool[block] = k_cache[1, :, j * BS : (j + 1) * BS]
                v_pool[block] = v_cache[1, :, j * BS : (j + 1) * BS]
            out = torch.empty(1, HEADS * D, dtype=torch.float8_e4m3fn if quant else torch.bfloat16)
            attention.decode_attention(qkv, None, cos, sin, k_pool, v_pool, torch.tensor([pos]), torch.tensor([1]),
                                       torch.stack([torch.zeros_like(table), table]), torch.empty(1, HEADS, 1, D),
                                       torch.empty(1, HEADS, 1), out, torch.full((1,), 4.0) if quant else None,
                                       heads=HEADS, kv_heads=KV_HEADS, compute=torch.bfloat16)
            outs[direct, quant] = out.float()
    attention.DIRECT_SINGLE_SPLIT = True
    return {"pos": pos, "single_split": True, "finite": bool(outs[True, False].isfinite().all()), "cache_written": True,
            "rel_err": ((outs[True, False][0].double() - expected).norm() / expected.norm()).item(),
            "direct_equal": all(torch.equal(outs[True, q], outs[False, q]) for q in (False, True)),
            "quantized_nonzero": bool(outs[True, True].abs().sum() > 0)}


def run_case(gen: torch.Generator, cos: torch.Tensor, sin: torch.Tensor, pos: int, qkv: torch.Tensor,
             given: torch.Tensor, fp8: bool = False, **options) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The kernel over random caches at ``pos`` (``fp8``: E4M3), handed the projection as ``given`` (with
    decode_attention's ``options``), against the reference's attention over ``qkv``: (its row, the key it wrote to
    the cache, the reference's new key)."""
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    k_cache = torch.randn(2, KV_HEADS, MAX_LEN, D, generator=gen).to(dtype)
    v_cache = torch.randn(2, KV_HEADS, MAX_LEN, D, generator=gen).to(dtype)
    expected = reference(qkv, cos, sin, k_cache, v_cache, pos)
    # slot 1's keys and values paged: its blocks scattered over the pool in a shuffled table
    table = (torch.randperm(POOL - 1, generator=gen)[: MAX_LEN // BS] + 1)
    k_pool = torch.zeros(POOL, KV_HEADS, BS, D, dtype=dtype)
    v_pool = torch.zeros_like(k_pool)
    for j, block in enumerate(table.tolist()):
        k_pool[block] = k_cache[1, :, j * BS : (j + 1) * BS]
        v_pool[block] = v_cache[1, :, j * BS : (j + 1) * BS]
    o = torch.empty(1, HEADS, SPLITS, D)
    lse = torch.empty(1, HEADS, SPLITS)
    out = torch.empty(1, HEADS * D, dtype=torch.bfloat16)
    attention.decode_attention(given, None, cos, sin, k_pool, v_pool, torch.tensor([pos]), torch.tensor([1]),
                               torch.stack([torch.zeros_like(table), table]),
                               o, lse, out, None, heads=HEADS, kv_heads=KV_HEADS, compute=torch.bfloat16, **options)
    new_key = rope(qkv[0, 0].view(-1, D)[HEADS:HEADS + KV_HEADS].bfloat16().double(), cos[pos].double(),
                   sin[pos].double())
    row = {"pos": pos, "finite": bool(out.isfinite().all()),
           "rel_err": ((out[0].double() - expected).norm() / expected.norm()).item()}
    return row, k_pool[table[pos // BS], :, pos % BS].double(), new_key


def folded_norm(gen: torch.Generator, cos: torch.Tensor, sin: torch.Tensor, pos: int = 200, hidden: int = 96,
                eps: float = 1e-6) -> dict:
    """The projection handed over unnormalized, as int64 accumulators, with 3 K splits' sums of squares: the
    kernel's 1 / sqrt(sum / hidden + eps) times them is the projection ``qkv`` the reference attends with."""
    qkv = torch.randn(1, 1, (HEADS + 2 * KV_HEADS) * D, generator=gen)
    sumsq = torch.rand(3, generator=gen) * 50 + 10
    rstd = torch.rsqrt(sumsq.double().sum() / hidden + eps)
    units = torch.round(qkv[0].double() / rstd * 2.0**32).long()  # [1, N]: fixed_sum's accumulators
    assert fixed_sum.is_accumulator(units)
    row, written, new_key = run_case(gen, cos, sin, pos, qkv, units, norm_sumsq=sumsq, hidden=hidden, eps=eps)
    # the key as the kernel rounds it: within a bfloat16 step of the reference's
    return {**row, "folded_norm": True,
            "cache_written": bool(((written - new_key).abs() <= new_key.abs() * 2**-7 + 1e-6).all())}


if __name__ == "__main__":
    main()
