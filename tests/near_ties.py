"""Greedy outputs compared where the CPU's float32 GEMM is not row-invariant: on some hosts (seen on a Sapphire Rapids
machine) ``x[:1] @ W.T`` differs from ``(x @ W.T)[:1]`` in the last bits, so a random model's near-tied greedy token
can depend on which requests shared a step. Two outputs that part are both right when every token of each is the
model's best within rounding, recomputed alone (a wrong cache or position gives logits far from any tie)."""

from __future__ import annotations

from typing import Sequence


def near_greedy(rt, prompt: Sequence[int], tokens: Sequence[int], tol: float = 1e-3) -> bool:
    """Whether each of ``tokens``, after ``prompt`` and the tokens before it, is within ``tol`` of the best logit of
    ``rt``'s model (one forward of the whole sequence, alone)."""
    if not tokens:
        return True
    seq = list(prompt) + list(tokens[:-1])
    rows = rt.engine.logits(rt.hidden_states(seq))[len(prompt) - 1 :]
    return all(float(row[t]) >= float(row.max()) - tol for row, t in zip(rows, tokens))


def assert_same_or_tied(rt, prompts, got: list[list[int]], want: list[list[int]], *, most: int | None = None) -> None:
    """``got`` equals ``want`` request by request, except where the two part on a near tie (both ``near_greedy``);
    ``most``: at least that many must be equal outright (default: all but one)."""
    parted = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert len(got) - len(parted) >= (len(got) - 1 if most is None else most), (parted, got, want)
    for i in parted:
        assert near_greedy(rt, prompts[i], got[i]) and near_greedy(rt, prompts[i], want[i]), (i, got[i], want[i])


def first_near_tie(rt, prompt: Sequence[int], tokens: Sequence[int], tol: float) -> int | None:
    """The first of ``tokens`` (greedy after ``prompt``) whose best logit leads the second by less than ``tol`` (one
    forward of the whole sequence, alone), or None: up to there no rounding can change the greedy output."""
    if not tokens:
        return None
    seq = list(prompt) + list(tokens[:-1])
    rows = rt.engine.logits(rt.hidden_states(seq))[len(prompt) - 1 :]
    for i, row in enumerate(rows[: len(tokens)]):
        top = row.float().topk(2).values
        if float(top[0] - top[1]) < tol:
            return i
    return None
