"""The one small interface every runtime implements, and the generation logic they share.

A runtime holds a built model and runs requests in *steps*: ``submit`` queues a request,
``step`` runs one iteration for every active request (prefill for new ones, one decode token
for the others) and returns the new tokens. This is the shape of TensorRT-LLM's executor
(``enqueue_request`` / ``await_responses``) and of continuous batching in a server loop; batch
generation, streaming and scoring are built on it here, once, for all runtimes.

Text-level concerns (incremental detokenization, stop strings) live in this module too, so
every runtime and every client sees exactly the same text for the same tokens.
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
import math
import numbers
import struct
from typing import Any, ClassVar, Iterable, Iterator, Sequence

from trtllm_pipeline.errors import InputError, StageFailed

INT32_MAX = 2**31 - 1
SEED_MAX = 2**64 - 1  # TensorRT-LLM's seed is a uint64, as is torch.Generator's
# temperature and top_p travel as 32-bit floats (Triton's TYPE_FP32): a larger value becomes inf, and a
# smaller nonzero one 0, which for top_p means "off". Such values are refused, not silently changed (the
# smallest positive 32-bit float, a denormal, is 1.4e-45: a temperature of 1e-45 is valid).
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_SMALLEST = 1.401298464324817e-45


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings (the Triton ensemble's optional inputs map onto these).

    ``check()`` is the one statement of what is valid; every runtime calls it in ``submit`` and the
    servers when they parse a request, so a value that would poison a step never reaches one.
    """

    max_tokens: int = 64
    min_tokens: int = 0
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0
    seed: int | None = None
    end_id: int | None = None  # None: the tokenizer's EOS; -1: never stop on a token
    stop_words: tuple[str, ...] = ()
    bad_words: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    def check(self) -> "SamplingParams":
        """``self`` if every field is usable, else InputError naming the first that is not."""
        problem = sampling_problem(self)
        if problem:
            raise InputError(problem)
        return self


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def float32_problem(name: str, value: float) -> str | None:
    """Why ``value`` does not survive the trip as a 32-bit float (inf, or a nonzero value that becomes 0), or None."""
    try:
        rounded = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        rounded = math.inf
    if math.isinf(rounded) or (value != 0 and rounded == 0):
        return (f"{name} must be 0 or from {FLOAT32_SMALLEST:.2g} to {FLOAT32_MAX:.3g} in magnitude (a 32-bit float), "
                f"got {value!r}")
    return None


def sampling_problem(p: SamplingParams) -> str | None:
    """What is wrong with ``p``, naming the field, or None."""
    if not _integer(p.max_tokens) or not 1 <= p.max_tokens <= INT32_MAX:
        return f"max_tokens must be an integer from 1 to {INT32_MAX}, got {p.max_tokens!r}"
    if not _integer(p.min_tokens) or not 0 <= p.min_tokens <= p.max_tokens:
        return f"min_tokens must be an integer from 0 to max_tokens ({p.max_tokens}), got {p.min_tokens!r}"
    if not _real(p.temperature) or not math.isfinite(p.temperature) or p.temperature < 0:
        return f"temperature must be a finite number, > 0 to sample or exactly 0 for greedy, got {p.temperature!r}"
    if problem := float32_problem("temperature", p.temperature):
        return problem
    if not _integer(p.top_k) or not 0 <= p.top_k <= INT32_MAX:
        return f"top_k must be an integer >= 0 (0: no top-k filter), got {p.top_k!r}"
    if not _real(p.top_p) or not math.isfinite(p.top_p) or not 0 < p.top_p <= 1:
        return f"top_p must be a number in (0, 1], got {p.top_p!r}"
    if problem := float32_problem("top_p", p.top_p):
        return problem
    if p.seed is not None and (not _integer(p.seed) or not 0 <= p.seed <= SEED_MAX):
        return f"seed must be an integer from 0 to {SEED_MAX}, got {p.seed!r}"
    if p.end_id is not None and (not _integer(p.end_id) or not -1 <= p.end_id <= INT32_MAX):
        return f"end_id must be a token id, or -1 to never stop on a token, got {p.end_id!r}"
    for name in ("stop_words", "bad_words"):
        words = getattr(p, name)
        if not isinstance(words, tuple) or not all(isinstance(w, str) for w in words):
            return f"{name} must be a list of strings, got {words!r}"
    return None


@dataclasses.dataclass
class TokenEvent:
    """New tokens of one request after a step; ``finish_reason`` is set on its last event."""

    request_id: Any
    token_ids: list[int]
    finish_reason: str | None = None  # "end_id" | "length" | "stop" | "cancelled" | "error"
    error: str | None = None  # finish_reason "error": why this request failed (the others went on)


class RequestFailed(StageFailed):
    """A request failed inside the runtime; the runtime dropped it and went on with the others."""


@dataclasses.dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str


class Runtime(abc.ABC):
    """A loaded engine. Implementations: ``torch_engine/runtime.TorchRuntime``, ``trtllm/runtime.TrtllmRuntime``."""

    name: ClassVar[str]

    tokenizer: Any  # trtllm_pipeline.tokenizer.Tokenizer (or transformers'); encode/decode happen outside the runtime
    max_batch_size: int
    max_seq_len: int

    # ---- what each runtime implements -------------------------------------------------------

    @abc.abstractmethod
    def submit(self, request_id: Any, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Queue a request; it starts at the next ``step`` that has a free slot."""

    @abc.abstractmethod
    def step(self) -> list[TokenEvent]:
        """Run one iteration over the active requests and return their new tokens."""

    @abc.abstractmethod
    def cancel(self, request_id: Any) -> None:
        """Drop a queued or running request (a client went away, a stop string matched)."""

    @abc.abstractmethod
    def has_work(self) -> bool:
        """True while any request is queued or running."""

    @abc.abstractmethod
    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> list[tuple[float, bool]]:
        """Log-likelihood of each continuation after its context, and whether it is the greedy one.

        Implementations may batch and reuse shared prefixes (e.g. MMLU's few-shot block).
        """

    def next_token_logprobs(self, context: Sequence[int]) -> list[float]:
        """Log-probabilities of every vocabulary token after ``context`` (one step's generation
        logits, log-softmaxed), for servers that return ``generation_logits``."""
        raise NotImplementedError(f"the {self.name} runtime does not return next-token log-probabilities")

    def stats(self) -> dict[str, float]:
        """What the scheduler knows now, for the serving process's metrics (``triton/engine_metrics``):
        ``requests_running`` and ``requests_waiting`` (now), ``kv_cache_usage`` (0-1, now),
        ``prefix_cache_queries``, ``prefix_cache_hits`` (prompt tokens, since load), ``preemptions``
        (since load). A key is absent where the runtime does not know it; every key given is exported."""
        return {}

    def sequence_logprobs(self, token_ids: Sequence[int], first: int):
        """Log-probabilities of every vocabulary token after each prefix ``token_ids[:i + 1]``, for
        ``i`` from ``first`` to the end: a float32 tensor ``[len(token_ids) - first, vocab]`` (one
        forward pass; the fidelity task compares two builds' rows)."""
        raise NotImplementedError(f"the {self.name} runtime does not return every position's log-probabilities")

    def describe(self) -> dict[str, Any]:
        """What ran, for result files and manifests: runtime name, device, dtypes, quantization."""
        return {"runtime": self.name}

    def close(self) -> None:
        """Release devices and worker processes."""

    def unavailable(self) -> str | None:
        """Why this runtime can run no request any more (a tensor-parallel worker died), or None while it can."""
        return None

    # ---- shared on top of the interface -----------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]) -> list[Completion]:
        """Run prompts to completion (batched up to ``max_batch_size`` at a time)."""
        per_request = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        streams = {i: TextStream(self.tokenizer, per_request[i].stop_words) for i in range(len(prompts))}
        reasons: dict[int, str] = {}
        for i, prompt in enumerate(prompts):
            self.submit(i, list(prompt), per_request[i])
        while self.has_work():
            for event in self.step():
                if event.finish_reason == "error":
                    self._abandon(range(len(prompts)))
                    raise RequestFailed(f"request {event.request_id} of {len(prompts)} failed in the {self.name} "
                                        f"runtime: {event.error}", fix="see the log for its traceback")
                self.apply_event(event, streams, reasons)
        return [
            Completion(list(prompts[i]), streams[i].token_ids, streams[i].text, reasons.get(i, "length"))
            for i in range(len(prompts))
        ]

    def stream(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: Any = "stream",
               text: "TextStream | None" = None) -> Iterator[str]:
        """Yield text pieces of one request as they are generated (stop strings already cut).

        Pass ``text`` to read the generated token ids (``text.token_ids``) afterwards.
        """
        streams = {request_id: text or TextStream(self.tokenizer, params.stop_words)}
        reasons: dict[Any, str] = {}
        self.submit(request_id, list(prompt_ids), params)
        try:
            while request_id not in reasons and self.has_work():
                for event in self.step():
                    if event.finish_reason == "error" and event.request_id == request_id:
                        reasons[request_id] = "error"
                        raise RequestFailed(f"the request failed in the {self.name} runtime: {event.error}",
                                            fix="see the log for its traceback")
                    if event.request_id not in streams:
                        continue
                    piece = self.apply_event(event, streams, reasons)
                    if piece:
                        yield piece
        finally:
            if request_id not in reasons:
                self.cancel(request_id)

    def _abandon(self, request_ids: Iterable[Any]) -> None:
        """Cancel whatever of these requests is still queued or running (the runtime is idle again)."""
        for request_id in request_ids:
            self.cancel(request_id)

    def apply_event(self, event: TokenEvent, streams: dict, reasons: dict) -> str:
        """Turn one event into text through its request's TextStream; the text piece to emit.

        A matched stop string cancels the request here; ``reasons`` gets each finished request's
        finish reason. Servers call this too, so served text is made exactly as in-process text.
        """
        stream = streams[event.request_id]
        piece = stream.push(event.token_ids)
        if stream.stopped and event.finish_reason is None:
            self.cancel(event.request_id)
            event.finish_reason = "stop"
        if event.finish_reason:
            piece += stream.flush()
            reasons[event.request_id] = "stop" if stream.stopped else event.finish_reason
        return piece


class TextStream:
    """Incremental detokenization with stop strings, shared by every runtime and the server.

    Decoding token by token breaks multi-byte characters and BPE merges, so new tokens are decoded
    together with the tokens before them and only the new suffix is kept (as vLLM detokenizes):
    a window from the last complete character, not the whole output every token, which would be
    quadratic in the output length. An incomplete UTF-8 character (decoded as U+FFFD) waits for its
    remaining bytes, and a tail that could still become a stop string is held back.
    """

    def __init__(self, tokenizer, stop_words: Iterable[str] = ()):
        self.tokenizer = tokenizer
        self.stop_words = tuple(w for w in stop_words if w)
        self.token_ids: list[int] = []
        self.text = ""  # emitted so far (never contains a stop string)
        self.stopped = False
        self._full = ""  # decoded so far, complete characters only
        self._prefix = 0  # the window starts here: context for decoding the new tokens
        self._read = 0  # tokens before this are decoded into _full

    def push(self, token_ids: Sequence[int]) -> str:
        if self.stopped or not token_ids:
            return ""
        self.token_ids.extend(token_ids)
        self._decode(final=False)
        return self._emit(final=False)

    def flush(self) -> str:
        if not self.stopped:
            self._decode(final=True)
        return self._emit(final=True)

    def _decode(self, final: bool) -> None:
        def decode(ids):
            return self.tokenizer.decode(ids, skip_special_tokens=True)

        context = decode(self.token_ids[self._prefix : self._read])
        window = decode(self.token_ids[self._prefix :])
        if window.endswith("\ufffd") and not final:
            return  # an incomplete character: wait for the rest of its bytes
        if window.startswith(context):
            self._full += window[len(context) :]
        else:  # a tokenizer whose decoding is not prefix-stable: decode everything once more
            self._full = decode(self.token_ids)
        self._prefix, self._read = self._read, len(self.token_ids)

    def _emit(self, final: bool) -> str:
        full = self._full
        for word in self.stop_words:
            cut = full.find(word, max(0, len(self.text) - len(word)))
            if cut != -1:
                full, self.stopped, final = full[:cut], True, True
        safe = len(full)
        if not final:
            safe -= max((_overlap(full, w) for w in self.stop_words), default=0)
        piece = full[len(self.text) : safe] if safe > len(self.text) else ""
        self.text += piece
        return piece


def _overlap(text: str, word: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``word``."""
    for n in range(min(len(word) - 1, len(text)), 0, -1):
        if text.endswith(word[:n]):
            return n
    return 0


_ids = itertools.count()


def next_request_id() -> int:
    return next(_ids)
