"""INT8 SmoothQuant at 1-64 input rows on the INT8 tensor cores: the weights straight from shared memory into ``wgmma``.

SmoothQuant's weights are int8 [N, K] as stored and its input int8 after the activation quantizer: the product is the
INT8 tensor cores' own (``wgmma`` s8 x s8 -> s32), and nothing about a weight needs an instruction. The dp4a GEMV
(quant_gemv_int8 at batch 1: ~0.7 instructions a weight, its warp-specialized form no faster on an H100) and
quant_gemm's GEMM at 8-64 rows (the 7B GLU at M 64 178 us on an H200, 2026-12-04, where its bytes take ~35) leave
that on the table. Here:

* The producer warp copies each K tile's weight box [64 rows, 128 inputs] and the input rows' box [NB, 128] (the
  rows as the MMA's N: 8 to 64; rows past M read as zeros) by the copy engine into ``STAGES`` stages
  (quant_gemv_ws.box_producer); the input is made once per launch by ``made_input.int8`` (the pre-quant scale,
  rounded to the compute dtype, then the activation quantizer: eager's points), whose launch the producer waits for
  under PDL after it has copied the first stages' weights.
* The consumer warpgroup issues one asynchronous ``wgmma`` a stage with A and B from shared memory, keeps one stage's
  MMAs in flight, and hands each stage back once its MMAs are done: int32 accumulators across all of K (exact: no
  promotion), then the folded per-row scale (weight scale / activation scale) in the epilogue.

Output: quant_gemm.launch's contract (float32 split-K partials [splits, M, N], or the GLU's ``silu(fc) * gate`` [M, N]
in the compute dtype, K not split, each matrix with its own input). The int32 sums are exact, so a split's partial is
the GEMM's up to float32 rounding of the scaled sum. Gluon kernels do not run in Triton's interpreter: the CPU tests
compile this one for sm_90 (``tools/gemv_sass.py --int8-rows``; ``made_input`` runs in the interpreter).

Measured on an H100 (benchmarks/results/h100-2026-12-08, each 7B launch checked against float32 within 1e-6): the
four launches x 28 layers 3.374 ms at 64 rows against quant_gemm's GEMM's 5.685; the step at context 2048 7.018 /
5.788 / 4.022 ms at batch 64 / 32 / 8 against 9.567 / 7.061 / 4.899, and at batch 1 3.667 against the register dp4a
GEMV's 3.821, where its warp-specialized form took 3.530 on the same machine (now SmoothQuant's batch-1 default:
quant_gemv_int8_ws). So the decode step takes this kernel at batch 2-64 by default
(``TRTLLM_PIPELINE_INT8_WGMMA_ROWS=N``: 2..N; 0: off).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import made_input, quant_gemv_w4a8_ws, support
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_w4a8_mma import B_LAYOUT, mma_layout
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_ws import box_producer, program_tiles, stage_barriers

ENV = "TRTLLM_PIPELINE_INT8_WGMMA_ROWS"
MAX_ROWS = 64
DEFAULT_ROWS = 64  # the decode step's batches 2..64 unless the switch says otherwise (H100 2026-12-08)
MAX_REGISTERS = 128
BLOCK_N = 64  # output rows a program: one 64-row MMA block
STAGES, WIDE_STAGES, GLU_STAGES = 4, 3, 3  # WIDE: from 64 rows (a stage 16 KB: two programs an SM in 132 KB)
LAYOUT = B_LAYOUT  # both operands: 128-byte rows of 8-bit values, K-major (FP8's and int8's layouts are one)
# box_producer's boxes: the weights' [row0, 128 kt], then the made input's [0, 128 kt]
BOXES = gl.constexpr(((1, 0, 0, 0, 128, 0), (0, 0, 0, 0, 128, 0)))


def enabled(m: int) -> bool:
    """Whether ``$TRTLLM_PIPELINE_INT8_WGMMA_ROWS`` (a batch size N; 0: off; unset: ``DEFAULT_ROWS``) asks for this
    kernel at ``m`` (2..N: batch 1 takes the warp-specialized dp4a GEMV, faster there)."""
    return support.rows_switch(ENV, MAX_ROWS, "the INT8 wgmma kernel", m, default=DEFAULT_ROWS)


def supported(q, m: int) -> bool:
    """SmoothQuant at 1..MAX_ROWS rows on a Hopper GPU, K in whole 128-input tiles."""
    return (q.fmt == "int8_sq" and 1 <= m <= MAX_ROWS and q.k % 128 == 0 and q.weight.device.type == "cuda"
            and torch.cuda.get_device_capability(q.weight.device) >= (9, 0))


def pick_config(q, m: int, sm_count: int, *, glu: bool = False, splits: int | None = None,
                block_n: int | None = None) -> LinearConfig:
    """64 output rows x 128 inputs, the MMA's N the next of 8, 16, 32, 64 for ``m`` rows, quant_gemv_w4a8_ws's K
    split rule, ``STAGES`` deep (64 rows ``WIDE_STAGES``, the GLU ``GLU_STAGES``: two matrices and inputs a stage);
    the H100's defaults (2026-12-08)."""
    nb = max(8, triton.next_power_of_2(m))
    block_n = block_n or BLOCK_N
    splits = 1 if glu else splits or quant_gemv_w4a8_ws.split_rule(q, sm_count, block_n)
    stages = GLU_STAGES if glu else WIDE_STAGES if nb >= 64 else STAGES
    return LinearConfig(nb, block_n, 128, splits, 4, stages, gemm=True, tma=True, ws=True, lut_mma=True, made=True)


@gluon.jit
def _consumer(bufs, bufs2, ready, empty, k_iters, GLU: gl.constexpr, BLOCK_N: gl.constexpr, NB: gl.constexpr,
              STAGES: gl.constexpr, PDL: gl.constexpr):
    """The K loop: a stage's MMAs issued, the previous stage's awaited and handed back (one stage in flight)."""
    if PDL:  # (its wait is the producer's: every input copy follows it, and the MMAs follow the copies)
        gdc_launch_dependents()
    acc = gl.zeros([BLOCK_N, NB], gl.int32, mma_layout(NB))
    acc2 = acc
    for i in range(k_iters):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(bufs[0].index(s), bufs[1].index(s).permute((1, 0)), acc, is_async=True)
        if GLU:
            acc2 = warpgroup_mma(bufs2[0].index(s), bufs2[1].index(s).permute((1, 0)), acc2, is_async=True)
            acc, acc2 = warpgroup_mma_wait(2, deps=(acc, acc2))  # (this stage's two in flight, the last's done)
        else:
            acc = warpgroup_mma_wait(1, deps=(acc,))
        if i > 0:
            mbarrier.arrive(empty.index((i - 1) % STAGES), count=1)
    acc, acc2 = warpgroup_mma_wait(0, deps=(acc, acc2))
    if PDL:  # (a program without K tiles copied nothing: its stores still wait for the kernels before)
        gdc_wait()
    return acc, acc2


@gluon.jit
def _int8_rows_mma_kernel(
    w_desc, x_desc, w2_desc, x2_desc, s_ptr, s2_ptr, out_ptr, M, N, k_tiles, per_split, stride_os, stride_om,
    GLU: gl.constexpr, COMPUTE: gl.constexpr, BLOCK_N: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr,
    PDL: gl.constexpr, num_warps: gl.constexpr,
):
    descs = (w_desc, x_desc)
    descs2 = (w2_desc, x2_desc)
    bufs = (gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_N, 128], LAYOUT),
            gl.allocate_shared_memory(gl.int8, [STAGES, NB, 128], LAYOUT))
    bufs2 = bufs
    if GLU:
        bufs2 = (gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_N, 128], LAYOUT),
                 gl.allocate_shared_memory(gl.int8, [STAGES, NB, 128], LAYOUT))
    ready, empty = stage_barriers(STAGES)
    pid_s = gl.program_id(1)
    row0, k0, k_iters = program_tiles(per_split, k_tiles, BLOCK_N)
    NBYTES: gl.constexpr = (w_desc.block_type.nbytes + x_desc.block_type.nbytes) * (2 if GLU else 1)
    acc, acc2 = gl.warp_specialize([
        (_consumer, (bufs, bufs2, ready, empty, k_iters, GLU, BLOCK_N, NB, STAGES, PDL)),
        (box_producer, (descs, descs2, bufs, bufs2, ready, empty, row0, k0, k_iters, BOXES, 1, GLU, STAGES, PDL,
                        NBYTES)),
    ], [1], [40])
    # MMA row m is output row row0 + m, column n the input row n; the folded scale per output row
    MMA: gl.constexpr = mma_layout(NB)
    r = row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
    in_n = r < N
    y = acc.to(gl.float32) * gl.expand_dims(gl.load(s_ptr + r, mask=in_n, other=0.0), 1)
    rows = gl.expand_dims(r, 1)
    n = gl.expand_dims(gl.arange(0, NB, layout=gl.SliceLayout(0, MMA)), 0)
    ok = gl.expand_dims(in_n, 1) & (n < M)
    if GLU:
        y2 = acc2.to(gl.float32) * gl.expand_dims(gl.load(s2_ptr + r, mask=in_n, other=0.0), 1)
        gl.store(out_ptr + n * stride_om + rows, silu_mul(y, y2, COMPUTE), mask=ok)
    else:
        gl.store(out_ptr + pid_s * stride_os + n * stride_om + rows, y, mask=ok)


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool):
    """quant_gemm.launch's contract for this kernel's configs (``cfg.lut_mma``, SmoothQuant): ``x`` [M, K] in the
    compute dtype before the pre-quant scale; ``out`` [splits, M, N] (or [M, N], one split) float32 partials, or with
    ``q2`` (the GLU's gate, K not split) [M, N] in the compute dtype. Two launches: ``made_input.int8``, the kernel."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    glu = q2 is not None
    m = x.shape[0]
    assert supported(q, m) and cfg.block_k == 128 and x.stride(1) == 1 and m <= cfg.block_m
    assert q.weight.is_contiguous() and out.stride(-1) == 1
    q2 = q2 or q
    assert q2.weight.is_contiguous() and (q2.pqs is None) == (q.pqs is None)
    made = made_input.int8(x, q, q2 if glu else None, compute, pdl)
    layout = LAYOUT.value
    descs = [TensorDescriptor.from_tensor(w, [box, 128], layout)
             for w, box in ((q.weight, cfg.block_n), (made[0], cfg.block_m), (q2.weight, cfg.block_n),
                            (made[-1], cfg.block_m))]
    k_tiles = q.k // 128
    splits = 1 if glu else cfg.splits  # (a split past the last K tile writes zeros: every partial is written)
    partials = not glu and out.dim() == 3
    return _int8_rows_mma_kernel[(triton.cdiv(q.n, cfg.block_n), splits)](
        *descs, q.scales, q2.scales, out, m, q.n, k_tiles, triton.cdiv(k_tiles, splits),
        out.stride(0) if partials else 0, out.stride(-2), GLU=glu, COMPUTE=tl_dtype(compute), BLOCK_N=cfg.block_n,
        NB=cfg.block_m, STAGES=cfg.num_stages, PDL=pdl, num_warps=cfg.num_warps, maxnreg=MAX_REGISTERS,
        launch_pdl=pdl)
