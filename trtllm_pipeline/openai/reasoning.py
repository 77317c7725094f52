"""The R1 reasoning split: what a DeepSeek-R1(-distill) model writes before ``</think>`` is ``reasoning_content``.

As vLLM's ``deepseek_r1`` reasoning parser does (``serving.openai_reasoning_parser``): the R1
chat template ends the prompt with ``<think>\\n``, so the answer starts inside the reasoning; a
``<think>`` the model writes anyway is dropped; everything up to ``</think>`` is reasoning and what
follows is the content. An answer that never closes its reasoning is all reasoning (content
null). ``none`` (the default) leaves the text alone. Streamed, the split is the same as on the
whole text: a piece that might be the start of ``</think>`` is held back until the next one says.
"""

from __future__ import annotations

PARSERS = ("none", "deepseek_r1")
START, END = "<think>", "</think>"


class Splitter:
    """Feed text pieces; get (reasoning, content) deltas whose concatenations equal ``split`` of the whole."""

    def __init__(self, parser: str):
        if parser not in PARSERS:
            raise ValueError(f"unknown reasoning parser {parser!r}; one of {', '.join(PARSERS)}")
        self.enabled = parser != "none"
        self._held = ""  # text not yet assigned: a possible partial tag
        self._in_reasoning = self.enabled
        self._started = False  # past a leading <think> (or past where one could be)

    def push(self, piece: str) -> tuple[str, str]:
        if not self.enabled:
            return "", piece
        text = self._held + piece
        self._held = ""
        reasoning = content = ""
        if not self._started:  # a leading <think> (after whitespace) is dropped: wait until that is decided
            stripped = text.lstrip()
            if not stripped or (len(stripped) < len(START) and START.startswith(stripped)):
                self._held = text
                return "", ""
            self._started = True
            if stripped.startswith(START):
                text = stripped[len(START):]
        if self._in_reasoning:
            at = text.find(END)
            if at >= 0:
                reasoning, text = text[:at], text[at + len(END):]
                self._in_reasoning = False
            else:
                keep = _partial_suffix(text, END)
                reasoning, self._held = text[: len(text) - keep], text[len(text) - keep:]
                return reasoning, ""
        content = text
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back, once the text is complete."""
        held, self._held = self._held, ""
        if not self.enabled:
            return "", held
        return (held, "") if self._in_reasoning else ("", held)

    @property
    def closed(self) -> bool:
        """Whether the reasoning ended (``</think>`` seen): content follows."""
        return not self._in_reasoning


def split(parser: str, text: str) -> tuple[str | None, str | None]:
    """(reasoning_content, content) of a whole answer; None where a part is absent."""
    splitter = Splitter(parser)
    r1, c1 = splitter.push(text)
    r2, c2 = splitter.finish()
    reasoning, content = r1 + r2, c1 + c2
    if not splitter.enabled:
        return None, text
    return reasoning, (content if splitter.closed else None)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
