"""The proposers by name (``runtime.speculative.method``): one line each, a factory of (settings, target runtime)."""

from __future__ import annotations

from typing import Any, Callable

from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import NgramProposer, Proposer


def _draft_model(settings, target) -> Proposer:
    from trtllm_pipeline.runtimes.torch_engine.speculative.draft import DraftProposer  # loads a model: on demand

    return DraftProposer.from_settings(settings, target)


def _self_layers(settings, target) -> Proposer:
    from trtllm_pipeline.runtimes.torch_engine.speculative.draft import DraftProposer

    return DraftProposer.from_target_layers(settings, target)


def _eagle3_head(settings, target) -> Proposer:
    from trtllm_pipeline.runtimes.torch_engine.speculative.eagle3 import Eagle3Proposer

    return Eagle3Proposer.from_settings(settings, target)


def _ngram(settings, target) -> Proposer:
    tree = getattr(settings, "tree", None)
    if tree is None:
        return NgramProposer(settings.ngram_min, settings.ngram_max)
    from trtllm_pipeline.runtimes.torch_engine.speculative.tree import NgramTreeProposer

    return NgramTreeProposer(settings.ngram_min, settings.ngram_max, tree.max_nodes, tree.min_occurrences)


PROPOSERS: dict[str, Callable[[Any, Any], Proposer]] = {
    "ngram": _ngram,
    "draft": _draft_model,
    "self": _self_layers,
    "eagle3": _eagle3_head,
}


def make_proposer(settings, target) -> Proposer:
    return PROPOSERS[settings.method](settings, target)
