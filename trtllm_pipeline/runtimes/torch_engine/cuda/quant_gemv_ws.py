"""quant_gemv's batch-1 INT4 GEMV on Hopper, warp-specialized (Gluon): one warp copies, four compute.

The copy-engine kernel of quant_gemv is issued by the same four warps that compute: per K tile every thread
pays barrier waits, the copies' issue and CTA-wide syncs (2.4-2.6 instructions per weight in its loop;
Nsight Compute: 0.59 instructions issued per scheduler and cycle, DRAM 58% busy). Here a producer warp
issues every copy of a tile by the bulk tensor copy engine (the packed weights, the input's two byte planes,
the scales and the input's block terms) into STAGES buffers, each with a "ready" and an "empty" mbarrier,
and the consumer warps only wait for a full buffer, read it into registers, free it and do the dp4a work
(1.4 instructions per weight in their loop: ``python tools/gemv_sass.py --ws ...``). H200, each kernel alone
(run 71): the GLU 21.0 us (3.4 TB/s) against the copy-engine kernel's 25.7, proj 11.8 against 12.6; the 7B
INT4-AWQ step 1.87 ms against 2.11 (docs/perf-notes.md).

The arithmetic is quant_gemv's, term for term (the same int32 block sums, the same float32 products and order), so
the results are its results: the same split-K partials, added into int64 accumulators (FIXED, ``fixed_sum``: the
decode step's) or summed by each row tile's last program (REDUCE), or for the GLU ``silu(fc) * gate`` and
mlp.proj's prepared input. With a ``gemv_input.NormFold`` (the QKV GEMV of the decode step's layers 1..) the
consumer warps make their input tiles themselves, from the residual and the previous linear's accumulators, and
the producer copies only weights and scales. On the decode step's path the weights may come from a tile-by-tile copy
(TILED_WEIGHTS, off by default) and INT4-AWQ's scales from their 16-bit copy (SCALES_16BIT: the compute dtype's
values, which every INT4-AWQ path uses). Gluon kernels do not run in Triton's interpreter: on the CPU the
tests compile this one for sm_90 and count its instructions; the H200 benchmark checks its numbers
(benchmarks/quant_fast_path.py, benchmarks/split_sum_check.py).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import fixed_sum, gemv_input
from trtllm_pipeline.runtimes.torch_engine.cuda.gemv_input import consumer_input
from trtllm_pipeline.runtimes.torch_engine.cuda.dp4a import dp4a
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import silu_mul, tl_dtype

# the packed weights' tiles (128-byte rows) swizzled; the small boxes as the plain rows the copy engine writes
W_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
PLAIN = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
PLAIN16 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)  # the 16-bit scales' boxes
# registers per thread: 4 consumer warps and the producer's warp group (80: three programs per SM)
MAX_REGISTERS = 80
# Under PDL, the producer copies the first stages' weights and scales before waiting for the previous kernel
# (False: after; the benchmark's variant "late" compares them)
EARLY_WEIGHTS = True
# True: the decode step gives the kernel a copy of its packed weights laid tile by tile (``tile_weights``), so
# that each stage's copy reads one contiguous 4-8 KB run instead of HALF rows of 128 bytes K/2 bytes apart
# (H200, 7B INT4-AWQ step: 1.615-1.626 ms against 1.637-1.651, runs 120-121; 1.646-1.657 against 1.668, run
# 122), for a second copy of every INT4 weight on the device: 3.04 GiB at 7B. Off by default since 2026-12-07
# (the default of ``switches.tiled_weights_enabled``; ``TRTLLM_PIPELINE_TILED_WEIGHTS=1`` lays it): once prefill
# read the packed weights instead of a bfloat16 copy, the tiled copy was the one thing between an INT4 7B's peak and
# issue 32's "weights + KV + 2 GiB" (H100 2026-12-07f: 16.31 GiB with it, 13.12 without; batch 1 2.102 against 2.141
# ms a step, 1.8%)
TILED_WEIGHTS = False
# True: the kernel reads an INT4-AWQ weight's scales in its 16-bit copy (``QuantWeight.scales16``: the same
# values, as TensorRT-LLM holds them), half the scale bytes of a step (H200, 7B step: -0.02 to -0.03 ms, runs
# 122-123; False: their float32 copy, the benchmark's variant "scales32")
SCALES_16BIT = True


@gluon.jit
def _quarters(t, A2: gl.constexpr):
    """The 4 words of each input block (a thread holds a block's 4 of a [R, 32] tile's words) as 4 [R, 8]."""
    t02, t13 = gl.split(gl.reshape(t, [t.shape[0], 8, 2, 2]))
    t0, t2 = gl.split(t02)
    t1, t3 = gl.split(t13)
    return (gl.convert_layout(t0, A2, assert_trivial=True), gl.convert_layout(t1, A2, assert_trivial=True),
            gl.convert_layout(t2, A2, assert_trivial=True), gl.convert_layout(t3, A2, assert_trivial=True))


@gluon.jit
def _block_dot(u, h, lo, c):
    """Per row and input block: the high plane's dp4a chain, shifted 8 bits, carries the low plane's (quant_gemv)."""
    a = 0
    for j in gl.static_range(4):
        a = dp4a(u[j], h[j], a, True, True)
    a = (a << 8) + c
    for j in gl.static_range(4):
        a = dp4a(u[j], lo[j], a, False, True)
    return a


@gluon.jit
def _copy_weights(w_desc, s_desc, bufs, s, bar, row0, kt, k_tiles, TILED: gl.constexpr):
    """K tile ``kt``'s packed words and scales into stage ``s`` (they do not depend on the previous kernel)."""
    w_bufs, x_bufs, s_bufs, ce_bufs = bufs
    if TILED:  # tile (row0 / HALF, kt) is the (row0 / HALF * k_tiles + kt)-th [HALF, 32] box of the tiled copy
        HALF: gl.constexpr = w_desc.block_type.shape[0]
        tma.async_copy_global_to_shared(w_desc, [row0 * k_tiles + kt * HALF, 0], bar, w_bufs.index(s))
    else:
        tma.async_copy_global_to_shared(w_desc, [row0, kt * 32], bar, w_bufs.index(s))
    tma.async_copy_global_to_shared(s_desc, [2 * kt, row0], bar, s_bufs.index(s))  # a scale group per tile


@gluon.jit
def _copy_input(x_desc, ce_desc, bufs, s, bar, kt):
    """K tile ``kt``'s input planes and block terms into stage ``s`` (the previous kernel's output)."""
    w_bufs, x_bufs, s_bufs, ce_bufs = bufs
    tma.async_copy_global_to_shared(x_desc, [0, kt * 32], bar, x_bufs.index(s))
    tma.async_copy_global_to_shared(ce_desc, [0, kt * 8], bar, ce_bufs.index(2 * s))  # 128-byte aligned


@gluon.jit
def _producer(descs, descs2, bufs, bufs2, ready, empty, row0, k0, k_iters, k_tiles, GLU: gl.constexpr,
              STAGES: gl.constexpr, PDL: gl.constexpr, EARLY: gl.constexpr, TILED: gl.constexpr,
              FOLD: gl.constexpr):
    w_desc, x_desc, s_desc, ce_desc = descs
    w2_desc, x2_desc, s2_desc, ce2_desc = descs2
    # a stage: both matrices' tiles (FOLD: the weights and scales only, the consumers make the input)
    IN_BYTES: gl.constexpr = 0 if FOLD else x_desc.block_type.nbytes + ce_desc.block_type.nbytes
    NBYTES: gl.constexpr = (w_desc.block_type.nbytes + s_desc.block_type.nbytes + IN_BYTES) * (2 if GLU else 1)
    # Under PDL (EARLY) the first stages' weights and scales are copied before waiting for the previous kernel,
    # so their DRAM latency overlaps its tail; only the input waits (the wait is per thread).
    first = 0
    if EARLY:
        first = gl.minimum(k_iters, STAGES)
    for i in range(first):
        bar = ready.index(i)
        mbarrier.expect(bar, NBYTES)
        _copy_weights(w_desc, s_desc, bufs, i, bar, row0, k0 + i, k_tiles, TILED)
        if GLU:
            _copy_weights(w2_desc, s2_desc, bufs2, i, bar, row0, k0 + i, k_tiles, TILED)
    if PDL and not FOLD:
        gdc_wait()
    for i in range(k_iters):
        s = i % STAGES
        bar = ready.index(s)
        if i >= first:
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier reads as phase 1 done
            mbarrier.expect(bar, NBYTES)
            _copy_weights(w_desc, s_desc, bufs, s, bar, row0, k0 + i, k_tiles, TILED)
            if GLU:
                _copy_weights(w2_desc, s2_desc, bufs2, s, bar, row0, k0 + i, k_tiles, TILED)
        if not FOLD:
            _copy_input(x_desc, ce_desc, bufs, s, bar, k0 + i)
            if GLU:
                _copy_input(x2_desc, ce2_desc, bufs2, s, bar, k0 + i)


@gluon.jit
def _copied_input(bufs, s):
    """Stage ``s``'s input as the copy engine wrote it: the high and low planes' words [1, 32], the block sums
    and the powers of two [1, 8]."""
    ROWS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    xb = bufs[1].index(s)._reinterpret(gl.int32, [2, 32], ROWS)
    ce = bufs[3].index(2 * s)._reinterpret(gl.int32, [2, 8], ROWS)
    return xb.slice(0, 1, dim=0), xb.slice(1, 1, dim=0), ce.slice(0, 1, dim=0), ce.slice(1, 1, dim=0)


@gluon.jit
def _made_input(made, i):
    """Tile ``i`` of the input a FOLD kernel's consumers made, as ``_copied_input`` gives a stage's."""
    ROWS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    per: gl.constexpr = made[0].shape[0]
    return (made[0]._reinterpret(gl.int32, [per, 1, 32], ROWS).index(i),
            made[1]._reinterpret(gl.int32, [per, 1, 32], ROWS).index(i),
            made[2]._reinterpret(gl.int32, [per, 1, 8], ROWS).index(i),
            made[3]._reinterpret(gl.int32, [per, 1, 8], ROWS).index(i))


@gluon.jit
def _read_tile(bufs, s, inp, HALF: gl.constexpr, B2: gl.constexpr, A2: gl.constexpr):
    """Stage ``s`` into registers: the weights' and planes' words by block [HALF, 8] x 4, the even and odd rows'
    scales [HALF, 1], the block sums and powers of two [1, 8] (the input's from ``inp``: the stage's copies,
    ``_copied_input``, or the tile a FOLD kernel's consumers made, ``_made_input``)."""
    w_bufs, x_bufs, s_bufs, ce_bufs = bufs
    xh_in, xl_in, c_in, e_in = inp
    u = _quarters(w_bufs.index(s).load(B2), A2)
    h = _quarters(xh_in.load(B2), A2)
    lo = _quarters(xl_in.load(B2), A2)
    # (a permuted [1, HALF] view read the wrong rows' scales: the box's two rows as one plain vector instead)
    sb = s_bufs.index(s)._reinterpret(s_bufs.dtype, [2 * HALF], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    s_lo = gl.expand_dims(sb.slice(0, HALF).load(gl.SliceLayout(1, A2)).to(gl.float32), 1)
    s_hi = gl.expand_dims(sb.slice(HALF, HALF).load(gl.SliceLayout(1, A2)).to(gl.float32), 1)
    c = c_in.load(A2)
    step = e_in.load(A2).to(gl.float32, bitcast=True)
    return u, h, lo, s_lo, s_hi, c, step


@gluon.jit
def _normed_tiles(fold, scale, cols, ok, first_rows, made, PER: gl.constexpr, COMPUTE: gl.constexpr):
    """This program's K tiles of a FOLD GEMV's input (gemv_input.NormFold; inputs ``cols`` [PER, 128], ``ok``
    where they are its own, ``scale`` there), made from the previous linear's accumulators and the residual: ``x = residual + y`` rounded as the norm kernel rounds it, then
    ``x * scale`` in gemv_input's planes (store_planes, term for term): the high and low planes' words into
    ``made[0]`` and ``made[1]`` [PER, 32], the block sums and powers of two into ``made[2]`` and ``made[3]``
    [PER, 8]. A warp makes a tile (a thread a word). The first row tile's programs (``first_rows``) also write x
    to the residual's other buffer and their K slice's sum of squares of x to ``sumsq[split]``."""
    sums_ptr, res_ptr, res_out_ptr, sq_ptr, split = fold
    y = fixed_sum.load(sums_ptr + cols, ok).to(COMPUTE).to(gl.float32)
    x = (gl.load(res_ptr + cols, mask=ok, other=0.0).to(gl.float32) + y).to(COMPUTE)
    gl.store(res_out_ptr + cols, x, mask=ok & first_rows)
    xf = x.to(gl.float32)
    gl.store(sq_ptr + split, gl.sum(gl.sum(xf * xf, axis=1), axis=0), mask=first_rows)
    made_planes(xf * scale, made, PER)


@gluon.jit
def made_planes(v, made, PER: gl.constexpr):
    """gemv_input.store_planes of ``v`` [PER, 128] float32 (``_tile_cols``' layout: a warp a tile), term for term,
    into ``made``: the high and low planes' words [PER, 32] (byte b of word w: element 4 w + b), the blocks' -8 sums
    and powers of two [PER, 8]."""
    # store_planes on [PER, 8 blocks, 4 words, 4 bytes]: the same elements per thread as ``v`` [PER, 128]
    L4: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4], [1, 8, 4, 1], [4, 1, 1, 1], [3, 2, 1, 0])
    vb = gl.convert_layout(gl.reshape(v, [PER, 8, 4, 4]), L4)
    amax = gl.max(gl.max(gl.abs(vb), axis=3), axis=2)
    e = gl.maximum((amax.to(gl.int32, bitcast=True) >> 23) & 0xFF, 15)
    inv = gl.expand_dims(gl.expand_dims(((268 - e) << 23).to(gl.float32, bitcast=True), 2), 3)
    step = ((e - 14) << 23).to(gl.float32, bitcast=True)
    xi = (((vb * inv) + gemv_input.ROUND) - gemv_input.ROUND).to(gl.int32)
    sh = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(0, gl.SliceLayout(0, L4)))) * 8
    sh = gl.expand_dims(gl.expand_dims(gl.expand_dims(sh, 0), 0), 0)
    xh = gl.sum(((xi >> 8) & 0xFF) << sh, axis=3)  # [PER, 8, 4]: word 4 b + m of each tile
    xl = gl.sum((xi & 0xFF) << sh, axis=3)
    c = -8 * gl.sum(gl.sum(xi, axis=3), axis=2)
    made[0].store(gl.reshape(xh, [PER, 32]))
    made[1].store(gl.reshape(xl, [PER, 32]))
    made[2].store(c)
    made[3].store(step.to(gl.int32, bitcast=True))


@gluon.jit
def _tile_cols(k0, k_iters, PER: gl.constexpr, L: gl.constexpr):
    """The inputs of this program's K tiles as [PER, 128] in layout ``L``, and which are its own."""
    t = gl.expand_dims(gl.arange(0, PER, layout=gl.SliceLayout(1, L)), 1)
    d = gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, L)), 0)
    return (k0 + t) * 128 + d, (t < k_iters) & (d < 128)  # (d < 128: the mask at the full shape)


@gluon.jit
def _accumulate(t, acc_lo, acc_hi, masks):
    """One tile into the even and odd rows' float32 accumulators [HALF, 8] (quant_gemv._accumulate, the odd
    rows' nibbles used in place as 16 (q + 8))."""
    u, h, lo, s_lo, s_hi, c, step = t
    m_nib, m_xor, m_nib_hi, m_xor_hi = masks
    u_lo = ((u[0] & m_nib) ^ m_xor, (u[1] & m_nib) ^ m_xor, (u[2] & m_nib) ^ m_xor, (u[3] & m_nib) ^ m_xor)
    u_hi = ((u[0] & m_nib_hi) ^ m_xor_hi, (u[1] & m_nib_hi) ^ m_xor_hi, (u[2] & m_nib_hi) ^ m_xor_hi,
            (u[3] & m_nib_hi) ^ m_xor_hi)
    acc_lo += _block_dot(u_lo, h, lo, c).to(gl.float32) * (s_lo * step)
    acc_hi += _block_dot(u_hi, h, lo, c << 4).to(gl.float32) * (s_hi * (step * 0.0625))
    return acc_lo, acc_hi


@gluon.jit
def _consumer(bufs, bufs2, ready, empty, k_iters, masks, fold, GLU: gl.constexpr, HALF: gl.constexpr,
              STAGES: gl.constexpr, B2: gl.constexpr, A2: gl.constexpr, PDL: gl.constexpr, FOLD: gl.constexpr,
              PER: gl.constexpr, COMPUTE: gl.constexpr):
    fold_ptrs, scale_ptr, k0, first_rows, made = fold
    if FOLD:  # the norm's scale (no kernel writes it) before the wait
        L: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])  # [PER, 128]: a warp a tile
        cols, ok = _tile_cols(k0, k_iters, PER, L)
        scale = gl.load(scale_ptr + cols, mask=ok, other=0.0)
    if PDL:  # its epilogue writes buffers the previous kernels read: not before they are done
        gdc_wait()
        gdc_launch_dependents()
    if FOLD:  # the input's tiles from the previous linear's sums, while the first weights land
        _normed_tiles(fold_ptrs, scale, cols, ok, first_rows, made, PER, COMPUTE)
        gl.thread_barrier()  # every consumer warp's tiles written before any reads them
    acc_lo = gl.zeros([HALF, 8], gl.float32, A2)
    acc_hi = gl.zeros([HALF, 8], gl.float32, A2)
    acc2_lo = gl.zeros([HALF, 8], gl.float32, A2)
    acc2_hi = gl.zeros([HALF, 8], gl.float32, A2)
    for i in range(k_iters):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        if FOLD:
            t = _read_tile(bufs, s, _made_input(made, i), HALF, B2, A2)
        else:
            t = _read_tile(bufs, s, _copied_input(bufs, s), HALF, B2, A2)
        if GLU:
            t2 = _read_tile(bufs2, s, _copied_input(bufs2, s), HALF, B2, A2)
        fence_async_shared()  # the reads ordered before the copy engine's next writes to the stage
        mbarrier.arrive(empty.index(s), count=1)
        acc_lo, acc_hi = _accumulate(t, acc_lo, acc_hi, masks)
        if GLU:
            acc2_lo, acc2_hi = _accumulate(t2, acc2_lo, acc2_hi, masks)
    return acc_lo, acc_hi, acc2_lo, acc2_hi


@gluon.jit
def _buffers(descs, HALF: gl.constexpr, STAGES: gl.constexpr):
    w_desc, x_desc, s_desc, ce_desc = descs
    return (gl.allocate_shared_memory(gl.int32, [STAGES, HALF, 32], w_desc.layout),
            gl.allocate_shared_memory(gl.int32, [STAGES, 2, 32], x_desc.layout),
            gl.allocate_shared_memory(s_desc.dtype, [STAGES, 2, HALF], s_desc.layout),
            gl.allocate_shared_memory(gl.int32, [2 * STAGES, 2, 8], ce_desc.layout))


@gluon.jit
def _store_planes(v_lo, v_hi, k0, K, dst, HALF: gl.constexpr):
    """gemv_input.store_planes for the GLU's 2 HALF outputs from ``k0``, held as even (``v_lo``) and odd rows
    [HALF] (blocks of 16 inputs: 8 rows of each): the same powers of two, integers, words and block sums."""
    NB: gl.constexpr = HALF // 8
    E2: gl.constexpr = gl.BlockedLayout([1, 4, 2], [32, 1, 1], [4, 1, 1], [2, 1, 0])  # a thread: a whole block
    # [NB, 4, 2]: block, pair of packed rows within the block, which of the pair
    lo = gl.convert_layout(gl.reshape(v_lo, [NB, 4, 2]), E2)
    hi = gl.convert_layout(gl.reshape(v_hi, [NB, 4, 2]), E2)
    amax = gl.maximum(gl.max(gl.max(gl.abs(lo), axis=2), axis=1), gl.max(gl.max(gl.abs(hi), axis=2), axis=1))
    e = gl.maximum((amax.to(gl.int32, bitcast=True) >> 23) & 0xFF, 15)
    inv = gl.expand_dims(gl.expand_dims(((268 - e) << 23).to(gl.float32, bitcast=True), 1), 2)
    step = ((e - 14) << 23).to(gl.float32, bitcast=True)
    xi_lo = (((lo * inv) + gemv_input.ROUND) - gemv_input.ROUND).to(gl.int32)
    xi_hi = (((hi * inv) + gemv_input.ROUND) - gemv_input.ROUND).to(gl.int32)
    c = -8 * (gl.sum(gl.sum(xi_lo, axis=2), axis=1) + gl.sum(gl.sum(xi_hi, axis=2), axis=1))
    # word 4b + m holds inputs 16b + 4m .. + 3: rows (2j, 2j + 1, 2j + 2, 2j + 3), j = 8b + 2m: lo, hi, lo, hi
    l_e, l_o = gl.split(xi_lo)
    h_e, h_o = gl.split(xi_hi)
    xh = ((l_e >> 8) & 0xFF) | (((h_e >> 8) & 0xFF) << 8) | (((l_o >> 8) & 0xFF) << 16) | ((h_o >> 8) << 24)
    xl = (l_e & 0xFF) | ((h_e & 0xFF) << 8) | ((l_o & 0xFF) << 16) | (h_o << 24)
    W2: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0])
    xh = gl.convert_layout(xh, W2)
    xl = gl.convert_layout(xl, W2)
    rw = k0 // 4 + gl.arange(0, NB, layout=gl.SliceLayout(1, W2))[:, None] * 4 + \
        gl.arange(0, 4, layout=gl.SliceLayout(0, W2))[None, :]
    w_ok = rw < K // 4
    gl.store(dst + rw, xh, mask=w_ok)
    gl.store(dst + K // 4 + rw, xl, mask=w_ok)
    B1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    rb = k0 // 16 + gl.arange(0, NB, layout=B1)
    b_ok = rb < K // 16
    gl.store(dst + K // 2 + rb, gl.convert_layout(c, B1), mask=b_ok)
    gl.store(dst + K // 2 + K // 16 + rb, gl.convert_layout(step.to(gl.int32, bitcast=True), B1), mask=b_ok)


@gluon.jit
def stage_barriers(STAGES: gl.constexpr):
    """Each stage's "ready" and "empty" mbarriers (count 1), initialized: the warp-specialized kernels' hand-off."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return ready, empty


# the row kernels' staged input tiles (quant_rows_w4a8_mma, quant_rows_int4_mma): a thread one word's four inputs
STAGED_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0]))


@gluon.jit
def staged_inputs(x_ptr, pqs_ptr, pqs2_ptr, kt, k_end, M, stride_x, NB: gl.constexpr, HAS_PQS: gl.constexpr,
                  GLU: gl.constexpr):
    """K tile ``kt``'s input rows and each matrix's pre-quant scales (``input_rows``, ``input_scales``)."""
    return (input_rows(x_ptr, kt, k_end, M, stride_x, NB), input_scales(pqs_ptr, kt, k_end, HAS_PQS),
            input_scales(pqs2_ptr, kt, k_end, HAS_PQS and GLU))


@gluon.jit
def input_rows(x_ptr, kt, k_end, M, stride_x, NB: gl.constexpr):
    """K tile ``kt`` of the input rows [NB, 128] as stored, zeros past row M and from tile ``k_end`` (a prefetch past
    the program's last tile reads nothing)."""
    n = gl.expand_dims(gl.arange(0, NB, layout=gl.SliceLayout(1, STAGED_LAYOUT)), 1)
    cols = kt * 128 + gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, STAGED_LAYOUT)), 0)
    return gl.load(x_ptr + n * stride_x + cols, mask=(n < M) & (cols < k_end * 128), other=0.0)


@gluon.jit
def input_scales(pqs_ptr, kt, k_end, HAS_PQS: gl.constexpr):
    """K tile ``kt`` of the pre-quant scales [1, 128] in float32 (ones without; zeros from tile ``k_end``)."""
    cols = kt * 128 + gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, STAGED_LAYOUT)), 0)
    if HAS_PQS:
        p = gl.load(pqs_ptr + cols, mask=cols < k_end * 128, other=0.0).to(gl.float32)
    else:
        p = gl.full([1, 128], 1.0, gl.float32, STAGED_LAYOUT)
    return p


@gluon.jit
def program_tiles(per_split, k_tiles, HALF: gl.constexpr):
    """This program's first packed row, first K tile and number of K tiles (row tile ``program_id(0)``, split
    ``program_id(1)``; a split past the last tile has none)."""
    k0 = gl.program_id(1) * per_split
    return gl.program_id(0) * HALF, k0, gl.minimum(per_split, k_tiles - k0)


@gluon.jit
def box_producer(descs, descs2, bufs, bufs2, ready, empty, row0, k0, k_iters, BOXES: gl.constexpr,
                 WEIGHTS: gl.constexpr, GLU: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr,
                 STAGE_BYTES: gl.constexpr):
    """The producer warp of the Gluon kernels whose stages are boxes the copy engine fills (quant_gemv_w4a8_mma,
    quant_rows_*): box j of K tile kt from ``descs[j]`` into ``bufs[j]``'s stage, at ``[p0 row0 + q0 kt + c0, p1 row0
    + q1 kt + c1]`` for ``BOXES[j]`` = (p0, q0, c0, p1, q1, c1) (row0: the program's first row, in its boxes' units),
    for one matrix or, GLU, two (``STAGE_BYTES``: all of a stage). The first ``WEIGHTS`` boxes depend on
    nothing before the kernel; the rest (an input a kernel before made) are copied, under PDL, after the wait for it:
    for the first stages after their weights."""
    first = gl.minimum(k_iters, STAGES)
    for i in range(k_iters):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier reads as phase 1 done
        bar = ready.index(s)
        mbarrier.expect(bar, STAGE_BYTES)
        kt = k0 + i
        _copy_boxes(descs, bufs, bar, row0, kt, s, BOXES, 0, WEIGHTS)
        if GLU:
            _copy_boxes(descs2, bufs2, bar, row0, kt, s, BOXES, 0, WEIGHTS)
        if i + 1 == first:
            if PDL and WEIGHTS < len(BOXES):
                gdc_wait()
            for j in range(first):  # the input of the stages issued so far
                _copy_boxes(descs, bufs, ready.index(j), row0, k0 + j, j, BOXES, WEIGHTS, len(BOXES))
                if GLU:
                    _copy_boxes(descs2, bufs2, ready.index(j), row0, k0 + j, j, BOXES, WEIGHTS, len(BOXES))
        elif i >= first:
            _copy_boxes(descs, bufs, bar, row0, kt, s, BOXES, WEIGHTS, len(BOXES))
            if GLU:
                _copy_boxes(descs2, bufs2, bar, row0, kt, s, BOXES, WEIGHTS, len(BOXES))


@gluon.jit
def _copy_boxes(descs, bufs, bar, row0, kt, s, BOXES: gl.constexpr, FIRST: gl.constexpr, END: gl.constexpr):
    """Boxes FIRST..END-1 of K tile ``kt`` into stage ``s`` (``box_producer``)."""
    for j in gl.static_range(FIRST, END):
        tma.async_copy_global_to_shared(
            descs[j], [BOXES[j][0] * row0 + BOXES[j][1] * kt + BOXES[j][2],
                       BOXES[j][3] * row0 + BOXES[j][4] * kt + BOXES[j][5]], bar, bufs[j].index(s))


# a K tile's packed words [rows, 32 words] and the per-row values box of ``rows_per_tile`` rows a K tile (W4A8's
# tables, INT4's 16-bit scales), as box_producer reads its boxes
def weight_boxes(rows_per_tile: int) -> tuple:
    return (1, 0, 0, 0, 32, 0), (0, rows_per_tile, 0, 1, 0, 0)


@gluon.jit
def _ws_gemv_kernel(
    w_desc, x_desc, s_desc, ce_desc, w2_desc, x2_desc, s2_desc, ce2_desc,
    out_ptr, pqs_out_ptr, xp_out_ptr, count_ptr, clear_ptr,
    sums_ptr, res_ptr, res_out_ptr, scale_ptr, sq_ptr,
    N, k_tiles, per_split, stride_os, m_nib, m_xor, m_nib_hi, m_xor_hi, clear_n,
    GLU: gl.constexpr, PREPARE_OUT: gl.constexpr, HAS_PQS_OUT: gl.constexpr, SPLITS: gl.constexpr,
    REDUCE: gl.constexpr, FIXED: gl.constexpr, CLEAR: gl.constexpr, COMPUTE: gl.constexpr, HALF: gl.constexpr,
    STAGES: gl.constexpr, PDL: gl.constexpr, EARLY: gl.constexpr, TILED: gl.constexpr, FOLD: gl.constexpr,
    PER: gl.constexpr, num_warps: gl.constexpr,
):
    B2: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    A2: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [num_warps, 1], [1, 0])
    descs = (w_desc, x_desc, s_desc, ce_desc)
    descs2 = (w2_desc, x2_desc, s2_desc, ce2_desc)
    bufs = _buffers(descs, HALF, STAGES)
    bufs2 = bufs
    if GLU:
        bufs2 = _buffers(descs2, HALF, STAGES)
    ready, empty = stage_barriers(STAGES)
    pid_n = gl.program_id(0)
    pid_s = gl.program_id(1)
    row0, k0, k_iters = program_tiles(per_split, k_tiles, HALF)
    masks = (m_nib, m_xor, m_nib_hi, m_xor_hi)
    # FOLD: the input tiles the consumers make (gemv_input.NormFold), PER of them at most
    MADE: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])  # per tile: plain rows
    T: gl.constexpr = PER if FOLD else 1
    made = (gl.allocate_shared_memory(gl.int32, [T, 32], MADE), gl.allocate_shared_memory(gl.int32, [T, 32], MADE),
            gl.allocate_shared_memory(gl.int32, [T, 8], MADE), gl.allocate_shared_memory(gl.int32, [T, 8], MADE))
    fold = ((sums_ptr, res_ptr, res_out_ptr, sq_ptr, pid_s), scale_ptr, k0, pid_n == 0, made)
    acc_lo, acc_hi, acc2_lo, acc2_hi = gl.warp_specialize([
        (_consumer, (bufs, bufs2, ready, empty, k_iters, masks, fold, GLU, HALF, STAGES, B2, A2, PDL, FOLD, PER,
                     COMPUTE)),
        (_producer, (descs, descs2, bufs, bufs2, ready, empty, row0, k0, k_iters, k_tiles, GLU, STAGES, PDL, EARLY,
                     TILED, FOLD)),
    ], [1], [40])
    if CLEAR:  # another linear's accumulators, between their last reader and their next writer (fixed_sum)
        lanes = gl.arange(0, 32 * num_warps, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
        programs = gl.num_programs(0) * gl.num_programs(1)
        fixed_sum.clear(clear_ptr, clear_n, pid_n * gl.num_programs(1) + pid_s, programs, lanes)
    rows = row0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, A2))  # packed rows: outputs 2 j and 2 j + 1
    ok = rows < N // 2
    y_lo = gl.sum(acc_lo, axis=1)
    y_hi = gl.sum(acc_hi, axis=1)
    if GLU:
        act_lo = silu_mul(y_lo, gl.sum(acc2_lo, axis=1), COMPUTE)
        act_hi = silu_mul(y_hi, gl.sum(acc2_hi, axis=1), COMPUTE)
        gl.store(out_ptr + 2 * rows, act_lo, mask=ok)
        gl.store(out_ptr + 2 * rows + 1, act_hi, mask=ok)
        if PREPARE_OUT:  # mlp.proj's input
            v_lo = consumer_input(act_lo, pqs_out_ptr, 2 * rows, ok, HAS_PQS_OUT, COMPUTE)
            v_hi = consumer_input(act_hi, pqs_out_ptr, 2 * rows + 1, ok, HAS_PQS_OUT, COMPUTE)
            _store_planes(v_lo, v_hi, 2 * row0, N, xp_out_ptr, HALF)
    elif FIXED:  # into the int64 accumulators: the splits' exact sum, whatever order they finish in
        fixed_sum.add(out_ptr + 2 * rows, y_lo, ok)
        fixed_sum.add(out_ptr + 2 * rows + 1, y_hi, ok)
    else:
        gl.store(out_ptr + pid_s * stride_os + 2 * rows, y_lo, mask=ok)
        gl.store(out_ptr + pid_s * stride_os + 2 * rows + 1, y_hi, mask=ok)
        if REDUCE:  # the row tile's last program sums the splits in split order into split 0 (quant_gemv)
            gl.thread_barrier()
            if gl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
                t_lo = gl.zeros([HALF], gl.float32, gl.SliceLayout(1, A2))
                t_hi = gl.zeros([HALF], gl.float32, gl.SliceLayout(1, A2))
                for sp in gl.static_range(SPLITS):
                    t_lo += gl.load(out_ptr + sp * stride_os + 2 * rows, mask=ok, other=0.0, cache_modifier=".cg")
                    t_hi += gl.load(out_ptr + sp * stride_os + 2 * rows + 1, mask=ok, other=0.0,
                                    cache_modifier=".cg")
                gl.store(out_ptr + 2 * rows, t_lo, mask=ok)
                gl.store(out_ptr + 2 * rows + 1, t_hi, mask=ok)
                gl.store(count_ptr + pid_n, 0)


def fits(q, block_n: int) -> bool:
    """Whether ``q`` takes this kernel's tiles (on top of quant_gemv.tma_fits): 128-input tiles of one scale
    group each, row tiles of at least 32 packed rows (128-byte scale boxes), the block terms' rows 16-byte
    aligned (K a multiple of 64)."""
    return q.group == 128 and block_n // 2 >= 32 and q.k % 64 == 0 and q.n % 2 == 0


def tile_weights(q, half: int):
    """``q`` with its packed weight also laid out tile by tile for row tiles of ``half`` packed rows: the
    [HALF, 32]-word tiles of a row tile's K tiles one after another, row tile after row tile (zero rows pad
    N/2 to whole tiles), so that a stage's copy is one contiguous run. A copy: the other kernels (batches
    above 1, the eager path) keep reading the checkpoint's layout. ``q`` itself where it does not tile."""
    if not fits(q, 2 * half) or q.k % 128 or (q.tiled is not None and q.tile_rows == half):
        return q
    words = q.weight.view(torch.int32)  # [N/2, K/4]
    tiles = triton.cdiv(q.n // 2, half)
    padded = torch.zeros(tiles * half, q.k // 4, dtype=torch.int32, device=words.device)
    padded[: words.shape[0]] = words
    tiled = padded.view(tiles, half, q.k // 128, 32).transpose(1, 2).contiguous().view(-1, 32)
    return dataclasses.replace(q, tiled=tiled, tile_rows=half)


def untile_weights(tiled: torch.Tensor, n: int, k: int, half: int) -> torch.Tensor:
    """The checkpoint's int8 [N/2, K] layout back from ``tile_weights``' copy (the tests' check)."""
    tiles = tiled.shape[0] // (half * (k // 128))
    words = tiled.view(tiles, k // 128, half, 32).transpose(1, 2).reshape(tiles * half, k // 4)
    return words[: n // 2].contiguous().view(torch.int8)


def _descriptors(x: gemv_input.Prepared, q, half: int) -> list:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    k, n = q.k, q.n
    planes = x.planes[0]
    weight = q.tiled if _tiled(q, half) else q.weight.view(torch.int32)
    # the scales' 16-bit copy where the weight has one (SCALES_16BIT), else float32
    sixteen = q.scales16 is not None and SCALES_16BIT
    scales = (q.scales16 if sixteen else q.scales).view(-1, n // 2)
    return [TensorDescriptor.from_tensor(weight, [half, 32], W_LAYOUT),
            TensorDescriptor.from_tensor(planes[:k // 2].view(2, k // 4), [2, 32], PLAIN),
            TensorDescriptor.from_tensor(scales, [2, half], PLAIN16 if sixteen else PLAIN),
            TensorDescriptor.from_tensor(planes[k // 2:k // 2 + 2 * (k // 16)].view(2, k // 16), [2, 8], PLAIN)]


def _tiled(q, half: int) -> bool:
    return q.tiled is not None and q.tile_rows == half


def launch(x: gemv_input.Prepared, q, q2, out: torch.Tensor, cfg, compute: torch.dtype, pdl: bool, *,
           x2: gemv_input.Prepared | None = None, prepare_out: gemv_input.Prepared | None = None,
           counters: torch.Tensor | None = None, clear: torch.Tensor | None = None,
           fold: gemv_input.NormFold | None = None, masks: tuple[int, int, int, int]):
    """quant_gemv.launch's contract for a warp-specialized config (``cfg.ws``), the GLU unsplit; ``masks``:
    quant_gemv's nibble masks and XORs (low, then high nibbles); an int64 ``out``: the accumulators the splits
    are added into (fixed_sum); ``clear``: int64 accumulators the launch sets to zero; ``fold``: the residual
    add and RMSNorm before this GEMV made by its programs (``x``'s planes are not read; gemv_input.NormFold)."""
    glu = q2 is not None
    assert fits(q, cfg.block_n) and cfg.block_k == 128 and x.planes.shape[0] == 1
    assert not glu or cfg.splits == 1, "the warp-specialized GLU does not split K"
    half = cfg.block_n // 2
    k_tiles = triton.cdiv(q.k, 128)
    per_split = triton.cdiv(k_tiles, cfg.splits)
    splits = triton.cdiv(k_tiles, per_split)
    grid = (triton.cdiv(q.n // 2, half), splits)
    fixed = fixed_sum.is_accumulator(out)  # (quant_gemv.launch checked its size)
    reduce = counters is not None and splits > 1 and not fixed
    tiled = _tiled(q, half)
    assert not glu or _tiled(q2, half) == tiled
    descs = _descriptors(x, q, half)
    descs += _descriptors(x2, q2, half) if glu else descs
    dst = prepare_out or x
    unread = dst.planes
    if prepare_out is not None:
        assert glu and prepare_out.block == 16 and cfg.block_n % 16 == 0 and prepare_out.k == q.n
    sums = res = res_out = scale = sumsq = unread  # the fold's buffers (pointers FOLD leaves unread without it)
    if fold is not None:
        assert not glu and fixed and fold.sums.dtype == torch.int64 and fold.sums.numel() >= q.k
        assert fold.residual.is_contiguous() and fold.residual_out.is_contiguous() and fold.scale.numel() == q.k
        assert fold.scale.dtype == torch.float32 and fold.sumsq.numel() >= splits
        sums, res, res_out, scale, sumsq = fold.sums, fold.residual, fold.residual_out, fold.scale, fold.sumsq
    return _ws_gemv_kernel[grid](
        *descs, out, dst.pqs if dst.pqs is not None else out, dst.planes, counters if reduce else unread,
        clear if clear is not None else unread, sums, res, res_out, scale, sumsq, q.n, k_tiles, per_split,
        0 if glu or fixed or out.dim() == 2 else out.stride(0), *masks, clear.numel() if clear is not None else 0,
        GLU=glu, PREPARE_OUT=prepare_out is not None, HAS_PQS_OUT=dst.pqs is not None, SPLITS=splits,
        REDUCE=reduce, FIXED=fixed, CLEAR=clear is not None, COMPUTE=tl_dtype(compute), HALF=half,
        STAGES=cfg.num_stages, PDL=pdl, EARLY=EARLY_WEIGHTS,
        TILED=tiled, FOLD=fold is not None, PER=triton.next_power_of_2(per_split) if fold is not None else 1,
        num_warps=cfg.num_warps, maxnreg=MAX_REGISTERS, launch_pdl=pdl,
    )
