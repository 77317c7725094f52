"""``generate``: run a prompt through the built engine in-process, streaming text as it comes.

The model's chat template is applied unless ``raw``; text is produced by the same incremental
detokenizer (``runtimes.base.TextStream``) that the Triton deployment uses, so a prompt gives the
same text in-process and served.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Iterator

from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes import Runtime, SamplingParams, TextStream, load_runtime


@dataclasses.dataclass
class GenerationStats:
    runtime: dict
    prompt_tokens: int
    output_tokens: int
    seconds: float


def encode_prompt(tokenizer, prompt: str, *, raw: bool, system: str | None = None) -> list[int]:
    """Token ids of ``prompt``: through the chat template (with its generation prompt) unless raw."""
    if not prompt:
        raise InputError("the prompt is empty.", fix="pass the prompt text as an argument")
    if raw or not getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(prompt, add_special_tokens=True)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)  # the template already holds BOS


def stream_text(runtime: Runtime, prompt: str, params: SamplingParams, *, raw: bool = False,
                system: str | None = None, stats: list | None = None) -> Iterator[str]:
    """Yield text pieces; append a GenerationStats to ``stats`` when done."""
    ids = encode_prompt(runtime.tokenizer, prompt, raw=raw, system=system)
    text = TextStream(runtime.tokenizer, params.stop_words)
    start = time.perf_counter()
    yield from runtime.stream(ids, params, text=text)
    if stats is not None:
        stats.append(GenerationStats(runtime.describe(), len(ids), len(text.token_ids), time.perf_counter() - start))


def open_runtime(cfg: BuildConfig, engines_dir: str | Path = "engines", device: str | None = None) -> Runtime:
    return load_runtime(cfg, engines_dir, **({"device": device} if device else {}))
