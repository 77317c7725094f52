"""Decode attention over the paged KV cache: one new token per request, flash-decoding style.

One program per (request, KV head, split of the key range): it finishes the QKV projection for its
heads (sums the split-K partials, adds the bias, rounds to the compute dtype as the eager model's
GEMM output is rounded), applies the rotary embedding, writes the new key and value into the cache
(split 0 only) and attends over its share of the *live* length ``position + 1`` read from device
memory, so a CUDA graph captured once serves every length. Keys and values are read through the request's
block table ([num_blocks, kv_heads, BS, D] per layer: a block's keys of one head are one contiguous run; each
tile's rows look their block up in the table, which stays on the device between steps, row b's table named by
a static input of the graph like the positions; a tile may span blocks of any size). All of a KV head's query heads (GQA)
ride in one tile, so each cached key and value is read once. A second small kernel combines the
splits by their log-sum-exp and quantizes the result for ``attention.dense`` (or prepares it as the
INT4 GEMV's input); a launch of one split (a loaded step) stores its output itself. (Combining inside the
attention launch, by the last split program to finish, measured slower on an H200: that program's
serial pass over the splits lengthens the launch's tail by more than a launch costs under PDL.)

The new token's key and value are taken from registers rather than from the cache, so no program
depends on another program's write within the launch: the split whose range holds it scores it apart from
the cached tiles (after them, as if in its last tile), which go from memory (fetched into L2 before the PDL
wait) straight into the dots.

An FP8 cache (``kv_scale``: the layer's float32 dequantization scale) stores ``x / scale`` saturated to E4M3,
and every key and value the dots take, the new token's included, is its E4M3 value times the scale rounded to the
compute dtype: the eager model's ``kv_store`` / ``kv_load``, so the two agree whatever path wrote the cache. With
scales of 1 (ModelOpt's, unless a layer's keys pass 448) the dots can take float16 operands (``FP8_DOTS_F16``): E4M3
converts to float16 in one instruction per pair, exactly as to bfloat16 (which takes two more conversions through
float32); a bfloat16 query is exact in float16 from 2^-14 to 65504 in magnitude (below, its bits past 2^-24 go, far
under the scores' rounding); only the probabilities round finer than eager's bfloat16 ones (2^-11 against 2^-8).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import fixed_sum
from trtllm_pipeline.runtimes.torch_engine.cuda.gemv_input import Prepared, consumer_input, store_planes
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import tl_dtype

LOG2E = 1.4426950408889634
# A tree verify row's token (``decode_attention``'s ``tree``) attends as a 1-token step at its virtual position
# (context length + depth) would: its ancestors' keys, which sit at their row indices' slots, are read at the virtual
# positions of their depths through one byte a position for the positions this far back (TREE_WORDS int64 a row),
# so a tree row holds at most this many tokens and one more (its first, at its context's end, is every node's
# ancestor and sits in place; ``graphs.TREE_TOKENS``)
TREE_WINDOW = tl.constexpr(64)
TREE_WORDS = TREE_WINDOW.value // 8
COMBINE_WARPS = 1  # one program per (request, head): D values, a few splits each
# Under PDL, each program fetches its share of the cached keys and values into L2 before waiting for the QKV
# linear: no kernel of the step writes them (H200, 7B INT4 step: 1.789 -> 1.779 ms, run 87)
PREFETCH_KV = True
# the attention launch's shape (the benchmark's "attn:" variants time others)
ATTENTION_WARPS = 4
ATTENTION_STAGES = 2
BLOCK_T = 64
# From this many rows a step (a loaded engine) the launch takes key tiles of 32 and 3 stages: at 64-256 rows of
# 512-2048 tokens that shape was the fastest of 45 or within 0.3% of it, 4-21% faster than the one above (H200,
# ``benchmarks/attention_sweep.py``, 2026-12-04: 256 x 2048 282 -> 272 us, 128 x 2048 176 -> 139 us a layer). Fewer
# rows keep the shape the batch-1 step was tuned with.
LOADED_ROWS = 64
LOADED_BLOCK_T, LOADED_STAGES = 32, 3
# The L2 prefetch before the PDL wait only for steps of fewer rows: a loaded step's keys and values outgrow L2 many
# times over (512 rows of ~1,300 FP8 tokens: ~0.7 GB a layer against 50 MB), so the lines the first programs fetch
# are evicted by the others' before their tiles read them, and each is read from DRAM twice. Timed as chained PDL
# launches (H100, ``attention_sweep.py --step``, 2026-12-07): with the prefetch 1.17-1.38x slower over FP8 keys at
# 64-512 rows x 1-2k tokens (512 x 2048: 663 against 483 us a layer), 1.55-1.66x over BF16 (1,163 against 700).
PREFETCH_MAX_ROWS = LOADED_ROWS
# One key-range split (``pick_splits`` from 2 x SMs / KV heads rows: 66 on an H100 or H200): each program stores its
# query heads' output itself, as the combine would (its weight exp2(0) = 1 leaves the output's rounding as it is), and
# the step launches no combine (512 rows of 1000/1000 on an H100: 1.34 ms of a ~21 ms step; the sweep above at 512 x
# 2048 FP8: 483 us a layer against 511 with the combine).
DIRECT_SINGLE_SPLIT = True
# An FP8 pool from LOADED_ROWS rows: tiles of 128 keys (the bytes of BF16's 64) in 2 stages. Of 216 shapes timed at
# 64-256 rows x 512-2048 tokens it was the fastest at 7 of 9 and within 10% at the others; the BF16 pool's loaded
# shape (32 keys, 3 stages) was 1.3-1.7x slower over FP8 keys (H100, ``attention_sweep.py --kv fp8``, 2026-12-05,
# a layer: 256 x 2048 362 -> 259 us, 128 x 2048 227 -> 131 us, 64 x 2048 120 -> 72 us).
LOADED_FP8_BLOCK_T, LOADED_FP8_STAGES = 128, 2
# An FP8 cache at unit scale: float16 dots (the module docstring). Read from sm_90 SASS (tools/attention_sass.py, the
# 32-key shape's K loop): 605 instructions a thread with bfloat16 dots, 510 with float16, 370 with float16 and the
# tiles loaded without the cp.async pipeline (BF16 keys: 368). Timed in the loaded shape above: 3-19% faster than
# bfloat16 dots at every shape of the same sweep, so None (the module's choice) takes them from LOADED_ROWS rows.
# Fewer rows keep bfloat16 dots (not timed there; on the tiny random model's three-token prompts as rows of a fast
# step float16 dots part from eager on one first token whose two best logits are 0.106 apart in float32). True or
# False forces either (the sweep, the kernel check).
FP8_DOTS_F16: bool | None = None


@triton.jit
def _prefetch_l2(ptrs):
    """An L2 prefetch of the lines at ``ptrs`` (no registers filled, nothing waited for)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _to_e4m3(x, inv):
    """``x * inv`` in float32, saturated to +-448, rounded to E4M3 (to nearest, even): the eager ``quantize_fp8``."""
    return tl.clamp(x.to(tl.float32) * inv, -448.0, 448.0).to(tl.float8e4nv, fp_downcast_rounding="rtne")


@triton.jit
def _from_e4m3(x, scale, UNIT: tl.constexpr, COMPUTE: tl.constexpr):
    """E4M3 keys or values as the dots take them: times ``scale`` in float32, rounded to the compute dtype (UNIT, a
    scale of 1: converted straight, which is exact; ModelOpt's scales are 1 unless a layer's keys pass 448)."""
    if UNIT:
        return x.to(COMPUTE)
    return (x.to(tl.float32) * scale).to(COMPUTE)


@triton.jit
def _tree_slots(t, rot, shifts_ptr, stride_shift):
    """The slots holding a tree row token's keys of virtual positions ``t`` (it at ``rot``): the ancestor ``j``
    positions back (0 < j < TREE_WINDOW) sits ``shift`` slots later, byte ``j % 8`` of word ``j // 8`` at
    ``shifts_ptr``; every other position (the context, the row's first token) in place."""
    back = rot - t
    near = (back > 0) & (back < TREE_WINDOW)
    j = tl.minimum(tl.maximum(back, 0), TREE_WINDOW - 1)
    word = tl.load(shifts_ptr + (j // 8) * stride_shift, mask=near, other=0)
    return t + ((word >> ((j % 8) * 8)) & 0xFF)


@triton.jit
def _cached(ptrs, cached, kv_scale, MASKED: tl.constexpr, KV_FP8: tl.constexpr, KV_UNIT: tl.constexpr,
            DOT: tl.constexpr):
    """A tile of cached keys or values [BLOCK_T, D] as the dots take them (MASKED: the keys not ``cached`` as 0)."""
    if MASKED:
        x = tl.load(ptrs, mask=cached[:, None], other=0.0)
    else:
        x = tl.load(ptrs)
    if KV_FP8:
        x = _from_e4m3(x, kv_scale, KV_UNIT, DOT)
    return x


@triton.jit
def _key_tile(t, end, rot, m_i, l_i, acc, q_dot, qk_scale, table, stride_btj, stride_cb, head, stride_ct, d,
              k_cache_ptr, v_cache_ptr, kv_scale, shifts_ptr, stride_shift, BS: tl.constexpr, KV_FP8: tl.constexpr,
              KV_UNIT: tl.constexpr, DOT: tl.constexpr, TREE: tl.constexpr, MASKED: tl.constexpr):
    """One tile of cached keys ``t`` (virtual positions) into the running maximum ``m_i``, sum ``l_i`` and output
    ``acc``; MASKED: keys at or past ``end`` and the new token's (``rot``, scored apart) left out, else every key
    of the tile is a cached one before both."""
    slot = t
    if TREE:
        slot = _tree_slots(t, rot, shifts_ptr, stride_shift)
    cached = (t < end) & (t != rot)  # (read only where MASKED)
    if MASKED:
        blocks = tl.load(table + (slot // BS) * stride_btj, mask=t < end, other=0)
    else:
        blocks = tl.load(table + (slot // BS) * stride_btj)
    offs = (blocks * stride_cb + head + (slot % BS) * stride_ct)[:, None] + d[None, :]
    kt = _cached(k_cache_ptr + offs, cached, kv_scale, MASKED, KV_FP8, KV_UNIT, DOT)
    s = tl.dot(q_dot, tl.trans(kt)) * qk_scale
    if MASKED:
        s = tl.where(cached[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a tile holding only the new token: all -inf
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    vt = _cached(v_cache_ptr + offs, cached, kv_scale, MASKED, KV_FP8, KV_UNIT, DOT)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT), vt)
    return m_new, l_i, acc


@triton.jit
def _rope_input(qkv_ptr, stride_qs, bias_ptr, cols, rot_cols, mask, rstd, QKV_SPLITS: tl.constexpr,
                FIXED: tl.constexpr, HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr):
    """The projection output at ``cols`` and at the rotate-half partner columns (its split partials summed, or
    FIXED: its int64 accumulators' values; times ``rstd``, the input norm's 1 / rms where the QKV GEMV left it
    to this kernel), rounded as eager."""
    x = fixed_sum.summed(qkv_ptr, stride_qs, cols, mask, QKV_SPLITS, FIXED) * rstd
    xr = fixed_sum.summed(qkv_ptr, stride_qs, rot_cols, mask, QKV_SPLITS, FIXED) * rstd
    if HAS_BIAS:
        x += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        xr += tl.load(bias_ptr + rot_cols, mask=mask, other=0.0).to(tl.float32)
    return x.to(COMPUTE).to(tl.float32), xr.to(COMPUTE).to(tl.float32)


@triton.jit
def _decode_attention_kernel(
    qkv_ptr, stride_qs, stride_qb, bias_ptr,
    cos_ptr, sin_ptr, stride_rot,
    k_cache_ptr, v_cache_ptr, stride_cb, stride_ch, stride_ct, kv_scale_ptr, kv_inv_ptr,
    pos_ptr, slot_ptr, bt_ptr, stride_btb, stride_btj, rot_ptr, shift_ptr, stride_shift,
    o_ptr, lse_ptr, stride_ob, stride_oh, stride_lb, out_ptr, out_inv_ptr, stride_outb,
    qk_scale, sq_ptr, hidden, eps,
    H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr, NORM_PARTS: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    QKV_SPLITS: tl.constexpr, FIXED: tl.constexpr, HAS_BIAS: tl.constexpr, SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BS: tl.constexpr, COMPUTE: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr, KV_FP8: tl.constexpr, KV_UNIT: tl.constexpr, LINE: tl.constexpr,
    LINES: tl.constexpr, DOT: tl.constexpr, TREE: tl.constexpr, WRITE_ONLY: tl.constexpr, DIRECT: tl.constexpr,
    QUANT_OUT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    # positions and table rows are the step's inputs, copied in before its first kernel (the tables themselves
    # stay on the device between steps, their rows rewritten only where a request's table has grown)
    pos = tl.load(pos_ptr + b)
    table = bt_ptr + tl.load(slot_ptr + b) * stride_btb
    head = kvh * stride_ch
    # The keys go by virtual position: a decode's and a chain's are their slots; a tree verify row's token is
    # rotated at, and attends as a 1-token step at, its context length + depth (``rot``), its ancestors' keys read
    # from their slots (``_tree_slots``), so that its keys fall into the very tiles and splits, in the very order, of
    # that step's and it computes that step's logits bit for bit (by slot, a row crossing a tile edge moved them:
    # 0.09 of a logit on the tiny model, and greedy outputs of an FP8 SmolLM2 parted from plain decoding's).
    rot = pos
    if TREE:
        rot = tl.load(rot_ptr + b)
    length = rot + 1
    # This split's share of the live keys, in whole BLOCK_T tiles.
    chunk = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_T) * BLOCK_T
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    if PREFETCH:
        for t0 in range(start, end, BLOCK_T):  # (a tree row's ancestors: their virtual positions' lines, L2 only)
            t = tl.minimum(t0 + tl.arange(0, BLOCK_T), length - 1)  # 128-byte lines of live rows only
            rows = tl.load(table + (t // BS) * stride_btj) * stride_cb + head + (t % BS) * stride_ct
            lines = rows[:, None] + tl.arange(0, LINES)[None, :] * LINE
            _prefetch_l2(k_cache_ptr + lines)
            _prefetch_l2(v_cache_ptr + lines)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()

    d = tl.arange(0, D)
    half = D // 2
    d_rot = (d + half) % D
    sign = tl.where(d < half, -1.0, 1.0)
    cos = tl.load(cos_ptr + rot * stride_rot + d)
    sin = tl.load(sin_ptr + rot * stride_rot + d)
    row = qkv_ptr + b * stride_qb
    rstd = 1.0
    if NORM_PARTS > 0:  # the QKV GEMV folded the input norm in: the sum of its splits' sums of squares
        parts = tl.arange(0, NORM_BLOCK)
        sq = tl.load(sq_ptr + parts, mask=parts < NORM_PARTS, other=0.0, cache_modifier=".cg")
        rstd = tl.math.rsqrt(tl.sum(sq, 0) / hidden + eps)

    # Query heads of this KV head, rotated: [BLOCK_H, D] (rows past GROUP are padding).
    hh = tl.arange(0, BLOCK_H)
    h_ok = hh < GROUP
    q_head = kvh * GROUP + hh
    q_cols = q_head[:, None] * D + d[None, :]
    q_rot_cols = q_head[:, None] * D + d_rot[None, :]
    q, qr = _rope_input(row, stride_qs, bias_ptr, q_cols, q_rot_cols, h_ok[:, None], rstd, QKV_SPLITS, FIXED,
                        HAS_BIAS, COMPUTE)
    q = (q * cos[None, :] + sign[None, :] * qr * sin[None, :]).to(COMPUTE)

    # The new key (rotated) and value: [D].
    all_d = d < D
    k, kr = _rope_input(row, stride_qs, bias_ptr, (H + kvh) * D + d, (H + kvh) * D + d_rot, all_d, rstd,
                        QKV_SPLITS, FIXED, HAS_BIAS, COMPUTE)
    k = (k * cos + sign * kr * sin).to(COMPUTE)
    v, _ = _rope_input(row, stride_qs, bias_ptr, (H + KVH + kvh) * D + d, (H + KVH + kvh) * D + d, all_d, rstd,
                       QKV_SPLITS, FIXED, HAS_BIAS, COMPUTE)
    v = v.to(COMPUTE)
    k_stored, v_stored = k, v
    kv_scale = 1.0
    if KV_FP8:  # stored as E4M3; attended as read back, as every cached key is
        kv_inv = 1.0
        if not KV_UNIT:
            kv_scale = tl.load(kv_scale_ptr)
            kv_inv = tl.load(kv_inv_ptr)
        k_stored = _to_e4m3(k, kv_inv)
        v_stored = _to_e4m3(v, kv_inv)
        k = _from_e4m3(k_stored, kv_scale, KV_UNIT, COMPUTE)
        v = _from_e4m3(v_stored, kv_scale, KV_UNIT, COMPUTE)
    if split == 0:  # (at its slot, whatever its virtual position)
        new_row = tl.load(table + (pos // BS) * stride_btj) * stride_cb + head + (pos % BS) * stride_ct
        tl.store(k_cache_ptr + new_row + d, k_stored)
        tl.store(v_cache_ptr + new_row + d, v_stored)
    if WRITE_ONLY:  # a verify step's first pass: the keys and values in place for the second (``decode_attention``)
        return

    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, D), dtype=tl.float32)
    # The new token, from registers, by the split whose range holds it: the cached tiles go from memory
    # straight into the dots. (Patching the new key and value into the loaded tiles took them through registers
    # and back to shared memory: H200, 7B INT4 step 1.807 -> 1.789 ms, run 87.)
    here = (rot >= start) & (rot < end)
    s_new = tl.where(here, tl.sum(q.to(tl.float32) * k.to(tl.float32)[None, :], 1) * qk_scale, float("-inf"))
    q_dot = q.to(DOT)  # exact: a bfloat16 query in float16 (DOT differs from COMPUTE only there)
    t_in = tl.arange(0, BLOCK_T)
    # Over an FP8 pool, whole tiles first, below the new token and the split's end: no key of them masked, so their
    # loads and scores go without the per-key masks (every tile of a long range but its last); then the rest, masked.
    # The tiles' order and each one's arithmetic are the same either way. sm_90 SASS of the key loop
    # (tools/attention_sass.py): FP8 at 128 keys 1,229 -> 869 instructions a thread, BF16 at 32 keys 368 -> 309.
    # Timed at load (H100, ``attention_sweep.py --step``, 2026-12-07d): FP8 1.04-1.07x faster at 64-512 rows x 1-2k
    # tokens (512 x 2048: 483 -> 457 us a layer), BF16 1.04x slower (700 -> 727: its 3-stage pipeline filled twice),
    # so a BF16 pool keeps one masked loop.
    whole = start
    if KV_FP8:
        whole = start + tl.maximum(tl.minimum(end, rot) - start, 0) // BLOCK_T * BLOCK_T
        for t0 in range(start, whole, BLOCK_T):
            m_i, l_i, acc = _key_tile(t0 + t_in, end, rot, m_i, l_i, acc, q_dot, qk_scale, table, stride_btj,
                                      stride_cb, head, stride_ct, d, k_cache_ptr, v_cache_ptr, kv_scale, shift_ptr + b,
                                      stride_shift, BS, KV_FP8, KV_UNIT, DOT, TREE, False)
    for t0 in range(whole, end, BLOCK_T):
        m_i, l_i, acc = _key_tile(t0 + t_in, end, rot, m_i, l_i, acc, q_dot, qk_scale, table, stride_btj, stride_cb,
                                  head, stride_ct, d, k_cache_ptr, v_cache_ptr, kv_scale, shift_ptr + b, stride_shift,
                                  BS, KV_FP8, KV_UNIT, DOT, TREE, True)
    # last, as if in the split's last tile: its p against the final maximum, rounded as the tiles' are
    m_new = tl.maximum(m_i, s_new)
    alpha = tl.where(here, tl.exp2(m_i - m_new), 1.0)
    p_new = tl.where(here, tl.exp2(s_new - m_new), 0.0)
    l_i = l_i * alpha + p_new
    acc = acc * alpha[:, None] + p_new.to(DOT).to(tl.float32)[:, None] * v.to(tl.float32)[None, :]
    m_i = tl.where(here, m_new, m_i)

    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    if DIRECT:  # one split: the combine's output (its weight is exp2(0) = 1, so the same rounding), stored here
        _store_out(out.to(COMPUTE), out_ptr + b * stride_outb + q_head[:, None] * D + d[None, :], out_inv_ptr,
                   h_ok[:, None], QUANT_OUT)
        return
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    o_rows = o_ptr + b * stride_ob + q_head[:, None] * stride_oh + split * D + d[None, :]
    tl.store(o_rows, out, mask=h_ok[:, None])
    tl.store(lse_ptr + b * stride_lb + q_head * SPLITS + split, lse, mask=h_ok)


@triton.jit
def _store_out(y, dst, out_inv_ptr, mask, QUANT_OUT: tl.constexpr):
    """Attention's output ``y`` (compute dtype) for attention.dense: as it is, or its E4M3 input (QUANT_OUT)."""
    if QUANT_OUT:
        q = tl.clamp(y.to(tl.float32) * tl.load(out_inv_ptr), -448.0, 448.0)
        tl.store(dst, q.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=mask)
    else:
        tl.store(dst, y, mask=mask)


@triton.jit
def _combine_kernel(
    o_ptr, lse_ptr, out_ptr, out_inv_ptr, pqs_ptr, prep_ptr,
    stride_ob, stride_oh, stride_lb, stride_outb, stride_prep, K_OUT,
    D: tl.constexpr, SPLITS: tl.constexpr, QUANT_OUT: tl.constexpr, PREPARE: tl.constexpr, HAS_PQS: tl.constexpr,
    XB: tl.constexpr, COMPUTE: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS)
    d = tl.arange(0, D)
    lse = tl.load(lse_ptr + b * stride_lb + h * SPLITS + sp)
    weight = tl.exp2(lse - tl.max(lse, 0))  # every row has a live key, so the max is finite
    parts = tl.load(o_ptr + b * stride_ob + h * stride_oh + sp[:, None] * D + d[None, :])
    y = (tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)).to(COMPUTE)
    _store_out(y, out_ptr + b * stride_outb + h * D + d, out_inv_ptr, True, QUANT_OUT)
    if PREPARE:  # attention.dense's input for the INT4 GEMV: this head's D inputs are whole blocks
        cols = h * D + d
        store_planes(consumer_input(y, pqs_ptr, cols, cols < K_OUT, HAS_PQS, COMPUTE), h * D, K_OUT,
                     prep_ptr + b * stride_prep, D, XB)


def pick_splits(batch: int, kv_heads: int, sm_count: int, max_splits: int = 32) -> int:
    """Key-range splits so that batch x KV heads x splits covers the SMs about twice."""
    want = triton.cdiv(2 * sm_count, batch * kv_heads)
    return max(1, min(max_splits, triton.next_power_of_2(want)))


class LaunchShape(NamedTuple):
    block_t: int
    stages: int
    f16_dots: bool


def launch_shape(batch: int, kv_fp8: bool, kv_unit: bool) -> LaunchShape:
    """The decode attention's key tile, pipeline stages and dot type for ``batch`` rows over a BF16 or FP8 pool."""
    loaded = batch >= LOADED_ROWS
    block_t, stages = ((LOADED_FP8_BLOCK_T, LOADED_FP8_STAGES) if kv_fp8 else (LOADED_BLOCK_T, LOADED_STAGES)) \
        if loaded else (BLOCK_T, ATTENTION_STAGES)
    return LaunchShape(block_t, stages, kv_fp8 and kv_unit and (loaded if FP8_DOTS_F16 is None else FP8_DOTS_F16))


def decode_attention(qkv_partials: torch.Tensor, bias: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor, table_rows: torch.Tensor,
                     block_tables: torch.Tensor,
                     o_work: torch.Tensor, lse_work: torch.Tensor, out: torch.Tensor, out_inv: torch.Tensor | None,
                     *, heads: int, kv_heads: int, compute: torch.dtype, block_t: int | None = None,
                     prepared: Prepared | None = None, norm_sumsq: torch.Tensor | None = None, hidden: int = 0,
                     eps: float = 0.0, pdl: bool = False, kv_scale: torch.Tensor | None = None,
                     kv_inv: torch.Tensor | None = None, kv_unit: bool = False,
                     tree: torch.Tensor | None = None, write_only: bool = False,
                     shape_rows: int | None = None) -> None:
    """Attention of one new token per row, writing its K/V into the cache; ``out`` is [B, heads * D].

    ``qkv_partials``: [S, B, (heads + 2 kv_heads) D] float32 split-K partials of the QKV projection, or its
    int64 accumulators [B, (heads + 2 kv_heads) D] (fixed_sum);
    ``k_cache``/``v_cache``: one layer's block pool [num_blocks, kv_heads, block_size, D]; ``block_tables``: [S, W]
    int64 block tables, ``table_rows`` [B] which of them is row b's (its blocks in order; W covers its position);
    ``o_work``: [B, heads, SPLITS, D]
    and ``lse_work``: [B, heads, SPLITS] float32 scratch, whose SPLITS sets the key-range split;
    ``prepared``: attention.dense's INT4 GEMV input, written from ``out`` too (``gemv_input``); ``norm_sumsq``:
    float32 [S'] where the QKV GEMV folded the input RMSNorm in (``gemv_input.NormFold``): its K splits' sums of
    squares of the ``hidden`` residual values, whose ``1 / sqrt(sum / hidden + eps)`` multiplies the projection;
    ``kv_scale`` / ``kv_inv``: float32 [1], an FP8 cache's dequantization scale for this layer and its inverse
    (``kv_unit``: both are 1, and the kernel converts without them);
    ``tree``: [1 + TREE_WORDS, B] int64 for a tree verify step (None: every row is rotated at its position and sees
    every key before it, as a decode or a chain's verify step): row 0 each row's virtual position (a tree node's: its
    context length plus its depth), where it is rotated and as a 1-token step at which it attends (its K/V still goes
    to its ``positions`` slot); rows 1.. the slot shifts of the ``TREE_WINDOW`` positions before it, byte j % 8 of
    row 1 + j // 8 the position j back's (an ancestor's: its row index less its depth; 0: in place). A linear row's
    virtual positions are its positions and its shifts 0: exactly the step without ``tree``.

    ``write_only``: only each row's key and value written into the cache (one program per row and KV head, no
    attention, ``out`` untouched): a verify step's first pass, after which every row of the step finds the others'
    keys in the cache (one launch's programs never see each other's writes). Attending there too cost the step a
    whole second attention.

    ``shape_rows``: the rows the key tile is chosen for (``launch_shape``; None: this launch's). A verify step passes
    its requests' decode batch, and with that batch's splits (``o_work``) each row sums its keys exactly as a 1-token
    step of that batch does, so that speculation keeps greedy outputs bit for bit.
    """
    qkv_partials, fixed = fixed_sum.as_partials(qkv_partials)
    qkv_splits, batch = qkv_partials.shape[0], qkv_partials.shape[1]
    assert norm_sumsq is None or batch == 1 and fixed, "the folded norm: one row, the QKV GEMV's accumulators"
    d = k_cache.shape[-1]
    kv_fp8 = k_cache.dtype == torch.float8_e4m3fn
    assert kv_fp8 == (kv_scale is not None and kv_inv is not None), "an FP8 cache comes with its scale"
    line = 128 // k_cache.element_size()  # elements per 128-byte line (the L2 prefetch's unit)
    splits = o_work.shape[2]
    group = heads // kv_heads
    dt = tl_dtype(compute)
    stages = ATTENTION_STAGES
    shape = launch_shape(shape_rows or batch, kv_fp8, kv_unit)
    if block_t is None:  # the module's choice (a benchmark passes its own, with ATTENTION_STAGES)
        block_t, stages = shape.block_t, shape.stages
    f16_dots = shape.f16_dots
    # (attention.dense's INT4 GEMV input is written by the combine only: batch 1's step, which splits anyway)
    direct = DIRECT_SINGLE_SPLIT and splits == 1 and prepared is None and not write_only
    _decode_attention_kernel[(batch, kv_heads, 1 if write_only else splits)](
        qkv_partials, qkv_partials.stride(0), qkv_partials.stride(1), bias if bias is not None else qkv_partials,
        cos, sin, cos.stride(0),
        k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        kv_scale if kv_fp8 else o_work, kv_inv if kv_fp8 else o_work,
        positions, table_rows, block_tables, block_tables.stride(0), block_tables.stride(1),
        tree[0] if tree is not None else positions, tree[1] if tree is not None else positions,
        tree.stride(0) if tree is not None else 0,
        o_work, lse_work, o_work.stride(0), o_work.stride(1), lse_work.stride(0),
        out, out_inv if out_inv is not None else out, out.stride(0),
        LOG2E / d**0.5, norm_sumsq if norm_sumsq is not None else o_work, hidden, eps,
        H=heads, KVH=kv_heads, D=d, GROUP=group, NORM_PARTS=norm_sumsq.numel() if norm_sumsq is not None else 0,
        NORM_BLOCK=triton.next_power_of_2(norm_sumsq.numel()) if norm_sumsq is not None else 1,
        QKV_SPLITS=qkv_splits, FIXED=fixed, HAS_BIAS=bias is not None,
        SPLITS=splits, BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_T=block_t,
        BS=k_cache.shape[2], COMPUTE=dt,
        PDL=pdl, PREFETCH=PREFETCH_KV and pdl and not write_only and batch < PREFETCH_MAX_ROWS,
        KV_FP8=kv_fp8, KV_UNIT=kv_fp8 and kv_unit,
        LINE=line, LINES=max(1, d // line),
        DOT=tl.float16 if f16_dots else dt, TREE=tree is not None, WRITE_ONLY=write_only, DIRECT=direct,
        QUANT_OUT=out_inv is not None, num_warps=ATTENTION_WARPS, num_stages=stages, launch_pdl=pdl,
    )
    if write_only or direct:
        return
    p = prepared
    assert p is None or p.k == heads * d and d % p.block == 0
    _combine_kernel[(batch, heads)](
        o_work, lse_work, out, out_inv if out_inv is not None else out,
        p.pqs if p is not None and p.pqs is not None else out, p.planes if p is not None else out,
        o_work.stride(0), o_work.stride(1), lse_work.stride(0), out.stride(0), p.planes.stride(0) if p else 0,
        heads * d, D=d, SPLITS=splits, QUANT_OUT=out_inv is not None, PREPARE=p is not None,
        HAS_PQS=p is not None and p.pqs is not None, XB=p.block if p else 16, COMPUTE=dt, PDL=pdl,
        num_warps=COMBINE_WARPS, launch_pdl=pdl,
    )
