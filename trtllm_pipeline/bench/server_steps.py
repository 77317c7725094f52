"""The server's own view of a load level (torch runtime): its step and generated-token counters on the metrics
port, read before and after the level. Beside the client's inter-token latency it says which side set the pace:
a served ITL well above the server's milliseconds per step is delivery (the responses' path to the client), an
ITL that equals it is the engine loop itself (slowed, for instance, by waiting on its sends)."""

from __future__ import annotations

import re

STEPS = "trtllm_pipeline_runtime_steps_total"
TOKENS = "trtllm_pipeline_generated_tokens_total"


def read_counters(url: str | None) -> dict[str, float] | None:
    """The two counters at ``url`` (``http://HOST:PORT/metrics``); None where they cannot be read (no server
    there, or a runtime without them, such as TensorRT-LLM's)."""
    if url is None:
        return None
    import requests

    try:
        text = requests.get(url, timeout=5).text
    except requests.RequestException:
        return None
    found = {}
    for name in (STEPS, TOKENS):
        values = re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
        if values:
            found[name] = sum(float(v) for v in values)
    return found if STEPS in found else None


def between(before: dict[str, float] | None, after: dict[str, float] | None, seconds: float) -> dict | None:
    """Steps, wall milliseconds per step (idle gaps included) and tokens per step over ``seconds``."""
    if not before or not after or seconds <= 0:
        return None
    steps = after[STEPS] - before[STEPS]
    if steps <= 0:
        return None
    tokens = after.get(TOKENS, 0.0) - before.get(TOKENS, 0.0)
    return {"steps": int(steps), "ms_per_step": round(1e3 * seconds / steps, 3),
            "tokens_per_step": round(tokens / steps, 2)}


def metrics_url(host: str, port: int) -> str:
    """Where a server bound to ``host`` is read from this machine (a wildcard address: over loopback)."""
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}/metrics"
