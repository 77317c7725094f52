"""The load generator: closed loop (a fixed number of requests in flight) or open loop (Poisson arrivals).

Every request is streamed and timed by its protocol's client (``protocols``); each one becomes a
``metrics.RequestResult``, a failed one included.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import random
import threading
import time
from typing import Any, Sequence

from trtllm_pipeline.bench.client_processes import run_split
from trtllm_pipeline.bench.metrics import RequestResult
from trtllm_pipeline.bench.protocols import Endpoint, RequestFailed
from trtllm_pipeline.bench.settings import LoadLevel

log = logging.getLogger(__name__)

MAX_OPEN_LOOP_CLIENTS = 256  # connections kept ready for open-loop arrivals


@dataclasses.dataclass(frozen=True)
class Job:
    index: int
    prompt: str
    input_tokens: int


def run_level(endpoint: Endpoint, jobs: Sequence[Job], level: LoadLevel, output_tokens: int, tokenizer,
              *, seed: int = 0, client_cpu: dict | None = None, processes: int = 1) -> list[RequestResult]:
    """Send ``jobs`` at one load level; one RequestResult per job, in job order. ``processes`` > 1: from that many
    client processes (``client_processes``). ``client_cpu``, where given, gets the client's CPU seconds over the load
    and the busiest process's share of the wall time (``cpu_s``, ``cpu_share``, ``processes``): a process's streams
    share one GIL, so a share near 1 says the client itself may have set the pace (late sends, late reads)."""
    if not jobs:
        return []
    if processes > 1:
        results, cpu_use = run_split(endpoint, jobs, level, output_tokens, processes=processes, seed=seed,
                                     connect=connect_clients, send=send)
    else:
        clients = connect_clients(endpoint, level, len(jobs))  # connected before the clock starts
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            results = send(clients, jobs, level, level.key, output_tokens, seed)
        finally:
            for client in clients:
                client.close()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        cpu_use = {"processes": 1, "cpu_s": round(cpu, 3), "cpu_share": round(cpu / wall, 3) if wall > 0 else None}
    if client_cpu is not None:
        client_cpu.update(cpu_use)
    retokenize(results, tokenizer)
    return results


def connect_clients(endpoint: Endpoint, level: LoadLevel, jobs: int) -> list:
    """The level's clients, one per stream it keeps in flight (open loop: up to ``MAX_OPEN_LOOP_CLIENTS``)."""
    width = level.concurrency if level.concurrency is not None else MAX_OPEN_LOOP_CLIENTS
    return [endpoint.client() for _ in range(min(width, jobs))]


def send(clients, jobs: Sequence[Job], level: LoadLevel, key: dict[str, Any], output_tokens: int,
         seed: int) -> list[RequestResult]:
    """``jobs`` through ``clients`` at ``level`` (closed or open loop), each result labelled with ``key``."""
    def execute(client, job: Job) -> RequestResult:
        return execute_request(client, job, key, output_tokens)

    if level.concurrency is not None:
        return _closed_loop(clients, jobs, execute)
    return _open_loop(clients, jobs, execute, level.request_rate, random.Random(seed))


def retokenize(results: Sequence[RequestResult], tokenizer) -> None:
    """Each result's returned text re-encoded (``output_tokens_retokenized``), once the level is over. Inside a
    request's worker it delayed that worker's next request and held the GIL while other requests' streams were
    being timed: at c=64 a wave of finished requests re-encoded 64 x 256 tokens at once, just as the next wave
    started (H100 2026-12-05e: the client's TTFT exceeded the engine's by 98 ms at c=64, 5.5 ms at c=1; how much of
    that was this, the next run says)."""
    for result in results:
        if result.text is not None:
            result.output_tokens_retokenized = len(tokenizer.encode(result.text, add_special_tokens=False))
            result.text = None


def _closed_loop(clients, jobs, execute) -> list[RequestResult]:
    """Each client sends its next request as soon as its previous one has finished."""
    results: list[RequestResult | None] = [None] * len(jobs)
    pending = iter(range(len(jobs)))
    lock = threading.Lock()

    def worker(client) -> None:
        while True:
            with lock:
                i = next(pending, None)
            if i is None:
                return
            results[i] = execute(client, jobs[i])

    _run_threads([threading.Thread(target=worker, args=(c,), daemon=True) for c in clients])
    return results  # type: ignore[return-value]


def _open_loop(clients, jobs, execute, rate: float, rng: random.Random) -> list[RequestResult]:
    """Requests leave at Poisson arrival times (exponential gaps of mean 1/rate), busy server or not."""
    results: list[RequestResult | None] = [None] * len(jobs)
    idle: queue.Queue = queue.Queue()
    for client in clients:
        idle.put(client)
    late = 0

    def send(client, i: int) -> None:
        try:
            results[i] = execute(client, jobs[i])
        finally:
            idle.put(client)

    threads, clock, due = [], time.perf_counter(), 0.0
    for i in range(len(jobs)):
        due += rng.expovariate(rate)
        time.sleep(max(0.0, clock + due - time.perf_counter()))
        client = idle.get()  # waits only when every client is busy
        late += time.perf_counter() - (clock + due) > 0.05
        thread = threading.Thread(target=send, args=(client, i), daemon=True)
        thread.start()
        threads.append(thread)
    _run_threads(threads, started=True)
    if late:
        log.warning("bench: %d of %d open-loop requests left more than 50 ms after their arrival time "
                    "(the load generator could not keep up)", late, len(jobs))
    return results  # type: ignore[return-value]


def _run_threads(threads: list[threading.Thread], started: bool = False) -> None:
    if not started:
        for thread in threads:
            thread.start()
    for thread in threads:
        thread.join()


def execute_request(client, job: Job, level: dict[str, Any], output_tokens: int) -> RequestResult:
    """One timed request; a failure or a wrong output length becomes the record's ``error``."""
    start = time.perf_counter()
    try:
        streamed = client.generate(job.prompt, output_tokens)
    except Exception as exc:  # any failure of one request is data: recorded, counted, not fatal
        error = str(exc) if isinstance(exc, RequestFailed) else f"{type(exc).__name__}: {exc}"
        return RequestResult(level, job.index, start, time.perf_counter(), input_tokens=job.input_tokens, error=error)
    last = streamed.token_times[-1] if streamed.token_times else time.perf_counter()
    result = RequestResult(
        level, job.index, start, max(last, streamed.ended or last),
        token_times=streamed.token_times, output_tokens=streamed.output_tokens, input_tokens=job.input_tokens,
        text=streamed.text,  # re-encoded when the level is over (``retokenize``)
    )
    if result.output_tokens != output_tokens:
        result.error = (f"returned {result.output_tokens} tokens, {output_tokens} were requested "
                        "(min_tokens = max_tokens); the server does not honour the forced length")
    return result
