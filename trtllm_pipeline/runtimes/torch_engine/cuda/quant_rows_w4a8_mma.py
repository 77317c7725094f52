"""W4A8-AWQ at 2-16 input rows: each nibble looked up as its E4M3 byte into FP8 ``wgmma``, the batch as the MMA's N.

quant_gemm's W4A8 GEMM at 8 rows rounds every weight to E4M3 in registers (a conversion and a scale multiply a weight)
and was slower than INT4-AWQ's at every batch on an H100 (the 7B step at batch 8: 5.130 ms against 4.439, 2026-12-07h),
where the issue asks W4A8 to be no slower than INT4 at any batch. quant_gemv_w4a8_mma's lookup costs the same whatever
the batch: each packed word gives its two rows' E4M3 magnitudes by 2 PRMT and a LOP3 (where q >= 0, and where q < 0
against the input with its sign bits flipped), already in the A operand's registers, and the MMA's 8 or 16 columns,
idle at batch 1, are the batch's rows here. So a weight costs the batch-1 kernel's lookups (1.92 instructions a weight
in its sm_90 loop) at any of these batches, and each row only its share of staging the input:

* Per K tile the consumer warps load the tile's input rows (rows past M zero), multiply by the pre-quant scale and
  round to the compute dtype, quantize to E4M3 with the activation scale (quant_linear's ``_act_tile``: eager's
  rounding points), and store them into two K-major B buffers [NB, 128], the second with the signs flipped, each
  word's inputs in the lookup's byte order (0, 2, 1, 3). The batch-1 kernel makes its whole K slice once instead; at
  16 rows that slice would not fit beside the stages. ``LinearConfig.prefetch`` (``support.staged_prefetch``, off
  until timed): the next tile's rows and scales are loaded during this tile's lookups and MMAs instead of at its top,
  and the tile's two chains are issued before one wait (``_async_tile``) instead of each waited for.
* The lookup, the two MMA chains a tile from zero and their float32 promotion every 128 inputs are
  quant_gemv_w4a8_mma's (``tile``), as are the producer warp, stages and tables (``QuantWeight.lut8``).

From 17 rows (the MMA's N 32 or 64) staging in every program would cost more than the lookups: each of the N / 64
programs along the output would quantize the same rows again. There one small kernel first writes the rows' E4M3 once
(``made_input.w4a8``: [matrices, sign, M, K] bytes, each word in the lookup's byte order, the second sign flipped;
eager's rounding points, quant_linear's ``_act_tile``), and the producer warp copies each K tile's [NB, 128] boxes of
both signs beside the words and tables by the copy engine (rows past M read as zeros; quant_gemv_ws.box_producer); the
consumers only look up and issue the MMAs, both chains of a tile before one wait (``_async_tile``). 64 output rows a
program keep the accumulators, the fresh per-tile sums and the lookups in 168 registers.

Output: quant_gemm.launch's contract (float32 split-K partials [splits, M, N], or the GLU's ``silu(fc) * gate``
[M, N] in the compute dtype, K not split), each column scaled by ``activation scale x scale_2`` (the matrix's
``out_scale``). Products are exact; sums are the tensor cores' per K tile, then float32, so results differ from the
GEMM's in rounding only. Gluon kernels do not run in Triton's interpreter: the CPU tests compile this one for sm_90
(``tools/gemv_sass.py --w4a8-rows``; ``made_input`` runs in the interpreter).

Measured on an H100 (benchmarks/results/h100-2026-12-08, each 7B launch checked against float32 within 1e-4): at 8
rows the four launches x 28 layers 3.091 ms against quant_gemm's W4A8 GEMM's 3.481 (the GLU at 128 rows and two
stages 51.7 us against 70.5 at 64), the step at batch 8 4.358 ms against 5.414 (INT4-AWQ's 4.459 on the same
machine). The wide form at 64 rows is twice the GEMM's time (10.0 against 5.1 ms of launches; the step at batch 64
12.0 against 10.3), and 16 rows ran on no GPU yet, so the decode step takes this kernel at batch 2-8 by default
(``DEFAULT_ROWS``; ``TRTLLM_PIPELINE_W4A8_WGMMA_ROWS=N``: 2..N, up to 64; 0: off).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import made_input, quant_gemv_w4a8_mma, quant_gemv_w4a8_ws, support
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_w4a8_mma import (B_LAYOUT, BOXES, SIGNS, _async_tile,
                                                                           mma_layout, stage_tables, tile, word_bytes,
                                                                           words_layout)
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_ws import (box_producer, program_tiles, stage_barriers,
                                                                      staged_inputs)

ENV = "TRTLLM_PIPELINE_W4A8_WGMMA_ROWS"
MAX_ROWS = 64
DEFAULT_ROWS = 8  # the rows an H100 checked and timed (2026-12-08; the wide form at 64 rows slower than the GEMM)
STAGED_ROWS = 16  # up to this many rows each program stages its input (support.staged_rows); beyond, made_input
MAX_REGISTERS, WIDE_REGISTERS = 128, 168
STAGES, GLU_STAGES, WIDE_GLU_STAGES = 3, 2, 2
# output rows a program: two 64-row MMA blocks (the staged GLU too: 51.7 us at 8 rows on an H100 against 70.5 at one
# block and three stages, 2026-12-08); the wide form one
BLOCK_N, GLU_BLOCK_N, WIDE_BLOCK_N = 128, 128, 64


def enabled(m: int) -> bool:
    """Whether ``$TRTLLM_PIPELINE_W4A8_WGMMA_ROWS`` (a batch size N; 0: off; unset: ``DEFAULT_ROWS``) asks for this
    kernel at ``m`` (2..N)."""
    return support.rows_switch(ENV, MAX_ROWS, "the W4A8 lookup wgmma kernel", m, default=DEFAULT_ROWS)


def supported(q, m: int) -> bool:
    """W4A8-AWQ at 2..MAX_ROWS rows on a Hopper GPU, in quant_gemv_w4a8_mma's tiles (128-input tiles of one group)."""
    return q.fmt == "w4a8_awq" and 2 <= m <= MAX_ROWS and quant_gemv_w4a8_mma.usable(q, q.weight.device)


def pick_config(q, m: int, sm_count: int, *, glu: bool = False, splits: int | None = None,
                block_n: int | None = None) -> LinearConfig:
    """128 output rows x 128 inputs (from 17 rows: 64), the MMA's N the next of 8, 16, 32, 64 for ``m`` rows,
    quant_gemv_w4a8_ws's K split rule, ``STAGES`` deep (the GLUs two: two matrices' words, the wide one its input
    boxes too)."""
    nb = max(8, triton.next_power_of_2(m))
    wide = nb > support.staged_rows(STAGED_ROWS)
    block_n = block_n or (WIDE_BLOCK_N if wide else GLU_BLOCK_N if glu else BLOCK_N)
    splits = 1 if glu else splits or quant_gemv_w4a8_ws.split_rule(q, sm_count, block_n)
    stages = (WIDE_GLU_STAGES if wide else GLU_STAGES) if glu else STAGES
    return LinearConfig(nb, block_n, 128, splits, 4, stages, gemm=True, tma=True, ws=True, w4a8=True, lut_mma=True,
                        made=wide, prefetch=not wide and support.staged_prefetch())


# ------------------------------------------------------------------------------------------ the consumers' work


# four float32 inputs (0, 1, 2, 3 of a word) as E4M3 bytes in the lookups' order (0, 2, 1, 3), rounded to nearest
# even and saturated to +-448 (eager clamps to that range, then rounds: the same bytes)
_E4M3_WORD = gl.constexpr("""{ .reg .b16 lo, hi;
cvt.rn.satfinite.e4m3x2.f32 lo, $3, $1;
cvt.rn.satfinite.e4m3x2.f32 hi, $4, $2;
mov.b32 $0, {lo, hi}; }""")


@gluon.jit
def _stage_input(x, pqs, aq, bx, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr):
    """A K tile of the input rows ``x`` [NB, 128] (quant_gemv_ws.input_rows) as E4M3 into the B buffers: times the
    pre-quant scales ``pqs`` rounded to the compute dtype, times the activation scale ``aq``, clamped to E4M3's range
    and rounded to nearest even (quant_gemv_w4a8_mma._fp8_words' points); ``bx[1]`` the same with the sign bits
    flipped. Byte j of each word holds input (0, 2, 1, 3)[j] of its four, the order the weights' lookups leave their
    bytes in."""
    NB: gl.constexpr = x.shape[0]
    v = x.to(gl.float32)
    if HAS_PQS:
        v = (v * pqs).to(COMPUTE).to(gl.float32)
    even, odd = gl.split(gl.reshape(v * aq, [NB, 32, 2, 2]))  # inputs (0, 2) and (1, 3) of each word
    x0, x2 = gl.split(even)
    x1, x3 = gl.split(odd)
    w = gl.inline_asm_elementwise(_E4M3_WORD, "=r,f,f,f,f", [x0, x1, x2, x3], dtype=gl.int32, is_pure=True, pack=1)
    bx[0].store(word_bytes(w))
    bx[1].store(word_bytes(w ^ SIGNS))


@gluon.jit
def _consumer(bufs, bufs2, ready, empty, k_iters, inputs, GLU: gl.constexpr, HALF: gl.constexpr, NB: gl.constexpr,
              STAGES: gl.constexpr, PDL: gl.constexpr, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr,
              PREFETCH: gl.constexpr):
    x_ptr, pqs_ptr, aq_ptr, pqs2_ptr, aq2_ptr, M, stride_x, k0, bx, bx2 = inputs
    L: gl.constexpr = words_layout(HALF)
    if PDL:  # x is the previous kernel's output; this one's outputs are read by the kernels before it
        gdc_wait()
        gdc_launch_dependents()
    k_end = k0 + k_iters
    aq = gl.load(aq_ptr)
    aq2 = gl.load(aq2_ptr)
    # PREFETCH: the next tile's rows and scales are loaded while this tile's lookups and MMAs run (after the stage's
    # fences: a fence waits for the loads before it)
    nx, np1, np2 = staged_inputs(x_ptr, pqs_ptr, pqs2_ptr, k0, k_end, M, stride_x, NB, HAS_PQS, GLU)
    acc = gl.zeros([2 * HALF, NB], gl.float32, mma_layout(NB))
    acc2 = acc
    for i in range(k_iters):
        if PREFETCH:
            x, p1, p2 = nx, np1, np2
        else:
            x, p1, p2 = staged_inputs(x_ptr, pqs_ptr, pqs2_ptr, k0 + i, k_end, M, stride_x, NB, HAS_PQS, GLU)
        gl.thread_barrier()  # the last tile's MMAs done with the B buffers
        _stage_input(x, p1, aq, bx, HAS_PQS, COMPUTE)
        if GLU:  # the gate's own pre-quant and activation scales
            _stage_input(x, p2, aq2, bx2, HAS_PQS, COMPUTE)
        fence_async_shared()  # the B stores before the tensor cores read them
        gl.thread_barrier()
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        w = bufs[0].index(s).load(L)
        tabs = stage_tables(bufs[1], s, L, HALF)
        if GLU:
            w2 = bufs2[0].index(s).load(L)
            tabs2 = stage_tables(bufs2[1], s, L, HALF)
        fence_async_shared()  # the reads ordered before the copy engine's next writes to the stage
        mbarrier.arrive(empty.index(s), count=1)
        if PREFETCH:
            nx, np1, np2 = staged_inputs(x_ptr, pqs_ptr, pqs2_ptr, k0 + i + 1, k_end, M, stride_x, NB, HAS_PQS, GLU)
        if PREFETCH:  # (and both chains of a tile before one wait: the staged form's latency hiding, one switch)
            acc = _async_tile(w, tabs, bx, acc)
            if GLU:
                acc2 = _async_tile(w2, tabs2, bx2, acc2)
        else:
            acc = tile(w, tabs, bx, acc)
            if GLU:
                acc2 = tile(w2, tabs2, bx2, acc2)
    return acc, acc2


@gluon.jit
def _w4a8_rows_mma_kernel(
    w_desc, t_desc, w2_desc, t2_desc, x_ptr, pqs_ptr, aq_ptr, osc_ptr, pqs2_ptr, aq2_ptr, osc2_ptr, out_ptr,
    M, N, k_tiles, per_split, stride_x, stride_os, stride_om,
    GLU: gl.constexpr, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr, HALF: gl.constexpr, NB: gl.constexpr,
    STAGES: gl.constexpr, PDL: gl.constexpr, PREFETCH: gl.constexpr, num_warps: gl.constexpr,
):
    descs = (w_desc, t_desc)
    descs2 = (w2_desc, t2_desc)
    bufs = (gl.allocate_shared_memory(gl.int32, [STAGES, HALF, 32], w_desc.layout),
            gl.allocate_shared_memory(gl.int32, [STAGES, 4, HALF], t_desc.layout))
    bx = (gl.allocate_shared_memory(gl.float8e4nv, [NB, 128], B_LAYOUT),
          gl.allocate_shared_memory(gl.float8e4nv, [NB, 128], B_LAYOUT))
    bufs2 = bufs
    bx2 = bx
    if GLU:
        bufs2 = (gl.allocate_shared_memory(gl.int32, [STAGES, HALF, 32], w2_desc.layout),
                 gl.allocate_shared_memory(gl.int32, [STAGES, 4, HALF], t2_desc.layout))
        bx2 = (gl.allocate_shared_memory(gl.float8e4nv, [NB, 128], B_LAYOUT),
               gl.allocate_shared_memory(gl.float8e4nv, [NB, 128], B_LAYOUT))
    ready, empty = stage_barriers(STAGES)
    pid_s = gl.program_id(1)
    row0, k0, k_iters = program_tiles(per_split, k_tiles, HALF)
    NBYTES: gl.constexpr = (w_desc.block_type.nbytes + t_desc.block_type.nbytes) * (2 if GLU else 1)
    inputs = (x_ptr, pqs_ptr, aq_ptr, pqs2_ptr, aq2_ptr, M, stride_x, k0, bx, bx2)
    acc, acc2 = gl.warp_specialize([
        (_consumer, (bufs, bufs2, ready, empty, k_iters, inputs, GLU, HALF, NB, STAGES, PDL, HAS_PQS, COMPUTE,
                     PREFETCH)),
        (box_producer, (descs, descs2, bufs, bufs2, ready, empty, row0, k0, k_iters, BOXES, 2, GLU, STAGES, PDL,
                        NBYTES)),
    ], [1], [40])
    _store(acc, acc2, osc_ptr, osc2_ptr, out_ptr, row0, M, N, pid_s, stride_os, stride_om, GLU, COMPUTE)


@gluon.jit
def _store(acc, acc2, osc_ptr, osc2_ptr, out_ptr, row0, M, N, pid_s, stride_os, stride_om, GLU: gl.constexpr,
           COMPUTE: gl.constexpr):
    """The accumulators [2 HALF, NB] times ``out_scale`` into the float32 partials, or the GLU's silu(fc) * gate:
    MMA row m = 64 b + 16 w + 8 h + g is output row 2 (row0 + 32 b + 8 w + g) + h, column n the input row n."""
    MMA: gl.constexpr = acc.type.layout
    m = gl.expand_dims(gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, MMA)), 1)
    n = gl.expand_dims(gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, MMA)), 0)
    rows = 2 * (row0 + 32 * (m // 64) + 8 * ((m // 16) % 4) + m % 8) + (m // 8) % 2
    ok = (rows < N) & (n < M)
    y = acc * gl.load(osc_ptr)
    if GLU:
        gl.store(out_ptr + n * stride_om + rows, silu_mul(y, acc2 * gl.load(osc2_ptr), COMPUTE), mask=ok)
    else:
        gl.store(out_ptr + pid_s * stride_os + n * stride_om + rows, y, mask=ok)


# ------------------------------------------------------------------------------------------ wide: the input made once


# the wide kernel's boxes (box_producer): the words and tables, then the made input's [0, 128 kt] of both signs
WIDE_BOXES = gl.constexpr(BOXES.value + ((0, 0, 0, 0, 128, 0),) * 2)


@gluon.jit
def _wide_consumer(bufs, bufs2, ready, empty, k_iters, GLU: gl.constexpr, HALF: gl.constexpr, NB: gl.constexpr,
                   STAGES: gl.constexpr, PDL: gl.constexpr):
    L: gl.constexpr = words_layout(HALF)
    if PDL:  # (its wait is the producer's: every input copy follows it, and the MMAs follow the copies)
        gdc_launch_dependents()
    acc = gl.zeros([2 * HALF, NB], gl.float32, mma_layout(NB))
    acc2 = acc
    for i in range(k_iters):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        w = bufs[0].index(s).load(L)
        tabs = stage_tables(bufs[1], s, L, HALF)
        acc = _async_tile(w, tabs, (bufs[2].index(s), bufs[3].index(s)), acc)
        if GLU:
            w2 = bufs2[0].index(s).load(L)
            tabs2 = stage_tables(bufs2[1], s, L, HALF)
            acc2 = _async_tile(w2, tabs2, (bufs2[2].index(s), bufs2[3].index(s)), acc2)
        fence_async_shared()  # the stage's reads (words, tables; the MMAs have returned) before the next copies
        mbarrier.arrive(empty.index(s), count=1)
    if PDL:  # (a program without K tiles copied nothing: its stores still wait for the kernels before)
        gdc_wait()
    return acc, acc2


@gluon.jit
def _wide_buffers(descs, HALF: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr):
    return (gl.allocate_shared_memory(gl.int32, [STAGES, HALF, 32], descs[0].layout),
            gl.allocate_shared_memory(gl.int32, [STAGES, 4, HALF], descs[1].layout),
            gl.allocate_shared_memory(gl.float8e4nv, [STAGES, NB, 128], descs[2].layout),
            gl.allocate_shared_memory(gl.float8e4nv, [STAGES, NB, 128], descs[3].layout))


@gluon.jit
def _w4a8_rows_wide_kernel(
    w_desc, t_desc, x_desc, xn_desc, w2_desc, t2_desc, x2_desc, xn2_desc, osc_ptr, osc2_ptr, out_ptr,
    M, N, k_tiles, per_split, stride_os, stride_om,
    GLU: gl.constexpr, COMPUTE: gl.constexpr, HALF: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr,
    PDL: gl.constexpr, num_warps: gl.constexpr,
):
    descs = (w_desc, t_desc, x_desc, xn_desc)
    descs2 = (w2_desc, t2_desc, x2_desc, xn2_desc)
    bufs = _wide_buffers(descs, HALF, NB, STAGES)
    bufs2 = bufs
    if GLU:
        bufs2 = _wide_buffers(descs2, HALF, NB, STAGES)
    ready, empty = stage_barriers(STAGES)
    pid_s = gl.program_id(1)
    row0, k0, k_iters = program_tiles(per_split, k_tiles, HALF)
    NBYTES: gl.constexpr = ((w_desc.block_type.nbytes + t_desc.block_type.nbytes + 2 * x_desc.block_type.nbytes)
                            * (2 if GLU else 1))
    acc, acc2 = gl.warp_specialize([
        (_wide_consumer, (bufs, bufs2, ready, empty, k_iters, GLU, HALF, NB, STAGES, PDL)),
        (box_producer, (descs, descs2, bufs, bufs2, ready, empty, row0, k0, k_iters, WIDE_BOXES, 2, GLU, STAGES, PDL,
                        NBYTES)),
    ], [1], [40])
    _store(acc, acc2, osc_ptr, osc2_ptr, out_ptr, row0, M, N, pid_s, stride_os, stride_om, GLU, COMPUTE)


# ------------------------------------------------------------------------------------------ launch


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool):
    """quant_gemm.launch's contract for this kernel's configs (``cfg.lut_mma``, W4A8-AWQ): ``x`` [M, K] in the compute
    dtype before the pre-quant scale; ``out`` [splits, M, N] (or [M, N], one split) float32 partials, or with ``q2``
    (the GLU's gate, K not split) [M, N] in the compute dtype. The wide form (``cfg.made``: from 17 rows) is two
    launches: ``made_input.w4a8``, then the wide kernel."""
    glu = q2 is not None
    m = x.shape[0]
    assert supported(q, m) and cfg.block_k == 128 and x.stride(1) == 1 and m <= cfg.block_m
    assert q.weight.is_contiguous() and out.stride(-1) == 1
    q = quant_gemv_w4a8_mma.with_tables(q)
    q2 = quant_gemv_w4a8_mma.with_tables(q2) if glu else q
    assert (q2.pqs is None) == (q.pqs is None)
    half = cfg.block_n // 2
    k_tiles = q.k // 128
    splits = 1 if glu else cfg.splits  # (a split past the last K tile writes zeros: every partial is written)
    per_split = triton.cdiv(k_tiles, splits)
    partials = not glu and out.dim() == 3
    strides = (m, q.n, k_tiles, per_split)
    out_strides = (out.stride(0) if partials else 0, out.stride(-2))
    common = dict(GLU=glu, COMPUTE=tl_dtype(compute), HALF=half, NB=cfg.block_m, STAGES=cfg.num_stages, PDL=pdl,
                  num_warps=cfg.num_warps, launch_pdl=pdl)
    grid = (triton.cdiv(q.n // 2, half), splits)
    if cfg.made:
        made = made_input.w4a8(x, q, q2 if glu else None, compute, pdl)
        descs = _wide_descriptors(q, made[0], half, cfg.block_m)
        descs2 = _wide_descriptors(q2, made[-1], half, cfg.block_m)
        return _w4a8_rows_wide_kernel[grid](*descs, *descs2, q.out_scale, q2.out_scale, out, *strides, *out_strides,
                                            maxnreg=WIDE_REGISTERS, **common)
    descs = quant_gemv_w4a8_mma.descriptors(q, half) + quant_gemv_w4a8_mma.descriptors(q2, half)
    return _w4a8_rows_mma_kernel[grid](
        *descs, x, q.pqs if q.pqs is not None else x, q.act_q, q.out_scale,
        q2.pqs if q2.pqs is not None else x, q2.act_q, q2.out_scale, out, *strides, x.stride(0),
        *out_strides, HAS_PQS=q.pqs is not None, PREFETCH=cfg.prefetch, maxnreg=MAX_REGISTERS, **common)


def _wide_descriptors(q, made: torch.Tensor, half: int, nb: int) -> list:
    """The wide kernel's four copy descriptors for one matrix: its words and tables, and ``made`` [2, M, K] (the
    input and its negation) in [NB, 128] boxes (rows past M are read as zeros)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = B_LAYOUT.value
    signs = [TensorDescriptor.from_tensor(made[j].view(torch.float8_e4m3fn), [nb, 128], layout) for j in (0, 1)]
    return quant_gemv_w4a8_mma.descriptors(q, half) + signs
