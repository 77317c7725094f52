"""The seam between tasks and models: what a task needs of "a model it can score and generate with".

As lm-evaluation-harness's ``LM``: a task builds prompts, asks for log-likelihoods and greedy
completions, and scores the answers; it never knows how the model runs. ``runtimes.base.Runtime``
(every in-process runtime) satisfies this, and so does ``served_model.ServedModel`` (a deployed
model behind Triton), so ``eval`` and ``eval --url`` run the very same task code.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from trtllm_pipeline.runtimes.base import Completion, SamplingParams


@runtime_checkable
class LanguageModel(Protocol):
    tokenizer: Any  # trtllm_pipeline.tokenizer.Tokenizer (or transformers'): tasks tokenize their prompts themselves
    max_seq_len: int  # prompt plus output; a model may also say max_input_len

    def score(self, contexts: Sequence[Sequence[int]],
              continuations: Sequence[Sequence[int]]) -> list[tuple[float, bool]]:
        """Log-likelihood of each continuation after its context, and whether it is the greedy one."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Each prompt run to completion."""

    def describe(self) -> dict[str, Any]:
        """What ran, for results files: at least ``runtime``."""

    def close(self) -> None:
        """Release devices, worker threads and connections."""
