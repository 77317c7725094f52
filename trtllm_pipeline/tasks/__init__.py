"""Accuracy tasks, after lm-evaluation-harness's task registry: one module per task.

Each task module (``mmlu``, ``gsm8k``) provides the same four functions, used by the eval stage:

* ``settings(evaluation, limit) -> dict``: everything that changes the prompts or the scoring
  (shots, format, seed, generation budget). Two results are comparable only when equal.
* ``load(data_dir) -> TaskData``: the evaluation items and the few-shot pool, from the hub or files.
* ``run(runtime, items, data, settings, *, batch_size, input_limit, progress) -> list[dict]``: one
  record per item (``id``, ``correct``, ``prediction``, ``target`` and task details); an item whose
  prompt cannot fit ``input_limit`` tokens gets ``correct: None`` and an ``error``.
* ``subscores(records) -> dict``: named groups of item records (MMLU categories, GSM8K filters).

Prompts follow lm-eval's ``mmlu`` and ``gsm8k`` task configs so that scores are comparable with
lm-eval and published tables; where this code differs on purpose, the task module says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
from types import ModuleType
from typing import Any

from trtllm_pipeline.errors import InputError

TASK_NAMES = ("mmlu", "gsm8k")


@dataclasses.dataclass(frozen=True)
class Item:
    """One evaluation question."""

    id: str  # stable across runs, runtimes and data sources: "<subject>/<row>", "test/<row>"
    stratum: str  # what ``--limit`` stratifies on (MMLU subject, GSM8K solution length)
    doc: dict[str, Any]  # the task's fields, normalised (question, choices, answer, ...)


@dataclasses.dataclass(frozen=True)
class TaskData:
    items: list[Item]  # the whole evaluation split, in the release's order
    fewshot: dict[str, list[dict[str, Any]]]  # few-shot pools (MMLU: dev rows per subject; GSM8K: train)
    source: str  # where it came from (hub id or directory), for the results file


def get_task(name: str) -> ModuleType:
    if name not in TASK_NAMES:
        raise InputError(f"unknown task {name!r}.", fix=f"use one or more of {', '.join(TASK_NAMES)}")
    return importlib.import_module(f"trtllm_pipeline.tasks.{name}")


def prompt_sha256(text: str) -> str:
    """Short hash of a prompt's exact text: two results compare only when their prompts are identical."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]
