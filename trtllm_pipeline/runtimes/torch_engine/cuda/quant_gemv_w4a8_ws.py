"""W4A8-AWQ's batch-1 GEMV on Hopper, warp-specialized (Gluon): quant_gemv_w4a8's arithmetic, quant_gemv_ws's structure.

quant_gemv_w4a8's kernel loads its weights straight into registers (Triton's pipeliner stages no load that feeds no
``tl.dot``): under Nsight Compute its GLU at batch 1 reads DRAM 49% busy, its top stall (27.6%) waiting on those
loads, where INT4-AWQ's warp-specialized GEMV reads the same bytes at 72% (H100 2026-12-07f). Here one producer warp
copies each K tile's packed words, table words and units by the bulk tensor copy engine into STAGES buffers (a
"ready" and an "empty" mbarrier each), as quant_gemv_ws's producer does; none of them depends on the previous
kernel, so under PDL it starts at once. The four consumer warps first make their K slice's input themselves (the
input ``x`` before its pre-quant scale, as quant_gemv_w4a8 takes it): ``x * pre_quant_scale`` rounded to the
compute dtype, E4M3 of ``x * act_q`` (quant_linear's ``_act_tile``), then gemv_input's int16 block floating point
in shared memory, a warp a 128-input tile; then per K tile they wait for a full stage, read it into registers, free
it and turn each nibble into its integer by the table lookup of quant_gemv_w4a8 (two PRMT a word and parity) before
the same dp4a chains.

The numbers are quant_gemv_w4a8's: the same integer sums per row and 16-input block (the planes' -128 sum term is
the stored -8 sum times 16), accumulated per row and block in float32 over the K tiles in the same order; only the
final sum over a row's 8 blocks may add in another order. Output: quant_gemv_w4a8.launch's contract (float32 split-K
partials, or the GLU's ``silu(fc) * gate`` in the compute dtype). Gluon kernels do not run in Triton's interpreter:
the CPU tests compile this one for sm_90 (tools/gemv_sass.py --w4a8-ws); benchmarks/w4a8_gemv.py checks its numbers
on the GPU against float32 ``x @ W^T`` and the dot kernel (variant ``ws``). The decode step takes it at batch 1 on
Hopper unless ``TRTLLM_PIPELINE_W4A8_WS=0`` (``enabled``). H100 2026-12-07h, one machine: the 7B's four launches x 28
layers 1.886 ms against the register kernel's 2.266 (each alone, ``w4a8_gemv.py``), the W4A8 step at batch 1 and
context 2048 2.772 ms against 3.417 (``quant_gemm`` steps, logits against eager as close as the register kernel's),
through the pipeline 2.667 ms at context 128 (``bench --in-process``; the register kernel 3.270 on 2026-12-06f).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv_w4a8, support
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig, silu_mul, tl_dtype
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_ws import (PLAIN, W_LAYOUT, _block_dot, _made_input,
                                                                      _quarters, _tile_cols, made_planes,
                                                                      program_tiles, stage_barriers)

ENV = "TRTLLM_PIPELINE_W4A8_WS"
# registers per thread: each consumer thread holds 4 (GLU: 2 x 2) rows' lookup tables (8 words a row) beside the
# INT4 kernel's values; 3 programs of 5 warps still fit an SM's 64K registers at 128 (sm_90 compile: no spills)
MAX_REGISTERS = 128
# stages: three (quant_gemv_ws's); the GLU two: its K slice's two inputs in planes take 20 KB a program beside the
# stages (sm_90 compile: 58 KB at 128 rows, two programs an SM under the 132 KB the decode step pins for this kernel,
# quant_gemv.CARVEOUT_WS_MADE)
STAGES, GLU_STAGES = 3, 2
# Output rows a program, and K splits for about this many programs an SM (K of at most SHORT_K_TILES tiles: the 7B's
# qkv and dense; else proj). H100 2026-12-07g, each launch alone (benchmarks/w4a8_gemv.py): the GLU at 128 rows 39.2
# us against 44.0 at 64; qkv and dense at half the splits of 3 an SM 5.8 / 4.4 us against 6.9 / 5.7
BLOCK_N, GLU_BLOCK_N = 128, 128
PROGRAMS_PER_SM, SHORT_K_PROGRAMS_PER_SM, SHORT_K_TILES = 3, 1.5, 64


def enabled() -> bool:
    """Whether the decode step takes this kernel for W4A8-AWQ at batch 1 where it fits (Hopper): unless
    ``$TRTLLM_PIPELINE_W4A8_WS`` is 0 (then quant_gemv_w4a8's register-load kernel)."""
    return support.switch(ENV, True, "takes the warp-specialized W4A8 GEMV at batch 1")


def fits(q, block_n: int) -> bool:
    """128-input tiles of one scale group, at least 32 packed rows a tile (the units' 128-byte boxes), rows of the
    packed words and tables 16-byte aligned for the copy engine."""
    return (quant_gemv_w4a8.supported(q, 1) and q.group == 128 and q.k % 128 == 0 and block_n // 2 >= 32
            and q.n % 8 == 0)


def usable(q, device: torch.device) -> bool:
    """Whether this kernel can run for ``q`` here: a Hopper GPU (the copy engine, Gluon's sm_90 path) and its tiles."""
    return (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)
            and fits(q, min(BLOCK_N, GLU_BLOCK_N)))


def pick_config(q, sm_count: int, *, glu: bool = False, splits: int | None = None,
                block_n: int | None = None) -> LinearConfig:
    """128 output rows x 128 inputs, K split for about ``PROGRAMS_PER_SM`` programs per SM (K short:
    ``SHORT_K_PROGRAMS_PER_SM``) with no split left empty, ``STAGES`` deep; the GLU 128 rows, K not split,
    ``GLU_STAGES`` deep (the best of the variants timed alone: ``BLOCK_N``'s note)."""
    block_n = block_n or (GLU_BLOCK_N if glu else BLOCK_N)
    splits = 1 if glu else splits or split_rule(q, sm_count, block_n)
    return LinearConfig(1, block_n, 128, splits, 4, GLU_STAGES if glu else STAGES, tma=True, ws=True, w4a8=True)


def split_rule(q, sm_count: int, block_n: int) -> int:
    """K splits of 128-input tiles for about ``PROGRAMS_PER_SM`` programs per SM (K short: ``SHORT_K_PROGRAMS_PER_SM``),
    no split left empty (the rule of the kernels that make their input in shared memory)."""
    k_tiles = triton.cdiv(q.k, 128)
    per_sm = SHORT_K_PROGRAMS_PER_SM if k_tiles <= SHORT_K_TILES else PROGRAMS_PER_SM
    splits = max(1, min(k_tiles, round(per_sm * sm_count / triton.cdiv(q.n, block_n))))
    return triton.cdiv(k_tiles, triton.cdiv(k_tiles, splits))


# ------------------------------------------------------------------------------------------ the lookup (PTX)


@gluon.jit
def _prmt(a, b, sel):
    """``prmt.b32``: byte i of the result is byte ``sel[4i+2:4i]`` of {b, a}, or its sign replicated where bit 4i+3
    is set (quant_gemv_w4a8.prmt)."""
    return gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, sel], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _bitsel(a, b, mask):
    """``(a & mask) | (b & ~mask)`` in one LOP3 (quant_gemv_w4a8.bitsel)."""
    return gl.inline_asm_elementwise("lop3.b32 $0, $1, $2, $3, 0xE4;", "=r,r,r,r", [a, b, mask], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _row_tables(t_lo, t_hi):
    """One parity's P = [0, c_1 .. c_7] and N = [c_8, c_7 .. c_1] (lo and hi words) from T = [c_8, c_1 .. c_7]."""
    n_lo = _prmt(t_lo, t_hi, gl.full_like(t_lo, 0x5670))
    n_hi = _prmt(t_lo, t_hi, gl.full_like(t_lo, 0x1234))
    return t_lo & -256, t_hi, n_lo, n_hi


@gluon.jit
def _biased(tables, sel):
    """A word's weights of one parity as ``c_q + 128`` a byte (quant_gemv_w4a8._biased)."""
    p_lo, p_hi, n_lo, n_hi = tables
    return _prmt(p_lo, p_hi, sel) - _prmt(n_lo, n_hi, sel ^ 0x8888) + quant_gemv_w4a8.BIAS


# ------------------------------------------------------------------------------------------ the two partitions


@gluon.jit
def _copy_tile(descs, bufs, s, bar, row0, kt):
    """K tile ``kt``'s packed words, table words [4, HALF] (even lo, even hi, odd lo, odd hi) and units [2, HALF]."""
    w_desc, t_desc, u_desc = descs
    w_bufs, t_bufs, u_bufs = bufs
    tma.async_copy_global_to_shared(w_desc, [row0, kt * 32], bar, w_bufs.index(s))
    tma.async_copy_global_to_shared(t_desc, [4 * kt, row0], bar, t_bufs.index(s))
    tma.async_copy_global_to_shared(u_desc, [2 * kt, row0], bar, u_bufs.index(s))


@gluon.jit
def _producer(descs, descs2, bufs, bufs2, ready, empty, row0, k0, k_iters, GLU: gl.constexpr,
              STAGES: gl.constexpr):
    # nothing copied here depends on the previous kernel: no PDL wait
    w_desc, t_desc, u_desc = descs
    NBYTES: gl.constexpr = (w_desc.block_type.nbytes + t_desc.block_type.nbytes + u_desc.block_type.nbytes) * \
        (2 if GLU else 1)
    for i in range(k_iters):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier reads as phase 1 done
        bar = ready.index(s)
        mbarrier.expect(bar, NBYTES)
        _copy_tile(descs, bufs, s, bar, row0, k0 + i)
        if GLU:
            _copy_tile(descs2, bufs2, s, bar, row0, k0 + i)


@gluon.jit
def _pqs(pqs_ptr, cols, ok, HAS_PQS: gl.constexpr):
    """The pre-quant scales at inputs ``cols`` (no kernel writes them: loaded before the PDL wait); ones without."""
    s = gl.full(cols.shape, 1.0, gl.float32, cols.type.layout)
    if HAS_PQS:
        s = gl.load(pqs_ptr + cols, mask=ok, other=0.0).to(gl.float32)
    return s


@gluon.jit
def raw_input(x_ptr, pqs_ptr, pqs2_ptr, k0, k_iters, GLU: gl.constexpr, PER: gl.constexpr, HAS_PQS: gl.constexpr,
              PDL: gl.constexpr):
    """This program's K slice of the input row as [PER, 128] (a warp a tile, each word's inputs in the table
    lookup's order 0, 2, 1, 3), which of them are its own, and the pre-quant scales there (the gate's second; the
    fc's again without a GLU), for the consumers to make their input from. The scales are loaded before the PDL
    wait; the input, the previous kernel's output, after it (and this kernel's outputs, which the kernels before it
    read, are let go then)."""
    L: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    cols, ok = _tile_cols(k0, k_iters, PER, L)
    cols = (cols & -4) | ((cols & 1) << 1) | ((cols >> 1) & 1)
    pqs = _pqs(pqs_ptr, cols, ok, HAS_PQS)
    pqs2 = pqs
    if GLU:
        pqs2 = _pqs(pqs2_ptr, cols, ok, HAS_PQS)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    return gl.load(x_ptr + cols, mask=ok, other=0.0), ok, pqs, pqs2


@gluon.jit
def _fp8_tiles(x, pqs, aq_ptr, ok, made, PER: gl.constexpr, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr):
    """This program's K tiles of one matrix's input as quant_gemv_w4a8._input makes them: ``x`` [PER, 128] (each
    word's inputs in the selectors' order 0, 2, 1, 3) times the pre-quant scales ``pqs`` rounded to the compute
    dtype, E4M3 of that times the activation scale, in gemv_input's planes (``made``)."""
    v = x.to(gl.float32)
    if HAS_PQS:
        v = (v * pqs).to(COMPUTE).to(gl.float32)
    v = gl.minimum(gl.maximum(v * gl.load(aq_ptr), -448.0), 448.0)
    v = v.to(gl.float8e4nv, fp_downcast_rounding="rtne").to(gl.float32)
    made_planes(gl.where(ok, v, 0.0), made, PER)


@gluon.jit
def _read_tile(bufs, s, inp, HALF: gl.constexpr, B2: gl.constexpr, A2: gl.constexpr):
    """Stage ``s`` into registers: the weights' and planes' words by block [HALF, 8] x 4, each parity's table words
    and unit [HALF, 1], the blocks' sums and powers of two [1, 8]."""
    w_bufs, t_bufs, u_bufs = bufs
    xh_in, xl_in, c_in, e_in = inp
    u = _quarters(w_bufs.index(s).load(B2), A2)
    h = _quarters(xh_in.load(B2), A2)
    lo = _quarters(xl_in.load(B2), A2)
    ROW: gl.constexpr = gl.SliceLayout(1, A2)
    VEC: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    tb = t_bufs.index(s)._reinterpret(gl.int32, [4 * HALF], VEC)
    ub = u_bufs.index(s)._reinterpret(gl.float32, [2 * HALF], VEC)
    te = (gl.expand_dims(tb.slice(0, HALF).load(ROW), 1), gl.expand_dims(tb.slice(HALF, HALF).load(ROW), 1))
    to = (gl.expand_dims(tb.slice(2 * HALF, HALF).load(ROW), 1), gl.expand_dims(tb.slice(3 * HALF, HALF).load(ROW), 1))
    ue = gl.expand_dims(ub.slice(0, HALF).load(ROW), 1)
    uo = gl.expand_dims(ub.slice(HALF, HALF).load(ROW), 1)
    c = c_in.load(A2) << 4  # the planes store -8 sum x_int; the biased bytes take 128
    step = e_in.load(A2).to(gl.float32, bitcast=True)
    return u, h, lo, te, to, ue, uo, c, step


@gluon.jit
def _parities(tab_e, tab_o, p):
    """A weight word's even and odd rows as biased bytes. Selectors (quant_gemv_w4a8._selectors): row 2j's and
    2j + 1's nibbles of inputs 0, 2, 1, 3, with ``t = p >> 12`` one LOP3 each (the odd row's then shifted by 4)."""
    t = p >> 12
    return (_biased(tab_e, _bitsel(p, t, gl.full_like(t, 0x0F0F))),
            _biased(tab_o, _bitsel(p, t, gl.full_like(t, 0xF0F0)) >> 4))


@gluon.jit
def _accumulate(t, acc_e, acc_o):
    """One tile into the even and odd rows' float32 accumulators [HALF, 8] (quant_gemv_w4a8._matrix)."""
    u, h, lo, te, to, ue, uo, c, step = t
    tab_e = _row_tables(te[0], te[1])
    tab_o = _row_tables(to[0], to[1])
    e0, o0 = _parities(tab_e, tab_o, u[0])
    e1, o1 = _parities(tab_e, tab_o, u[1])
    e2, o2 = _parities(tab_e, tab_o, u[2])
    e3, o3 = _parities(tab_e, tab_o, u[3])
    acc_e += _block_dot((e0, e1, e2, e3), h, lo, c).to(gl.float32) * (ue * step)
    acc_o += _block_dot((o0, o1, o2, o3), h, lo, c).to(gl.float32) * (uo * step)
    return acc_e, acc_o


@gluon.jit
def _consumer(bufs, bufs2, ready, empty, k_iters, inputs, GLU: gl.constexpr, HALF: gl.constexpr,
              STAGES: gl.constexpr, B2: gl.constexpr, A2: gl.constexpr, PDL: gl.constexpr, PER: gl.constexpr,
              HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr):
    x_ptr, pqs_ptr, aq_ptr, pqs2_ptr, aq2_ptr, k0, made, made2 = inputs
    x, ok, pqs, pqs2 = raw_input(x_ptr, pqs_ptr, pqs2_ptr, k0, k_iters, GLU, PER, HAS_PQS, PDL)
    _fp8_tiles(x, pqs, aq_ptr, ok, made, PER, HAS_PQS, COMPUTE)
    if GLU:  # the gate's own pre-quant and activation scales
        _fp8_tiles(x, pqs2, aq2_ptr, ok, made2, PER, HAS_PQS, COMPUTE)
    gl.thread_barrier()  # every consumer warp's tiles written before any reads them
    acc_e = gl.zeros([HALF, 8], gl.float32, A2)
    acc_o = gl.zeros([HALF, 8], gl.float32, A2)
    acc2_e = gl.zeros([HALF, 8], gl.float32, A2)
    acc2_o = gl.zeros([HALF, 8], gl.float32, A2)
    for i in range(k_iters):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        t = _read_tile(bufs, s, _made_input(made, i), HALF, B2, A2)
        if GLU:
            t2 = _read_tile(bufs2, s, _made_input(made2, i), HALF, B2, A2)
        fence_async_shared()  # the reads ordered before the copy engine's next writes to the stage
        mbarrier.arrive(empty.index(s), count=1)
        acc_e, acc_o = _accumulate(t, acc_e, acc_o)
        if GLU:
            acc2_e, acc2_o = _accumulate(t2, acc2_e, acc2_o)
    return acc_e, acc_o, acc2_e, acc2_o


@gluon.jit
def _buffers(descs, HALF: gl.constexpr, STAGES: gl.constexpr):
    w_desc, t_desc, u_desc = descs
    return (gl.allocate_shared_memory(gl.int32, [STAGES, HALF, 32], w_desc.layout),
            gl.allocate_shared_memory(gl.int32, [STAGES, 4, HALF], t_desc.layout),
            gl.allocate_shared_memory(gl.float32, [STAGES, 2, HALF], u_desc.layout))


@gluon.jit
def _made_buffers(PER: gl.constexpr):
    MADE: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])  # per tile: plain rows
    return (gl.allocate_shared_memory(gl.int32, [PER, 32], MADE), gl.allocate_shared_memory(gl.int32, [PER, 32], MADE),
            gl.allocate_shared_memory(gl.int32, [PER, 8], MADE), gl.allocate_shared_memory(gl.int32, [PER, 8], MADE))


@gluon.jit
def _w4a8_ws_kernel(
    w_desc, t_desc, u_desc, w2_desc, t2_desc, u2_desc,
    x_ptr, pqs_ptr, aq_ptr, osc_ptr, pqs2_ptr, aq2_ptr, osc2_ptr, out_ptr,
    N, k_tiles, per_split, stride_os,
    GLU: gl.constexpr, HAS_PQS: gl.constexpr, COMPUTE: gl.constexpr, HALF: gl.constexpr, STAGES: gl.constexpr,
    PDL: gl.constexpr, PER: gl.constexpr, num_warps: gl.constexpr,
):
    B2: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    A2: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [num_warps, 1], [1, 0])
    descs = (w_desc, t_desc, u_desc)
    descs2 = (w2_desc, t2_desc, u2_desc)
    bufs = _buffers(descs, HALF, STAGES)
    bufs2 = bufs
    made = _made_buffers(PER)
    made2 = made
    if GLU:
        bufs2 = _buffers(descs2, HALF, STAGES)
        made2 = _made_buffers(PER)
    ready, empty = stage_barriers(STAGES)
    pid_s = gl.program_id(1)
    row0, k0, k_iters = program_tiles(per_split, k_tiles, HALF)
    inputs = (x_ptr, pqs_ptr, aq_ptr, pqs2_ptr, aq2_ptr, k0, made, made2)
    acc_e, acc_o, acc2_e, acc2_o = gl.warp_specialize([
        (_consumer, (bufs, bufs2, ready, empty, k_iters, inputs, GLU, HALF, STAGES, B2, A2, PDL, PER, HAS_PQS,
                     COMPUTE)),
        (_producer, (descs, descs2, bufs, bufs2, ready, empty, row0, k0, k_iters, GLU, STAGES)),
    ], [1], [40])
    rows = row0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, A2))  # packed rows: outputs 2 j and 2 j + 1
    ok = rows < N // 2
    osc = gl.load(osc_ptr)
    y_e = gl.sum(acc_e, axis=1) * osc
    y_o = gl.sum(acc_o, axis=1) * osc
    if GLU:
        osc2 = gl.load(osc2_ptr)
        gl.store(out_ptr + 2 * rows, silu_mul(y_e, gl.sum(acc2_e, axis=1) * osc2, COMPUTE), mask=ok)
        gl.store(out_ptr + 2 * rows + 1, silu_mul(y_o, gl.sum(acc2_o, axis=1) * osc2, COMPUTE), mask=ok)
    else:
        gl.store(out_ptr + pid_s * stride_os + 2 * rows, y_e, mask=ok)
        gl.store(out_ptr + pid_s * stride_os + 2 * rows + 1, y_o, mask=ok)


# ------------------------------------------------------------------------------------------ launch


def _descriptors(q, half: int) -> list:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    n = q.n
    return [TensorDescriptor.from_tensor(q.weight.view(torch.int32), [half, 32], W_LAYOUT),
            TensorDescriptor.from_tensor(q.lut.view(-1, n // 2), [4, half], PLAIN),
            TensorDescriptor.from_tensor(q.units.view(-1, n // 2), [2, half], PLAIN)]


def launch(x: torch.Tensor, q, q2, out: torch.Tensor, cfg: LinearConfig, compute: torch.dtype, pdl: bool):
    """quant_gemv_w4a8.launch's contract for a warp-specialized config (``cfg.ws``): ``x`` [1, K] in the compute
    dtype before the pre-quant scale; ``out`` [splits, 1, N] float32 partials, or (``q2``: the GLU's gate, K not
    split) [1, N] in the compute dtype."""
    glu = q2 is not None
    assert fits(q, cfg.block_n) and cfg.block_k == 128 and x.shape[0] == 1 and x.stride(1) == 1
    assert q.weight.is_contiguous()
    q = quant_gemv_w4a8.with_tables(q)
    q2 = quant_gemv_w4a8.with_tables(q2) if glu else q
    assert (q2.pqs is None) == (q.pqs is None)
    half = cfg.block_n // 2
    k_tiles = q.k // 128
    splits = 1 if glu else cfg.splits  # (a split past the last K tile writes zeros: every partial is written)
    per_split = triton.cdiv(k_tiles, splits)
    descs = _descriptors(q, half) + (_descriptors(q2, half) if glu else _descriptors(q, half))
    return _w4a8_ws_kernel[(triton.cdiv(q.n // 2, half), splits)](
        *descs, x, q.pqs if q.pqs is not None else x, q.act_q, q.out_scale,
        q2.pqs if q2.pqs is not None else x, q2.act_q, q2.out_scale, out,
        q.n, k_tiles, per_split, 0 if glu or out.dim() == 2 else out.stride(0),
        GLU=glu, HAS_PQS=q.pqs is not None, COMPUTE=tl_dtype(compute), HALF=half, STAGES=cfg.num_stages, PDL=pdl,
        PER=triton.next_power_of_2(per_split), num_warps=cfg.num_warps, maxnreg=MAX_REGISTERS, launch_pdl=pdl,
    )
