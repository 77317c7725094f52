"""Stop requests by a side channel: the torch engine model hears them at once, not behind Triton's queue.

TensorRT-LLM's stop request (``stop`` true, the request's id) goes through Triton's scheduler to the
engine model like any request, and under load it waited there up to 0.7 s (measured, 64 streams on
2 cores) while the runtime ran on: tens of steps. So the torch runtime's ``tensorrt_llm`` model also
listens on an abstract Unix datagram socket named after the model repository, and the BLS and the
HTTP front send a stop there first: a datagram holding the request id. Where nothing listens
(TensorRT-LLM's C++ backend), ``send`` says so and they send the stop request through Triton.
Request ids stopped this way are the BLS's and the front's own (random), so another client's request
cannot be named by accident.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

MAX_ID_BYTES = 256


def address(repository: str | Path) -> str:
    """The socket of the model repository at ``repository`` (Linux abstract namespace: no file)."""
    digest = hashlib.sha256(str(Path(repository).resolve()).encode()).hexdigest()[:24]
    return f"\0trtllm-pipeline-stop-{digest}"


def send(where: str, request_id: str) -> bool:
    """Ask the engine model listening at ``where`` to stop ``request_id``; False when none listens."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(request_id.encode()[:MAX_ID_BYTES], where)
        return True
    except OSError:
        return False


class Listener:
    """Calls ``on_stop(request_id)`` for each stop datagram, from a thread of its own."""

    def __init__(self, where: str, on_stop: Callable[[str], None]):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(where)
        self.on_stop = on_stop
        self._thread = threading.Thread(target=self._listen, name="stop-listener", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_ID_BYTES)
            except OSError:  # closed
                return
            if data:
                self.on_stop(data.decode("utf-8", "replace"))

    def close(self) -> None:
        self.sock.close()
