"""Weights of a later linear fetched into L2 by a kernel on a side stream, while DRAM idles.

At batch 1 a decode step keeps DRAM busy only while the large GEMVs stream their weights: from the input norm
to the post-attention norm (QKV, attention, the split combine, dense: ~20 us a layer of the INT4 7B step) it
moves ~20 MB, a fifth of what it could. No kernel of the step writes a weight, so the weights of a linear that
comes later can be fetched into L2 in that window, and that linear then reads them at L2's latency. A kernel
that prefetches is held until its bytes land (H200: 6.8 MB kept a 128-program launch 5.2 us, run 94), so in
the step's chain of kernels it costs the chain what it saves the linear (tried in the chain, runs 93-94: every
plan slower). Here it runs on a side stream instead: the decode step forks after a layer's input norm, a
launch of a few programs prefetches that layer's plan, and the step joins the side stream at its end; the
chain itself never waits for it. The instruction is Hopper's bulk prefetch
(``cp.async.bulk.prefetch.L2.global [address], bytes``), or line by line (``prefetch.global.L2``, LINES).

A plan is a few byte regions, each ``rows`` runs of ``nbytes`` bytes ``stride`` bytes apart (a whole tensor
is one run; a slab of K columns of a weight matrix is one run per row), kept as an int64 tensor [R, 4] that
the kernel reads. The programs share the runs out in chunks of at most CHUNK bytes, one chunk per thread at a
time.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

CHUNK = tl.constexpr(4096)  # bytes per prefetch instruction at most (a multiple of 16)
# Prefetch a chunk line by line (``prefetch.global.L2``, one 128-byte line an instruction) instead of by one bulk
# instruction (read at launch)
LINES = False
PROGRAMS = 16  # the side launch's programs (4 warps each): a few SMs' worth, beside the step's kernels


@dataclasses.dataclass(frozen=True)
class Region:
    """``rows`` runs of ``nbytes`` bytes from ``addr``, ``stride`` bytes apart (all multiples of 16)."""

    addr: int
    rows: int
    stride: int
    nbytes: int

    def __post_init__(self):
        if self.addr % 16 or self.stride % 16 or self.nbytes % 16 or self.nbytes <= 0 or self.rows <= 0:
            raise ValueError(f"a bulk prefetch needs 16-byte aligned runs of 16-byte multiples: {self}")

    @property
    def total(self) -> int:
        return self.rows * self.nbytes


def whole(t: torch.Tensor) -> Region:
    """All of a contiguous tensor."""
    assert t.is_contiguous()
    return Region(t.data_ptr(), 1, 0, t.numel() * t.element_size())


def columns(t: torch.Tensor, start: int, stop: int) -> Region:
    """Columns [start, stop) of every row of a 2-D tensor whose rows are contiguous."""
    assert t.dim() == 2 and t.stride(1) == 1 and 0 <= start < stop <= t.shape[1]
    size = t.element_size()
    return Region(t.data_ptr() + start * size, t.shape[0], t.stride(0) * size, (stop - start) * size)


def plan(regions: list[Region], device) -> torch.Tensor | None:
    """The regions as the kernels read them: int64 [R, 4] on ``device`` (None for no region)."""
    if not regions:
        return None
    rows = [[r.addr, r.rows, r.stride, r.nbytes] for r in regions]
    return torch.tensor(rows, dtype=torch.int64, device=device)


@triton.jit
def _bulk_prefetch(address, size):
    """One bulk L2 prefetch per element where ``size`` > 0 (a predicate: inline assembly has no mask)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [address, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _line_prefetch(address, size, CHUNK: tl.constexpr):
    """A chunk as 128-byte line prefetches (lines past ``size`` are not fetched)."""
    for j in tl.static_range(CHUNK // 128):
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [address + j * 128, size - j * 128], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch(plan_ptr, REGIONS: tl.constexpr, pid, programs, lanes, CHUNK: tl.constexpr, RECORD: tl.constexpr,
             record_ptr, LINES: tl.constexpr = False):
    """This program's share of the plan: chunk c of the plan's runs goes to program c / len(lanes) mod
    ``programs``, one per lane. ``lanes``: ``arange(0, L)`` in the caller's layout (Gluon or Triton).
    RECORD (the interpreter's tests): each chunk's address and size stored at ``record_ptr`` [chunks, 2],
    chunk by chunk in the plan's order, instead of prefetched. LINES: by line prefetches (``LINES``)."""
    BLOCK: tl.constexpr = lanes.shape[0]
    first = 0
    for r in tl.static_range(REGIONS):
        addr = tl.load(plan_ptr + 4 * r)
        rows = tl.load(plan_ptr + 4 * r + 1).to(tl.int32)
        stride = tl.load(plan_ptr + 4 * r + 2)
        nbytes = tl.load(plan_ptr + 4 * r + 3).to(tl.int32)
        per_row = (nbytes + CHUNK - 1) // CHUNK
        total = rows * per_row
        for c0 in range(pid * BLOCK, total, programs * BLOCK):
            c = c0 + lanes
            row = c // per_row
            offset = (c - row * per_row) * CHUNK
            size = tl.where(c < total, tl.minimum(nbytes - offset, CHUNK), 0)
            address = addr + row.to(tl.int64) * stride + offset
            if RECORD:
                ok = c < total
                tl.store(record_ptr + 2 * (first + c), address, mask=ok)
                tl.store(record_ptr + 2 * (first + c) + 1, size.to(tl.int64), mask=ok)
            elif LINES:
                _line_prefetch(address.to(tl.pointer_type(tl.int8)), size, CHUNK)
            else:
                _bulk_prefetch(address.to(tl.pointer_type(tl.int8)), size)
        first += total


@triton.jit
def _record_kernel(plan_ptr, record_ptr, REGIONS: tl.constexpr, CHUNK: tl.constexpr, LANES: tl.constexpr):
    prefetch(plan_ptr, REGIONS, tl.program_id(0), tl.num_programs(0), tl.arange(0, LANES), CHUNK, True, record_ptr)


def chunks(regions: list[Region], programs: int, lanes: int, chunk: int = CHUNK.value) -> list[tuple[int, int]]:
    """(address, size) of every chunk ``prefetch`` issues for ``regions`` from ``programs`` programs of
    ``lanes`` lanes, in the plan's order, as the kernel computes them (the tests run it in the interpreter)."""
    count = sum(r.rows * triton.cdiv(r.nbytes, chunk) for r in regions)
    record = torch.full((count, 2), -1, dtype=torch.int64)
    _record_kernel[(programs,)](plan(regions, "cpu"), record, REGIONS=len(regions), CHUNK=chunk, LANES=lanes)
    return [tuple(row) for row in record.tolist()]


@triton.jit
def _prefetch_kernel(plan_ptr, REGIONS: tl.constexpr, CHUNK: tl.constexpr, LANES: tl.constexpr,
                     LINES: tl.constexpr):
    prefetch(plan_ptr, REGIONS, tl.program_id(0), tl.num_programs(0), tl.arange(0, LANES), CHUNK, False, plan_ptr,
             LINES)


def launch(plan_rows: torch.Tensor, programs: int | None = None) -> None:
    """Prefetch ``plan_rows`` (``plan``'s tensor) into L2 on the current stream (no PDL: nothing waits on it
    but the step's join)."""
    _prefetch_kernel[(programs or PROGRAMS,)](plan_rows, REGIONS=plan_rows.shape[0], CHUNK=CHUNK, LANES=128,
                                              LINES=LINES, num_warps=4)
