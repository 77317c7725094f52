"""The 4-bit formats' decode kernels at the 7B's GLU and mlp.proj, a few launches each, for Nsight Compute (issue 32).

    ncu --clock-control none --section ... python3 benchmarks/ncu_quant.py [--ms 1,8] [--formats int4_awq,w4a8_awq]
    TRITON_INTERPRET=1 PYTHONPATH=tests/interpreter_site:tests:. python3 benchmarks/ncu_quant.py --dry-run
    (h200_run.sh ncu_quant)

At M 8 the table's GEMMs stream ~1.2 TB/s (28% of the byte roof, H100 2026-12-07) and five kernels tried so far
land there; sm_90 SASS read on the CPU says the K loop is latency-bound, which only the hardware's stall counters can
confirm or refute. Batch 1's GEMV (~65% of the roof) is launched too, as the contrast. W4A8-AWQ's batch-1 GEMV (a
table lookup into dp4a: 3.146 ms a 7B step on an H200, 47% of the floor, against INT4's 1.7 on the same bytes) and
its M 8 GEMM the same way. Each kernel runs LAUNCHES times on one weight copy (the first compiles it) inside an NVTX
range named as the printed line (``ncu --nvtx`` shows it with each launch); the profile is read per launch, so no
timing here. Prints each launch's kernel and config, and the result's error against float32 ``x @ W^T`` (a launch
that computed garbage would make its counters meaningless). At M > 1 each GEMM also runs without the AWQ pre-quant
scales, the input scaled beforehand (what folding them into the producer would leave): the profile's difference is
what they cost. At M > 1 the kernel is the decode step's choice (``quant_gemm.choose``), so the wgmma row kernels'
switches pick what is profiled (``TRTLLM_PIPELINE_W4A8_WGMMA_ROWS=64 TRTLLM_PIPELINE_INT4_WGMMA_ROWS=64``: the wide
forms at 64 rows, the made input's kernel with them).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import quant_fast_path as qf  # noqa: E402
from quant_gemm import _reference, _weights  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.cuda import (fixed_sum, quant_gemm, quant_gemv,  # noqa: E402
                                                        quant_gemv_w4a8, quant_gemv_w4a8_mma, quant_linear)

LAUNCHES = 3
FORMATS = ("int4_awq", "w4a8_awq")
SHAPES = (("glu", 18944, 3584, 2), ("proj", 3584, 18944, 1))
DRY_SHAPES = (("glu", 256, 128, 2), ("proj", 128, 256, 1))  # --dry-run: every call on the CPU, through the interpreter


def _decode_choice(q, m: int, sm: int, glu: bool = False):
    """At M > 1 the decode step's kernel where it is a GEMM (``quant_gemm.choose``: the wgmma row kernels where their
    switches take them, e.g. ``TRTLLM_PIPELINE_W4A8_WGMMA_ROWS=64`` for W4A8's wide form), else quant_gemm's GEMM."""
    cfg = quant_gemm.choose(q, m, sm, glu=glu)
    return cfg if cfg.gemm else quant_gemm.pick_config(q, m, sm, glu=glu)


def _glu_call(qs, x, m: int, sm: int):
    """The decode step's GLU launch at M = ``m``: batch 1's GEMV, else the table's GEMM (its split K's counters)."""
    dt = torch.bfloat16
    n = qs[0].n
    out = torch.empty(m, n, dtype=dt, device=x.device)
    if m == 1 and qs[0].fmt == "w4a8_awq":  # its GEMV takes the input as it is
        cfg = quant_gemv_w4a8.pick_config(qs[0], sm, glu=True)
        return cfg, lambda: quant_linear.quant_glu(x, qs[0], qs[1], out, cfg, dt), out.float
    if m == 1:
        cfg = quant_linear.pick_config(qs[0], 1, sm, glu=True)
        xin = [quant_gemv.launch_input(x, q, dt) for q in qs]
        counters = torch.zeros(4096, dtype=torch.int32, device=x.device)
        workspace = torch.empty(8 * 2 * n, device=x.device)
        return cfg, lambda: quant_linear.quant_glu(xin[0], qs[0], qs[1], out, cfg, dt, pdl=False, x2=xin[1],
                                                   counters=counters, workspace=workspace), out.float
    cfg = _decode_choice(qs[0], m, sm, glu=True)
    extra = {}
    if cfg.splits > 1:
        extra = dict(counters=torch.zeros(quant_gemm.glu_counters(qs[0], m, cfg), dtype=torch.int32, device=x.device),
                     workspace=torch.empty(quant_gemm.glu_workspace(qs[0], m, cfg), device=x.device))
    return cfg, lambda: quant_gemm.launch(x, qs[0], qs[1], out, cfg, dt, **extra), out.float


def _proj_call(q, x, m: int, sm: int):
    dt = torch.bfloat16
    if m == 1 and q.fmt == "w4a8_awq":
        cfg = quant_gemv_w4a8.pick_config(q, sm)
        out = torch.empty(cfg.splits, 1, q.n, device=x.device)
        return cfg, lambda: quant_linear.quant_partials(x, q, out, cfg, dt), lambda: out.sum(0)
    if m == 1:
        cfg = quant_linear.pick_config(q, 1, sm)
        xin = quant_gemv.launch_input(x, q, dt)
        out = fixed_sum.accumulator(1, q.n, device=x.device)
        return cfg, lambda: quant_linear.quant_partials(xin, q, out, cfg, dt), lambda: fixed_sum.to_float(out)
    cfg = _decode_choice(q, m, sm)
    out = torch.empty(cfg.splits, m, q.n, device=x.device)
    return cfg, lambda: quant_gemm.launch(x, q, None, out, cfg, dt), lambda: out.sum(0)


@contextlib.contextmanager
def _range(name: str, cuda: bool):
    """An NVTX range around a case's launches (ncu --nvtx names them by it)."""
    if cuda:
        torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        if cuda:
            torch.cuda.nvtx.range_pop()


def _profiled(label: str, make, want, cuda: bool) -> bool:
    """``make()``'s (config, call, read) launched LAUNCHES times in an NVTX range named ``label``, its first result
    checked against ``want``; prints the line the range is named by. False where it failed (reported, not raised:
    the other cases are still profiled)."""
    try:
        cfg, call, read = make()
        with _range(label, cuda):
            call()  # (batch 1's GEMV adds into its accumulators: its result is read after one launch)
            error = qf.rel(read(), want)
            for _ in range(LAUNCHES - 1 if cuda else 0):
                call()
        if cuda:
            torch.cuda.synchronize()
        print(f"{label}: {cfg} error {error:.2e}", flush=True)
        return True
    except Exception as exc:  # noqa: BLE001 - one kernel's failure leaves the others to profile
        print(f"{label}: failed {exc!r:.300}", flush=True)
        return False


def _call(qs, x, m: int, sm: int):
    return _glu_call(qs, x, m, sm) if len(qs) == 2 else _proj_call(qs[0], x, m, sm)


def _without_pqs(qs, x):
    """The matrices without their pre-quant scales and the input scaled by them beforehand (as a producer could
    write it): the same launch with none in the GEMM's loop, what its profile prices. The first matrix's scales
    serve both of the GLU's (the random layers' two differ: its error is then not the table launch's; its time is)."""
    return [dataclasses.replace(q, pqs=None) for q in qs], (x.float() * qs[0].pqs.float()).to(torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,8", help="decode batch sizes (default 1,8)")
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"of {', '.join(FORMATS)} (default: both)")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    cuda = device.type == "cuda"
    sm = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 4
    gen = torch.Generator(device=device).manual_seed(11)
    failed = 0
    cases = [(fmt, *shape) for fmt in args.formats.split(",") for shape in (DRY_SHAPES if args.dry_run else SHAPES)]
    for fmt, name, n, k, mats in cases:
        if fmt not in FORMATS:
            sys.exit(f"ncu_quant.py: no format {fmt!r}; --formats takes {', '.join(FORMATS)}")
        lins = _weights(fmt, n, k, mats, gen, device)
        qs = [lin.kernel_weight() for lin in lins]
        if fmt == "w4a8_awq":  # both lookup kernels' tables (what the decode step makes at load)
            qs = [quant_gemv_w4a8_mma.with_tables(quant_gemv_w4a8.with_tables(q)) for q in qs]
        name = f"{fmt} {name}"
        for m in (int(v) for v in args.ms.split(",")):
            x = (torch.randn(m, k, generator=gen, device=device) * 2).to(torch.bfloat16)
            ref = [_reference(lin, x) for lin in lins]
            dt = torch.bfloat16
            want = F.silu(ref[0].to(dt).float()).to(dt).float() * ref[1].to(dt).float() if mats == 2 else ref[0]
            failed += not _profiled(f"{name} m={m}", lambda: _call(qs, x, m, sm), want, cuda)
            # (the row kernels' pre-quant scales are the made input's or the staging's, not in their K loop)
            if m > 1 and qs[0].pqs is not None and not (cuda and _decode_choice(qs[0], m, sm).lut_mma):
                plain, scaled = _without_pqs(qs, x)
                failed += not _profiled(f"{name} m={m} without pre-quant scales in the GEMM",
                                        lambda: _call(plain, scaled, m, sm), want, cuda)
        if cuda:
            torch.cuda.empty_cache()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
