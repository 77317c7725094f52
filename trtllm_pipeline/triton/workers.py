"""Threads kept for ``tensorrt_llm_bls``'s requests: a request handed over with a queue put, not a thread started.

``threading.Thread.start()`` returns only once the new thread has run (it waits for the thread's first steps, which
need the GIL). In the BLS's stub every running request relays its stream in a thread of its own, so under load
``execute()`` (Triton's one call into the stub for new requests, which must return before the next) waited for the
GIL at every request it started, and a wave of new requests queued in Triton behind it. Triton's queue time for the
BLS on this project's 2-core CPU machine (2026-12-06, tiny model, 128 -> 128 tokens, 192 requests a level, two
server starts each, alternated): a thread started per request 13.6 / 13.5 ms a request at 32 streams and 22.6 / 17.2
at 64; kept threads 7.3 / 10.5 and 9.7 / 18.0 (noisy: the engine, Triton and the client share the two cores). Here a
pool of threads, started at load, takes the work; it grows (a thread started) only when every thread is busy.
(Not ``concurrent.futures.ThreadPoolExecutor``: it starts its threads on submit, in ``execute()``, up to a fixed
count that a request's stream would hold for its whole length, and joins them at the interpreter's exit, where a
stub going down must not wait for streams still relaying.)
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)


class Workers:
    """``submit(fn, *args)`` runs ``fn(*args)`` on a kept thread; ``started`` threads are started at once (daemons:
    a stub that exits does not wait for streams still relaying)."""

    def __init__(self, started: int = 0, name: str = "worker"):
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work, counting those started and not yet waiting
        self._threads = 0
        self._name = name
        for _ in range(started):
            self._start()

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def idle(self) -> int:
        return self._idle

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            short = self._idle == 0
            if not short:
                self._idle -= 1  # this item's thread, taken now: a second submit before it wakes sees it busy
        self._work.put((fn, args))
        if short:  # every thread busy: one more (the rare case, with its wait for the new thread)
            self._start(taken=True)

    def _start(self, taken: bool = False) -> None:
        with self._lock:
            self._threads += 1
            if not taken:
                self._idle += 1
            number = self._threads
        threading.Thread(target=self._run, name=f"{self._name}-{number}", daemon=True).start()

    def _run(self) -> None:
        while True:
            fn, args = self._work.get()
            try:
                fn(*args)
            except Exception:  # the work reports its own errors; one that escapes must not end the thread
                log.exception("a %s's work failed", self._name)
            with self._lock:
                self._idle += 1
            # an idle thread's count is taken by submit() before its put: the next item is this thread's or another
            # idle one's, never left waiting while a thread is idle
