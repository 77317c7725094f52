"""The OpenAI shapes: request models (what is accepted, checked by pydantic) and the response bodies.

Requests follow OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` with vLLM's extensions
(``top_k``, ``min_tokens``, ``ignore_eos``). Fields a client may send that change nothing here
(``user``, ``presence_penalty: 0``, ...) are accepted and ignored, as vLLM does; the ones whose
meaning this server cannot honour (``n`` > 1, ``logprobs``, ``echo``, ``tools``, ...) are refused
with 400 naming them, rather than silently answering something else. Errors are OpenAI's
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Parameters a client may send whose meaning is not served here: refused, never ignored.
UNSUPPORTED = {
    "logprobs": "log-probabilities are not returned by this deployment",
    "top_logprobs": "log-probabilities are not returned by this deployment",
    "echo": "echo is not supported",
    "best_of": "best_of is not supported (one completion per request)",
    "suffix": "suffix (insertion) is not supported",
    "tools": "tool calling is not supported",
    "functions": "function calling is not supported",
    "response_format": "structured output is not supported",
    "logit_bias": "logit_bias is not supported",
}
# Sent by many clients at their defaults: fine at those values (or null), refused otherwise.
NEUTRAL = {"presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,), "best_of": (1,),
           "logprobs": (False, 0), "top_logprobs": (0,), "echo": (False,), "tools": ([],), "functions": ([],),
           "response_format": ({"type": "text"},), "logit_bias": ({},)}


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: 400 invalid_request_error, 404 model_not_found, 503 ..."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ("service_unavailable" if status == 503 else "invalid_request_error" if 400 <= status < 500
                             else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Model(BaseModel):
    # strict: "max_tokens": "10" is a mistake, not a number; extra: clients send fields of their own.
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class StreamOptions(_Model):
    include_usage: bool = False
    # vLLM's extension: with include_usage, every chunk carries the usage so far, and a chunk is sent for every
    # response that carried tokens, its text empty where the detokenizer holds it back (incomplete UTF-8): a client
    # then sees each token arrive (what `bench --protocol openai` times)
    continuous_usage_stats: bool = False


class _Common(_Model):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None  # OpenAI's default is 1 (sampling); 0 is greedy
    top_p: float | None = None
    top_k: int | None = None  # vLLM: -1 or 0 is off
    seed: int | None = None
    stop: str | list[str] | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None

    def refused(self) -> OpenAIError | None:
        """The first field sent whose meaning this server cannot honour."""
        extra = self.model_extra or {}
        for name, why in UNSUPPORTED.items():
            if name in extra and not _neutral(name, extra[name]):
                return OpenAIError(400, f"{name}: {why}", param=name)
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
            if name in extra and not _neutral(name, extra[name]):
                return OpenAIError(400, f"{name} is not supported here (only its neutral value, "
                                   f"{NEUTRAL[name][0]})", param=name)
        if self.n != 1:
            return OpenAIError(400, f"n must be 1 (one completion per request), got {self.n}", param="n")
        if self.stream_options is not None and not self.stream:
            return OpenAIError(400, "stream_options is only allowed with stream: true", param="stream_options")
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage in every chunk (vLLM: only with include_usage)."""
        return self.include_usage and self.stream_options.continuous_usage_stats


def _neutral(name: str, value: Any) -> bool:
    return value is None or value in NEUTRAL.get(name, ())


class CompletionRequest(_Common):
    prompt: str | list[str]


class TextPart(_Model):
    type: Literal["text"]
    text: str


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


def parse(model: type[_Common], data: Any) -> _Common:
    """The request, or OpenAIError(400) naming the first field that is wrong."""
    if not isinstance(data, dict):
        raise OpenAIError(400, f"the body must be a JSON object, got a {type(data).__name__}")
    if (where := _lone_surrogate(data)) is not None:
        raise OpenAIError(400, f"{where or 'a key'}: not valid Unicode text (a lone surrogate such as \\ud800)",
                          param=where or None)
    try:
        request = model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = "is missing; it is required" if first["type"] == "missing" else first["msg"]
        raise OpenAIError(400, f"{where}: {message}", param=where or None) from None
    if refusal := request.refused():
        raise refusal
    return request


def _lone_surrogate(data: Any, where: str = "") -> str | None:
    """The path (``messages.0.content``) of the first string in ``data`` that is not encodable as UTF-8: JSON
    lets a client send ``"\\ud800"``, which is no character and would fail the tokenizer; None when none is."""
    stack = [(data, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(item, dict):
            for key, value in item.items():
                if _lone_surrogate(key) is not None:
                    return path
                stack.append((value, f"{path}.{key}" if path else str(key)))
        elif isinstance(item, list):
            stack.extend((value, f"{path}.{i}") for i, value in reversed(list(enumerate(item))))
    return None


# --------------------------------------------------------------------------- responses


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(request_id: str, model: str, text: str, finish_reason: str | None, prompt_tokens: int,
               completion_tokens: int, *, chunk: bool = False) -> dict[str, Any]:
    body = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
    if not chunk:
        body["usage"] = usage(prompt_tokens, completion_tokens)
    return body


def chat(request_id: str, model: str, message: dict[str, Any], finish_reason: str | None, prompt_tokens: int,
         completion_tokens: int) -> dict[str, Any]:
    return {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "logprobs": None,
                         "finish_reason": finish_reason}],
            "usage": usage(prompt_tokens, completion_tokens)}


def chat_chunk(request_id: str, model: str, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    return {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}


def usage_chunk(request_id: str, model: str, obj: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The last chunk of a stream with ``stream_options.include_usage``: no choices, the usage."""
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}


def models(model_id: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                        "owned_by": "trtllm-pipeline"}]}
