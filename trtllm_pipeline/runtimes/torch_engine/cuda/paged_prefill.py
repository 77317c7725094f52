"""Prefill attention over the paged KV cache: the packed rows of a step (prompt chunks of any lengths, a cached prefix
before some) in one launch, every key (cached or this step's, which ``prefill.write_kv`` has written into the pool
first) read through its row's block table.

Invariance is the point of it: a query's output is the same bits whichever chunk computes it (a whole prompt in one
row, or a later chunk after a cached prefix at any start), whatever rows share the launch and wherever the query sits
in its tile, so that chunked prefill, prefix caching and batching never change a token. Hence:

- a query's keys go in tiles of BLOCK_N aligned at the row's position 0 (tile t holds keys t * BLOCK_N ..), visited
  from tile 0 up: its online softmax meets the same keys in the same groups in the same order wherever it runs;
- the launch shape (``LaunchConfig``) depends on the head size and the GQA group alone, never on the step's rows;
- a key a query may not see enters as a -inf score: exp2 makes its weight exactly 0 and it never moves the running
  maximum (key 0 is visible to every query and tile 0 comes first, so the maximum is finite from the first tile on),
  so a tile partly or wholly past a query (its tile's later queries need it) changes nothing of that query's sums
  (a rescale by exp2(0) = 1, zero products): tiles whole below the tile's first query go unmasked, the rest masked,
  and the same arithmetic is done either way;
- floating-point contraction is off (``enable_fp_fusion=False``): the masked and unmasked tiles' score arithmetic
  is spelled alike but a ``where`` sits between the scaling and the max only in one, and an FMA formed across it in
  one and not the other would round a query's scores differently by the tile's kind, that is by its chunking.

One program per (query tile, KV head): BLOCK_M // G queries of one row with all G query heads of that KV head stacked
as the dots' M (row i is query i // G, head i % G: a token's heads are adjacent in ``q``), so each key and value tile
is read once for the group and no KV head is repeated; G need not be a power of two (the 7B's 7: 18 queries x 7
heads in 128 rows, 2 of them padding). The host builds a small int32 tile map, one entry per tile (row, packed index
of its first query, that query's position, its queries): everything else comes from device tensors, so a CUDA graph
can replay the launch with the map and the tables as static inputs (unused entries of a graph's map: all zero, which
read nothing and store nothing).

An E4M3 pool (``kv_scale``: the layer's float32 dequantization scale) is read as ``model.dequantize_fp8`` makes it:
E4M3 times the scale in float32, rounded once to the compute dtype (``attention._from_e4m3``, the decode kernel's).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import triton
import triton.language as tl

from trtllm_pipeline.runtimes.torch_engine.cuda.attention import LOG2E, _cached
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import tl_dtype

TILE_FIELDS = 4  # a tile map entry: row, packed index of the tile's first query, its position, queries in the tile


class LaunchConfig(NamedTuple):
    block_m: int  # the dots' M: queries x G heads (BLOCK_M // G queries a tile)
    block_n: int  # keys a tile: fixed, so that a query's key tiles (and its sums) never depend on the launch
    warps: int
    stages: int


# By head size (the tiny model's 16, SmolLM2's 64, the 7B's 128). Not chosen per step: BLOCK_N is part of every
# output's rounding, and the other fields may be too (through the layouts of the dots and of the row sums).
# Timed on an H100 (CUDA graphs, BF16 pool, random keys, 2026-12) against 5 other shapes each. The 7B's (28 / 4
# heads): 128 x 64 in 8 warps the fastest at a 2048 prompt (98 us; SDPA's flash kernel over contiguous K/V: 75), a
# 512 chunk after 1536 (50 us; today's gathered blocks + masked SDPA: 109) and 4 x 256 after 768 (50; 155), behind
# 128 x 32 in 4 warps at 8 x 512 (86 against 76 us) and 64 x 128 (116 against 95), which lost 38% on the later
# chunk. SmolLM2-360M's (15 / 5): 64 x 64 in 4 warps the fastest at 4 of those 5 and within 1% at 8 x 512 (2048:
# 37.5 us against 45 for 128 x 64, whose 248 registers a thread left no room).
CONFIGS = {16: LaunchConfig(64, 64, 4, 3), 32: LaunchConfig(64, 64, 4, 3), 64: LaunchConfig(64, 64, 4, 3),
           128: LaunchConfig(128, 64, 8, 2)}


def launch_config(head_dim: int, group: int) -> LaunchConfig:
    """The launch shape for heads of ``head_dim`` and ``group`` query heads a KV head (at least one query a tile)."""
    if head_dim not in CONFIGS:
        raise ValueError(f"paged prefill attention takes head_dim in {sorted(CONFIGS)}, not {head_dim}")
    base = CONFIGS[head_dim]
    return base._replace(block_m=max(base.block_m, triton.next_power_of_2(group)))


@triton.jit
def _key_tile(n0, end, pos, m_i, l_i, acc, q, qk_scale, table, stride_tw, k_head, v_head, stride_cb, stride_ct, d,
              kv_scale, BLOCK_N: tl.constexpr, BS: tl.constexpr, MASKED: tl.constexpr, KV_FP8: tl.constexpr,
              KV_UNIT: tl.constexpr, COMPUTE: tl.constexpr):
    """Keys ``n0 ..`` into the running maximum ``m_i``, sum ``l_i`` and output ``acc`` of the tile's rows (at positions
    ``pos``); MASKED: keys past a row's position scored -inf and keys at or past ``end`` (the tile's last query + 1)
    neither looked up nor read, else every key of the tile is visible to every row."""
    keys = n0 + tl.arange(0, BLOCK_N)
    live = keys < end
    if MASKED:  # (a table entry past the row's span may be anything)
        blocks = tl.load(table + (keys // BS) * stride_tw, mask=live, other=0)
    else:
        blocks = tl.load(table + (keys // BS) * stride_tw)
    offs = (blocks.to(tl.int64) * stride_cb + (keys % BS) * stride_ct)[:, None] + d[None, :]
    k = _cached(k_head + offs, live, kv_scale, MASKED, KV_FP8, KV_UNIT, COMPUTE)  # (live: never reads the others)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        s = tl.where(keys[None, :] <= pos[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: key 0 is every row's, and tile 0 comes first
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _cached(v_head + offs, live, kv_scale, MASKED, KV_FP8, KV_UNIT, COMPUTE)
    acc = tl.dot(p.to(COMPUTE), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _prefill_kernel(q_ptr, stride_qt, stride_qh, k_ptr, v_ptr, stride_cb, stride_ch, stride_ct, kv_scale_ptr,
                    tables_ptr, stride_tr, stride_tw, tiles_ptr, out_ptr, stride_ot, qk_scale,
                    KVH: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BS: tl.constexpr, COMPUTE: tl.constexpr, KV_FP8: tl.constexpr,
                    KV_UNIT: tl.constexpr):
    # (KV heads fastest: the map's heaviest tiles, first, start on every head before the lighter ones)
    pid = tl.program_id(0)
    kvh = pid % KVH
    entry = tiles_ptr + (pid // KVH) * 4  # (TILE_FIELDS)
    row = tl.load(entry)
    token = tl.load(entry + 1)
    first = tl.load(entry + 2)
    count = tl.load(entry + 3)

    i = tl.arange(0, BLOCK_M)
    query = i // G
    head = kvh * G + i % G
    valid = query < count  # (count <= BLOCK_M // G: the rows past the last whole group are padding too)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (token + query)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=valid[:, None], other=0.0)
    # A padding row's position lies past the tile's end: it sees the live keys, so its sums stay finite (unstored).
    pos = first + query
    kv_scale = 1.0
    if KV_FP8:
        if not KV_UNIT:
            kv_scale = tl.load(kv_scale_ptr)
    table = tables_ptr + row * stride_tr
    k_head = k_ptr + kvh * stride_ch
    v_head = v_ptr + kvh * stride_ch

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    end = first + count
    whole = (first + 1) // BLOCK_N * BLOCK_N  # tiles every query of this tile sees whole: no masks
    for n0 in range(0, whole, BLOCK_N):
        m_i, l_i, acc = _key_tile(n0, end, pos, m_i, l_i, acc, q, qk_scale, table, stride_tw, k_head, v_head,
                                  stride_cb, stride_ct, d, kv_scale, BLOCK_N, BS, False, KV_FP8, KV_UNIT, COMPUTE)
    for n0 in range(whole, end, BLOCK_N):
        m_i, l_i, acc = _key_tile(n0, end, pos, m_i, l_i, acc, q, qk_scale, table, stride_tw, k_head, v_head,
                                  stride_cb, stride_ct, d, kv_scale, BLOCK_N, BS, True, KV_FP8, KV_UNIT, COMPUTE)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # (l_i 0: an unused entry's rows, never stored)
    tl.store(out_ptr + (token + query)[:, None] * stride_ot + head[:, None] * D + d[None, :], out.to(COMPUTE),
             mask=valid[:, None])


def tile_map(starts: Sequence[int], lengths: Sequence[int], queries: int,
             device: torch.device | str = "cpu", rows: Sequence[int] | None = None) -> torch.Tensor:
    """[T, 4] int32: per tile of up to ``queries`` consecutive queries of a row, (row, packed index of its first
    query, that query's position, its queries); the tiles with the most keys first (the longest programs: run last,
    they would be the launch's tail). ``rows``: only those rows' tiles (the others' outputs left to another kernel)."""
    entries, token, chosen = [], 0, None if rows is None else set(rows)
    for r, (start, n) in enumerate(zip(starts, lengths)):
        if chosen is None or r in chosen:
            entries += [(r, token + j, start + j, min(queries, n - j)) for j in range(0, n, queries)]
        token += n
    entries.sort(key=lambda e: -(e[2] + e[3]))
    return torch.tensor(entries, dtype=torch.int32).reshape(-1, TILE_FIELDS).to(device)


_TRIED: dict[tuple, str | None] = {}  # (shape, dtypes, device) -> None where the kernel launched, else why not


def trial(heads: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype, kv_dtype: torch.dtype,
          device: torch.device, kv_unit: bool = False) -> str | None:
    """None where the kernel compiles and launches for this engine's shape on ``device`` (one query, once per
    process; ``kv_unit`` and int64 tables as the engine launches it: the variant compiled is the one its steps use),
    else why not: a GPU with less shared memory than Hopper's (the 7B's launch holds ~100 KB) refuses the launch, and
    then the step's attention keeps SDPA instead of failing every later chunk."""
    key = (heads, kv_heads, head_dim, block_size, dtype, kv_dtype, str(device), kv_unit)
    if key not in _TRIED:
        try:
            q = torch.zeros(1, heads, head_dim, dtype=dtype, device=device)
            pool = torch.zeros(2, kv_heads, block_size, head_dim, dtype=dtype, device=device).to(kv_dtype)
            scale = torch.ones(1, dtype=torch.float32, device=device) if kv_dtype == torch.float8_e4m3fn else None
            prefill_attention(q, pool, pool, torch.ones(1, 1, dtype=torch.long, device=device), [0], [1], scale=1.0,
                              kv_scale=scale, kv_unit=kv_unit and scale is not None)
            _TRIED[key] = None
        except Exception as exc:  # noqa: BLE001 - any refusal (resources, compilation) means: not on this device
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            _TRIED[key] = f"{type(exc).__name__}: {first}"
    return _TRIED[key]


def _ints(x: Sequence[int] | torch.Tensor) -> list[int]:
    return x.tolist() if isinstance(x, torch.Tensor) else [int(v) for v in x]


def _check(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, kv_scale: torch.Tensor | None) -> None:
    """Refuses what the kernel does not take (ValueError), before anything is launched."""
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"paged prefill attention computes in bfloat16 or float16, not {q.dtype}")
    if cache_k.dim() != 4 or cache_k.shape != cache_v.shape or cache_k.stride() != cache_v.stride():
        raise ValueError("the pools must be one layer's [num_blocks, kv_heads, block_size, D], K and V alike")
    if cache_k.dtype != cache_v.dtype or cache_k.dtype not in (q.dtype, torch.float8_e4m3fn):
        raise ValueError(f"a pool of {q.dtype} or float8_e4m3fn, not {cache_k.dtype} / {cache_v.dtype}")
    if (cache_k.dtype == torch.float8_e4m3fn) != (kv_scale is not None):
        raise ValueError("an E4M3 pool comes with its kv_scale (and only an E4M3 pool)")
    heads, kvh, d = q.shape[1], cache_k.shape[1], q.shape[2]
    if heads % kvh or cache_k.shape[3] != d:
        raise ValueError(f"{heads} query heads of {d} over {kvh} KV heads of {cache_k.shape[3]}")
    bs = cache_k.shape[2]
    if bs & (bs - 1):
        raise ValueError(f"block_size must be a power of two, not {bs}")
    if q.stride(2) != 1 or cache_k.stride(3) != 1:
        raise ValueError("q and the pools must be contiguous along D")


def prefill_attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, tables: torch.Tensor,
                      starts: Sequence[int] | torch.Tensor, lengths: Sequence[int] | torch.Tensor, *, scale: float,
                      kv_scale: torch.Tensor | None = None, kv_unit: bool = False, out: torch.Tensor | None = None,
                      tiles: torch.Tensor | None = None, config: LaunchConfig | None = None) -> torch.Tensor:
    """Causal attention of packed rows over the paged pool; returns ``out`` [N, heads * D] in q's dtype.

    ``q``: [N, heads, D] rotated queries (bfloat16 or float16), row r's at ``offsets[r] : offsets[r + 1]`` (offsets:
    the cumulative ``lengths``); query j of row r sits at position ``starts[r] + j`` and sees the row's keys 0 ..
    that position, all of them already in ``cache_k`` / ``cache_v`` (one layer's [num_blocks, kv_heads, block_size,
    D], q's dtype or float8_e4m3fn; block_size a power of two) through ``tables[r]`` ([rows, W] int32 or int64 block
    ids; entries past the row's span never read). ``scale``: the softmax scale (1 / sqrt(D)). ``kv_scale``: an E4M3
    pool's float32 dequantization scale (one element); ``kv_unit``: it is 1 (converted without it, the same values).
    ``starts`` / ``lengths``: python ints or tensors (read on the host, for the tile map). ``tiles``: a tile map
    (``tile_map`` with ``config.block_m // G`` queries a tile) made beforehand, e.g. a CUDA graph's static input; then
    ``starts`` and ``lengths`` are not read. ``config``: the launch shape (``launch_config``'s by default; a check or
    benchmark may pass another, which changes the outputs' rounding: keep one per engine).
    """
    _check(q, cache_k, cache_v, kv_scale)
    n, heads, d = q.shape
    kvh = cache_k.shape[1]
    group = heads // kvh
    cfg = config or launch_config(d, group)
    if out is None:
        out = torch.empty(n, heads * d, dtype=q.dtype, device=q.device)
    if out.shape != (n, heads * d) or out.dtype != q.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{n}, {heads * d}] {q.dtype}, rows contiguous")
    if tiles is None:
        starts, lengths = _ints(starts), _ints(lengths)
        if sum(lengths) != n or len(starts) != len(lengths) or len(lengths) > tables.shape[0]:
            raise ValueError(f"rows of {lengths} tokens (at {starts}) for {n} queries and {tables.shape[0]} tables")
        tiles = tile_map(starts, lengths, cfg.block_m // group, q.device)
    if tiles.dtype != torch.int32 or tiles.dim() != 2 or tiles.shape[1] != TILE_FIELDS or not tiles.is_contiguous():
        raise ValueError(f"a tile map is [T, {TILE_FIELDS}] int32, contiguous (tile_map's)")
    if n == 0 or tiles.shape[0] == 0:
        return out
    fp8 = cache_k.dtype == torch.float8_e4m3fn
    _prefill_kernel[(tiles.shape[0] * kvh,)](
        q, q.stride(0), q.stride(1), cache_k, cache_v, cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        kv_scale if fp8 else q, tables, tables.stride(0), tables.stride(1), tiles, out, out.stride(0),
        scale * LOG2E, KVH=kvh, G=group, D=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BS=cache_k.shape[2],
        COMPUTE=tl_dtype(q.dtype), KV_FP8=fp8, KV_UNIT=fp8 and kv_unit, num_warps=cfg.warps, num_stages=cfg.stages,
        enable_fp_fusion=False)
    return out
