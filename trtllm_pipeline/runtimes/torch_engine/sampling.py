"""Next tokens for a batch of rows in one pass on the logits' device, with one copy back to the host.

Per-row settings (greedy or temperature / top-k / top-p, tokens banned this step) are applied as
batched tensor operations, so a decode step costs a handful of kernels whatever the batch, and the
only host synchronisation is reading the chosen token ids, which a streamed token needs anyway.
Seeded rows draw from their own ``torch.Generator`` (one ``multinomial`` launch each, no sync), so
a request's samples depend on its seed alone, not on what it was batched with.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from trtllm_pipeline.runtimes.base import SamplingParams

# Below this a temperature is greedy in all but name; dividing by it would overflow float32 (a
# temperature of 1e-45 is a float32 denormal, or zero), so it is floored here.
MIN_TEMPERATURE = 1e-5


@dataclasses.dataclass
class Row:
    """What the sampler needs of one request this step."""

    params: SamplingParams
    banned: Sequence[int] = ()  # token ids that may not be chosen now (min_tokens' end id, bad words)
    generator: torch.Generator | None = None


def sample(logits: torch.Tensor, rows: Sequence[Row], greedy: torch.Tensor | None = None) -> list[int]:
    """One token per row of ``logits`` [n, vocab] (float32).

    ``greedy``: the rows' argmax if the caller already has it (the CUDA graph computes it); used when
    every row is greedy.
    """
    n = len(rows)
    if all(r.params.greedy for r in rows):
        return _greedy(logits, rows, greedy)
    logits = _ban(logits, rows)
    chosen = logits.argmax(-1)
    sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
    if sampled:
        probs = filtered_probs(logits[sampled], [rows[i].params for i in sampled])
        for j, i in enumerate(sampled):
            chosen[i] = torch.multinomial(probs[j], 1, generator=rows[i].generator)[0]
    return chosen[:n].tolist()


def _greedy(logits: torch.Tensor, rows: Sequence[Row], greedy: torch.Tensor | None) -> list[int]:
    """Greedy rows' tokens: the argmax, recomputed under the bans only for the rows whose argmax is banned. The
    same tokens as the argmax of the banned logits (an argmax that is not banned is still the first maximum once
    other tokens are masked), without a copy of every row's logits each step: a request with ``min_tokens`` bans
    its end id at every step until then (the served benchmark's requests, every token)."""
    chosen = (greedy if greedy is not None else logits.argmax(-1)).tolist()
    clash = [i for i, r in enumerate(rows) if r.banned and chosen[i] in r.banned]
    if clash:
        at = torch.tensor(clash, device=logits.device)
        for i, token in zip(clash, ban(logits[at], [rows[i].banned for i in clash], inplace=True).argmax(-1).tolist()):
            chosen[i] = token
    return chosen[: len(rows)]


def _ban(logits: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
    return ban(logits, [r.banned for r in rows])


def ban(logits: torch.Tensor, banned: Sequence[Sequence[int]], *, inplace: bool = False) -> torch.Tensor:
    """``logits`` [n, vocab] with ``banned[i]``'s tokens of row i at -inf (a copy, unless ``inplace``; ``logits``
    itself if none is). What plain sampling applies before its argmax or ``filtered_probs``; speculative verification
    applies it at each verified position too (``TorchRuntime._verify``)."""
    vocab = logits.shape[-1]
    cells = [(i, t) for i, row in enumerate(banned) for t in row if 0 <= t < vocab]
    if not cells:
        return logits
    if not inplace:
        logits = logits.clone()
    index = torch.tensor(cells, device=logits.device).t()
    logits[index[0], index[1]] = float("-inf")
    return logits


def filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) per row; probabilities [rows, vocab]."""
    device = logits.device
    temps = torch.tensor([max(p.temperature, MIN_TEMPERATURE) for p in params], device=device, dtype=logits.dtype)
    # Scaled relative to each row's largest logit: the best token is exactly 0, so however small the
    # temperature, the softmax has a finite numerator and a sum of at least 1 (never inf/inf).
    logits = (logits - logits.amax(-1, keepdim=True)) / temps[:, None]
    ks = [min(p.top_k, logits.shape[-1]) for p in params]
    if any(ks):
        top = torch.topk(logits, max(ks), dim=-1).values
        k_index = torch.tensor([max(k, 1) - 1 for k in ks], device=device)
        kth = top.gather(1, k_index[:, None])
        kth[torch.tensor([k == 0 for k in ks], device=device)] = float("-inf")  # top_k 0: no filter
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    top_ps = [p.top_p for p in params]
    if any(p < 1.0 for p in top_ps):
        sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
        limit = torch.tensor([p if p < 1.0 else float("inf") for p in top_ps], device=device, dtype=probs.dtype)[:, None]
        outside = sorted_probs.cumsum(-1) - sorted_probs > limit  # keep the smallest set reaching top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return probs
