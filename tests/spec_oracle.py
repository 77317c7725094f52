"""Test proposers that know the answer and lie on purpose (tests/test_speculative.py, tests/spec_fast_check.py,
tests/test_spec_tree_verify.py, tests/spec_tree_fast_check.py), and plain greedy decoding to hold them against."""

from __future__ import annotations

import types

from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import Proposer
from trtllm_pipeline.runtimes.torch_engine.speculative.registry import PROPOSERS
from trtllm_pipeline.runtimes.torch_engine.speculative.tree import DraftTree


def greedy(rt, prompts, n: int = 24, check: bool = False) -> list[list[int]]:
    """``prompts`` decoded together, ``n`` tokens each (no end id); ``check``: the allocator checked after every
    step (after every rollback and move: no block leaked, none freed twice)."""
    for i, p in enumerate(prompts):
        rt.submit(i, p, SamplingParams(max_tokens=n, end_id=-1))
    out = {i: [] for i in range(len(prompts))}
    while rt.has_work():
        for e in rt.step():
            out[e.request_id] += e.token_ids
        if check:
            rt.kv.check()
    return [out[i] for i in range(len(prompts))]


class Oracle(Proposer):
    """Plain greedy's next tokens, every third position from the third on wrong. The tiny model's own text never
    repeats, so an n-gram lookup there is almost never right: this drives partial acceptance, rollback across blocks
    and the adaptive length deterministically."""

    name = "oracle"

    def __init__(self, answers):
        self.answers = answers

    def propose(self, batch):
        out = []
        for r in batch:
            at = len(r.generated)
            truth = self.answers[r.request_id][at : at + r.k]
            out.append([t if (at + j) % 3 != 2 else t + 1 for j, t in enumerate(truth)])
        return out


def oracle_settings(answers, k: int = 4):
    """Speculative settings naming the oracle (registered here, one line, as a proposer is)."""
    PROPOSERS["oracle"] = lambda settings, target: Oracle(answers)
    return types.SimpleNamespace(method="oracle", num_draft_tokens=k, adaptive=True)


class DecoyTree(Proposer):
    """Knows plain greedy's answer: a wrong first branch (``decoy`` nodes), then the truth (its last token wrong every
    other step), then a branch leaving the truth after its first token: the kept path is never the tree's first
    nodes, so its K/V must move; ``chain_only``: the truth alone, as a chain."""

    name = "decoy-tree"

    def __init__(self, answers, decoy: int = 3, chain_only: bool = False):
        self.answers, self.decoy, self.chain_only, self.calls = answers, decoy, chain_only, 0

    def propose(self, batch):
        out = []
        for r in batch:
            self.calls += 1
            at = len(r.generated)
            truth = list(self.answers[r.request_id][at : at + r.k])
            if truth and self.calls % 2:
                truth[-1] += 1
            if self.chain_only:
                out.append(DraftTree.of_chain(truth))
                continue
            decoy = [t + 1 for t in truth[: self.decoy]]
            side = truth[:1] + [t + 2 for t in truth[1:3]]
            out.append(DraftTree.of_paths([decoy, truth, side]))
        return out
