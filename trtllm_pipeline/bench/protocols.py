"""Streaming clients for the load generator, one per protocol, timing every streamed response.

Each client is used by one worker thread at a time and turns one prompt into a ``Streamed``:
the arrival time of each token-bearing response and its text. Lengths are forced, so that every
request generates exactly the tokens asked for and the numbers compare across servers:

* ``triton-grpc`` / ``triton-http``: the deployment's client (``client.TritonClient``: the gRPC
  stream API of the decoupled ``tensorrt_llm_bls`` (same contract as the ``ensemble``), or ``generate_stream`` with server-sent events);
  ``min_tokens = max_tokens`` (TensorRT-LLM's ensemble inputs), ``exclude_input_in_output``.
  Every response carries one generated token (TensorRT-LLM streaming; our torch server too), so
  the responses count the tokens.
* ``openai``: ``POST /v1/completions`` with ``stream``, ``min_tokens``/``ignore_eos`` (vLLM and
  trtllm-serve extensions) and ``stream_options.include_usage``, whose final usage block gives the
  exact token count (a chunk may carry several tokens).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Iterator

from trtllm_pipeline.client import TritonClient
from trtllm_pipeline.triton.contract import FRONT_MODEL
from trtllm_pipeline.errors import InputError, UnavailableError

PROTOCOLS = ("triton-grpc", "triton-http", "openai")
TRITON_PROTOCOLS = {"triton-grpc": "grpc", "triton-http": "http"}  # -> client.TritonClient's names
TRITON_MODEL = FRONT_MODEL  # the model clients use: it stops what a gone client asked for


@dataclasses.dataclass
class Streamed:
    token_times: list[float] = dataclasses.field(default_factory=list)  # perf_counter at each arrival
    pieces: list[str] = dataclasses.field(default_factory=list)
    usage_tokens: int | None = None  # the server's own count, where the protocol reports one
    # the stream's last response where it carries no token (OpenAI's usage chunk): its end, after the last text (a
    # token whose text the server still held back, as a random model's partial UTF-8, sends none)
    ended: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def output_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.token_times)


class RequestFailed(Exception):
    """The server answered one request with an error (recorded, the benchmark goes on)."""


def forced_length(output_tokens: int) -> dict[str, Any]:
    """The ensemble inputs that make a request's output exactly ``output_tokens`` long."""
    return {"max_tokens": output_tokens, "min_tokens": output_tokens, "exclude_input_in_output": True}


# --------------------------------------------------------------------------- Triton (gRPC or HTTP)


class TritonStreamClient:
    """The deployment's own client (``client.TritonClient``), timing each streamed response."""

    def __init__(self, url: str, protocol: str, model: str, timeout_s: float):
        self.client = TritonClient(url, protocol, model, timeout_s)  # checks the model is ready

    def generate(self, prompt: str, output_tokens: int) -> Streamed:
        out = Streamed(usage_tokens=0)  # the server's count: a response may carry several tokens
        for piece, tokens in self.client.stream_tokens(prompt, **forced_length(output_tokens)):
            # gRPC: when the response landed (``TritonClient.arrived``); HTTP: read as soon as it lands
            out.token_times.append(self.client.arrived if self.client.protocol == "grpc" else time.perf_counter())
            out.pieces.append(piece)
            out.usage_tokens += tokens
        return out

    def close(self) -> None:
        self.client.close()


# --------------------------------------------------------------------------- OpenAI-compatible servers


def _sse_data(response) -> Iterator[tuple[float, str]]:
    """(arrival time, payload) of each ``data:`` line, read as the chunks arrive."""
    for line in response.iter_lines(chunk_size=None, decode_unicode=False):
        arrived = time.perf_counter()
        if line.startswith(b"data:"):
            yield arrived, line[5:].strip().decode("utf-8", errors="replace")


class OpenAIClient:
    """``/v1/completions`` streamed; the usage block at the end gives the exact token count."""

    def __init__(self, base_url: str, model: str, timeout_s: float):
        import requests

        self.session = requests.Session()
        self.base_url, self.model, self.timeout_s = base_url, model, timeout_s

    def _post_stream(self, path: str, body: dict):
        import requests

        try:
            response = self.session.post(self.base_url + path, json=body, stream=True, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise RequestFailed(f"{type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            detail = response.text[:300].strip()
            response.close()
            raise RequestFailed(f"HTTP {response.status_code}: {detail}")
        return response

    def close(self) -> None:
        self.session.close()

    def generate(self, prompt: str, output_tokens: int) -> Streamed:
        out = Streamed()
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": output_tokens, "min_tokens": output_tokens,
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            # continuous_usage_stats (vLLM's; this project's front has it): a chunk for every response with tokens,
            # the count so far on each, so a token whose text is held back (a random model's partial UTF-8) still
            # shows when it arrived. A server without it sends usage once, at the end: then text chunks are timed.
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        counted = 0  # completion tokens the chunks' usage has said so far
        with self._post_stream("/v1/completions", body) as response:
            done = False
            for arrived, payload in _sse_data(response):
                # read on past [DONE] to the response's end (the next bytes): a response left unread closes its
                # connection, and each request then paid a new one, which clients that keep theirs (the OpenAI SDK,
                # httpx) do not
                done = done or payload == "[DONE]"
                if done:
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    raise RequestFailed(f"server error: {chunk['error']}")
                usage, choices = chunk.get("usage"), chunk.get("choices") or []
                tokens = (usage or {}).get("completion_tokens")
                tokens = None if tokens is None else int(tokens)
                if tokens is not None:
                    out.usage_tokens = tokens
                    out.ended = arrived
                # a chunk brought tokens if its usage grew, or (no usage on it) if it carries text; AIPerf, without
                # per-chunk usage, ignores chunks without text too
                fresh = tokens > counted if tokens is not None and choices else any(c.get("text") for c in choices)
                if fresh:
                    out.token_times.append(arrived)
                if tokens is not None:
                    counted = tokens
                out.pieces.extend(c["text"] for c in choices if c.get("text"))
        if out.usage_tokens is None:
            raise RequestFailed("the stream ended without a usage block (stream_options.include_usage unsupported?)")
        return out


# --------------------------------------------------------------------------- factory


@dataclasses.dataclass
class Endpoint:
    """A served model, checked once; ``client()`` makes one per worker thread."""

    protocol: str
    url: str
    model: str
    timeout_s: float

    def client(self):
        if self.protocol == "openai":
            return OpenAIClient(self.url, self.model, self.timeout_s)
        return TritonStreamClient(self.url, TRITON_PROTOCOLS[self.protocol], self.model, self.timeout_s)


def connect(protocol: str, url: str, model: str | None, timeout_s: float) -> Endpoint:
    """Check that the server is up and serves the model; raise with a fix when it is not."""
    if protocol not in PROTOCOLS:
        raise InputError(f"unknown protocol {protocol!r}.", fix=f"use one of {', '.join(PROTOCOLS)}")
    if protocol in TRITON_PROTOCOLS:
        endpoint = Endpoint(protocol, url.split("://", 1)[-1].rstrip("/"), model or TRITON_MODEL, timeout_s)
        endpoint.client().close()  # raises UnavailableError / InputError when it is not servable
        return endpoint
    base = (url if "://" in url else f"http://{url}").rstrip("/")
    base = base.removesuffix("/v1")  # an OpenAI base URL (what the openai SDK takes) or the server's root
    models = [m["id"] for m in _get_json(base, "/v1/models", what="the model list").get("data", [])]
    if model is None and len(models) != 1:
        raise InputError(f"{base} serves {len(models)} models ({', '.join(models) or 'none'}).",
                         fix="name the one to benchmark with --model")
    if model is not None and model not in models:
        raise InputError(f"{base} does not serve {model!r} (it serves {', '.join(models) or 'nothing'}).",
                         fix="pass one of those with --model")
    return Endpoint(protocol, base, model or models[0], timeout_s)


def _get_json(base: str, path: str, *, what: str) -> dict:
    import requests

    try:
        response = requests.get(base + path, timeout=10)
    except requests.RequestException as exc:
        raise UnavailableError(f"no server answers at {base} ({type(exc).__name__}).",
                               fix="start one, or pass the right --url") from None
    if response.status_code != 200:
        raise InputError(f"{base}{path}: HTTP {response.status_code} asking for {what}.",
                         fix="check --url, --protocol and --model")
    return response.json()
