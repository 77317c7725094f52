"""triton/workers: the BLS's kept threads. Every submitted piece of work runs, at once, however many are running
(a request's stream holds its thread to its end: work never waits for a thread), on threads started at load while
any is idle."""

from __future__ import annotations

import threading
import time

from trtllm_pipeline.triton.workers import Workers


def test_work_beyond_the_started_threads_runs_at_once_and_threads_are_reused():
    workers = Workers(started=4, name="test")
    release, running = threading.Event(), threading.Semaphore(0)

    def hold():
        running.release()
        release.wait(10)

    for _ in range(10):  # more than started: each must run now, not after another ends
        workers.submit(hold)
    for _ in range(10):
        assert running.acquire(timeout=10), "a submitted piece of work did not start while the others held theirs"
    assert workers.threads == 10
    release.set()
    wait_idle(workers)

    done = threading.Semaphore(0)
    for _ in range(3):  # once they are idle, later work takes them: no thread started
        for _ in range(10):
            workers.submit(done.release)
        for _ in range(10):
            assert done.acquire(timeout=10)
        wait_idle(workers)
    assert workers.threads == 10


def test_work_that_raises_leaves_its_thread_working():
    workers = Workers(started=1, name="test")
    done = threading.Event()

    def fail():
        raise RuntimeError("the work's own error")

    workers.submit(fail)
    wait_idle(workers)
    workers.submit(done.set)
    assert done.wait(10) and workers.threads == 1


def wait_idle(workers: Workers) -> None:
    """Until every thread waits for work (a thread counts itself idle just after its work returns)."""
    deadline = time.monotonic() + 10
    while workers.idle < workers.threads:
        assert time.monotonic() < deadline, (workers.idle, workers.threads)
        time.sleep(0.01)
