"""The 4/8-bit GEMMs at every batch size on one GPU (issue 32): per-kernel table, measured kernel table, whole steps.

    python3 benchmarks/quant_gemm.py --out DIR [--parts kernels,steps] [--formats int4_awq,w4a8_awq,int8_sq,int8_wo,fp8,bf16]
    TRITON_INTERPRET=1 PYTHONPATH=tests/interpreter_site:tests:. python3 benchmarks/quant_gemm.py --dry-run --out DIR

Parts (each one's failure is recorded and the next part still runs; each ~4-8 minutes on an H200, so the device
tool's 10-minute calls take one each: kernels first, its table copied into the package, then steps):
  kernels  each format x M in 1, 8, 32, 64, 128, 256, 512, 2048 x the 7B's four linears (qkv 3584 -> 4608, dense
           3584 -> 3584, fc + gate 3584 -> 2 x 18944: the GLU launch at M <= 64, one of the pair's GEMMs at prefill
           sizes, proj 18944 -> 3584): every candidate kernel (quant_gemm's GEMM at several tiles: ``gemm_candidates``,
           quant_gemv's GEMV at M = 1, the older dot kernel at M <= 64, and prefill's library kernels, timed whole:
           SmoothQuant's ``int_mm`` (torch._int_mm) past M 16, INT4-AWQ's, W4A8's and INT8 weight-only's ``dequant``
           (the weight dequantized into quant_gemm's scratch buffer, then F.linear / torch._scaled_mm) past M 64;
           FP8 and BF16: linear.py's kernels and torch._scaled_mm / F.linear) checked against float32 ``x @ W^T`` (W
           dequantized as the format defines it), then timed over rotating weight copies larger than L2: us, GB/s of
           weight bytes, TFLOP/s, fraction of the roof (max(bytes / 4.3 TB/s, flops / dense tensor-core peak)). The
           fastest correct kernel per (format, shape, M) goes to DIR/quant_gemm_table.json (with, where a library
           kernel won, the fastest the decode step can launch), which the runtime reads when copied to
           trtllm_pipeline/runtimes/torch_engine/cuda/quant_gemm_table.json (or named by $TRTLLM_PIPELINE_GEMM_TABLE).
           The sweep beyond each default stops after KERNEL_SWEEP_S seconds (default 300; the log says where).
  steps    per format a 7B engine of random BF16 weights quantized on the GPU (quant_fast_path.quantized_checkpoint):
           built first with the dequantized copies (the old memory: "before"), prefill of 2048 tokens timed and its
           peak taken, then the copies dropped ("after": prefill through quant_gemm, no copy; the dequant kernel's
           one scratch buffer reported) and: the prefill's last logits against the copy's, one decode step at batch 8
           against the eager (copy) model, then decode graphs at batch 1/8/32/64, context 2048: ms/step, tokens/s,
           peak GiB. The table in DIR (when the kernels part ran first) is the one the steps take (with ``--ms``,
           the package's table with the measured M values' entries in place).

  gemv_rows   INT4-AWQ only, M 1, 2, 4, 8, 16 (``ROWS_MS``) x the four linears: the GEMV (batch 1's; above it the
           several-row kernel, ``quant_gemv.rows_config``, at its default tiles and, within KERNEL_SWEEP_S, the
           ``gemv_candidates`` variants) against today's choices (the GEMM's tiles, the dot kernel), each checked as
           above; DIR/quant_gemm_table.json is then the package's table (or $TRTLLM_PIPELINE_GEMM_TABLE's) with these
           M values' entries in place: a "gemv" entry at M > 1 carries its tiles, and only such an entry (or the
           switch below) makes the decode step take the GEMV at that M.
  rows_steps  INT4-AWQ 7B decode steps at batch 1, 8, 16, 64, context 2048 (``ROWS_BATCHES``), one engine, each
           kernel choice in turn: "table" (the package's table: today's kernels), "gemv"
           ($TRTLLM_PIPELINE_INT4_GEMV_MAX_ROWS=16), after gemv_rows in the same call "measured" (its table), then
           "mma", "int4pack" and "wgmma" (``rows_step_rows``)

``--dry-run``: both parts on the CPU at a tiny shape through Triton's interpreter (M 1, 8, 24, 80; no sweep; batches
1 and 2; wall-clock times), so that every call the GPU run makes is made (tests/test_fast_decode.py runs it).

Results: DIR/quant_gemm.json, DIR/quant_gemm_table.json, DIR/quant_gemm.txt (the tables, also on stdout).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import quant_fast_path as qf  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.cuda import quant_mma_int4  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.cuda import (fixed_sum, int4pack, linear, quant_gemm,  # noqa: E402
                                                        quant_gemv, quant_gemv_ws, quant_linear, quant_rows_int4_mma)
from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.model import Linear, Qwen2Engine  # noqa: E402

MS = (1, 8, 32, 64, 128, 256, 512, 2048)
DRY_MS = (1, 8, 24, 80)  # --dry-run: the GEMV, decode launches (the dot kernel, int_mm past M 16), prefill sizes
ROWS_MS = (1, 2, 4, 8, 16)  # gemv_rows: INT4-AWQ's GEMV for several rows against today's choice (the GEMM, the dot)
DRY_ROWS_MS = (1, 3)
DECODE_M = 64  # the largest M timed as a decode launch (split-K partials, the GLU); above it prefill's linear
BATCHES = (1, 8, 32, 64)
FORMATS = ("int4_awq", "w4a8_awq", "int8_sq", "int8_wo", "fp8", "bf16")
BANDWIDTH = 4.3e12  # a device-to-device copy on the H200 (docs/perf-notes.md)
# dense tensor-core peaks of an H200 SXM by the MMA's operand type (TFLOP/s or TOP/s)
PEAK = {"bf16": 989e12, "fp8": 1979e12, "int8": 1979e12}
MMA_TYPE = {"int4_awq": "bf16", "w4a8_awq": "fp8", "int8_sq": "int8", "int8_wo": "bf16", "fp8": "fp8", "bf16": "bf16"}
KERNEL_SWEEP_S = float(os.environ.get("KERNEL_SWEEP_S", "300"))
# relative error against float32 x @ W^T above which a candidate does not enter the table
MAX_ERR = {"int4_awq": 5e-3, "w4a8_awq": 5e-3, "int8_sq": 5e-3, "int8_wo": 5e-3, "fp8": 2e-2, "bf16": 1e-2}


def linears(hidden=3584, intermediate=18944, qkv=4608) -> list[tuple[str, int, int]]:
    return [("qkv", qkv, hidden), ("dense", hidden, hidden), ("glu", intermediate, hidden), ("proj", hidden, intermediate)]


def gemm_candidates(q, m: int, sm: int, glu: bool) -> list[LinearConfig]:
    """quant_gemm's default tiles first, then others (each distinct config is a compilation: ~1-2 s). Decode sizes:
    the group scale on each weight (INT4-AWQ), the input on the MMA's M side, twice the splits (or four stages for
    the GLU). Prefill sizes (the H200's first run tried 4 tiles there and reached ~25% of the tensor-core roof): 128 x
    128 tiles at 64 or 128 inputs a stage and 3 or 4 stages, 128 x 256, 256 x 128 (twice the rows per unpacked weight
    tile: half the unpacking per MMA), 64 x 128 x 128 at 4 warps, and the weight on the MMA's M side (SWAP: the
    unpacked weight tile is the MMA's register operand, not stored to shared memory first), all 8 warps unless said;
    INT4-AWQ with its scale on each weight (the default there since it won every prefill shape: glu M 2048 1032 us
    against 1730 with the scale on the tile's dot result, which is tried too at the default tiles)."""
    base = quant_gemm.default_config(q, m, sm, glu=glu)
    r = dataclasses.replace
    int4_awq = q.fmt == "int4_awq"
    if m <= DECODE_M:
        others = [r(base, scale_weights=True) if int4_awq else r(base, num_stages=4),
                  r(base, swap=False, block_k=64, num_stages=4),
                  r(base, num_stages=4) if glu else r(base, splits=base.splits * 2)]
        # Every linear streams 1.0-1.3 TB/s at M 8 whatever its grid (H100 2026-12-06e: the GLU's 64- and 32-row
        # tiles, 296 and 592 programs, were slower than 128 rows' 148; fewer proj splits too), with ~a quarter of an
        # SM's issue used: more of each SM's work in flight, not more programs. Two warpgroups on the tile (8 warps),
        # and K tiles of 256 (twice the bytes a stage). (sm_90 SASS, tools/gemm_sass.py, GLU at M 8: 8 warps do NOT
        # halve a thread's unpacking, 807 instructions a K tile against 4 warps' 900: a 64-row weight operand is one
        # wgmma's M, so both warpgroups unpack all of it; K 256: 1,747 for twice the weights, 255 registers.)
        others += [r(base, num_warps=8, scale_weights=int4_awq), r(base, block_k=256, scale_weights=int4_awq)]
        if glu:
            # The GLU split K (its partials to a workspace, each output tile's last program finishing): sm_90 SASS
            # reads its K loop as latency-bound, one warp a scheduler issuing ~0.2 a cycle (the 7B's 148 tiles of 128
            # rows leave most SMs one program, two fit by registers), so two programs an SM on shorter K ranges is
            # the next thing to try. On 132 SMs (264 places): 2 splits are 296 programs (32 of them after the rest),
            # 3 are 444 (two rounds, the second 180), 4 are 592 (three).
            others += [r(base, splits=s, scale_weights=int4_awq) for s in (2, 3, 4)]
    else:
        def tile(bm, bn, bk, warps=8, stages=3, swap=False):
            return LinearConfig(bm, bn, bk, 1, warps, stages, gemm=True, swap=swap, scale_weights=int4_awq)

        others = [r(base, scale_weights=False) if int4_awq else None,  # INT4-AWQ: the scale on each tile's dot too
                  tile(128, 128, 128), tile(128, 128, 64, stages=4), tile(128, 128, 128, stages=4),
                  tile(128, 256, 64), tile(256, 128, 64), tile(64, 128, 128, warps=4),
                  tile(128, 256, 64, swap=True), tile(128, 256, 128, swap=True), tile(128, 128, 64, warps=4, swap=True)]
    if q.int4:
        # each INT4 candidate so far again with ptx_nibbles: its nibbles unpacked by PTX a register at a time,
        # INT4-AWQ's scale on two weights an instruction in the compute dtype, W4A8's E4M3 by saturating conversions
        # (the GLU's K loop at M 8: 7.6 -> 3.5 instructions a weight, W4A8 8.6 -> 6.0; sm_90 SASS). CUDA only: under
        # Triton's interpreter the flag runs the int8-op, float32 path, so only a GPU's error column checks it.
        others += [r(c, ptx_nibbles=True) for c in [base, *others] if c is not None]
    out = [base]
    for c in others:
        if c is not None and c not in out:
            out.append(c)
    return out


def gemv_candidates(q, m: int, sm: int, glu: bool, sweep: bool) -> list[LinearConfig]:
    """INT4-AWQ's GEMV at M rows: batch 1's config, or the several-row kernel's default tiles
    (``quant_gemv.rows_config``) and, when sweeping, half and twice the output rows a program, twice the splits, the
    loads through the compiler's two-stage pipeline, and for the GLU 32 rows x 128 inputs."""
    if m == 1:
        return [quant_linear.pick_config(q, 1, sm, glu=glu)]
    base = quant_gemv.rows_config(q, m, sm, glu=glu)
    if not sweep:
        return [base]
    r = dataclasses.replace
    others = [quant_gemv.rows_config(q, m, sm, glu=glu, block_n=max(16, base.block_n // 2)),
              quant_gemv.rows_config(q, m, sm, glu=glu, block_n=base.block_n * 2), r(base, num_stages=2)]
    if glu:
        others.append(quant_gemv.rows_config(q, m, sm, glu=True, block_n=32, block_k=128))
    else:
        others.append(quant_gemv.rows_config(q, m, sm, splits=base.splits * 2))
    out = [base]
    for c in others:
        if c not in out:
            out.append(c)
    return out


def roof(fmt: str, m: int, n: int, k: int, nbytes: int, us: float) -> dict:
    flops = 2 * m * n * k
    t_roof = max(nbytes / BANDWIDTH, flops / PEAK[MMA_TYPE[fmt]])
    s = us * 1e-6
    return {"us": us, "gbps": nbytes / s / 1e9, "tflops": flops / s / 1e12, "of_roof": t_roof / s,
            "bound": "bytes" if nbytes / BANDWIDTH >= flops / PEAK[MMA_TYPE[fmt]] else "flops"}


def _weights(fmt: str, n: int, k: int, mats: int, gen, device, dt=torch.bfloat16) -> list[Linear]:
    lins = []
    ws = [(torch.randn(n, k, generator=gen, device=device) / k**0.5).to(dt) for _ in range(mats)]
    shared = max(float(w.float().abs().max()) for w in ws) if fmt == "fp8" else None  # one FP8 GEMM's scales
    for j, w in enumerate(ws):
        a_amax = 5.0 * (1.01 if j and fmt in qf.QUANT_FORMATS else 1)  # the quant formats' fc and gate apart
        t = {f"p.{s}": v for s, v in qf.quantize_linear(fmt, w, a_amax, gen, w_amax=shared).items()}
        lins.append(Linear(t, "p", dt, device, fmt if fmt in qf.QUANT_FORMATS else "none" if fmt == "bf16" else fmt,
                           qf.GROUP if fmt in qf.QUANT_FORMATS else None))
    return lins


def _reference(lin: Linear, x: torch.Tensor) -> torch.Tensor:
    """float32 ``x @ W^T``: W dequantized as the format defines it, x as its activation quantizer leaves it."""
    if lin.format == "none":
        return x.float() @ lin.weight.float().t()
    xq = lin.quantize_input(x).float() if lin.fp8 else qf.reference_input(lin, x)
    return xq @ lin._dequantize().t()


def _nbytes(lins: list[Linear]) -> int:
    return sum(t.numel() * t.element_size() for lin in lins for t in lin.step_tensors())


def kernel_rows(formats, time_fn, device, sm: int, *, ms=MS, deadline: float, l2_bytes=60 * 2**20, log=print,
                shapes=None):
    """One row per (format, linear, M, candidate): error, time (``time_fn(fn, reps)``: us per call; None: not
    timed), bandwidth, roof. Past ``deadline`` only the default tiles (and the other kernels) of each case run."""
    rows = []
    swept = True
    cuda = device.type == "cuda"
    gen = torch.Generator(device=device).manual_seed(11)
    dt = torch.bfloat16
    for fmt in formats:
        quant = fmt in qf.QUANT_FORMATS
        for name, n, k in shapes or linears():
            glu_mats = 2 if name == "glu" else 1
            lins = _weights(fmt, n, k, glu_mats, gen, device)
            nbytes_all = _nbytes(lins)
            copies = max(2, -(-4 * l2_bytes // nbytes_all)) if cuda else 1
            if quant:
                qs = [lin.kernel_weight() for lin in lins]
                sets = [qs] + [[dataclasses.replace(q, weight=q.weight.clone(), scales=q.scales.clone(), tiled=None,
                                                    scales16=None if q.scales16 is None else q.scales16.clone())
                                for q in qs] for _ in range(copies - 1)]
            else:
                sets = [[lin.weight for lin in lins]] + [[lin.weight.clone() for lin in lins] for _ in range(copies - 1)]
            for m in ms:
                decode = m <= DECODE_M
                glu = decode and glu_mats == 2
                used = lins if glu else lins[:1]  # prefill: one of the pair's GEMMs (fc)
                nbytes = _nbytes(used)
                x = (torch.randn(m, k, generator=gen, device=device) * 2).to(dt)
                ref = [_reference(lin, x) for lin in used]
                want = F.silu(ref[0].to(dt).float()).to(dt).float() * ref[1].to(dt).float() if glu else ref[0]
                sweep = time.perf_counter() < deadline
                if swept and not sweep:
                    log(f"-- past the sweep's deadline (KERNEL_SWEEP_S): default tiles only from {fmt} {name} m={m}")
                swept = sweep
                for kind, cfg, call, read in _candidates(fmt, used, sets, x, m, sm, glu, decode, device, sweep):
                    row = {"format": fmt, "linear": name, "m": m, "n": n, "k": k, "glu": glu, "kernel": kind,
                           "config": dataclasses.astuple(cfg) if cfg is not None else None, "weight_bytes": nbytes}
                    try:
                        handle = call(0)
                        row["error"] = qf.rel(read(), want)
                        if hasattr(handle, "n_regs"):
                            row["registers"], row["spills"] = handle.n_regs, handle.n_spills
                        if time_fn is not None:
                            it = iter(range(10**9))
                            # the dequant kernel's scratch buffer is one per stream and never grown under a
                            # graph's capture (its own stream): timed eagerly, as prefill runs it
                            timer = _eager_us if kind == "dequant" and cuda else time_fn
                            us = timer(lambda: call(next(it)), copies * 2 if decode else copies)
                            row.update(roof(fmt, m, (2 if glu else 1) * n, k, nbytes, us))
                    except Exception as exc:  # a config that does not compile or run is a finding, not a stop
                        row["failed"] = repr(exc)[:300]
                    rows.append(row)
                    log(_line(row))
            del sets, lins
            if cuda:
                torch.cuda.empty_cache()
    return rows


def _candidates(fmt, lins, sets, x, m, sm, glu, decode, device, sweep: bool):
    """(kind, config, call(i), read()) of every kernel to time for this case: ``call`` runs it on weight copy i."""
    dt = torch.bfloat16
    copies = len(sets)
    quant = fmt in qf.QUANT_FORMATS
    pdl = device.type == "cuda"
    n = lins[0].weight.shape[0] * (2 if lins[0].format in ("int4_awq", "w4a8_awq") else 1)
    if quant:
        q0 = sets[0][0]
        configs = gemm_candidates(q0, m, sm, glu)
        for cfg in configs if sweep else configs[:1]:
            if decode:
                out = torch.empty(m, n, dtype=dt, device=device) if glu else torch.empty(cfg.splits, m, n,
                                                                                          device=device)
            else:
                out = torch.empty(m, n, dtype=dt, device=device)
            split_glu = {}
            if glu and cfg.splits > 1:
                split_glu = dict(counters=torch.zeros(quant_gemm.glu_counters(q0, m, cfg), dtype=torch.int32,
                                                      device=device),
                                 workspace=torch.empty(quant_gemm.glu_workspace(q0, m, cfg), device=device))

            def call(i, cfg=cfg, out=out, split_glu=split_glu):
                ws = sets[i % copies]
                return quant_gemm.launch(x, ws[0], ws[1] if glu else None, out, cfg, dt, pdl=decode and pdl,
                                         **split_glu)
            yield "gemm", cfg, call, (lambda out=out: out.float() if out.dim() == 2 else out.sum(0))
        if decode:  # the older dot kernel (and at M <= 16, INT4-AWQ's GEMV: batch 1's, or its several-row kernel)
            kinds = [("dot", quant_linear.pick_config(q0, m, sm, glu=glu, gemv=False))]
            if quant_gemv.supported(q0, m):
                kinds[:0] = [("gemv", c) for c in gemv_candidates(q0, m, sm, glu, sweep)]
            for kind, cfg in kinds:
                xin = [quant_gemv.launch_input(x, q, dt) for q in sets[0]] if cfg.gemv else [x, x]
                if glu:
                    out = torch.empty(m, n, dtype=dt, device=device)
                elif cfg.gemv:
                    out = fixed_sum.accumulator(m, n, device=device)
                else:
                    out = torch.empty(cfg.splits, m, n, device=device)
                counters = torch.zeros(4096, dtype=torch.int32, device=device)
                workspace = torch.empty(8 * 2 * n, device=device)

                def call(i, cfg=cfg, out=out, xin=xin, counters=counters, workspace=workspace):
                    ws = sets[i % copies]
                    if glu:
                        extra = {"x2": xin[1], "counters": counters, "workspace": workspace} if cfg.gemv else {}
                        return quant_linear.quant_glu(xin[0], ws[0], ws[1], out, cfg, dt, pdl=pdl, **extra)
                    return quant_linear.quant_partials(xin[0], ws[0], out, cfg, dt, pdl=pdl)

                def read(out=out, cfg=cfg):
                    if glu:
                        return out.float()
                    return fixed_sum.to_float(out) if cfg.gemv else out.sum(0)
                # (batch 1's GEMV config is pick_config's, not the table's; the several-row kernel's goes there)
                yield kind, None if cfg.gemv and cfg.block_m == 1 else cfg, call, read
            if quant_mma_int4.supported(q0, m):  # the INT8 tensor-core kernel on the same prepared rows (untabled)
                yield from _mma_candidates(sets, x, m, sm, glu, sweep, device, pdl)
        if fmt == "int4_awq":  # torch's own INT4 kernel (tinygemm), its weight in its layout (untabled)
            yield from _int4pack_candidates(lins, x, glu, copies)
        # the library GEMMs quant_gemm.linear can take (prefill; not the decode step's GLU launch), timed whole:
        # torch._int_mm with the input's quantization and the epilogue, or the weight dequantized into the scratch
        # buffer and F.linear / torch._scaled_mm (its input's pre-quant scale and quantization too)
        library = []
        if not glu and quant_gemm.int_mm_supported(q0, m):
            library.append(("int_mm", quant_gemm.int_mm_linear))
        if not decode and quant_gemm.dequant_supported(q0, dt):
            library.append(("dequant", quant_gemm.dequant_linear))
        for kind, fn in library:
            res = {}

            def call(i, fn=fn, res=res):
                res[0] = fn(x, sets[i % copies][0], None, dt)
            yield kind, None, call, (lambda res=res: res[0].float())
        return
    w_scale = None if fmt == "bf16" else (lins[0].a_scale * lins[0].w_scale).reshape(1)
    xin = x if fmt == "bf16" else (x.float() * lins[0].a_inv).clamp(-448, 448).to(torch.float8_e4m3fn)
    if decode:  # linear.py's split-K / GLU kernels, as the decode step runs them
        cfg = linear.pick_config(m, n, x.shape[1], lins[0].weight.element_size(), sm, glu=glu)
        out = torch.empty(m, n, dtype=dt, device=device) if glu else torch.empty(cfg.splits, m, n, device=device)

        def call(i, cfg=cfg):
            ws = sets[i % copies]
            if glu:
                return linear.glu(xin, ws[0], ws[1], w_scale, None, out, cfg, dt, pdl=pdl)
            return linear.linear_partials(xin, ws[0], w_scale, out, cfg, pdl=pdl)
        yield "linear.py", cfg, call, lambda: out.float() if glu else out.sum(0)
    if not glu:  # the library GEMM (what prefill runs)
        res = {}

        def call(i):
            w = sets[i % copies][0]
            if fmt == "bf16":
                res[0] = F.linear(x, w)
            else:
                res[0] = torch._scaled_mm(xin, w.t(), scale_a=lins[0].a_scale, scale_b=lins[0].w_scale, out_dtype=dt)
        yield "F.linear" if fmt == "bf16" else "torch._scaled_mm", None, call, lambda: res[0].float()


def _line(r: dict) -> str:
    head = f"{r['format']:8} {r['linear']:5} m={r['m']:<4} {r['kernel']:16} {str(r['config']):44}"
    if "failed" in r:
        return head + " FAILED " + r["failed"][:120]
    if "us" not in r:
        return head + f" (not timed)  err {r['error']:.1e}"
    return head + (f" {r['us']:9.1f} us {r['gbps']:6.0f} GB/s {r['tflops']:6.1f} TF/s {r['of_roof']:5.0%} of roof"
                   f" ({r['bound']})  err {r['error']:.1e}")


def _correct(r: dict) -> bool:
    return "us" in r and r["error"] < MAX_ERR[r["format"]]


def _config_entry(r: dict) -> list[int]:
    c = LinearConfig(*r["config"])
    return [c.block_m, c.block_n, c.block_k, c.splits, c.num_warps, c.num_stages, int(c.swap), int(c.scale_weights),
            int(c.ptx_nibbles)]


MMA_BLOCK_NS = (64, 256)  # the INT8 MMA kernel's variants beside its default tiles (quant_mma_int4.config)


def _mma_candidates(sets, x, m, sm, glu, sweep, device, pdl):
    """("mma", config, call, read) of quant_mma_int4's kernel (issue 32: INT4-AWQ at 2-16 rows on the INT8 tensor
    cores) at its default tiles and, with ``sweep``, MMA_BLOCK_NS output rows a program. Into int64 accumulators as
    the decode step launches it; the GLU as fc and gate, two launches (the kernel has no fused GLU: the SiLU
    product is made when read, untimed). Not in quant_gemm.KERNELS: never written to the table."""
    dt = torch.bfloat16
    q0 = sets[0][0]
    mats = 2 if glu else 1
    configs = [quant_mma_int4.config(q0, m, sm)]
    configs += [quant_mma_int4.config(q0, m, sm, block_n=bn) for bn in MMA_BLOCK_NS if sweep]
    xin = [quant_gemv.launch_input(x, q, dt) for q in sets[0][:mats]]
    for cfg in configs:
        outs = [fixed_sum.accumulator(m, q0.n, device=device) for _ in range(mats)]

        def call(i, cfg=cfg, outs=outs):
            ws = sets[i % len(sets)]
            for j in range(mats):
                quant_linear.quant_partials(xin[j], ws[j], outs[j], cfg, dt, pdl=pdl)

        def read(outs=outs):
            if glu:
                return (F.silu(fixed_sum.to_float(outs[0]).to(dt)) * fixed_sum.to_float(outs[1]).to(dt)).float()
            return fixed_sum.to_float(outs[0])
        yield "mma", cfg, call, read


def _int4pack_candidates(lins, x, glu: bool, copies: int):
    """("int4pack", None, call, read) of ``torch._weight_int4pack_mm`` (cuda/int4pack.py) where it takes the shape:
    the GLU's fc and gate side by side in one call where their pre-quant scales agree (one input), else apart, then
    SiLU x gate by torch's elementwise ops, inside the time (as the decode step runs it)."""
    qs = [lin.kernel_weight() for lin in lins]
    if not int4pack.supported(qs[0].n, qs[0].k, qs[0].group) or x.dtype != torch.bfloat16:
        return
    packs = [int4pack.of_inputs(*qs) for _ in range(copies)]
    res = {}

    def call(i):
        if glu:
            fc, gate = int4pack.fc_gate(x, packs[i % copies], qs[0].n)
            res[0] = F.silu(fc) * gate
        else:
            res[0] = int4pack.linear(x, packs[i % copies][0])
    yield "int4pack", None, call, lambda: res[0].float()


def table_entries(rows: list[dict]) -> list[dict]:
    """The fastest correct kernel per (format, n, k, glu, m) among the 4/8-bit formats' candidates, in the form
    ``quant_gemm._load_table`` reads; where that is one of quant_gemm.LINEAR_KERNELS (prefill's ``linear`` only),
    also the fastest of the kernels the decode step launches (``step_kernel``, ``step_us``, ``step_config``)."""
    groups: dict = {}
    for r in rows:
        if r["format"] in qf.QUANT_FORMATS and r["kernel"] in quant_gemm.KERNELS and _correct(r):
            groups.setdefault((r["format"], r["n"], r["k"], r["glu"], r["m"]), []).append(r)
    entries = []
    for (fmt, n, k, glu, m), rs in sorted(groups.items()):
        r = min(rs, key=lambda r: r["us"])
        e = {"format": fmt, "n": n, "k": k, "glu": glu, "m": m, "kernel": r["kernel"], "us": round(r["us"], 2)}
        if r["config"] is not None and r["kernel"] in ("gemm", "gemv"):  # (the GEMV's: its several-row tiles)
            e["config"] = _config_entry(r)
        steps = [s for s in rs if s["kernel"] in quant_gemm.STEP_KERNELS]
        if r["kernel"] in quant_gemm.LINEAR_KERNELS and steps:
            s = min(steps, key=lambda s: s["us"])
            e.update(step_kernel=s["kernel"], step_us=round(s["us"], 2))
            if s["config"] is not None and s["kernel"] in ("gemm", "gemv"):
                e["step_config"] = _config_entry(s)
        entries.append(e)
    return entries


def kernel_table(rows: list[dict]) -> str:
    """Per (format, linear, M): the fastest correct kernel (error under MAX_ERR), the default GEMM, the best GEMM."""
    lines = ["format   linear m     kernel            us      GB/s   TFLOP/s  of roof  bound   err      "
             "(GEMM default us, best GEMM us)"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["format"], r["linear"], r["m"]), []).append(r)
    for (fmt, name, m), rs in groups.items():
        ok = [r for r in rs if _correct(r)]
        if not ok:
            lines.append(f"{fmt:8} {name:6} {m:<5} all failed" if not any("us" in r for r in rs) else
                         f"{fmt:8} {name:6} {m:<5} none within {MAX_ERR[fmt]:.0e}")
            continue
        b = min(ok, key=lambda r: r["us"])
        default = next((r for r in rs if r["kernel"] == "gemm" and "us" in r), None)
        gemms = [r for r in ok if r["kernel"] == "gemm"]
        best_gemm = min(gemms, key=lambda r: r["us"]) if gemms else None
        lines.append(f"{fmt:8} {name:6} {m:<5} {b['kernel']:16} {b['us']:8.1f} {b['gbps']:7.0f} {b['tflops']:8.1f} "
                     f"{b['of_roof']:7.0%}  {b['bound']:6} {b['error']:.1e}   "
                     f"{'%.1f' % default['us'] if default else '-'}, {'%.1f' % best_gemm['us'] if best_gemm else '-'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- steps


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _eager_us(fn, reps: int) -> float:
    """Microseconds per ``fn()`` launched eagerly ``max(reps, 10)`` times between CUDA events (after one warm-up)."""
    fn()
    reps = max(reps, 10)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000 / reps


def _timed_ms(fn, device: torch.device) -> tuple[float, object]:
    """(milliseconds of ``fn()``: CUDA events on a GPU, the wall clock on the CPU, the dry run's; its result)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t0) * 1000, out
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    out = fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b), out


def _gib(device: torch.device, what: str) -> float:
    """torch.cuda's ``what`` ("allocated": resident now, "peak": since the last reset) in GiB; 0 on the CPU."""
    if device.type != "cuda":
        return 0.0
    fn = torch.cuda.memory_allocated if what == "allocated" else torch.cuda.max_memory_allocated
    return fn(device) / 2**30


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _time_prefill(engine, prompt, reps=3) -> tuple[float, torch.Tensor]:
    """Median ms of one prefill of ``prompt`` [1, T] into slot 0 and its last token's logits."""
    dev = prompt.device
    times, logits = [], None
    for i in range(reps + 1):
        ms, logits = _timed_ms(lambda: engine.logits(engine.forward_slots(prompt, [0], [0])[:, -1]), dev)
        if i:
            times.append(ms)
    return statistics.median(times), logits


def _drop_copies(engine) -> int:
    """Free every linear's dequantized copy (what the engine keeps without KEEP_DEQUANTIZED); bytes freed."""
    freed = 0
    for layer in engine.layers:
        for key in ("qkv", "dense", "fc_gate", "proj"):
            mod = layer[key]
            for lin in ([mod.first, mod.second] if hasattr(mod, "first") else [mod]):
                if lin.dequantized is not None and (lin.gemm or lin.scaled_mm):
                    freed += lin.dequantized.numel() * lin.dequantized.element_size()
                    lin.dequantized = None
    return freed


def _batch_check(engine, graphs, batch: int = 8, prompt_len: int = 48) -> dict:
    """One decode step at ``batch`` rows (slots 0..): the fast path's logits against the eager model's (with its
    copies), both from the same prefilled cache."""
    dev = engine.cache_k.device
    gen = torch.Generator(device=dev).manual_seed(3)
    slots = list(range(batch))
    prompts = torch.randint(0, engine.lm_head.shape[0], (batch, prompt_len), device=dev, generator=gen)
    h = engine.forward_slots(prompts, slots, [0] * batch)
    tokens = engine.logits(h[:, -1]).argmax(-1)
    blocks = 1 + batch * engine.slot_blocks  # the null block, then each slot's run of blocks
    snap_k, snap_v = engine.cache_k[:, :blocks].clone(), engine.cache_v[:, :blocks].clone()
    eager = engine.logits(engine.forward_slots(tokens[:, None], slots, [prompt_len] * batch)[:, -1]).float()
    engine.cache_k[:, :blocks], engine.cache_v[:, :blocks] = snap_k, snap_v
    fast = graphs.decode(tokens.tolist(), engine.slot_tables(slots), [prompt_len] * batch).float()
    return {"batch": batch, "logits_rel_fast_vs_eager": qf.rel(fast, eager),
            "argmax_equal": f"{int((fast.argmax(-1) == eager.argmax(-1)).sum())}/{batch}"}


def step_rows(formats, bf16_tensors, device, *, ctx=2048, batches=BATCHES, steps=32, prefill=2048, check_batch=8,
              amax_prompt=512, warmup=3, log=print):
    """Per format: a 7B engine (``bf16_tensors()``: the dry run's is tiny) quantized, its prefill before and after
    the dequantized copies are dropped, a batch check, decode steps at ``batches``, memory (0 on the CPU)."""
    from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import DecodeStep
    from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import DecodeGraphs

    rows = []
    quant_gemm.release_scratch()  # the kernels part's
    config, tensors = bf16_tensors()
    amax = qf.input_amax(config, tensors, device, prompt_len=amax_prompt)
    del tensors
    _reset_peak(device)
    gib = 2**30
    for fmt in formats:
        row = {"format": fmt, "context": ctx, "prefill_tokens": prefill}
        engine = graphs = step = None
        try:
            cfg, tensors = qf.quantized_checkpoint(fmt, *bf16_tensors(), amax, device)
            Linear.KEEP_DEQUANTIZED = True  # "before": the copies a quantized engine used to keep
            try:
                engine = Qwen2Engine(cfg, tensors, device=device, max_slots=max(max(batches), check_batch) + 1,
                                     max_seq_len=max(ctx + steps + 16, prefill + 64))
            finally:
                Linear.KEEP_DEQUANTIZED = False
            del tensors
            gen = torch.Generator(device=device).manual_seed(4)
            prompt = torch.randint(0, engine.lm_head.shape[0], (1, prefill), device=device, generator=gen)
            _reset_peak(device)
            row["prefill_ms_before"], logits_before = _time_prefill(engine, prompt)
            row["peak_gib_before"] = _gib(device, "peak")
            row["resident_gib_before"] = _gib(device, "allocated")
            mem = engine.memory_bytes()
            row["kv_gib"] = mem["kv_cache"] / gib
            # the step's eager reference runs with the copies (the emulation); the fast path reads the stored tensors
            if fmt != "bf16":
                graphs_ref = DecodeGraphs(DecodeStep(engine), [1, check_batch])
                graphs_ref.prepare()
                row["check_batch"] = _batch_check(engine, graphs_ref, check_batch)
                # batch 1 too: its GEMVs are other kernels than the batches' GEMMs (quant_gemv_ws, quant_gemv_w4a8_ws)
                row["check_batch1"] = _batch_check(engine, graphs_ref, 1)
                log(f"check {fmt}: batch {check_batch} {row['check_batch']}, batch 1 {row['check_batch1']}")
                del graphs_ref
            row["copy_gib_dropped"] = _drop_copies(engine) / gib
            _reset_peak(device)
            row["resident_gib_after"] = _gib(device, "allocated")
            row["weights_gib"] = (mem["layers"] + mem["lm_head"] + mem["embedding"]) / gib - row["copy_gib_dropped"]
            row["prefill_ms"], logits_after = _time_prefill(engine, prompt)
            row["prefill_logits_rel_vs_copy"] = qf.rel(logits_after, logits_before)
            # quant_gemm's ``dequant`` kernel: ONE transient buffer, the largest layer's dequantized weight
            row["dequant_scratch_gib"] = quant_gemm.scratch_bytes() / gib
            t0 = time.perf_counter()
            step = DecodeStep(engine)
            graphs = DecodeGraphs(step, list(batches))
            graphs.prepare()
            row["graphs_setup_s"] = time.perf_counter() - t0
            # quant_gemv_ws.TILED_WEIGHTS: the batch-1 GEMV's tile-by-tile copy of each INT4 weight, in the peak
            row["tiled_copy_gib"] = sum(lin.quant.tiled.numel() * lin.quant.tiled.element_size()
                                        for layer in step.layers
                                        for lin in (layer.qkv, layer.dense, layer.fc, layer.gate, layer.proj)
                                        if lin.quant is not None and lin.quant.tiled is not None) / gib
            row["configs"] = {b: {k: dataclasses.astuple(c) for k, c in graphs.buffers[b].configs.items()}
                              for b in batches}
            engine.cache_k.normal_()
            engine.cache_v.normal_()
            row["steps"] = []
            for b in batches:
                wall, replay = _time_decode(graphs, b, ctx, steps, warmup)
                row["steps"].append({"batch": b, "ms_per_step": wall, "graph_replay_ms": replay,
                                     "tokens_per_s": b * 1000 / wall})
                log(f"step {fmt:8} b={b:<3} ctx={ctx}: {wall:.3f} ms/step (replay {replay:.3f}), "
                    f"{b * 1000 / wall:.0f} tok/s")
            row["peak_gib"] = _gib(device, "peak")
            glu1 = graphs.buffers[1].configs["glu"] if 1 in graphs.buffers else None
            if glu1 is not None and glu1.ws and not glu1.w4a8:  # (INT4's GEMV: W4A8's has no tiled copy)
                # batch 1 with the GEMV's tiled copy the other way round (switches.tiled_weights_enabled): its time
                # against its memory
                tiled_default = bool(row["tiled_copy_gib"])
                graphs = step = None
                _reset_peak(device)
                saved, quant_gemv_ws.TILED_WEIGHTS = quant_gemv_ws.TILED_WEIGHTS, not tiled_default
                forced = os.environ.pop("TRTLLM_PIPELINE_TILED_WEIGHTS", None)  # (the module's default decides)
                try:
                    graphs = DecodeGraphs(DecodeStep(engine), [1])
                    graphs.prepare()
                    wall, replay = _time_decode(graphs, 1, ctx, steps, warmup)
                finally:
                    quant_gemv_ws.TILED_WEIGHTS = saved
                    if forced is not None:
                        os.environ["TRTLLM_PIPELINE_TILED_WEIGHTS"] = forced
                row["untiled_batch1" if tiled_default else "tiled_batch1"] = {
                    "ms_per_step": wall, "graph_replay_ms": replay, "peak_gib": _gib(device, "peak")}
            log(f"steps {fmt}: { {k: v for k, v in row.items() if k not in ('steps', 'configs')} }")
        except Exception as exc:
            row["error"] = traceback.format_exc()[-2000:]
            log(f"steps {fmt} FAILED: {exc!r}")
        rows.append(row)
        # every reference to this format's engine: its DecodeStep held it (weights + KV) into the next format's row
        # until that row made its own step, which is what the 2026-12-04c run's "~16 GiB beyond weights + KV" in
        # the rows after W4A8 was (the previous engine: 12.6-15.4 GiB)
        del engine, graphs, step
        quant_gemm.release_scratch()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def merged_table(entries: list[dict], base: Path) -> list[dict]:
    """``base``'s table entries with those measured here in their place (the same format, shape, GLU and M) or beside
    them: a whole table for the runtime, from a part that measured a few M values only (``gemv_rows``)."""
    def key(e):
        return e["format"], e["n"], e["k"], bool(e["glu"]), e["m"]

    new = {key(e) for e in entries}
    old = json.loads(base.read_text())["entries"] if base.is_file() else []
    return sorted([e for e in old if key(e) not in new] + entries, key=key)


# the whole-step A/B of INT4-AWQ at these batches (``rows_step_rows``): the kernels the package's table picks, the
# several-row GEMV everywhere (its switch), and the table the gemv_rows part measured; 64 for the wgmma row kernel's
# wide form (17-64 rows) against today's kernels there
ROWS_BATCHES = (1, 8, 16, 64)


def rows_step_rows(bf16_tensors, device, table: Path | None, *, ctx=2048, batches=ROWS_BATCHES, steps=32,
                   amax_prompt=512, warmup=3, log=print) -> list[dict]:
    """INT4-AWQ decode steps at ``batches`` under each kernel choice (one engine, new step graphs per choice): "table"
    (the package's quant_gemm_table.json: today's kernels), "gemv" ($TRTLLM_PIPELINE_INT4_GEMV_MAX_ROWS=16: the GEMV
    at every batch up to 16), "measured" (``table``: the gemv_rows part's merged table, where it ran), "mma"
    ($TRTLLM_PIPELINE_INT4_MMA_ROWS=16: quant_mma_int4 for qkv, dense and proj at 2-16 rows, the GLU on the GEMV) and
    "int4pack" ($TRTLLM_PIPELINE_INT4PACK_ROWS=16: torch's INT4 kernel at 2-16 rows) and "wgmma"
    ($TRTLLM_PIPELINE_INT4_WGMMA_ROWS=64: quant_rows_int4_mma at 2-64 rows), the last two with their logits against
    eager's at each batch past 1 (``check_batch``)."""
    from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import DecodeStep
    from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import DecodeGraphs

    config, tensors = bf16_tensors()
    amax = qf.input_amax(config, tensors, device, prompt_len=amax_prompt)
    del tensors
    cfg, tensors = qf.quantized_checkpoint("int4_awq", *bf16_tensors(), amax, device)
    engine = Qwen2Engine(cfg, tensors, device=device, max_slots=max(batches) + 1, max_seq_len=ctx + steps + 16)
    del tensors
    engine.cache_k.normal_()
    engine.cache_v.normal_()
    choices = [("table", {quant_gemm.TABLE_ENV: str(quant_gemm.TABLE), quant_gemv.ROWS_ENV: "0"}),
               ("gemv", {quant_gemm.TABLE_ENV: str(quant_gemm.TABLE), quant_gemv.ROWS_ENV: str(quant_gemv.MAX_ROWS)})]
    if table is not None and table.is_file():
        choices.append(("measured", {quant_gemm.TABLE_ENV: str(table), quant_gemv.ROWS_ENV: "0"}))
    # quant_mma_int4's INT8 tensor-core linear for qkv, dense and proj at 2-16 rows, the GLU on the several-row GEMV
    choices.append(("mma", {quant_gemm.TABLE_ENV: str(quant_gemm.TABLE), quant_gemv.ROWS_ENV: str(quant_gemv.MAX_ROWS),
                            quant_mma_int4.ROWS_ENV: str(quant_mma_int4.MAX_ROWS)}))
    # torch's INT4 kernel (cuda/int4pack.py) for every INT4 linear at 2-16 rows, batch 1 on the table's GEMV; its
    # step's logits checked against eager's (its first whole steps)
    choices.append(("int4pack", {quant_gemm.TABLE_ENV: str(quant_gemm.TABLE), quant_gemv.ROWS_ENV: "0",
                                 int4pack.ROWS_ENV: "16"}))
    # quant_rows_int4_mma (the weights dequantized in registers into bfloat16 wgmma) at 2-64 rows; checked the same way
    choices.append(("wgmma", {quant_gemm.TABLE_ENV: str(quant_gemm.TABLE), quant_gemv.ROWS_ENV: "0",
                              quant_rows_int4_mma.ENV: str(quant_rows_int4_mma.MAX_ROWS)}))
    switches = (quant_mma_int4.ROWS_ENV, int4pack.ROWS_ENV, quant_rows_int4_mma.ENV)
    rows = []
    saved = {k: os.environ.get(k) for k in (quant_gemm.TABLE_ENV, quant_gemv.ROWS_ENV) + switches}
    for name, env in choices:
        for k in switches:
            os.environ.pop(k, None)
        os.environ.update(env)
        graphs = None
        try:
            graphs = DecodeGraphs(DecodeStep(engine), list(batches))
            graphs.prepare()
            for b in batches:
                wall, replay = _time_decode(graphs, b, ctx, steps, warmup)
                # (dot: quant_linear's kernel; mma: quant_mma_int4's)
                kernels = {k: "mma" if c.mma else "gemv" if c.gemv else "wgmma" if c.lut_mma else
                           "gemm" if c.gemm else "int4pack" if c.library else "dot"
                           for k, c in graphs.buffers[b].configs.items() if k != "lm_head"}
                rows.append({"choice": name, "batch": b, "ms_per_step": wall, "graph_replay_ms": replay,
                             "kernels": kernels, "configs": {k: dataclasses.astuple(c)
                                                             for k, c in graphs.buffers[b].configs.items()}})
                log(f"rows step {name:8} b={b:<3} ctx={ctx}: {wall:.3f} ms/step (replay {replay:.3f}) {kernels}")
                if name in ("int4pack", "wgmma") and b > 1:  # (the wgmma kernel's staged and wide forms both)
                    rows[-1]["check_batch"] = _batch_check(engine, graphs, batch=b, prompt_len=min(48, ctx))
                    log(f"rows step {name} b={b} against eager: {rows[-1]['check_batch']}")
        except Exception:
            rows.append({"choice": name, "error": traceback.format_exc()[-2000:]})
            log(f"rows step {name} FAILED:\n{traceback.format_exc()[-2000:]}")
        finally:
            del graphs
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def rows_step_table(rows: list[dict]) -> str:
    lines = ["INT4-AWQ decode step (ms/step, graph replay) by kernel choice and batch:"]
    for r in rows:
        if "error" in r:
            lines.append(f"  {r['choice']:8} FAILED {r['error'].splitlines()[-1]}")
        else:
            lines.append(f"  {r['choice']:8} b={r['batch']:<3} {r['ms_per_step']:7.3f} ({r['graph_replay_ms']:.3f})"
                         f"  {r['kernels']}")
    return "\n".join(lines)


def _time_decode(graphs, batch, ctx, steps, warmup=3) -> tuple[float, float]:
    """(wall ms per decode step at ``batch`` rows (slots 0..), every row at context ``ctx``, the greedy tokens read
    back as serving reads them, after ``warmup`` untimed steps; ms per replay of the step's CUDA graph alone, the
    wall time without graphs)."""
    dev = graphs.step.engine.cache_k.device
    slots, tokens = list(range(batch)), [1] * batch
    tables = graphs.step.engine.slot_tables(slots)  # resident on the device after the first step (request ids)
    for w in range(warmup):
        graphs.decode(tokens, tables, [ctx + w] * batch, slots)
    _sync(dev)
    wall0 = time.perf_counter()
    for s in range(steps):
        graphs.decode(tokens, tables, [ctx + s] * batch, slots)
        tokens = graphs.greedy(batch).tolist()  # the one copy a served token needs
    wall = (time.perf_counter() - wall0) / steps * 1000
    graphs.release(slots)
    if batch not in graphs.graphs:
        return wall, wall
    replays = 20
    ms, _ = _timed_ms(lambda: [graphs.graphs[batch].replay() for _ in range(replays)], dev)
    return wall, ms / replays


def step_table(rows: list[dict]) -> str:
    lines = ["format   batch  ms/step  tok/s     (context 2048)",
             ]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['format']:8} FAILED: {r['error'].strip().splitlines()[-1]}")
            continue
        for s in r["steps"]:
            lines.append(f"{r['format']:8} {s['batch']:<5} {s['ms_per_step']:8.3f} {s['tokens_per_s']:8.0f}")
    lines += ["", "format   prefill 2048 ms (before: copy)  peak GiB after (before)  weights GiB  KV GiB  "
                  "prefill logits vs copy  batch-8 step vs eager  (tiled GEMV copy GiB, dequant scratch GiB)"]
    for r in rows:
        if "error" in r:
            continue
        chk = r.get("check_batch", {})
        lines.append(f"{r['format']:8} {r['prefill_ms']:8.1f} ({r['prefill_ms_before']:6.1f})            "
                     f"{r['peak_gib']:6.2f} ({r['peak_gib_before']:6.2f})        {r['weights_gib']:7.2f}  "
                     f"{r['kv_gib']:6.2f}  {r['prefill_logits_rel_vs_copy']:.2e}            "
                     f"{chk.get('logits_rel_fast_vs_eager', float('nan')):.2e} argmax {chk.get('argmax_equal', '-')}"
                     f"  ({r.get('tiled_copy_gib', 0):.2f}, {r.get('dequant_scratch_gib', 0):.2f})")
        for key, label in (("untiled_batch1", "without"), ("tiled_batch1", "with")):
            if key in r:
                u = r[key]
                lines.append(f"{'':8} {label} the tiled copy: batch 1 {u['ms_per_step']:.3f} ms/step (replay "
                             f"{u['graph_replay_ms']:.3f}), peak {u['peak_gib']:.2f} GiB")
    return "\n".join(lines)


def _cpu_time(fn, reps: int) -> float:
    """The dry run's stand-in for ``gpu_fast_path.time_graph``: wall-clock us of one call (the interpreter's, which
    says nothing of a GPU's: ``reps`` would only repeat the call, each one a whole interpreted kernel)."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def dry_run_shape():
    """The 7B's architecture at a tiny size: what ``--dry-run`` builds (hidden 128, 1 layer, vocabulary 256)."""
    from trtllm_pipeline.model.catalog import KNOWN_MODELS

    return dataclasses.replace(KNOWN_MODELS["deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"], hidden_size=128,
                               intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=256)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="kernels,steps")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--ms", default=None, help=f"the kernels' M values (default {','.join(map(str, MS))}; dry run "
                                               f"{','.join(map(str, DRY_MS))})")
    ap.add_argument("--dry-run", action="store_true",
                    help="every call of both parts on the CPU at a tiny shape (Triton's interpreter: set "
                         "TRITON_INTERPRET=1, tests/ and tests/interpreter_site on PYTHONPATH), no sweep; timings "
                         "are the interpreter's (tests/test_fast_decode.py runs it)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    formats = [f for f in args.formats.split(",") if f]
    unknown = set(formats) - set(FORMATS)
    if unknown:
        ap.error(f"--formats: unknown {sorted(unknown)}; choose from {FORMATS}")
    from torch_runtime_gpu import synthetic_tensors

    if args.dry_run:
        dev, sm, time_fn, sweep_s = torch.device("cpu"), 4, _cpu_time, 0.0
        shape = dry_run_shape()
        shapes = linears(shape.hidden_size, shape.intermediate_size,
                         (shape.num_attention_heads + 2 * shape.num_key_value_heads) * shape.head_dim)
        # one untimed step and one timed: every call the GPU run makes, each made once (interpreted steps are slow)
        steps_kw = dict(ctx=24, batches=(1, 2), steps=1, warmup=1, prefill=16, check_batch=2, amax_prompt=16)
        rows_kw = dict(ctx=24, batches=(1, 3), steps=1, warmup=1, amax_prompt=16)
        ms, rows_ms = DRY_MS, DRY_ROWS_MS
        gpu = "cpu (dry run)"
    else:
        from gpu_fast_path import SHAPE as shape, time_graph as time_fn

        dev = torch.device("cuda")
        sm = torch.cuda.get_device_properties(dev).multi_processor_count
        shapes, steps_kw, ms, sweep_s, gpu = None, {}, MS, KERNEL_SWEEP_S, torch.cuda.get_device_name(dev)
        rows_kw, rows_ms = {}, ROWS_MS
    if args.ms:
        ms = rows_ms = [int(m) for m in args.ms.split(",")]
    rows_table = None
    result = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "sm_count": sm,
              "formats": formats}
    texts = []
    out_json = args.out / "quant_gemm.json"
    for part in args.parts.split(","):
        t0 = time.perf_counter()
        try:
            if part == "kernels":
                rows = kernel_rows(formats, time_fn, dev, sm, ms=ms, deadline=t0 + sweep_s, shapes=shapes,
                                   log=lambda s: print(s, flush=True))
                result["kernels"] = rows
                entries = table_entries(rows)
                if args.ms:  # a few M values: the package's entries for the others (the steps' batches keep theirs)
                    entries = merged_table(entries, Path(os.environ.get(quant_gemm.TABLE_ENV) or quant_gemm.TABLE))
                table_path = args.out / "quant_gemm_table.json"
                table_path.write_text(json.dumps({"gpu": gpu, "triton": triton.__version__,
                                                  "entries": entries}, indent=1) + "\n")
                os.environ[quant_gemm.TABLE_ENV] = str(table_path)  # the steps take the measured choices
                texts.append(kernel_table(rows))
            elif part == "gemv_rows":  # INT4-AWQ's GEMV (batch 1's, the several-row kernel) against today's choice
                rows = kernel_rows(["int4_awq"], time_fn, dev, sm, ms=rows_ms, deadline=t0 + sweep_s, shapes=shapes,
                                   log=lambda s: print(s, flush=True))
                result["gemv_rows"] = rows
                rows_table = args.out / "quant_gemm_table.json"
                base = Path(os.environ.get(quant_gemm.TABLE_ENV) or quant_gemm.TABLE)
                rows_table.write_text(json.dumps({"gpu": gpu, "triton": triton.__version__,
                                                  "entries": merged_table(table_entries(rows), base)}, indent=1) + "\n")
                texts.append(kernel_table(rows))
            elif part == "rows_steps":
                measured_table = rows_table if "gemv_rows" in result else None
                result["rows_steps"] = rows_step_rows(lambda: synthetic_tensors(shape, False, dev), dev,
                                                      measured_table, log=lambda s: print(s, flush=True),
                                                      **rows_kw)
                texts.append(rows_step_table(result["rows_steps"]))
            elif part == "steps":
                result["steps"] = step_rows(formats, lambda: synthetic_tensors(shape, False, dev), dev,
                                            log=lambda s: print(s, flush=True), **steps_kw)
                texts.append(step_table(result["steps"]))
            else:
                raise ValueError(f"unknown part {part!r}: kernels, steps, gemv_rows, rows_steps")
        except Exception:
            result[part] = {"error": traceback.format_exc()}
            print(f"PART {part} FAILED:\n{traceback.format_exc()}", flush=True)
        result[part + "_seconds"] = time.perf_counter() - t0
        out_json.write_text(json.dumps(result, indent=1, default=str))
        print(f"--- {part} done in {result[part + '_seconds']:.0f} s", flush=True)
    text = "\n\n".join(texts)
    (args.out / "quant_gemm.txt").write_text(text + "\n")
    print(text, flush=True)


if __name__ == "__main__":
    main()
