"""Errors a user can act on. The CLI prints them as one paragraph and exits with their code.

Exit codes are part of the interface that CI scripts rely on:
  0 success, 1 the work ran and failed (gate failed, build failed, server died),
  2 bad input (config, arguments, missing data or files) or a result that cannot be judged,
  3 this machine cannot do it (TensorRT-LLM, GPU or hub missing).
"""

from __future__ import annotations

import dataclasses

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3


class PipelineError(Exception):
    """An error with a message meant for the user and a suggested fix."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\nFix: {self.fix}" if self.fix else self.message

    def __reduce__(self):
        # pickled with its fix (Exception's own pickling would pass ``args``, the message alone): a bench client
        # process's error reaches the parent whole
        return type(self), (self.message, self.fix)


class ConfigError(PipelineError):
    """A build config (or another input file) is invalid."""

    exit_code = EXIT_USAGE


class InputError(PipelineError):
    """An argument, data file or artifact given to a stage is missing or malformed."""

    exit_code = EXIT_USAGE


class UnavailableError(PipelineError):
    """Something this machine lacks: TensorRT-LLM, a suitable GPU, network access to the hub."""

    exit_code = EXIT_UNAVAILABLE


class StageFailed(PipelineError):
    """The stage ran and failed (a subprocess exited non-zero, a server never became ready)."""

    exit_code = EXIT_FAILED


@dataclasses.dataclass(frozen=True)
class Problem:
    """Why something cannot run here and what to do about it: a pre-flight finding, before any error.

    Callers read ``problem`` (a short reason, e.g. why ``--runtime auto`` chose another runtime) and
    ``fix`` separately; ``str()`` is the full sentence a list of problems shows.
    """

    problem: str  # without a final period
    fix: str | None = None

    def __str__(self) -> str:
        return f"{self.problem}. Fix: {self.fix}." if self.fix else f"{self.problem}."


def bullets(problems) -> str:
    """Problems as an indented list under a message's first line."""
    return "".join(f"\n  - {p}" for p in problems)
