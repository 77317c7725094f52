"""The BLS's requests to the torch engine model on a stream socket of their own, beside Triton.

Through Triton, each token the engine streams to a BLS request crosses the Python backend four times: the
engine's stub sends it to the server (a synchronous round trip), the server hands it to the BLS's stub and waits
until that stub's one message thread has taken it, which needs the BLS's GIL (``InferResponse`` builds numpy
arrays), and the BLS's ``exec()`` holds one of the server's 32 threads until the first response. Under load that
cost ~45 us a stream a step on the H200 (the served step 6.1 ms at 64 streams against 3.3 in-process), and a c=8
load on the 7B stalled for good on 2026-12-05 (H100: both stubs' sends waiting on the server, the engine idle;
2026-12-04 too, twice). So the torch engine model also listens on an abstract Unix stream socket named after the
model repository, and the BLS sends it the same engine request there: one connection a request, the request as
one frame, the responses as frames on the same connection, the last one marked final. The engine's sends become
socket writes (no round trip), its stub and the BLS's meet nowhere else, and a BLS whose client went away closes
the connection, which the engine sees at its next write. Where nothing listens (TensorRT-LLM's C++ backend) the
BLS goes through Triton as before, and ``TRTLLM_PIPELINE_BLS_DIRECT=0`` makes it do so here too.

A frame: a 4-byte big-endian length, that many bytes of JSON header, then the bytes of the arrays it lists
(``"arrays": [[name, dtype, shape], ...]``, the dtype as numpy's code such as "<i4", C order). No pickle: either end
may be another version of this code.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 1 << 20
MAX_FRAME_BYTES = 1 << 30
REQUEST_READ_S = 10.0  # a connection that does not send its request within this long is dropped
SHORT_HEADER_BYTES = 256  # headers up to this long are cached parsed (``_header``): a token frame's is ~90 bytes
_LENGTH = struct.Struct(">I")
FINAL = 1  # a response frame's flags: the request's last (Triton's TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class ProtocolError(Exception):
    """A frame that does not parse, or a connection that ended in the middle of one."""


def address(repository: str | Path) -> str:
    """The engine model's socket for the model repository at ``repository`` (Linux abstract namespace: no file)."""
    digest = hashlib.sha256(str(Path(repository).resolve()).encode()).hexdigest()[:24]
    return f"\0trtllm-pipeline-engine-{digest}"


def encode(header: dict, arrays: dict[str, np.ndarray] | None = None) -> bytes:
    """One frame. Arrays of strings (object dtype, as Triton's BYTES) travel as a JSON list in the header."""
    header = dict(header)
    listed, blobs, texts = [], [], {}
    for name, value in (arrays or {}).items():
        value = np.asarray(value)
        if value.dtype == object:
            texts[name] = [[v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in value.reshape(-1)],
                           list(value.shape)]
            continue
        value = np.ascontiguousarray(value)
        # dtype.str ('<i4'), not dtype.name: the name costs ~4 us an array in numpy (a frame a token a stream)
        listed.append([name, value.dtype.str, list(value.shape)])
        blobs.append(value.tobytes())
    header["arrays"] = listed
    if texts:
        header["texts"] = texts
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([_LENGTH.pack(len(head)), head, *blobs])


def read_frame(stream) -> tuple[dict, dict[str, np.ndarray]] | None:
    """The next frame from ``stream`` (a binary file over the socket), or None at a clean end of the connection."""
    prefix = stream.read(_LENGTH.size)
    if not prefix:
        return None
    if len(prefix) < _LENGTH.size:
        raise ProtocolError("the connection ended inside a frame's length")
    (length,) = _LENGTH.unpack(prefix)
    _check_header_length(length)
    try:
        header = _header(_exactly(stream, length))
        arrays = {name: np.frombuffer(_exactly(stream, size), dtype=dtype).reshape(shape)
                  for name, dtype, shape, size in _layout(header)}
        _add_texts(header, arrays)
    except (ValueError, TypeError, KeyError) as exc:
        raise ProtocolError(f"a frame that does not parse: {exc}") from None
    return header, arrays


class FrameBuffer:
    """Frames from a connection read in chunks (``feed``): one ``recv`` may bring several (a stream whose reader fell
    behind the engine), ``take`` returns every complete one at once, and a frame split across reads waits for its
    rest. The BLS's request thread reads its engine stream so, itself: one system call and one wake-up for all that
    arrived, where a reader thread per request handed each frame over on a queue."""

    def __init__(self):
        self.data = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.data += chunk

    def take(self) -> list[tuple[dict, dict[str, np.ndarray]]]:
        frames, at, data = [], 0, self.data
        try:
            while len(data) - at >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(data, at)
                _check_header_length(length)
                body = at + _LENGTH.size + length
                if len(data) < body:
                    break
                header = _header(bytes(data[at + _LENGTH.size: body]))
                layout = _layout(header)
                if len(data) < body + sum(size for *_, size in layout):
                    break
                arrays = {}
                for name, dtype, shape, size in layout:
                    arrays[name] = np.frombuffer(bytes(data[body: body + size]), dtype=dtype).reshape(shape)
                    body += size
                _add_texts(header, arrays)
                frames.append((header, arrays))
                at = body
        except (ValueError, TypeError, KeyError) as exc:
            raise ProtocolError(f"a frame that does not parse: {exc}") from None
        finally:
            del data[:at]
        return frames


def _check_header_length(length: int) -> None:
    if length > MAX_HEADER_BYTES:
        raise ProtocolError(f"a frame header of {length} bytes (at most {MAX_HEADER_BYTES})")


def _header(raw: bytes) -> dict:
    """A frame's header; a short one (a streamed token's: the same few shapes over and over) parsed once. A copy:
    readers take the texts out of theirs."""
    return dict(_short_header(raw)) if len(raw) <= SHORT_HEADER_BYTES else json.loads(raw)


@functools.lru_cache(maxsize=256)
def _short_header(raw: bytes) -> dict:
    return json.loads(raw)


def _layout(header: dict) -> list[tuple[str, np.dtype, list[int], int]]:
    """(name, dtype, shape, bytes) of each array the frame carries after its header, in order; checked."""
    layout, total = [], 0
    for name, dtype_name, shape in header.get("arrays", []):
        if (dtype := _numeric(dtype_name)) is None:
            raise ProtocolError(f"array {name!r} has dtype {dtype_name!r}")
        dims = [int(d) for d in shape]
        if any(d < 0 for d in dims):
            raise ProtocolError(f"array {name!r} has shape {shape}")
        size = math.prod(dims) * dtype.itemsize  # (math.prod: numpy's prod costs ~4 us an array)
        total += size
        if total > MAX_FRAME_BYTES:
            raise ProtocolError(f"array {name!r} of shape {shape} is too large")
        layout.append((name, dtype, dims, size))
    return layout


def _add_texts(header: dict, arrays: dict[str, np.ndarray]) -> None:
    for name, (values, shape) in header.pop("texts", {}).items():
        arrays[name] = np.array([v.encode("utf-8") for v in values], dtype=object).reshape(shape)


@functools.lru_cache(maxsize=64)
def _numeric(dtype: str) -> np.dtype | None:
    """The dtype named ``dtype`` if it is a boolean, integer or float (Triton's tensor types but BYTES, which travel
    as text), else None."""
    try:
        found = np.dtype(dtype)
    except TypeError:
        return None
    return found if found.kind in "biuf" else None


def _exactly(stream, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise ProtocolError("the connection ended inside a frame")
    return data


class Request:
    """A request that came on the socket, read by the engine's parser as it reads one of Triton's requests."""

    def __init__(self, header: dict, arrays: dict[str, np.ndarray]):
        self.header, self.arrays = header, arrays

    def request_id(self) -> str:
        return str(self.header.get("request_id", ""))

    def requested_output_names(self) -> list[str]:
        return list(self.header.get("outputs", []))

    def parameters(self) -> str:
        return json.dumps(self.header.get("parameters", {}))

    def input(self, name: str) -> np.ndarray | None:
        return self.arrays.get(name)


class Response:
    """What the engine answers a socket request with: outputs by name, or an error and its Triton code's name."""

    def __init__(self, outputs: dict[str, np.ndarray] | None = None, error: str | None = None, code: str | None = None):
        self.outputs, self.error, self.code = outputs or {}, error, code

    def frame(self, flags: int) -> bytes:
        header: dict = {"flags": flags}
        if self.error is not None:
            header.update(error=self.error, code=self.code or "INTERNAL")
        return encode(header, self.outputs)


class Tokens(Response):
    """A streaming response of one row's new token ids: ``output_ids`` [1, 1, n] and ``sequence_length`` [1, 1], int32,
    each where ``output_ids`` / ``sequence_length`` say (what the BLS asks for), as a ``Response`` carrying those
    arrays. Its frame is the same bytes as ``encode`` makes of them, made without numpy or JSON (a header cached by
    token count and flags, the ids packed by ``struct``): a frame a token a stream is the outbox's work, which shares
    the engine loop's GIL; ~1 us instead of ~8.5 (the arrays 3 us, ``encode`` 5.4 us on this project's CPU)."""

    def __init__(self, ids: list[int], output_ids: bool = True, sequence_length: bool = True):
        self.ids, self.has_ids, self.has_length = ids, output_ids, sequence_length
        self.error = self.code = None

    @property
    def outputs(self) -> dict[str, np.ndarray]:  # noqa: D401 - as a Response's
        outputs = {}
        if self.has_ids:
            outputs["output_ids"] = np.array([[self.ids]], dtype=np.int32).reshape(1, 1, len(self.ids))
        if self.has_length:
            outputs["sequence_length"] = np.array([[len(self.ids)]], dtype=np.int32)
        return outputs

    def frame(self, flags: int) -> bytes:
        n = len(self.ids)
        head = _tokens_head(n if self.has_ids else -1, self.has_length, flags)
        if self.has_ids and self.has_length:
            return head + struct.pack(f"<{n + 1}i", *self.ids, n)
        if self.has_ids:
            return head + struct.pack(f"<{n}i", *self.ids)
        return head + struct.pack("<i", n) if self.has_length else head


@functools.lru_cache(maxsize=1024)
def _tokens_head(count: int, length: bool, flags: int) -> bytes:
    """A ``Tokens`` frame's length prefix and header (``count`` -1: no ``output_ids``), as ``encode`` writes them."""
    listed = ([["output_ids", "<i4", [1, 1, count]]] if count >= 0 else []) + (
        [["sequence_length", "<i4", [1, 1]]] if length else [])
    head = json.dumps({"flags": flags, "arrays": listed}, separators=(",", ":")).encode()
    return _LENGTH.pack(len(head)) + head


class Sender:
    """A socket request's responses, written on its connection (the engine's outbox calls ``send`` as it calls a
    Triton response sender's). A write that fails raises: the BLS closed the connection, its client is gone."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self._lock = threading.Lock()
        self._closed = False

    def send(self, response: Response | None = None, flags: int = 0) -> None:
        frame = response.frame(flags) if response is not None else encode({"flags": flags})
        with self._lock:
            if self._closed:
                raise ConnectionError("the request's connection is closed")
            self.conn.sendall(frame)
            if flags & FINAL:
                self._close()

    def _close(self) -> None:
        self._closed = True
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()


class Listener:
    """Accepts connections at ``where`` and calls ``on_request(Request, Sender)`` for each, from threads of its own
    (the accepting one, and one a connection while its request frame is read)."""

    def __init__(self, where: str, on_request: Callable[[Request, Sender], None]):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(where)
        self.sock.listen(512)
        self.on_request = on_request
        self._thread = threading.Thread(target=self._accept, name="direct-listener", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self._read(conn)

    def _read(self, conn: socket.socket) -> None:
        """The request frame (a few hundred bytes, sent at once by ``open_stream``): read here, the next accept waits
        for it, under a deadline so that a silent peer cannot hold the listener."""
        try:
            conn.settimeout(REQUEST_READ_S)
            with conn.makefile("rb") as stream:
                frame = read_frame(stream)
            conn.settimeout(None)
            if frame is None:
                conn.close()
                return
            self.on_request(Request(*frame), Sender(conn))
        except (OSError, ProtocolError) as exc:
            log.warning("a direct request that could not be read: %s", exc)
            conn.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def open_stream(where: str, header: dict, arrays: dict[str, np.ndarray]) -> socket.socket | None:
    """A connection to the engine model at ``where`` with the request sent on it; None when nothing listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(where)
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    # when it was sent (monotonic: one clock for every process on the machine), so that the engine can count how long
    # the request waited for its listener (``trtllm_pipeline_direct_wait_seconds_total``)
    sock.sendall(encode({**header, "sent_at": time.monotonic()}, arrays))
    return sock


def responses(sock: socket.socket) -> Iterator[tuple[dict, dict[str, np.ndarray]]]:
    """The response frames of the request sent on ``sock``, to the final one (then the connection is closed). A
    connection that ends before it raises ConnectionError."""
    try:
        with sock.makefile("rb") as stream:
            while True:
                frame = read_frame(stream)
                if frame is None:
                    raise ConnectionError("the engine model closed the request's connection before its last response")
                yield frame
                if frame[0].get("flags", 0) & FINAL:
                    return
    finally:
        sock.close()
