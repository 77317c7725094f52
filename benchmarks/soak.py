"""Soak a served model with valid streams, malformed and poison requests, and clients that go away.

Against a running deployment (loopback), for a while:

* ``--streams`` workers keep valid requests in flight, over HTTP (server-sent events) and gRPC
  (stream API), to ``tensorrt_llm_bls`` and the ``ensemble``, each forced to a random length
  (``min_tokens = max_tokens``); some sample at a vanishing temperature (the issue's poison, valid
  now). A valid request counts as served only if every one of its tokens arrived, one response each,
  and no error.
* malformed and poison requests, about ``--malformed`` of all requests: wrong types, missing
  fields, broken JSON, NaN and negative temperatures, bad top-k/top-p, 5 MB prompts, prompts over
  the engine's limit. Each must be refused with a 4xx (gRPC: an error) whose message names what
  is wrong.
* every ``--disconnect-every`` seconds a client starts a 2000-token stream, reads two tokens and
  goes away (HTTP socket closed, gRPC stream cancelled, gRPC channel dropped, in turn). The
  runtime's counters on the metrics port say when its slot was freed: the steps between the
  moment the client left and that moment are the figure.

``run`` first measures a phase of valid streams alone (``--baseline-seconds``), then the soak, and
writes both as JSON: requests, tokens, latency percentiles (request, TTFT, inter-token), refusals,
disconnect figures. ``tests/test_soak.py`` runs a short version of this against the test session's
server; the figures of the long one are in docs/serving.md.

    python benchmarks/soak.py -c build_configs/tiny-qwen2-fp8-tp1.yaml --engines-dir engines \\
        --seconds 60 --streams 64 -o soak.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import queue
import random
import re
import socket
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np
import requests

from trtllm_pipeline.triton.contract import NUM_OUTPUT_TOKENS

MODELS = ("tensorrt_llm_bls", "ensemble")
FRONT = "tensorrt_llm_bls"
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "Translate to German: good morning",
           "Café au lait 0", "List three prime numbers:", "Question: what is 7 * 6?\nAnswer:", "日本語 0"]

# (name, model-agnostic HTTP body or raw bytes, what the refusal must say). Sent to both models, in this
# order (the first ones go out within the first few malformed requests however slow the machine is).
MALFORMED_HTTP = [
    ("5 MB prompt", {"text_input": "a" * 5_000_000, "max_tokens": 4}, "at most"),
    ("truncated JSON", b'{"text_input": "hi", "max_tok', "JSON"),
    ("missing text_input (streamed)", {"max_tokens": 4, "stream": True}, "text_input"),
    ("missing max_tokens", {"text_input": "hi", "stream": True}, "max_tokens"),
    ("max_tokens a string", {"text_input": "hi", "max_tokens": "ten"}, "max_tokens"),
    ("max_tokens a fraction", {"text_input": "hi", "max_tokens": 1.5}, "max_tokens"),
    ("stop_words an integer", {"text_input": "hi", "max_tokens": 4, "stop_words": 3}, "stop_words"),
    ("not an object", b"[1, 2, 3]", "JSON object"),
    ("NaN literal", b'{"text_input": "hi", "max_tokens": 4, "temperature": NaN}', "NaN"),
    ("negative temperature", {"text_input": "hi", "max_tokens": 4, "temperature": -1.0, "top_k": 5}, "temperature"),
    ("top_k negative", {"text_input": "hi", "max_tokens": 4, "top_k": -3}, "top_k"),
    ("top_p above 1", {"text_input": "hi", "max_tokens": 4, "top_p": 1.5}, "top_p"),
    ("min_tokens above max_tokens", {"text_input": "hi", "max_tokens": 4, "min_tokens": 9}, "min_tokens"),
    ("empty prompt", {"text_input": "", "max_tokens": 4}, "empty"),
    ("max_tokens beyond max_seq_len", {"text_input": "hi", "max_tokens": 100_000}, "max_seq_len"),
    ("misspelt field", {"text_input": "hi", "max_tokens": 4, "temprature": 0.5}, "temprature"),
    ("lone surrogate", b'{"text_input": "a\\ud800", "max_tokens": 4}', "text_input"),
    ("JSON 10,000 deep", b"[" * 10_000 + b"]" * 10_000, "nested too deeply"),
    ("temperature past float32", {"text_input": "hi", "max_tokens": 4, "temperature": 1e308, "top_k": 5}, "temperature"),
]
LONG_PROMPT = ("over the token limit", {"text_input": "ab " * 190_000, "max_tokens": 4}, "at most")  # tokenized: rare


@dataclasses.dataclass
class Target:
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def url(self, model: str, endpoint: str) -> str:
        return f"http://{self.host}:{self.http_port}/v2/models/{model}/{endpoint}"


@dataclasses.dataclass
class Valid:
    protocol: str
    model: str
    asked: int
    tokens: int = 0
    error: str | None = None
    start: float = 0.0
    times: list[float] = dataclasses.field(default_factory=list)
    phase: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.tokens == self.asked

    @property
    def latency(self) -> float:
        return (self.times[-1] if self.times else time.perf_counter()) - self.start


@dataclasses.dataclass
class Refusal:
    name: str
    protocol: str
    model: str
    status: int | None  # HTTP status; None for gRPC
    message: str
    expected: str

    @property
    def ok(self) -> bool:
        refused = self.status is None or 400 <= self.status < 500
        return refused and bool(self.message) and self.expected.lower() in self.message.lower()


@dataclasses.dataclass
class Disconnect:
    how: str
    freed: bool
    steps: float | None  # runtime steps from the last count read before the client left to its slot's release
    seconds: float | None  # from the client leaving to the release, by the runtime's own clock (same host)
    step_seconds: float | None  # the runtime's mean step time around it

def runtime_metrics(target: Target) -> dict[str, float]:
    text = requests.get(f"http://{target.host}:{target.metrics_port}/metrics", timeout=10).text
    return {k: float(v) for k, v in re.findall(r"^trtllm_pipeline_(\w+)\{[^}]*\} (\S+)$", text, re.MULTILINE)}


# --------------------------------------------------------------------------- valid requests


def _grpc_inputs(values: dict[str, Any]) -> list:
    import tritonclient.grpc as grpcclient

    kinds = {str: ("BYTES", object), bool: ("BOOL", bool), int: ("INT32", np.int32), float: ("FP32", np.float32)}
    tensors = []
    for name, value in values.items():
        datatype, dtype = kinds[type(value)]
        if name == "random_seed":
            datatype, dtype = "UINT64", np.uint64
        array = np.array([[value.encode() if dtype is object else value]], dtype=dtype)
        tensors.append(grpcclient.InferInput(name, list(array.shape), datatype))
        tensors[-1].set_data_from_numpy(array)
    return tensors


def send_valid(target: Target, session: requests.Session, request: Valid, body: dict[str, Any],
               timeout: float = 300) -> Valid:
    request.start = time.perf_counter()
    try:
        if request.protocol == "http":
            with session.post(target.url(request.model, "generate_stream"), json=body, stream=True,
                              timeout=timeout) as response:
                for line in response.iter_lines():
                    if not line.startswith(b"data:"):
                        continue
                    event = json.loads(line[5:])
                    if "error" in event:
                        request.error = f"HTTP {response.status_code}: {event['error']}"
                        break
                    request.times.append(time.perf_counter())
                    request.tokens += int(event.get(NUM_OUTPUT_TOKENS, 1))
        else:
            import tritonclient.grpc as grpcclient

            client = grpcclient.InferenceServerClient(target.grpc)
            got: queue.Queue = queue.Queue()
            client.start_stream(callback=lambda result, error: got.put((result, error)))
            try:
                client.async_stream_infer(request.model, _grpc_inputs(body), enable_empty_final_response=True)
                while True:
                    result, error = got.get(timeout=timeout)
                    if error is not None:
                        request.error = f"gRPC: {error.message()}"
                        break
                    if result.as_numpy("text_output") is not None:
                        request.times.append(time.perf_counter())
                        carried = result.as_numpy(NUM_OUTPUT_TOKENS)
                        request.tokens += 1 if carried is None else int(carried.reshape(-1)[0])
                    final = result.get_response().parameters.get("triton_final_response")
                    if final is not None and final.bool_param:
                        break
            finally:
                client.stop_stream()
                client.close()
    except Exception as exc:  # anything at all: this request was lost
        request.error = f"{type(exc).__name__}: {exc}"
    return request


def valid_body(rng: random.Random, asked: int, poison: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"text_input": rng.choice(PROMPTS) + f" {rng.randrange(10**6)}", "max_tokens": asked,
                            "min_tokens": asked, "stream": True}
    if poison:  # the poison: a vanishing temperature with top-k (greedy in all but name)
        body.update(temperature=1e-45, top_k=5)
    elif rng.random() < 0.3:
        body.update(temperature=0.8, top_k=40, top_p=0.95, random_seed=rng.randrange(2**31))
    return body


# --------------------------------------------------------------------------- malformed requests


def send_malformed_http(target: Target, session: requests.Session, name: str, body, expected: str,
                        model: str, endpoint: str) -> Refusal:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        response = session.post(target.url(model, endpoint), data=data, timeout=120,
                                headers={"Content-Type": "application/json"})
        text = response.text.strip().removeprefix("data:").strip()
        try:
            message = json.loads(text.splitlines()[0] if text else "{}").get("error", "")
        except ValueError:
            message = text[:200]
        return Refusal(name, f"http/{endpoint}", model, response.status_code, message, expected)
    except Exception as exc:
        return Refusal(name, f"http/{endpoint}", model, None, "", f"{expected} (got {type(exc).__name__}: {exc})")


def send_malformed_grpc(target: Target, name: str, values: list[tuple[str, np.ndarray, str]], expected: str,
                        model: str) -> Refusal:
    import tritonclient.grpc as grpcclient

    tensors = []
    for key, array, datatype in values:
        tensors.append(grpcclient.InferInput(key, list(array.shape), datatype))
        tensors[-1].set_data_from_numpy(array)
    client = grpcclient.InferenceServerClient(target.grpc)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put(error))
    try:
        client.async_stream_infer(model, tensors, enable_empty_final_response=True)
        error = got.get(timeout=120)
        message = error.message() if error is not None else ""
    except Exception as exc:
        message = ""
        expected = f"{expected} (got {type(exc).__name__}: {exc})"
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return Refusal(name, "grpc", model, None, message, expected)


def grpc_malformed() -> list[tuple[str, list, str]]:
    text, four = np.array([[b"hi"]], dtype=object), np.array([[4]], dtype=np.int32)
    return [
        ("NaN temperature", [("text_input", text, "BYTES"), ("max_tokens", four, "INT32"),
                             ("top_k", np.array([[5]], np.int32), "INT32"),
                             ("temperature", np.array([[np.nan]], np.float32), "FP32")], "temperature"),
        ("max_tokens as FP32", [("text_input", text, "BYTES"), ("max_tokens", np.array([[4.0]], np.float32), "FP32")],
         "data-type"),
        ("min_tokens above max_tokens", [("text_input", text, "BYTES"), ("max_tokens", four, "INT32"),
                                         ("min_tokens", np.array([[9]], np.int32), "INT32")], "min_tokens"),
        ("top_p NaN", [("text_input", text, "BYTES"), ("max_tokens", four, "INT32"),
                       ("top_p", np.array([[np.nan]], np.float32), "FP32")], "top_p"),
    ]


# --------------------------------------------------------------------------- disconnects


def _open_and_leave(target: Target, how: str) -> tuple[callable, str]:
    """Start a 2000-token stream to the front model, read two tokens; returns how to leave."""
    body = {"text_input": "Once upon a time", "max_tokens": 2000, "min_tokens": 2000, "stream": True}
    if how == "http-close":
        sock = socket.create_connection((target.host, target.http_port))
        data = json.dumps(body).encode()
        sock.sendall(f"POST /v2/models/{FRONT}/generate_stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                     f"\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        received = b""
        while received.count(b"data:") < 2:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError(f"the stream ended early: {received[-300:]!r}")
            received += chunk
        return sock.close, how
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(target.grpc)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put(error))
    client.async_stream_infer(FRONT, _grpc_inputs(body))
    for _ in range(2):
        if (error := got.get(timeout=120)) is not None:
            raise RuntimeError(error.message())
    if how == "grpc-cancel":
        return lambda: (client.stop_stream(cancel_requests=True), client.close()), how
    # The channel dropped without a word. (The closure keeps the client: dropping it would run its __del__,
    # whose stop_stream() waits for the stream to end, a polite goodbye instead of an abrupt one.)
    return (lambda: client._channel.close()), how


def disconnect_once(target: Target, how: str, timeout: float = 10.0) -> Disconnect:
    """One client that goes away; the runtime's counters say when its slot was freed: the step count
    and the time it recorded then (``last_cancel_step``, ``last_cancel_unix_seconds``)."""
    leave, _ = _open_and_leave(target, how)
    before = runtime_metrics(target)
    read_at = time.time()
    gone = time.time()
    leave()
    while time.time() - gone < timeout:
        now = runtime_metrics(target)
        if now.get("requests_cancelled_total", 0) > before.get("requests_cancelled_total", 0):
            rate = (now["runtime_steps_total"] - before["runtime_steps_total"]) / max(1e-9, time.time() - read_at)
            return Disconnect(how, True, now["last_cancel_step"] - before["runtime_steps_total"],
                              now["last_cancel_unix_seconds"] - gone, 1 / rate if rate else None)
        time.sleep(0.002)
    return Disconnect(how, False, None, None, None)


# --------------------------------------------------------------------------- the soak


class Soak:
    def __init__(self, target: Target, *, streams: int = 32, malformed: float = 0.2, disconnect_every: float = 2.0,
                 lengths: tuple[int, int] = (16, 64), seed: int = 1234, long_prompt_every: int = 25):
        self.target, self.streams, self.malformed_fraction = target, streams, malformed
        self.disconnect_every, self.lengths, self.long_prompt_every = disconnect_every, lengths, long_prompt_every
        self.rng = random.Random(seed)
        self.valid: list[Valid] = []
        self.refusals: list[Refusal] = []
        self.disconnects: list[Disconnect] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._malformed_due = threading.Semaphore(0)

    def _valid_worker(self, index: int, until: float, phase: str, poison: bool) -> None:
        rng = random.Random(self.rng.random() + index)
        session = requests.Session()
        while time.perf_counter() < until:
            protocol = "http" if rng.random() < 0.5 else "grpc"
            model = FRONT if rng.random() < 0.75 else "ensemble"
            asked = rng.randint(*self.lengths)
            is_poison = poison and rng.random() < 0.1
            request = send_valid(self.target, session, Valid(protocol, model, asked, phase=phase),
                                 valid_body(rng, asked, is_poison))
            with self._lock:
                self.valid.append(request)
            # Every valid request completed makes malformed ones due, so that they are about the given fraction.
            if poison and rng.random() < self.malformed_fraction / (1 - self.malformed_fraction):
                self._malformed_due.release()

    def _malformed_worker(self, until: float) -> None:
        session = requests.Session()
        grpc_cases = grpc_malformed()
        sent = 0
        while time.perf_counter() < until:
            if not self._malformed_due.acquire(timeout=0.2):
                continue
            sent += 1
            model = MODELS[sent % 2]
            if sent % self.long_prompt_every == 0:
                name, body, expected = LONG_PROMPT
                refusal = send_malformed_http(self.target, session, name, body, expected, model, "generate")
            elif sent % 5 == 0:
                name, values, expected = grpc_cases[(sent // 5 - 1) % len(grpc_cases)]  # the first at 5
                refusal = send_malformed_grpc(self.target, name, values, expected, model)
            else:
                name, body, expected = MALFORMED_HTTP[(sent - 1) % len(MALFORMED_HTTP)]  # the first at 1
                endpoint = "generate_stream" if sent % 3 else "generate"
                refusal = send_malformed_http(self.target, session, name, body, expected, model, endpoint)
            with self._lock:
                self.refusals.append(refusal)

    def _disconnect_worker(self, until: float) -> None:
        kinds = ("http-close", "grpc-cancel", "grpc-abrupt")
        n = 0
        next_at = time.perf_counter() + self.disconnect_every / 2
        while time.perf_counter() < until:
            if time.perf_counter() < next_at:
                time.sleep(0.05)
                continue
            try:
                result = disconnect_once(self.target, kinds[n % len(kinds)])
            except Exception as exc:
                result = Disconnect(kinds[n % len(kinds)], False, None, None, None)
                with self._lock:
                    self.errors.append(f"disconnect {n}: {type(exc).__name__}: {exc}")
            with self._lock:
                self.disconnects.append(result)
            n += 1
            next_at += self.disconnect_every

    def phase(self, seconds: float, *, name: str, hostile: bool) -> None:
        until = time.perf_counter() + seconds
        threads = [threading.Thread(target=self._valid_worker, args=(i, until, name, hostile), daemon=True)
                   for i in range(self.streams)]
        if hostile:
            threads += [threading.Thread(target=self._malformed_worker, args=(until,), daemon=True) for _ in range(2)]
            threads.append(threading.Thread(target=self._disconnect_worker, args=(until,), daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=seconds + 600)

    def wait_idle(self, timeout: float = 60) -> dict[str, float]:
        deadline = time.perf_counter() + timeout
        while (m := runtime_metrics(self.target)).get("requests_active") and time.perf_counter() < deadline:
            time.sleep(0.1)
        return m

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for phase in sorted({v.phase for v in self.valid}):
            done = [v for v in self.valid if v.phase == phase]
            ok = [v for v in done if v.ok]
            itl = [b - a for v in ok for a, b in zip(v.times, v.times[1:])]
            out[phase] = {
                "valid_requests": len(done), "valid_served": len(ok), "valid_lost": len(done) - len(ok),
                "lost_examples": [dataclasses.asdict(v) | {"times": len(v.times)} for v in done if not v.ok][:5],
                "tokens": sum(v.tokens for v in ok),
                "request_latency_s": _percentiles([v.latency for v in ok]),
                "ttft_s": _percentiles([v.times[0] - v.start for v in ok if v.times]),
                "itl_s": _percentiles(itl),
                "seconds_per_token_of_request": _percentiles([v.latency / v.asked for v in ok]),
            }
        refused = [r for r in self.refusals if r.ok]
        out["malformed"] = {
            "requests": len(self.refusals), "refused_4xx_with_message": len(refused),
            "refused_pct": 100.0 * len(refused) / len(self.refusals) if self.refusals else None,
            "share_of_all_requests_pct": 100.0 * len(self.refusals) / max(1, len(self.refusals) + len(
                [v for v in self.valid if v.phase == "soak"])),
            "kinds": sorted({r.name for r in self.refusals}),
            "not_refused": [dataclasses.asdict(r) for r in self.refusals if not r.ok][:10],
        }
        freed = [d for d in self.disconnects if d.freed]
        out["disconnects"] = {
            "count": len(self.disconnects), "freed": len(freed),
            "steps_to_free": _percentiles([d.steps for d in freed]) | {"max": max((d.steps for d in freed), default=None)},
            "seconds_to_free": _percentiles([d.seconds for d in freed]),
            "steps_to_free_by_time": _percentiles([d.seconds / d.step_seconds for d in freed if d.step_seconds]),
            "step_seconds": _percentiles([d.step_seconds for d in freed]),
            "by_kind": {how: [d.steps for d in freed if d.how == how] for how in sorted({d.how for d in self.disconnects})},
        }
        out["errors"] = self.errors
        if "baseline" in out and "soak" in out:
            out["p99_request_latency_ratio_soak_vs_baseline"] = _ratio(out, "request_latency_s")
            out["p99_seconds_per_token_ratio_soak_vs_baseline"] = _ratio(out, "seconds_per_token_of_request")
        return out


def _ratio(out: dict, key: str) -> float | None:
    base, soak = out["baseline"][key].get("p99"), out["soak"][key].get("p99")
    return soak / base if base and soak else None


def _percentiles(values: list[float]) -> dict[str, float | None]:
    values = sorted(v for v in values if v is not None and math.isfinite(v))
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None}

    def q(p: float) -> float:
        return values[min(len(values) - 1, max(0, math.ceil(p * len(values)) - 1))]

    return {"n": len(values), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "mean": statistics.fmean(values)}


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True, help="build config (built; served here unless --no-serve)")
    parser.add_argument("--engines-dir", default="engines")
    parser.add_argument("--seconds", type=float, default=60.0, help="the soak phase")
    parser.add_argument("--baseline-seconds", type=float, default=30.0, help="valid streams alone, first")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--malformed", type=float, default=0.2, help="share of all requests that are malformed")
    parser.add_argument("--disconnect-every", type=float, default=2.0, help="seconds between two disconnects")
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("-o", "--output", default="soak.json")
    args = parser.parse_args(argv)

    from trtllm_pipeline import serve
    from trtllm_pipeline.config import load_config
    from trtllm_pipeline.console import setup_logging

    setup_logging(0)
    cfg = load_config(args.config)
    with socket.socket() as a, socket.socket() as b, socket.socket() as c:
        for s in (a, b, c):
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in (a, b, c)]
    started = time.perf_counter()
    server = serve.start(cfg, engines_dir=args.engines_dir, host="127.0.0.1", http=ports[0], grpc=ports[1],
                         metrics=ports[2])
    try:
        target = Target("127.0.0.1", server.http_port, server.grpc_port, server.metrics_port)
        soak = Soak(target, streams=args.streams, malformed=args.malformed, disconnect_every=args.disconnect_every,
                    lengths=(args.min_tokens, args.max_tokens))
        print(f"server ready in {time.perf_counter() - started:.1f} s; baseline {args.baseline_seconds:.0f} s, then "
              f"soak {args.seconds:.0f} s with {args.streams} streams", file=sys.stderr)
        soak.phase(args.baseline_seconds, name="baseline", hostile=False)
        soak.wait_idle()
        soak.phase(args.seconds, name="soak", hostile=True)
        after = soak.wait_idle()
        ready = requests.get(f"http://{target.host}:{target.http_port}/v2/health/ready", timeout=10).status_code == 200
        figures = soak.figures() | {"server_ready_after": ready, "runtime_counters_after": after,
                                    "settings": vars(args) | {"runtime": server.runtime}}
    finally:
        serve.stop(cfg, engines_dir=args.engines_dir)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(figures, f, indent=2)
    summary = {k: figures[k] for k in ("p99_request_latency_ratio_soak_vs_baseline",
                                       "p99_seconds_per_token_ratio_soak_vs_baseline", "server_ready_after")}
    summary |= {"valid_lost": figures["soak"]["valid_lost"] + figures["baseline"]["valid_lost"],
                "malformed_refused_pct": figures["malformed"]["refused_pct"],
                "disconnect_steps_to_free": figures["disconnects"]["steps_to_free"]}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
