"""Compile quant_gemm's INT4 GEMM (runtimes/torch_engine/cuda/quant_gemm.py) for an H100/H200 (sm_90) on a machine
without a GPU and count the instructions of its K loop per thread, with the nibbles unpacked as int8 elementwise ops
or by PTX (``LinearConfig.ptx_nibbles``). Where tools/gemv_sass.py reads the batch-1 GEMV, this reads the tensor-core
GEMM that decode batches of 2-64 rows and prefill use.

    python tools/gemm_sass.py                                  # the 7B's GLU and proj at M 8, both unpackings
    python tools/gemm_sass.py --block-n 64 --glu               # one shape
    python tools/gemm_sass.py --w4a8                           # W4A8-AWQ's
    python tools/gemm_sass.py --glu --block-n 128 --glu-splits 3   # the GLU split K (its epilogue sums the splits)
    python tools/gemm_sass.py --glu --block-n 128 --glu-splits 3 --scaled   # its input scaled by the norm before

Static counts of one loop iteration, with the divisibility the JIT would see at the 7B shapes. Times need the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv_sass import disassemble, loop_mix  # noqa: E402  (tools/: the same disassembly)

from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm  # noqa: E402

POINTERS = {"x_ptr": "*bf16", "x2_ptr": "*bf16",
            "w_ptr": "*i8", "w2_ptr": "*i8", "s_ptr": "*fp32", "s2_ptr": "*fp32", "pqs_ptr": "*bf16",
            "pqs2_ptr": "*bf16", "aq_ptr": "*fp32", "aq2_ptr": "*fp32", "osc_ptr": "*fp32", "osc2_ptr": "*fp32",
            "bias_ptr": "*bf16", "ws_ptr": "*fp32", "count_ptr": "*i32"}


def compile_w4(*, glu: bool, ptx: bool, block_m: int = 16, block_n: int = 128, block_k: int = 128,
               scale_weights: bool = True, swap: bool = True, warps: int = 4, stages: int = 3, a8: bool = False,
               glu_splits: int = 1, scaled: bool = False):
    """The INT4-AWQ GEMM (``a8``: W4A8-AWQ's) as ``quant_gemm.launch`` would compile it at a decode batch (bfloat16,
    group 128, the input's pre-quant scale; split-K partials, or the GLU's silu(gate) x up, over ``glu_splits``
    K splits; ``scaled``: as the decode step launches it since 2026-12-07, the input already times its pre-quant scale,
    mlp.gate's its own)."""
    fn = quant_gemm._w4_gemm_kernel
    consts = dict(GROUP=128, A8=a8, HAS_PQS=not scaled, GLU=glu, X2=scaled and glu, HAS_BIAS=False, PARTIALS=not glu,
                  ONE_GROUP=True, GLU_SPLITS=glu_splits if glu else 1,
                  POST_SCALE=not (scale_weights or a8), EVEN_N=True, EVEN_K=True, EVEN_M=False, SWAP=swap, MAGIC=0x4308,
                  OFFSET=136.0, COMPUTE=tl.bfloat16, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PDL=True,
                  PTX=ptx)
    pointers = dict(POINTERS, out_ptr="*bf16" if glu else "*fp32")
    sig = {n: "constexpr" if n in consts else pointers.get(n, "i32") for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] != "constexpr" and n not in ("M", "k_iters_per_split")}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block-n", type=int, help="one tile width (default: GLU 128 and 64, proj 128)")
    ap.add_argument("--glu", action="store_true", help="with --block-n: the GLU (two matrices), else one matrix")
    ap.add_argument("--w4a8", action="store_true", help="W4A8-AWQ's GEMM (E4M3 weights into FP8 MMAs)")
    ap.add_argument("--glu-splits", type=int, default=1, help="the GLU split K this many ways (its epilogue then "
                    "sums the splits' partials from a workspace)")
    ap.add_argument("--scaled", action="store_true", help="the input already times its pre-quant scale (the decode "
                    "step's GEMMs since 2026-12-07; the GLU then reads mlp.gate's input apart)")
    ap.add_argument("--json", action="store_true", help="a JSON list, a row per kernel")
    args = ap.parse_args()
    shapes = [(args.glu, args.block_n)] if args.block_n else [(True, 128), (True, 64), (False, 128)]
    rows = []
    for glu, block_n in shapes:
        for ptx in (False, True):
            sass, regs = disassemble(compile_w4(glu=glu, ptx=ptx, block_n=block_n, a8=args.w4a8,
                                                glu_splits=args.glu_splits, scaled=args.scaled))
            mix = loop_mix(sass)
            n = sum(mix.values())
            weights = (2 if glu else 1) * block_n * 128 // 128  # a K tile's weights a thread (128 threads)
            if args.json:
                rows.append({"glu": glu, "block_n": block_n, "ptx": ptx, "loop_per_thread": n,
                             "glu_splits": args.glu_splits if glu else 1, "atomics": sass.count("ATOM"),
                             "weights_per_thread": weights, "registers": regs, "mix": dict(mix)})
            else:
                print(f"{'glu' if glu else 'one matrix'} block_n {block_n} {'PTX' if ptx else 'int8 ops'}: {n} "
                      f"instructions a K tile ({n / weights:.1f} a weight), {regs} registers; {mix.most_common(8)}")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
