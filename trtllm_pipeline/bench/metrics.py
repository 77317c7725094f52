"""Latency and throughput metrics of a streamed-generation benchmark, as pure functions.

Names and definitions follow AIPerf (NVIDIA's successor to genai-perf), docs/metrics_reference.md
of ai-dynamo/aiperf:
  time to first token  ttft = arrival of the first token - request sent
  request latency      e2e  = arrival of the last response - request sent (the last token's, or a stream's end
                       where a response without tokens closes it: OpenAI's usage chunk)
  inter-token latency  itl  = (e2e - ttft) / (output tokens - 1): excludes the first token, so
                       it is the decode speed a user sees (the "ms/token" of the reference recipe);
                       vLLM's benchmark_serving calls this same quantity TPOT.
  output token throughput  = output tokens of successful requests / benchmark duration
  request throughput       = successful requests / benchmark duration
  benchmark duration       = last response received - first request sent
Here ``tpot`` is the time per output token *including* the wait for the first one, e2e / tokens:
what a request costs its user per token; it equals 1 / (per-request output token rate).

Timestamps are seconds on one monotonic clock (``time.perf_counter``); results are milliseconds.
Statistics are over successful requests only; failed ones are counted, never averaged in.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclasses.dataclass
class RequestResult:
    """What one request did: when it was sent, when each token arrived, how many came back."""

    level: dict[str, Any]  # {"concurrency": 4} or {"request_rate": 2.0}
    index: int
    start: float
    end: float  # the last response (a token's, or the stream's end), or when the request failed
    token_times: list[float] = dataclasses.field(default_factory=list)  # arrival of each token-bearing response
    output_tokens: int = 0  # from the server: one token per streamed response, or the usage block
    output_tokens_retokenized: int | None = None  # the returned text re-encoded (BPE may merge tokens)
    input_tokens: int | None = None
    error: str | None = None
    # the returned text until the level ends (``load.run_level`` re-encodes it then, off the requests' clock)
    text: str | None = dataclasses.field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def ttft(self) -> float | None:
        return ttft(self.start, self.token_times)

    def e2e(self) -> float | None:
        return e2e_latency(self.start, self.token_times, self.end)

    def itl(self) -> float | None:
        return inter_token_latency(self.start, self.token_times, self.output_tokens, self.end)

    def tpot(self) -> float | None:
        return time_per_output_token(self.start, self.token_times, self.output_tokens, self.end)

    def to_record(self) -> dict[str, Any]:
        """The per-request entry of the results file (milliseconds from the request's start)."""
        return {
            **self.level,
            "index": self.index,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "output_tokens_retokenized": self.output_tokens_retokenized,
            "ttft_ms": _ms(self.ttft()),
            "itl_ms": _ms(self.itl()),
            "tpot_ms": _ms(self.tpot()),
            "e2e_ms": _ms(self.e2e()),
            "token_times_ms": [round((t - self.start) * 1e3, 3) for t in self.token_times],
            "error": self.error,
        }


# --------------------------------------------------------------------------- per request


def ttft(start: float, token_times: Sequence[float]) -> float | None:
    return token_times[0] - start if token_times else None


def e2e_latency(start: float, token_times: Sequence[float], end: float | None = None) -> float | None:
    """``end`` (the last response's arrival) - start; ``end`` None: the last token's."""
    if not token_times:
        return None
    return (token_times[-1] if end is None else end) - start


def inter_token_latency(start: float, token_times: Sequence[float], output_tokens: int,
                        end: float | None = None) -> float | None:
    """(e2e - ttft) / (n - 1); undefined for fewer than two tokens."""
    if output_tokens < 2 or not token_times:
        return None
    return ((token_times[-1] if end is None else end) - token_times[0]) / (output_tokens - 1)


def time_per_output_token(start: float, token_times: Sequence[float], output_tokens: int,
                          end: float | None = None) -> float | None:
    """e2e / n: time per token including the first one."""
    if output_tokens < 1 or not token_times:
        return None
    return ((token_times[-1] if end is None else end) - start) / output_tokens


# --------------------------------------------------------------------------- per load level


def distribution(values_s: Sequence[float | None]) -> dict[str, float | None]:
    """mean and percentiles (numpy's linear interpolation, as AIPerf) in ms; None when empty."""
    values = np.asarray([v for v in values_s if v is not None], dtype=float) * 1e3
    if values.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    out = {"mean": round(float(values.mean()), 3)}
    for p in PERCENTILES:
        out[f"p{p}"] = round(float(np.percentile(values, p)), 3)
    return out


def benchmark_duration(results: Sequence[RequestResult]) -> float | None:
    """First request sent to last response received, over every request of the level."""
    if not results:
        return None
    return max(r.end for r in results) - min(r.start for r in results)


def summarize_level(level: dict[str, Any], results: Sequence[RequestResult]) -> dict[str, Any]:
    """One ``summary`` entry of the results file."""
    ok = [r for r in results if r.ok]
    duration = benchmark_duration(results)
    tokens = sum(r.output_tokens for r in ok)
    rate = (lambda n: round(n / duration, 3)) if duration and ok else (lambda n: None)
    retokenized = [r for r in ok if r.output_tokens_retokenized is not None]
    return {
        **level,
        "requests": len(ok),
        "errors": len(results) - len(ok),
        "output_tokens_mean": round(tokens / len(ok), 3) if ok else None,
        "ttft_ms": distribution([r.ttft() for r in ok]),
        "itl_ms": distribution([r.itl() for r in ok]),
        "tpot_ms": distribution([r.tpot() for r in ok]),
        "e2e_ms": distribution([r.e2e() for r in ok]),
        "output_tokens_per_s": rate(tokens),
        "requests_per_s": rate(len(ok)),
        "duration_s": round(duration, 3) if duration is not None else None,
        # BPE can merge across token boundaries when the text is re-encoded: shown, not hidden.
        "retokenized_mismatches": sum(r.output_tokens_retokenized != r.output_tokens for r in retokenized),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)
