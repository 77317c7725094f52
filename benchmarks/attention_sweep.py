"""The decode attention kernel's launch shape at the batches a loaded engine runs (issue 31): at 256 rows of ~1-2k
tokens attention is most of a step (H200, random 7B FP8, 2026-12-04: the step grew from 12 to 21 ms as the KV filled,
~60% of the bandwidth in attention). Times ``cuda/attention.decode_attention`` over a paged pool (block size 32,
blocks scattered) for batch x context x (BLOCK_T, warps, stages, splits), each checked against the module's default
launch, and prints the best per case with its GB/s of KV. One call on the H200:
    python benchmarks/attention_sweep.py -o attention_sweep.json
``--kv fp8``: the pool in E4M3 with a scale (``quantization.kv_cache: fp8``), half the bytes a key takes; every
shape with bfloat16 and with float16 dots (``attention.FP8_DOTS_F16``, each row's ``dots``).
On the CPU (Triton's interpreter) ``--dry-run`` runs one small case of each shape, unchecked for speed.
``--step``: instead of the sweep, the module's own launch as the decode step makes it (under PDL, its splits and
shape) against its variants: the L2 prefetch before the PDL wait at every batch (``attention.PREFETCH_MAX_ROWS``),
the split combine launched where one split stores its output itself (``attention.DIRECT_SINGLE_SPLIT``), both (the
launch before 2026-12-07); each a chain of PDL launches in one graph, as a step's layers are, and its output's bits
against the default's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.cuda import attention  # noqa: E402

HEADS, KV_HEADS, D, BS = 28, 4, 128, 32  # the 7B's attention; the pool's block size
SHAPES = [(bt, w, s) for bt in (32, 64, 128) for w, s in ((4, 2), (4, 3), (4, 4), (8, 2), (8, 3))]
# tiles loaded without the cp.async pipeline: an 8-bit tile then reaches the dots without byte-wise shared-memory
# reads (sm_90 SASS, tools/attention_sass.py: an FP8 tile's key loop 605 -> 482 instructions a thread, 370 with
# float16 dots)
SHAPES += [(32, 4, 1), (64, 4, 1), (32, 8, 1)]
# 128-key FP8 tiles (the loaded FP8 shape) without the pipeline, and with 8 warps (not in the 2026-12-05 sweep)
SHAPES += [(128, 4, 1), (128, 8, 1)]


def case(batch: int, ctx: int, device, gen, kv: str = "bf16"):
    """A pool holding ``batch`` rows of ``ctx`` tokens in scattered blocks, and one step's inputs."""
    per_row = -(-(ctx + 1) // BS)
    blocks = 1 + batch * per_row
    dtype = torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
    k = torch.randn(blocks, KV_HEADS, BS, D, generator=gen, device=device).to(dtype)
    v = torch.randn(blocks, KV_HEADS, BS, D, generator=gen, device=device).to(dtype)
    order = 1 + torch.randperm(blocks - 1, generator=gen, device=device)
    tables = order.view(batch, per_row)
    width = (HEADS + 2 * KV_HEADS) * D
    parts = torch.randn(1, batch, width, generator=gen, device=device)
    rot = torch.randn(ctx + 1, D, generator=gen, device=device)
    positions = torch.full((batch,), ctx, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)
    return k, v, tables, parts, rot, positions, rows


def launch(inputs, splits: int, block_t: int | None, pdl: bool = False):
    k, v, tables, parts, rot, positions, rows = inputs
    batch, device = positions.shape[0], positions.device
    o = torch.empty(batch, HEADS, splits, D, device=device)
    lse = torch.empty(batch, HEADS, splits, device=device)
    out = torch.empty(batch, HEADS * D, dtype=torch.bfloat16, device=device)

    scales = {}
    if k.dtype == torch.float8_e4m3fn:  # ModelOpt's FP8 KV scale, 1 (unless a layer's keys pass 448)
        one = torch.ones(1, device=device)
        scales = {"kv_scale": one, "kv_inv": one, "kv_unit": True}

    def call():
        attention.decode_attention(parts, None, rot, rot, k, v, positions, rows, tables, o, lse, out, None,
                                   heads=HEADS, kv_heads=KV_HEADS, compute=torch.bfloat16, block_t=block_t, pdl=pdl,
                                   **scales)
    return call, out


def graph_us(call, reps: int = 20) -> float:
    """Microseconds per call: ``reps`` calls captured in one CUDA graph, replayed between events."""
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            call()
    graph.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    graph.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000 / reps


# --step's variants: (name, PREFETCH_MAX_ROWS, DIRECT_SINGLE_SPLIT); the first is the module's default
STEP_VARIANTS = [("default", None, None), ("prefetch", 1 << 30, None), ("combine", None, False),
                 ("prefetch+combine", 1 << 30, False)]


def step_variants(batches, contexts, kv: str, device, gen, sm: int, cuda: bool) -> list[dict]:
    """``--step``: each variant's microseconds a launch (and combine) and whether its output is the default's."""
    defaults = attention.PREFETCH_MAX_ROWS, attention.DIRECT_SINGLE_SPLIT
    rows = []
    for batch, ctx in itertools.product(batches, contexts):
        inputs = case(batch, ctx, device, gen, kv)
        splits = attention.pick_splits(batch, KV_HEADS, sm)
        kv_bytes = 2 * batch * KV_HEADS * (ctx + 1) * D * inputs[0].element_size()
        want, line = None, []
        for name, prefetch, direct in STEP_VARIANTS:
            attention.PREFETCH_MAX_ROWS = defaults[0] if prefetch is None else prefetch
            attention.DIRECT_SINGLE_SPLIT = defaults[1] if direct is None else direct
            call, out = launch(inputs, splits, None, pdl=cuda)
            call()
            got = out.float().clone()
            want = got if want is None else want
            row = {"batch": batch, "ctx": ctx, "kv": kv, "splits": splits, "variant": name,
                   "equal": bool(torch.equal(got, want))}
            if cuda:
                row["us"] = graph_us(call)
                row["kv_gbps"] = kv_bytes / row["us"] / 1e3
                line.append(f"{name} {row['us']:7.1f} us ({row['kv_gbps']:5.0f} GB/s)")
            rows.append(row)
        attention.PREFETCH_MAX_ROWS, attention.DIRECT_SINGLE_SPLIT = defaults
        print(f"{kv} batch {batch:4d} ctx {ctx:5d} splits {splits}: " + "; ".join(line), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="64,128,256")
    ap.add_argument("--contexts", default="512,1024,2048")
    ap.add_argument("--kv", choices=("bf16", "fp8"), default="bf16", help="the pool's element type")
    ap.add_argument("--dry-run", action="store_true", help="the CPU through Triton's interpreter: one small case")
    ap.add_argument("--step", action="store_true", help="the module's launch against its variants (see above)")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    cuda = not args.dry_run
    device = torch.device("cuda" if cuda else "cpu")
    sm = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 4
    gen = torch.Generator(device=device).manual_seed(0)
    batches = [int(b) for b in args.batches.split(",")] if cuda else [2]
    contexts = [int(c) for c in args.contexts.split(",")] if cuda else [70]
    shapes = SHAPES if cuda else SHAPES[:2]
    warps_default, stages_default = attention.ATTENTION_WARPS, attention.ATTENTION_STAGES
    fp8_dots = attention.FP8_DOTS_F16
    rows, t0 = [], time.perf_counter()
    if args.step:
        rows = step_variants(batches, contexts, args.kv, device, gen, sm, cuda)
        batches = []  # (no sweep)
    for batch, ctx in itertools.product(batches, contexts):
        inputs = case(batch, ctx, device, gen, args.kv)
        base = attention.pick_splits(batch, KV_HEADS, sm)
        kv_bytes = 2 * batch * KV_HEADS * (ctx + 1) * D * inputs[0].element_size()
        # the module's own choice at this batch (launch_shape: the loaded shapes from LOADED_ROWS rows)
        chosen = attention.launch_shape(batch, args.kv == "fp8", True)
        default = (chosen.block_t, warps_default, chosen.stages)
        ref_call, ref_out = launch(inputs, base, default[0])
        ref_call()
        want = ref_out.float().clone()
        results = []
        dots = ("bf16", "f16") if args.kv == "fp8" else ("bf16",)
        for (block_t, warps, stages), splits, dot in itertools.product(shapes, sorted({base, 2 * base, 4 * base}),
                                                                       dots):
            attention.ATTENTION_WARPS, attention.ATTENTION_STAGES = warps, stages
            attention.FP8_DOTS_F16 = dot == "f16"
            row = {"batch": batch, "ctx": ctx, "kv": args.kv, "block_t": block_t, "warps": warps, "stages": stages,
                   "splits": splits, "dots": dot,
                   "default": (block_t, warps, stages) == default and splits == base
                   and dot == ("f16" if chosen.f16_dots else "bf16")}
            try:
                call, out = launch(inputs, splits, block_t)
                call()
                row["rel_err"] = float((out.float() - want).norm() / want.norm())
                if cuda:
                    row["us"] = graph_us(call)
                    row["kv_gbps"] = kv_bytes / row["us"] / 1e3
            except Exception as exc:  # a shape that does not compile or fit is a finding, not a stop
                row["failed"] = repr(exc)[:200]
            results.append(row)
        attention.ATTENTION_WARPS, attention.ATTENTION_STAGES = warps_default, stages_default
        attention.FP8_DOTS_F16 = fp8_dots
        rows += results
        timed = [r for r in results if "us" in r and r["rel_err"] < 1e-2]
        mine = next((r for r in results if r["default"]), {})
        if timed:
            best = min(timed, key=lambda r: r["us"])
            print(f"batch {batch:4d} ctx {ctx:5d}: default {mine.get('us', float('nan')):8.1f} us "
                  f"({mine.get('kv_gbps', 0):5.0f} GB/s); best {best['us']:8.1f} us ({best['kv_gbps']:5.0f} GB/s) "
                  f"BLOCK_T {best['block_t']} warps {best['warps']} stages {best['stages']} splits {best['splits']} "
                  f"dots {best['dots']}",
                  flush=True)
        else:
            failed = sum("failed" in r for r in results)
            print(f"batch {batch} ctx {ctx}: {len(results)} launches, {failed} failed, max rel err "
                  f"{max((r.get('rel_err', 0) for r in results), default=0):.1e}", flush=True)
    print(f"-- {len(rows)} launches in {time.perf_counter() - t0:.0f} s")
    if args.output:
        args.output.write_text(json.dumps({"gpu": torch.cuda.get_device_name(device) if cuda else "cpu",
                                           "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
