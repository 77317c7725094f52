"""INT8 weight-only (W8A16) at 1-64 input rows on the FP16 tensor cores: each int8 weight made exact in registers.

Weight-only INT8 has no integer tensor-core path (its input stays in the compute dtype) and quant_gemm's GEMM converts
each weight through float32 (``(w ^ 0x80) | 0x4B000000``, a subtraction, a pack: quant_gemm), at 8-64 rows slower
than FP8 (H100 2026-12-07h: 4.706 / 6.202 / 7.870 ms a step at 8 / 32 / 64). Here the batch is the MMA's N and each
weight costs its conversion into ``wgmma``'s A operand:

* float16 has 10 mantissa bits, so ``0x64`` above a byte ``u`` is 1024 + u exactly: ``w ^ 0x80`` (u = 128 + w), two
  PRMT against ``0x64646464`` (bytes 0, 1 and 2, 3 of a word, each above 0x64) and ``sub.f16x2`` of 1152 give the word's
  four weights as two float16 pairs: a LOP3, two PRMT and two HADD2 a word, 1.25 instructions a weight, no rounding.
* A lane's A fragment at one 16-input chunk c is rows g and g + 8 at MMA inputs 2t, 2t + 1 and 2t + 8, 2t + 9 (t: the
  lane in its quad): word 4c + t of the two rows, bytes 0, 1 then 2, 3. So MMA input 16 c + 8 j + 2 t + i multiplies
  input 16 c + 4 t + 2 j + i, and ``made_input.w8a16`` writes B in that order; the words reach the operand's
  registers from the copy engine's stage without moving (``convert_layout(..., assert_trivial=True)``).
* B is the input rows in float16, each row scaled by a power of two r so that its largest value stays below 2^15
  (bfloat16 -> float16 loses nothing in range and nothing of its 8 bits; outliers past 65504 cannot overflow);
  the epilogue multiplies by r and the row's weight scale (ModelOpt's per-channel scale: one group over K).

The producer warp copies each K tile's words [64 rows, 128 inputs] (the GLU: both matrices') and the made input's two
[NB, 64] halves (quant_gemv_ws.box_producer; rows past M read as zeros), the consumer warpgroup converts and issues
two m64n{8..64}k16 chains a tile, float32 accumulators over the program's K. Output: quant_gemm.launch's contract
(float32 split-K partials [splits, M, N], or the GLU's ``silu(fc) * gate`` [M, N] in the compute dtype, K not split).
Products are exact (integer weights times float16 inputs), sums the tensor cores' float32, against eager's bfloat16
rounding of each ``w s`` (2^-9 of a weight). Gluon kernels do not run in Triton's interpreter: the CPU tests compile
this one for sm_90 (``tools/gemv_sass.py --int8wo-rows``; ``made_input`` runs in the interpreter).

Measured on an H100 (benchmarks/results/h100-2026-12-08, the 7B's four launches x 28 layers each checked against
float32 within 1e-6): 3.712 ms at 64 rows against quant_gemm's GEMM's 4.403; the step at context 2048 7.410 / 6.128 /
4.296 ms at batch 64 / 32 / 8 against 8.054 / 6.321 / 4.798; at batch 1 slower than the dp4a GEMV (3.913 against
3.319: 2.989 ms of launches against 2.644). So the decode step takes it at batch 2-64 by default
(``TRTLLM_PIPELINE_INT8WO_WGMMA_ROWS=N``: 2..N; 0: off).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import made_input, quant_rows_int8_mma, support
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_w4a8_ws import _prmt
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_rows_int4_mma import _b_layout, _mma_layout, _operand_layout
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_ws import (W_LAYOUT, box_producer, program_tiles,
                                                                      stage_barriers)

ENV = "TRTLLM_PIPELINE_INT8WO_WGMMA_ROWS"
MAX_ROWS = 64
DEFAULT_ROWS = 64  # the decode step's batches 2..64 unless the switch says otherwise (H100 2026-12-08)
MAX_REGISTERS = 128
SIGNS = gl.constexpr(-2139062144)  # 0x80808080: each byte's sign bit (u = 128 + w)
ABOVE = gl.constexpr(0x64646464)  # float16 1024's upper byte, the PRMT's second word
OFFSET = gl.constexpr(0x64806480)  # float16 1152 = 1024 + 128, twice
# box_producer's boxes: the weights' words [row0, 32 kt] (the GLU: both matrices'), then the made input's two halves
# [0, 128 kt] and [0, 128 kt + 64]
WEIGHT_BOX = (1, 0, 0, 0, 32, 0)
INPUT_BOXES = ((0, 0, 0, 0, 128, 0), (0, 0, 0, 0, 128, 64))
BOXES = gl.constexpr((WEIGHT_BOX,) + INPUT_BOXES)
GLU_BOXES = gl.constexpr((WEIGHT_BOX, WEIGHT_BOX) + INPUT_BOXES)


def enabled(m: int) -> bool:
    """Whether ``$TRTLLM_PIPELINE_INT8WO_WGMMA_ROWS`` (a batch size N; 0: off; unset: ``DEFAULT_ROWS``) asks for this
    kernel at ``m`` (2..N: batch 1 stays on the dp4a GEMV, faster there)."""
    return support.rows_switch(ENV, MAX_ROWS, "the INT8 weight-only wgmma kernel", m, default=DEFAULT_ROWS)


def supported(q, m: int) -> bool:
    """INT8 weight-only at 1..MAX_ROWS rows on a Hopper GPU: K in whole 128-input tiles, one scale per output row over
    all of K (a checkpoint of one rank slice) and no pre-quant scale (ModelOpt's export has none)."""
    return (q.fmt == "int8_wo" and 1 <= m <= MAX_ROWS and q.k % 128 == 0 and q.group == q.k
            and q.weight.device.type == "cuda" and torch.cuda.get_device_capability(q.weight.device) >= (9, 0)
            and q.pqs is None)


def pick_config(q, m: int, sm_count: int, *, glu: bool = False, splits: int | None = None,
                block_n: int | None = None) -> LinearConfig:
    """SmoothQuant's row kernel's tiles (quant_rows_int8_mma.pick_config: 64 output rows x 128 inputs, its stages and
    K splits; a stage here holds 16-bit input rows, 24 KB at 64 rows)."""
    return quant_rows_int8_mma.pick_config(q, m, sm_count, glu=glu, splits=splits, block_n=block_n)


# ------------------------------------------------------------------------------------------ layouts
# (the 16-bit MMA's accumulator and operand layouts and the input's 128-byte-swizzled boxes: quant_rows_int4_mma's)


@gluon.constexpr_function
def _words_layout():
    """The stage's words [64, 32] as the lanes take them: lane (g, t) of warp w holds rows 16 w + g (+ 8: the last
    register bit) and words t + 4 r (r: 3 register bits), its A fragments' weights (``_operand``)."""
    return gl.DistributedLinearLayout(reg_bases=[[0, 4], [0, 8], [0, 16], [8, 0]],
                                      lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 32])


# ------------------------------------------------------------------------------------------ the weights' operand


@gluon.jit
def _pairs(u, sel: gl.constexpr):
    """The float16 pair 1024 + u of two bytes of ``u`` (``sel``: PRMT's selector, each byte above 0x64)."""
    return _prmt(u, gl.full_like(u, ABOVE), gl.full_like(u, sel))


@gluon.jit
def _rows_pairs(w):
    """Words [4, 8, 16] (warp, g, word 4 c + t) as the pairs [4, 8, 32], pair 8 c + 4 j + t holding bytes 2 j, 2 j + 1
    of word 4 c + t as 1024 + u."""
    u = w ^ SIGNS
    p = gl.join(_pairs(u, 0x5140), _pairs(u, 0x5342))  # (warp, g, word, j)
    return gl.reshape(gl.permute(gl.reshape(p, [4, 8, 4, 4, 2]), [0, 1, 2, 4, 3]), [4, 8, 32])


@gluon.jit
def _operand(words, h: gl.constexpr, NB: gl.constexpr):
    """A [64, 64] float16 of the weights at the tile's inputs 64 h .. 64 h + 63 in the wgmma operand's layout: MMA
    row 16 w + 8 p + g is row 16 w + 8 p + g, MMA input 16 c + 8 j + 2 t + i is input 16 c + 4 t + 2 j + i (word 4 c +
    t of the half, byte 2 j + i)."""
    half, upper = gl.split(gl.permute(gl.reshape(words, [64, 2, 16]), [0, 2, 1]))
    if h == 1:
        half = upper
    even, odd = gl.split(gl.permute(gl.reshape(half, [4, 2, 8, 16]), [0, 2, 3, 1]))  # rows g and g + 8
    x = gl.join(_rows_pairs(even), _rows_pairs(odd))  # (warp, g, pair, p)
    x = gl.reshape(gl.permute(x, [0, 3, 1, 2]), [64, 32])
    x2 = gl.reshape(gl.join(x, x), [64, 64])  # each pair for its two float16 (one register)
    a = gl.inline_asm_elementwise("sub.f16x2 $0, $1, $3;", "=r,r,r,r,r", [x2, gl.full_like(x2, OFFSET)],
                                  dtype=gl.float16, is_pure=True, pack=2)
    return gl.convert_layout(a, _operand_layout(NB), assert_trivial=True)


# ------------------------------------------------------------------------------------------ the kernel


@gluon.jit
def _consumer(bufs, ready, empty, k_iters, GLU: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr,
              PDL: gl.constexpr):
    """The K loop: a stage's words into the two operands (the GLU: four), two MMA chains each, the stage handed back
    once they have returned."""
    L: gl.constexpr = _words_layout()
    if PDL:  # (its wait is the producer's: every input copy follows it, and the MMAs follow the copies)
        gdc_launch_dependents()
    acc = gl.zeros([64, NB], gl.float32, _mma_layout(NB))
    acc2 = acc
    X_LO: gl.constexpr = 2 if GLU else 1  # the input halves' buffers follow the weights'
    for i in range(k_iters):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        b_lo = bufs[X_LO].index(s).permute((1, 0))
        b_hi = bufs[X_LO + 1].index(s).permute((1, 0))
        w = bufs[0].index(s).load(L)
        acc = warpgroup_mma(_operand(w, 0, NB), b_lo, acc)
        acc = warpgroup_mma(_operand(w, 1, NB), b_hi, acc)
        if GLU:
            w2 = bufs[1].index(s).load(L)
            acc2 = warpgroup_mma(_operand(w2, 0, NB), b_lo, acc2)
            acc2 = warpgroup_mma(_operand(w2, 1, NB), b_hi, acc2)
        fence_async_shared()  # the stage's reads (the MMAs have returned) before the copy engine's next writes
        mbarrier.arrive(empty.index(s), count=1)
    if PDL:  # (a program without K tiles copied nothing: its stores still wait for the kernels before)
        gdc_wait()
    return acc, acc2


@gluon.jit
def _int8wo_rows_mma_kernel(
    w_desc, w2_desc, lo_desc, hi_desc, s_ptr, s2_ptr, r_ptr, out_ptr, M, N, k_tiles, per_split, stride_os, stride_om,
    GLU: gl.constexpr, COMPUTE: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr,
    num_warps: gl.constexpr,
):
    words = gl.allocate_shared_memory(gl.int32, [STAGES, 64, 32], w_desc.layout)
    lo = gl.allocate_shared_memory(gl.float16, [STAGES, NB, 64], lo_desc.layout)
    hi = gl.allocate_shared_memory(gl.float16, [STAGES, NB, 64], hi_desc.layout)
    if GLU:
        descs = (w_desc, w2_desc, lo_desc, hi_desc)
        bufs = (words, gl.allocate_shared_memory(gl.int32, [STAGES, 64, 32], w2_desc.layout), lo, hi)
    else:
        descs = (w_desc, lo_desc, hi_desc)
        bufs = (words, lo, hi)
    ready, empty = stage_barriers(STAGES)
    pid_s = gl.program_id(1)
    row0, k0, k_iters = program_tiles(per_split, k_tiles, 64)
    NBYTES: gl.constexpr = w_desc.block_type.nbytes * (2 if GLU else 1) + 2 * lo_desc.block_type.nbytes
    boxes: gl.constexpr = GLU_BOXES if GLU else BOXES
    acc, acc2 = gl.warp_specialize([
        (_consumer, (bufs, ready, empty, k_iters, GLU, NB, STAGES, PDL)),
        (box_producer, (descs, descs, bufs, bufs, ready, empty, row0, k0, k_iters, boxes, 1 + GLU, False, STAGES,
                        PDL, NBYTES)),
    ], [1], [40])
    # MMA row m is output row row0 + m, column n the input row n: times the row's weight scale and the input row's r
    MMA: gl.constexpr = _mma_layout(NB)
    r = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, MMA))
    n = gl.arange(0, NB, layout=gl.SliceLayout(0, MMA))
    in_n = r < N
    in_m = n < M
    rn = gl.expand_dims(gl.load(r_ptr + n, mask=in_m, other=0.0), 0)
    y = acc * gl.expand_dims(gl.load(s_ptr + r, mask=in_n, other=0.0), 1) * rn
    rows = gl.expand_dims(r, 1)
    cols = gl.expand_dims(n, 0)
    ok = gl.expand_dims(in_n, 1) & gl.expand_dims(in_m, 0)
    if GLU:
        y2 = acc2 * gl.expand_dims(gl.load(s2_ptr + r, mask=in_n, other=0.0), 1) * rn
        gl.store(out_ptr + cols * stride_om + rows, silu_mul(y, y2, COMPUTE), mask=ok)
    else:
        gl.store(out_ptr + pid_s * stride_os + cols * stride_om + rows, y, mask=ok)


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool):
    """quant_gemm.launch's contract for this kernel's configs (``cfg.lut_mma``, INT8 weight-only): ``x`` [M, K] in the
    compute dtype; ``out`` [splits, M, N] (or [M, N], one split) float32 partials, or with ``q2`` (the GLU's gate, K
    not split) [M, N] in the compute dtype. Two launches: ``made_input.w8a16`` (both matrices' input: no pre-quant
    scale), the kernel."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    glu = q2 is not None
    m = x.shape[0]
    assert supported(q, m) and cfg.block_k == 128 and cfg.block_n == 64 and x.stride(1) == 1 and m <= cfg.block_m
    assert q.weight.is_contiguous() and out.stride(-1) == 1
    q2 = q2 or q
    assert q2.weight.is_contiguous() and q2.pqs is None
    made, r = made_input.w8a16(x, pdl)
    words = [TensorDescriptor.from_tensor(w.view(torch.int32), [64, 32], W_LAYOUT) for w in (q.weight, q2.weight)]
    halves = [TensorDescriptor.from_tensor(made, [cfg.block_m, 64], _b_layout())] * 2
    k_tiles = q.k // 128
    splits = 1 if glu else cfg.splits  # (a split past the last K tile writes zeros: every partial is written)
    partials = not glu and out.dim() == 3
    return _int8wo_rows_mma_kernel[(triton.cdiv(q.n, 64), splits)](
        *words, *halves, q.scales, q2.scales, r, out, m, q.n, k_tiles, triton.cdiv(k_tiles, splits),
        out.stride(0) if partials else 0, out.stride(-2), GLU=glu, COMPUTE=tl_dtype(compute), NB=cfg.block_m,
        STAGES=cfg.num_stages, PDL=pdl, num_warps=cfg.num_warps, maxnreg=MAX_REGISTERS, launch_pdl=pdl)
