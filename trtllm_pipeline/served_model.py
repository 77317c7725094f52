"""A deployed model (Triton's ``tensorrt_llm_bls``, through ``client.TritonClient``) as a ``tasks.model.LanguageModel``.

``eval --url`` judges what is served, so the gate can compare it with an in-process run: the same
items, prompts and settings. The tasks hand over token ids; the client speaks text and the server
tokenizes it with the same tokenizer, adding BOS. So ids are decoded back to text (special tokens
kept, a leading BOS dropped) and the text must re-encode to exactly those ids, else the request is
refused rather than scored on a different input. Scoring reads the ``generation_logits`` of a
one-token request: single-token continuations only, as MMLU's answer letters are. Requests run
concurrently, one client per worker thread (tritonclient's clients are not thread-safe).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from trtllm_pipeline.client import OpenAIClient, TritonClient, connect
from trtllm_pipeline.endpoints import is_openai_url
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.base import Completion, SamplingParams
from trtllm_pipeline.tasks import tokens


class ServedModel:
    name = "served"

    def __init__(self, url: str, protocol: str, tokenizer, *, max_input_len: int, max_seq_len: int,
                 concurrency: int):
        self.url, self.protocol, self.tokenizer = url, "openai" if is_openai_url(url) else protocol, tokenizer
        self.max_input_len, self.max_seq_len = max_input_len, max_seq_len
        self._local = threading.local()
        self._clients: list[TritonClient | OpenAIClient] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="eval-client")
        self._client()  # fail now, with the client's message, when nothing answers at ``url``

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name, "url": self.url, "protocol": self.protocol}

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for client in self._clients:
            client.close()

    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> list[tuple[float, bool]]:
        """Log-likelihood of each one-token continuation; one request per distinct context.

        The flag says whether the continuation is the likeliest of those scored after its context
        (the server returns no more than their log-probabilities); MMLU reads only the numbers.
        """
        if any(len(c) != 1 for c in continuations):
            raise InputError("a served model can score single-token continuations only (from generation_logits).",
                             fix="evaluate this task in-process (without --url)")
        by_context: dict[tuple[int, ...], list[int]] = {}
        for i, context in enumerate(contexts):
            by_context.setdefault(tuple(context), []).append(i)
        keys = list(by_context)
        rows = self._pool.map(lambda key: self._score_one(key, [continuations[i][0] for i in by_context[key]]), keys)
        results: list[tuple[float, bool]] = [(0.0, False)] * len(contexts)
        for key, (logprobs, best) in zip(keys, rows):
            for i, logprob in zip(by_context[key], logprobs):
                results[i] = (logprob, continuations[i][0] == best)
        return results

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        return list(self._pool.map(lambda ids: self._generate_one(list(ids), params), prompts))

    # ---- one request ----------------------------------------------------------------------------

    def _client(self):
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = connect(self.url, self.protocol)  # Triton, or an OpenAI base URL
            with self._lock:
                self._clients.append(client)
        return client

    def _text(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        bos = self.tokenizer.bos_token
        if bos and ids and ids[0] == self.tokenizer.bos_token_id:
            text = text[len(bos):]  # the server adds it again
        if tokens.encode(self.tokenizer, text) != ids:
            raise InputError("a prompt does not survive the round trip through text that the server needs "
                             "(decode, then the server's encode gives other tokens).",
                             fix="evaluate this model in-process (without --url)")
        return text

    def _score_one(self, context: tuple[int, ...], choices: list[int]) -> tuple[list[float], int]:
        logprobs = self._client().score_choices(self._text(list(context)), choices)
        return logprobs, choices[max(range(len(choices)), key=lambda i: logprobs[i])]

    def _generate_one(self, ids: list[int], params: SamplingParams) -> Completion:
        """Streamed, because the server sends one piece per generated token: the count tells a
        length cut from an end token. The ids returned are the text's encoding (the server sends
        text only), so their count can differ from what was generated where text does not
        round-trip (a cut multi-byte character)."""
        stops = [w for w in params.stop_words if w]
        client = self._client()
        pieces = list(client.stream(self._text(ids), max_tokens=params.max_tokens, stop_words=stops or None))
        text = "".join(pieces)
        cuts = [text.find(w) for w in stops if w in text]
        if cuts:  # the same text an in-process run keeps: everything before the first stop string
            text, reason = text[: min(cuts)], "stop"
        elif isinstance(client, OpenAIClient):  # its chunks are not tokens: the server says why it ended
            reason = "length" if client.finish_reason == "length" else "end_id"
        else:
            reason = "length" if len(pieces) >= params.max_tokens else "end_id"
        return Completion(ids, self.tokenizer.encode(text, add_special_tokens=False), text, reason)
