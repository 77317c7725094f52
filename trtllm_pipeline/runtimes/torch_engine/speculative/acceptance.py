"""Which drafted tokens the target keeps: greedy, and speculative sampling's rejection rule.

A verified row is the request's last token and ``m`` drafts d1..dm, fed at once: the target's distributions
p0..pm come out at every position (p_i is the target's next-token distribution after d_i, p0 after the last real
token). Greedy: keep drafts while each equals the target's argmax there, then add the target's own next token, so
the output is exactly plain greedy decoding's. Sampling (Leviathan et al. 2023, Chen et al. 2023): keep d_{i+1} with
probability min(1, p_i(d)/q_i(d)); at the first rejection draw from normalize(max(0, p_i - q_i)) and stop; if all
are kept draw one more from p_m. Each emitted token is then distributed exactly as p, whatever q was. This
project's proposers commit to one token (q a point mass on d): acceptance is p_i(d) and the residual is p_i with d
removed. ``p`` is the distribution the runtime samples from (the tokens banned at that position masked out, then
temperature, top-k, top-p: ``sampling.filtered_probs``), so the rule respects them (greedy's argmax too is over the
masked logits: ``TorchRuntime._verify``); the draws use the request's generator, so a seeded request is reproducible
(though not the same sequence as without speculation: the random numbers are used differently).
"""

from __future__ import annotations

from typing import Sequence

import torch


def accept_greedy(argmax: Sequence[int], drafts: Sequence[int]) -> list[int]:
    """Tokens emitted by a greedy row: the agreeing drafts, then the target's next token (``argmax``: m + 1)."""
    out = []
    for i, d in enumerate(drafts):
        if d != argmax[i]:
            break
        out.append(d)
    out.append(int(argmax[len(out)]))
    return out


def accept_tree_greedy(argmax: Sequence[int], tokens: Sequence[int], parents: Sequence[int]) -> list[int]:
    """Tokens emitted by a greedy tree row (``PlanRow.parents``: index 0 the request's last token; ``argmax`` per row
    index): from the root, the child whose token is the target's argmax at its parent while there is one, then the
    target's own token after the last kept node. A chain gives ``accept_greedy``'s tokens."""
    out, at = [], 0
    while True:
        want = int(argmax[at])
        out.append(want)
        at = _child(tokens, parents, at, want)
        if at is None:
            return out


def tree_path(tokens: Sequence[int], parents: Sequence[int], kept: Sequence[int]) -> list[int]:
    """The row indices of the kept drafts ``kept`` (the emitted tokens but the last): the path whose K/V moves into
    place. The first child with the token at each step, as ``accept_tree_greedy`` walks (a trie's siblings differ)."""
    path, at = [], 0
    for token in kept:
        at = _child(tokens, parents, at, token)
        path.append(at)
    return path


def _child(tokens: Sequence[int], parents: Sequence[int], node: int, token: int) -> int | None:
    return next((c for c in range(node + 1, len(parents)) if parents[c] == node and tokens[c] == token), None)


def accept_sampled(probs: torch.Tensor, drafts: Sequence[int], generator: torch.Generator | None,
                   draft_probs: torch.Tensor | None = None) -> list[int]:
    """Tokens emitted by a sampled row. ``probs``: the target's [m + 1, vocab]; ``draft_probs``: q [m, vocab], or
    None for a point mass on each draft. Two host reads: which drafts pass, then the one token drawn."""
    m = len(drafts)
    device = probs.device
    if m:
        index = torch.tensor(list(drafts), device=device)
        rows = torch.arange(m, device=device)
        p_d = probs[rows, index]
        q_d = torch.ones_like(p_d) if draft_probs is None else draft_probs[rows, index]
        u = torch.rand(m, generator=generator, device=device, dtype=probs.dtype)
        passed = (u * q_d < p_d).tolist()  # u < p/q, without dividing by a q of 0
        kept = passed.index(False) if False in passed else m
    else:
        kept = 0
    out = [int(d) for d in drafts[:kept]]
    if kept < m:  # rejected at position `kept`: the residual distribution
        q = (torch.nn.functional.one_hot(index[kept], probs.shape[-1]).to(probs.dtype) if draft_probs is None
             else draft_probs[kept])
        residual = (probs[kept] - q).clamp_min(0)
        total = residual.sum()
        # p <= q everywhere means p == q (both sum to 1): rejection then had probability 0; p is the fallback
        dist = residual / total if float(total) > 0 else probs[kept]
    else:
        dist = probs[m]
    out.append(int(torch.multinomial(dist, 1, generator=generator)[0]))
    return out
