"""Compile the decode attention kernel (runtimes/torch_engine/cuda/attention.py) for an H200 (sm_90) on a machine
without a GPU and count the instructions of its key loop: one tile of BLOCK_T keys and values, per thread.

What an FP8 cache's tile costs in issue against its bytes (docs/perf-notes.md, "An FP8 KV cache"): at 4.3 TB/s an SM
gets ~16.5 bytes a cycle, so a tile is bandwidth-bound while its instructions stay under its bytes / 16.5.

    python tools/attention_sass.py                            # BF16 keys at the loaded shape (32 keys, 3 stages)
    python tools/attention_sass.py --kv fp8 --dots f16        # an FP8 cache at unit scale, float16 dots
    python tools/attention_sass.py --kv fp8 --dots f16 --stages 1
    python tools/attention_sass.py --tree                     # a tree verify step's kernel (TREE: slot shifts)

Static counts at the 7B's shape (28 heads, 4 KV heads, D 128, blocks of 32). Times still need the GPU.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv_sass import OPCODE, disassemble  # noqa: E402  (tools/: the same disassembly)

from trtllm_pipeline.runtimes.torch_engine.cuda import attention  # noqa: E402

MMA = ("HMMA", "HGMMA")


def compile_attention(kv: str, dots: str, block_t: int, stages: int, warps: int = 4, tree: bool = False,
                      write_only: bool = False):
    """The kernel as decode_attention launches it for a loaded step (one QKV split in int64 accumulators, bias;
    ``tree``: a tree verify step's, its ancestors' keys read through each row's slot shifts; ``write_only``: a verify
    step's first pass, the keys and values written and nothing attended)."""
    fp8 = kv != "bf16"
    compute = tl.bfloat16
    consts = dict(H=28, KVH=4, D=128, GROUP=7, NORM_PARTS=0, NORM_BLOCK=1, QKV_SPLITS=1, FIXED=True, HAS_BIAS=True,
                  SPLITS=2, BLOCK_H=16, BLOCK_T=block_t, BS=32, COMPUTE=compute, PDL=True, PREFETCH=True,
                  KV_FP8=fp8, KV_UNIT=kv == "fp8", LINE=128 if fp8 else 64, LINES=1 if fp8 else 2,
                  DOT=tl.float16 if dots == "f16" else compute, TREE=tree, WRITE_ONLY=write_only, DIRECT=False,
                  QUANT_OUT=True)
    cache = "*fp8e4nv" if fp8 else "*bf16"
    pointers = {"qkv_ptr": "*i64", "k_cache_ptr": cache, "v_cache_ptr": cache, "kv_scale_ptr": "*fp32",
                "kv_inv_ptr": "*fp32", "pos_ptr": "*i64", "slot_ptr": "*i64", "bt_ptr": "*i64", "o_ptr": "*fp32",
                "lse_ptr": "*fp32", "sq_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "rot_ptr": "*i64",
                "shift_ptr": "*i64", "out_ptr": "*fp8e4nv", "out_inv_ptr": "*fp32"}
    fn = attention._decode_attention_kernel
    sig = {n: "constexpr" if n in consts else pointers.get(n, "*bf16") if n.endswith("ptr")
           else "fp32" if n in ("qk_scale", "eps") else "i32" for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] not in ("constexpr", "fp32") and n != "stride_btj"}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def key_loop(sass: str) -> collections.Counter:
    """Opcodes of the shortest backward-branch loop with the most MMA instructions (the key loop)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", line))}
    best = collections.Counter()

    def key(mix):
        return sum(mix[m] for m in MMA), -sum(mix.values())

    for i, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i - 1:
            mix = collections.Counter(o.group(1) for body in lines[labels[m.group(1)]:i + 1]
                                      if (o := OPCODE.search(body)))
            if not best or key(mix) > key(best):
                best = mix
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", choices=("bf16", "fp8", "fp8-scaled"), default="bf16",
                    help="the cache: BF16, E4M3 at unit scale (ModelOpt's), E4M3 with a scale")
    ap.add_argument("--dots", choices=("bf16", "f16"), default="bf16", help="the dots' operand type (FP8_DOTS_F16)")
    ap.add_argument("--block-t", type=int, default=attention.LOADED_BLOCK_T)
    ap.add_argument("--stages", type=int, default=attention.LOADED_STAGES)
    ap.add_argument("--tree", action="store_true", help="a tree verify step's kernel (decode_attention's tree)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    kernel = compile_attention(a.kv, a.dots, a.block_t, a.stages, tree=a.tree)
    sass, regs = disassemble(kernel)
    mix = key_loop(sass)
    tile_bytes = 2 * a.block_t * 128 * (1 if a.kv != "bf16" else 2)  # one KV head's keys and values
    row = {"kv": a.kv, "dots": a.dots, "tree": a.tree, "block_t": a.block_t, "stages": a.stages, "registers": regs,
           "loop_per_thread": sum(mix.values()), "tile_bytes": tile_bytes,
           "byte_cycles_per_sm": round(tile_bytes / 16.5), "shared_bytes": kernel.metadata.shared, "mix": dict(mix)}
    if a.json:
        print(json.dumps(row))
        return
    tree = ", tree slot shifts" if a.tree else ""
    print(f"{a.kv} cache, {a.dots} dots{tree}, {a.block_t} keys a tile, {a.stages} stages: {regs} registers, key loop "
          f"{row['loop_per_thread']} instructions a thread against ~{row['byte_cycles_per_sm']} cycles of bytes, "
          f"{row['shared_bytes']} bytes of shared memory")
    print("  " + ", ".join(f"{op} {n}" for op, n in mix.most_common(16)))


if __name__ == "__main__":
    main()
