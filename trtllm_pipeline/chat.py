"""A prompt as the model sees it: through its chat template, to token ids in-process or to text for a server.

In-process ``generate`` and the served ensemble must give a model the same token ids for the same
prompt; the two functions here are the two halves of that promise.
"""

from __future__ import annotations

from trtllm_pipeline.errors import InputError


def _templated(tokenizer, prompt: str, system: str | None) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompt(tokenizer, prompt: str, *, raw: bool, system: str | None = None) -> list[int]:
    """Token ids of ``prompt``: through the chat template (with its generation prompt) unless raw."""
    if not prompt:
        raise InputError("the prompt is empty.", fix="pass the prompt text as an argument")
    if raw or not getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(prompt, add_special_tokens=True)
    return tokenizer.encode(_templated(tokenizer, prompt, system), add_special_tokens=False)  # it holds BOS


def served_prompt(tokenizer, prompt: str, system: str | None = None) -> str:
    """The chat-templated text whose server-side tokenization equals ``encode_prompt``'s ids.

    The server tokenizes ``text_input`` with the tokenizer's special tokens (BOS); the template
    writes BOS as text too, so it is dropped here rather than sent twice.
    """
    if not getattr(tokenizer, "chat_template", None):
        return prompt
    return _without_bos(tokenizer, _templated(tokenizer, prompt, system))


def served_messages(tokenizer, messages: list[dict[str, str]]) -> str:
    """A whole conversation (OpenAI-style ``role``/``content`` dicts) as ``served_prompt`` sends one prompt."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return _without_bos(tokenizer, text)


def _without_bos(tokenizer, text: str) -> str:
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer.bos_token_id in tokenizer.encode("", add_special_tokens=True):
        text = text[len(bos):]
    return text
