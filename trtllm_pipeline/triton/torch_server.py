"""The torch runtime behind Triton's decoupled ``tensorrt_llm`` model: continuous batching in one thread.

``execute`` only parses requests and queues them; one loop thread owns the runtime (it is not
thread-safe), admits queued requests between steps, runs ``step()`` and sends each request's new
token as it comes. Text is made by a ``TextStream`` per request and the runtime's own event
handling (``Runtime.apply_event``), exactly as in-process ``generate`` makes it, so a streamed request's
pieces concatenate to the non-streamed text.

Streaming sends one response per generated token, like TensorRT-LLM: ``output_ids`` holds that
token and ``output_text`` its exact text piece (often empty while a character or a possible stop
string is incomplete). A request that ends on its end id gets an empty final response, or, when
text was still held back, one last response with no token and that text.

``generation_logits`` (``return_generation_logits``) are the log-softmax of the logits after the
prompt, computed with ``Runtime.score`` over the vocabulary: only for ``max_tokens`` 1, which is
what scoring answer choices needs.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import threading
from typing import Any

import numpy as np

from trtllm_pipeline.errors import PipelineError
from trtllm_pipeline.runtimes import Runtime, SamplingParams, TextStream
from trtllm_pipeline.triton.tensors import RequestError, per_row, words_from_list

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Row:
    key: tuple[int, int]
    prompt: list[int]
    params: SamplingParams
    text: TextStream
    reason: str | None = None


@dataclasses.dataclass
class _Job:
    sender: Any
    rows: list[_Row]
    streaming: bool
    exclude_input: bool
    pad_id: int
    logits: np.ndarray | None = None
    wants_logits: bool = False


class TorchModelServer:
    def __init__(self, runtime: Runtime, pb_utils, *, exclude_input_in_output: bool):
        self.runtime = runtime
        self.pb = pb_utils
        self.exclude_input_default = exclude_input_in_output
        self._incoming: queue.Queue = queue.Queue()
        self._waiting: list[_Job] = []  # parsed, not yet submitted (a logits job waits for an idle runtime)
        self._jobs: dict[int, _Job] = {}  # submitted, by job number
        self._numbers = itertools.count()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="torch-runtime-loop", daemon=True)
        self._thread.start()

    # ---- called by Triton's thread ---------------------------------------------------------------

    def enqueue(self, request) -> None:
        sender = request.get_response_sender()
        try:
            self._incoming.put(self._parse(request, sender))
        except RequestError as exc:
            self._fail(sender, str(exc))

    def close(self) -> None:
        self._closing.set()
        self._incoming.put(None)
        self._thread.join(timeout=30)
        self.runtime.close()

    # ---- parsing ---------------------------------------------------------------------------------

    def _input(self, request, name: str) -> np.ndarray | None:
        tensor = self.pb.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    def _parse(self, request, sender) -> _Job:
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
            rows.append(_Row((number, i), prompt, params, TextStream(self.runtime.tokenizer, params.stop_words)))
        pad_id = value["pad_id"][0] if value["pad_id"][0] is not None else self.runtime.tokenizer.eos_token_id
        return _Job(sender, rows, streaming, bool(value["exclude_input_in_output"][0]), int(pad_id),
                    wants_logits=wants_logits)

    @staticmethod
    def _sampling(v: dict[str, Any], words: dict[str, tuple[str, ...]]) -> SamplingParams:
        """One batch row's tensor values as SamplingParams, with TensorRT-LLM's meanings."""
        if v["request_output_len"] is None or v["request_output_len"] < 1:
            raise RequestError(f"request_output_len must be at least 1, got {v['request_output_len']}")
        top_k, top_p, temperature = int(v["runtime_top_k"]), float(v["runtime_top_p"]), v["temperature"]
        # Greedy unless top_k or top_p asks for sampling, then at temperature 1 unless given; top_p 0 is off.
        sampling = bool(top_k or top_p)
        return SamplingParams(
            max_tokens=int(v["request_output_len"]), min_tokens=int(v["min_tokens"]),
            temperature=(1.0 if temperature is None else float(temperature)) if sampling else 0.0,
            top_k=top_k, top_p=top_p if 0.0 < top_p < 1.0 else 1.0,
            seed=None if v["seed"] is None else int(v["seed"]),
            end_id=None if v["end_id"] is None else int(v["end_id"]),
            stop_words=words["stop_words_list"], bad_words=words["bad_words_list"],
        )

    # ---- the loop --------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closing.is_set():
            try:
                self._take_incoming(block=not self.runtime.has_work() and not self._waiting)
                self._drop_cancelled()
                self._admit()
                if self.runtime.has_work():
                    for event in self.runtime.step():
                        self._on_event(event)
            except Exception as exc:  # keep serving: fail what was in flight, log the cause
                log.exception("torch runtime loop")
                self._fail_all(f"internal error in the torch runtime: {type(exc).__name__}: {exc}")

    def _take_incoming(self, block: bool) -> None:
        try:
            job = self._incoming.get(timeout=0.5) if block else self._incoming.get_nowait()
            while True:
                if job is not None:
                    self._waiting.append(job)
                job = self._incoming.get_nowait()
        except queue.Empty:
            return

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
            except (PipelineError, ValueError) as exc:
                for row in job.rows:
                    self.runtime.cancel(row.key)
                self._fail(job.sender, getattr(exc, "message", str(exc)))
                continue
            self._jobs[number] = job

    def _first_step_logprobs(self, prompt: list[int]) -> np.ndarray:
        return np.array(self.runtime.next_token_logprobs(prompt), dtype=np.float32).reshape(1, 1, 1, -1)

    def _drop_cancelled(self) -> None:
        for number, job in list(self._jobs.items()):
            if job.sender.is_cancelled():
                for row in job.rows:
                    self.runtime.cancel(row.key)
                del self._jobs[number]
                self._send(job, None, final=True)

    def _on_event(self, event) -> None:
        number, index = event.request_id
        job = self._jobs.get(number)
        if job is None:
            return
        row = job.rows[index]
        reasons: dict = {}
        piece = self.runtime.apply_event(event, {event.request_id: row.text}, reasons)
        row.reason = reasons.get(event.request_id)
        if job.streaming:
            final = row.reason is not None
            if event.token_ids or piece:
                self._send(job, self._response(job, [list(event.token_ids)], [piece]), final=final)
            elif final:
                self._send(job, None, final=True)
        elif all(r.reason is not None for r in job.rows):
            self._send(job, self._response(job, [self._output_ids(job, r) for r in job.rows],
                                           [self._output_text(job, r) for r in job.rows]), final=True)
        if all(r.reason is not None for r in job.rows):
            self._jobs.pop(number, None)

    # ---- responses -------------------------------------------------------------------------------

    def _output_ids(self, job: _Job, row: _Row) -> list[int]:
        return row.text.token_ids if job.exclude_input else row.prompt + row.text.token_ids

    def _output_text(self, job: _Job, row: _Row) -> str:
        if job.exclude_input:
            return row.text.text
        return self.runtime.tokenizer.decode(row.prompt, skip_special_tokens=True) + row.text.text

    def _response(self, job: _Job, ids: list[list[int]], pieces: list[str]):
        width = max(len(x) for x in ids)
        tokens = np.array([[x + [job.pad_id] * (width - len(x))] for x in ids], dtype=np.int32)
        outputs = [
            self.pb.Tensor("output_ids", tokens),
            self.pb.Tensor("sequence_length", np.array([[len(x)] for x in ids], dtype=np.int32)),
            self.pb.Tensor("output_text", np.array([[p.encode("utf-8")] for p in pieces], dtype=object)),
        ]
        if job.logits is not None:
            outputs.append(self.pb.Tensor("generation_logits", job.logits))
        return self.pb.InferenceResponse(output_tensors=outputs)

    def _send(self, job: _Job, response, *, final: bool) -> None:
        flags = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        try:
            if response is None:
                job.sender.send(flags=flags)
            else:
                job.sender.send(response, flags=flags)
        except Exception as exc:  # the client went away: stop generating for it
            log.info("dropping a request whose response could not be sent: %s", exc)
            for row in job.rows:
                self.runtime.cancel(row.key)
            self._jobs.pop(job.rows[0].key[0], None)

    def _fail(self, sender, message: str) -> None:
        sender.send(self.pb.InferenceResponse(output_tensors=[], error=self.pb.TritonError(message)),
                    flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _fail_all(self, message: str) -> None:
        for job in [*self._jobs.values(), *self._waiting]:
            for row in job.rows:
                self.runtime.cancel(row.key)
            try:
                self._fail(job.sender, message)
            except Exception:  # already answered or gone
                pass
        self._jobs.clear()
        self._waiting.clear()
