"""Client of a deployed build over gRPC (stream API) or HTTP (generate extension).

It talks to ``tensorrt_llm_bls`` by default (``contract.FRONT_MODEL``; the ``ensemble`` takes the same
inputs), the model that stops generating when its client cancels or goes away. Both are decoupled
(they stream), so over gRPC every request, streamed or not, goes through
``start_stream``/``async_stream_infer`` (Triton refuses plain ``infer`` on a decoupled model); over
HTTP a whole answer is ``POST /v2/models/<model>/generate`` and a stream ``/generate_stream``
(server-sent events). One client per thread: tritonclient's clients are not thread-safe.

Parameters are the ensemble's optional inputs (``max_tokens``, ``min_tokens``, ``temperature``,
``top_k``, ``top_p``, ``random_seed``, ``end_id``, ``pad_id``, ``stop_words``, ``bad_words``,
``exclude_input_in_output``); as with TensorRT-LLM, decoding is greedy unless ``top_k`` or
``top_p`` asks for sampling.
"""

from __future__ import annotations

import json
import queue
from typing import Any, Iterator, Sequence

import numpy as np

from trtllm_pipeline.errors import InputError, StageFailed, UnavailableError
from trtllm_pipeline.triton.contract import CLIENT_INPUTS, FRONT_MODEL

PROTOCOLS = ("grpc", "http")
DEFAULT_MAX_TOKENS = 256
_TYPES = {"TYPE_STRING": ("BYTES", object), "TYPE_INT32": ("INT32", np.int32), "TYPE_FP32": ("FP32", np.float32),
          "TYPE_BOOL": ("BOOL", bool), "TYPE_UINT64": ("UINT64", np.uint64)}
_INPUT_TYPES = {name: _TYPES[kind] for name, kind, _, _ in CLIENT_INPUTS}


class ServerError(StageFailed):
    """The server answered a request with an error (the request's fault or the model's)."""


class TritonClient:
    """``generate(prompt, **params) -> str``, ``stream(prompt, **params)`` and ``score_choices``."""

    def __init__(self, url: str, protocol: str = "grpc", model: str = FRONT_MODEL, timeout_s: float = 600.0):
        if protocol not in PROTOCOLS:
            raise InputError(f"protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}.")
        self.url, self.protocol, self.model, self.timeout_s = url, protocol, model, timeout_s
        if protocol == "grpc":
            import tritonclient.grpc as grpcclient

            self._grpc = grpcclient
            self._client = grpcclient.InferenceServerClient(url)
        else:
            import requests

            self._session = requests.Session()
        self._check_ready()

    # ---- public ------------------------------------------------------------------------------

    def generate(self, prompt: str, **params) -> str:
        """The whole answer to ``prompt``."""
        if self.protocol == "http":
            return self._http_generate(self._values(prompt, params, stream=False))["text_output"]
        return "".join(piece for piece, _ in self._grpc_responses(self._values(prompt, params, stream=False)))

    def stream(self, prompt: str, **params) -> Iterator[str]:
        """The answer's text pieces as the server sends them, one per generated token."""
        values = self._values(prompt, params, stream=True)
        if self.protocol == "http":
            yield from self._http_stream(values)
        else:
            yield from (piece for piece, _ in self._grpc_responses(values))

    def score_choices(self, prompt: str, choice_token_ids: Sequence[int]) -> list[float]:
        """Log-probability of each single-token choice right after ``prompt``.

        From the ``generation_logits`` of a one-token request (TensorRT-LLM engines need
        ``build.gather_generation_logits``); MMLU's answer letters are scored this way.
        """
        values = self._values(prompt, {"max_tokens": 1, "return_generation_logits": True}, stream=False)
        if self.protocol == "http":
            logits = np.asarray(self._http_generate(values).get("generation_logits", []), dtype=np.float64)
        else:
            found = [lg for _, lg in self._grpc_responses(values) if lg is not None]
            logits = np.asarray(found[-1] if found else [], dtype=np.float64)
        if logits.size == 0:
            raise ServerError(f"{self.model} at {self.url} returned no generation_logits.",
                              fix="serve an engine built with build.gather_generation_logits: true")
        row = logits.reshape(-1, logits.shape[-1])[0]  # the first generated step (HTTP sends it flat)
        logprobs = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
        return [float(logprobs[t]) for t in choice_token_ids]

    def close(self) -> None:
        if self.protocol == "grpc":
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
            datatype, dtype = _INPUT_TYPES[name]
            items = value if isinstance(value, list) else [value]
            array = np.array([[v.encode("utf-8") if dtype is object else v for v in items]], dtype=dtype)
            tensor = self._grpc.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        return tensors

    def _grpc_responses(self, values: dict[str, Any]) -> Iterator[tuple[str, np.ndarray | None]]:
        responses: queue.Queue = queue.Queue()
        self._client.start_stream(callback=lambda result, error: responses.put((result, error)))
        finished = False
        try:
            self._client.async_stream_infer(self.model, self._grpc_inputs(values), enable_empty_final_response=True)
            while True:
                try:
                    result, error = responses.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise ServerError(f"no response from {self.url} for {self.timeout_s:.0f} s.") from None
                if error is not None:
                    raise ServerError(f"{self.model} at {self.url}: {error.message()}")
                text = result.as_numpy("text_output")
                if text is not None:
                    yield _text(text), result.as_numpy("generation_logits")
                final = result.get_response().parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    finished = True
                    return
        finally:
            # A consumer that stops early cancels the request instead of leaving it running.
            self._client.stop_stream(cancel_requests=not finished)

    # ---- HTTP ----------------------------------------------------------------------------------

    def _http_generate(self, values: dict[str, Any]) -> dict[str, Any]:
        response = self._post("generate", values, stream=False)
        body = response.json()
        if "error" in body:
            raise ServerError(f"{self.model} at {self.url}: {body['error']}")
        return body

    def _http_stream(self, values: dict[str, Any]) -> Iterator[str]:
        with self._post("generate_stream", values, stream=True) as response:
            for line in response.iter_lines(decode_unicode=False):
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[len(b"data:"):])
                if "error" in event:
                    raise ServerError(f"{self.model} at {self.url}: {event['error']}")
                if "text_output" in event:
                    yield event["text_output"]

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


def _text(array: np.ndarray) -> str:
    value = array.reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
