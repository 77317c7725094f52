"""INT8 weights at batch 1 on Hopper, warp-specialized (Gluon): quant_gemv_int8's arithmetic, quant_gemv_ws's structure.

quant_gemv_int8's kernel loads its weight words straight into registers; at batch 1 the 7B step took 3.21 ms
(weight-only) and 3.57 (SmoothQuant) on an H100 (2026-12-05), 3.40 / 3.53 on an H200, where issue 32 asks for 2.5
(the H200's floor for these bytes: 1.8). Here a producer warp copies each K tile of the packed words (64 rows x 128
inputs, 8 KB) by the bulk tensor copy engine into STAGES buffers with "ready" and "empty" mbarriers, as quant_gemv_ws
does, and starts at once under PDL (the weights do not depend on the previous kernel). The four consumer warps first
make their K slice's input in shared memory from the raw input row: SmoothQuant's int8 words (``x *
pre_quant_scale`` rounded to the compute dtype, then ``round(x * act_q)`` half to even in [-128, 127], four to a
word), or weight-only's int16 block planes (gemv_input's, through quant_gemv_ws.made_planes); then per tile they read
a full stage, free it, and do the dp4a work: SmoothQuant one ``dp4a.s32.s32`` a word into exact int32 sums,
weight-only the high plane's chain shifted 8 bits into the low plane's, per row and 16-input block.

SmoothQuant's numbers are quant_gemv_int8's to the bit (exact int32 sums, the same one multiplier a row); weight-only's
per-block float32 sums are taken over 128-input tiles (the register kernel's: 256), so the float32 order differs.
Output: quant_gemv_int8.launch's contract. Gluon kernels do not run in Triton's interpreter: the CPU tests compile
this one for sm_90 (tools/gemv_sass.py --int8-ws); ``benchmarks/w4a8_gemv.py --format int8_wo`` (or ``int8_sq``)
checks it on the GPU (variant ``ws``). Not faster than the register kernel on an H100 (2026-12-07g, each launch alone:
the 7B's four launches x 28 layers 2.593 against 2.491 ms weight-only, 2.679 against 2.882 SmoothQuant, where only
the GLU gained; through the pipeline, weight-only at batch 1 and context 128: 3.353 ms, the register kernel 3.206 on
2026-12-05). SmoothQuant's step at batch 1 gained on two H100s (3.535 ms on 2026-12-07g; 3.530 against the register
kernel's 3.824 on one machine, 2026-12-08), so the decode step takes it for SmoothQuant by default and for weight-only
under ``TRTLLM_PIPELINE_INT8_WS=1`` (``enabled``; 0: neither).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import gemv_input, quant_gemv_int8, support
from trtllm_pipeline.runtimes.torch_engine.cuda.dp4a import dp4a
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_ws import (W_LAYOUT, _made_input, _quarters, _tile_cols,
                                                                      made_planes, program_tiles, stage_barriers)

ENV = "TRTLLM_PIPELINE_INT8_WS"
MAX_REGISTERS = 128
BLOCK_N, GLU_BLOCK_N = 64, 32  # output rows a program: 8 KB of words a stage (the GLU: two matrices of 4 KB)
STAGES = 3
PROGRAMS_PER_SM = 3


def enabled(fmt: str) -> bool:
    """Whether the decode step takes this kernel for INT8 format ``fmt`` at batch 1 where it fits
    (``$TRTLLM_PIPELINE_INT8_WS`` 1: both formats; 0: neither, quant_gemv_int8's register-load kernel; unset:
    SmoothQuant only, where the H100 measured it faster)."""
    return support.switch(ENV, fmt == "int8_sq", "takes the warp-specialized INT8 GEMV at batch 1")


def fits(q) -> bool:
    """quant_gemv_int8's batch-1 cases in 128-input tiles: K a whole number of tiles, weight-only's scale groups
    whole tiles (or the whole row)."""
    return (quant_gemv_int8.supported(q, 1) and q.k % 128 == 0
            and (q.fmt == "int8_sq" or q.group == q.k or q.group % 128 == 0))


def usable(q, device: torch.device) -> bool:
    """Whether this kernel can run for ``q`` here: a Hopper GPU and its tiles."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0) and fits(q)


def pick_config(q, sm_count: int, *, glu: bool = False, splits: int | None = None,
                block_n: int | None = None) -> LinearConfig:
    """64 output rows x 128 inputs (the GLU 32 rows of each matrix), K split for about ``PROGRAMS_PER_SM`` programs
    per SM with no split left empty, ``STAGES`` deep (not yet swept)."""
    block_n = block_n or (GLU_BLOCK_N if glu else BLOCK_N)
    k_tiles = q.k // 128
    if glu:
        splits = 1
    elif splits is None:
        splits = max(1, min(k_tiles, round(PROGRAMS_PER_SM * sm_count / triton.cdiv(q.n, block_n))))
        splits = triton.cdiv(k_tiles, triton.cdiv(k_tiles, splits))
    return LinearConfig(1, block_n, 128, splits, 4, STAGES, tma=True, ws=True, dp4a8=True)


@gluon.jit
def _producer(w_desc, w2_desc, w_bufs, w2_bufs, ready, empty, row0, k0, k_iters, GLU: gl.constexpr,
              STAGES: gl.constexpr):
    # nothing copied here depends on the previous kernel: no PDL wait
    NBYTES: gl.constexpr = w_desc.block_type.nbytes * (2 if GLU else 1)
    for i in range(k_iters):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier reads as phase 1 done
        bar = ready.index(s)
        mbarrier.expect(bar, NBYTES)
        tma.async_copy_global_to_shared(w_desc, [row0, (k0 + i) * 32], bar, w_bufs.index(s))
        if GLU:
            tma.async_copy_global_to_shared(w2_desc, [row0, (k0 + i) * 32], bar, w2_bufs.index(s))


@gluon.jit
def _int8_words(x, pqs_ptr, aq_ptr, cols, ok, words, PER: gl.constexpr, HAS_PQS: gl.constexpr,
                COMPUTE: gl.constexpr):
    """SmoothQuant's input tiles as quant_gemv_int8._input_words makes them: ``x`` [PER, 128] times the pre-quant
    scale rounded to the compute dtype, ``round(x * act_q)`` in [-128, 127], four int8 to a word, into ``words``
    [PER, 32]."""
    v = x.to(gl.float32)
    if HAS_PQS:
        v = (v * gl.load(pqs_ptr + cols, mask=ok, other=0.0).to(gl.float32)).to(COMPUTE).to(gl.float32)
    r = gl.minimum(gl.maximum(v * gl.load(aq_ptr), -128.0), 127.0)
    q = ((r + gemv_input.ROUND) - gemv_input.ROUND).to(gl.int32)  # to nearest, half to even
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32, 1], [4, 1, 1], [2, 1, 0])  # a thread: a word's 4 bytes
    b = gl.convert_layout(gl.reshape(q & 0xFF, [PER, 32, 4]), L3)
    sh = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(0, L3))) * 8
    words.store(gl.sum(b << gl.expand_dims(gl.expand_dims(sh, 0), 0), axis=2))  # disjoint bytes: the sum is the OR


@gluon.jit
def _made_words(words, i):
    """Tile ``i`` of SmoothQuant's made input as [1, 32] words."""
    ROWS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    return words._reinterpret(gl.int32, [words.shape[0], 1, 32], ROWS).index(i)


@gluon.jit
def _sq_tile(w, xw, acc):
    """SmoothQuant: one dp4a.s32.s32 a word into the rows' and blocks' exact int32 sums [BLOCK_N, 8]."""
    for j in gl.static_range(4):
        acc = dp4a(w[j], xw[j], acc, True, True, A_SIGNED=True)
    return acc


@gluon.jit
def _wo_tile(w, h, lo, step, s, acc):
    """Weight-only: per row and 16-input block ``sum w x_int`` (the high plane's chain shifted 8 bits carries the low
    plane's, as quant_gemv_int8._block_sums), then times ``scale x 2^E`` into the float32 sums [BLOCK_N, 8]."""
    a = 0
    for j in gl.static_range(4):
        a = dp4a(w[j], h[j], a, True, True, A_SIGNED=True)
    a = a << 8
    for j in gl.static_range(4):
        a = dp4a(w[j], lo[j], a, False, True, A_SIGNED=True)
    return acc + a.to(gl.float32) * (s * step)


@gluon.jit
def _consumer(w_bufs, w2_bufs, ready, empty, k_iters, inputs, GLU: gl.constexpr, A8: gl.constexpr,
              ONE_GROUP: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, B2: gl.constexpr,
              A2: gl.constexpr, PDL: gl.constexpr, PER: gl.constexpr, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr):
    x_ptr, pqs_ptr, aq_ptr, pqs2_ptr, aq2_ptr, s_ptr, s2_ptr, stride_sg, group, k0, rows, ok, made, made2 = inputs
    L: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])  # [PER, 128]: a warp a tile
    cols, col_ok = _tile_cols(k0, k_iters, PER, L)
    s = gl.expand_dims(gl.load(s_ptr + rows, mask=ok, other=0.0), 1)  # weight-only, one group: the row's scale
    s2 = gl.expand_dims(gl.load(s2_ptr + rows, mask=ok, other=0.0), 1)
    if PDL:  # x is the previous kernel's output; this one's outputs are read by the kernels before it
        gdc_wait()
        gdc_launch_dependents()
    x = gl.load(x_ptr + cols, mask=col_ok, other=0.0)
    if A8:
        _int8_words(x, pqs_ptr, aq_ptr, cols, col_ok, made[0], PER, HAS_PQS, COMPUTE)
        if GLU:  # the gate's own pre-quant and activation scales
            _int8_words(x, pqs2_ptr, aq2_ptr, cols, col_ok, made2[0], PER, HAS_PQS, COMPUTE)
        acc = gl.zeros([BLOCK_N, 8], gl.int32, A2)
    else:  # (no pre-quant scale: quant_gemv_int8.supported) one input for both matrices
        made_planes(x.to(gl.float32), made, PER)
        acc = gl.zeros([BLOCK_N, 8], gl.float32, A2)
    gl.thread_barrier()  # every consumer warp's tiles written before any reads them
    acc2 = gl.zeros_like(acc)
    for i in range(k_iters):
        st = i % STAGES
        mbarrier.wait(ready.index(st), (i // STAGES) & 1)
        w = _quarters(w_bufs.index(st).load(B2), A2)
        w2 = w
        if GLU:
            w2 = _quarters(w2_bufs.index(st).load(B2), A2)
        fence_async_shared()  # the reads ordered before the copy engine's next writes to the stage
        mbarrier.arrive(empty.index(st), count=1)
        if A8:
            acc = _sq_tile(w, _quarters(_made_words(made[0], i).load(B2), A2), acc)
            if GLU:
                acc2 = _sq_tile(w2, _quarters(_made_words(made2[0], i).load(B2), A2), acc2)
        else:
            xh_in, xl_in, c_in, e_in = _made_input(made, i)
            h = _quarters(xh_in.load(B2), A2)
            lo = _quarters(xl_in.load(B2), A2)
            step = e_in.load(A2).to(gl.float32, bitcast=True)
            if not ONE_GROUP:  # the tile's group's scales (quant_gemv_int8.supported: a tile lies in one group)
                g = (k0 + i) * 128 // group
                s = gl.expand_dims(gl.load(s_ptr + g * stride_sg + rows, mask=ok, other=0.0), 1)
                s2 = gl.expand_dims(gl.load(s2_ptr + g * stride_sg + rows, mask=ok, other=0.0), 1)
            acc = _wo_tile(w, h, lo, step, s, acc)
            if GLU:
                acc2 = _wo_tile(w2, h, lo, step, s2, acc2)
    return acc, acc2


@gluon.jit
def _made_buffers(A8: gl.constexpr, PER: gl.constexpr):
    """The consumers' input: SmoothQuant's words [PER, 32] (first), or weight-only's planes (quant_gemv_ws's four)."""
    MADE: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    B: gl.constexpr = 1 if A8 else PER  # (the planes' buffers unused by SmoothQuant: one row each)
    return (gl.allocate_shared_memory(gl.int32, [PER, 32], MADE), gl.allocate_shared_memory(gl.int32, [B, 32], MADE),
            gl.allocate_shared_memory(gl.int32, [B, 8], MADE), gl.allocate_shared_memory(gl.int32, [B, 8], MADE))


@gluon.jit
def _int8_ws_kernel(
    w_desc, w2_desc, x_ptr, s_ptr, pqs_ptr, aq_ptr, s2_ptr, pqs2_ptr, aq2_ptr, out_ptr,
    N, k_tiles, per_split, stride_os, stride_sg, group,
    A8: gl.constexpr, ONE_GROUP: gl.constexpr, GLU: gl.constexpr, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr,
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr, PER: gl.constexpr, num_warps: gl.constexpr,
):
    B2: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    A2: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [num_warps, 1], [1, 0])
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 32], w_desc.layout)
    w2_bufs = w_bufs
    made = _made_buffers(A8, PER)
    made2 = made
    if GLU:
        w2_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 32], w2_desc.layout)
        if A8:
            made2 = _made_buffers(A8, PER)
    ready, empty = stage_barriers(STAGES)
    pid_s = gl.program_id(1)
    row0, k0, k_iters = program_tiles(per_split, k_tiles, BLOCK_N)
    rows = row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, A2))
    ok = rows < N
    inputs = (x_ptr, pqs_ptr, aq_ptr, pqs2_ptr, aq2_ptr, s_ptr, s2_ptr, stride_sg, group, k0, rows, ok, made, made2)
    acc, acc2 = gl.warp_specialize([
        (_consumer, (w_bufs, w2_bufs, ready, empty, k_iters, inputs, GLU, A8, ONE_GROUP, BLOCK_N, STAGES, B2, A2,
                     PDL, PER, HAS_PQS, COMPUTE)),
        (_producer, (w_desc, w2_desc, w_bufs, w2_bufs, ready, empty, row0, k0, k_iters, GLU, STAGES)),
    ], [1], [40])
    if A8:  # the activation step x weight scale[n], one multiplier a row (QuantWeight.of), as quant_gemv_int8's
        y = gl.sum(acc, axis=1).to(gl.float32) * gl.load(s_ptr + rows, mask=ok, other=0.0)
        y2 = gl.sum(acc2, axis=1).to(gl.float32) * gl.load(s2_ptr + rows, mask=ok, other=0.0)
    else:
        y = gl.sum(acc, axis=1)
        y2 = gl.sum(acc2, axis=1)
    if GLU:
        gl.store(out_ptr + rows, silu_mul(y, y2, COMPUTE), mask=ok)
    else:
        gl.store(out_ptr + pid_s * stride_os + rows, y, mask=ok)


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool):
    """quant_gemv_int8.launch's contract for a warp-specialized config (``cfg.ws``): ``x`` [1, K] in the compute
    dtype before the pre-quant scale; ``out`` [splits, 1, N] float32 partials, or (``q2``: the GLU's gate, K not
    split) [1, N] in the compute dtype."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    glu = q2 is not None
    assert fits(q) and cfg.block_k == 128 and x.shape[0] == 1 and x.stride(1) == 1 and q.weight.is_contiguous()
    q2 = q2 or q
    assert (q2.pqs is None) == (q.pqs is None) and q2.scales.stride() == q.scales.stride()
    k_tiles = q.k // 128
    splits = 1 if glu else cfg.splits  # (a split past the last K tile writes zeros: every partial is written)
    per_split = triton.cdiv(k_tiles, splits)
    a8 = q.fmt == "int8_sq"
    descs = [TensorDescriptor.from_tensor(w.weight.view(torch.int32), [cfg.block_n, 32], W_LAYOUT) for w in (q, q2)]
    return _int8_ws_kernel[(triton.cdiv(q.n, cfg.block_n), splits)](
        *descs, x, q.scales, q.pqs if q.pqs is not None else x, q.act_q if a8 else q.scales,
        q2.scales, q2.pqs if q2.pqs is not None else x, q2.act_q if a8 else q2.scales, out,
        q.n, k_tiles, per_split, 0 if glu or out.dim() == 2 else out.stride(0),
        q.scales.stride(0) if q.scales.dim() == 2 else 0, q.group,
        A8=a8, ONE_GROUP=a8 or q.group == q.k, GLU=glu, HAS_PQS=q.pqs is not None, COMPUTE=tl_dtype(compute),
        BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, PDL=pdl, PER=triton.next_power_of_2(per_split),
        num_warps=cfg.num_warps, maxnreg=MAX_REGISTERS, launch_pdl=pdl,
    )
