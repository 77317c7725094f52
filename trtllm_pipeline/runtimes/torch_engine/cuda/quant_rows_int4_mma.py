"""INT4-AWQ at 2-16 input rows: the weights dequantized in registers into ``wgmma``'s A operand (Gluon, Hopper).

quant_gemm's GEMM at 8 rows is issue-bound in its dequantization (the 7B's GLU at M 8 49-58 us where the batch-1 GEMV
reads the same bytes in 30: docs/perf-notes.md), and the batch-1 GEMV's dp4a costs grow with every row. Here the
batch is the MMA's N (8 or 16 columns of B) and costs nothing per weight, and each weight costs its dequantization:

* A warp's 16 MMA rows are the even (g) and odd (g + 8) rows of 8 packed rows (quant_gemv_w4a8_mma's mapping), so a
  packed word of the checkpoint (two rows' nibbles at four inputs) is exactly a lane's A fragment at one 16-input
  chunk: ``(w & 0x000F000F) ^ 8 | 0x4300`` per bfloat16 half (one LOP3 from two constant registers) is 136 + q for
  inputs 0 and 2 of the word's even row, the same of ``w >> 8`` for inputs 1 and 3, of ``w >> 4`` and ``w >> 12`` for
  the odd row. The MMA's inputs are numbered so that these pairs are the fragment's (0, 2 | 1, 3 of each word), and
  the input rows are written to B in that order (``_stage_input``; with ``LinearConfig.prefetch`` loaded one K tile
  ahead, quant_rows_w4a8_mma's). Each K tile (one scale group) is multiplied from
  zero; its float32 result less 136 x each input row's sum over the tile, times the rows' group scales, is added into
  the accumulators: ``s (q x)`` where eager multiplies x by its bfloat16 rounding of ``q s`` (that rounding's
  difference, 2^-9 of a weight, and float32's on the offset: ~2^-24 x 136 of the inputs' sum). The dequantization is a
  LOP3 and 3/4 of a shift a pair: under an instruction a weight whatever the batch.
* quant_gemv_ws's producer warp copies each K tile's packed words and 16-bit group scales into stages; the consumer
  warps write each tile's input rows (times their pre-quant scale, rounded to the compute dtype) into a K-major
  B buffer, then dequantize and issue the MMAs; float32 accumulators across K.

From 17 rows (the MMA's N 32 or 64) every program staging the same rows would cost more than its dequantization:
there ``made_input.int4`` (one small kernel) writes the rows once, times their pre-quant scale in the compute dtype
and in the MMA's input order, and the producer warp copies the tile's two [NB, 64] halves beside the words and scales
(quant_gemv_ws.box_producer; rows past M read as zeros); the consumers only dequantize and issue the MMAs. There each
weight is made bfloat16(q s) in registers (``_SCALED``: the LOP3's 136 + q, less 136, times the row's scale: one
rounding, eager's weight), so the MMAs chain on the accumulators across K with no per-tile result to scale and add
(at N 64 that result's registers and its float32 sums were a third of the loop), and a program takes 128 output rows
in 168 registers: each copied input row serves twice the weights (at 64 rows the input's boxes are 16 KB a tile
against 4 KB of words at 64 output rows). ``LinearConfig.scale_weights`` False: the offset form above, with each
tile's [1, NB] sums of 136 x the rows copied too, 64 output rows a program (the first one timed, H100 2026-12-08).

Output: quant_gemm.launch's contract (float32 split-K partials [splits, M, N], or the GLU's ``silu(fc) * gate``
[M, N] in the compute dtype, K not split). Gluon kernels do not run in Triton's interpreter: the CPU tests compile this
one for sm_90 (``tools/gemv_sass.py --int4-mma``; ``made_input`` runs in the interpreter). Correct on an H100 but
slower than quant_gemm's GEMM in the step (benchmarks/results/h100-2026-12-08: batch 8 / 16 / 64 5.159 / 6.244 /
9.606 ms against 4.459 / 5.415 / 9.087), so the decode step takes it only at batch 2..N (N at most 64) under
``TRTLLM_PIPELINE_INT4_WGMMA_ROWS=N``.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                warpgroup_mma_wait)
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import made_input, quant_gemv_w4a8_ws, quant_gemv_ws, support
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_w4a8_mma import words_layout
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_ws import (PLAIN, PLAIN16, W_LAYOUT, box_producer,
                                                                      program_tiles, stage_barriers, staged_inputs,
                                                                      weight_boxes)

ENV = "TRTLLM_PIPELINE_INT4_WGMMA_ROWS"
MAX_ROWS = 64
STAGED_ROWS = 16  # up to this many rows each program stages its input (support.staged_rows); beyond, made_input
MAX_REGISTERS, WIDE_REGISTERS = 128, 168
STAGES, GLU_STAGES, WIDE_GLU_STAGES = 3, 2, 2
# output rows a program: 128 (the staged GLU too, as W4A8's: 51.7 us at 8 rows on an H100 against 70.5 at 64 rows and
# three stages, 2026-12-08; INT4's not yet timed so); the wide form 128 with each weight scaled in registers (its
# accumulators chain across K: the registers of a per-tile result are free), 64 with the per-tile offset and scale
BLOCK_N, GLU_BLOCK_N, WIDE_BLOCK_N, OFFSET_WIDE_BLOCK_N = 128, 128, 128, 64
NIBBLES = gl.constexpr(0x000F000F)  # each bfloat16 half's low nibble
MAGIC = gl.constexpr(0x43084308)  # where the mask is set: the nibble's XOR 8; elsewhere: bfloat16 128's bits
BOXES = gl.constexpr(weight_boxes(2))  # a K tile's packed words and 16-bit scales (even, odd rows)


def enabled(m: int) -> bool:
    """Whether ``$TRTLLM_PIPELINE_INT4_WGMMA_ROWS`` (a batch size N; 0 or unset: off) asks for this kernel at ``m``."""
    return support.rows_switch(ENV, MAX_ROWS, "the INT4 register-dequantizing wgmma kernel", m)


def supported(q, m: int) -> bool:
    """INT4-AWQ at 2..MAX_ROWS rows of a bfloat16 engine (its 16-bit scales are in the compute dtype) on a Hopper GPU,
    128-input tiles of one scale group."""
    if q.fmt != "int4_awq" or not 2 <= m <= MAX_ROWS or getattr(q, "scales16", None) is None:
        return False
    return (q.scales16.dtype == torch.bfloat16 and quant_gemv_ws.fits(q, WIDE_BLOCK_N)
            and q.weight.device.type == "cuda" and torch.cuda.get_device_capability(q.weight.device) >= (9, 0))


def pick_config(q, m: int, sm_count: int, *, glu: bool = False, splits: int | None = None,
                block_n: int | None = None) -> LinearConfig:
    """128 output rows x 128 inputs, the MMA's N the next of 8, 16, 32, 64 for ``m`` rows, quant_gemv_w4a8_ws's K
    split rule, ``STAGES`` deep (the GLUs two: two matrices' words, the wide one its input boxes too); from 17 rows
    the wide form, each weight scaled in registers (``scale_weights``; False: the per-tile offset and scale, 64 rows
    a program)."""
    nb = max(8, triton.next_power_of_2(m))
    wide = nb > support.staged_rows(STAGED_ROWS)
    block_n = block_n or (WIDE_BLOCK_N if wide else GLU_BLOCK_N if glu else BLOCK_N)
    splits = 1 if glu else splits or quant_gemv_w4a8_ws.split_rule(q, sm_count, block_n)
    stages = (WIDE_GLU_STAGES if wide else GLU_STAGES) if glu else STAGES
    return LinearConfig(nb, block_n, 128, splits, 4, stages, gemm=True, tma=True, ws=True, lut_mma=True, made=wide,
                        prefetch=not wide and support.staged_prefetch(), scale_weights=wide)


# ------------------------------------------------------------------------------------------ layouts


@gluon.constexpr_function
def _mma_layout(nb):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, nb, 16])


@gluon.constexpr_function
def _operand_layout(nb):
    return gl.DotOperandLayout(operand_index=0, parent=_mma_layout(nb), k_width=2)


@gluon.constexpr_function
def _b_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


# ------------------------------------------------------------------------------------------ dequantization


@gluon.jit
def _lop(v):
    """Per bfloat16 half: the low nibble XOR 8 in bfloat16 128's mantissa: 136 + q (one LOP3: b ? a ^ c : c)."""
    return gl.inline_asm_elementwise("lop3.b32 $0, $1, $2, $3, 0x6A;", "=r,r,r,r",
                                     [v, gl.full_like(v, NIBBLES), gl.full_like(v, MAGIC)], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _pairs(v):
    """The bfloat16 pair (136 + q, 136 + q') of the nibbles in bits 0-3 and 16-19 of ``v`` (``_lop``)."""
    return _lop(v)


# per bfloat16 half: 136 + q (``_lop``), less 136 (exact), times the row's group scale s: bfloat16(q s), one rounding,
# the weight eager multiplies (``$2``: the row's scale in both halves)
_SCALED = gl.constexpr("""{ .reg .b32 t, c;
lop3.b32 t, $1, $3, $4, 0x6A;
mov.b32 c, 0x43084308;
sub.rn.bf16x2 t, t, c;
mul.rn.bf16x2 $0, t, $2; }""")


@gluon.jit
def _scaled_pairs(v, scale):
    """The bfloat16 pair (q s, q' s) of the nibbles in bits 0-3 and 16-19 of ``v``: three instructions a pair."""
    return gl.inline_asm_elementwise(_SCALED, "=r,r,r,r,r", [v, gl.broadcast(scale, v)[0], gl.full_like(v, NIBBLES),
                                                            gl.full_like(v, MAGIC)], dtype=gl.int32, is_pure=True,
                                     pack=1)


@gluon.jit
def _half_words(w, h: gl.constexpr):
    """The words [HALF, 32] of the tile's first (h = 0) or second 64 inputs, [HALF, 16]."""
    half: gl.constexpr = w.shape[0]
    lo, hi = gl.split(gl.permute(gl.reshape(w, [half, 2, 16]), [0, 2, 1]))
    if h == 0:
        return lo
    return hi


@gluon.jit
def _operand(w, NB: gl.constexpr, scales=None):
    """A [2 HALF, 64] bfloat16 of 136 + q (or with ``scales``, each packed row's even and odd rows' scale pairs
    [HALF, 1] (``_scale_pairs``), of q s) in the wgmma operand's layout from packed words [HALF, 16] (64 inputs): MMA
    row 64 b + 16 w + 8 p + g is row parity p of packed row 32 b + 8 w + g; MMA input 16 c + 8 j + 2 t + i of the chunk
    c is input 16 c + 4 t + 2 i + j (``_stage_input`` writes B so)."""
    half: gl.constexpr = w.shape[0]
    nb: gl.constexpr = half // 32
    if scales is None:
        e02 = _pairs(w)
        e13 = _pairs(w >> 8)
        o02 = _pairs(w >> 4)
        o13 = _pairs(w >> 12)
    else:
        e02 = _scaled_pairs(w, scales[0])
        e13 = _scaled_pairs(w >> 8, scales[0])
        o02 = _scaled_pairs(w >> 4, scales[1])
        o13 = _scaled_pairs(w >> 12, scales[1])
    # pairs: (packed row, word = 4 c + t, j) -> pair index 8 c + 4 j + t
    even = gl.reshape(gl.permute(gl.reshape(gl.join(e02, e13), [half, 4, 4, 2]), [0, 1, 3, 2]), [half, 32])
    odd = gl.reshape(gl.permute(gl.reshape(gl.join(o02, o13), [half, 4, 4, 2]), [0, 1, 3, 2]), [half, 32])
    x = gl.reshape(gl.join(even, odd), [nb, 4, 8, 32, 2])  # (block, warp, g, pair, parity)
    x = gl.reshape(gl.permute(x, [0, 1, 4, 2, 3]), [2 * half, 32])
    x2 = gl.reshape(gl.join(x, x), [2 * half, 64])  # each pair for its two bfloat16 (one register: no instruction)
    a = gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r", [x2], dtype=gl.bfloat16, is_pure=True, pack=2)
    return gl.convert_layout(a, _operand_layout(NB), assert_trivial=True)


@gluon.jit
def _row_scales(s_bufs, s, HALF: gl.constexpr, NB: gl.constexpr):
    """Stage ``s``'s group scales of the even and odd rows as float32 [2 HALF, 1] by MMA row (``_operand``'s order)."""
    ONE: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    VEC: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    sb = s_bufs.index(s)._reinterpret(gl.bfloat16, [2 * HALF], VEC)
    even = sb.slice(0, HALF).load(ONE).to(gl.float32)
    odd = sb.slice(HALF, HALF).load(ONE).to(gl.float32)
    v = gl.reshape(gl.join(even, odd), [HALF // 32, 4, 8, 2])  # (block, warp, g, parity)
    v = gl.reshape(gl.permute(v, [0, 1, 3, 2]), [2 * HALF])
    return gl.expand_dims(gl.convert_layout(v, gl.SliceLayout(1, _mma_layout(NB))), 1)


@gluon.jit
def _scale_pairs(s_bufs, s, LAYOUT: gl.constexpr):
    """Stage ``s``'s group scales of the even and odd rows [HALF, 1] each, every bfloat16 in both halves of an int32
    (``_scaled_pairs``' operand), in ``LAYOUT`` (the packed words' [HALF, 16] of ``_half_words``)."""
    HALF: gl.constexpr = s_bufs.shape[2]
    VEC: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    sb = s_bufs.index(s)._reinterpret(gl.bfloat16, [2 * HALF], VEC)
    ROWS: gl.constexpr = gl.SliceLayout(1, LAYOUT)
    even = sb.slice(0, HALF).load(ROWS).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    odd = sb.slice(HALF, HALF).load(ROWS).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    return gl.expand_dims(even | (even << 16), 1), gl.expand_dims(odd | (odd << 16), 1)


@gluon.jit
def _stage_input(x, pqs, b_buf, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr):
    """A K tile of the input rows ``x`` [NB, 128] (quant_gemv_ws.input_rows) times the pre-quant scales ``pqs``,
    rounded to the compute dtype, into the K-major B buffer [NB, 128] in the MMA's input order: MMA input 16 c + 8 j +
    2 t + i is input 16 c + 4 t + 2 i + j (a lane's pairs of ``_operand``). Four inputs a thread; the order is a
    relabelling of them. Returns 136 x each row's sum over the tile [NB] (the accumulators' column layout)."""
    NB: gl.constexpr = x.shape[0]
    if HAS_PQS:
        x = (x.to(gl.float32) * pqs).to(COMPUTE)
    b_buf.store(gl.reshape(gl.permute(gl.reshape(x, [NB, 8, 4, 2, 2]), [0, 1, 4, 2, 3]), [NB, 128]))
    # (row, chunk c, t, input bit 1 = i, input bit 0 = j) -> MMA input order; and 136 x each row's sum, what the
    # weights' offset adds to the tile's products (float32 of the bfloat16 values the MMA multiplies)
    return gl.convert_layout(gl.sum(x.to(gl.float32), axis=1) * 136.0, gl.SliceLayout(0, _mma_layout(NB)))


# ------------------------------------------------------------------------------------------ the two partitions


@gluon.jit
def _tile(w, scales, b_lo, b_hi, offset, acc, NB: gl.constexpr):
    """One K tile into the float32 accumulators: the MMAs of 136 + q over B's two 128-byte halves (``b_lo``,
    ``b_hi``: [NB, 64] K-major, 64 inputs each), from zero, less ``offset`` (136 x each input row's sum), times the
    rows' group scales."""
    a_lo = _operand(_half_words(w, 0), NB)
    part = warpgroup_mma(a_lo, b_lo.permute((1, 0)), gl.zeros_like(acc), use_acc=False, is_async=True)
    a_hi = _operand(_half_words(w, 1), NB)  # (made while the first half's MMAs run)
    part = warpgroup_mma(a_hi, b_hi.permute((1, 0)), part, is_async=True)
    part, a_lo, a_hi = warpgroup_mma_wait(0, deps=[part, a_lo, a_hi])
    return acc + (part - gl.expand_dims(offset, 0)) * scales


@gluon.jit
def _scaled_tile(w, s_bufs, s, b_lo, b_hi, acc, NB: gl.constexpr):
    """One K tile added into the float32 accumulators with each weight made bfloat16(q s) in registers
    (``_scaled_pairs``): the tile's MMAs chain on the accumulators, no tile result of its own to scale and add."""
    lo = _half_words(w, 0)
    WORDS: gl.constexpr = lo.type.layout
    scales = _scale_pairs(s_bufs, s, WORDS)
    a_lo = _operand(lo, NB, scales)
    acc = warpgroup_mma(a_lo, b_lo.permute((1, 0)), acc, is_async=True)
    a_hi = _operand(_half_words(w, 1), NB, scales)  # (made while the first half's MMAs run)
    acc = warpgroup_mma(a_hi, b_hi.permute((1, 0)), acc, is_async=True)
    acc, a_lo, a_hi = warpgroup_mma_wait(0, deps=[acc, a_lo, a_hi])
    return acc


@gluon.jit
def _consumer(bufs, bufs2, ready, empty, k_iters, inputs, GLU: gl.constexpr, HALF: gl.constexpr, NB: gl.constexpr,
              STAGES: gl.constexpr, PDL: gl.constexpr, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr,
              PREFETCH: gl.constexpr):
    x_ptr, pqs_ptr, pqs2_ptr, M, stride_x, k0, b_buf, b_buf2 = inputs
    L: gl.constexpr = words_layout(HALF)
    if PDL:  # x is the previous kernel's output; this one's outputs are read by the kernels before it
        gdc_wait()
        gdc_launch_dependents()
    k_end = k0 + k_iters
    # PREFETCH: the next tile's rows and scales are loaded while this tile's MMAs run (quant_rows_w4a8_mma's)
    nx, np1, np2 = staged_inputs(x_ptr, pqs_ptr, pqs2_ptr, k0, k_end, M, stride_x, NB, HAS_PQS, GLU)
    acc = gl.zeros([2 * HALF, NB], gl.float32, _mma_layout(NB))
    acc2 = acc
    for i in range(k_iters):
        if PREFETCH:
            x, p1, p2 = nx, np1, np2
        else:
            x, p1, p2 = staged_inputs(x_ptr, pqs_ptr, pqs2_ptr, k0 + i, k_end, M, stride_x, NB, HAS_PQS, GLU)
        gl.thread_barrier()  # the last tile's MMAs done with the B buffers
        offset = _stage_input(x, p1, b_buf, HAS_PQS, COMPUTE)
        offset2 = offset
        if GLU:  # the gate's own pre-quant scale
            offset2 = _stage_input(x, p2, b_buf2, HAS_PQS, COMPUTE)
        fence_async_shared()  # the B stores before the tensor cores read them
        gl.thread_barrier()
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        w = bufs[0].index(s).load(L)
        scales = _row_scales(bufs[1], s, HALF, NB)
        if GLU:
            w2 = bufs2[0].index(s).load(L)
            scales2 = _row_scales(bufs2[1], s, HALF, NB)
        fence_async_shared()  # the reads ordered before the copy engine's next writes to the stage
        mbarrier.arrive(empty.index(s), count=1)
        if PREFETCH:
            nx, np1, np2 = staged_inputs(x_ptr, pqs_ptr, pqs2_ptr, k0 + i + 1, k_end, M, stride_x, NB, HAS_PQS, GLU)
        acc = _tile(w, scales, b_buf.slice(0, 64, dim=1), b_buf.slice(64, 64, dim=1), offset, acc, NB)
        if GLU:
            acc2 = _tile(w2, scales2, b_buf2.slice(0, 64, dim=1), b_buf2.slice(64, 64, dim=1), offset2, acc2, NB)
    return acc, acc2


@gluon.jit
def _int4_rows_mma_kernel(
    w_desc, s_desc, w2_desc, s2_desc, x_ptr, pqs_ptr, pqs2_ptr, out_ptr,
    M, N, k_tiles, per_split, stride_x, stride_os, stride_om,
    GLU: gl.constexpr, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr, HALF: gl.constexpr, NB: gl.constexpr,
    STAGES: gl.constexpr, PDL: gl.constexpr, PREFETCH: gl.constexpr, num_warps: gl.constexpr,
):
    descs = (w_desc, s_desc)
    descs2 = (w2_desc, s2_desc)
    bufs = (gl.allocate_shared_memory(gl.int32, [STAGES, HALF, 32], w_desc.layout),
            gl.allocate_shared_memory(gl.bfloat16, [STAGES, 2, HALF], s_desc.layout))
    b_buf = gl.allocate_shared_memory(gl.bfloat16, [NB, 128], _b_layout())
    bufs2 = bufs
    b_buf2 = b_buf
    if GLU:
        bufs2 = (gl.allocate_shared_memory(gl.int32, [STAGES, HALF, 32], w2_desc.layout),
                 gl.allocate_shared_memory(gl.bfloat16, [STAGES, 2, HALF], s2_desc.layout))
        b_buf2 = gl.allocate_shared_memory(gl.bfloat16, [NB, 128], _b_layout())
    ready, empty = stage_barriers(STAGES)
    pid_s = gl.program_id(1)
    row0, k0, k_iters = program_tiles(per_split, k_tiles, HALF)
    NBYTES: gl.constexpr = (w_desc.block_type.nbytes + s_desc.block_type.nbytes) * (2 if GLU else 1)
    inputs = (x_ptr, pqs_ptr, pqs2_ptr, M, stride_x, k0, b_buf, b_buf2)
    acc, acc2 = gl.warp_specialize([
        (_consumer, (bufs, bufs2, ready, empty, k_iters, inputs, GLU, HALF, NB, STAGES, PDL, HAS_PQS, COMPUTE,
                     PREFETCH)),
        (box_producer, (descs, descs2, bufs, bufs2, ready, empty, row0, k0, k_iters, BOXES, 2, GLU, STAGES, PDL,
                        NBYTES)),
    ], [1], [40])
    _store(acc, acc2, out_ptr, row0, M, N, pid_s, stride_os, stride_om, GLU, COMPUTE)


@gluon.jit
def _store(acc, acc2, out_ptr, row0, M, N, pid_s, stride_os, stride_om, GLU: gl.constexpr, COMPUTE: gl.constexpr):
    """The accumulators [2 HALF, NB] into the float32 partials, or the GLU's silu(fc) * gate: MMA row m = 64 b + 16 w
    + 8 p + g is output row 2 (row0 + 32 b + 8 w + g) + p, column n the input row n."""
    MMA: gl.constexpr = acc.type.layout
    m = gl.expand_dims(gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, MMA)), 1)
    n = gl.expand_dims(gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, MMA)), 0)
    rows = 2 * (row0 + 32 * (m // 64) + 8 * ((m // 16) % 4) + m % 8) + (m // 8) % 2
    ok = (rows < N) & (n < M)
    if GLU:
        gl.store(out_ptr + n * stride_om + rows, silu_mul(acc, acc2, COMPUTE), mask=ok)
    else:
        gl.store(out_ptr + pid_s * stride_os + n * stride_om + rows, acc, mask=ok)


# ------------------------------------------------------------------------------------------ wide: the input made once


# the wide kernel's boxes (box_producer): the words and scales, then the made input's two 64-input halves of the
# tile and its row sums
WIDE_BOXES = gl.constexpr(BOXES.value + ((0, 0, 0, 0, 128, 0), (0, 0, 0, 0, 128, 64), (0, 1, 0, 0, 0, 0)))
SCALED_BOXES = gl.constexpr(WIDE_BOXES.value[:-1])  # the scale on each weight: no row sums to copy


@gluon.constexpr_function
def sums_columns(nb):
    """Columns of the row sums' box and stage for ``nb`` rows: at least 32 floats, so that every stage's copy lands
    at a 128-byte boundary (the copy engine's alignment; 8 or 16 columns gave a misaligned address on an H100,
    2026-12-08)."""
    return max(nb, 32)


@gluon.jit
def _stage_offsets(o_bufs, s, NB: gl.constexpr):
    """Stage ``s``'s 136 x row sums [NB] (the first of its ``sums_columns(NB)``), read straight in the accumulators'
    column layout."""
    VEC: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    row = o_bufs.index(s)._reinterpret(gl.float32, [sums_columns(NB)], VEC)
    return row.slice(0, NB).load(gl.SliceLayout(0, _mma_layout(NB)))


@gluon.jit
def _wide_tile(bufs, s, acc, L: gl.constexpr, HALF: gl.constexpr, NB: gl.constexpr, SCALED: gl.constexpr):
    """Stage ``s``'s K tile of one matrix into its accumulators: each weight scaled in registers (SCALED), or the
    tile's MMAs of 136 + q from zero, less the offset, times the scales (``_tile``)."""
    w = bufs[0].index(s).load(L)
    if SCALED:
        acc = _scaled_tile(w, bufs[1], s, bufs[2].index(s), bufs[3].index(s), acc, NB)
    else:
        acc = _tile(w, _row_scales(bufs[1], s, HALF, NB), bufs[2].index(s), bufs[3].index(s),
                    _stage_offsets(bufs[4], s, NB), acc, NB)
    return acc


@gluon.jit
def _wide_consumer(bufs, bufs2, ready, empty, k_iters, GLU: gl.constexpr, HALF: gl.constexpr, NB: gl.constexpr,
                   STAGES: gl.constexpr, PDL: gl.constexpr, SCALED: gl.constexpr):
    L: gl.constexpr = words_layout(HALF)
    if PDL:  # (its wait is the producer's: every input copy follows it, and the MMAs follow the copies)
        gdc_launch_dependents()
    acc = gl.zeros([2 * HALF, NB], gl.float32, _mma_layout(NB))
    acc2 = acc
    for i in range(k_iters):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = _wide_tile(bufs, s, acc, L, HALF, NB, SCALED)
        if GLU:
            acc2 = _wide_tile(bufs2, s, acc2, L, HALF, NB, SCALED)
        fence_async_shared()  # the stage's reads (the MMAs have returned) before the copy engine's next writes
        mbarrier.arrive(empty.index(s), count=1)
    if PDL:  # (a program without K tiles copied nothing: its stores still wait for the kernels before)
        gdc_wait()
    return acc, acc2


@gluon.jit
def _wide_buffers(descs, HALF: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr, SCALED: gl.constexpr):
    bufs = (gl.allocate_shared_memory(gl.int32, [STAGES, HALF, 32], descs[0].layout),
            gl.allocate_shared_memory(gl.bfloat16, [STAGES, 2, HALF], descs[1].layout),
            gl.allocate_shared_memory(gl.bfloat16, [STAGES, NB, 64], descs[2].layout),
            gl.allocate_shared_memory(gl.bfloat16, [STAGES, NB, 64], descs[3].layout))
    if not SCALED:
        bufs = bufs + (gl.allocate_shared_memory(gl.float32, [STAGES, 1, sums_columns(NB)], descs[4].layout),)
    return bufs


@gluon.jit
def _int4_rows_wide_kernel(
    w_desc, s_desc, lo_desc, hi_desc, o_desc, w2_desc, s2_desc, lo2_desc, hi2_desc, o2_desc, out_ptr,
    M, N, k_tiles, per_split, stride_os, stride_om,
    GLU: gl.constexpr, COMPUTE: gl.constexpr, HALF: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr,
    PDL: gl.constexpr, SCALED: gl.constexpr, num_warps: gl.constexpr,
):
    if SCALED:  # (no row sums: o_desc is not read)
        descs = (w_desc, s_desc, lo_desc, hi_desc)
        descs2 = (w2_desc, s2_desc, lo2_desc, hi2_desc)
    else:
        descs = (w_desc, s_desc, lo_desc, hi_desc, o_desc)
        descs2 = (w2_desc, s2_desc, lo2_desc, hi2_desc, o2_desc)
    bufs = _wide_buffers(descs, HALF, NB, STAGES, SCALED)
    bufs2 = bufs
    if GLU:
        bufs2 = _wide_buffers(descs2, HALF, NB, STAGES, SCALED)
    ready, empty = stage_barriers(STAGES)
    pid_s = gl.program_id(1)
    row0, k0, k_iters = program_tiles(per_split, k_tiles, HALF)
    NBYTES: gl.constexpr = ((w_desc.block_type.nbytes + s_desc.block_type.nbytes + 2 * lo_desc.block_type.nbytes
                             + (0 if SCALED else o_desc.block_type.nbytes)) * (2 if GLU else 1))
    BOX_LIST: gl.constexpr = SCALED_BOXES if SCALED else WIDE_BOXES
    acc, acc2 = gl.warp_specialize([
        (_wide_consumer, (bufs, bufs2, ready, empty, k_iters, GLU, HALF, NB, STAGES, PDL, SCALED)),
        (box_producer, (descs, descs2, bufs, bufs2, ready, empty, row0, k0, k_iters, BOX_LIST, 2, GLU, STAGES, PDL,
                        NBYTES)),
    ], [1], [40])
    _store(acc, acc2, out_ptr, row0, M, N, pid_s, stride_os, stride_om, GLU, COMPUTE)


# ------------------------------------------------------------------------------------------ launch


def _descriptors(q, half: int) -> list:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return [TensorDescriptor.from_tensor(q.weight.view(torch.int32), [half, 32], W_LAYOUT),
            TensorDescriptor.from_tensor(q.scales16.view(-1, q.n // 2), [2, half], PLAIN16)]


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool):
    """quant_gemm.launch's contract for this kernel's configs (``cfg.lut_mma``, INT4-AWQ): ``x`` [M, K] in the compute
    dtype before the pre-quant scale; ``out`` [splits, M, N] (or [M, N], one split) float32 partials, or with ``q2``
    (the GLU's gate, K not split) [M, N] in the compute dtype. The wide form (``cfg.made``: from 17 rows) is two
    launches: ``made_input.int4``, then the wide kernel."""
    glu = q2 is not None
    m = x.shape[0]
    assert supported(q, m) and compute == torch.bfloat16 and cfg.block_k == 128 and x.stride(1) == 1
    assert m <= cfg.block_m
    assert q.weight.is_contiguous() and out.stride(-1) == 1
    q2 = q2 or q
    assert (q2.pqs is None) == (q.pqs is None) and q2.scales16 is not None
    half = cfg.block_n // 2
    k_tiles = q.k // 128
    splits = 1 if glu else cfg.splits  # (a split past the last K tile writes zeros: every partial is written)
    per_split = triton.cdiv(k_tiles, splits)
    partials = not glu and out.dim() == 3
    shape = (m, q.n, k_tiles, per_split)
    out_strides = (out.stride(0) if partials else 0, out.stride(-2))
    common = dict(GLU=glu, COMPUTE=tl_dtype(compute), HALF=half, NB=cfg.block_m, STAGES=cfg.num_stages, PDL=pdl,
                  num_warps=cfg.num_warps, launch_pdl=pdl)
    grid = (triton.cdiv(q.n // 2, half), splits)
    if cfg.made:
        made, sums = made_input.int4(x, q, q2 if glu else None, compute, sums_columns(cfg.block_m), pdl,
                                     sums=not cfg.scale_weights)  # (the scaled form copies no sums: not made)
        descs = _descriptors(q, half) + _input_descriptors(made[0], sums[0], cfg.block_m)
        descs2 = _descriptors(q2, half) + _input_descriptors(made[-1], sums[-1], cfg.block_m)
        return _int4_rows_wide_kernel[grid](*descs, *descs2, out, *shape, *out_strides, SCALED=cfg.scale_weights,
                                            maxnreg=WIDE_REGISTERS, **common)
    descs = _descriptors(q, half) + _descriptors(q2, half)
    return _int4_rows_mma_kernel[grid](
        *descs, x, q.pqs if q.pqs is not None else x, q2.pqs if q2.pqs is not None else x, out,
        *shape, x.stride(0), *out_strides, HAS_PQS=q.pqs is not None, PREFETCH=cfg.prefetch, maxnreg=MAX_REGISTERS,
        **common)


def _input_descriptors(made: torch.Tensor, sums: torch.Tensor, nb: int) -> list:
    """The wide kernel's copy descriptors of one matrix's made input: ``made`` [M, K] in [NB, 64] boxes (both halves
    of a K tile; rows past M are read as zeros) and ``sums`` [K / 128, sums_columns(NB)] a row at a time."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    half = TensorDescriptor.from_tensor(made, [nb, 64], _b_layout())
    return [half, half, TensorDescriptor.from_tensor(sums, [1, sums_columns(nb)], PLAIN)]
