"""The batch-invariant GEMM (``cuda/invariant_gemm``, issue 31) against the library GEMMs the eager forward calls today,
at the 7B's shapes: time, and whether each row is the same bits at every M.

    python benchmarks/invariant_gemm.py -o out.json [--shapes qkv,dense,fc_gate,proj,lm_head] [--ms 1,16,...,4096]
    python benchmarks/invariant_gemm.py --dry-run -o out.json   # CPU, Triton's interpreter, tiny shapes: the code paths

Needs only torch and triton (the repository on sys.path for the kernel module; no other package of the project).

Shapes (K, N): qkv 3584 -> 4608 (with its bias, as Qwen2's), dense 3584 -> 3584, fc_gate 3584 -> 37888 (fc and gate
fused), proj 18944 -> 3584, and lm_head 3584 -> 152064 (BF16 in, float32 logits out). M in 1, 16, 128, 512, 2048,
4096. Per linear shape two kinds:

  bf16  ours ``gemm(x, W, bias, out_dtype=bf16)``; library ``F.linear`` (cuBLAS).
  fp8   E4M3 weight, per-tensor scales, as ``model.Linear``'s fp8 format: ``ours`` from a bfloat16 x (the
        quantization pass + the GEMM: what the layer would call), ``ours_e4m3`` from an already E4M3 x (the GEMM
        alone), ``ours_fast`` the same without promotion (``promote=False``: the whole K in the FP8 accumulator);
        ``library`` ``quantize_fp8`` + ``torch._scaled_mm`` (``Linear.forward`` today), ``library_e4m3`` the
        ``_scaled_mm`` alone, ``library_fast`` with ``use_fast_accum=True``.

lm_head: ours ``gemm(x, W, out_dtype=float32)``; library ``torch.mm(..., out_dtype=float32)`` (``float32_logits``'s
CUDA path; where this torch lacks it, ``F.linear`` of float32 copies, noted in the JSON).

Timing: each call captured REPS times into one CUDA graph (REPS from one eager call's time, so a replay takes ~2 ms or
more), the weight rotated over copies that together exceed twice the L2 cache (so a call reads its weight from HBM,
as a forward does), the graph replayed ``--repeats`` times, each replay timed with CUDA events: the median per call
in microseconds, TFLOP/s (2 M N K) and the weight's GB/s.

Invariance: for every variant, ours and the library's, x of the largest M (+ 37 rows); its rows at every M (first rows)
and at every M from row 37 (other offsets in the tiles, other neighbours) against the same rows of the largest call,
bitwise. Ours must be all equal; the library's count is what issue 31 is about. ``vs_library``: the largest relative
difference of ours from the library at the largest M (the order of sums differs: rounding only).

JSON (``-o``): device, versions, the launch configs, ``rows`` (one per shape, kind, variant, M), ``invariance`` (one per
shape, kind, variant), ``errors`` (a part that failed: recorded, the rest still runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPES = {"qkv": (3584, 4608), "dense": (3584, 3584), "fc_gate": (3584, 37888), "proj": (18944, 3584),
          "lm_head": (3584, 152064)}
BIASED = {"qkv"}
MS = (1, 16, 128, 512, 2048, 4096)
OFFSET = 37
GRAPH_MS = 2.0  # a replay's least length: launch and event overheads far below it
# Tiny shapes for --dry-run (the interpreter): K a multiple of the tiles, N not
DRY_SHAPES = {"qkv": (256, 192), "proj": (384, 160), "lm_head": (128, 200)}
DRY_MS = (1, 16, 130)
# ``ours_narrow``: tiles this many columns wide. At decode sizes the 128-column tiles give the 7B's narrow linears 28-36
# programs on 132 SMs; if a row's bits are the same from narrower tiles (the wgmma's N is the only change), the tile
# width could follow M without breaking invariance: ``tile_widths`` says, per shape, at the largest M.
NARROW_N = 64


def args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--out", type=Path, help="write the JSON here")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated of " + ", ".join(SHAPES))
    p.add_argument("--ms", default=",".join(map(str, MS)), help="comma-separated M values")
    p.add_argument("--repeats", type=int, default=15, help="graph replays timed per call (median)")
    p.add_argument("--dry-run", action="store_true", help="CPU through Triton's interpreter at tiny shapes")
    return p


def main() -> None:
    opts = args_parser().parse_args()
    if opts.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
        sys.path.insert(0, str(REPO / "tests"))
        __import__("triton_interpreter")  # (its round-to-nearest conversions; before the kernel module)
    import torch
    import triton

    from trtllm_pipeline.runtimes.torch_engine.cuda import invariant_gemm

    bench = Bench(torch, invariant_gemm, opts)
    shapes = DRY_SHAPES if opts.dry_run else SHAPES
    names = [s for s in opts.shapes.split(",") if s in shapes]
    ms = DRY_MS if opts.dry_run else tuple(int(m) for m in opts.ms.split(","))
    t0 = time.time()
    for name in names:
        kinds = ("lm_head",) if name == "lm_head" else ("bf16", "fp8")
        for kind in kinds:
            try:
                bench.shape(name, *shapes[name], kind, ms)
            except Exception as e:  # noqa: BLE001  (recorded; the next part still runs)
                bench.errors.append({"shape": name, "kind": kind, "error": repr(e),
                                     "traceback": traceback.format_exc()[-3000:]})
                print(f"{name} {kind}: FAILED {e!r}", flush=True)
            if bench.device.type == "cuda":
                torch.cuda.empty_cache()
    result = {"device": bench.device_name, "torch": torch.__version__, "triton": triton.__version__,
              "dry_run": opts.dry_run, "configs": {"bf16": invariant_gemm.BF16_CONFIG._asdict(),
                                                   "fp8": invariant_gemm.FP8_CONFIG._asdict()},
              "notes": bench.notes, "rows": bench.rows, "invariance": bench.invariance,
              "tile_widths": bench.tile_widths, "errors": bench.errors,
              "seconds": round(time.time() - t0, 1)}
    bench.table()
    if opts.out:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {opts.out}")


class Bench:
    def __init__(self, torch, invariant_gemm, opts):
        self.torch, self.ig, self.opts = torch, invariant_gemm, opts
        self.device = torch.device("cpu" if opts.dry_run else "cuda")
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            self.device_name, self.l2 = props.name, getattr(props, "L2_cache_size", 50 << 20)
        else:
            self.device_name, self.l2 = "cpu (Triton interpreter)", 1 << 20
        self.gen = torch.Generator(device=self.device).manual_seed(0)
        self.rows, self.invariance, self.errors, self.notes = [], [], [], []
        self.tile_widths = []  # ``ours_narrow`` against ``ours``: may the tile width follow M (a faster decode)?

    # -- operands ------------------------------------------------------------------------------------------------
    def randn(self, *shape, std=1.0):
        return self.torch.randn(*shape, generator=self.gen, device=self.device) * std

    def weights(self, w, copies_for_l2: bool):
        """The weight and copies of it: together over twice the L2 cache (timing), or the one (invariance)."""
        if not copies_for_l2:
            return [w]
        nbytes = w.numel() * w.element_size()
        return [w] + [w.clone() for _ in range(max(1, math.ceil(2 * self.l2 / nbytes)) - 1)]

    def variants(self, name: str, k: int, n: int, kind: str) -> dict:
        """name -> (fn(x, w), the x it takes from the bfloat16 x, weight)."""
        torch, ig = self.torch, self.ig
        F = torch.nn.functional
        bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
        bias = self.randn(n).to(bf16) if name in BIASED else None
        if kind == "bf16":
            w = self.randn(n, k, std=k**-0.5).to(bf16)
            narrow = ig.BF16_CONFIG._replace(block_n=NARROW_N)
            return {"ours": (lambda x, w: ig.gemm(x, w, bias=bias, out_dtype=bf16), None, w),
                    "ours_narrow": (lambda x, w: ig.gemm(x, w, bias=bias, out_dtype=bf16, config=narrow), None, w),
                    "library": (lambda x, w: F.linear(x, w, bias), None, w)}
        if kind == "lm_head":
            w = self.randn(n, k, std=k**-0.5).to(bf16)
            return {"ours": (lambda x, w: ig.gemm(x, w, out_dtype=torch.float32), None, w),
                    "library": (self.float32_logits, None, w)}
        w = self.randn(n, k, std=64.0).clamp(-448, 448).to(fp8)
        x_scale = torch.tensor(0.01, device=self.device)
        w_scale = torch.tensor(0.37 / 64 / k**0.5, device=self.device)
        x_inv = 1.0 / x_scale  # as Linear.a_inv

        def quantize_fp8(x):  # model.quantize_fp8
            return (x.float() * x_inv).clamp(-448.0, 448.0).to(fp8)

        def scaled_mm(xq, w, fast=False):
            return torch._scaled_mm(xq, w.t(), scale_a=x_scale, scale_b=w_scale, bias=bias, out_dtype=bf16,
                                    use_fast_accum=fast)

        fast = ig.FP8_CONFIG._replace(promote=False)
        narrow = ig.FP8_CONFIG._replace(block_n=NARROW_N)
        scales = {"x_scale": x_scale, "w_scale": w_scale}
        return {"ours": (lambda x, w: ig.gemm(x, w, bias=bias, x_inv=x_inv, out_dtype=bf16, **scales), None, w),
                "ours_e4m3": (lambda x, w: ig.gemm(x, w, bias=bias, out_dtype=bf16, **scales), quantize_fp8, w),
                "ours_narrow": (lambda x, w: ig.gemm(x, w, bias=bias, out_dtype=bf16, config=narrow, **scales),
                                quantize_fp8, w),
                "ours_fast": (lambda x, w: ig.gemm(x, w, bias=bias, out_dtype=bf16, config=fast, **scales),
                              quantize_fp8, w),
                "library": (lambda x, w: scaled_mm(quantize_fp8(x), w), None, w),
                "library_e4m3": (scaled_mm, quantize_fp8, w),
                "library_fast": (lambda x, w: scaled_mm(x, w, fast=True), quantize_fp8, w)}

    def float32_logits(self, x, w):
        torch = self.torch
        try:
            return torch.mm(x, w.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError):
            note = "lm_head library: torch.mm(out_dtype=float32) missing here; F.linear of float32 copies instead"
            if note not in self.notes:
                self.notes.append(note)
            return torch.cat([torch.nn.functional.linear(x.float(), w[i: i + 16384].float())
                              for i in range(0, w.shape[0], 16384)], dim=-1)

    # -- measuring -----------------------------------------------------------------------------------------------
    def time_us(self, fn, x, weights) -> float:
        """Median microseconds a call over ``--repeats`` replays of a CUDA graph of REPS calls (weights rotated)."""
        torch = self.torch
        if self.device.type != "cuda":  # the dry run: wall clock, a few calls
            times = []
            for i in range(3):
                t = time.perf_counter()
                fn(x, weights[i % len(weights)])
                times.append((time.perf_counter() - t) * 1e6)
            return statistics.median(times)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up (Triton's compile, cuBLAS's workspace) off the capture
            for w in weights:
                fn(x, w)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x, weights[0])
        end.record()
        end.synchronize()
        once_ms = start.elapsed_time(end)
        reps = max(len(weights), min(200, math.ceil(GRAPH_MS / max(once_ms, 1e-3))))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(reps):
                fn(x, weights[i % len(weights)])
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.opts.repeats):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / reps)
        del graph
        return statistics.median(times)

    def shape(self, name: str, k: int, n: int, kind: str, ms: tuple[int, ...]) -> None:
        torch = self.torch
        variants = self.variants(name, k, n, kind)
        largest = max(ms)
        x_all = self.randn(largest + OFFSET, k, std=2.0).to(torch.bfloat16)
        outputs = {}
        for variant, (fn, prepare, w) in variants.items():
            x_in = prepare(x_all) if prepare is not None else x_all
            # invariance: the largest call's rows against every M's, from row 0 and from row OFFSET
            whole = fn(x_in, w)
            outputs[variant] = whole[:largest]
            view = torch.int32 if whole.dtype == torch.float32 else torch.int16
            counts = {}
            for m in ms:
                equal = total = 0
                for start in (0, OFFSET):
                    y = fn(x_in[start: start + m], w)
                    equal += int((y.view(view) == whole[start: start + m].view(view)).all(-1).sum())
                    total += m
                counts[str(m)] = [equal, total]
            entry = {"shape": name, "k": k, "n": n, "kind": kind, "variant": variant, "largest": largest + OFFSET,
                     "rows": counts, "equal": sum(e for e, _ in counts.values()),
                     "total": sum(t for _, t in counts.values())}
            self.invariance.append(entry)
            del whole
            weights = self.weights(w, self.device.type == "cuda")
            for m in ms:
                us = self.time_us(fn, x_in[:m], weights)
                flops = 2 * m * n * k
                self.rows.append({"shape": name, "k": k, "n": n, "kind": kind, "variant": variant, "m": m,
                                  "us": round(us, 2), "tflops": round(flops / us / 1e6, 1),
                                  "weight_gbps": round(w.numel() * w.element_size() / us / 1e3, 1)})
            del weights
            print(f"{name} {kind} {variant}: invariant rows {entry['equal']}/{entry['total']}; "
                  + ", ".join(f"M {r['m']} {r['us']:.1f} us" for r in self.rows[-len(ms):]), flush=True)
        if "ours_narrow" in outputs:  # the same rows' bits from tiles of another width?
            reference = outputs["ours"] if kind == "bf16" else outputs["ours_e4m3"]
            view = torch.int16
            wide = (self.ig.BF16_CONFIG if kind == "bf16" else self.ig.FP8_CONFIG).block_n
            self.tile_widths.append({"shape": name, "kind": kind, "block_n": [NARROW_N, wide],
                                     "equal_rows": int((outputs["ours_narrow"].view(view) == reference.view(view))
                                                       .all(-1).sum()), "rows": largest})
        library = outputs.get("library")
        for variant, y in outputs.items():
            if variant.startswith("ours") and library is not None:
                diff = (y.float() - library.float()).abs().max().item()
                entry = next(e for e in self.invariance
                             if (e["shape"], e["kind"], e["variant"]) == (name, kind, variant))
                entry["vs_library"] = diff / max(library.float().abs().max().item(), 1e-30)

    def table(self) -> None:
        if not self.rows:
            return
        print(f"\n{'shape':8} {'kind':8} {'variant':13} " + " ".join(f"{'M ' + str(m):>10}" for m in
                                                                      sorted({r['m'] for r in self.rows})))
        keys = []
        for r in self.rows:
            key = (r["shape"], r["kind"], r["variant"])
            if key not in keys:
                keys.append(key)
        for key in keys:
            rows = {r["m"]: r for r in self.rows if (r["shape"], r["kind"], r["variant"]) == key}
            print(f"{key[0]:8} {key[1]:8} {key[2]:13} " + " ".join(f"{rows[m]['us']:>8.1f}us" for m in sorted(rows)))
        for t in self.tile_widths:
            print(f"tiles of {t['block_n'][0]} against {t['block_n'][1]} columns, {t['shape']} {t['kind']}: "
                  f"{t['equal_rows']}/{t['rows']} rows the same bits")
        print("\ninvariant rows (equal / compared):")
        for e in self.invariance:
            vs = f", max |ours - library| / max |library| {e['vs_library']:.2e}" if "vs_library" in e else ""
            print(f"  {e['shape']:8} {e['kind']:8} {e['variant']:13} {e['equal']}/{e['total']}{vs}")


if __name__ == "__main__":
    main()
