"""Triton ``tensorrt_llm_bls``: the ensemble's pipeline driven from Python (business logic scripting).

Same client contract as ``ensemble``. It tokenizes a short prompt itself (``preprocessing``'s own code,
``Preprocessor``: the same ids, limits and errors, without a round trip through another model's stub: Triton
counted 4.9 ms a request there for 0.17 ms of tokenizing; TTFT at concurrency 1, tiny model on this project's
2-core CPU machine, 16.3-16.8 -> 14.9-15.4 ms) and has ``preprocessing`` tokenize a long
one (``LOCAL_TOKENIZE_BYTES``; the tokenizer holds the GIL: here a 570 KB prompt takes 0.35 s, which would stall
every stream this model relays), then calls ``tensorrt_llm`` (the torch engine model on its own socket,
``triton/direct.py``: no round trips through Triton per token; TensorRT-LLM's as a gRPC stream from this server,
``triton/loopback.py``) and, as it sees a request's whole stream, detokenizes with a ``TextStream``: streamed text is
exact for either runtime (TensorRT-LLM's C++ backend included), stop strings are cut as text. One prompt
per request; each request runs on a thread of its own (kept: ``triton/workers``) so that requests overlap. The
tokenizer (``trtllm_pipeline.tokenizer``, no transformers in the stub) loads on the first request: a deployment used
through the ensemble does not pay for it at startup.

This is the model clients are pointed at (``contract.FRONT_MODEL``), because it stops what its
client no longer wants. In Triton 2.51 a client that disconnects or cancels shows as
``is_cancelled()`` on this model's request, but not on the requests it made (a BLS response
iterator cannot be cancelled in this version), and the ensemble propagates nothing at all. So the
engine request always streams (one response per token, whatever the client asked), this model
checks its own request after each response, and when the client is gone it sends TensorRT-LLM's
stop request (``stop`` true, the same request id) to the engine model: generation ends within a
step or two and the engine's slot is free. With ``TRTLLM_PIPELINE_STREAM_COALESCE=1``, engine responses that
arrive while one is being handled are answered together, with one response; every response says how many
tokens it carries (``num_output_tokens``). Required inputs and the front door's size limits are checked first
(``contract.RequestLimits``), before preprocessing tokenizes anything.
"""

try:  # the serving process's module path, before any package import (runtimes/torch_engine/backend.py)
    import serving_sys_path  # noqa: F401
except ImportError:  # a server this project did not start (TensorRT-LLM's container)
    pass

import collections
import functools
import json
import os
import queue
import threading
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_pipeline.runtimes import TextStream
from trtllm_pipeline.triton import direct, health, loopback, stops
from trtllm_pipeline.triton.contract import (BLS_ID_PREFIX, BLS_PARAMETER, CLIENT_INPUTS, LOCAL_TOKENIZE_BYTES,
                                             NUM_OUTPUT_TOKENS, PREPROCESSING_INPUTS, PREPROCESSING_OUTPUTS,
                                             REQUIRED_INPUTS, STOP_ID_PREFIX, RequestLimits)
from trtllm_pipeline.triton.tensors import Preprocessor, RequestError, per_row, string_parameters, texts
from trtllm_pipeline.triton.workers import Workers

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
ENGINE_OUTPUTS = ["output_ids", "sequence_length", "generation_logits"]


_MORE = object()  # watched(): the engine's stream goes on
# preprocessing's inputs as Preprocessor's arguments
_PREPROCESSOR_ARGS = {"QUERY": "queries", "REQUEST_OUTPUT_LEN": "max_tokens", "STOP_WORDS_DICT": "stop_words",
                      "BAD_WORDS_DICT": "bad_words", "END_ID": "end_id", "PAD_ID": "pad_id"}
WATCH_S = 0.1  # how often a request waiting on the engine looks whether the engine was lost (a stat)
# How often a request asks Triton whether its client cancelled it (a synchronous round trip to the server): at most
# this often, not at every engine response (one a step, ~3 ms on the GPU)
CANCEL_POLL_S = 0.01
LOST_WAIT_S = 1.0  # after the engine's socket closed early: how long the engine's process may take to show as gone
WORKERS_AT_LOAD = 128  # threads kept from load: one a request (two through Triton: its reader) for 64 streams and more
RECV_BYTES = 1 << 16  # one read of the engine's socket: every frame that has arrived, up to this
# Triton 2.51's Python backend drops a finished BLS response iterator's entry from its map on the stub's own cleanup
# thread, without the GIL (pb_stub.cc, SendCleanupId). Where the Python side had already let go of the iterator, that
# frees it there, and with it its responses' numpy arrays, Python objects: the heap corrupts. On this project's CPU
# machine every server on this path died so ("malloc(): unaligned fastbin chunk detected", 3 of 3 within 80-250
# requests of 16-32 tokens). So each iterator is kept here until LINGER_S after its stream ended: the cleanup has run by
# then, and the last reference, ours, goes in a Python thread, with the GIL.
# The same stub can also deadlock on this path, a lock cycle between a thread whose exec() returned, its response
# thread and a thread reading another request's responses; nothing here can prevent it (docs/serving.md). So exec()
# reads an engine's stream only where the gRPC loopback (triton/loopback.py) cannot be had; health.lost reports this
# stub hung once its heartbeat (health.mark_stub) stops.
LINGER_S = 2.0
_lingering: collections.deque = collections.deque()
_lingering_lock = threading.Lock()


class Cancelled(Exception):
    """The client went away or cancelled the request."""


class EngineError(Exception):
    """The engine model's error response, with its Triton error code (UNAVAILABLE: the engine is lost)."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class _Item(NamedTuple):
    """One engine response, whichever way it came: its error, or its token ids (``length`` of them; none for an
    empty response) and generation logits."""

    error: EngineError | None = None
    ids: np.ndarray | None = None
    length: int = 0
    logits: np.ndarray | None = None


class TritonPythonModel:
    def initialize(self, args):
        params = string_parameters(json.loads(args["model_config"]))
        self.tokenizer_dir = params["tokenizer_dir"]
        self.engine_model = params["tensorrt_llm_model_name"]
        self.preprocessing_model = params["preprocessing_model_name"]
        self.limits = RequestLimits(**json.loads(params["limits"]))
        # a repository written before the BLS tokenized (no end_id here): every prompt goes to preprocessing
        self.ids = (int(params["end_id"]), int(params["pad_id"])) if "end_id" in params else None
        self.repository = Path(args["model_repository"]).parent
        health.mark_stub(self.repository, args["model_name"])  # its crash then shows (health.lost)
        self.stop_address = stops.address(self.repository)
        # Engine responses that came while one was handled answered together (TRTLLM_PIPELINE_STREAM_COALESCE=1,
        # as the torch engine model's outbox reads it); off: one response out per response in, as TensorRT-LLM.
        self.coalesce = os.environ.get("TRTLLM_PIPELINE_STREAM_COALESCE", "0") == "1"
        # The torch engine model's own socket (triton/direct.py); off where nothing listens (TensorRT-LLM's backend)
        self.direct_address = direct.address(self.repository)
        self.direct = os.environ.get("TRTLLM_PIPELINE_BLS_DIRECT", "1") != "0"
        # Where the engine model has no socket: gRPC streams to this server (triton/loopback.py), else exec()
        self.loopback, how = loopback.connect()
        logger = getattr(pb_utils, "Logger", None)
        if logger is not None:
            logger.log_info(f"tensorrt_llm_bls: requests to an engine model without a socket go by "
                            f"{how if self.loopback is not None else 'exec() (' + how + ')'}")
        # each request's thread (and through Triton its stream's reader) kept, not started per request
        self.workers = Workers(started=WORKERS_AT_LOAD, name="tensorrt_llm_bls")

    @functools.cached_property
    def tokenizer(self):
        from trtllm_pipeline.tokenizer import Tokenizer

        return Tokenizer(self.tokenizer_dir)

    @functools.cached_property
    def preprocessor(self):
        return Preprocessor(self.tokenizer, end_id=self.ids[0], pad_id=self.ids[1], limits=self.limits)

    def preprocess(self, pre_inputs):
        """preprocessing's outputs for ``pre_inputs`` (its input names): computed here for a short prompt, else by
        the preprocessing model."""
        if self.ids is not None and sum(len(v) for v in pre_inputs["QUERY"].reshape(-1)) <= LOCAL_TOKENIZE_BYTES:
            return self.preprocessor(**{_PREPROCESSOR_ARGS[k]: v for k, v in pre_inputs.items()})
        response = self.request(self.preprocessing_model, list(PREPROCESSING_OUTPUTS), pre_inputs).exec()
        if response.has_error():
            raise RequestError(response.error().message())
        return {name: pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in PREPROCESSING_OUTPUTS}

    def execute(self, requests):
        for request in requests:
            taken = time.monotonic()  # the engine counts from here to its socket (``engine_stream``'s header)
            inputs = {t.name(): t.as_numpy() for t in request.inputs()}
            sender = request.get_response_sender()
            self.workers.submit(self.run, request, inputs, sender, taken)
        return None

    def run(self, request, inputs, sender, taken):
        try:
            self.generate(request, inputs, sender, taken)
        except Cancelled:
            try:
                sender.send(flags=FINAL)
            except Exception:  # the client is gone: nobody to tell
                pass
        except Exception as exc:  # an answer for the client, whatever failed
            code = (exc.code if isinstance(exc, EngineError) else pb_utils.TritonError.INVALID_ARG
                    if isinstance(exc, RequestError) else pb_utils.TritonError.INTERNAL)
            try:
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc), code)),
                            flags=FINAL)
            except Exception:
                pass

    def generate(self, request, inputs, sender, taken):
        for name in REQUIRED_INPUTS:  # Triton 2.51 lets a request lacking one through in some cases
            if name not in inputs:
                raise RequestError(f"{name} is missing; it is required")
        if inputs["text_input"].shape[0] != 1:
            raise RequestError(f"tensorrt_llm_bls takes one prompt per request; this one has "
                               f"{inputs['text_input'].shape[0]}")
        texts(inputs["text_input"], "text_input", self.limits)  # its size, before anything else
        pre_inputs = {PREPROCESSING_INPUTS[k]: v for k, v in inputs.items() if k in PREPROCESSING_INPUTS}
        engine = {PREPROCESSING_OUTPUTS[name]: value for name, value in self.preprocess(pre_inputs).items()}
        engine.update({trt: inputs[name] for name, _, _, trt in CLIENT_INPUTS if trt and name in inputs})
        engine["exclude_input_in_output"] = np.array([[True]])  # the prompt's text is added here, if asked
        engine["streaming"] = np.array([[True]])  # a response per token: a point to notice a cancellation
        streaming = per_row(inputs.get("stream"), 1, False)[0]
        exclude = per_row(inputs.get("exclude_input_in_output"), 1, True)[0]
        stop_words = texts(inputs["stop_words"].reshape(-1, 1), "stop_words") if "stop_words" in inputs else []
        text = TextStream(self.tokenizer, stop_words)
        prompt = engine["input_ids"][0, : int(engine["input_lengths"].reshape(-1)[0])].tolist()
        prefix = "" if exclude else self.tokenizer.decode(prompt, skip_special_tokens=True)
        logits = None
        max_tokens = int(engine["request_output_len"].reshape(-1)[0])
        flushed = False
        # The HTTP or OpenAI front's id when it gave one (it stops the request by it when its client goes away), else ours.
        given = request.request_id() or ""
        request_id = given if given.startswith(STOP_ID_PREFIX) else f"{BLS_ID_PREFIX}{uuid.uuid4().hex}"
        wanted = _requested_outputs(request)
        responses = self.engine_stream(engine, request_id, taken)
        polled = 0.0
        for batch in responses:  # every engine response that came since the last look: one response out
            if time.monotonic() - polled >= CANCEL_POLL_S:
                polled = time.monotonic()
                if request.is_cancelled():
                    self.stop(request_id)
                    for _ in responses:  # to the engine's final response
                        pass
                    raise Cancelled
            pieces, count, fresh_logits = [], 0, None
            for item in batch:
                if item.error is not None:
                    raise item.error
                if item.ids is None or item.length == 0:  # an empty response, or one without a token (the end id's)
                    continue
                pieces.append(text.push(item.ids[: item.length].tolist()))
                count += item.length
                if len(text.token_ids) >= max_tokens and not flushed:  # the last token: its response takes the tail
                    pieces.append(text.flush())
                    flushed = True
                if item.logits is not None:
                    logits = fresh_logits = item.logits
                if text.stopped:  # a stop string matched: what follows is not the client's
                    break
            if streaming and count:
                self.send(sender, prefix + "".join(pieces), fresh_logits, wanted, tokens=count)
                prefix = ""
            if text.stopped:  # the engine need not go on
                self.stop(request_id)
                for _ in responses:
                    pass
        tail = "" if flushed else text.flush()
        if not streaming:
            self.send(sender, prefix + text.text, logits, wanted, tokens=len(text.token_ids), final=True)
        elif tail:
            self.send(sender, tail, None, wanted, tokens=0, final=True)
        else:
            sender.send(flags=FINAL)

    def engine_stream(self, engine, request_id, taken=None):
        """The engine's responses to the request ``engine`` (its input tensors) in batches of ``_Item``s (``watched``
        says what a batch is): on the torch engine model's socket (``direct``) where it listens, else over gRPC from
        this server (``loopback``), else through Triton's BLS ``exec()``.
        Either way the request is made here, in the request's thread (Triton's ``exec()`` returns once the engine has
        it; gRPC's stream, ``loopback``, sends it on its own thread at once); the responses are read later.
        ``taken``: when ``execute()`` took the request (monotonic), in the socket request's header, so that the engine
        counts this model's share of the time to first token. (This model updates no custom metric: the Python
        backend's metric call holds the GIL while it waits for Triton's threads, which on the path through Triton wait
        for this stub's GIL; a server hung so under a clean clone's suite.)"""
        if self.direct:
            header = {"request_id": request_id, "outputs": ENGINE_OUTPUTS, "parameters": {BLS_PARAMETER: True}}
            if taken is not None:
                header["bls_taken_at"] = taken
            try:
                sock = direct.open_stream(self.direct_address, header, engine)
            except OSError as exc:
                raise EngineError(f"cannot send the request to the engine model's socket: {exc}",
                                  pb_utils.TritonError.UNAVAILABLE) from None
            if sock is not None:
                return self._socket_batches(sock)
            self.direct = False  # nothing listens: an engine model of another kind (TensorRT-LLM's), for good
            logger = getattr(pb_utils, "Logger", None)
            if logger is not None:
                logger.log_info("tensorrt_llm_bls: the engine model has no socket; its requests go through Triton "
                                "(as said at load: gRPC, or exec())")
        if self.loopback is not None:
            return self.watched(_socket_item(header, arrays) for header, arrays in self.loopback.stream(
                self.engine_model, ENGINE_OUTPUTS, engine, request_id, {BLS_PARAMETER: True}))
        return self.watched(_triton_items(self.request(self.engine_model, ENGINE_OUTPUTS, engine,
                                                       request_id=request_id).exec(decoupled=True)))

    def _socket_batches(self, sock):
        """``watched``'s batches read from the engine's socket in this (the request's) thread: each read takes all
        that has arrived (``direct.FrameBuffer``), one batch when coalescing, else one batch a frame; a read that
        waits ``WATCH_S`` looks whether the engine was lost. No reader thread and no handoff a frame: reading frames
        so was 29% of what held this model's GIL at 32 streams on this project's CPU machine (py-spy), 20% now."""
        frames = direct.FrameBuffer()
        try:
            sock.settimeout(WATCH_S)
            while True:
                taken = frames.take()
                if not taken:
                    try:
                        chunk = sock.recv(RECV_BYTES)
                    except TimeoutError:
                        if (why := health.lost(self.repository)) is not None:
                            raise EngineError(why, pb_utils.TritonError.UNAVAILABLE) from None
                        continue
                    if not chunk:
                        raise ConnectionError("the engine model closed the request's connection before its last "
                                              "response")
                    frames.feed(chunk)
                    continue
                items = [_socket_item(header, arrays) for header, arrays in taken]
                yield from [items] if self.coalesce else ([item] for item in items)
                if taken[-1][0].get("flags", 0) & direct.FINAL:
                    return
        except (OSError, direct.ProtocolError) as exc:  # the engine's process died, or the stream broke
            deadline = time.monotonic() + LOST_WAIT_S
            while (why := health.lost(self.repository)) is None and time.monotonic() < deadline:
                time.sleep(0.05)  # a killed process closes its sockets before it shows as gone
            raise EngineError(why or f"the engine model's stream ended early: {exc}",
                              pb_utils.TritonError.UNAVAILABLE) from None
        finally:
            sock.close()

    def watched(self, responses):
        """The engine's responses in batches: one each, or, coalescing, all that arrived since the previous batch
        (under load the engine may stream faster than one response out per response in can follow). Read by a
        thread of their own, so that a request waiting for one ends when its engine was lost (a tensor-parallel
        worker died: ``health``): the engine's error response was seen not to reach a BLS request that had had
        responses already (Triton 2.51), which then waited for ever."""
        handoff = queue.SimpleQueue()

        def read():
            try:
                for response in responses:
                    handoff.put(response)
            except Exception as exc:  # handed to the request
                handoff.put(exc)
            handoff.put(None)

        self.workers.submit(read)
        while True:
            try:
                item = handoff.get(timeout=WATCH_S)
            except queue.Empty:
                if (why := health.lost(self.repository)) is not None:
                    raise EngineError(why, pb_utils.TritonError.UNAVAILABLE) from None
                continue
            batch, end = [], _MORE
            while True:
                if item is None or isinstance(item, Exception):  # the engine's stream ended, or failed
                    end = item
                    break
                batch.append(item)
                if not self.coalesce:
                    break
                try:
                    item = handoff.get_nowait()
                except queue.Empty:
                    break
            if batch:
                yield batch
            if end is None:
                return
            if isinstance(end, Exception):
                raise end

    def stop(self, request_id):
        """Stop ``request_id``: by datagram where the torch engine model listens, else TensorRT-LLM's stop
        request through Triton (the loopback's gRPC, else ``exec()``). The request then ends with a final response
        (its reader sees the end)."""
        if not stops.send(self.stop_address, request_id):
            stop = {"input_ids": np.zeros((1, 1), np.int32), "input_lengths": np.ones((1, 1), np.int32),
                    "request_output_len": np.ones((1, 1), np.int32), "stop": np.array([[True]])}
            if self.loopback is not None:
                for _ in self.loopback.stream(self.engine_model, ["output_ids"], stop, request_id,
                                              {BLS_PARAMETER: True}):
                    pass
                return
            iterator = self.request(self.engine_model, ["output_ids"], stop, request_id=request_id).exec(decoupled=True)
            for _ in iterator:
                pass
            _linger(iterator)

    def request(self, model, outputs, tensors, request_id=""):
        # BLS_PARAMETER marks the request as this model's, whatever its id (a front's passes through): the torch engine
        # model answers such a stream at once, which frees the thread our exec() holds (torch_server.enqueue)
        return pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs, request_id=request_id,
                                         inputs=[pb_utils.Tensor(k, v) for k, v in tensors.items()],
                                         parameters={BLS_PARAMETER: True})

    def send(self, sender, piece, logits, wanted, *, tokens, final=False):
        """``tokens``: how many generated tokens this response's text stands for (``num_output_tokens``, as
        Triton's vLLM backend and its OpenAI frontend name it): one response may carry several."""
        outputs = [pb_utils.Tensor("text_output", np.array([[piece.encode("utf-8")]], dtype=object)),
                   pb_utils.Tensor(NUM_OUTPUT_TOKENS, np.array([[tokens]], dtype=np.int32))]
        if logits is not None:
            outputs.append(pb_utils.Tensor("generation_logits", logits))
        if wanted:  # only what the request asked for (the stub prunes the rest itself, which crashed it once)
            outputs = [t for t in outputs if t.name() in wanted]
        sender.send(pb_utils.InferenceResponse(outputs), flags=FINAL if final else 0)


def _requested_outputs(request):
    try:
        return set(request.requested_output_names())
    except Exception:  # a Python backend without it: send everything
        return set()


def _triton_items(iterator):
    """A BLS response iterator's responses as ``_Item``s; the iterator lingers after (``LINGER_S``)."""
    try:
        for response in iterator:
            yield _triton_item(response)
    finally:
        _linger(iterator)


def _linger(iterator) -> None:
    """Keep ``iterator`` for ``LINGER_S``; those kept longer are let go here (outside the lock: an unfinished one reads
    its stream to the end as it goes)."""
    now = time.monotonic()
    expired = []
    with _lingering_lock:
        _lingering.append((now, iterator))
        while now - _lingering[0][0] > LINGER_S:
            expired.append(_lingering.popleft())
    expired.clear()


def _triton_item(response) -> _Item:
    if response.has_error():
        return _Item(EngineError(response.error().message(), _code(response.error())))
    ids = pb_utils.get_output_tensor_by_name(response, "output_ids")
    if ids is None:  # an empty response (the first to a BLS request, or an empty final one)
        return _Item()
    length = int(pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy().reshape(-1)[0])
    found = pb_utils.get_output_tensor_by_name(response, "generation_logits")
    return _Item(None, ids.as_numpy().reshape(-1), length, None if found is None else found.as_numpy())


def _socket_item(header, arrays) -> _Item:
    if "error" in header:
        code = getattr(pb_utils.TritonError, str(header.get("code")), pb_utils.TritonError.INTERNAL)
        return _Item(EngineError(str(header["error"]), code))
    if "output_ids" not in arrays:
        return _Item()
    logits = arrays.get("generation_logits")
    return _Item(None, arrays["output_ids"].reshape(-1), int(arrays["sequence_length"].reshape(-1)[0]), logits)


def _code(error):
    """The Triton error code of an engine's error (INTERNAL where this Python backend has no ``code()``)."""
    try:
        return error.code()
    except AttributeError:
        return pb_utils.TritonError.INTERNAL
