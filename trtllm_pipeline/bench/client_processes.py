"""One load level sent from several client processes, so that the load generator is not what sets the pace.

A client process's streams share one GIL: each response is parsed and timed in Python, and at 64 gRPC streams the
bench's one process was busy 64-82% of its wall time (H100 2026-12-06c, ``client.cpu_share``) while the server made
~12,000 tokens a second. Sent from N processes instead, each runs ``load``'s own loop on its share of the level: a
closed loop's concurrency split as evenly as it goes (every request has the same forced length, so a fixed share of
the jobs each keeps them balanced), an open loop's rate split N ways (N Poisson processes of rate r / N add up to one of
rate r). Processes are spawned (not forked: this one may hold gRPC's threads), connect their clients, and start
together once all are ready; the level's clock starts then. Times are ``time.perf_counter()``, CLOCK_MONOTONIC on
Linux: one clock for every process of the machine, so the requests' times compare across them.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from typing import Callable, Sequence

from trtllm_pipeline.bench.metrics import RequestResult
from trtllm_pipeline.bench.protocols import Endpoint
from trtllm_pipeline.bench.settings import LoadLevel
from trtllm_pipeline.errors import PipelineError, StageFailed

STREAMS_PER_PROCESS = 16  # ``auto``: a process per 16 streams ...
READY_TIMEOUT_S = 120.0  # a spawned process imports the clients and connects them


def auto_processes(level: LoadLevel, jobs: int) -> int:
    """``auto``: one process per ``STREAMS_PER_PROCESS`` streams, at most a quarter of the machine's cores (the server
    runs here too, usually), never more than the jobs; one on a small machine."""
    streams = level.concurrency if level.concurrency is not None else STREAMS_PER_PROCESS * 4
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(-(-streams // STREAMS_PER_PROCESS), cores // 4, jobs))


def shares(level: LoadLevel, jobs: Sequence, processes: int) -> list[tuple[LoadLevel, list[int]]]:
    """Each process's level (its concurrency or rate) and the positions of its jobs, round robin."""
    processes = min(processes, len(jobs), level.concurrency or len(jobs))
    out = []
    for p in range(processes):
        positions = list(range(p, len(jobs), processes))
        if level.concurrency is not None:
            own = LoadLevel(concurrency=level.concurrency // processes + (p < level.concurrency % processes))
        else:
            own = LoadLevel(request_rate=level.request_rate / processes)
        out.append((own, positions))
    return out


def run_split(endpoint: Endpoint, jobs: Sequence, level: LoadLevel, output_tokens: int, *, processes: int,
              seed: int, connect: Callable, send: Callable) -> tuple[list[RequestResult], dict]:
    """The level's results in job order (each with the whole level's key) and the client's CPU over it: the
    processes' seconds summed (``cpu_s``) and the busiest one's share of the wall time (``cpu_share``). Each process
    runs ``connect(endpoint, level, jobs)`` for its clients, then ``send(clients, jobs, level, key, output_tokens,
    seed)`` (``load``'s own; passed in, so that this module does not import the one that imports it)."""
    ctx = multiprocessing.get_context("spawn")
    ready, done, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    parts = shares(level, jobs, processes)
    children = [ctx.Process(target=_child, daemon=True,
                            args=(p, endpoint, [jobs[i] for i in positions], own, level.key, output_tokens,
                                  seed + p, connect, send, ready, done, start))
                for p, (own, positions) in enumerate(parts)]
    for child in children:
        child.start()
    try:
        for _ in children:
            _take(ready, children, READY_TIMEOUT_S, "connecting its clients")
        wall = time.perf_counter()
        start.set()
        outcomes = {}
        for _ in children:
            p, results, cpu_s = _take(done, children, None, "sending its requests")
            outcomes[p] = (results, cpu_s)
        wall = time.perf_counter() - wall
    except BaseException:
        for child in children:  # the others too: one failed, or the user stopped the bench
            child.terminate()
        raise
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.terminate()
    ordered: list[RequestResult | None] = [None] * len(jobs)
    for p, (_, positions) in enumerate(parts):
        for i, result in zip(positions, outcomes[p][0]):
            ordered[i] = result
    cpu = [cpu_s for _, cpu_s in outcomes.values()]
    return ordered, {"processes": len(children), "cpu_s": round(sum(cpu), 3),
                     "cpu_share": round(max(cpu) / wall, 3) if wall > 0 else None}  # type: ignore[return-value]


def _take(channel, children, timeout_s: float | None, doing: str):
    """The next message a child sent, watching that none has died meanwhile; a child's error raised here."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            message = channel.get(timeout=1.0)
            break
        except queue.Empty:
            dead = [c for c in children if not c.is_alive() and c.exitcode not in (0, None)]
            if dead:
                raise StageFailed(f"bench: a client process exited with code {dead[0].exitcode} while {doing}.",
                                  fix="run the level with --client-processes 1 to see its error")
            if deadline is not None and time.monotonic() > deadline:
                raise StageFailed(f"bench: the client processes were not ready in {timeout_s:.0f} s.",
                                  fix="use --client-processes 1 on a machine this loaded")
    if isinstance(message, BaseException):
        raise message
    return message


def _child(p: int, endpoint: Endpoint, jobs, level: LoadLevel, key: dict, output_tokens: int, seed: int,
           connect: Callable, send: Callable, ready, done, start) -> None:
    try:
        clients = connect(endpoint, level, len(jobs))
    except BaseException as exc:  # noqa: BLE001 - the parent raises it, named, instead of waiting
        ready.put(_error(exc))
        return
    ready.put(True)
    start.wait()
    cpu = time.process_time()
    try:
        results = send(clients, jobs, level, key, output_tokens, seed)
    except BaseException as exc:  # noqa: BLE001
        done.put(_error(exc))
        return
    finally:
        for client in clients:
            client.close()
    done.put((p, results, time.process_time() - cpu))


def _error(exc: BaseException) -> BaseException:
    """What the parent raises: a pipeline error as it is (it pickles whole), anything else named."""
    return exc if isinstance(exc, PipelineError) else StageFailed(f"bench: a client process: {type(exc).__name__}: {exc}")
