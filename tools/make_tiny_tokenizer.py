"""Regenerate trtllm_pipeline/assets/tiny_qwen2_tokenizer.json (committed; run by hand only).

The built-in `tiny-qwen2` model needs a real byte-level BPE tokenizer that round-trips any UTF-8
text and carries the DeepSeek-R1-Distill special tokens. Training it at every install would tie the
model's hash to the Python and `tokenizers` versions, so it is trained once, here, and committed.
The corpus is CPython's own documentation text (pydoc_data), which every Python carries.

    .venv/bin/python tools/make_tiny_tokenizer.py
"""

from __future__ import annotations

import pathlib

import pydoc_data.topics
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from trtllm_pipeline.model.builtin import TINY_QWEN2_SPECIAL_TOKENS, TINY_QWEN2_VOCAB_SIZE

# Qwen2's pre-tokenizer split: single digits, letters runs, punctuation runs, whitespace.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
OUT = pathlib.Path(__file__).resolve().parents[1] / "trtllm_pipeline/assets/tiny_qwen2_tokenizer.json"


def main() -> None:
    corpus = [text for _, text in sorted(pydoc_data.topics.topics.items())]
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, _ in TINY_QWEN2_SPECIAL_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_QWEN2_VOCAB_SIZE - len(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    # Special tokens go after the learned vocabulary, as in the Qwen2 family. `<think>` and
    # `</think>` are added but not special, so they survive skip_special_tokens like in R1-distill.
    for text, special in TINY_QWEN2_SPECIAL_TOKENS:
        if special:
            tok.add_special_tokens([text])
        else:
            tok.add_tokens([text])
    bos = "<｜begin▁of▁sentence｜>"
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
            ),
        ]
    )
    assert tok.get_vocab_size() == TINY_QWEN2_VOCAB_SIZE, tok.get_vocab_size()
    tok.save(str(OUT))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, vocab {tok.get_vocab_size()})")


if __name__ == "__main__":
    main()
