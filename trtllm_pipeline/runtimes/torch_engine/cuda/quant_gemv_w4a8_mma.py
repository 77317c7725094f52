"""W4A8-AWQ at batch 1 on the FP8 tensor cores: each nibble looked up as its E4M3 byte, then ``wgmma`` (Gluon, Hopper).

quant_gemv_w4a8_ws turns each nibble into a small integer by two PRMT, multiplies by the input's int16 planes with four
dp4a a word and rebuilds float32 per 16-input block: ~2.8 instructions a weight in its loop, issue-bound (the 7B's GLU
at 2.07 TB/s on an H100, where INT4's GEMV, 1.49 a weight, streams the same bytes at ~2.25; docs/perf-notes.md). Here
the lookup yields the weight's E4M3 byte itself and the tensor cores do the multiply-adds:

* A weight of W4A8 is ``E4M3(q x t)`` (t: the row's group step in units of scale_2, quant_linear): sign and magnitude.
  Per group and row the table holds the magnitudes ``T = [E(8t), E(t) .. E(7t)]`` (8 bytes; E(0) = 0), from which
  ``P = [0, E(t) .. E(7t)]`` and ``N = [E(8t), E(7t) .. E(t)]`` come as in quant_gemv_w4a8. ``PRMT(P, s)`` gives the
  magnitude where q >= 0 and 0 elsewhere (a selector's sign bit replicates a byte below 128), ``PRMT(N, s ^ 0x8888)``
  the magnitude where q < 0 and 0 elsewhere. The second is multiplied against the input with its sign bits flipped
  (``|w| (-x) = w x``), so no byte needs its sign set: 2 PRMT and a LOP3 a word and row parity, nothing to combine.
* ``wgmma.m64n8k32`` (E4M3 x E4M3, float32 accumulators) takes A from registers: a warp's 16 MMA rows are the even
  (g) and odd (g + 8) rows of 8 packed rows, so that one packed word's two lookups are a lane's two A rows at the same
  four inputs; the words arrive in that fragment's layout from the copy engine's swizzled stage (``words_layout``)
  and go to the operand's layout without moving (``convert_layout(..., assert_trivial=True)``, checked when it
  compiles). B is the input tile in shared memory, K-major, as row 0 of an [8, 128] buffer whose other rows stay zero
  (batch 1: the MMA's other 7 columns are idle; the tensor cores have time to spare).
* Each K tile's two MMA chains (q >= 0, q < 0) start from zero and are added into float32 accumulators: the FP8 tensor
  cores' accumulator keeps fewer bits than float32 (DeepSeek-V3's report, 3.3.2), so the sums are promoted every 128
  inputs, as there.
* The input: ``x * pre_quant_scale`` rounded to the compute dtype, E4M3 of that times the activation scale
  (quant_linear's ``_act_tile``), made once per program as bytes in shared memory by the consumer warps, each word's
  inputs in the order the lookup leaves a weight word's (0, 2, 1, 3: quant_gemv_w4a8's selectors).

quant_gemv_w4a8_ws's producer warp, stages and barriers, with the tables' box and no units. Products are exact; sums
are the tensor cores' per K tile, then float32 (the dp4a kernels' are exact per 16-input block), so results differ
from quant_gemv_w4a8's in rounding. Gluon kernels do not run in Triton's interpreter: the CPU tests compile this one
for sm_90 (``tools/gemv_sass.py --w4a8-mma``); ``benchmarks/w4a8_gemv.py`` (variant ``mma``) checks it against
float32 ``x @ W^T`` and the dot kernel on the GPU. Correct on an H100 (1e-4 of float32) and no faster there than
quant_gemv_w4a8_ws (benchmarks/results/h100-2026-12-08: the four launches x 28 layers 1.951 against 1.894 ms, the
step 2.834 against 2.847), so the decode step takes it only under ``TRTLLM_PIPELINE_W4A8_MMA=1``.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                warpgroup_mma_wait)

from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv_w4a8, quant_gemv_w4a8_ws, support
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_w4a8_ws import _bitsel, _prmt, _row_tables
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_ws import (PLAIN, W_LAYOUT, box_producer, program_tiles,
                                                                      stage_barriers, weight_boxes)

ENV = "TRTLLM_PIPELINE_W4A8_MMA"
MAX_REGISTERS = 128
STAGES = 3
BLOCK_N, GLU_BLOCK_N = 128, 64  # output rows a program: two (the GLU: one) 64-row MMA blocks
B_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))  # [8, 128] K-major
SIGNS = gl.constexpr(-2139062144)  # 0x80808080: each byte's sign bit
BOXES = gl.constexpr(weight_boxes(4))  # a K tile's packed words and tables (4 words a row: even/odd x P/N halves)


def enabled() -> bool:
    """Whether the decode step takes this kernel for W4A8-AWQ at batch 1 where it fits (``$TRTLLM_PIPELINE_W4A8_MMA``
    1; unset or 0: quant_gemv_w4a8_ws on Hopper)."""
    return support.switch(ENV, False, "takes the FP8 tensor-core W4A8 GEMV at batch 1")


def fits(q, block_n: int) -> bool:
    """quant_gemv_w4a8_ws's tiles, in whole 64-row MMA blocks of 32 or 64 packed rows."""
    return quant_gemv_w4a8_ws.fits(q, block_n) and block_n in (64, 128)


def usable(q, device: torch.device) -> bool:
    """Whether this kernel can run for ``q`` here: a Hopper GPU (wgmma, the copy engine) and its tiles."""
    return quant_gemv_w4a8_ws.usable(q, device) and fits(q, GLU_BLOCK_N)


def pick_config(q, sm_count: int, *, glu: bool = False, splits: int | None = None,
                block_n: int | None = None) -> LinearConfig:
    """128 output rows x 128 inputs (the GLU 64 rows: two matrices' registers), quant_gemv_w4a8_ws's K splits,
    ``STAGES`` deep."""
    block_n = block_n or (GLU_BLOCK_N if glu else BLOCK_N)
    splits = 1 if glu else splits or quant_gemv_w4a8_ws.split_rule(q, sm_count, block_n)
    return LinearConfig(1, block_n, 128, splits, 4, STAGES, tma=True, ws=True, w4a8=True, lut_mma=True)


def tables(t: torch.Tensor) -> torch.Tensor:
    """The E4M3 magnitudes per group and row from the step ``t`` (QuantWeight.scales of W4A8, [G, 2, N/2]): int32
    [G, 2, 2, N/2] (even / odd rows, then the words [E(8t), E(t), E(2t), E(3t)] and [E(4t) .. E(7t)], byte 0 first;
    E(0) = 0 is implied), quant_gemv_w4a8.tables' layout with the bytes themselves for the integers."""
    v = quant_gemv_w4a8.values(t)  # E4M3(q t) for q = -8..7: [G, 2, N/2, 16]
    mags = v[..., 8:].abs().clone()  # q = 0..7
    mags[..., 0] = v[..., 0].abs()  # |E(-8 t)| in E(0)'s place
    b = mags.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32)
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int32, device=t.device)
    lo = (b[..., 0:4] << shifts).sum(-1, dtype=torch.int32)
    hi = (b[..., 4:8] << shifts).sum(-1, dtype=torch.int32)
    return torch.stack([lo, hi], dim=2).contiguous()


def with_tables(q):
    """``q`` with its E4M3 byte tables (``QuantWeight.lut8``), made once per weight."""
    return q if q.lut8 is not None else dataclasses.replace(q, lut8=tables(q.scales))


# ------------------------------------------------------------------------------------------ layouts


@gluon.constexpr_function
def words_layout(half):
    """The stage's packed words [HALF, 32] as the lanes take them: lane (g, t) of warp w holds packed row 8 w + g (+ 32
    a register) and words t + 4 r (r: 3 register bits), so that its lookups are its A fragment (``_operand``; INT4's
    dequantization in quant_rows_int4_mma the same: there 4 r + t is the 16-input chunk r's word t)."""
    regs = [[0, 4], [0, 8], [0, 16]] + ([[32, 0]] if half == 64 else [])
    return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[8, 0], [16, 0]], block_bases=[], shape=[half, 32])


@gluon.constexpr_function
def mma_layout(nb):
    """The accumulators' layout: 64-row blocks of the weight's output rows, ``nb`` columns (the input rows: 8 at
    batch 1, one of them used; quant_rows_w4a8_mma's 8 or 16)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, nb, 32])


@gluon.constexpr_function
def _operand_layout(nb):
    return gl.DotOperandLayout(operand_index=0, parent=mma_layout(nb), k_width=4)


# ------------------------------------------------------------------------------------------ the consumers' work


@gluon.jit
def _operand(even, odd, NB: gl.constexpr):
    """A [2 HALF, 128] E4M3 from the lookups of packed rows [HALF, 32] words: MMA row 64 b + 16 w + 8 h + g is row
    parity h of packed row 32 b + 8 w + g, MMA input 4 k + j byte j of word k (inputs 4 k + 0, 2, 1, 3: the
    selectors' order, which the input's words share); in the wgmma operand's layout."""
    half: gl.constexpr = even.shape[0]
    nb: gl.constexpr = half // 32
    x = gl.join(even, odd)  # [HALF, 32, 2]: (packed row, word, parity)
    x = gl.reshape(x, [nb, 4, 8, 32, 2])  # (block, warp, g, word, parity)
    x = gl.reshape(gl.permute(x, [0, 1, 4, 2, 3]), [2 * half, 32])  # (block, warp, parity, g) = the MMA row
    return gl.convert_layout(word_bytes(x), _operand_layout(NB), assert_trivial=True)


@gluon.jit
def word_bytes(x):
    """Words [R, C] as their E4M3 bytes [R, 4 C], byte 0 first (one register a word: no instruction)."""
    x4 = gl.reshape(gl.join(gl.join(x, x), gl.join(x, x)), [x.shape[0], 4 * x.shape[1]])  # each word for its 4 bytes
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r,r,r", [x4], dtype=gl.float8e4nv, is_pure=True, pack=4)


@gluon.jit
def _selectors(w):
    """Each packed word's even and odd rows' nibbles as PRMT selectors."""
    t = w >> 12
    return _bitsel(w, t, gl.full_like(t, 0x0F0F)), _bitsel(w, t, gl.full_like(t, 0xF0F0)) >> 4


@gluon.jit
def _lookups(w, tables, NB: gl.constexpr):
    """Packed words [HALF, 32] as A operands of an ``NB``-column MMA: the magnitudes where q >= 0 and where q < 0."""
    pe_lo, pe_hi, ne_lo, ne_hi, po_lo, po_hi, no_lo, no_hi = tables
    sel_e, sel_o = _selectors(w)
    pos = _operand(_prmt(pe_lo, pe_hi, sel_e), _prmt(po_lo, po_hi, sel_o), NB)
    neg = _operand(_prmt(ne_lo, ne_hi, sel_e ^ 0x8888), _prmt(no_lo, no_hi, sel_o ^ 0x8888), NB)
    return pos, neg


@gluon.jit
def _async_tile(w, tables, bx, acc):
    """``tile`` with both chains issued before one wait, the q < 0 lookups made under the first chain's MMAs; the
    operands' words kept live across the wait as int32 (an 8-bit dependency does not lower)."""
    NB: gl.constexpr = acc.shape[1]
    pe_lo, pe_hi, ne_lo, ne_hi, po_lo, po_hi, no_lo, no_hi = tables
    sel_e, sel_o = _selectors(w)
    pe, po = _prmt(pe_lo, pe_hi, sel_e), _prmt(po_lo, po_hi, sel_o)
    part = warpgroup_mma(_operand(pe, po, NB), bx[0].permute((1, 0)), gl.zeros_like(acc), use_acc=False,
                         is_async=True)
    ne, no = _prmt(ne_lo, ne_hi, sel_e ^ 0x8888), _prmt(no_lo, no_hi, sel_o ^ 0x8888)
    part = warpgroup_mma(_operand(ne, no, NB), bx[1].permute((1, 0)), part, is_async=True)
    part, pe, po, ne, no = warpgroup_mma_wait(0, deps=[part, pe, po, ne, no])
    return acc + part


@gluon.jit
def stage_tables(t_bufs, s, L: gl.constexpr, HALF: gl.constexpr):
    """Stage ``s``'s table words as each parity's P and N [HALF, 1] (quant_gemv_w4a8_ws._row_tables)."""
    ROW: gl.constexpr = gl.SliceLayout(1, L)
    VEC: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    tb = t_bufs.index(s)._reinterpret(gl.int32, [4 * HALF], VEC)
    e = _row_tables(gl.expand_dims(tb.slice(0, HALF).load(ROW), 1), gl.expand_dims(tb.slice(HALF, HALF).load(ROW), 1))
    o = _row_tables(gl.expand_dims(tb.slice(2 * HALF, HALF).load(ROW), 1),
                    gl.expand_dims(tb.slice(3 * HALF, HALF).load(ROW), 1))
    return e + o


@gluon.jit
def _fp8_words(x, pqs, aq_ptr, ok, made, PER: gl.constexpr, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr):
    """This program's K tiles of one matrix's input as E4M3 bytes, four to a word, into ``made`` [PER, 32]: ``x``
    [PER, 128] times the pre-quant scales rounded to the compute dtype, E4M3 of that times the activation scale."""
    v = x.to(gl.float32)
    if HAS_PQS:
        v = (v * pqs).to(COMPUTE).to(gl.float32)
    v = gl.minimum(gl.maximum(v * gl.load(aq_ptr), -448.0), 448.0)
    q = v.to(gl.float8e4nv, fp_downcast_rounding="rtne").to(gl.int8, bitcast=True).to(gl.int32) & 0xFF
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32, 1], [4, 1, 1], [2, 1, 0])  # a thread: a word's 4 bytes
    b = gl.convert_layout(gl.reshape(gl.where(ok, q, 0), [PER, 32, 4]), L3)
    sh = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(0, L3))) * 8
    made.store(gl.sum(b << gl.expand_dims(gl.expand_dims(sh, 0), 0), axis=2))  # disjoint bytes: the sum is the OR


@gluon.jit
def _stage_input(made, i, bx):
    """Tile ``i`` of the made input as row 0 of the B buffers (the input, and with its signs flipped); rows 1-7 stay
    zero. A 128-byte swizzled row 0 is stored unswizzled, so its words go in order."""
    ONE: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    VEC: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    ROWS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    words = made._reinterpret(gl.int32, [made.shape[0], 1, 32], ROWS).index(i)
    w = gl.reshape(words.load(gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0])), [32])
    w = gl.convert_layout(w, ONE)
    bx[0]._reinterpret(gl.int32, [256], VEC).slice(0, 32).store(w)
    bx[1]._reinterpret(gl.int32, [256], VEC).slice(0, 32).store(w ^ SIGNS)


@gluon.jit
def _zero(bx):
    VEC: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    ONE: gl.constexpr = gl.BlockedLayout([2], [32], [4], [0])
    for j in gl.static_range(2):
        bx[j]._reinterpret(gl.int32, [256], VEC).store(gl.zeros([256], gl.int32, ONE))


@gluon.jit
def tile(w, tables, bx, acc):
    """One K tile into the float32 accumulators [2 HALF, NB]: the q >= 0 chain against the input (``bx[0]``, [NB, 128]
    K-major), the q < 0 chain against it with its signs flipped (``bx[1]``), from zero, then added (promoted every 128
    inputs)."""
    NB: gl.constexpr = acc.shape[1]
    pos, neg = _lookups(w, tables, NB)
    part = warpgroup_mma(pos, bx[0].permute((1, 0)), gl.zeros_like(acc), use_acc=False)
    part = warpgroup_mma(neg, bx[1].permute((1, 0)), part)
    return acc + part


# ------------------------------------------------------------------------------------------ the two partitions


@gluon.jit
def _consumer(bufs, bufs2, ready, empty, k_iters, inputs, GLU: gl.constexpr, HALF: gl.constexpr,
              STAGES: gl.constexpr, PDL: gl.constexpr, PER: gl.constexpr, HAS_PQS: gl.constexpr,
              COMPUTE: gl.constexpr):
    x_ptr, pqs_ptr, aq_ptr, pqs2_ptr, aq2_ptr, k0, made, made2, bx, bx2 = inputs
    L: gl.constexpr = words_layout(HALF)
    _zero(bx)
    if GLU:
        _zero(bx2)
    # (the lookups' bytes come in the selectors' order, inputs 0, 2, 1, 3 of each word: the input's words the same)
    x, ok, pqs, pqs2 = quant_gemv_w4a8_ws.raw_input(x_ptr, pqs_ptr, pqs2_ptr, k0, k_iters, GLU, PER, HAS_PQS, PDL)
    _fp8_words(x, pqs, aq_ptr, ok, made, PER, HAS_PQS, COMPUTE)
    if GLU:  # the gate's own pre-quant and activation scales
        _fp8_words(x, pqs2, aq2_ptr, ok, made2, PER, HAS_PQS, COMPUTE)
    acc = gl.zeros([2 * HALF, 8], gl.float32, mma_layout(8))
    acc2 = acc
    for i in range(k_iters):
        gl.thread_barrier()  # the made words written (i = 0), the last tile's MMAs done with the B buffers
        _stage_input(made, i, bx)
        if GLU:
            _stage_input(made2, i, bx2)
        fence_async_shared()  # the B rows' stores before the tensor cores read them
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
        acc = tile(w, tabs, bx, acc)
        if GLU:
            acc2 = tile(w2, tabs2, bx2, acc2)
    return acc, acc2


@gluon.jit
def _w4a8_mma_kernel(
    w_desc, t_desc, w2_desc, t2_desc, x_ptr, pqs_ptr, aq_ptr, osc_ptr, pqs2_ptr, aq2_ptr, osc2_ptr, out_ptr,
    N, k_tiles, per_split, stride_os,
    GLU: gl.constexpr, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr, HALF: gl.constexpr, STAGES: gl.constexpr,
    PDL: gl.constexpr, PER: gl.constexpr, num_warps: gl.constexpr,
):
    descs = (w_desc, t_desc)
    descs2 = (w2_desc, t2_desc)
    bufs = (gl.allocate_shared_memory(gl.int32, [STAGES, HALF, 32], w_desc.layout),
            gl.allocate_shared_memory(gl.int32, [STAGES, 4, HALF], t_desc.layout))
    MADE: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    made = gl.allocate_shared_memory(gl.int32, [PER, 32], MADE)
    bx = (gl.allocate_shared_memory(gl.float8e4nv, [8, 128], B_LAYOUT),
          gl.allocate_shared_memory(gl.float8e4nv, [8, 128], B_LAYOUT))
    bufs2 = bufs
    made2 = made
    bx2 = bx
    if GLU:
        bufs2 = (gl.allocate_shared_memory(gl.int32, [STAGES, HALF, 32], w2_desc.layout),
                 gl.allocate_shared_memory(gl.int32, [STAGES, 4, HALF], t2_desc.layout))
        made2 = gl.allocate_shared_memory(gl.int32, [PER, 32], MADE)
        bx2 = (gl.allocate_shared_memory(gl.float8e4nv, [8, 128], B_LAYOUT),
               gl.allocate_shared_memory(gl.float8e4nv, [8, 128], B_LAYOUT))
    ready, empty = stage_barriers(STAGES)
    pid_s = gl.program_id(1)
    row0, k0, k_iters = program_tiles(per_split, k_tiles, HALF)
    NBYTES: gl.constexpr = (w_desc.block_type.nbytes + t_desc.block_type.nbytes) * (2 if GLU else 1)
    inputs = (x_ptr, pqs_ptr, aq_ptr, pqs2_ptr, aq2_ptr, k0, made, made2, bx, bx2)
    acc, acc2 = gl.warp_specialize([
        (_consumer, (bufs, bufs2, ready, empty, k_iters, inputs, GLU, HALF, STAGES, PDL, PER, HAS_PQS, COMPUTE)),
        (box_producer, (descs, descs2, bufs, bufs2, ready, empty, row0, k0, k_iters, BOXES, 2, GLU, STAGES, PDL,
                        NBYTES)),
    ], [1], [40])
    # MMA row m = 64 b + 16 w + 8 h + g is output row 2 (row0 + 32 b + 8 w + g) + h; column 0 is the input's (the
    # other columns' B rows are zero, so a row's sum is its column 0)
    m = gl.arange(0, 2 * HALF, layout=gl.SliceLayout(1, mma_layout(8)))
    rows = 2 * (row0 + 32 * (m // 64) + 8 * ((m // 16) % 4) + m % 8) + (m // 8) % 2
    ok = rows < N
    y = gl.sum(acc, axis=1) * gl.load(osc_ptr)
    if GLU:
        gl.store(out_ptr + rows, silu_mul(y, gl.sum(acc2, axis=1) * gl.load(osc2_ptr), COMPUTE), mask=ok)
    else:
        gl.store(out_ptr + pid_s * stride_os + rows, y, mask=ok)


# ------------------------------------------------------------------------------------------ launch


def descriptors(q, half: int) -> list:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return [TensorDescriptor.from_tensor(q.weight.view(torch.int32), [half, 32], W_LAYOUT),
            TensorDescriptor.from_tensor(q.lut8.view(-1, q.n // 2), [4, half], PLAIN)]


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool):
    """quant_gemv_w4a8.launch's contract for this kernel's configs (``cfg.lut_mma``): ``x`` [1, K] in the compute
    dtype before the pre-quant scale; ``out`` [splits, 1, N] float32 partials, or (``q2``: the GLU's gate, K not
    split) [1, N] in the compute dtype."""
    glu = q2 is not None
    assert fits(q, cfg.block_n) and cfg.block_k == 128 and x.shape[0] == 1 and x.stride(1) == 1
    assert q.weight.is_contiguous()
    q = with_tables(q)
    q2 = with_tables(q2) if glu else q
    assert (q2.pqs is None) == (q.pqs is None)
    half = cfg.block_n // 2
    k_tiles = q.k // 128
    splits = 1 if glu else cfg.splits  # (a split past the last K tile writes zeros: every partial is written)
    per_split = triton.cdiv(k_tiles, splits)
    descs = descriptors(q, half) + descriptors(q2, half)
    return _w4a8_mma_kernel[(triton.cdiv(q.n // 2, half), splits)](
        *descs, x, q.pqs if q.pqs is not None else x, q.act_q, q.out_scale,
        q2.pqs if q2.pqs is not None else x, q2.act_q, q2.out_scale, out,
        q.n, k_tiles, per_split, 0 if glu or out.dim() == 2 else out.stride(0),
        GLU=glu, HAS_PQS=q.pqs is not None, COMPUTE=tl_dtype(compute), HALF=half, STAGES=cfg.num_stages, PDL=pdl,
        PER=triton.next_power_of_2(per_split), num_warps=cfg.num_warps, maxnreg=MAX_REGISTERS, launch_pdl=pdl,
    )
