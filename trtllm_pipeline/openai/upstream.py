"""The deployed model as the OpenAI front reaches it: ``tensorrt_llm_bls`` over gRPC streaming, for asyncio.

The deployment's own client (``client.TritonClient``) is synchronous and not thread-safe, so each
request borrows an idle client from a pool (one gRPC channel each, made once) and drives its stream
from a worker thread, handing every response to the event loop as it lands. When the HTTP client
goes away the request's ``cancelled`` event is set: the worker sees it within
``client.CANCEL_POLL_S`` (also while no token arrives, e.g. queued), and the client cancels the
gRPC stream, which ``tensorrt_llm_bls`` sees as ``is_cancelled()`` and turns into a stop of the
engine request within a step or two (docs/serving.md, "Cancellation").
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator

from trtllm_pipeline.client import ServerError, TritonClient
from trtllm_pipeline.errors import PipelineError
from trtllm_pipeline.openai.protocol import OpenAIError
from trtllm_pipeline.triton.contract import FRONT_MODEL

READY_CACHE_S = 1.0  # a ready model is asked again after this long (a request costs no extra round trip)
_DONE = object()


class Upstream:
    def __init__(self, url: str, *, model: str = FRONT_MODEL, max_streams: int = 512, timeout_s: float = 600.0):
        self.url, self.model, self.timeout_s = url, model, timeout_s
        self._idle: list[TritonClient] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_streams, thread_name_prefix="openai-upstream")
        self._ready_at = 0.0

    # ---- readiness -------------------------------------------------------------------------------

    async def check_ready(self) -> None:
        """OpenAIError(503) unless Triton serves the model now (a positive answer is kept a second)."""
        if time.monotonic() - self._ready_at < READY_CACHE_S:
            return
        loop = asyncio.get_running_loop()
        ready, why = await loop.run_in_executor(self._pool, self._probe)
        if not ready:
            raise OpenAIError(503, f"the model is not ready yet ({why}); retry shortly", code="model_not_ready")
        self._ready_at = time.monotonic()

    def _probe(self) -> tuple[bool, str]:
        try:
            client = self._borrow()
        except PipelineError as exc:
            return False, exc.message.rstrip(".")
        try:
            return client._client.is_model_ready(self.model), f"Triton at {self.url} says {self.model} is not ready"
        except Exception as exc:  # the server went away meanwhile
            return False, f"{type(exc).__name__} asking Triton at {self.url}"
        finally:
            self._release(client)

    # ---- streams ----------------------------------------------------------------------------------

    async def stream(self, text: str, inputs: dict, cancelled: threading.Event | None = None, request_id: str = ""
                     ) -> AsyncIterator[tuple[str, int]]:
        """(text piece, tokens it carries) as Triton sends them; setting ``cancelled`` or closing the
        iterator cancels the request (the iterator then ends). ``request_id``: Triton's request id."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancelled = cancelled or threading.Event()

        def put(item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop has closed (shutdown): nobody is listening
                cancelled.set()

        def produce() -> None:
            client = None
            try:
                client = self._borrow()
                for item in client.stream_tokens(text, cancelled, request_id, **inputs):
                    put(item)
                put(_DONE)
            except BaseException as exc:  # handed to the request, which answers with it
                put(exc)
            finally:
                if client is not None:
                    self._release(client)

        loop.run_in_executor(self._pool, produce)
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise openai_error(item) from None
                yield item
        finally:
            cancelled.set()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            idle, self._idle = self._idle, []
        for client in idle:
            client.close()

    def _borrow(self) -> TritonClient:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return TritonClient(self.url, "grpc", self.model, self.timeout_s)  # checks the model is ready

    def _release(self, client: TritonClient) -> None:
        with self._lock:
            self._idle.append(client)


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
