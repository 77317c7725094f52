"""``tensorrt_llm_bls``'s share of a request's time to first token, on Triton's metrics port (issue 30).

Beside Triton's own queue time for the model (``nv_inference_queue_duration_us``), the engine's TTFT (from the
request's arrival at the engine model) and the client's TTFT, these say where a loaded server's requests wait in
front of the engine: Triton's queue, the BLS taking and tokenizing the request and sending it on the engine's socket
(``submit``), the engine's listener taking it from there (the engine's ``trtllm_pipeline_direct_wait_seconds_total``),
or the first token's way back (the rest of ``first``). On an H100 at 64
streams (2026-12-06) clients waited up to 1.4 s for a first token the engine made in 26 ms on average; nothing then
said where. Counters of seconds, summed, with a count: a reader takes their change over a load level and divides.
"""

from __future__ import annotations

import threading

FAMILIES = {
    "requests": ("trtllm_pipeline_bls_requests_total", "requests tensorrt_llm_bls took from Triton (execute)"),
    "submit": ("trtllm_pipeline_bls_submit_seconds_total",
               "from execute() taking a request to its sending to the engine model (checked, tokenized, sent), summed"),
    "first": ("trtllm_pipeline_bls_first_response_seconds_total",
              "from execute() taking a request to its first response handed to Triton, summed"),
}


class BlsTimes:
    """The BLS's counters; a Python backend without custom metrics (or a stand-in without them) counts nothing.
    Three calls to Triton a request: not batched (a step's token responses are what costs, not these)."""

    def __init__(self, pb_utils, model_name: str):
        self._families, self._metrics = {}, {}  # a family must outlive its metrics
        # One update at a time: two request threads incrementing at once aborted tritonserver itself (Triton 2.51:
        # "boost::interprocess::lock_exception" in the Python backend, 8 streams on this project's CPU machine).
        self._lock = threading.Lock()
        try:
            for key, (name, description) in FAMILIES.items():
                family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.COUNTER)
                self._families[key] = family
                self._metrics[key] = family.Metric(labels={"model": model_name})
        except Exception:  # no custom metrics here (an older backend): the request path must not fail for them
            self._metrics = {}

    def took(self) -> None:
        self._add("requests", 1.0)

    def submitted(self, seconds: float) -> None:
        self._add("submit", seconds)

    def first_response(self, seconds: float) -> None:
        self._add("first", seconds)

    def _add(self, key: str, value: float) -> None:
        metric = self._metrics.get(key)
        if metric is not None:
            try:
                with self._lock:
                    metric.increment(value)
            except Exception:  # a metric lost with the server going down: the answer matters more
                pass
