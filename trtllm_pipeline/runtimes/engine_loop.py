"""The one loop that drives a runtime for whoever serves it: Triton's Python model and ``bench --in-process``.

A runtime is not thread-safe and makes progress only when ``step()`` is called, so one thread owns it and
turns: the host's work between steps (take new requests, drop cancelled ones, admit; ``Host.between_steps``),
one ``step()``, then the host's handling of the step's events (detokenize, stream responses;
``Host.on_events``).

A failure outside any one request's part of a step (a bug, a lost tensor-parallel worker) goes to
``Host.on_failure`` with the loop still running, so new requests get an answer.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol, Sequence

from trtllm_pipeline.runtimes.base import Runtime, TokenEvent

log = logging.getLogger(__name__)


class Host(Protocol):
    def between_steps(self, block: bool) -> None:
        """Take what arrived (waiting up to a moment when ``block``: the runtime is idle) and admit it."""

    def idle(self) -> bool:
        """Nothing waits on the host's side (so the loop may block when the runtime has no work either)."""

    def on_events(self, events: Sequence[TokenEvent]) -> None:
        """One step's events, in the loop's thread."""

    def on_failure(self, exc: Exception) -> None:
        """The loop's last resort: fail what is in flight (each request's own failure never gets here)."""


class EngineLoop:
    def __init__(self, runtime: Runtime, host: Host, *, name: str = "engine-loop"):
        self.runtime, self.host, self.name = runtime, host, name
        self.steps = 0
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def turn(self) -> list[TokenEvent]:
        """One turn: the host's work, a step if there is work, the host's handling of its events."""
        self.host.between_steps(block=not self.runtime.has_work() and self.host.idle())
        if not self.runtime.has_work():
            return []
        events = self.runtime.step()
        self.steps += 1
        self.host.on_events(events)
        return events

    def run(self) -> None:
        """Turn until ``close``; a failure of a turn is the host's to report, and the loop goes on."""
        while not self._closing.is_set():
            try:
                self.turn()
            except Exception as exc:
                log.exception("%s", self.name)
                self.host.on_failure(exc)

    def start(self) -> "EngineLoop":
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop turning (the host's ``between_steps`` must return within a moment when asked to block)."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
