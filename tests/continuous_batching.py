"""Continuous batching as the runtime tests drive it: a new request joins every step while earlier ones decode, each
leaving on its own, so batches change size step by step. Imported by in-process tests and the interpreter scripts
alike (no side effects at import)."""

from __future__ import annotations


def staggered(rt, prompts, params) -> list[list[int]]:
    """Each prompt's generated tokens, prompt i submitted before the i-th step."""
    out: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    pending = list(range(len(prompts)))
    while pending or rt.has_work():
        if pending:
            i = pending.pop(0)
            rt.submit(i, prompts[i], params)
        for event in rt.step():
            out[event.request_id] += event.token_ids
    return [out[i] for i in range(len(prompts))]
