"""The step's greedy token: each row's argmax over the logits, as torch.argmax takes it (the first of equal
maxima), in one launch that follows lm_head under PDL.

torch.argmax over one 152064-wide row is a single reduction kernel (H200: 8.7 us) launched after lm_head
without PDL. Here PARTS programs per row each scan a contiguous part of the row (read from L2, where lm_head
just wrote it) and the last of them to finish picks the first part holding the row's maximum: the same
index whichever program is last. Folding the tile maxima into lm_head's own launch instead cost its 2376
programs a barrier and an atomic each (H200, 7B INT4 step: 1.82 against 1.79 ms, lm_head 245 -> 296 us).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda.linear import last_program

PARTS = 64  # programs per row
BLOCK = 2048  # logits a program reads per iteration
# Off CUDA (Triton's interpreter, the CPU's check of this kernel) 4 parts of 16,384-wide blocks: the same reduction,
# parts and the last picking, in a sixteenth of the programs and iterations, each of which the interpreter runs one
# operation at a time whatever its width (2 ms a program: 12% of a speculative decoding check's time)
CPU_PARTS, CPU_BLOCK = 4, 16384


def _shape(device: torch.device) -> tuple[int, int]:
    """(programs per row, logits per iteration) on ``device``."""
    return (PARTS, BLOCK) if device.type == "cuda" else (CPU_PARTS, CPU_BLOCK)


@dataclasses.dataclass
class Greedy:
    """Where ``argmax`` puts each row's token (``tokens`` int64 [B]), and its scratch."""

    tokens: torch.Tensor
    best: torch.Tensor  # float32 [B, parts]: each part's maximum
    best_idx: torch.Tensor  # int32 [B, parts]: its first column
    counters: torch.Tensor  # int32 [B] zeros: the parts done per row (the last leaves it at zero)

    @classmethod
    def empty(cls, tokens: torch.Tensor) -> "Greedy":
        batch, dev = tokens.shape[0], tokens.device
        parts = _shape(dev)[0]
        return cls(tokens, torch.empty(batch, parts, device=dev),
                   torch.empty(batch, parts, dtype=torch.int32, device=dev),
                   torch.zeros(batch, dtype=torch.int32, device=dev))


@triton.jit
def _argmax_kernel(logits_ptr, ban_ptr, best_ptr, best_idx_ptr, out_ptr, count_ptr, N, stride_l, per_part,
                   PARTS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr, BAN: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    start = part * per_part
    end = tl.minimum(start + per_part, N)
    top = float("-inf")
    arg = start
    for c in range(start, end, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        v = tl.load(logits_ptr + row * stride_l + cols, mask=cols < end, other=float("-inf"))
        if BAN:  # (one int64 a row: from L1 after the first iteration)
            v = tl.where(cols == tl.load(ban_ptr + row), float("-inf"), v)
        m = tl.max(v, 0)
        better = m > top  # strictly: an equal maximum later in the row keeps the earlier index
        arg = tl.where(better, c + tl.argmax(v, 0, tie_break_left=True), arg)
        top = tl.where(better, m, top)
    tl.store(best_ptr + row * PARTS + part, top)
    tl.store(best_idx_ptr + row * PARTS + part, arg)
    if last_program(count_ptr, row, PARTS):
        parts = tl.arange(0, PARTS)
        v = tl.load(best_ptr + row * PARTS + parts, cache_modifier=".cg")
        first = tl.argmax(v, 0, tie_break_left=True)
        tl.store(out_ptr + row, tl.load(best_idx_ptr + row * PARTS + first, cache_modifier=".cg").to(tl.int64))
        tl.store(count_ptr + row, 0)


def argmax(logits: torch.Tensor, out: Greedy, pdl: bool = False, ban: torch.Tensor | None = None) -> None:
    """``out.tokens[b] = argmax(logits[b])`` for float32 ``logits`` [B, N] (one launch). ``ban`` (int64 [B]): a
    token row b may not take (its end id before ``min_tokens``), negative for none: skipped as if its logit were
    -inf, so the step's own argmax is the greedy token under that ban and a chained step may feed on it."""
    batch, n = logits.shape
    parts, block = _shape(logits.device)
    assert logits.stride(1) == 1 and out.tokens.shape[0] == batch and out.best.shape[1] == parts
    per_part = triton.cdiv(triton.cdiv(n, parts), 16) * 16
    _argmax_kernel[(batch, parts)](logits, logits if ban is None else ban, out.best, out.best_idx, out.tokens,
                                   out.counters, n, logits.stride(0), per_part, PARTS=parts, BLOCK=block, PDL=pdl,
                                   BAN=ban is not None, num_warps=4, launch_pdl=pdl)


def argmax_torch(logits: torch.Tensor, out: torch.Tensor, ban: torch.Tensor) -> None:
    """``argmax``'s result by torch (no PDL): the argmax of ``logits`` with each row's ``ban`` at -inf (the
    logits themselves untouched)."""
    banned = ban.clamp(min=0).unsqueeze(1)
    masked = logits.scatter(1, banned, torch.where(ban.unsqueeze(1) >= 0, float("-inf"), logits.gather(1, banned)))
    torch.argmax(masked, dim=-1, out=out)
