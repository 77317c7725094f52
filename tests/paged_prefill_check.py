"""Run by tests/test_paged_prefill.py in a subprocess: ``cuda/paged_prefill.prefill_attention`` through Triton's
interpreter. Prints JSON.

Accuracy: against causal attention in float64 over the keys and values as the pool's readers see them (a BF16 pool;
an E4M3 pool at unit scale and at 0.37, read as ``model.dequantize_fp8``), rows of lengths that are no multiples of
the query tile, the key tile or the block, one after a cached prefix (start > 0), one a single token, their blocks
shuffled over the pool, every slot the rows do not own NaN and every table entry past a row's span an id far past
the pool (so a read of either shows). The bound: the output is rounded once to bfloat16 and each softmax weight once
before the PV dot, so |out - ref| <= u (|ref| + sum_j p_j |v_j|) with u = 2^-8 (bfloat16's unit roundoff), the
float32 sums far below it; ``bound_ratio`` is the largest |out - ref| over that bound (<= 1 passes).

Invariance: one prompt's queries computed as one row from position 0; as two chunks (the second at start 13, a cut
aligned to neither the query tile nor the block), each launched alone; packed between other rows, its blocks at
other pool slots; and its second chunk packed with another row: every query's output bitwise equal (``torch.equal``)
to the whole row's; and once more as one row through a tile map made beforehand, its tiles reversed and three unused
all-zero entries after them (a CUDA graph's static map). Tables int32 (accuracy) and int64 (invariance).

    python tests/paged_prefill_check.py
    python tests/paged_prefill_check.py cuda   # the compiled kernel on a GPU
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

from trtllm_pipeline.runtimes.torch_engine.cuda import paged_prefill  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.model import dequantize_fp8, quantize_fp8  # noqa: E402

COMPUTE = torch.bfloat16
UNIT_ROUNDOFF = 2.0**-8  # bfloat16's
POOL_BLOCKS = 64
FAR_BLOCK = 1 << 30  # a table entry past a row's span: read, it would fault
# Tiles small enough that the interpreter's short rows span several query and key tiles, a key tile several blocks
SMALL = paged_prefill.LaunchConfig(block_m=16, block_n=16, warps=4, stages=1)


class Pool:
    """One layer's pool (NaN where no row wrote) and what its readers see of each row's keys and values."""

    def __init__(self, gen: torch.Generator, kv_heads: int, d: int, bs: int, pool_dtype: torch.dtype,
                 scale: float | None, blocks: int = POOL_BLOCKS):
        self.kv_heads, self.d, self.bs, self.dtype = kv_heads, d, bs, pool_dtype
        self.gen, self.free = gen, (torch.randperm(blocks - 1, generator=gen) + 1).tolist()
        nan = torch.full((blocks, kv_heads, bs, d), float("nan"))
        # (E4M3's NaN is the byte 0x7F: the bytes, since a cast would saturate)
        self.k, self.v = (torch.full(nan.shape, 0x7F, dtype=torch.uint8).view(pool_dtype)
                          if pool_dtype == torch.float8_e4m3fn else nan.to(pool_dtype) for _ in range(2))
        self.scale = None if scale is None else torch.full((1,), scale)

    def sequence(self, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A row's keys and values for positions 0 .. span - 1 as stored, [span, kv_heads, D] each (values past
        448 x scale among them: saturated)."""
        x = (torch.randn(2, span, self.kv_heads, self.d, generator=self.gen) * 3).to(COMPUTE)
        if self.scale is None:
            return x[0], x[1]
        return quantize_fp8(x[0], 1.0 / self.scale[0]), quantize_fp8(x[1], 1.0 / self.scale[0])

    def place(self, keys: torch.Tensor, values: torch.Tensor, width: int) -> torch.Tensor:
        """Writes a row's stored keys and values into free blocks; returns its table row (``width`` entries)."""
        span = keys.shape[0]
        blocks = [self.free.pop() for _ in range(-(-span // self.bs))]
        at, within = torch.tensor(blocks)[torch.arange(span) // self.bs], torch.arange(span) % self.bs
        for pool, x in ((self.k, keys), (self.v, values)):
            pool.view(torch.uint8)[at, :, within] = x.view(torch.uint8)  # (bytes: E4M3 index kernels are few)
        return torch.tensor(blocks + [FAR_BLOCK] * (width - len(blocks)))

    def read(self, x: torch.Tensor) -> torch.Tensor:
        """What the kernel must see of stored keys or values: ``model.dequantize_fp8``'s values."""
        return x if self.scale is None else dequantize_fp8(x, self.scale[0], COMPUTE)

    def kwargs(self) -> dict:  # (at unit scale as the engine passes ModelOpt's: converted without the multiply)
        return {} if self.scale is None else {"kv_scale": self.scale.to(DEVICE), "kv_unit": self.scale.item() == 1.0}


def reference(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], starts: list[int],
              lengths: list[int], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention in float64, [N, heads, D], and each element's sum_j p_j |v_j| (for the bound)."""
    group = q.shape[1] // keys[0].shape[1]
    out, mass, at = [], [], 0
    for k, v, start, n in zip(keys, values, starts, lengths):
        k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)  # [span, heads, D]
        qr = q[at : at + n].double()
        at += n
        scores = torch.einsum("nhd,khd->hnk", qr, k) * scale
        visible = torch.arange(k.shape[0])[None, :] <= (start + torch.arange(n))[:, None]
        p = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)  # [heads, n, span]
        out.append(torch.einsum("hnk,khd->nhd", p, v))
        mass.append(torch.einsum("hnk,khd->nhd", p, v.abs()))
    return torch.cat(out), torch.cat(mass)


def launch(pool: Pool, q: torch.Tensor, tables: torch.Tensor, starts: list[int], lengths: list[int],
           config: paged_prefill.LaunchConfig | None, tiles: torch.Tensor | None = None) -> torch.Tensor:
    out = paged_prefill.prefill_attention(q.to(DEVICE), pool.k.to(DEVICE), pool.v.to(DEVICE), tables.to(DEVICE),
                                          starts, lengths, scale=q.shape[-1] ** -0.5, config=config,
                                          tiles=None if tiles is None else tiles.to(DEVICE), **pool.kwargs())
    return out.cpu().view(q.shape)


def accuracy(gen: torch.Generator, heads: int, kv_heads: int, d: int, bs: int, pool_dtype: torch.dtype,
             scale: float | None, config: paged_prefill.LaunchConfig | None) -> dict:
    starts, lengths = [0, 7, 26, 0], [13, 9, 1, 19]  # a first chunk, two after cached prefixes, a longer first
    pool = Pool(gen, kv_heads, d, bs, pool_dtype, scale)
    width = max(-(-(s + n) // bs) for s, n in zip(starts, lengths)) + 2
    stored = [pool.sequence(s + n) for s, n in zip(starts, lengths)]
    tables = torch.stack([pool.place(k, v, width) for k, v in stored]).to(torch.int32)
    q = (torch.randn(sum(lengths), heads, d, generator=gen) * 2).to(COMPUTE)
    ref, mass = reference(q, [pool.read(k) for k, _ in stored], [pool.read(v) for _, v in stored], starts, lengths,
                          d**-0.5)
    out = launch(pool, q, tables, starts, lengths, config).double()
    err = (out - ref).abs()
    cfg = config or paged_prefill.launch_config(d, heads // kv_heads)
    return {"heads": heads, "kv_heads": kv_heads, "d": d, "block_size": bs, "pool": str(pool_dtype), "scale": scale,
            "config": cfg._asdict(), "finite": bool(out.isfinite().all()), "max_abs_err": err.max().item(),
            "rel_err": (err.norm() / ref.norm()).item(),
            "bound_ratio": (err / (UNIT_ROUNDOFF * (ref.abs() + mass) + 1e-30)).max().item()}


def invariance(gen: torch.Generator, pool_dtype: torch.dtype, scale: float | None,
               config: paged_prefill.LaunchConfig | None, heads: int = 4, kv_heads: int = 2, d: int = 32,
               bs: int = 4, length: int = 37, cut: int = 13) -> dict:
    pool = Pool(gen, kv_heads, d, bs, pool_dtype, scale, max(POOL_BLOCKS, 2 * -(-length // bs) + 16))
    width = -(-length // bs) + 3
    keys, values = pool.sequence(length)
    table, moved = pool.place(keys, values, width), pool.place(keys, values, width)  # the same keys, other blocks
    others = [pool.place(*pool.sequence(span), width) for span in (9, 10, 9)]
    q = (torch.randn(length, heads, d, generator=gen) * 2).to(COMPUTE)
    q_other = [(torch.randn(n, heads, d, generator=gen) * 2).to(COMPUTE) for n in (6, 10, 9)]
    whole = launch(pool, q, table[None], [0], [length], config)
    # a CUDA graph's map: made beforehand, its tiles in another order, unused all-zero entries after them
    cfg = config or paged_prefill.launch_config(d, heads // kv_heads)
    tiles = paged_prefill.tile_map([0], [length], cfg.block_m // (heads // kv_heads)).flip(0)
    graph_map = launch(pool, q, table[None], [], [], config, torch.cat([tiles, torch.zeros(3, 4, dtype=torch.int32)]))
    first = launch(pool, q[:cut], table[None], [0], [cut], config)
    second = launch(pool, q[cut:], table[None], [cut], [length - cut], config)
    chunked = torch.cat([first, second])
    # packed: a later chunk of 6 (at 3) before it, a first chunk of 10 after it; its keys at other blocks
    packed = launch(pool, torch.cat([q_other[0], q, q_other[1]]), torch.stack([others[0], moved, others[1]]),
                    [3, 0, 0], [6, length, 10], config)[6 : 6 + length]
    # its second chunk packed after another row's first chunk of 9
    second_packed = launch(pool, torch.cat([q_other[2], q[cut:]]), torch.stack([others[2], moved]), [0, cut],
                           [9, length - cut], config)[9:]

    def equal(x: torch.Tensor, part: slice = slice(None)) -> int:
        return sum(torch.equal(a, b) for a, b in zip(x, whole[part]))

    return {"pool": str(pool_dtype), "scale": scale, "config": cfg._asdict(), "queries": length, "cut": cut,
            "chunked_equal": equal(chunked), "packed_equal": equal(packed), "graph_map_equal": equal(graph_map),
            "second_chunk_packed_equal": equal(second_packed, slice(cut, None)), "second_chunk": length - cut,
            "finite": bool(whole.isfinite().all())}


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    t0 = time.time()
    pools = ((torch.bfloat16, None), (torch.float8_e4m3fn, 1.0), (torch.float8_e4m3fn, 0.37))
    acc = [accuracy(gen, 4, 2, 32, 4, dtype, scale, config) for dtype, scale in pools for config in (SMALL, None)]
    # a group of 3 (padding rows in every tile), key tiles inside one block; a group of 1 at D 64; the tiny model's 16
    acc.append(accuracy(gen, 6, 2, 16, 32, torch.bfloat16, None, SMALL))
    acc.append(accuracy(gen, 2, 2, 64, 8, torch.float8_e4m3fn, 0.37, SMALL))
    acc.append(accuracy(gen, 8, 2, 16, 4, torch.bfloat16, None, None))
    # the launch shapes of SmolLM2 (9 heads over 3: a group of 3, D 64) and the 7B (28 over 4: 7, D 128)
    acc.append(accuracy(gen, 3, 1, 64, 16, torch.bfloat16, None, None))
    acc.append(accuracy(gen, 7, 1, 128, 32, torch.float8_e4m3fn, 0.37, None))
    inv = [invariance(gen, dtype, scale, config) for dtype, scale, config in
           ((torch.bfloat16, None, SMALL), (torch.float8_e4m3fn, 0.37, SMALL), (torch.bfloat16, None, None))]
    # the 7B's shape over three 64-key tiles, cut inside the second (18 queries a tile, blocks of 32)
    inv.append(invariance(gen, torch.bfloat16, None, None, heads=7, kv_heads=1, d=128, bs=32, length=150, cut=77))
    if DEVICE != "cpu":  # a GPU's own dots: the module's shapes over many tiles, both pools
        for dtype, scale in ((torch.bfloat16, None), (torch.float8_e4m3fn, 0.37)):
            inv.append(invariance(gen, dtype, scale, None, heads=7, kv_heads=1, d=128, bs=32, length=1500, cut=601))
            inv.append(invariance(gen, dtype, scale, None, heads=3, kv_heads=1, d=64, bs=16, length=700, cut=333))
    print(json.dumps({"device": DEVICE, "accuracy": acc, "invariance": inv, "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
