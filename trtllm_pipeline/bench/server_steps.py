"""The server's own view of a load level (torch runtime): its step and generated-token counters on the metrics
port, read before and after the level. Beside the client's inter-token latency it says which side set the pace:
a served ITL well above the server's milliseconds per step is delivery (the responses' path to the client), an
ITL that equals it is the engine loop itself (slowed, for instance, by waiting on its sends). Where the runtime
exports them (``Runtime.stats()``, ``triton/engine_metrics.STATS``), also how many of its steps were chained on the
previous one (the host off the GPU's path) and what went through the eager model: prefill tokens with no room on the
fast path and the host seconds they took, the two things that set a loaded server's pace beside the decode step."""

from __future__ import annotations

import re
import time

from trtllm_pipeline.endpoints import client_host, host_port

STEPS = "trtllm_pipeline_runtime_steps_total"
TOKENS = "trtllm_pipeline_generated_tokens_total"
# requests in the runtime: flushed after every other count (``MetricBatch``), so that a reading where it is 0 holds
# every count made before the loop went idle. The token count reaches Triton batched, the step count at once: read
# as the last response landed, a level's tokens came short of its steps (0.88 tokens a step at c=1 in a CPU suite)
ACTIVE = "trtllm_pipeline_requests_active"
SETTLE_S = 2.0  # how long a reading waits for the loop to go idle (requests of other clients may keep it busy)
# the engine's step totals (torch runtime), by the key ``between`` reports their change under
ENGINE = {"chained_steps": "trtllm_pipeline:engine_steps_chained_total",
          "eager_tokens": "trtllm_pipeline:engine_eager_tokens_total",
          "fast_prefill_chunks": "trtllm_pipeline:engine_fast_prefill_chunks_total",
          "eager_seconds": "trtllm_pipeline:engine_eager_seconds_total"}
# the engine's TTFT histogram (arrival at the engine model to the first token): its mean over a level, beside the
# client's TTFT, splits the time to first token between the engine and the path in front of it (BLS, network)
TTFT_SUM, TTFT_COUNT = "trtllm_pipeline:time_to_first_token_seconds_sum", "trtllm_pipeline:time_to_first_token_seconds_count"
# In front of the engine (tensorrt_llm_bls, the model clients use): Triton's queue time for it (microseconds, summed
# over its successful requests), and what the engine counts of the requests that came on its socket, stamped by the
# BLS in their headers: the BLS's execute() to its send, and the send to the engine queueing the request (its
# listener's accept, read and parse); each a mean over the level's requests, by the key ``between`` reports it
DIRECT_REQUESTS = "trtllm_pipeline_direct_requests_total"
DIRECT = {"bls_submit_ms_mean": "trtllm_pipeline_direct_bls_seconds_total",
          "engine_socket_ms_mean": "trtllm_pipeline_direct_wait_seconds_total"}
TRITON_QUEUE_US = 'nv_inference_queue_duration_us{model="tensorrt_llm_bls",version="1"}'
TRITON_SUCCESS = 'nv_inference_request_success{model="tensorrt_llm_bls",version="1"}'


def read_counters(url: str | None, settle_s: float = SETTLE_S) -> dict[str, float] | None:
    """The step and token counters at ``url`` (``http://HOST:PORT/metrics``), and the engine's step totals where
    it has them, once the runtime runs no request (at most ``settle_s`` later: its batched counts are all there);
    None where the first cannot be read (no server there, or a runtime without them, such as TensorRT-LLM's)."""
    deadline = time.monotonic() + settle_s
    while True:
        found = _read(url)
        if found is None or found.get(ACTIVE, 0.0) == 0 or time.monotonic() >= deadline:
            return found
        time.sleep(0.02)


def _read(url: str | None) -> dict[str, float] | None:
    if url is None:
        return None
    import requests

    try:
        text = requests.get(url, timeout=5).text
    except requests.RequestException:
        return None
    found = {}
    for name in (STEPS, TOKENS, ACTIVE, *ENGINE.values(), TTFT_SUM, TTFT_COUNT, DIRECT_REQUESTS, *DIRECT.values()):
        values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
        if values:
            found[name] = sum(float(v) for v in values)
    for name in (TRITON_QUEUE_US, TRITON_SUCCESS):  # one model's sample, labels as Triton prints them
        values = re.findall(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        if values:
            found[name] = float(values[0])
    return found if STEPS in found else None


def between(before: dict[str, float] | None, after: dict[str, float] | None, seconds: float) -> dict | None:
    """Steps, wall milliseconds per step (idle gaps included) and tokens per step over ``seconds``; the engine's
    totals' changes where both readings have them (``ENGINE``), the eager forwards' share of ``seconds``, and the
    engine's mean time to first token over the requests that got theirs in between."""
    if not before or not after or seconds <= 0:
        return None
    steps = after[STEPS] - before[STEPS]
    if steps <= 0:
        return None
    tokens = after.get(TOKENS, 0.0) - before.get(TOKENS, 0.0)
    found = {"steps": int(steps), "ms_per_step": round(1e3 * seconds / steps, 3),
             "tokens_per_step": round(tokens / steps, 2)}
    for key, name in ENGINE.items():
        if name in before and name in after:
            found[key] = round(after[name] - before[name], 3)
    if "eager_seconds" in found:  # the share of the level's wall time the loop spent in eager forwards
        found["eager_share"] = round(found["eager_seconds"] / seconds, 3)
    firsts = after.get(TTFT_COUNT, 0.0) - before.get(TTFT_COUNT, 0.0)
    if firsts > 0 and TTFT_SUM in after:
        found["engine_ttft_ms_mean"] = round(1e3 * (after[TTFT_SUM] - before.get(TTFT_SUM, 0.0)) / firsts, 3)
    found.update(_front(before, after))
    return found


def _front(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Means over the level's requests in front of the engine (``DIRECT``, Triton's queue for the BLS), where the
    server has them: beside the engine's TTFT they say where a client's wait for its first token went."""
    found = {}
    direct = after.get(DIRECT_REQUESTS, 0.0) - before.get(DIRECT_REQUESTS, 0.0)
    for key, name in DIRECT.items():
        if direct > 0 and name in after:
            found[key] = round(1e3 * (after[name] - before.get(name, 0.0)) / direct, 3)
    succeeded = after.get(TRITON_SUCCESS, 0.0) - before.get(TRITON_SUCCESS, 0.0)
    if succeeded > 0 and TRITON_QUEUE_US in after:
        found["triton_queue_ms_mean"] = round((after[TRITON_QUEUE_US] - before.get(TRITON_QUEUE_US, 0.0))
                                              / succeeded / 1e3, 3)
    return found


def metrics_url(host: str, port: int) -> str:
    """Where a server bound to ``host`` is read from this machine (a wildcard address: over loopback)."""
    return f"http://{host_port(client_host(host), port)}/metrics"
