"""Compile the INT4 GEMV (runtimes/torch_engine/cuda/quant_gemv.py) for an H200 (sm_90) on a machine without a GPU and
count the instructions of its K loop: registers, instructions per thread and per weight, the mix.

Triton's wheel carries ptxas, cuobjdump and nvdisasm, so the SASS the GPU would run is readable here; that
is how the LOP3 count per nibble (docs/perf-notes.md, run 18) and the dp4a kernel's 0.5 IDP.4A per weight
were checked without spending device time.

    python tools/gemv_sass.py                       # qkv/dense's default at the 7B shapes
    python tools/gemv_sass.py --block-n 16 --block-k 256 --glu --no-tile-scale --splits 1     # the GLU's
    python tools/gemv_sass.py --block-n 128 --stages 2                                       # proj's
    python tools/gemv_sass.py --tma --glu --block-n 64 --splits 1 --stages 3     # the copy-engine GLU
    python tools/gemv_sass.py --ws --glu --block-n 64 --splits 1 --stages 3      # Hopper's (warp-specialized)
    python tools/gemv_sass.py --rows 8 --block-n 64                              # batch 2-16's, 8 input rows
    python tools/gemv_sass.py --mma 8 --block-n 64                  # quant_mma_int4 (INT8 tensor cores), 8 rows
    python tools/gemv_sass.py --int8 int8_sq --block-n 64 --block-k 256 --stages 3   # INT8's (quant_gemv_int8)
    python tools/gemv_sass.py --w4a8 --block-n 128 --stages 3                        # W4A8's (quant_gemv_w4a8)
    python tools/gemv_sass.py --w4a8-ws 28 --glu --block-n 64 --stages 2   # W4A8's warp-specialized (Hopper)
    python tools/gemv_sass.py --int8-ws int8_wo --block-n 64 --stages 3 --tiles 3   # INT8's warp-specialized
    python tools/gemv_sass.py --w4a8-mma 11 --block-n 128 --stages 3   # W4A8's lookup into FP8 wgmma (Hopper)
    python tools/gemv_sass.py --int4-mma 8 --block-n 128 --stages 3    # INT4 at 2-16 rows, bfloat16 wgmma
    python tools/gemv_sass.py --w4a8-rows 8 --block-n 128 --stages 3   # W4A8 at 2-64 rows, the lookup into FP8 wgmma
    python tools/gemv_sass.py --w4a8-rows 8 --block-n 128 --stages 3 --prefetch   # its input one K tile ahead
    python tools/gemv_sass.py --int8-rows 8 --block-n 64 --stages 4    # SmoothQuant at 1-64 rows, int8 wgmma
    python tools/gemv_sass.py --int8wo-rows 8 --block-n 64 --stages 4  # INT8 weight-only at 1-64 rows, fp16 wgmma

Static counts of one loop iteration, with the divisibility the JIT would see at the 7B shapes (pointers,
N, K and strides divisible by 16). Times still need the GPU: a count is where to look, not a speed.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import tempfile
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from trtllm_pipeline.runtimes.torch_engine.cuda import (quant_gemv, quant_gemv_int8, quant_gemv_int8_ws,
                                                       quant_gemv_w4a8, quant_gemv_w4a8_mma, quant_gemv_w4a8_ws,
                                                       quant_gemv_ws, quant_mma_int4, quant_rows_int4_mma,
                                                       quant_rows_int8_mma, quant_rows_int8wo_mma,
                                                       quant_rows_w4a8_mma)

TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
DIVISIBLE = {"N", "K", "stride_wn", "stride_sg", "stride_s2", "stride_os"}


def compile_kernel(block_n: int, block_k: int, glu: bool, tile_scale: bool, warps: int, stages: int,
                   splits: int = 28, single: bool = False, tma: bool = False):
    fn = quant_gemv._int4_gemv_kernel
    consts = dict(GROUP=128, XB=16, GLU=glu, EVEN=True, TILE_SCALE=tile_scale, PREPARE_OUT=glu, HAS_PQS_OUT=True,
                  XB_OUT=16, SPLITS=splits, REDUCE=False, FIXED=not glu, CLEAR=True, COMPUTE=tl.bfloat16,
                  BLOCK_N=block_n, BLOCK_K=block_k, PREFETCH=stages > 1 and not tma, SINGLE=single, EARLY=True,
                  ASM=True, PDL=True, TMA=tma, STAGES=stages)
    pointers = {"count_ptr": "*i32", "ws_ptr": "*fp32", "clear_ptr": "*i64", "xp_ptr": "*i32", "xp2_ptr": "*i32",
                "xp_out_ptr": "*i32", "w_ptr": "*i32", "w2_ptr": "*i32", "s_ptr": "*fp32", "s2_ptr": "*fp32",
                "out_ptr": "*bf16" if glu else "*i64"}
    descs = {**dict.fromkeys(("w_desc", "w2_desc"), f"tensordesc<i32[{block_n // 2}, {block_k // 4}]>"),
             **dict.fromkeys(("x_desc", "x2_desc"), f"tensordesc<i32[2, {block_k // 4}]>")}
    if not tma:
        consts.update(dict.fromkeys(descs))
    sig = {n: "constexpr" if n in consts else pointers.get(n, "*bf16") if n.endswith("ptr") else descs[n]
           if n.endswith("desc") else "i32" for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] != "constexpr" and "desc" not in sig[n] and (n.endswith("ptr") or n in DIVISIBLE)}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 1})


def compile_rows(rows: int, block_n: int, block_k: int, glu: bool, tile_scale: bool, warps: int, stages: int,
                 splits: int = 28):
    """quant_gemv's several-row kernel (``_int4_gemv_rows_kernel``) for BLOCK_M = ``rows`` input rows, as the decode
    step launches it at batch 2-16 (the GLU preparing proj's inputs, the others adding into int64 accumulators)."""
    fn = quant_gemv._int4_gemv_rows_kernel
    consts = dict(GROUP=128, XB=16, GLU=glu, EVEN=True, TILE_SCALE=tile_scale, PREPARE_OUT=glu, HAS_PQS_OUT=True,
                  XB_OUT=16, SPLITS=splits, REDUCE=False, FIXED=not glu, CLEAR=True, COMPUTE=tl.bfloat16,
                  BLOCK_M=rows, BLOCK_N=block_n, BLOCK_K=block_k, ASM=True, PDL=True, STAGES=stages)
    pointers = {"count_ptr": "*i32", "clear_ptr": "*i64", "xp_ptr": "*i32", "xp2_ptr": "*i32", "xp_out_ptr": "*i32",
                "w_ptr": "*i32", "w2_ptr": "*i32", "s_ptr": "*fp32", "s2_ptr": "*fp32",
                "out_ptr": "*bf16" if glu else "*i64"}
    sig = {n: "constexpr" if n in consts else pointers.get(n, "*bf16") if n.endswith("ptr") else "i32"
           for n in fn.arg_names}
    divisible = DIVISIBLE | {"stride_xp", "stride_om", "stride_xo"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] != "constexpr" and (n.endswith("ptr") or n in divisible)}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 1})


def compile_ws(block_n: int, glu: bool, splits: int, stages: int, tiled: bool = quant_gemv_ws.TILED_WEIGHTS,
               fold: int = 0, scales16: bool = quant_gemv_ws.SCALES_16BIT):
    """quant_gemv_ws's kernel (Gluon) for sm_90, as the decode step launches it (the GLU preparing proj's input,
    the others adding into int64 accumulators, each clearing another linear's; ``tiled``: reading the
    tile-by-tile copy of the weights; ``fold``: making its input from the residual and the previous linear's sums,
    that many K tiles per program (gemv_input.NormFold); ``scales16``: bfloat16 scales, else float32)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    half = block_n // 2

    def desc(shape, dtype="i32"):
        layout = (quant_gemv_ws.W_LAYOUT if shape == [half, 32] else
                  quant_gemv_ws.PLAIN16 if dtype == "bf16" else quant_gemv_ws.PLAIN)
        return f"tensordesc<{dtype}[{shape[0]}, {shape[1]}],{layout!r}>"

    descs = {"w_desc": desc([half, 32]), "x_desc": desc([2, 32]),
             "s_desc": desc([2, half], "bf16" if scales16 else "fp32"),
             "ce_desc": desc([2, 8])}
    consts = dict(GLU=glu, PREPARE_OUT=glu, HAS_PQS_OUT=True, SPLITS=splits, REDUCE=False, FIXED=not glu,
                  CLEAR=True, COMPUTE=tl.bfloat16, HALF=half, STAGES=stages, PDL=True,
                  EARLY=quant_gemv_ws.EARLY_WEIGHTS, TILED=tiled, FOLD=fold > 0,
                  PER=triton.next_power_of_2(fold) if fold else 1, num_warps=4)
    sig = {**descs, **{k.replace("_desc", "2_desc"): v for k, v in descs.items()},
           "out_ptr": "*bf16" if glu else "*i64", "pqs_out_ptr": "*bf16", "xp_out_ptr": "*i32", "count_ptr": "*i32",
           "clear_ptr": "*i64", "sums_ptr": "*i64", "res_ptr": "*bf16", "res_out_ptr": "*bf16", "scale_ptr": "*fp32",
           "sq_ptr": "*fp32",
           **dict.fromkeys(("N", "k_tiles", "per_split", "stride_os", "m_nib", "m_xor", "m_nib_hi", "m_xor_hi",
                            "clear_n"), "i32"),
           **dict.fromkeys(consts, "constexpr")}
    src = GluonASTSource(quant_gemv_ws._ws_gemv_kernel, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": quant_gemv_ws.MAX_REGISTERS})


def compile_w4a8_ws(block_n: int, glu: bool, stages: int, per: int):
    """quant_gemv_w4a8_ws's kernel (Gluon) for sm_90 as the decode step launches it at batch 1 (``per``: K tiles a
    program, the 7B's 28 for the GLU and qkv / dense unsplit)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    half = block_n // 2
    consts = dict(GLU=glu, HAS_PQS=True, COMPUTE=tl.bfloat16, HALF=half, STAGES=stages, PDL=True,
                  PER=triton.next_power_of_2(per), num_warps=4)
    plain = quant_gemv_w4a8_ws.PLAIN
    descs = {"w_desc": f"tensordesc<i32[{half}, 32],{quant_gemv_w4a8_ws.W_LAYOUT!r}>",
             "t_desc": f"tensordesc<i32[4, {half}],{plain!r}>", "u_desc": f"tensordesc<fp32[2, {half}],{plain!r}>"}
    sig = {**descs, **{k.replace("_desc", "2_desc"): v for k, v in descs.items()},
           **dict.fromkeys(("x_ptr", "pqs_ptr", "pqs2_ptr"), "*bf16"),
           **dict.fromkeys(("aq_ptr", "osc_ptr", "aq2_ptr", "osc2_ptr"), "*fp32"),
           "out_ptr": "*bf16" if glu else "*fp32",
           **dict.fromkeys(("N", "k_tiles", "per_split", "stride_os"), "i32"),
           **dict.fromkeys(consts, "constexpr")}
    src = GluonASTSource(quant_gemv_w4a8_ws._w4a8_ws_kernel, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": quant_gemv_w4a8_ws.MAX_REGISTERS})


def _aligned(fn, sig: dict) -> dict:
    """Triton's divisibility attributes for ``fn``'s pointers and row strides, as the JIT specializes them at the 7B's
    launches (16-byte aligned tensors, strides multiples of 16): without them a row's 4 inputs load as 4 loads."""
    return {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
            if sig[n] != "constexpr" and "desc" not in sig[n] and (n.endswith("ptr") or n.startswith("stride_"))}


def compile_w4a8_mma(block_n: int, glu: bool, stages: int, per: int):
    """quant_gemv_w4a8_mma's kernel (Gluon: E4M3 bytes by lookup into wgmma) for sm_90 at batch 1."""
    from triton.experimental.gluon._runtime import GluonASTSource

    half = block_n // 2
    consts = dict(GLU=glu, HAS_PQS=True, COMPUTE=tl.bfloat16, HALF=half, STAGES=stages, PDL=True,
                  PER=triton.next_power_of_2(per), num_warps=4)
    plain = quant_gemv_w4a8_mma.PLAIN
    descs = {"w_desc": f"tensordesc<i32[{half}, 32],{quant_gemv_w4a8_mma.W_LAYOUT!r}>",
             "t_desc": f"tensordesc<i32[4, {half}],{plain!r}>"}
    sig = {**descs, **{k.replace("_desc", "2_desc"): v for k, v in descs.items()},
           **dict.fromkeys(("x_ptr", "pqs_ptr", "pqs2_ptr"), "*bf16"),
           **dict.fromkeys(("aq_ptr", "osc_ptr", "aq2_ptr", "osc2_ptr"), "*fp32"),
           "out_ptr": "*bf16" if glu else "*fp32",
           **dict.fromkeys(("N", "k_tiles", "per_split", "stride_os"), "i32"),
           **dict.fromkeys(consts, "constexpr")}
    src = GluonASTSource(quant_gemv_w4a8_mma._w4a8_mma_kernel, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": quant_gemv_w4a8_mma.MAX_REGISTERS})


def _compile_rows(fn, descs: dict, pointers: dict, scalars: tuple, consts: dict, glu: bool, registers: int):
    """A wgmma row kernel (quant_rows_int4_mma, quant_rows_w4a8_mma) for sm_90: ``descs`` its first matrix's copy
    descriptors (the second's named with a 2), then its pointers, the output, its int32 scalars and constants."""
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {**descs, **{k.replace("_desc", "2_desc"): v for k, v in descs.items()}, **pointers,
           "out_ptr": "*bf16" if glu else "*fp32", **dict.fromkeys(scalars, "i32"),
           **dict.fromkeys(consts, "constexpr")}
    src = GluonASTSource(fn, sig, constexprs=consts, attrs=_aligned(fn, sig))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": registers})


def compile_int4_mma(block_n: int, glu: bool, stages: int, rows: int, made: bool | None = None,
                     prefetch: bool = False, scaled: bool = False):
    """quant_rows_int4_mma's kernel (Gluon: INT4 dequantized in registers into bfloat16 wgmma) for sm_90 at ``rows``
    input rows (the MMA's N: 8 or 16, each program staging its input; 32 or 64, or ``made``: the wide kernel, its
    input made once and copied beside the weights; ``prefetch``: the staged form's input one K tile ahead;
    ``scaled``: the wide form with each weight scaled in registers)."""
    half = block_n // 2
    nb = max(8, triton.next_power_of_2(rows))
    wide = nb > quant_rows_int4_mma.STAGED_ROWS if made is None else made
    consts = dict(GLU=glu, COMPUTE=tl.bfloat16, HALF=half, NB=nb, STAGES=stages, PDL=True, num_warps=4)
    descs = {"w_desc": f"tensordesc<i32[{half}, 32],{quant_rows_int4_mma.W_LAYOUT!r}>",
             "s_desc": f"tensordesc<bf16[2, {half}],{quant_rows_int4_mma.PLAIN16!r}>"}
    if wide:
        b = f"tensordesc<bf16[{nb}, 64],{quant_rows_int4_mma._b_layout()!r}>"
        sums = f"tensordesc<fp32[1, {quant_rows_int4_mma.sums_columns(nb)}],{quant_rows_int4_mma.PLAIN!r}>"
        descs.update(lo_desc=b, hi_desc=b, o_desc=sums)
        consts["SCALED"] = scaled
        fn = quant_rows_int4_mma._int4_rows_wide_kernel
        pointers = {}
        scalars = ("M", "N", "k_tiles", "per_split", "stride_os", "stride_om")
    else:
        consts.update(HAS_PQS=True, PREFETCH=prefetch)
        fn = quant_rows_int4_mma._int4_rows_mma_kernel
        pointers = dict.fromkeys(("x_ptr", "pqs_ptr", "pqs2_ptr"), "*bf16")
        scalars = ("M", "N", "k_tiles", "per_split", "stride_x", "stride_os", "stride_om")
    registers = quant_rows_int4_mma.WIDE_REGISTERS if wide else quant_rows_int4_mma.MAX_REGISTERS
    return _compile_rows(fn, descs, pointers, scalars, consts, glu, registers)


def compile_w4a8_rows(block_n: int, glu: bool, stages: int, rows: int, made: bool | None = None,
                      prefetch: bool = False):
    """quant_rows_w4a8_mma's kernel (Gluon: E4M3 bytes by lookup into FP8 wgmma, the batch as N) for sm_90 at ``rows``
    input rows (the MMA's N: 8 or 16, each program staging its input; 32 or 64, or ``made``: the wide kernel, its
    input made once and copied beside the weights; ``prefetch``: the staged form's input one K tile ahead)."""
    half = block_n // 2
    nb = max(8, triton.next_power_of_2(rows))
    wide = nb > quant_rows_w4a8_mma.STAGED_ROWS if made is None else made
    consts = dict(GLU=glu, COMPUTE=tl.bfloat16, HALF=half, NB=nb, STAGES=stages, PDL=True, num_warps=4)
    plain = quant_gemv_w4a8_mma.PLAIN
    descs = {"w_desc": f"tensordesc<i32[{half}, 32],{quant_gemv_w4a8_mma.W_LAYOUT!r}>",
             "t_desc": f"tensordesc<i32[4, {half}],{plain!r}>"}
    if wide:
        b = f"tensordesc<fp8e4nv[{nb}, 128],{quant_rows_w4a8_mma.B_LAYOUT.value!r}>"
        descs.update(x_desc=b, xn_desc=b)
        fn = quant_rows_w4a8_mma._w4a8_rows_wide_kernel
        pointers = dict.fromkeys(("osc_ptr", "osc2_ptr"), "*fp32")
        scalars = ("M", "N", "k_tiles", "per_split", "stride_os", "stride_om")
    else:
        consts.update(HAS_PQS=True, PREFETCH=prefetch)
        fn = quant_rows_w4a8_mma._w4a8_rows_mma_kernel
        pointers = {**dict.fromkeys(("x_ptr", "pqs_ptr", "pqs2_ptr"), "*bf16"),
                    **dict.fromkeys(("aq_ptr", "osc_ptr", "aq2_ptr", "osc2_ptr"), "*fp32")}
        scalars = ("M", "N", "k_tiles", "per_split", "stride_x", "stride_os", "stride_om")
    registers = quant_rows_w4a8_mma.WIDE_REGISTERS if wide else quant_rows_w4a8_mma.MAX_REGISTERS
    return _compile_rows(fn, descs, pointers, scalars, consts, glu, registers)


def compile_int8_rows(glu: bool, stages: int, rows: int):
    """quant_rows_int8_mma's kernel (Gluon: SmoothQuant's int8 weights from shared memory into wgmma, the rows as N)
    for sm_90 at ``rows`` input rows (the MMA's N: 8 to 64)."""
    nb = max(8, triton.next_power_of_2(rows))
    consts = dict(GLU=glu, COMPUTE=tl.bfloat16, BLOCK_N=quant_rows_int8_mma.BLOCK_N, NB=nb, STAGES=stages, PDL=True,
                  num_warps=4)
    layout = quant_rows_int8_mma.LAYOUT.value
    descs = {"w_desc": f"tensordesc<i8[{quant_rows_int8_mma.BLOCK_N}, 128],{layout!r}>",
             "x_desc": f"tensordesc<i8[{nb}, 128],{layout!r}>"}
    scalars = ("M", "N", "k_tiles", "per_split", "stride_os", "stride_om")
    return _compile_rows(quant_rows_int8_mma._int8_rows_mma_kernel, descs, dict.fromkeys(("s_ptr", "s2_ptr"), "*fp32"),
                         scalars, consts, glu, quant_rows_int8_mma.MAX_REGISTERS)


def compile_int8wo_rows(glu: bool, stages: int, rows: int):
    """quant_rows_int8wo_mma's kernel (Gluon: INT8 weight-only words made float16 in registers into wgmma, the rows as
    N) for sm_90 at ``rows`` input rows (the MMA's N: 8 to 64)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    m = quant_rows_int8wo_mma
    nb = max(8, triton.next_power_of_2(rows))
    consts = dict(GLU=glu, COMPUTE=tl.bfloat16, NB=nb, STAGES=stages, PDL=True, num_warps=4)
    words = f"tensordesc<i32[64, 32],{m.W_LAYOUT!r}>"
    half = f"tensordesc<fp16[{nb}, 64],{m._b_layout()!r}>"
    sig = {"w_desc": words, "w2_desc": words, "lo_desc": half, "hi_desc": half,
           **dict.fromkeys(("s_ptr", "s2_ptr", "r_ptr"), "*fp32"), "out_ptr": "*bf16" if glu else "*fp32",
           **dict.fromkeys(("M", "N", "k_tiles", "per_split", "stride_os", "stride_om"), "i32"),
           **dict.fromkeys(consts, "constexpr")}
    fn = m._int8wo_rows_mma_kernel
    src = GluonASTSource(fn, sig, constexprs=consts, attrs=_aligned(fn, sig))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": m.MAX_REGISTERS})


def compile_int8_ws(fmt: str, block_n: int, glu: bool, stages: int, per: int):
    """quant_gemv_int8_ws's kernel (Gluon) for sm_90 as the decode step launches it at batch 1 (``per``: K tiles a
    program; weight-only per channel, as ModelOpt exports it)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    sq = fmt == "int8_sq"
    consts = dict(A8=sq, ONE_GROUP=True, GLU=glu, HAS_PQS=sq, COMPUTE=tl.bfloat16, BLOCK_N=block_n, STAGES=stages,
                  PDL=True, PER=triton.next_power_of_2(per), num_warps=4)
    desc = f"tensordesc<i32[{block_n}, 32],{quant_gemv_int8_ws.W_LAYOUT!r}>"
    sig = {"w_desc": desc, "w2_desc": desc, **dict.fromkeys(("x_ptr", "pqs_ptr", "pqs2_ptr"), "*bf16"),
           **dict.fromkeys(("s_ptr", "aq_ptr", "s2_ptr", "aq2_ptr"), "*fp32"), "out_ptr": "*bf16" if glu else "*fp32",
           **dict.fromkeys(("N", "k_tiles", "per_split", "stride_os", "stride_sg", "group"), "i32"),
           **dict.fromkeys(consts, "constexpr")}
    src = GluonASTSource(quant_gemv_int8_ws._int8_ws_kernel, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": quant_gemv_int8_ws.MAX_REGISTERS})


def compile_int8(fmt: str, block_n: int, block_k: int, glu: bool, warps: int, stages: int):
    """quant_gemv_int8's kernel (INT8 SmoothQuant or weight-only at batch 1) at the 7B's divisibility."""
    fn = quant_gemv_int8._int8_gemv_kernel
    sq = fmt == "int8_sq"
    consts = dict(A8=sq, HAS_PQS=sq, GLU=glu, EVEN=True, COMPUTE=tl.bfloat16, BLOCK_N=block_n, BLOCK_K=block_k,
                  ASM=True, PDL=True)
    pointers = {"w_ptr": "*i32", "w2_ptr": "*i32", "s_ptr": "*fp32", "s2_ptr": "*fp32", "aq_ptr": "*fp32",
                "aq2_ptr": "*fp32", "out_ptr": "*bf16" if glu else "*fp32"}
    sig = {n: "constexpr" if n in consts else pointers.get(n, "*bf16") if n.endswith("ptr") else "i32"
           for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] != "constexpr" and (n.endswith("ptr") or n in DIVISIBLE)}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def compile_w4a8(block_n: int, block_k: int, glu: bool, warps: int, stages: int):
    """quant_gemv_w4a8's kernel (W4A8-AWQ at batch 1) at the 7B's group (128) and divisibility."""
    fn = quant_gemv_w4a8._w4a8_gemv_kernel
    consts = dict(GROUP=128, XB=16, HAS_PQS=True, GLU=glu, EVEN=True, COMPUTE=tl.bfloat16, BLOCK_N=block_n,
                  BLOCK_K=block_k, PREFETCH=stages > 1, ASM=True, PDL=True)
    pointers = {"w_ptr": "*i32", "w2_ptr": "*i32", "t_ptr": "*i32", "t2_ptr": "*i32", "u_ptr": "*fp32",
                "u2_ptr": "*fp32", "aq_ptr": "*fp32", "aq2_ptr": "*fp32", "osc_ptr": "*fp32", "osc2_ptr": "*fp32",
                "out_ptr": "*bf16" if glu else "*fp32"}
    sig = {n: "constexpr" if n in consts else pointers.get(n, "*bf16") if n.endswith("ptr") else "i32"
           for n in fn.arg_names}
    divisible = DIVISIBLE | {"stride_tg", "stride_t2", "stride_tw", "stride_ug", "stride_u2"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] != "constexpr" and (n.endswith("ptr") or n in divisible)}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    # (stages > 1: the kernel's own prefetch of the next tile into registers, as launch passes it; Triton's pipeliner
    # never staged these loads through shared memory)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 1})


def compile_mma(rows: int, block_n: int, block_k: int, warps: int, stages: int, splits: int = 28):
    """quant_mma_int4's INT8 tensor-core kernel for BLOCK_M = ``rows`` input rows (group 128, blocks of 16 inputs),
    adding into int64 accumulators as the decode step launches it."""
    fn = quant_mma_int4._int4_mma_rows_kernel
    consts = dict(GROUP=128, XB=16, EVEN=True, SPLITS=splits, REDUCE=False, FIXED=True, CLEAR=True, BLOCK_M=rows,
                  BLOCK_N=block_n, BLOCK_K=block_k, KC=quant_mma_int4.chunk(rows, 16), ASM=True, PDL=True,
                  STAGES=stages)
    pointers = {"count_ptr": "*i32", "clear_ptr": "*i64", "xp_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*fp32",
                "out_ptr": "*i64"}
    sig = {n: "constexpr" if n in consts else pointers[n] if n.endswith("ptr") else "i32" for n in fn.arg_names}
    divisible = DIVISIBLE | {"stride_xp", "stride_om"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] != "constexpr" and (n.endswith("ptr") or n in divisible)}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 1})


def disassemble(kernel) -> tuple[str, int | None]:
    """(SASS text, registers per thread) of a compiled kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([str(TOOLS / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
        usage = subprocess.run([str(TOOLS / "cuobjdump"), "-res-usage", str(cubin)], capture_output=True,
                               text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    return sass, int(regs.group(1)) if regs else None


def loop_mix(sass: str) -> collections.Counter:
    """The K loop's opcodes (``k_loop``)."""
    return collections.Counter(o.group(1) for line in k_loop(sass) if (o := OPCODE.search(line)))


def k_loop(sass: str) -> list[str]:
    """The SASS lines between a conditional backward branch's target label and the branch: of such loops, the
    shortest with the most dot-product instructions (the K loop; a copy-engine kernel also has loops that wait on its
    barriers, and unconditional returns from their out-of-line retries at the kernel's end to a label inside the K
    loop: a range that skips the loop's first part). Dot instructions: dp4a (IDP), or the tensor cores' (IMMA / HMMA,
    and Hopper's warpgroup IGMMA / HGMMA / QGMMA)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", line))}
    best, best_key = [], None
    for i, line in enumerate(lines):
        m = re.search(r"@!?U?P\w+\s+BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i - 1:  # a conditional backward branch, not the exit's self-loop
            body = lines[labels[m.group(1)]:i + 1]
            mix = collections.Counter(o.group(1) for line in body if (o := OPCODE.search(line)))
            key = (_dots(mix), -sum(mix.values()))
            if best_key is None or key > best_key:
                best, best_key = body, key
    return best


def rewritten_operands(sass: str) -> list[str]:
    """The K loop's instructions that write a register an asynchronous ``wgmma`` still reads as its A operand (from
    the MMA to the next ``WARPGROUP.DEPBAR``): each such write is undefined behaviour (PTX: the A registers must not be
    modified before the wait for their group), so a kernel that issues its MMAs asynchronously must have none."""
    live, bad = {}, []
    for line in k_loop(sass):
        if not OPCODE.search(line):
            continue
        if (m := re.search(r"GMMA\.\S+ R\d+, R(\d+),", line)) is not None:  # A from registers: 4 of them a k-step
            live.update(dict.fromkeys(range(int(m.group(1)), int(m.group(1)) + 4), line.strip()))
        elif "DEPBAR" in line:
            live.clear()
        elif (m := re.search(r"\*/\s+(?:@!?U?P\w+\s+)?[A-Z][A-Z0-9_.]*\s+R(\d+)", line)) and int(m.group(1)) in live:
            bad.append(line.strip())
    return bad


def _dots(mix: collections.Counter) -> int:
    return sum(mix[op] for op in ("IDP", "IMMA", "HMMA", "IGMMA", "HGMMA", "QGMMA"))


def _tensor_ops(sass: str) -> dict:
    """The whole kernel's tensor-core instructions by opcode (IMMA/HMMA: mma.sync; IGMMA/HGMMA: wgmma)."""
    ops = collections.Counter(o.group(1) for line in sass.splitlines() if (o := OPCODE.search(line)))
    return {op: n for op, n in ops.items() if op in ("IMMA", "HMMA", "IGMMA", "HGMMA", "QGMMA")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-n", type=int, default=256, help="output rows per program (default 256)")
    ap.add_argument("--block-k", type=int, default=128, help="inputs per K tile (default 128)")
    ap.add_argument("--glu", action="store_true", help="the fc + gate variant (two matrices)")
    ap.add_argument("--no-tile-scale", action="store_true", help="a scale load per word (tile spans groups)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=1, help="1: loads straight to registers; 2: the next tile prefetched")
    ap.add_argument("--tma", action="store_true", help="weight tiles by the bulk tensor copy engine, --stages deep")
    ap.add_argument("--ws", action="store_true", help="the warp-specialized kernel (quant_gemv_ws), --stages deep")
    ap.add_argument("--tiled", action="store_true", help="with --ws: the weights' tile-by-tile copy")
    ap.add_argument("--fold", type=int, default=0,
                    help="with --ws: the norm folded in (gemv_input.NormFold), this many K tiles per program")
    ap.add_argument("--scales32", action="store_true", help="with --ws: float32 scales (SCALES_16BIT off)")
    ap.add_argument("--splits", type=int, default=28, help="K splits (> 1: the last program per row tile sums them)")
    ap.add_argument("--rows", type=int, default=0, help="the several-row kernel for this many input rows (2-16)")
    ap.add_argument("--int8", choices=("int8_sq", "int8_wo"), default=None,
                    help="INT8's GEMV (quant_gemv_int8) for this format, --stages deep")
    ap.add_argument("--w4a8", action="store_true", help="W4A8's GEMV (quant_gemv_w4a8), --stages deep")
    ap.add_argument("--int8-ws", choices=("int8_sq", "int8_wo"), default=None,
                    help="INT8's warp-specialized GEMV (quant_gemv_int8_ws) for this format, --tiles K tiles a program")
    ap.add_argument("--tiles", type=int, default=28, help="with --int8-ws: K tiles a program (default 28)")
    ap.add_argument("--int4-mma", type=int, default=0, metavar="ROWS",
                    help="INT4's register-dequantizing wgmma kernel (quant_rows_int4_mma) for ROWS input rows")
    ap.add_argument("--int8-rows", type=int, default=0, metavar="ROWS",
                    help="SmoothQuant's wgmma kernel (quant_rows_int8_mma) for ROWS input rows, --stages deep")
    ap.add_argument("--int8wo-rows", type=int, default=0, metavar="ROWS",
                    help="INT8 weight-only's wgmma kernel (quant_rows_int8wo_mma) for ROWS input rows, --stages deep")
    ap.add_argument("--made", action="store_true", help="with --w4a8-rows / --int4-mma: the wide form at any rows")
    ap.add_argument("--scaled", action="store_true",
                    help="with --int4-mma's wide form: each weight bfloat16(q s) in registers, no per-tile sums")
    ap.add_argument("--prefetch", action="store_true",
                    help="with --w4a8-rows / --int4-mma: the staged form loading its input one K tile ahead")
    ap.add_argument("--w4a8-rows", type=int, default=0, metavar="ROWS",
                    help="W4A8's lookup wgmma kernel for several rows (quant_rows_w4a8_mma) for ROWS input rows")
    ap.add_argument("--w4a8-mma", type=int, default=0, metavar="TILES",
                    help="W4A8's FP8 tensor-core GEMV (quant_gemv_w4a8_mma), TILES K tiles a program, --stages deep")
    ap.add_argument("--w4a8-ws", type=int, default=0, metavar="TILES",
                    help="W4A8's warp-specialized GEMV (quant_gemv_w4a8_ws), TILES K tiles a program, --stages deep")
    ap.add_argument("--mma", type=int, default=0,
                    help="quant_mma_int4's INT8 tensor-core kernel for this many input rows (2-16)")
    ap.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    a = ap.parse_args()
    if a.int4_mma:
        kernel = compile_int4_mma(a.block_n, a.glu, a.stages, a.int4_mma, a.made or None, a.prefetch,
                                  a.scaled)
    elif a.w4a8_rows:
        kernel = compile_w4a8_rows(a.block_n, a.glu, a.stages, a.w4a8_rows, a.made or None, a.prefetch)
    elif a.int8_rows:
        kernel = compile_int8_rows(a.glu, a.stages, a.int8_rows)
    elif a.int8wo_rows:
        kernel = compile_int8wo_rows(a.glu, a.stages, a.int8wo_rows)
    elif a.w4a8_mma:
        kernel = compile_w4a8_mma(a.block_n, a.glu, a.stages, a.w4a8_mma)
    elif a.int8_ws:
        kernel = compile_int8_ws(a.int8_ws, a.block_n, a.glu, a.stages, a.tiles)
    elif a.w4a8_ws:
        kernel = compile_w4a8_ws(a.block_n, a.glu, a.stages, a.w4a8_ws)
    elif a.mma:
        kernel = compile_mma(a.mma, a.block_n, a.block_k, a.warps, a.stages, a.splits)
    elif a.w4a8:
        kernel = compile_w4a8(a.block_n, a.block_k, a.glu, a.warps, a.stages)
    elif a.int8:
        kernel = compile_int8(a.int8, a.block_n, a.block_k, a.glu, a.warps, a.stages)
    elif a.rows:
        kernel = compile_rows(a.rows, a.block_n, a.block_k, a.glu, not a.no_tile_scale, a.warps, a.stages, a.splits)
    elif a.ws:
        kernel = compile_ws(a.block_n, a.glu, a.splits, a.stages, a.tiled or quant_gemv_ws.TILED_WEIGHTS, a.fold,
                            quant_gemv_ws.SCALES_16BIT and not a.scales32)
    else:
        kernel = compile_kernel(a.block_n, a.block_k, a.glu, not a.no_tile_scale, a.warps, a.stages, a.splits,
                                tma=a.tma)
    sass, regs = disassemble(kernel)
    mix = loop_mix(sass)
    per_thread = sum(mix.values())
    weights = a.block_n * a.block_k * (2 if a.glu else 1)
    if a.json:
        spills = sum(1 for line in sass.splitlines() if (o := OPCODE.search(line)) and o.group(1) in ("LDL", "STL"))
        print(json.dumps({"registers": regs, "threads": 32 * a.warps, "weights": weights,
                          "loop_per_thread": per_thread, "mix": dict(mix), "shared_bytes": kernel.metadata.shared,
                          "local_memory_ops": spills, "tensor_core_ops": _tensor_ops(sass)}))
        return
    print(f"block {a.block_n} x {a.block_k}{' GLU' if a.glu else ''}, {a.warps} warps, {a.stages} stages: "
          f"{regs} registers, loop {per_thread} instructions per thread, "
          f"{per_thread * 32 * a.warps / weights:.2f} per weight")
    print("  " + ", ".join(f"{op} {n}" for op, n in mix.most_common(16)))


if __name__ == "__main__":
    main()
