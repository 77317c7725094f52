"""A test proposer that knows the answer and lies on purpose (tests/test_speculative.py, tests/spec_fast_check.py)."""

from __future__ import annotations

import types

from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import Proposer
from trtllm_pipeline.runtimes.torch_engine.speculative.registry import PROPOSERS


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
