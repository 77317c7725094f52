"""The deployed model as the OpenAI front reaches it: ``tensorrt_llm_bls`` over gRPC streaming, on the event loop.

One ``grpc.aio`` channel, made on first use inside the front's loop, carries every request: each is a stream of its
own (``ModelStreamInfer``, the request the deployment's client sends: ``client.stream_request``), read by the request's
own coroutine. No thread a request: the synchronous client this replaced (``client.TritonClient`` from a pool of
worker threads, a channel and its polling thread each, every response handed to the loop) cost 134 us of CPU a
response at 32 streams against 83 here (tiny model, CPU, 2026-12-06), and its threads took the GIL from the loop that
writes the answers. When the HTTP client goes away the request's stream is cancelled (``_Stream.cancel``), which
``tensorrt_llm_bls`` sees as ``is_cancelled()`` and turns into a stop of the engine request within a step or two
(docs/serving.md, "Cancellation").
"""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc

from trtllm_pipeline.client import ServerError, TritonClient, response_piece, stream_request
from trtllm_pipeline.errors import PipelineError
from trtllm_pipeline.openai.protocol import OpenAIError
from trtllm_pipeline.triton.contract import FRONT_MODEL

READY_CACHE_S = 1.0  # a ready model is asked again after this long (a request costs no extra round trip)
READY_TIMEOUT_S = 10.0
# gRPC's default message limits are 4 MB; a response with generation logits is vocabulary x 4 bytes a token
MESSAGE_BYTES = 256 * 1024 * 1024


class Upstream:
    def __init__(self, url: str, *, model: str = FRONT_MODEL, timeout_s: float = 600.0):
        self.url, self.model, self.timeout_s = url, model, timeout_s
        self._stub = None
        self._channel = None
        self._ready_at = 0.0

    def _service(self):
        """The stub on the channel, made on first use: a ``grpc.aio`` channel belongs to the loop it was made in."""
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.url, options=[
                ("grpc.max_send_message_length", MESSAGE_BYTES), ("grpc.max_receive_message_length", MESSAGE_BYTES)])
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

    # ---- readiness -------------------------------------------------------------------------------

    async def check_ready(self) -> None:
        """OpenAIError(503) unless Triton serves the model now (a positive answer is kept a second)."""
        if time.monotonic() - self._ready_at < READY_CACHE_S:
            return
        try:
            answer = await self._service().ModelReady(service_pb2.ModelReadyRequest(name=self.model),
                                                      timeout=READY_TIMEOUT_S)
            ready, why = answer.ready, f"Triton at {self.url} says {self.model} is not ready"
        except grpc.aio.AioRpcError as exc:  # not up, or gone
            ready, why = False, f"{exc.code().name} asking Triton at {self.url}"
        if not ready:
            raise OpenAIError(503, f"the model is not ready yet ({why}); retry shortly", code="model_not_ready")
        self._ready_at = time.monotonic()

    # ---- streams ----------------------------------------------------------------------------------

    def stream(self, text: str, inputs: dict, cancelled: threading.Event | None = None, request_id: str = ""
               ) -> "_Stream":
        """(text piece, tokens it carries) as Triton sends them; ``cancel()``, closing the iterator or setting
        ``cancelled`` (seen at the next response) cancels the request. ``request_id``: Triton's request id."""
        try:
            values = TritonClient._values(text, inputs, stream=True)
        except PipelineError as exc:  # a parameter the contract does not have: the request's fault
            raise OpenAIError(400, exc.message) from None
        return _Stream(self, stream_request(self.model, values, request_id), cancelled or threading.Event())

    def close(self) -> None:
        """Forget the channel (it closes with the process; its loop has ended by the time the front stops)."""
        self._stub = self._channel = None


class _Stream:
    """One request's gRPC stream as an async iterator of (text piece, tokens)."""

    def __init__(self, upstream: Upstream, request, cancelled: threading.Event):
        self.upstream, self.request, self.cancelled = upstream, request, cancelled
        self._call = None
        self._done = False

    def __aiter__(self) -> "_Stream":
        return self

    async def __anext__(self) -> tuple[str, int]:
        while not self._done:
            if self.cancelled.is_set():
                self.cancel()
                break
            if self._call is None:
                async def one_request():
                    yield self.request

                self._call = self.upstream._service().ModelStreamInfer(one_request(), timeout=self.upstream.timeout_s)
            try:
                response = await self._call.read()
            except asyncio.CancelledError:
                if self._done:  # our own cancel(): the stream ends
                    break
                raise
            except grpc.aio.AioRpcError as exc:
                if self._done:  # cancelled by us meanwhile
                    break
                self._done = True
                raise openai_error(ServerError(f"{self.upstream.model} at {self.upstream.url}: {exc.details()}",
                                               status=exc.code().name)) from None
            if response is grpc.aio.EOF:
                self._done = True
                break
            if response.error_message:
                self.cancel()
                raise openai_error(ServerError(f"{self.upstream.model} at {self.upstream.url}: "
                                               f"{response.error_message}")) from None
            piece, tokens, final = response_piece(InferResult(response.infer_response))
            # the last one: the request was sent half-closed, so Triton ends the call itself (nothing to cancel)
            self._done = final
            if piece is not None:
                # a response's tokens where the model says (tensorrt_llm_bls), else one for each response but a final
                # one that carries text (the detokenizer's held-back tail): the counts add up to the completion
                return piece, tokens if tokens is not None else 0 if final else 1
        raise StopAsyncIteration

    def cancel(self) -> None:
        """End the stream and cancel the Triton request (nothing to cancel once it has finished)."""
        self._done = True
        self.cancelled.set()
        if self._call is not None and not self._call.done():
            self._call.cancel()

    async def aclose(self) -> None:
        self.cancel()


def openai_error(exc: BaseException) -> OpenAIError:
    """What the client is told about an upstream failure: its own fault (400) or the server's."""
    if isinstance(exc, OpenAIError):
        return exc
    message = exc.message if isinstance(exc, PipelineError) else f"{type(exc).__name__}: {exc}"
    status = getattr(exc, "status", None) if isinstance(exc, ServerError) else None
    if status == "INVALID_ARGUMENT":
        return OpenAIError(400, message)
    if status in ("UNAVAILABLE", "NOT_FOUND") or (isinstance(exc, PipelineError) and not isinstance(exc, ServerError)):
        return OpenAIError(503, f"the model is not reachable ({message})", code="model_not_ready")
    return OpenAIError(500, message)
