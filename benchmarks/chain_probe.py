"""What one dependency between two kernels costs in a CUDA graph, by the way the second waits for the first.

    python benchmarks/chain_probe.py [-o chain_probe.json]

The INT4 decode step is ~226 launches, and each one costs ~1.6-1.8 us beyond its work (docs/perf-notes.md,
eighth step): the dependent kernel waits under PDL (``griddepcontrol.wait``) for the whole previous grid to
finish and flush. This probe times chains of near-empty kernels to compare the ways a kernel can wait:

* ``nopdl``: plain stream order;
* ``pdl``: launched early under PDL, ``griddepcontrol.wait`` then ``launch_dependents`` (the decode step's way);
* ``flag``: launched early under PDL, but each program spins on a counter (``ld.acquire.gpu``) until every
  program of the previous kernel has added one to it (a CTA barrier, then one ``atom.release.gpu``), then
  triggers its dependents: no grid-completion wait at all;
* ``flag-narrow``: the counter only where a one-program kernel (the norm's shape) waits for a wide one.

Two chains, each 224 kernels: wide -> narrow -> wide ... (a GEMV's grid, then a norm's one program) and wide ->
wide. Every kernel's numbers depend on the previous kernel's, and every buffer is zeroed at the graph's start,
so a kernel that ran before its input was written gives numbers unlike plain stream order's (checked).
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

NOPDL, PDL, FLAG = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def _spin(cnt_ptr, target):
    """Until the counter reads ``target`` (acquire: what its writers stored before adding is visible after)."""
    one = tl.zeros([1], tl.int32)
    c = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [cnt_ptr + one], dtype=tl.int32,
                                  is_pure=False, pack=1)
    while tl.min(c, 0) < target:
        c = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [cnt_ptr + one],
                                      dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _enter(cnt_in, n_in, WAIT: tl.constexpr):
    if WAIT == PDL:
        gdc_wait()
        gdc_launch_dependents()
    if WAIT == FLAG:
        _spin(cnt_in, n_in)
        gdc_launch_dependents()


@triton.jit
def _leave(cnt_out, SIGNAL: tl.constexpr):
    if SIGNAL:
        tl.debug_barrier()  # every thread's stores before the one release below (it is cumulative)
        tl.atomic_add(cnt_out, 1, sem="release", scope="gpu")


@triton.jit
def _wide(src, n_src, dst, cnt_in, n_in, cnt_out, WAIT: tl.constexpr, SIGNAL: tl.constexpr, BLOCK: tl.constexpr):
    _enter(cnt_in, n_in, WAIT)
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(src + offs, mask=offs < n_src, other=0.0, cache_modifier=".cg")
    tl.store(dst + pid, tl.sum(x, 0) * 0.5 / n_src + pid * 1e-3 + 1.0)
    _leave(cnt_out, SIGNAL)


@triton.jit
def _narrow(src, n_src, dst, cnt_in, n_in, cnt_out, WAIT: tl.constexpr, SIGNAL: tl.constexpr, BLOCK: tl.constexpr):
    _enter(cnt_in, n_in, WAIT)
    offs = tl.arange(0, BLOCK)
    x = tl.load(src + offs, mask=offs < n_src, other=0.0, cache_modifier=".cg")
    tl.store(dst, tl.sum(x, 0) / n_src + 0.25)
    _leave(cnt_out, SIGNAL)


def chain(pattern: str, mode: str, kernels: int, wide: int, bufs, counters) -> None:
    """Launch the chain: kernel i reads buffer i-1 and writes buffer i (row i of ``bufs``)."""
    width = lambda i: 1 if pattern == "wn" and i % 2 else wide  # noqa: E731
    for i in range(1, kernels + 1):
        narrow = width(i) == 1
        if mode == "nopdl":
            wait, pdl = NOPDL, False
        elif mode == "pdl" or (mode == "flag-narrow" and not narrow):
            wait, pdl = PDL, True
        else:
            wait, pdl = FLAG, True
        nxt = i + 1 <= kernels
        nxt_flag = nxt and (mode == "flag" or (mode == "flag-narrow" and width(i + 1) == 1))
        kern = _narrow if narrow else _wide
        kern[(width(i),)](bufs[i - 1], width(i - 1), bufs[i], counters[i - 1:], width(i - 1), counters[i:],
                          WAIT=wait if i > 1 else NOPDL, SIGNAL=nxt_flag, BLOCK=triton.next_power_of_2(wide),
                          num_warps=4, launch_pdl=pdl and i > 1)


def run(pattern: str, mode: str, kernels: int, wide: int, reps: int) -> tuple[float, torch.Tensor]:
    bufs = torch.zeros(kernels + 1, wide, device="cuda")
    counters = torch.zeros(kernels + 1, dtype=torch.int32, device="cuda")
    seed = torch.linspace(0.5, 1.5, wide, device="cuda")

    def body():
        bufs.zero_()
        counters.zero_()
        bufs[0].copy_(seed)
        chain(pattern, mode, kernels, wide, bufs, counters)

    body()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    for _ in range(20):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1000.0, bufs.clone()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", default="chain_probe.json")
    ap.add_argument("--kernels", type=int, default=224)
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    rows = []
    print(f"{'chain':>6} {'wide':>5} {'mode':>12} {'us/graph':>9} {'us/kernel':>9}  same as stream order")
    for pattern in ("wn", "ww"):
        for wide in (132, 264, 396):
            ref = None
            for mode in ("nopdl", "pdl", "flag", "flag-narrow"):
                if mode == "flag-narrow" and pattern == "ww":
                    continue
                us, out = run(pattern, mode, a.kernels, wide, a.reps)
                ref = out if ref is None else ref
                same = bool(torch.equal(out, ref))
                rows.append({"chain": pattern, "wide": wide, "mode": mode, "us_per_graph": us,
                             "us_per_kernel": us / a.kernels, "same_as_stream_order": same})
                print(f"{pattern:>6} {wide:>5} {mode:>12} {us:9.1f} {us / a.kernels:9.3f}  {same}")
    with open(a.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "kernels": a.kernels, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
