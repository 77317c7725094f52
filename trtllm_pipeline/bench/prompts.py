"""Prompts for the load generator: synthetic ones of an exact token length, or a dataset's questions."""

from __future__ import annotations

import random
import re
from pathlib import Path

from trtllm_pipeline.bench.settings import BenchSettings
from trtllm_pipeline.errors import InputError, StageFailed
from trtllm_pipeline.tasks.registry import get_task


def prompts(settings: BenchSettings, tokenizer) -> tuple[list[str], str]:
    count = settings.warmup + settings.requests
    if settings.dataset == "synthetic":
        return synthetic_prompts(tokenizer, count, settings.input_tokens, settings.seed), "synthetic"
    return dataset_prompts(settings.dataset, settings.data_dir, count)


def synthetic_prompts(tokenizer, count: int, input_tokens: int, seed: int) -> list[str]:
    """``count`` distinct prompts of exactly ``input_tokens`` tokens (special tokens included).

    Built from the vocabulary's own space-prefixed words: the tokenizer splits text at spaces
    before merging, so each word adds a known number of tokens and the length can be hit exactly.
    Distinct prompts keep a server's prefix cache from flattering the numbers.
    """
    words = _vocabulary_words(tokenizer)
    overhead = len(tokenizer("")["input_ids"])  # BOS etc., added by the server's tokenizer as well
    if input_tokens <= overhead:
        raise InputError(f"--input-tokens {input_tokens} leaves no room for text after the tokenizer's "
                         f"{overhead} special token(s).", fix=f"use at least {overhead + 1}")
    return [_exact_prompt(tokenizer, words, input_tokens, random.Random(f"{seed}:{i}")) for i in range(count)]


def _vocabulary_words(tokenizer) -> list[str]:
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    marks = [t for t in tokens if t and re.fullmatch(r"[Ġ▁][a-z]{3,12}", t)]  # byte-level BPE / sentencepiece
    words = sorted({tokenizer.convert_tokens_to_string([t]) for t in marks})
    if len(words) < 50:
        raise InputError("the tokenizer has too few plain word tokens to build synthetic prompts.",
                         fix="benchmark with --dataset gsm8k instead")
    return words


def _exact_prompt(tokenizer, words: list[str], target: int, rng: random.Random) -> str:
    pieces = [rng.choice(words) for _ in range(target)]
    for _ in range(4 * target + 100):
        n = len(tokenizer("".join(pieces).lstrip())["input_ids"])
        if n == target:
            return "".join(pieces).lstrip()
        if n > target and len(pieces) == 1:  # the first word, without its space, may take several tokens
            pieces = [rng.choice(words)]
        elif n > target:
            pieces = pieces[: max(1, len(pieces) - (n - target))]
        else:
            pieces += [rng.choice(words) for _ in range(target - n)]
    raise StageFailed(f"could not build a prompt of exactly {target} tokens with this tokenizer.",
                      fix="use another --input-tokens, or --dataset gsm8k")


def dataset_prompts(name: str, data_dir: Path | None, count: int) -> tuple[list[str], str]:
    """The first ``count`` questions of the dataset's test split (cycled if it is shorter)."""
    data = get_task(name).load(data_dir)
    questions = [item.doc["question"] for item in data.items]
    if not questions:
        raise InputError(f"{name}: no questions found in {data.source}.")
    return [questions[i % len(questions)] for i in range(count)], data.source
