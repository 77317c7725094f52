"""The Python side of TensorRT-LLM's tensor contract, shared by the Python-backend models.

Kept free of ``triton_python_backend_utils`` (which exists only inside Triton's stub) so that it
runs, and is tested, anywhere: tokenizing prompts against the engine's limits, the ``[2, n]`` word
lists TensorRT-LLM takes for stop and bad words, and decoding token batches.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from trtllm_pipeline.errors import InputError
from trtllm_pipeline.chat import encode_prompt
from trtllm_pipeline.triton.contract import RequestLimits


class RequestError(ValueError):
    """A request the server answers with an error response (the server itself stays healthy)."""


def string_parameters(model_config: dict[str, Any]) -> dict[str, str]:
    """A Python model's ``parameters`` from the JSON config Triton passes to ``initialize``."""
    return {key: value["string_value"] for key, value in model_config.get("parameters", {}).items()}


def texts(array: np.ndarray, what: str, limits: RequestLimits | None = None) -> list[str]:
    """One string per batch row of a ``[batch, 1]`` BYTES tensor; with ``limits``, each row's size is
    checked before it is decoded (a prompt too long for the engine is refused before any work)."""
    firsts = array.reshape(array.shape[0], -1)[:, 0]
    if limits is not None:
        for v in firsts:
            if problem := limits.text_problem(what, len(v) if isinstance(v, (bytes, str)) else 0):
                raise RequestError(problem)
    try:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in firsts]
    except UnicodeDecodeError:
        raise RequestError(f"{what} is not valid UTF-8") from None


def per_row(array: np.ndarray | None, batch: int, default: Any) -> list[Any]:
    """Per-request scalars (``[batch]`` or ``[batch, 1]``) as one Python value per row."""
    if array is None:
        return [default] * batch
    flat = array.reshape(-1)
    if flat.size not in (1, batch):
        raise RequestError(f"expected one value per batch row ({batch}), got {flat.size}")
    return [flat[0 if flat.size == 1 else i].item() for i in range(batch)]


def word_list(tokenizer, words: Sequence[str]) -> np.ndarray:
    """TensorRT-LLM's ``[2, n]`` word list: token ids of all words, then cumulative end offsets padded with -1."""
    ids: list[int] = []
    offsets: list[int] = []
    for word in words:
        tokens = tokenizer.encode(word, add_special_tokens=False) if word else []
        if tokens:
            ids += tokens
            offsets.append(len(ids))
    width = max(1, len(ids))
    return np.array([ids + [0] * (width - len(ids)), offsets + [-1] * (width - len(offsets))], dtype=np.int32)


def words_from_list(tokenizer, array: np.ndarray | None) -> tuple[str, ...]:
    """The words of a ``[2, n]`` word list, decoded back to text (stop strings are matched as text)."""
    if array is None or array.size == 0:
        return ()
    ids, offsets = array.reshape(2, -1).tolist()
    words, start = [], 0
    for end in offsets:
        if end < 0:
            break
        words.append(tokenizer.decode(ids[start:end]))
        start = end
    return tuple(w for w in words if w)


class Preprocessor:
    """``preprocessing``: prompts to token ids under the engine's limits, word lists, end and pad ids.

    Prompts are tokenized as the in-process ``generate --raw`` does (the tokenizer's special
    tokens, no chat template), so served and in-process runs see the same ids.
    """

    def __init__(self, tokenizer, *, end_id: int, pad_id: int, limits: RequestLimits):
        self.tokenizer = tokenizer
        self.end_id, self.pad_id = end_id, pad_id
        self.limits = limits
        self.max_input_len, self.max_seq_len = limits.max_input_tokens, limits.max_seq_len

    def __call__(self, queries: np.ndarray | None, max_tokens: np.ndarray | None, *,
                 stop_words: np.ndarray | None = None, bad_words: np.ndarray | None = None,
                 end_id: np.ndarray | None = None, pad_id: np.ndarray | None = None) -> dict[str, np.ndarray]:
        # Required inputs are checked here too: Triton 2.51 lets a request that lacks one through when
        # it brings as many inputs as the model requires (e.g. `max_tokens` and `stream`).
        if queries is None:
            raise RequestError("text_input is missing; it is required")
        if max_tokens is None:
            raise RequestError("max_tokens is missing; it is required")
        prompts = texts(queries, "text_input", self.limits)
        batch = len(prompts)
        lengths = per_row(max_tokens, batch, None)
        ids = [self._encode(p, n) for p, n in zip(prompts, lengths)]
        width = max(len(x) for x in ids)
        pad = per_row(pad_id, batch, self.pad_id)
        return {
            "INPUT_ID": np.array([x + [pad[i]] * (width - len(x)) for i, x in enumerate(ids)], dtype=np.int32),
            "REQUEST_INPUT_LEN": np.array([[len(x)] for x in ids], dtype=np.int32),
            "REQUEST_OUTPUT_LEN": np.array([[n] for n in lengths], dtype=np.int32),
            "STOP_WORDS_IDS": self._word_lists(stop_words, batch),
            "BAD_WORDS_IDS": self._word_lists(bad_words, batch),
            "OUT_END_ID": np.array([[v] for v in per_row(end_id, batch, self.end_id)], dtype=np.int32),
            "OUT_PAD_ID": np.array([[v] for v in pad], dtype=np.int32),
        }

    def _encode(self, prompt: str, max_tokens: int) -> list[int]:
        if max_tokens <= 0:
            raise RequestError(f"max_tokens must be at least 1, got {max_tokens}")
        try:
            ids = encode_prompt(self.tokenizer, prompt, raw=True)
        except InputError:
            raise RequestError("text_input is empty; send at least one character") from None
        if len(ids) > self.max_input_len:
            raise RequestError(f"the prompt has {len(ids)} tokens; this engine takes at most {self.max_input_len} "
                               "(build.max_input_len)")
        if len(ids) + max_tokens > self.max_seq_len:
            raise RequestError(f"max_tokens {max_tokens} after a {len(ids)}-token prompt exceeds the engine's "
                               f"max_seq_len of {self.max_seq_len}; ask for at most {self.max_seq_len - len(ids)}")
        return ids

    def _word_lists(self, words: np.ndarray | None, batch: int) -> np.ndarray:
        rows = [[] for _ in range(batch)] if words is None else [
            texts(np.asarray(row).reshape(-1, 1), "stop_words/bad_words") for row in words.reshape(batch, -1)]
        for row in rows:
            if problem := self.limits.words_problem("stop_words/bad_words", [w.encode() for w in row if w]):
                raise RequestError(problem)
        lists = [word_list(self.tokenizer, r) for r in rows]
        width = max(x.shape[1] for x in lists)
        return np.stack([_pad_word_list(x, width) for x in lists])


def _pad_word_list(words: np.ndarray, width: int) -> np.ndarray:
    """Widen a word list to ``width`` columns: ids padded with 0, offsets with -1, as TensorRT-LLM reads them."""
    extra = width - words.shape[1]
    return np.concatenate([words, np.array([[0] * extra, [-1] * extra], dtype=np.int32)], axis=1)


def decode_rows(tokenizer, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``postprocessing``: ``[batch, beams, n]`` ids with their lengths to ``[batch, beams]`` UTF-8 texts."""
    lengths = lengths.reshape(tokens.shape[:2])
    out = [[tokenizer.decode(beam[:n].tolist(), skip_special_tokens=True).encode("utf-8")
            for beam, n in zip(row, row_lengths)] for row, row_lengths in zip(tokens, lengths)]
    return np.array(out, dtype=object)
