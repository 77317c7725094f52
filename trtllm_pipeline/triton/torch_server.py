"""The torch runtime behind Triton's decoupled ``tensorrt_llm`` model: continuous batching in one thread.

``execute`` only parses requests and queues them (the BLS's come on a socket of their own, ``triton/direct.py``,
and are parsed the same way); the engine loop (``runtimes/engine_loop``, the one
``bench --in-process`` runs too) owns the runtime in one thread: this class is its host, admitting queued
requests between steps and handing each request's new token to the outbox (on a GPU, a thread that sends while
the loop runs the next step). Text is made by a ``TextStream`` per request and the runtime's own event
handling (``Runtime.apply_event``), exactly as in-process ``generate`` makes it, so a streamed request's
pieces concatenate to the non-streamed text; a BLS request that asks for no text and has no stop string keeps its
token ids only (``_TokenIds``: the BLS detokenizes its stream itself).

Streaming sends one response per generated token, like TensorRT-LLM: ``output_ids`` holds that
token and ``output_text`` its exact text piece (often empty while a character or a possible stop
string is incomplete); with ``TRTLLM_PIPELINE_STREAM_COALESCE=1`` on a GPU, tokens generated while a row's
response waits for its turn to be sent join it (``output_ids``/``sequence_length`` then carry several). A
request that ends on its end id gets an empty final response, or, when text was still held back, one last
response with no token and that text.

``generation_logits`` (``return_generation_logits``) are the log-softmax of the logits after the
prompt, computed with ``Runtime.score`` over the vocabulary: only for ``max_tokens`` 1, which is
what scoring answer choices needs.

One request cannot hurt the others: its parameters are checked when it is parsed
(``SamplingParams.check``: an error response naming the field), a request that still fails inside a
step comes back as an ``error`` event for it alone (the runtime retries the step without it), and
the loop's catch-all is only the last resort.

Cancellation, as Triton 2.51 delivers it (see docs/serving.md): a client that disconnects or
cancels a request made *directly* to this model shows as ``request.is_cancelled()``, polled about
once per step; a request made through ``tensorrt_llm_bls`` is stopped by TensorRT-LLM's stop request
(``stop`` true, the same request id), which the BLS sends when its client is gone, and the HTTP
front too for the requests it gave an id. Through the ``ensemble`` Triton passes nothing on; only
the HTTP front's stop request reaches such a request (gRPC clients of the ensemble: nothing).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import queue
import threading
import time
from typing import Any

import numpy as np

from trtllm_pipeline.errors import InputError, PipelineError, UnavailableError
from trtllm_pipeline.runtimes import Runtime, SamplingParams, TextStream
from trtllm_pipeline.runtimes.engine_loop import EngineLoop
from trtllm_pipeline.triton import direct, health, stops
from trtllm_pipeline.triton.contract import BLS_ID_PREFIX, BLS_PARAMETER, STOP_ID_PREFIX
from trtllm_pipeline.triton.engine_metrics import MetricBatch, RequestTimes, engine_metrics, outcome_of
from trtllm_pipeline.triton.tensors import RequestError, per_row, words_from_list

log = logging.getLogger(__name__)


class _TokenIds:
    """A row's tokens where nobody reads its text, in place of its ``TextStream`` (read the same way by
    ``Runtime.apply_event``: no text, never stopped): a BLS request with no stop string. The BLS asks for no
    ``output_text``: it detokenizes the stream itself, with the client's stop strings. The two tokenizer decodes a
    token of a TextStream were ~65% of ``on_events`` (served_host_probe, 64 streams on the direct socket). The one
    difference a response can show: a stream that ends on its end id while its last character is incomplete ends
    with an empty final response, not one of no token carrying that text; the BLS reads both as no token."""

    stopped = False
    text = ""

    def __init__(self):
        self.token_ids: list[int] = []

    def push(self, token_ids) -> str:
        self.token_ids.extend(token_ids)
        return ""

    def flush(self) -> str:
        return ""


@dataclasses.dataclass
class _Row:
    key: tuple[int, int]
    prompt: list[int]
    params: SamplingParams
    text: TextStream | _TokenIds
    reason: str | None = None
    times: RequestTimes = dataclasses.field(default_factory=RequestTimes)  # from its arrival, for the metrics


@dataclasses.dataclass
class _Job:
    sender: Any
    rows: list[_Row]
    streaming: bool
    exclude_input: bool
    pad_id: int
    logits: np.ndarray | None = None
    wants_logits: bool = False
    request: Any = None  # Triton's request: is_cancelled() and its request id
    request_id: str = ""
    outputs: frozenset[str] = frozenset()  # the outputs the request asked for (empty: all)
    socket_wait: float | None = None  # a direct request: seconds from the BLS's send to its parse here
    bls_wait: float | None = None  # and from the BLS's execute() to its send (both stamped in the header by the BLS)

    def __post_init__(self):
        asked = lambda name: not self.outputs or name in self.outputs  # noqa: E731
        self.asked_ids, self.asked_length = asked("output_ids"), asked("sequence_length")
        # A streaming response on the direct socket that carries token ids alone (direct.Tokens): no text asked
        # for, no logits (the BLS's requests, which detokenize the stream themselves)
        self.tokens_only = (_direct(self.sender) and self.logits is None and not self.wants_logits
                            and not asked("output_text"))


@dataclasses.dataclass
class _Stop:
    """TensorRT-LLM's stop request: cancel the requests with this request id."""

    sender: Any  # None: a datagram (triton/stops.py), answered by nobody
    request_id: str


@dataclasses.dataclass
class _Gone:
    """A response to this job could not be sent: its client went away (reported by the outbox's thread)."""

    job: _Job


@dataclasses.dataclass
class _Chunk:
    """A streaming row's tokens and text not yet sent: what one response will carry."""

    ids: list[int]
    text: str
    final: bool


class _Outbox:
    """Sends responses in the order given, from a thread of its own where ``threaded``. Each send is a synchronous
    IPC round trip from the stub to the server: threaded, the sends overlap the engine loop's next step instead of
    delaying it (the stub releases the GIL), and the loop stays at most one step ahead of them (``mark``/``wait``),
    so generation never outruns delivery. On the H200 that bounds a served batch: 64 streams, one response each a
    step, gave 23.9 ms between tokens where the step takes 3.7 ms in-process.

    ``coalesce`` (``TRTLLM_PIPELINE_STREAM_COALESCE=1``; off until measured on the H200, where its first run at
    the 7B shape did not finish a c=8 load) lets the loop run free: a streaming row's tokens that come while its
    previous response waits its turn join that response (``stream``; one response then carries several tokens, as
    vLLM's output queue coalesces them). A send that fails (the client is gone) comes back to the loop as
    ``on_gone(job)``. Unthreaded (CPU), every response is sent at once, one token each."""

    def __init__(self, on_gone, threaded: bool, coalesce: bool = False):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._coalesce = coalesce
        self._on_gone = on_gone
        self._lock = threading.Lock()
        self._chunks: dict[tuple[int, int], _Chunk] = {}  # (id of the job, row): waiting in the queue
        self._sent = threading.Condition()
        self._queued = self._done = 0
        self._awaited = 0  # the mark ``wait`` waits for: the sending thread wakes it only once that is reached
        self._thread = None
        if threaded:
            self._thread = threading.Thread(target=self._run, name="torch-runtime-outbox", daemon=True)
            self._thread.start()

    @property
    def coalesces(self) -> bool:
        return self._thread is not None and self._coalesce

    def put(self, sender, response, flags: int, job: "_Job | None" = None) -> None:
        with self._sent:
            self._queued += 1
        if self._thread is None:  # sent here and now
            self._deliver(sender, response, flags, job)
        else:
            self._queue.put(("send", sender, response, flags, job))

    def stream(self, job: "_Job", row: int, ids: list[int], text: str, final: bool, build, final_flag: int) -> None:
        """A streaming row's new tokens and text; ``build(job, ids, text)`` makes the response (in the sending
        thread, when threaded: the loop does not wait for it). Joined to the row's response not sent yet, if any."""
        if self._thread is None or not self._coalesce:
            self.put(job.sender, build(job, ids, text) if ids or text else None, final_flag if final else 0, job)
            return
        key = (id(job), row)
        with self._lock:
            chunk = self._chunks.get(key)
            if chunk is not None:  # still queued: these tokens go with it
                chunk.ids.extend(ids)
                chunk.text += text
                chunk.final = chunk.final or final
                return
            self._chunks[key] = _Chunk(list(ids), text, final)
        self._queue.put(("chunk", key, job, build, final_flag))

    def mark(self) -> int:
        """How many responses were queued so far (``wait(mark)`` returns once they are all sent)."""
        with self._sent:
            return self._queued

    def wait(self, mark: int, timeout: float = 30.0) -> None:
        with self._sent:
            self._awaited = mark
            self._sent.wait_for(lambda: self._done >= mark, timeout=timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued, then stop."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if item[0] == "chunk":  # a streaming row's tokens: all that came until now, in one response
                    _, key, job, build, final_flag = item
                    with self._lock:
                        chunk = self._chunks.pop(key)
                    response = build(job, chunk.ids, chunk.text) if chunk.ids or chunk.text else None
                    self._deliver(job.sender, response, final_flag if chunk.final else 0, job)
                else:
                    self._deliver(*item[1:])
            except Exception:  # never the thread's end: every later response would wait for ever
                log.exception("sending a response")
                if item[0] == "chunk":
                    self._on_gone(item[2])

    def _deliver(self, sender, response, flags: int, job: "_Job | None") -> None:
        try:
            if response is None:
                sender.send(flags=flags)
            else:
                sender.send(response, flags=flags)
        except Exception as exc:  # the client went away
            log.info("a response could not be sent: %s", exc)
            if job is not None:
                self._on_gone(job)
        with self._sent:
            self._done += 1
            # not at every send: a waiting loop would wake (and take the GIL) once a response to see it is not done
            if self._done >= self._awaited:
                self._sent.notify_all()


class _Metrics:
    """The runtime loop on Triton's metrics port (Python-backend custom metrics): steps, tokens,
    requests in the runtime, and requests cancelled or failed; batched (``MetricBatch``). What the cancellation
    tests and the soak read; the engine's metrics for operators are ``engine_metrics``."""

    FAMILIES = {
        "steps": ("COUNTER", "trtllm_pipeline_runtime_steps_total", "steps run by the torch runtime"),
        "tokens": ("COUNTER", "trtllm_pipeline_generated_tokens_total", "tokens generated by the torch runtime"),
        "active": ("GAUGE", "trtllm_pipeline_requests_active", "requests queued or running in the torch runtime"),
        "cancelled": ("COUNTER", "trtllm_pipeline_requests_cancelled_total",
                      "requests dropped because their client cancelled or went away"),
        "failed": ("COUNTER", "trtllm_pipeline_requests_failed_total",
                   "requests that failed inside a step, alone (the others went on)"),
        "cancel_step": ("GAUGE", "trtllm_pipeline_last_cancel_step",
                        "the steps count when the last cancelled request was dropped (its slot freed)"),
        "cancel_time": ("GAUGE", "trtllm_pipeline_last_cancel_unix_seconds",
                        "when the last cancelled request was dropped, in seconds since the epoch"),
        "direct_requests": ("COUNTER", "trtllm_pipeline_direct_requests_total",
                            "requests that came on the direct socket (tensorrt_llm_bls's)"),
        "direct_wait": ("COUNTER", "trtllm_pipeline_direct_wait_seconds_total",
                        "from tensorrt_llm_bls sending a request on the direct socket to this model queueing it "
                        "(accepted, read, parsed), summed"),
        "direct_bls": ("COUNTER", "trtllm_pipeline_direct_bls_seconds_total",
                       "in tensorrt_llm_bls, from its execute() taking a request to its sending on the direct socket "
                       "(checked, tokenized), summed"),
    }

    UNBATCHED = ("steps", "cancel_step", "cancel_time")

    def __init__(self, pb_utils, batch: MetricBatch):
        self._families, self._metrics = {}, {}  # a family must outlive its metrics
        for key, (kind, name, description) in self.FAMILIES.items():
            family = pb_utils.MetricFamily(name=name, description=description, kind=getattr(pb_utils.MetricFamily, kind))
            self._families[key] = family
            metric = family.Metric(labels={"model": "tensorrt_llm"})
            # The step count and the moment of the last cancellation stay exact (one IPC call a step): the soak
            # measures steps-to-free against them; the rest reaches Triton batched.
            self._metrics[key] = metric if key in self.UNBATCHED else batch.wrap(metric, last=key == "active")
        self._active = -1
        self.steps = 0

    def add(self, key: str, value: float = 1) -> None:
        if key == "steps":
            self.steps += value
        elif key == "cancelled":  # the slot is free now: when, in steps and in time (set before the count moves)
            self._metrics["cancel_step"].set(self.steps)
            self._metrics["cancel_time"].set(time.time())
        if value:
            self._metrics[key].increment(value)

    def active(self, value: int) -> None:
        if value != self._active:
            self._metrics["active"].set(value)
            self._active = value


class _NoMetrics:
    def add(self, key: str, value: int = 1) -> None:
        pass

    def active(self, value: int) -> None:
        pass


class TorchModelServer:
    def __init__(self, runtime: Runtime, pb_utils, *, exclude_input_in_output: bool, stop_address: str | None = None,
                 model_name: str = "tensorrt_llm", repository: str | None = None, direct_address: str | None = None):
        self.runtime = runtime
        self.repository, self._lost = repository, False
        self.pb = pb_utils
        self.metric_batch = MetricBatch()  # metric changes reach Triton ~10 times a second, not several per step
        self._published_active = 0
        try:
            self.metrics = _Metrics(pb_utils, self.metric_batch)
        except Exception as exc:  # a Python backend without custom metrics
            log.info("no custom metrics: %s", exc)
            self.metrics = _NoMetrics()
        self.engine = engine_metrics(pb_utils, model_name, self.metric_batch)
        self.exclude_input_default = exclude_input_in_output
        self._incoming: queue.Queue = queue.Queue()
        # A thread for the sends where the steps run on a GPU (the host is free while the GPU computes); on the CPU
        # the same cores would do both, so the loop sends itself.
        self.outbox = _Outbox(lambda job: self._incoming.put(_Gone(job)),
                              threaded=getattr(getattr(runtime, "device", None), "type", "cpu") == "cuda"
                              or os.environ.get("TRTLLM_PIPELINE_OUTBOX_THREAD") == "1",  # (tests: as on a GPU)
                              coalesce=os.environ.get("TRTLLM_PIPELINE_STREAM_COALESCE", "0") == "1")
        self._last_step_mark = 0
        self._waiting: list[_Job] = []  # parsed, not yet submitted (a logits job waits for an idle runtime)
        self._jobs: dict[int, _Job] = {}  # submitted, by job number
        self._numbers = itertools.count()
        self._polled = self._polled_queue = 0.0
        self._poll_turn = 0  # where the next round of cancellation polls starts among the running requests
        self.loop = EngineLoop(runtime, self, name="torch-runtime-loop").start()
        self._stops = None
        if stop_address is not None:  # stop requests by datagram (triton/stops.py), besides Triton's own
            try:
                self._stops = stops.Listener(stop_address, lambda rid: self._incoming.put(_Stop(None, rid)))
            except OSError as exc:
                log.warning("no stop side channel (%s): stop requests come through Triton only", exc)
        self._direct = None
        if direct_address is not None:  # the BLS's requests on a socket of their own (triton/direct.py)
            try:
                self._direct = direct.Listener(direct_address, self._enqueue)
            except OSError as exc:
                log.warning("no direct socket for the BLS (%s): its requests come through Triton", exc)

    # ---- called by Triton's thread ---------------------------------------------------------------

    def enqueue(self, request) -> None:
        self._enqueue(request, request.get_response_sender())

    def _enqueue(self, request, sender) -> None:
        """Parse and queue a request: Triton's (``enqueue``) or one on the direct socket (its listener's thread)."""
        try:
            job = self._parse(request, sender)
            if isinstance(job, _Job) and isinstance(request, direct.Request) and "sent_at" in request.header:
                sent = float(request.header["sent_at"])  # (monotonic: one clock for the machine's processes)
                job.socket_wait = max(0.0, time.monotonic() - sent)
                if "bls_taken_at" in request.header:
                    job.bls_wait = max(0.0, sent - float(request.header["bls_taken_at"]))
            if isinstance(job, _Job) and job.streaming and _from_bls(request) and not _direct(job.sender):
                # An empty first response at once: the BLS's exec() holds one of its model instance's Python-backend
                # threads (32) until a request's first response, so requests queued here would hold them all and
                # leave none to send the running requests' tokens: the server stalls (seen at 64 streams, 8 rows).
                # Only for the BLS's requests: the ensemble's postprocessing cannot take an empty response.
                self.outbox.put(sender, self.pb.InferenceResponse(output_tensors=[]), 0)
            self._incoming.put(job)
        except RequestError as exc:
            self._fail(sender, str(exc), invalid=True)
        except Exception as exc:  # a bug in parsing: this request's error, not the server's
            log.exception("parsing a request")
            self._fail(sender, f"cannot parse the request: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        if self._stops is not None:
            self._stops.close()
        if self._direct is not None:
            self._direct.close()
        self._incoming.put(None)  # wakes a loop waiting for work
        self.loop.close(timeout=30)
        self.outbox.close()
        self.runtime.close()

    # ---- parsing ---------------------------------------------------------------------------------

    def _input(self, request, name: str) -> np.ndarray | None:
        if isinstance(request, direct.Request):
            return request.input(name)
        tensor = self.pb.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    def _parse(self, request, sender) -> "_Job | _Stop":
        request_id = request.request_id() or ""
        stop = self._input(request, "stop")
        if stop is not None and stop.size and bool(stop.reshape(-1)[0]):
            if not request_id:
                raise RequestError("stop: a stop request needs the request id of the request it stops")
            return _Stop(sender, request_id)
        ids = self._input(request, "input_ids")
        if ids is None:
            raise RequestError("input_ids is missing")
        ids = ids.reshape(ids.shape[0], -1)
        batch = ids.shape[0]
        lengths = per_row(self._input(request, "input_lengths"), batch, ids.shape[1])
        value = {name: per_row(self._input(request, name), batch, default) for name, default in (
            ("request_output_len", None), ("end_id", None), ("pad_id", None), ("min_tokens", 0),
            ("temperature", None), ("runtime_top_k", 0), ("runtime_top_p", 0.0), ("seed", None), ("streaming", False),
            ("exclude_input_in_output", self.exclude_input_default), ("return_generation_logits", False))}
        streaming, wants_logits = bool(value["streaming"][0]), bool(value["return_generation_logits"][0])
        if (streaming or wants_logits) and batch > 1:
            raise RequestError(f"streaming and return_generation_logits take one prompt per request; this one "
                               f"has {batch}")
        words = {name: self._input(request, name) for name in ("stop_words_list", "bad_words_list")}
        outputs = frozenset(_requested_outputs(request))
        # Nobody reads the text of a BLS request that asks for none: the BLS detokenizes the stream itself
        untold = bool(outputs) and "output_text" not in outputs and _from_bls(request)
        number = next(self._numbers)
        rows = []
        for i in range(batch):
            row_words = {name: words_from_list(self.runtime.tokenizer, None if w is None else w[i])
                         for name, w in words.items()}
            params = self._sampling({name: v[i] for name, v in value.items()}, row_words)
            if wants_logits and params.max_tokens != 1:
                raise RequestError("return_generation_logits needs max_tokens 1 on the torch runtime "
                                   "(the logits of the step after the prompt)")
            prompt = [int(t) for t in ids[i, : int(lengths[i])]]
            text = (_TokenIds() if untold and not params.stop_words  # (a stop string is cut here: its text is read)
                    else TextStream(self.runtime.tokenizer, params.stop_words))
            rows.append(_Row((number, i), prompt, params, text))
        pad_id = value["pad_id"][0] if value["pad_id"][0] is not None else self.runtime.tokenizer.eos_token_id
        return _Job(sender, rows, streaming, bool(value["exclude_input_in_output"][0]), int(pad_id),
                    wants_logits=wants_logits, request=request, request_id=request_id, outputs=outputs)

    @staticmethod
    def _sampling(v: dict[str, Any], words: dict[str, tuple[str, ...]]) -> SamplingParams:
        """One batch row's tensor values as SamplingParams, with TensorRT-LLM's meanings; a value that
        could poison a step is a RequestError naming its client input."""
        if v["request_output_len"] is None or v["request_output_len"] < 1:
            raise RequestError(f"max_tokens (request_output_len) must be at least 1, got {v['request_output_len']}")
        top_k, top_p, temperature = int(v["runtime_top_k"]), float(v["runtime_top_p"]), v["temperature"]
        if temperature is not None and not (np.isfinite(temperature) and temperature >= 0):
            raise RequestError(f"temperature must be a finite number, > 0 to sample or exactly 0 for greedy, "
                               f"got {temperature}")
        if not (np.isfinite(top_p) and 0.0 <= top_p <= 1.0):
            raise RequestError(f"top_p must be in (0, 1] (0: off), got {top_p}")
        # Greedy unless top_k or top_p asks for sampling, then at temperature 1 unless given; top_p 0 is off.
        sampling = bool(top_k or top_p)
        params = SamplingParams(
            max_tokens=int(v["request_output_len"]), min_tokens=int(v["min_tokens"]),
            temperature=(1.0 if temperature is None else float(temperature)) if sampling else 0.0,
            top_k=top_k, top_p=top_p if 0.0 < top_p < 1.0 else 1.0,
            seed=None if v["seed"] is None else int(v["seed"]),
            end_id=None if v["end_id"] is None else int(v["end_id"]),
            stop_words=words["stop_words_list"], bad_words=words["bad_words_list"],
        )
        try:
            return params.check()
        except InputError as exc:
            raise RequestError(_client_names(exc.message)) from None

    # ---- the engine loop's host (runtimes/engine_loop.py), in the loop's thread -----------------------------

    def between_steps(self, block: bool) -> None:
        self._take_incoming(block)
        self._drop_cancelled()
        self._admit()
        self._publish()
        self._check_lost()

    def idle(self) -> bool:
        return not self._waiting

    def on_events(self, events) -> None:
        self._check_lost()  # before any request hears of it: the fronts then answer 503 already
        if not self.outbox.coalesces:  # one response per token: the previous step's went out while this step ran
            self.outbox.wait(self._last_step_mark)
        for event in events:
            self._on_event(event)
        tokens = sum(len(e.token_ids) for e in events)
        self.metrics.add("steps")
        self.metrics.add("tokens", tokens)
        self.engine.generated(tokens)
        self._publish()
        self._last_step_mark = self.outbox.mark()  # this step's responses: sent while the next step runs

    def _publish(self) -> None:
        """Hand the metric changes to Triton: at once when the number of requests in flight changed (a request
        came or went; readers wait on that gauge, which is flushed last) or nothing is left to run, else every
        ``MetricBatch.interval_s``: not the several IPC round trips per step that each change costs."""
        active = len(self._jobs) + len(self._waiting)
        now = active != self._published_active or not self.runtime.has_work()
        self.engine.stats(self._stats())
        self.metrics.active(active)
        self.metric_batch.flush(force=now)
        self._published_active = active

    def on_failure(self, exc: Exception) -> None:  # a request's own failure never gets here: fail what was in flight
        self._fail_all(f"internal error in the torch runtime: {type(exc).__name__}: {exc}")

    def _stats(self) -> dict[str, float]:
        """The runtime's figures, with the requests parsed here and not yet submitted counted as waiting."""
        stats = {"requests_running": sum(len(j.rows) for j in self._jobs.values()), **self.runtime.stats()}
        stats["requests_waiting"] = stats.get("requests_waiting", 0) + sum(len(j.rows) for j in self._waiting)
        return stats

    def _ended(self, job: _Job, outcome: str) -> None:
        for row in job.rows:
            self.engine.ended(row.times, outcome)

    def _check_lost(self) -> None:
        """Once the runtime can run nothing (a tensor-parallel worker died), say so where the fronts and the
        BLS look (``health``): readiness turns 503 and requests waiting on this model end."""
        if self._lost or (why := self.runtime.unavailable()) is None:
            return
        self._lost = True
        if self.repository is not None:
            health.mark_lost(self.repository, why)

    def _take_incoming(self, block: bool) -> None:
        try:
            item = self._incoming.get(timeout=0.5) if block else self._incoming.get_nowait()
            while True:
                if isinstance(item, _Stop):
                    self._stop(item)
                elif isinstance(item, _Gone):
                    self._gone(item.job)
                elif item is not None:
                    if item.socket_wait is not None:  # counted here, in the loop's thread, as every metric is
                        self.metrics.add("direct_requests")
                        self.metrics.add("direct_wait", item.socket_wait)
                        self.metrics.add("direct_bls", item.bls_wait or 0.0)
                    self._waiting.append(item)
                item = self._incoming.get_nowait()
        except queue.Empty:
            return

    def _stop(self, stop: _Stop) -> None:
        """Cancel every request with the stop request's id (each ends with an empty final response)."""
        for job in [j for j in self._waiting if j.request_id == stop.request_id]:
            self._waiting.remove(job)
            self.metrics.add("cancelled")
            self._ended(job, "aborted")
            self._send(job, None, final=True)
        for number, job in list(self._jobs.items()):
            if job.request_id == stop.request_id:
                self._end(number, job)
        if stop.sender is not None:  # None: by datagram, nobody to answer
            self.outbox.put(stop.sender, None, self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _gone(self, job: _Job) -> None:
        """A response to ``job`` could not be sent: stop generating for it, if it still runs. Its client went away,
        which the cancelled count says as a stop request's ``_end`` does (whichever of the two comes first: a client
        that closes its stream makes both)."""
        number = job.rows[0].key[0]
        if self._jobs.get(number) is not job:
            return
        self.metrics.add("cancelled")
        self._ended(job, "aborted")
        for row in job.rows:
            self.runtime.cancel(row.key)
        self._jobs.pop(number, None)

    def _end(self, number: int, job: _Job) -> None:
        """Drop a request its client no longer wants (cancelled, gone, or a stop request)."""
        self.metrics.add("cancelled")
        self._ended(job, "aborted")
        for row in job.rows:
            self.runtime.cancel(row.key)
        self._jobs.pop(number, None)
        self._send(job, None, final=True)

    def _admit(self) -> None:
        """Submit waiting jobs in arrival order; one that wants logits first waits for an idle runtime."""
        while self._waiting:
            job = self._waiting[0]
            if job.wants_logits and self.runtime.has_work():
                return
            self._waiting.pop(0)
            number = job.rows[0].key[0]
            try:
                if job.wants_logits:
                    job.logits = self._first_step_logprobs(job.rows[0].prompt)
                for row in job.rows:
                    self.runtime.submit(row.key, row.prompt, row.params)
            except Exception as exc:  # this job's fault or not, it is this job's error
                self._ended(job, "failed")
                for row in job.rows:
                    self.runtime.cancel(row.key)
                invalid = isinstance(exc, (PipelineError, ValueError))
                if not invalid:
                    log.exception("submitting a request")
                self._fail(job.sender, getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}",
                           invalid=isinstance(exc, InputError), unavailable=isinstance(exc, UnavailableError))
                continue
            self.engine.admitted(sum(len(row.prompt) for row in job.rows))
            self._jobs[number] = job

    def _first_step_logprobs(self, prompt: list[int]) -> np.ndarray:
        return np.array(self.runtime.next_token_logprobs(prompt), dtype=np.float32).reshape(1, 1, 1, -1)

    def _drop_cancelled(self) -> None:
        """Requests whose client went away or cancelled them (direct calls to this model): running ones polled in
        turn, each at most every POLL_S and all together at most POLLS_PER_S times a second (is_cancelled() is a
        synchronous IPC round trip: 64 streams polled every 10 ms were ~15-30 a step, the served loop's largest host
        cost once an IPC costs what it did on the H200: served_host_probe --send-us 30 --poll-us 30), queued ones
        every QUEUED_POLL_S. Requests of the BLS and the HTTP front are stopped by stop requests instead: Triton
        never flags them, so they are not polled."""
        now = time.monotonic()
        if now - self._polled < POLL_S:
            return
        queued = now - self._polled_queue >= QUEUED_POLL_S
        due = int((now - self._polled) * POLLS_PER_S)
        self._polled = now
        if queued:
            self._polled_queue = now
        running = [(number, job) for number, job in self._jobs.items() if _polled(job)]
        if running:
            start = self._poll_turn % len(running)
            turn = (running[start:] + running[:start])[: max(1, due)]
            self._poll_turn = start + len(turn)
            for number, job in turn:
                if _cancelled(job):
                    self._end(number, job)
        if queued:
            for job in [j for j in self._waiting if _polled(j) and _cancelled(j)]:
                self._waiting.remove(job)
                self.metrics.add("cancelled")
                self._ended(job, "aborted")
                self._send(job, None, final=True)

    def _on_event(self, event) -> None:
        number, index = event.request_id
        job = self._jobs.get(number)
        if job is None:
            return
        if event.finish_reason == "error":  # this request failed inside a step; the others went on
            self.metrics.add("failed")
            self._ended(job, "failed")
            for row in job.rows:
                self.runtime.cancel(row.key)
            self._jobs.pop(number, None)
            if (why := self.runtime.unavailable()) is not None:  # not this request's failure: the engine is gone
                self._fail(job.sender, why, unavailable=True)
            else:
                self._fail(job.sender, f"internal error in the torch runtime, for this request only: {event.error}")
            return
        row = job.rows[index]
        reasons: dict = {}
        try:
            piece = self.runtime.apply_event(event, {event.request_id: row.text}, reasons)
        except Exception as exc:  # detokenizing this request's token failed: its error alone
            log.exception("detokenizing a response")
            self._ended(job, "failed")
            for r in job.rows:
                self.runtime.cancel(r.key)
            self._jobs.pop(number, None)
            self._fail(job.sender, f"internal error making the text: {type(exc).__name__}: {exc}")
            return
        row.reason = reasons.get(event.request_id)
        self.engine.tokens(row.times, len(event.token_ids))
        if row.reason is not None:
            self.engine.ended(row.times, outcome_of(row.reason))
        if job.streaming:
            final = row.reason is not None
            if event.token_ids or piece or final:
                self.outbox.stream(job, index, list(event.token_ids), piece, final, self._stream_response,
                                   self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        elif all(r.reason is not None for r in job.rows):
            self._send(job, self._response(job, [self._output_ids(job, r) for r in job.rows],
                                           [self._output_text(job, r) for r in job.rows]), final=True)
        if row.reason is not None and all(r.reason is not None for r in job.rows):
            self._jobs.pop(number, None)

    # ---- responses -------------------------------------------------------------------------------

    def _output_ids(self, job: _Job, row: _Row) -> list[int]:
        return row.text.token_ids if job.exclude_input else row.prompt + row.text.token_ids

    def _output_text(self, job: _Job, row: _Row) -> str:
        if job.exclude_input:
            return row.text.text
        return self.runtime.tokenizer.decode(row.prompt, skip_special_tokens=True) + row.text.text

    def _response(self, job: _Job, ids: list[list[int]], pieces: list[str]):
        """The rows' outputs, only those the request asked for (the stub's pruning of the rest crashed it: BLS
        requests, H200), each made only if asked: a streaming row's response is made at a step's rate (64 streams:
        served_host_probe's on_events -20%)."""
        pb, wanted = self.pb, job.outputs

        def asked(name: str) -> bool:
            return not wanted or name in wanted

        outputs = {}
        if asked("output_ids"):
            width = max(len(x) for x in ids)
            outputs["output_ids"] = np.array([[x + [job.pad_id] * (width - len(x))] for x in ids], dtype=np.int32)
        if asked("sequence_length"):
            outputs["sequence_length"] = np.array([[len(x)] for x in ids], dtype=np.int32)
        if asked("output_text"):
            outputs["output_text"] = np.array([[p.encode("utf-8")] for p in pieces], dtype=object)
        if job.logits is not None and asked("generation_logits"):
            outputs["generation_logits"] = job.logits
        if _direct(job.sender):
            return direct.Response(outputs)
        return pb.InferenceResponse(output_tensors=[pb.Tensor(name, value) for name, value in outputs.items()])

    def _stream_response(self, job: _Job, ids: list[int], piece: str):
        if job.tokens_only:  # the BLS's: its frame made without numpy or JSON (direct.Tokens, the same bytes)
            return direct.Tokens(ids, job.asked_ids, job.asked_length)
        return self._response(job, [ids], [piece])

    def _send(self, job: _Job, response, *, final: bool) -> None:
        """Queued for the outbox's thread; one that fails ends the job there (``_gone``)."""
        self.outbox.put(job.sender, response, self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0, job)

    def _fail(self, sender, message: str, *, invalid: bool = False, unavailable: bool = False) -> None:
        """An error response; ``invalid``: the request's fault (INVALID_ARG); ``unavailable``: the engine can run
        nothing now (UNAVAILABLE: HTTP 503); else the server's fault (INTERNAL)."""
        error = self.pb.TritonError
        name = "INVALID_ARG" if invalid else "UNAVAILABLE" if unavailable else "INTERNAL"
        if _direct(sender):
            self.outbox.put(sender, direct.Response(error=message, code=name),
                            self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        code = getattr(error, name, None)
        self.outbox.put(sender, self.pb.InferenceResponse(output_tensors=[], error=error(message) if code is None
                                                          else error(message, code)),
                        self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _fail_all(self, message: str) -> None:
        """The loop itself failed: every request in flight gets the error (their state is unknown)."""
        for job in [*self._jobs.values(), *self._waiting]:
            self._ended(job, "failed")
            for row in job.rows:
                self.runtime.cancel(row.key)
            try:
                self._fail(job.sender, message)
            except Exception:  # already answered or gone
                pass
        self._jobs.clear()
        self._waiting.clear()


POLL_S = 0.01
POLLS_PER_S = 500  # running requests' is_cancelled() calls, all together (64 streams: each every ~0.13 s)
QUEUED_POLL_S = 0.25


def _requested_outputs(request) -> list[str]:
    """The output names a request asked for. Sending others makes the Python-backend stub prune them from the
    response itself, which crashed the stub (segmentation fault in ``send``, Triton 2.51's Python 3.12 stub) for
    requests made by the BLS, which asks for three of the four outputs."""
    try:
        return list(request.requested_output_names())
    except Exception:  # a Python backend without it: send everything, as before
        return []


def _polled(job: _Job) -> bool:
    return (job.request is not None and not isinstance(job.request, direct.Request)
            and not job.request_id.startswith((STOP_ID_PREFIX, BLS_ID_PREFIX)))


def _cancelled(job: _Job) -> bool:
    try:
        return bool(job.request.is_cancelled())
    except Exception:  # already answered: nothing left to cancel
        return False


# SamplingParams' field names, as a client of the ensemble names them.
_CLIENT_NAMES = {"seed": "random_seed", "max_tokens": "max_tokens"}


def _client_names(message: str) -> str:
    for field, client in _CLIENT_NAMES.items():
        if message.startswith(f"{field} ") and field != client:
            return f"{client} ({field}) {message[len(field) + 1:]}"
    return message


def _direct(sender) -> bool:
    """Whether the request answered by ``sender`` came on the direct socket (its responses are ``direct.Response``)."""
    return isinstance(sender, direct.Sender)


def _from_bls(request) -> bool:
    """Whether ``request`` came from the BLS model: marked by its ``BLS_PARAMETER`` (a front's id passes through the
    BLS unchanged), or by the BLS's own id prefix (where request parameters are not read)."""
    try:
        if json.loads(request.parameters() or "{}").get(BLS_PARAMETER):
            return True
    except (AttributeError, TypeError, ValueError):
        pass
    return (request.request_id() or "").startswith(BLS_ID_PREFIX)
