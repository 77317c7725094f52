"""Logging for the CLI and a guard that keeps third-party chatter out of the user's terminal."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from typing import Iterator

log = logging.getLogger("trtllm_pipeline")


def setup_logging(verbose: int) -> None:
    """INFO (plain messages) by default; -v shows DEBUG from this package and third parties."""
    level = logging.DEBUG if verbose else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose > 1 else logging.WARNING)
    log.setLevel(level)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.levelno >= logging.WARNING:
            msg = f"{record.levelname.lower()}: {msg}"
        if record.exc_info and log.isEnabledFor(logging.DEBUG):
            msg += "\n" + self.formatException(record.exc_info)
        return msg


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Route third-party prints and warnings (ModelOpt, transformers) to debug logging.

    With -v nothing is hidden.
    """
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    buffer = io.StringIO()
    previous = None
    with warnings.catch_warnings(), contextlib.redirect_stdout(buffer):
        warnings.simplefilter("ignore")
        try:
            from transformers.utils import logging as hf_logging

            previous = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        except ImportError:  # transformers is a dependency; this only guards odd installs
            hf_logging = None
        try:
            yield
        finally:
            if hf_logging is not None and previous is not None:
                hf_logging.set_verbosity(previous)
                hf_logging.enable_progress_bar()
    for line in buffer.getvalue().splitlines():
        log.debug("%s", line)
