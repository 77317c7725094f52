"""Accuracy tasks, after lm-evaluation-harness's task registry: one module per task.

Each task module (``mmlu``, ``gsm8k``) holds everything about its task (data loading, prompts,
scoring, sub-scores, gate default) and ends with the ``Task`` record (``base.Task``) that
``registry`` lists; ``model.LanguageModel`` is what a task asks of a model. The shared parts:
``data`` (reading the hub or local files), ``tokens`` (tokenizing as lm-eval does), ``subset``
(``--limit``), ``stats`` (intervals and the paired comparison).

Prompts follow lm-eval's ``mmlu`` and ``gsm8k`` task configs so that scores are comparable with
lm-eval and published tables; where this code differs on purpose, the task module says so.
"""
