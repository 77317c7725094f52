"""What the user sees: logging, a guard that keeps third-party chatter out of the terminal, and
the one mapping from an error to its message and exit code (the CLI's, which the demo shares)."""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import sys
import warnings
from typing import Iterator

import click

from trtllm_pipeline.errors import EXIT_FAILED, EXIT_UNAVAILABLE, PipelineError

EXIT_INTERRUPTED = 130  # what a shell reports for a process ended by Ctrl-C

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


DISK_ERRORS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
               errno.EROFS: "the file system is read-only", errno.EACCES: "no permission",
               errno.EFBIG: "a file would exceed the file size limit"}


def exit_status(exc: BaseException) -> int:
    """Say what stopped a command, in one paragraph on stderr, and return its exit code.

    A ``PipelineError`` is the user's to act on: its message, its fix, its code. Ctrl-C is 130.
    Anything else is a bug: re-raised with -v (for the traceback), else named in one line, code 1.
    """
    if isinstance(exc, PipelineError):
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        return EXIT_INTERRUPTED
    if "No space left on device" in str(exc) and not isinstance(exc, OSError):  # safetensors' writer, in words
        exc = OSError(errno.ENOSPC, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, OSError) and exc.errno in DISK_ERRORS:  # the machine's state, not a bug: say which file
        where = f" writing {exc.filename}" if exc.filename else ""
        click.echo(f"error: {DISK_ERRORS[exc.errno]}{where} ({exc.strerror}); a stage's unfinished output is removed, not kept.\n"
                   "Fix: free space or choose another --engines-dir, then run the command again", err=True)
        return EXIT_UNAVAILABLE
    if log.isEnabledFor(logging.DEBUG):
        raise exc
    click.echo(f"internal error: {type(exc).__name__}: {exc}\n(re-run with -v for the traceback)", err=True)
    return EXIT_FAILED


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
