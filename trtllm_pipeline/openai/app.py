"""The OpenAI-compatible routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(and the chat page on them, ``page``).

Each request is parsed (``protocol``), translated and checked against the engine's limits
(``translate``) before anything is sent upstream, so a bad one is a 400 naming the field and costs
the engine nothing. A streamed request waits for its first token before answering, so that an
error Triton raises (a request it refuses, a model that went away) still gets its HTTP status;
then ``text/event-stream``, one ``data: {...}`` chunk per text piece, ``data: [DONE]`` last. A
client that disconnects mid-stream is noticed by its ``http.disconnect`` (not only at the next
write) and its Triton request cancelled (``upstream``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from trtllm_pipeline.endpoints import allowed_host_names, header_problem
from trtllm_pipeline.openai import protocol, reasoning
from trtllm_pipeline.openai.page import add_chat_page
from trtllm_pipeline.openai.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError
from trtllm_pipeline.openai.translate import Prepared, finish_reason, prepare
from trtllm_pipeline.triton import health as engine_health
from trtllm_pipeline.triton import stops
from trtllm_pipeline.triton.contract import STOP_ID_PREFIX, RequestLimits

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
LOST_POLL_S = 0.5  # how often a request in flight looks whether the model it waits on was lost (triton.health)
LOST_WAIT_S = 1.0  # after the upstream failed: how long a dead stub's process may take to show as gone
LOST_CACHE_S = 0.1  # one look at engine_health.lost serves the requests in flight that ask within this long
BODY_TIMEOUT_S = 20.0  # a body trickled in slower than this is a slow client's (408), not a request


def _reject_constant(name: str):
    raise OpenAIError(400, f"the body is not valid JSON: {name} is not a JSON number")


def create_app(upstream, tokenizer, limits: RequestLimits, model_id: str, *, aliases: tuple[str, ...] = (),
               reasoning_parser: str = "none", repository: str | None = None,
               allowed_hosts: frozenset[str] = allowed_host_names("127.0.0.1")) -> FastAPI:
    """``upstream``: what streams (text, tokens) for a prompt (``upstream.Upstream``, or a stand-in in tests);
    ``repository``: the model repository, whose engine may report itself lost (``triton.health``)."""
    app = FastAPI(title="trtllm-pipeline OpenAI front", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_HeaderGuard, allowed_hosts=allowed_hosts)
    created = int(time.time())
    names = {model_id, *aliases}

    def lost() -> str | None:
        return engine_health.lost(repository) if repository is not None else None

    seen = [0.0, None]  # (when, what) engine_health last said to a request in flight

    def lost_in_flight() -> str | None:
        """``lost()`` for the requests in flight, one look for all of them every LOST_CACHE_S: each asks every
        LOST_POLL_S, and a look is several file reads on the event loop (at 32 streams 6% of the front's GIL time,
        py-spy on the CPU, 2026-12-06). A new request still looks itself (``check_engine``)."""
        now = time.monotonic()
        if now - seen[0] >= LOST_CACHE_S:
            seen[:] = now, lost()
        return seen[1]

    def check_engine() -> None:
        if (why := lost()) is not None:
            raise OpenAIError(503, f"the model cannot serve: {why}", code="model_not_ready")

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, exc: OpenAIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # unknown routes and methods, OpenAI-shaped
        return JSONResponse(OpenAIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").body(),
                            status_code=exc.status_code)

    add_chat_page(app)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        check_engine()
        return protocol.models(model_id, created)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve(request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _serve(request, ChatCompletionRequest)

    async def _serve(http: Request, kind):
        req = protocol.parse(kind, await _json(http, limits.max_body_bytes))
        if req.model not in names:
            raise OpenAIError(404, f"the model {req.model!r} does not exist here; this server serves {model_id!r}",
                              param="model", code="model_not_found")
        prepared = await asyncio.get_running_loop().run_in_executor(None, prepare, req, tokenizer, limits)
        check_engine()
        await upstream.check_ready()
        chat = kind is ChatCompletionRequest
        request_id = protocol.new_id("chatcmpl" if chat else "cmpl")
        # The engine request's id: the BLS passes an id of this form on to the engine model, so that a request
        # whose client went away is stopped at once by the stop side channel, even while it waits in the engine's
        # queue (where the gRPC cancellation, seen by the BLS at its next response, would wait for its admission).
        engine_id = f"{STOP_ID_PREFIX}{uuid.uuid4().hex}"
        stop = (lambda: stops.send(stops.address(repository), engine_id)) if repository is not None else None
        cancelled = threading.Event()
        pieces = _Pieces(upstream.stream(prepared.text, prepared.inputs, cancelled, engine_id), cancelled, stop,
                         lost_in_flight)
        try:
            async with _cancel_on_disconnect(http, pieces, lost_in_flight):
                await pieces.first()  # an upstream refusal is answered with its status, before any 200
                if not req.stream:
                    return await _whole(pieces, prepared, request_id, req.model, chat)
        except BaseException as exc:
            await pieces.aclose()
            if isinstance(exc, OpenAIError) and exc.status == 500:
                check_engine()  # the engine was lost under this request: 503, as for the next ones
            raise
        events = _events(pieces, prepared, request_id, req.model, chat, req.include_usage, req.continuous_usage)
        return StreamingResponse(_watched(events, http, pieces, lost_in_flight), media_type="text/event-stream",
                                 headers=SSE_HEADERS)

    async def _whole(pieces: "_Pieces", prepared: Prepared, request_id: str, model: str, chat: bool):
        text, tokens = [], 0
        async for piece, n in pieces:
            text.append(piece)
            tokens += n
        await pieces.aclose()
        whole, reason = "".join(text), finish_reason(tokens, prepared.max_tokens)
        if not chat:
            return protocol.completion(request_id, model, whole, reason, prepared.prompt_tokens, tokens)
        thought, content = reasoning.split(reasoning_parser, whole)
        message: dict[str, Any] = {"content": content}
        if reasoning_parser != "none":
            message["reasoning_content"] = thought
        return protocol.chat(request_id, model, message, reason, prepared.prompt_tokens, tokens)

    async def _events(pieces: "_Pieces", prepared: Prepared, request_id: str, model: str, chat: bool,
                      include_usage: bool, continuous: bool = False) -> AsyncIterator[bytes]:
        """The stream's SSE events. ``continuous`` (vLLM's ``continuous_usage_stats``): a chunk for every response
        that carried tokens, its delta empty where no text came with them, and the usage so far on each."""
        splitter = reasoning.Splitter(reasoning_parser)
        tokens = 0

        def out(chunk: dict[str, Any]) -> bytes:
            if continuous:
                chunk["usage"] = protocol.usage(prepared.prompt_tokens, tokens)
            return _sse(chunk)

        if chat:
            yield _sse(protocol.chat_chunk(request_id, model, {"role": "assistant", "content": ""}, None))
        try:
            async for piece, n in pieces:
                tokens += n
                if not piece and not (continuous and n):
                    continue
                chunks = _deltas(splitter.push(piece), request_id, model, chat)
                if not chunks and continuous:  # the tokens' text held back: their arrival still shown
                    chunks = [protocol.chat_chunk(request_id, model, {"content": ""}, None) if chat
                              else protocol.completion(request_id, model, "", None, 0, 0, chunk=True)]
                for chunk in chunks:
                    yield out(chunk)
            for chunk in _deltas(splitter.finish(), request_id, model, chat):
                yield out(chunk)
        except OpenAIError as exc:  # after the 200: the stream's last event says what went wrong
            yield _sse(exc.body())
            yield b"data: [DONE]\n\n"
            return
        reason = finish_reason(tokens, prepared.max_tokens)
        yield out(protocol.chat_chunk(request_id, model, {}, reason) if chat else
                  protocol.completion(request_id, model, "", reason, 0, 0, chunk=True))
        if include_usage:
            yield _sse(protocol.usage_chunk(request_id, model, "chat.completion.chunk" if chat else "text_completion",
                                            prepared.prompt_tokens, tokens))
        yield b"data: [DONE]\n\n"

    def _deltas(split: tuple[str, str], request_id: str, model: str, chat: bool) -> list[dict[str, Any]]:
        """The chunks of one piece's reasoning and answer text."""
        thought, content = split
        if not chat:
            return [protocol.completion(request_id, model, content, None, 0, 0, chunk=True)] if content else []
        return ([protocol.chat_chunk(request_id, model, {"reasoning_content": thought}, None)] if thought else []) + (
            [protocol.chat_chunk(request_id, model, {"content": content}, None)] if content else [])

    return app


async def _json(request: Request, limit: int) -> Any:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise OpenAIError(413, f"the body is {length} bytes; requests to this server are at most {limit} bytes "
                          "(build.max_input_len allows no longer prompt)")
    try:
        body = await asyncio.wait_for(request.body(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise OpenAIError(408, f"the body did not arrive within {BODY_TIMEOUT_S:.0f} s") from None
    if len(body) > limit:
        raise OpenAIError(413, f"the body is {len(body)} bytes; at most {limit}")
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise OpenAIError(400, "the body is not UTF-8 JSON") from None
    except ValueError as exc:
        raise OpenAIError(400, f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # thousands of nested brackets: no request is like that
        raise OpenAIError(400, "the body is not a request: its JSON is nested too deeply") from None


class _HeaderGuard:
    """``endpoints.header_problem`` for every request (a pure ASGI middleware: Starlette's BaseHTTPMiddleware
    would hide the client's ``http.disconnect`` from the routes)."""

    def __init__(self, app, allowed_hosts: frozenset[str]):
        self.app, self.allowed_hosts = app, allowed_hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
            if problem := header_problem(scope["method"], headers, self.allowed_hosts):
                message, status = problem
                response = JSONResponse(OpenAIError(status, message).body(), status_code=status,
                                        headers={"Connection": "close"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


class _Pieces:
    """The upstream stream with its first item fetched ahead (``first``), iterated once; ``cancel``
    (from anywhere) ends it and cancels the Triton request."""

    def __init__(self, stream: AsyncIterator[tuple[str, int]], cancelled: threading.Event,
                 stop: Callable[[], Any] | None = None, model_lost: Callable[[], str | None] = lambda: None):
        self.stream, self.cancelled, self._first, self._has_first = stream, cancelled, None, False
        self.stop, self.finished, self.model_lost = stop, False, model_lost
        self.lost: str | None = None  # why the model was lost under this request (the stream was cut for it)

    async def first(self) -> None:
        try:
            self._first = await self._next()
            self._has_first = True
        except StopAsyncIteration:
            self._check_lost()
            self.finished = True

    async def __aiter__(self):
        if self._has_first:
            self._has_first = False
            yield self._first
        while True:
            try:
                item = await self._next()
            except StopAsyncIteration:
                break
            yield item
        self._check_lost()
        self.finished = True

    async def _next(self) -> tuple[str, int]:
        """The upstream's next item; where it failed because the model was lost (Triton 2.51 may end a stream with an
        error when a stub dies, before the watcher's next look), that reason instead of Triton's."""
        try:
            return await self.stream.__anext__()
        except OpenAIError as exc:
            if exc.status < 500:
                raise
            for _ in range(int(LOST_WAIT_S / 0.05)):  # a killed process closes its sockets before it shows as gone
                if (why := self.model_lost()) is not None:
                    self.lost = why
                    self._check_lost()
                await asyncio.sleep(0.05)
            raise

    def _check_lost(self) -> None:
        if self.lost is not None:
            raise OpenAIError(503, f"the model cannot serve: {self.lost}", code="model_not_ready")

    def lose(self, why: str) -> None:
        """The model this request waits on was lost: end the stream, which then raises that."""
        self.lost = why
        self.cancel()

    def cancel(self) -> None:
        if not self.cancelled.is_set() and not self.finished and self.stop is not None:
            self.stop()  # the engine drops it at its next step, queued or running
        self.cancelled.set()
        if (cancel := getattr(self.stream, "cancel", None)) is not None:  # its gRPC call, at once (upstream._Stream)
            cancel()

    async def aclose(self) -> None:
        self.cancel()
        with contextlib.suppress(RuntimeError):  # already closing, from the other side
            await self.stream.aclose()


@contextlib.asynccontextmanager
async def _cancel_on_disconnect(http: Request, pieces: _Pieces, lost: Callable[[], str | None] = lambda: None):
    """While inside: the client's ``http.disconnect`` cancels the Triton request at once (not at the
    next write, which may be far off while the request waits in a queue); and a model lost under the request
    (``lost()``, every ``LOST_POLL_S``: a crashed stub answers nothing, and Triton 2.51 leaves its streams waiting)
    ends it with that reason."""
    async def watch() -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass
        pieces.cancel()

    async def watch_model() -> None:
        while (why := lost()) is None:
            await asyncio.sleep(LOST_POLL_S)
        pieces.lose(why)

    watchers = [asyncio.ensure_future(watch()), asyncio.ensure_future(watch_model())]
    try:
        yield
    finally:
        for watcher in watchers:
            watcher.cancel()


async def _watched(events: AsyncIterator[bytes], http: Request, pieces: _Pieces,
                   lost: Callable[[], str | None] = lambda: None) -> AsyncIterator[bytes]:
    try:
        async with _cancel_on_disconnect(http, pieces, lost):
            async for chunk in events:
                yield chunk
    finally:
        await pieces.aclose()
