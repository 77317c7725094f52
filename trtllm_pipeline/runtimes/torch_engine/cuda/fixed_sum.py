"""A split-K GEMV's partials summed exactly and in any order: int64 fixed point.

Each program of a split-K launch adds its float32 partial, as an integer count of 2^-32, into an int64
accumulator by a reduction atomic that returns nothing (``REDG.E.ADD.64`` in the SASS: the program does not wait
for it). Integer addition is associative, so the total does not depend on the order in which the programs
finish: the consumer reads the exact sum of the partials (each exact where its magnitude is at least 2^-8, cut
at 2^-32 below that) and rounds it to float32 once, which is closer to the true sum than any float32 order.

It replaces the row tile's last program summing the splits in split order, which cost every program of the
launch a barrier and a counter atomic and the last one a round trip to L2 and a serial pass (H200, 7B
INT4-AWQ step: the GEMVs' split-sum tails were 0.13 ms of 1.75, run 94).

An accumulator starts at zero, and a launch that runs after its last reader and before its next writer sets it
to zero again (``clear``: stores spread over that launch's programs; ``DecodeStep`` says which). Clearing it
in the kernel that reads it would cost that kernel's one program the stores, and a barrier or an atomic
exchange per element so that no thread clears an element another thread has not read yet (H200: the 57
norms 153 -> 244 us with the exchange). Partials saturate at +-2^24, so 2^7 splits of them still fit the int64;
NaN adds as zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SCALE = tl.constexpr(4294967296.0)  # 2^32: the accumulator counts units of 2^-32
UNIT = tl.constexpr(2.0**-32)
LIMIT = tl.constexpr(16777216.0)  # 2^24: a partial's saturation


@triton.jit
def add(ptr, partial, mask):
    """Add float32 ``partial`` into the int64 accumulators at ``ptr`` where ``mask`` (no wait for the add)."""
    units = (tl.clamp(partial, -LIMIT, LIMIT) * SCALE).to(tl.int64)  # exact power-of-two scaling, then truncation
    tl.atomic_add(ptr, units, mask=mask, sem="relaxed", scope="gpu")


@triton.jit
def load(ptr, mask):
    """The float32 values of the accumulators at ``ptr`` (0 where not ``mask``): each int64 rounded once (to
    nearest), then scaled exactly. Read from L2 (``.cg``), where the adds land."""
    units = tl.load(ptr, mask=mask, other=0, cache_modifier=".cg")
    return units.to(tl.float32) * UNIT


@triton.jit
def summed(ptr, stride_s, offs, mask, SPLITS: tl.constexpr, FIXED: tl.constexpr):
    """A linear's float32 output at ``offs`` as its consumer reads it: the accumulators' values (FIXED), or
    the SPLITS split partials ``stride_s`` apart summed in split order (0 where not ``mask``)."""
    if FIXED:
        return load(ptr + offs, mask)
    y = tl.zeros(offs.shape, dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        y += tl.load(ptr + s * stride_s + offs, mask=mask, other=0.0)
    return y


def as_partials(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A linear's output as ``summed`` takes it: [S, B, N] split partials as they are, int64 accumulators [B, N]
    as one split; and whether they are accumulators."""
    fixed = is_accumulator(t)
    return (t[None] if fixed else t), fixed


@triton.jit
def clear(ptr, n, pid, programs, lanes):
    """Program ``pid`` of ``programs`` sets its share of the ``n`` accumulators at ``ptr`` to zero; ``lanes``:
    ``arange(0, L)`` in the caller's layout (Gluon or Triton)."""
    per = tl.cdiv(n, programs)
    end = tl.minimum(pid * per + per, n)
    for i in range(pid * per, end, lanes.shape[0]):
        idx = i + lanes
        tl.store(ptr + idx, (lanes * 0).to(tl.int64), mask=idx < end)


def accumulator(*shape: int, device) -> torch.Tensor:
    """Zeroed int64 accumulators."""
    return torch.zeros(shape, dtype=torch.int64, device=device)


def to_float(units: torch.Tensor) -> torch.Tensor:
    """What ``load`` reads, on the host side (the tests and benchmarks)."""
    return units.to(torch.float32) * UNIT.value


def is_accumulator(t: torch.Tensor | None) -> bool:
    """Whether a linear's output handed to its consumer is an accumulator (else float32 split partials)."""
    return t is not None and t.dtype == torch.int64
