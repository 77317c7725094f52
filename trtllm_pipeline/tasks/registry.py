"""The evaluation tasks, one registration line each; config validation, gate, report and demo read them here."""

from __future__ import annotations

from typing import Iterable, Literal

from trtllm_pipeline.errors import InputError
from trtllm_pipeline.tasks import fidelity, gsm8k, mmlu
from trtllm_pipeline.tasks.base import Task

TASKS: dict[str, Task] = {task.name: task for task in (
    mmlu.TASK,
    gsm8k.TASK,
    fidelity.TASK,
)}
# A task name where a file may hold one (build configs, gates.yaml): pydantic names the choices in its errors.
TaskName = Literal[tuple(TASKS)]  # type: ignore[valid-type]


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise InputError(f"unknown task {name!r}.", fix=f"use one or more of {', '.join(TASKS)}")
    return TASKS[name]


def task_names(requested: Iterable[str]) -> list[str]:
    """``--tasks`` as a list of known task names, each once, in the order given."""
    names = [t.strip() for t in requested if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise InputError(f"--tasks: unknown task(s) {', '.join(unknown) or '(none given)'}.",
                         fix=f"use a comma-separated list of {', '.join(TASKS)}")
    return list(dict.fromkeys(names))
