"""What a task is made of: its items, its data, and the record that registers it (``Task``)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any, Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Item:
    """One evaluation question."""

    id: str  # stable across runs, runtimes and data sources: "<subject>/<row>", "test/<row>"
    stratum: str  # what ``--limit`` stratifies on (MMLU subject, GSM8K solution length)
    doc: dict[str, Any]  # the task's fields (question, choices, answer, ...)


@dataclasses.dataclass(frozen=True)
class TaskData:
    items: list[Item]  # the whole evaluation split, in the release's order
    fewshot: dict[str, list[dict[str, Any]]]  # few-shot pools (MMLU: dev rows per subject; GSM8K: train)
    source: str  # where it came from (hub id or directory), for the results file


@dataclasses.dataclass(frozen=True)
class Task:
    """One evaluation task, as its module registers it (``tasks.registry.TASKS``).

    * ``settings(evaluation, limit) -> dict``: everything that changes the prompts or the scoring
      (shots, format, seed, generation budget). Two results are comparable only when equal.
    * ``load(data_dir) -> TaskData``: the evaluation items and the few-shot pool, from the hub or files.
    * ``run(model, items, data, settings, *, batch_size, input_limit, progress) -> list[dict]``: one
      record per item (``id``, ``correct``, ``prediction``, ``target`` and task details), prompts
      built and scored with a ``tasks.model.LanguageModel``; an item whose prompt cannot fit
      ``input_limit`` tokens gets ``correct: None`` and an ``error``.
    * ``subscores(records) -> dict``: named groups of item records (MMLU categories, GSM8K filters).
    * ``reference``: the task compares the build with a reference build (fidelity): ``eval`` opens
      the reference's runtime too and passes it to ``run`` as ``reference=`` (None: the build is its own).
    * ``cell(results, detail) -> str``: how the report and ``eval`` show a result; None: the score as accuracy.
    * ``records_per_item``: records ``run`` returns per item (fidelity: an item is a chunk of text, a
      record one of its scored tokens); ``unit`` names them.
    """

    name: str  # as --tasks, evaluation.tasks, gates.yaml and the results file name it
    label: str  # as the report shows it
    settings: Callable[[Any, int | None], dict[str, Any]]
    load: Callable[[Path | None], TaskData]
    run: Callable[..., list[dict]]
    subscores: Callable[[Sequence[dict]], dict[str, dict[str, dict]]]
    max_drop: float  # the gate's allowed accuracy drop (points) where the gates file sets none
    demo_limits: tuple[int, int]  # items `make demo` evaluates: (normally, with --fast)
    reference: bool = False
    cell: Callable[[dict, bool], str] | None = None
    records_per_item: int = 1
    unit: str = "items"


def prompt_sha256(text: str) -> str:
    """Short hash of a prompt's exact text: two results compare only when their prompts are identical."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]
