"""Client of a deployed build over gRPC (stream API) or HTTP (generate extension).

It talks to ``tensorrt_llm_bls`` by default (``contract.FRONT_MODEL``; the ``ensemble`` takes the same
inputs), the model that stops generating when its client cancels or goes away. Both are decoupled
(they stream), so over gRPC every request, streamed or not, goes through
``start_stream``/``async_stream_infer`` (Triton refuses plain ``infer`` on a decoupled model; a stream a request,
``KEEP_STREAM`` below); over
HTTP a whole answer is ``POST /v2/models/<model>/generate`` and a stream ``/generate_stream``
(server-sent events). One client per thread: tritonclient's clients are not thread-safe.

Parameters are the ensemble's optional inputs (``max_tokens``, ``min_tokens``, ``temperature``,
``top_k``, ``top_p``, ``random_seed``, ``end_id``, ``pad_id``, ``stop_words``, ``bad_words``,
``exclude_input_in_output``); as with TensorRT-LLM, decoding is greedy unless ``top_k`` or
``top_p`` asks for sampling.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from typing import Any, Iterator, Sequence

import numpy as np

from trtllm_pipeline.endpoints import is_openai_url
from trtllm_pipeline.errors import InputError, StageFailed, UnavailableError
from trtllm_pipeline.triton import loopback
from trtllm_pipeline.triton.contract import CLIENT_INPUTS, FRONT_MODEL, NUM_OUTPUT_TOKENS

log = logging.getLogger(__name__)

PROTOCOLS = ("grpc", "http")
DEFAULT_MAX_TOKENS = 256
# A gRPC stream a request (opened, then stopped after its final response), not one kept across a client's requests:
# H100 2026-12-06c, random 7B FP8 served at c=64 (384 requests, one BLS process), a stream a request 12,364 output
# tokens/s, TTFT p50 109 / p90 171 ms, Triton's queue for the BLS 19 ms a request; kept streams, same call, 11,070 and
# 11,058, p50 184 / 180, p90 357 / 346, queue 114 / 87 ms. Why a kept stream queues longer in Triton is not known.
# ``TRTLLM_PIPELINE_GRPC_KEEP_STREAM=1`` keeps one a client (the A/B).
KEEP_STREAM = os.environ.get("TRTLLM_PIPELINE_GRPC_KEEP_STREAM", "0").strip() == "1"
CANCEL_POLL_S = 0.05  # how often a stream with a cancellation event looks at it while no response arrives
_TYPES = {"TYPE_STRING": ("BYTES", object), "TYPE_INT32": ("INT32", np.int32), "TYPE_FP32": ("FP32", np.float32),
          "TYPE_BOOL": ("BOOL", bool), "TYPE_UINT64": ("UINT64", np.uint64)}
_INPUT_TYPES = {name: _TYPES[kind] for name, kind, _, _ in CLIENT_INPUTS}


class ServerError(StageFailed):
    """The server answered a request with an error (the request's fault or the model's).

    ``status``: gRPC's status name (``INVALID_ARGUMENT`` for a bad request, ``UNAVAILABLE`` ...),
    when the server gave one, so that a front can tell the client's fault from the server's."""

    def __init__(self, message: str, fix: str | None = None, status: str | None = None):
        super().__init__(message, fix)
        self.status = status


class TritonClient:
    """``generate(prompt, **params) -> str``, ``stream(prompt, **params)`` and ``score_choices``."""

    def __init__(self, url: str, protocol: str = "grpc", model: str = FRONT_MODEL, timeout_s: float = 600.0):
        if protocol not in PROTOCOLS:
            raise InputError(f"protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}.")
        self.url, self.protocol, self.model, self.timeout_s = url, protocol, model, timeout_s
        self.arrived = 0.0  # gRPC: when the last response a stream yielded landed (``time.perf_counter()``)
        if protocol == "grpc":
            import tritonclient.grpc as grpcclient

            self._grpc = grpcclient
            self._client = grpcclient.InferenceServerClient(url)
            self._responses: queue.Queue | None = None  # the open stream's responses (``_stream``)
        else:
            import requests

            self._session = requests.Session()
        self._check_ready()

    # ---- public ------------------------------------------------------------------------------

    def generate(self, prompt: str, **params) -> str:
        """The whole answer to ``prompt``."""
        if self.protocol == "http":
            return self._http_generate(self._values(prompt, params, stream=False))["text_output"]
        return "".join(piece for piece, _, _, _ in self._grpc_responses(self._values(prompt, params, stream=False)))

    def stream(self, prompt: str, **params) -> Iterator[str]:
        """The answer's text pieces as the server sends them, one per generated token."""
        values = self._values(prompt, params, stream=True)
        if self.protocol == "http":
            yield from (piece for piece, _ in self._http_stream(values))
        else:
            yield from (piece for piece, _, _, _ in self._grpc_responses(values))

    def stream_tokens(self, prompt: str, cancelled: threading.Event | None = None, request_id: str = "",
                      **params) -> Iterator[tuple[str, int]]:
        """(text piece, generated tokens it carries): the response's ``num_output_tokens`` (``tensorrt_llm_bls``;
        one response may carry several tokens), else 1 for each response but a final one that carries text (the
        detokenizer's held-back tail), so the counts add up to the exact completion length. Over gRPC, setting
        ``cancelled`` (from another thread) ends the stream and cancels the request within ``CANCEL_POLL_S``,
        even while no response arrives. ``request_id``: Triton's request id (gRPC)."""
        values = self._values(prompt, params, stream=True)
        if self.protocol == "http":
            if cancelled is not None or request_id:
                raise InputError("cancelling a stream and request ids need gRPC.", fix="use protocol grpc")
            yield from ((piece, 1 if tokens is None else tokens) for piece, tokens in self._http_stream(values))
            return
        for piece, _, final, tokens in self._grpc_responses(values, cancelled, request_id):
            yield piece, tokens if tokens is not None else 0 if final else 1

    def score_choices(self, prompt: str, choice_token_ids: Sequence[int]) -> list[float]:
        """Log-probability of each single-token choice right after ``prompt``.

        From the ``generation_logits`` of a one-token request (TensorRT-LLM engines need
        ``build.gather_generation_logits``); MMLU's answer letters are scored this way.
        """
        values = self._values(prompt, {"max_tokens": 1, "return_generation_logits": True}, stream=False)
        if self.protocol == "http":
            logits = np.asarray(self._http_generate(values).get("generation_logits", []), dtype=np.float64)
        else:
            found = [lg for _, lg, _, _ in self._grpc_responses(values) if lg is not None]
            logits = np.asarray(found[-1] if found else [], dtype=np.float64)
        if logits.size == 0:
            raise ServerError(f"{self.model} at {self.url} returned no generation_logits.",
                              fix="serve an engine built with build.gather_generation_logits: true")
        row = logits.reshape(-1, logits.shape[-1])[0]  # the first generated step (HTTP sends it flat)
        logprobs = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
        return [float(logprobs[t]) for t in choice_token_ids]

    def close(self) -> None:
        if self.protocol == "grpc":
            self._end_stream(cancel=True)
            self._client.close()
        else:
            self._session.close()

    def __enter__(self) -> "TritonClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- request values ----------------------------------------------------------------------

    @staticmethod
    def _values(prompt: str, params: dict[str, Any], *, stream: bool) -> dict[str, Any]:
        unknown = set(params) - set(_INPUT_TYPES)
        if unknown:
            raise InputError(f"unknown generation parameter(s): {', '.join(sorted(unknown))}.",
                             fix=f"use {', '.join(n for n in _INPUT_TYPES if n not in ('text_input', 'stream'))}")
        values = {"text_input": prompt, "max_tokens": DEFAULT_MAX_TOKENS, "stream": stream}
        values.update({k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in params.items() if v is not None})
        return values

    # ---- gRPC ----------------------------------------------------------------------------------

    def _grpc_inputs(self, values: dict[str, Any]) -> list:
        tensors = []
        for name, value in values.items():
            datatype, array = _input_array(name, value)
            tensor = self._grpc.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        return tensors

    def _grpc_responses(self, values: dict[str, Any], cancelled: threading.Event | None = None, request_id: str = ""
                        ) -> Iterator[tuple[str, np.ndarray | None, bool, int | None]]:
        """(text, generation logits, whether it is the final response, the tokens it carries where the model
        says: ``num_output_tokens``) of each response bearing text."""
        responses = self._stream()
        finished = False
        try:
            self._client.async_stream_infer(self.model, self._grpc_inputs(values), request_id=request_id,
                                            enable_empty_final_response=True)
            while True:
                deadline = time.monotonic() + self.timeout_s
                while True:
                    if cancelled is not None and cancelled.is_set():
                        return  # not finished: the finally cancels the request
                    try:
                        arrived, result, error = responses.get(timeout=CANCEL_POLL_S if cancelled is not None
                                                               else self.timeout_s)
                        break
                    except queue.Empty:
                        if time.monotonic() >= deadline:
                            raise ServerError(f"no response from {self.url} for {self.timeout_s:.0f} s.") from None
                if error is not None:
                    raise ServerError(f"{self.model} at {self.url}: {error.message()}", status=_status(error))
                text, tokens, final = response_piece(result)
                if text is not None:
                    self.arrived = arrived  # (``time.perf_counter()``) when the response being yielded landed
                    yield text, result.as_numpy("generation_logits"), final, tokens
                if final:
                    finished = True
                    if not KEEP_STREAM:
                        self._end_stream(cancel=False)
                    return
        finally:
            # A request that ended otherwise than with its final response (a consumer that stopped early, an error, a
            # timeout) is cancelled with its stream; the next request opens a fresh one, with nothing of this one's.
            if not finished:
                self._end_stream(cancel=True)

    def _stream(self) -> queue.Queue:
        """The client's gRPC stream, opened for a request (and, with ``KEEP_STREAM``, kept for its next ones, one at a
        time, each ending with its final response)."""
        if self._responses is None:
            responses: queue.Queue = queue.Queue()
            # stamped on arrival, in gRPC's thread: the consumer may take it from the queue later, when other streams
            # hold the GIL (a benchmark's 64), which is not the server's time (``arrived``)
            self._client.start_stream(
                callback=lambda result, error: responses.put((time.perf_counter(), result, error)))
            self._responses = responses
        return self._responses

    def _end_stream(self, *, cancel: bool) -> None:
        if self._responses is None:
            return
        self._responses = None
        try:
            self._client.stop_stream(cancel_requests=cancel)
        except Exception as exc:  # noqa: BLE001 - a server already gone: nothing left to stop
            log.debug("stopping the gRPC stream to %s: %s", self.url, exc)

    # ---- HTTP ----------------------------------------------------------------------------------

    def _http_generate(self, values: dict[str, Any]) -> dict[str, Any]:
        response = self._post("generate", values, stream=False)
        body = response.json()
        if "error" in body:
            raise ServerError(f"{self.model} at {self.url}: {body['error']}")
        return body

    def _http_stream(self, values: dict[str, Any]) -> Iterator[tuple[str, int | None]]:
        """(text, the tokens it carries where the model says) of each event bearing text."""
        with self._post("generate_stream", values, stream=True) as response:
            for line in response.iter_lines(chunk_size=None, decode_unicode=False):  # each chunk as it lands
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[len(b"data:"):])
                if "error" in event:
                    raise ServerError(f"{self.model} at {self.url}: {event['error']}")
                if "text_output" in event:
                    tokens = event.get(NUM_OUTPUT_TOKENS)
                    yield event["text_output"], None if tokens is None else int(tokens)

    def _post(self, endpoint: str, values: dict[str, Any], *, stream: bool):
        import requests

        url = f"http://{self.url}/v2/models/{self.model}/{endpoint}"
        try:
            response = self._session.post(url, json=values, stream=stream, timeout=self.timeout_s)
        except requests.ConnectionError as exc:
            raise UnavailableError(f"cannot reach {self.url} over HTTP ({exc}).",
                                   fix="start the server (trtllm-pipeline serve -c CONFIG) or check --url") from None
        if response.status_code >= 400 and "json" not in response.headers.get("content-type", ""):
            raise ServerError(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
        return response

    def _check_ready(self) -> None:
        try:
            if self.protocol == "grpc":
                ready = self._client.is_model_ready(self.model)
            else:
                ready = self._session.get(f"http://{self.url}/v2/models/{self.model}/ready", timeout=10).ok
        except Exception as exc:  # connection refused, DNS, TLS: all mean "not reachable"
            raise UnavailableError(f"cannot reach a Triton server at {self.url} over {self.protocol} "
                                   f"({type(exc).__name__}).",
                                   fix="start it (trtllm-pipeline serve -c CONFIG) or check --url/--protocol") from None
        if not ready:
            raise InputError(f"the server at {self.url} has no ready model {self.model!r}.",
                             fix="deploy and serve a build (trtllm-pipeline serve -c CONFIG)")


def stream_request(model: str, values: dict[str, Any], request_id: str = ""):
    """``values`` (``TritonClient._values``) as the protobuf request of a gRPC stream (``ModelStreamInfer``), asking
    for Triton's empty final response (a decoupled model may end a request by a flag alone): what
    ``async_stream_infer`` sends, for a caller on ``grpc.aio`` (the OpenAI front's event loop)."""
    return loopback.stream_request(model, {name: _input_array(name, value)[1] for name, value in values.items()},
                                   request_id)


def _input_array(name: str, value: Any) -> tuple[str, np.ndarray]:
    """A contract input's Triton datatype and its [1, n] array (strings as UTF-8 bytes)."""
    datatype, dtype = _INPUT_TYPES[name]
    items = value if isinstance(value, list) else [value]
    return datatype, np.array([[v.encode("utf-8") if dtype is object else v for v in items]], dtype=dtype)


def response_piece(result) -> tuple[str | None, int | None, bool]:
    """(text or None, the tokens it carries where the model says, whether it is the request's final response) of a
    stream's response (tritonclient's ``InferResult``)."""
    final = result.get_response().parameters.get("triton_final_response")
    text, tokens = result.as_numpy("text_output"), result.as_numpy(NUM_OUTPUT_TOKENS)
    return (None if text is None else _text(text), None if tokens is None else int(tokens.reshape(-1)[0]),
            final is not None and final.bool_param)


def _status(error) -> str | None:
    """``INVALID_ARGUMENT`` from tritonclient's ``StatusCode.INVALID_ARGUMENT`` (None when it has none)."""
    status = error.status() if hasattr(error, "status") else None
    return str(status).rsplit(".", 1)[-1] if status else None


def _text(array: np.ndarray) -> str:
    value = array.reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


class OpenAIClient:
    """The same calls (``generate``, ``stream``, the contract's parameter names) against an OpenAI API base
    URL (``http://HOST:PORT/v1``: this deployment's OpenAI front, vLLM, trtllm-serve), over
    ``/v1/completions``: the prompt goes as text, templated by the caller as for Triton. Decoding keeps
    the contract's rule (greedy unless ``top_k`` or ``top_p`` asks for sampling), so one set of
    parameters means the same through either client. ``finish_reason`` is the last request's."""

    def __init__(self, base_url: str, model: str | None = None, timeout_s: float = 600.0):
        import requests

        self.url, self.timeout_s, self.protocol = base_url.rstrip("/"), timeout_s, "openai"
        self._session = requests.Session()
        self.finish_reason: str | None = None
        try:
            listed = self._session.get(f"{self.url}/models", timeout=10)
            names = [m["id"] for m in listed.json().get("data", [])] if listed.ok else []
        except (requests.RequestException, ValueError) as exc:
            raise UnavailableError(f"cannot reach an OpenAI API at {self.url} ({type(exc).__name__}).",
                                   fix="start it (trtllm-pipeline serve -c CONFIG) or check --url") from None
        if model is None and len(names) != 1:
            raise InputError(f"{self.url} serves {len(names)} models ({', '.join(names) or 'none'}).",
                             fix="serve one model there")
        self.model = model or names[0]

    def generate(self, prompt: str, **params) -> str:
        return "".join(self.stream(prompt, **params))

    def stream(self, prompt: str, **params) -> Iterator[str]:
        body = self._body(prompt, params)
        with self._session.post(f"{self.url}/completions", json=body, stream=True, timeout=self.timeout_s) as response:
            if response.status_code != 200:
                raise ServerError(f"{self.url}: HTTP {response.status_code}: {_openai_message(response)}")
            for line in response.iter_lines(chunk_size=None, decode_unicode=False):  # each chunk as it lands
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    raise ServerError(f"{self.url}: {event['error'].get('message', event['error'])}")
                for choice in event.get("choices") or []:
                    self.finish_reason = choice.get("finish_reason") or self.finish_reason
                    if choice.get("text"):
                        yield choice["text"]

    def score_choices(self, prompt: str, choice_token_ids: Sequence[int]) -> list[float]:
        raise InputError("an OpenAI URL returns no generation logits, so it cannot score choices (MMLU).",
                         fix="evaluate MMLU through Triton (--url HOST:PORT, --protocol grpc) or in-process")

    def _body(self, prompt: str, params: dict[str, Any]) -> dict[str, Any]:
        unknown = set(params) - set(_INPUT_TYPES)
        if unknown:
            raise InputError(f"unknown generation parameter(s): {', '.join(sorted(unknown))}.")
        p = {k: v for k, v in params.items() if v is not None}
        sampling = bool(p.get("top_k") or p.get("top_p"))
        body = {"model": self.model, "prompt": prompt, "max_tokens": p.get("max_tokens", DEFAULT_MAX_TOKENS),
                "stream": True, "temperature": float(p.get("temperature", 1.0)) if sampling else 0.0}
        if sampling:
            body.update({theirs: p[ours] for ours, theirs in (("top_k", "top_k"), ("top_p", "top_p"),
                                                              ("random_seed", "seed")) if ours in p})
        if "min_tokens" in p:
            body["min_tokens"] = p["min_tokens"]
        if p.get("stop_words"):
            body["stop"] = list(p["stop_words"])
        if p.get("end_id") == -1:
            body["ignore_eos"] = True
        self.finish_reason = None
        return body

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> "OpenAIClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _openai_message(response) -> str:
    try:
        return response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response.text[:300]


def connect(url: str, protocol: str = "grpc", timeout_s: float = 600.0) -> "TritonClient | OpenAIClient":
    """The client for ``url``: an OpenAI API base URL (``http://HOST:PORT/v1``), else Triton at HOST:PORT."""
    if protocol == "openai" or is_openai_url(url):
        return OpenAIClient(url, timeout_s=timeout_s)
    return TritonClient(url, protocol, timeout_s=timeout_s)
