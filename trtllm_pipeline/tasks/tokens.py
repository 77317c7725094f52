"""Prompts to token ids, as lm-evaluation-harness tokenizes them for a causal LM.

* BOS: the tokenizer's own default (DeepSeek-R1-distill's post-processor prepends BOS), except
  when the text already starts with BOS, as a chat template's output does; never two.
* Log-likelihood requests: trailing whitespace of the context moves to the continuation, then
  context + continuation is tokenized as one string and split after the context's tokens, so the
  continuation's tokens are the ones the model would really see (" A" as one token, not " " + "A").
"""

from __future__ import annotations

from typing import Sequence


def encode(tokenizer, text: str) -> list[int]:
    return encode_batch(tokenizer, [text])[0]


def encode_batch(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text (one batched call to the fast tokenizer per BOS setting)."""
    bos = tokenizer.bos_token
    out: list[list[int] | None] = [None] * len(texts)
    for add_bos in (True, False):
        index = [i for i, t in enumerate(texts) if (not (bos and t.startswith(bos))) == add_bos]
        if index:
            ids = tokenizer([texts[i] for i in index], add_special_tokens=add_bos)["input_ids"]
            for i, row in zip(index, ids):
                out[i] = list(row)
    return out  # type: ignore[return-value]


def encode_pairs(tokenizer, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) for each (context, continuation) text pair."""
    moved = []
    for context, continuation in pairs:
        stripped = context.rstrip()
        moved.append((stripped, context[len(stripped):] + continuation))
    unique = sorted({c for c, _ in moved})  # MMLU: one context, four answer letters
    context_ids = dict(zip(unique, encode_batch(tokenizer, unique)))
    wholes = encode_batch(tokenizer, [c + x for c, x in moved])
    return [(context_ids[c], whole[len(context_ids[c]):]) for (c, _), whole in zip(moved, wholes)]
