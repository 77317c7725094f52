"""An OpenAI request as this deployment's request: the prompt text, its exact token count, the sampling
settings (``SamplingParams``, checked as every runtime checks them) and the ``tensorrt_llm_bls`` inputs.

The prompt is tokenized here exactly as the server's preprocessing will (the build's tokenizer, its
special tokens), so ``usage.prompt_tokens`` is exact and a prompt the engine cannot take is a 400
before anything is sent: over ``build.max_input_len`` tokens, or with ``max_tokens`` past
``build.max_seq_len``. Chat messages go through the tokenizer's chat template with its generation
prompt (``chat.served_messages``: the text whose server-side tokenization is the template's ids).

Sampling follows OpenAI: ``temperature`` defaults to 1 (sampling), 0 is greedy. The client contract
is greedy unless ``top_k`` or ``top_p`` asks for sampling (TensorRT-LLM's rule), so a sampled
request always carries ``top_p`` (1.0: no nucleus cut). ``ignore_eos`` is ``end_id`` -1.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trtllm_pipeline.chat import served_messages
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.openai.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.triton.contract import RequestLimits

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat: whatever room is left


@dataclasses.dataclass(frozen=True)
class Prepared:
    text: str  # what is sent as text_input
    prompt_tokens: int
    params: SamplingParams
    inputs: dict[str, Any]  # the tensorrt_llm_bls inputs besides text_input

    @property
    def max_tokens(self) -> int:
        return self.params.max_tokens


def prompt_text(request: CompletionRequest | ChatCompletionRequest, tokenizer) -> str:
    if isinstance(request, ChatCompletionRequest):
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        if not getattr(tokenizer, "chat_template", None):
            raise OpenAIError(400, "this model's tokenizer has no chat template; use /v1/completions",
                              param="messages")
        return served_messages(tokenizer, messages)
    prompt = request.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise OpenAIError(400, f"prompt: one prompt per request (got {len(prompt)})", param="prompt")
        prompt = prompt[0]
    return prompt


def prepare(request: CompletionRequest | ChatCompletionRequest, tokenizer, limits: RequestLimits) -> Prepared:
    """The request as the deployment takes it, or OpenAIError(400) naming what it cannot take."""
    text = prompt_text(request, tokenizer)
    if not text:
        raise OpenAIError(400, "the prompt is empty", param="prompt" if isinstance(request, CompletionRequest)
                          else "messages")
    if problem := limits.text_problem("the prompt", len(text.encode("utf-8", "surrogatepass"))):
        raise OpenAIError(400, problem, param="prompt")  # refused by its size before tokenizing
    prompt_tokens = len(tokenizer.encode(text, add_special_tokens=True))
    if prompt_tokens > limits.max_input_tokens:
        raise OpenAIError(400, f"the prompt is {prompt_tokens} tokens; this engine takes at most "
                          f"{limits.max_input_tokens} (build.max_input_len)", param="messages"
                          if isinstance(request, ChatCompletionRequest) else "prompt", code="context_length_exceeded")
    max_tokens, name = _max_tokens(request, limits.max_seq_len - prompt_tokens)
    if max_tokens is not None and prompt_tokens + max_tokens > limits.max_seq_len:
        raise OpenAIError(400, f"{name} is {max_tokens}, but the prompt is {prompt_tokens} tokens and this engine "
                          f"takes at most {limits.max_seq_len} in all (build.max_seq_len): at most "
                          f"{max(limits.max_seq_len - prompt_tokens, 0)}", param=name, code="context_length_exceeded")
    stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if problem := limits.words_problem("stop", [s.encode() for s in stops]):
        raise OpenAIError(400, problem, param="stop")
    temperature = 1.0 if request.temperature is None else request.temperature
    top_k = 0 if request.top_k in (None, -1) else request.top_k
    top_p = 1.0 if request.top_p is None else request.top_p
    try:
        params = SamplingParams(max_tokens=max_tokens, min_tokens=request.min_tokens, temperature=temperature,
                                top_k=top_k, top_p=top_p, seed=request.seed, end_id=-1 if request.ignore_eos else None,
                                stop_words=tuple(s for s in stops if s)).check()
    except InputError as exc:
        field = exc.message.split(" ", 1)[0]
        raise OpenAIError(400, exc.message, param=_openai_name(field, name)) from None
    return Prepared(text, prompt_tokens, params, triton_inputs(params))


def _max_tokens(request, room: int) -> tuple[int, str]:
    if isinstance(request, ChatCompletionRequest):
        if request.max_completion_tokens is not None:
            return request.max_completion_tokens, "max_completion_tokens"
        if request.max_tokens is not None:
            return request.max_tokens, "max_tokens"
        return max(room, 1), "max_tokens"  # vLLM's default: what the context leaves
    return (COMPLETION_DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens), "max_tokens"


def _openai_name(field: str, max_name: str) -> str:
    return {"max_tokens": max_name, "stop_words": "stop", "end_id": "ignore_eos"}.get(field, field)


def triton_inputs(params: SamplingParams) -> dict[str, Any]:
    """``tensorrt_llm_bls`` inputs for ``params`` (besides the prompt and ``stream``)."""
    inputs: dict[str, Any] = {"max_tokens": params.max_tokens, "exclude_input_in_output": True}
    if params.min_tokens:
        inputs["min_tokens"] = params.min_tokens
    if params.stop_words:
        inputs["stop_words"] = list(params.stop_words)
    if params.end_id is not None:
        inputs["end_id"] = params.end_id
    if not params.greedy:  # the contract samples only when top_k or top_p asks: top_p is always sent
        inputs.update(temperature=params.temperature, top_p=params.top_p)
        if params.top_k:
            inputs["top_k"] = params.top_k
        if params.seed is not None:
            inputs["random_seed"] = params.seed
    return inputs


def finish_reason(completion_tokens: int, max_tokens: int) -> str:
    """``length`` when the budget was spent, else ``stop`` (an end token or a stop string)."""
    return "length" if completion_tokens >= max_tokens else "stop"
