"""W4A8-AWQ's batch-1 table-lookup GEMV (runtimes/torch_engine/cuda/quant_gemv_w4a8.py) alone at the 7B's four decode
linears, before and after a change, in one call (issue 32): no 7B build, random weights quantized on the GPU.
``--format int8_sq`` / ``int8_wo``: INT8's batch-1 GEMV (quant_gemv_int8, variant new) and its warp-specialized form
(quant_gemv_int8_ws, variant ws and its neighbours) the same way, against quant_linear's INT8 tensor-core kernel.

    python3 benchmarks/w4a8_gemv.py --out DIR [--variants legacy,new,ws,mma,sweep] [--format w4a8_awq]
    python3 benchmarks/w4a8_gemv.py --out DIR --rows 8 [--variants gemm,rows]   # W4A8 at 2-64 input rows
    python3 benchmarks/w4a8_gemv.py --out DIR --rows 64 --format int8_wo        # INT8 weight-only at 64 rows
    TRITON_INTERPRET=1 PYTHONPATH=tests/interpreter_site:tests:. python3 benchmarks/w4a8_gemv.py --dry-run --out DIR

Per linear (qkv 3584 -> 4608, dense 3584 -> 3584, fc + gate 3584 -> 2 x 18944 as the GLU launch, proj 18944 -> 3584)
and variant, the kernel is checked against float32 ``x @ W^T`` with W dequantized and against quant_linear's FP8
tensor-core kernel on the same weights and input (the call fails where a variant is past 1e-4 from both, the GLU
1e-2) and timed from a CUDA graph of launches over rotating weight copies larger than L2:
us per launch, GB/s of the bytes it reads (packed weight, tables, units, pre-quant scale), fraction of 4.3 TB/s.

Variants (``--variants``, or $W4A8_GEMV_VARIANTS):
  legacy  ``quant_gemv_w4a8.legacy_config``: the first rule, timed in the 7B step at 4.288 ms (H200 2026-12-05d):
          256 rows (GLU 64), ~4 programs per SM of >= 2 K tiles, each tile loaded at the top of its iteration
  new     ``quant_gemv_w4a8.pick_config``: what the decode step takes now
  ws      ``quant_gemv_w4a8_ws.pick_config``: the warp-specialized kernel (Hopper only; the decode step's there unless
          TRTLLM_PIPELINE_W4A8_WS=0), then its stages, rows and splits around it (always run: not cut by the sweep's
          deadline)
  mma     ``quant_gemv_w4a8_mma.pick_config``: the lookup into FP8 wgmma (Hopper; the decode step's under
          TRTLLM_PIPELINE_W4A8_MMA=1), then its rows, stages and splits around it (always run)
  sweep   others around ``new`` (no prefetch; proj at 256 rows; the GLU at 16 and 64 rows; qkv/dense at the
          legacy splits prefetched), until $W4A8_GEMV_SWEEP_S seconds (default 40) have passed
Both variants run today's kernel code (its selectors take one shift a word fewer than the first version's: the
static counts in docs/perf-notes.md); the difference between legacy and new is the launch: splits, rows, prefetch.

``--rows M`` (2-64, $W4A8_GEMV_ROWS; W4A8, SmoothQuant, INT8 weight-only or INT4-AWQ): M input rows through
quant_gemm.launch, checked and timed the same way against float32 and quant_linear's kernel at M rows (the bound
1e-3: W4A8's kernels sum on the FP8 tensor cores); the variant ``rows`` at batch 1 too (the INT8 wgmma kernels take
one row):
  gemm    ``quant_gemm.pick_config``: quant_gemm's GEMM (the GLU not split), what a decode batch takes today
  rows    the format's wgmma row kernel, the rows as the MMA's N (Hopper): W4A8's lookup into FP8 wgmma
          (quant_rows_w4a8_mma, the decode step's under TRTLLM_PIPELINE_W4A8_WGMMA_ROWS=N; from 17 rows the wide
          kernel, two launches: the input made once, then the kernel), SmoothQuant's int8 weights from shared memory
          (quant_rows_int8_mma, TRTLLM_PIPELINE_INT8_WGMMA_ROWS=N, two launches), weight-only's int8 made float16 in
          registers (quant_rows_int8wo_mma, TRTLLM_PIPELINE_INT8WO_WGMMA_ROWS=N, two launches); then stages, rows and
          splits around it; the 4-bit staged forms (2-16 rows) also their wide form (``rows-made``) and their input
          loaded one K tile ahead (``rows-prefetch``; TRTLLM_PIPELINE_WGMMA_PREFETCH=1 in the decode step)

Where a wide (made-input) row kernel ran, the made input alone is timed too (``made-input``: part of that
variant's time). The last lines: per variant the sum over the four launches x 28 layers (the step's W4A8 GEMV time,
ms). Results: DIR/w4a8_gemv.json (INT8: DIR/FORMAT_gemv.json; --rows M: DIR/FORMAT_rowsM.json). ~1 minute on an H200
(each distinct config is one compilation).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import quant_fast_path as qf  # noqa: E402
import quant_gemm as qg  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.cuda import (quant_gemm, quant_gemv_int8,  # noqa: E402
                                                       quant_gemv_int8_ws, quant_gemv_w4a8, quant_gemv_w4a8_mma,
                                                       quant_gemv_w4a8_ws, quant_linear, made_input,
                                                       quant_rows_int4_mma, quant_rows_int8_mma,
                                                       quant_rows_int8wo_mma, quant_rows_w4a8_mma)

BANDWIDTH = 4.3e12  # a device-to-device copy on the H200 (docs/perf-notes.md)
LAYERS = 28
SHAPES = [("qkv", 4608, 3584), ("dense", 3584, 3584), ("glu", 18944, 3584), ("proj", 3584, 18944)]
DRY_SHAPES = [("qkv", 192, 256), ("dense", 128, 256), ("glu", 96, 256), ("proj", 128, 512)]
SWEEP_S = float(os.environ.get("W4A8_GEMV_SWEEP_S", "40"))


def variants(q, sm: int, glu: bool, which: list[str]) -> list[tuple[str, object]]:
    """(name, LinearConfig) to run for one linear: ``which``'s, in order, without repeats (INT8: new and ws only)."""
    r = dataclasses.replace
    int8 = q.fmt in ("int8_sq", "int8_wo")
    new = quant_gemv_int8.pick_config(q, sm, glu=glu) if int8 else quant_gemv_w4a8.pick_config(q, sm, glu=glu)
    ws_module = quant_gemv_int8_ws if int8 else quant_gemv_w4a8_ws
    out = []
    for v in which:
        if v == "legacy" and not int8:
            out.append(("legacy", quant_gemv_w4a8.legacy_config(q, sm, glu=glu)))
        elif v == "new":
            out.append(("new", new))
        elif v == "ws":  # the warp-specialized kernel (Hopper), then others around it
            if not ws_module.usable(q, q.weight.device):
                continue
            ws = ws_module.pick_config(q, sm, glu=glu)
            out.append(("ws", ws))
            if glu:
                out += [("ws-3-stages", r(ws, num_stages=3)), ("ws-2x-rows", r(ws, block_n=2 * ws.block_n))]
            else:
                out += [("ws-half-rows", ws_module.pick_config(q, sm, block_n=ws.block_n // 2)),
                        ("ws-2-stages", r(ws, num_stages=2)), ("ws-4-stages", r(ws, num_stages=4)),
                        ("ws-half-splits", r(ws, splits=max(1, ws.splits // 2)))]
        elif v == "mma" and not int8:  # the lookup into FP8 wgmma (quant_gemv_w4a8_mma), then others around it
            if not quant_gemv_w4a8_mma.usable(q, q.weight.device):
                continue
            mma = quant_gemv_w4a8_mma.pick_config(q, sm, glu=glu)
            out.append(("mma", mma))
            if glu:
                out += [("mma-128-rows", r(mma, block_n=128, num_stages=2)), ("mma-2-stages", r(mma, num_stages=2))]
            else:
                out += [("mma-64-rows", quant_gemv_w4a8_mma.pick_config(q, sm, block_n=64)),
                        ("mma-4-stages", r(mma, num_stages=4)),
                        ("mma-half-splits", r(mma, splits=max(1, mma.splits // 2)))]
        elif v == "sweep" and not int8:
            out.append(("new-no-prefetch", r(new, num_stages=1)))
            if glu:
                out += [(f"glu-{n}", quant_gemv_w4a8.pick_config(q, sm, glu=True, block_n=n)) for n in (16, 64)]
            elif new.block_n != quant_gemv_w4a8.BLOCK_N:
                out.append(("256-rows", quant_gemv_w4a8.pick_config(q, sm, block_n=quant_gemv_w4a8.BLOCK_N)))
            else:
                legacy = quant_gemv_w4a8.legacy_config(q, sm)
                out.append(("legacy-splits-prefetch", r(legacy, num_stages=2)))
        elif v not in ("legacy", "sweep", "mma"):
            raise SystemExit(f"--variants: unknown {v!r} (legacy, new, ws, mma, sweep)")
    seen, unique = set(), []
    for name, cfg in out:
        if cfg not in seen:
            seen.add(cfg)
            unique.append((name, cfg))
    return unique


def rows_variants(q, m: int, sm: int, glu: bool, which: list[str]) -> list[tuple[str, object]]:
    """(name, LinearConfig) at ``m`` rows (``--rows``; ``which``'s gemm and rows): quant_gemm's GEMM and the format's
    wgmma row kernel (quant_gemm.ROW_KERNELS: W4A8's lookup, SmoothQuant's int8 from shared memory, weight-only's
    int8 made float16)."""
    r = dataclasses.replace
    module = quant_gemm.ROW_KERNELS.get(q.fmt)
    out = []
    for v in which:
        if v == "gemm" and m > 1:  # (the GLU not split: a split GLU needs the decode step's counters and workspace)
            cfg = quant_gemm.pick_config(q, m, sm, glu=glu)
            out.append(("gemm", r(cfg, splits=1) if glu else cfg))
        elif v == "rows":
            if module is None or not module.supported(q, m):
                continue
            rows = module.pick_config(q, m, sm, glu=glu)
            out.append(("rows", rows))
            if module in (quant_rows_int8_mma, quant_rows_int8wo_mma):  # one form, 64 rows: stages and splits
                out += ([("rows-2-stages", r(rows, num_stages=2))] if glu else
                        [("rows-2-stages", r(rows, num_stages=2)), ("rows-6-stages", r(rows, num_stages=6)),
                         ("rows-half-splits", r(rows, splits=max(1, rows.splits // 2)))])
            elif rows.made:  # the wide kernel (W4A8: 64 output rows, its registers; INT4: 128, each weight scaled)
                out += ([("rows-3-stages", r(rows, num_stages=3))] if glu else
                        [("rows-2-stages", r(rows, num_stages=2)), ("rows-4-stages", r(rows, num_stages=4)),
                         ("rows-half-splits", r(rows, splits=max(1, rows.splits // 2)))])
                # the other row count (W4A8's GLU at 128 rows spills: not tried), and INT4's offset form (the first
                # one timed) at 64 rows
                other = module.pick_config(q, m, sm, glu=glu, block_n=192 - rows.block_n)
                if not glu or rows.scale_weights:
                    out.append((f"rows-{other.block_n}-rows", other))
                if rows.scale_weights:
                    narrow = module.pick_config(q, m, sm, glu=glu, block_n=module.OFFSET_WIDE_BLOCK_N)
                    out.append(("rows-offset", r(narrow, scale_weights=False)))
            else:  # the staged form, its neighbours, and the wide form at these rows (the input made once)
                wide_n = module.WIDE_BLOCK_N  # (INT4's wide form scales each weight: 128 rows a program)
                made = r(rows, made=True, block_n=wide_n, num_stages=module.WIDE_GLU_STAGES if glu else 3,
                         splits=1 if glu else module.pick_config(q, m, sm, block_n=wide_n).splits,
                         scale_weights=module is quant_rows_int4_mma)
                if glu:  # the other row count (W4A8: 128 rows and two stages, the H100's pick at 8 rows, 2026-12-08)
                    other = 64 if rows.block_n == 128 else 128
                    out += [(f"rows-{other}-rows", r(rows, block_n=other, num_stages=3 if other == 64 else 2)),
                            ("rows-other-stages", r(rows, num_stages=5 - rows.num_stages))]
                else:
                    out += [("rows-64-rows", module.pick_config(q, m, sm, block_n=64)),
                            ("rows-4-stages", r(rows, num_stages=4)),
                            ("rows-half-splits", r(rows, splits=max(1, rows.splits // 2)))]
                out.append(("rows-made", made))
                # the input one K tile ahead (support.staged_prefetch) or not, the other way from the default
                out.append((f"rows-{'no-' if rows.prefetch else ''}prefetch", r(rows, prefetch=not rows.prefetch)))
    return out


def made_input_launch(x, qs, glu: bool, cfg, dt):
    """The input a wide wgmma row kernel copies, made once (``made_input``, as the kernel's launch makes it)."""
    q2 = qs[1] if glu else None
    fmt = qs[0].fmt
    if fmt == "w4a8_awq":
        return made_input.w4a8(x, qs[0], q2, dt, pdl=True)
    if fmt == "int4_awq":
        return made_input.int4(x, qs[0], q2, dt, quant_rows_int4_mma.sums_columns(cfg.block_m), pdl=True,
                               sums=not cfg.scale_weights)
    if fmt == "int8_sq":
        return made_input.int8(x, qs[0], q2, dt, pdl=True)
    return made_input.w8a16(x, pdl=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", default=os.environ.get("W4A8_GEMV_VARIANTS"),
                    help="comma-separated (default legacy,new,ws,mma,sweep; with --rows: gemm,rows)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU through Triton's interpreter at tiny shapes")
    ap.add_argument("--format", default="w4a8_awq", choices=("w4a8_awq", "int8_sq", "int8_wo", "int4_awq"),
                    help="the weights' format (default w4a8_awq; INT8's: quant_gemv_int8 and its warp-specialized "
                         "form)")
    ap.add_argument("--rows", type=int, default=int(os.environ.get("W4A8_GEMV_ROWS", "1")),
                    help="input rows (1: the batch-1 GEMVs; 2-64: through quant_gemm.launch, variants gemm,rows)")
    args = ap.parse_args()
    m = args.rows
    if not 1 <= m <= quant_rows_w4a8_mma.MAX_ROWS or m == 1 and args.format == "int4_awq":
        raise SystemExit(f"--rows {m}: 1 to {quant_rows_w4a8_mma.MAX_ROWS} (int4_awq: 2 to 64, its wgmma row kernel "
                         "against quant_gemm's GEMM)")
    which = [v for v in (args.variants or ("gemm,rows" if m > 1 else "legacy,new,ws,mma,sweep")).split(",") if v]
    batch1 = [v for v in which if v not in ("gemm", "rows")]  # the batch-1 GEMVs' variants
    if m > 1 and batch1:
        raise SystemExit(f"--variants {','.join(batch1)}: at --rows {m} only gemm and rows")
    if args.dry_run:
        dev, sm, shapes, layers = torch.device("cpu"), 4, DRY_SHAPES, 1
    else:
        dev = torch.device("cuda")
        sm = torch.cuda.get_device_properties(dev).multi_processor_count
        shapes, layers = SHAPES, LAYERS
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = dev.type == "cuda"
    dt = torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(11)
    t0 = time.perf_counter()
    rows = []
    for name, n, k in shapes:
        glu = name == "glu"
        lins = qg._weights(args.format, n, k, 2 if glu else 1, gen, dev)
        qs = [lin.kernel_weight() for lin in lins]
        if args.format == "w4a8_awq":  # both kernels' tables, made before any timing (a launch without them makes
            # them itself: in a captured graph that would be timed as the kernel's)
            qs = [quant_gemv_w4a8_mma.with_tables(quant_gemv_w4a8.with_tables(q)) for q in qs]
        nbytes = sum(t.numel() * t.element_size() for q in qs for t in (q.weight, q.lut, q.units, q.pqs, q.scales)
                     if t is not None and not (t is q.scales and q.lut is not None))
        copies = max(2, math.ceil(4 * 60 * 2**20 / nbytes)) if cuda else 1
        def copied(q):  # (the tables too where the format has them)
            tables = ({"lut": q.lut.clone(), "units": q.units.clone(), "lut8": q.lut8.clone()}
                      if q.lut is not None else {})
            return dataclasses.replace(q, weight=q.weight.clone(), **tables)
        sets = [qs] + [[copied(q) for q in qs] for _ in range(copies - 1)]
        x = (torch.randn(m, k, generator=gen, device=dev) * 2).to(dt)
        ref = [qg._reference(lin, x) for lin in lins]
        want = F.silu(ref[0].to(dt).float()).to(dt).float() * ref[1].to(dt).float() if glu else ref[0]
        # quant_linear's tensor-core kernel (FP8 / INT8: the step's choice with the switch off) on the same input
        dot_cfg = quant_linear.pick_config(qs[0], m, sm, glu=glu, gemv=False)
        if glu:
            dot = torch.empty(m, n, dtype=dt, device=dev)
            quant_linear.quant_glu(x, qs[0], qs[1], dot, dot_cfg, dt)
            dot = dot.float()
        else:
            dot = torch.empty(dot_cfg.splits, m, n, device=dev)
            quant_linear.quant_partials(x, qs[0], dot, dot_cfg, dt)
            dot = dot.sum(0)
        chosen = variants(qs[0], sm, glu, batch1) + rows_variants(qs[0], m, sm, glu,
                                                                  [v for v in which if v in ("gemm", "rows")])
        for vname, cfg in chosen:
            cut = vname not in ("legacy", "new") and not vname.startswith(("ws", "mma", "gemm", "rows"))
            if cut and time.perf_counter() - t0 > SWEEP_S:
                continue
            row = {"linear": name, "n": n, "k": k, "variant": vname, "config": dataclasses.astuple(cfg),
                   "block_n": cfg.block_n, "splits": cfg.splits, "prefetch": cfg.num_stages > 1,
                   "programs": -(-n // cfg.block_n) * cfg.splits, "bytes": nbytes}
            out = torch.empty(m, n, dtype=dt, device=dev) if glu else torch.empty(cfg.splits, m, n, device=dev)

            def call(i, cfg=cfg, out=out, sets=sets):
                ws = sets[i % copies]
                if cfg.gemm:  # quant_gemm's GEMM or a wgmma row kernel: the decode step's entry for them
                    return quant_gemm.launch(x, ws[0], ws[1] if glu else None, out, cfg, dt, pdl=cuda)
                if glu:
                    return quant_linear.quant_glu(x, ws[0], ws[1], out, cfg, dt, pdl=cuda)
                return quant_linear.quant_partials(x, ws[0], out, cfg, dt, pdl=cuda)
            try:
                handle = call(0)
                got = out.float() if glu else out.sum(0)
                row["error"] = qf.rel(got, want)
                row["vs_dot"] = qf.rel(got, dot)
                if hasattr(handle, "n_regs"):
                    row["registers"], row["spills"] = handle.n_regs, handle.n_spills
                if cuda:
                    from gpu_fast_path import time_graph  # (CUDA at import: the dry run never reaches here)

                    it = iter(range(10**9))
                    us = time_graph(lambda: call(next(it)), copies * 2)
                    row.update(us=us, gbps=nbytes / us / 1e3, of_floor=nbytes / BANDWIDTH * 1e6 / us)
            except Exception as exc:  # a config that does not compile or run is a finding, not a stop
                row["failed"] = repr(exc)[:300]
            rows.append(row)
            timing = (f"{row['us']:8.1f} us {row['gbps']:6.0f} GB/s {row['of_floor']:5.0%} of 4.3 TB/s"
                      if "us" in row else " (not timed)" if "failed" not in row else " FAILED " + row["failed"])
            print(f"{name:5} {vname:24} rows {cfg.block_n:3} splits {cfg.splits:3} prefetch {int(row['prefetch'])} "
                  f"programs {row['programs']:5} regs {row.get('registers', '-')!s:>3}{timing}"
                  f"  err {row.get('error', float('nan')):.1e} vs dot kernel {row.get('vs_dot', float('nan')):.1e}",
                  flush=True)
        made_cfg = next((cfg for _, cfg in chosen if cfg.lut_mma and cfg.made), None)
        if cuda and made_cfg is not None:  # the made input alone: what the wide kernels' launch pair spends before them
            from gpu_fast_path import time_graph

            us = time_graph(lambda qs=qs: made_input_launch(x, qs, glu, made_cfg, dt), 8)
            rows.append({"linear": name, "n": n, "k": k, "variant": "made-input", "us": us, "input_rows": m})
            print(f"{name:5} {'made-input':24} (the wide kernels' input alone) {us:8.1f} us", flush=True)
        del sets, qs, lins
        if cuda:
            torch.cuda.empty_cache()
    summary = {}
    for v in ("legacy", "new", "ws", "mma", "gemm", "rows"):
        got = {r["linear"]: r["us"] for r in rows if r["variant"] == v and "us" in r}
        if len(got) == len(shapes):
            summary[v] = {"per_layer_us": got, "step_ms": layers * sum(got.values()) / 1000}
            print(f"{v}: the four launches x {layers} layers: {summary[v]['step_ms']:.3f} ms a step "
                  f"({', '.join(f'{k} {u:.1f}' for k, u in got.items())} us)")
    name = "w4a8_gemv.json" if args.format == "w4a8_awq" else f"{args.format}_gemv.json"
    name = name if m == 1 else f"{ {'w4a8_awq': 'w4a8', 'int8_sq': 'int8'}.get(args.format, args.format)}_rows{m}.json"
    (args.out / name).write_text(json.dumps({"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "sm": sm,
                                             "input_rows": m, "rows": rows, "summary": summary}, indent=1))
    # A variant fails where it parts from both references: float32 x @ W^T of the dequantized weight (the GLU:
    # rounded to bfloat16 where eager rounds) and the dot kernel. Neither alone: the FP8 tensor cores' accumulation is
    # not a float32 sum (H100 2026-12-05e, the 7B's qkv: the dot kernel 1.5e-4 from float32, the GEMV 1.1e-6), and
    # through the interpreter, at the dry run's small shapes, float32 sits 2-5e-3 from both kernels, which agree.
    # Several rows (--rows): both kernels' sums are the FP8 tensor cores' per K tile, so 1e-3 (quant_gemm's W4A8 GEMM
    # at M 64 on an H100: 1.5e-4 from float32, 2026-12-06e).
    limit = 1e-4 if m == 1 else 1e-3
    bad = [r for r in rows if "failed" in r or min(r["error"], r["vs_dot"]) > (1e-2 if r["linear"] == "glu" else limit)]
    if bad:
        print(f"{len(bad)} variant(s) failed or parted from both float32 x @ W^T and the dot kernel "
              f"({limit:g}; the GLU 1e-2)")
        sys.exit(1)


if __name__ == "__main__":
    main()
