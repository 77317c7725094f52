"""The engine's metrics, vLLM's set under our own prefix, on Triton's metrics port (Python-backend custom metrics).

Names follow vLLM's conventions (``vllm:num_requests_running``, ``..._total`` counters, histograms in
seconds, a ``model_name`` label), prefixed ``trtllm_pipeline:``, so a vLLM dashboard carries over by a
change of prefix. Triton 2.51's Python backend has counters, gauges and histograms (``buckets``,
``observe``), so everything goes through Triton's own ``/metrics``, beside its ``nv_*`` metrics, with no
endpoint of ours. Every value is a number about requests, never their text: labels are the model name
and an outcome.

The request timings are the engine's view: from the request's arrival at the engine model (after
tokenization) to its first token (TTFT), between its first and last token per token (TPOT), and to its
end (end-to-end). The scheduler's figures come from ``Runtime.stats()``: gauges are set, and
cumulative counts (prefix-cache lookups, preemptions) are turned into counter increments; a key the
runtime reports that is not named in ``STATS`` is exported as a gauge of its own name.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

log = logging.getLogger(__name__)

PREFIX = "trtllm_pipeline:"

# Runtime.stats() key -> (kind, name after the prefix, help). Counters: the runtime reports totals since load.
STATS = {
    "requests_running": ("GAUGE", "num_requests_running", "requests in the engine's batch (prefilling or decoding)"),
    "requests_waiting": ("GAUGE", "num_requests_waiting", "requests queued for a place in the batch"),
    "kv_cache_usage": ("GAUGE", "kv_cache_usage_perc", "fraction of the KV cache's blocks in use (1 = full)"),
    "prefix_cache_queries": ("COUNTER", "prefix_cache_queries_total", "prompt tokens looked up in the prefix cache"),
    "prefix_cache_hits": ("COUNTER", "prefix_cache_hits_total", "prompt tokens found in the prefix cache"),
    "preemptions": ("COUNTER", "num_preemptions_total", "requests preempted to free KV-cache blocks"),
    "steps_chained": ("COUNTER", "engine_steps_chained_total",
                      "decode steps launched on the previous step's tokens still on the device (torch runtime)"),
    "eager_tokens": ("COUNTER", "engine_eager_tokens_total", "tokens run through the eager model: on a GPU, prefill "
                     "chunks with no room on the fast path (torch runtime)"),
    "fast_prefill_chunks": ("COUNTER", "engine_fast_prefill_chunks_total",
                            "prefill chunks run as rows of a CUDA-graph step (torch runtime)"),
    "graph_prefills": ("COUNTER", "engine_graph_prefills_total",
                       "prompts' first prefill chunks run from a CUDA graph (torch runtime)"),
    "eager_seconds": ("COUNTER", "engine_eager_seconds_total",
                      "host seconds in eager forwards, their sampling's wait for the device included (torch runtime)"),
    "spec_decode_draft_tokens": ("COUNTER", "spec_decode_num_draft_tokens_total", "tokens proposed by the drafter"),
    "spec_decode_accepted_tokens": ("COUNTER", "spec_decode_num_accepted_tokens_total",
                                    "drafted tokens the target model accepted"),
    "spec_decode_verify_rows": ("COUNTER", "spec_decode_num_verify_rows_total",
                                "rows verified (a request's decode token and its drafts in one step)"),
    "spec_decode_acceptance_length": ("GAUGE", "spec_decode_acceptance_length",
                                      "mean tokens a verified row emitted since load (1 + accepted / rows)"),
}
COUNTERS = {
    "prompt": ("prompt_tokens_total", "prompt tokens of the requests the engine admitted"),
    "generation": ("generation_tokens_total", "tokens the engine generated"),
}
# How a request ended: finished (its end token or max_tokens), stopped (a stop string), aborted (its client
# cancelled or went away, or a stop request), failed (an error inside the engine, for it alone or for all).
OUTCOMES = ("finished", "stopped", "aborted", "failed")
OUTCOME = ("request_outcome_total", "requests that ended, by outcome")
_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
HISTOGRAMS = {
    "ttft": ("time_to_first_token_seconds", "from the request's arrival at the engine to its first token",
             (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)),
    "tpot": ("time_per_output_token_seconds", "per request: (last token - first token) / (tokens - 1)",
             (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0)),
    "e2e": ("e2e_request_latency_seconds", "from the request's arrival at the engine to its end", _LATENCY),
}


FLUSH_S = 0.1  # how often a busy engine loop hands its metric changes to Triton


class Buffered:
    """A Python-backend metric whose changes wait for ``flush``: every change is an IPC round trip from the stub
    to the server (tens of microseconds), and the engine loop would make several per step, a step being 2-3 ms
    on an H200; batched, they cost that a few times a second."""

    def __init__(self, metric):
        self.metric = metric
        self._lock = threading.Lock()
        self._increment, self._value, self._observed = 0, None, []

    def increment(self, value) -> None:
        with self._lock:
            self._increment += value

    def set(self, value) -> None:
        with self._lock:
            self._value = value

    def observe(self, value) -> None:
        with self._lock:
            self._observed.append(value)

    def flush(self) -> None:
        with self._lock:
            increment, value, observed = self._increment, self._value, self._observed
            self._increment, self._value, self._observed = 0, None, []
        if increment:
            self.metric.increment(increment)
        if value is not None:
            self.metric.set(value)
        for v in observed:
            self.metric.observe(v)


class MetricBatch:
    """The buffered metrics of one engine model, handed to Triton every ``interval_s`` or when forced (the loop
    is idle: whoever reads ``/metrics`` then sees every change within the loop's idle wait)."""

    def __init__(self, interval_s: float = FLUSH_S):
        self.interval_s, self._last = interval_s, 0.0
        self.metrics: list[Buffered] = []
        self._last_ones: list[Buffered] = []

    def wrap(self, metric, last: bool = False) -> Buffered:
        """``last``: flushed after all the others (a gauge that readers wait on, e.g. requests in flight, so that
        when they see it change every count that came before it is there too)."""
        buffered = Buffered(metric)
        (self._last_ones if last else self.metrics).append(buffered)
        return buffered

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        for metric in [*self.metrics, *self._last_ones]:
            metric.flush()


@dataclasses.dataclass
class RequestTimes:
    """One engine request's clock (monotonic seconds) and token count."""

    arrived: float = dataclasses.field(default_factory=time.monotonic)
    first_token: float | None = None
    tokens: int = 0
    ended: bool = False


class EngineMetrics:
    """The metric families, made once at load (a family must outlive its metrics), and the calls the
    engine loop makes; with a ``MetricBatch`` their changes reach Triton when it flushes."""

    def __init__(self, pb_utils, model_name: str, batch: MetricBatch | None = None):
        self.pb, self.labels = pb_utils, {"model_name": model_name}
        self._wrap = batch.wrap if batch is not None else (lambda metric: metric)
        self._families: list = []
        self._stats: dict[str, tuple[str, object]] = {}
        self._last: dict[str, float] = {}
        self.counters = {key: self._metric("COUNTER", name, text) for key, (name, text) in COUNTERS.items()}
        self.outcomes = self._family("COUNTER", *OUTCOME)
        self.outcome = {o: self._wrap(self.outcomes.Metric(labels={**self.labels, "outcome": o})) for o in OUTCOMES}
        self.histograms = {key: self._metric("HISTOGRAM", name, text, buckets=list(buckets))
                           for key, (name, text, buckets) in HISTOGRAMS.items()}

    def _family(self, kind: str, name: str, text: str):
        family = self.pb.MetricFamily(name=PREFIX + name, description=text, kind=getattr(self.pb.MetricFamily, kind))
        self._families.append(family)
        return family

    def _metric(self, kind: str, name: str, text: str, **buckets):
        return self._wrap(self._family(kind, name, text).Metric(labels=self.labels, **buckets))

    # ---- per step -------------------------------------------------------------------------------

    def admitted(self, prompt_tokens: int) -> None:
        self.counters["prompt"].increment(prompt_tokens)

    def generated(self, tokens: int) -> None:
        if tokens:
            self.counters["generation"].increment(tokens)

    def stats(self, values: dict[str, float]) -> None:
        """The runtime's figures: gauges set when they changed, totals as counter increments."""
        for key, value in values.items():
            if self._last.get(key) == value:
                continue
            kind, metric = self._stats.get(key) or self._new_stat(key)
            if kind == "GAUGE":
                metric.set(value)
            elif value > self._last.get(key, 0):
                metric.increment(value - self._last.get(key, 0))
            self._last[key] = value

    def _new_stat(self, key: str):
        kind, name, text = STATS.get(key, ("GAUGE", key, f"Runtime.stats()[{key!r}]"))
        self._stats[key] = kind, self._metric(kind, name, text)
        return self._stats[key]

    # ---- per request ----------------------------------------------------------------------------

    def tokens(self, times: RequestTimes, n: int) -> None:
        if n and times.first_token is None:
            times.first_token = time.monotonic()
            self.histograms["ttft"].observe(times.first_token - times.arrived)
        times.tokens += n

    def ended(self, times: RequestTimes, outcome: str) -> None:
        """Count how the request ended (once); the latencies of those that ran to their end."""
        if times.ended:
            return
        times.ended = True
        self.outcome[outcome].increment(1)
        if outcome not in ("finished", "stopped") or times.first_token is None:
            return
        now = time.monotonic()
        self.histograms["e2e"].observe(now - times.arrived)
        if times.tokens > 1:
            self.histograms["tpot"].observe((now - times.first_token) / (times.tokens - 1))


class NoEngineMetrics:
    """Where the Python backend has no custom metrics (the calls cost nothing)."""

    def admitted(self, prompt_tokens: int) -> None:
        pass

    def generated(self, tokens: int) -> None:
        pass

    def stats(self, values: dict[str, float]) -> None:
        pass

    def tokens(self, times: RequestTimes, n: int) -> None:
        times.tokens += n

    def ended(self, times: RequestTimes, outcome: str) -> None:
        times.ended = True


def engine_metrics(pb_utils, model_name: str, batch: MetricBatch | None = None) -> EngineMetrics | NoEngineMetrics:
    try:
        return EngineMetrics(pb_utils, model_name, batch)
    except Exception as exc:  # a Python backend without custom metrics (or without histograms)
        log.warning("no engine metrics: %s", exc)
        return NoEngineMetrics()


def outcome_of(finish_reason: str | None) -> str:
    """The outcome of a runtime's finish reason (``TokenEvent.finish_reason``)."""
    return {"stop": "stopped", "cancelled": "aborted", "error": "failed"}.get(finish_reason or "", "finished")
