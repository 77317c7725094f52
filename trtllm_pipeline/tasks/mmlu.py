"""MMLU (Hendrycks et al.): 57 subjects, 5-shot, scored by the log-likelihood of the answer letter.

The prompt is lm-evaluation-harness's ``mmlu`` task (``mmlu/default/_default_template_yaml``):
the subject's description line, the first five dev-split questions of the subject each followed
by `` <letter>`` and a blank line, then the test question with ``A.``..``D.`` choices and
``Answer:``. The model's answer is the letter among `` A``.. `` D`` with the highest
log-likelihood after that prompt (lm-eval's ``acc``). Overall and per-category scores are
averages over items (lm-eval's ``weight_by_size``), so they match lm-eval's group scores.

Where a prompt does not fit the engine's input limit, shots are dropped one at a time until it
does (the original MMLU evaluation's rule) and the item records how many it kept.
"""

from __future__ import annotations

from typing import Any, Sequence

from trtllm_pipeline.errors import InputError
from trtllm_pipeline.tasks import data, tokens
from trtllm_pipeline.tasks.base import Item, Task, TaskData, prompt_sha256
from trtllm_pipeline.tasks.model import LanguageModel
from trtllm_pipeline.tasks.stats import summarize

SHOTS = 5
LETTERS = data.LETTERS
CATEGORIES = ("stem", "humanities", "social_sciences", "other")

# Subject -> category, as lm-eval's mmlu/_generate_configs.py groups them.
SUBJECTS = {
    "abstract_algebra": "stem", "anatomy": "stem", "astronomy": "stem", "business_ethics": "other",
    "clinical_knowledge": "other", "college_biology": "stem", "college_chemistry": "stem",
    "college_computer_science": "stem", "college_mathematics": "stem", "college_medicine": "other",
    "college_physics": "stem", "computer_security": "stem", "conceptual_physics": "stem",
    "econometrics": "social_sciences", "electrical_engineering": "stem", "elementary_mathematics": "stem",
    "formal_logic": "humanities", "global_facts": "other", "high_school_biology": "stem",
    "high_school_chemistry": "stem", "high_school_computer_science": "stem",
    "high_school_european_history": "humanities", "high_school_geography": "social_sciences",
    "high_school_government_and_politics": "social_sciences", "high_school_macroeconomics": "social_sciences",
    "high_school_mathematics": "stem", "high_school_microeconomics": "social_sciences",
    "high_school_physics": "stem", "high_school_psychology": "social_sciences", "high_school_statistics": "stem",
    "high_school_us_history": "humanities", "high_school_world_history": "humanities", "human_aging": "other",
    "human_sexuality": "social_sciences", "international_law": "humanities", "jurisprudence": "humanities",
    "logical_fallacies": "humanities", "machine_learning": "stem", "management": "other", "marketing": "other",
    "medical_genetics": "other", "miscellaneous": "other", "moral_disputes": "humanities",
    "moral_scenarios": "humanities", "nutrition": "other", "philosophy": "humanities", "prehistory": "humanities",
    "professional_accounting": "other", "professional_law": "humanities", "professional_medicine": "other",
    "professional_psychology": "social_sciences", "public_relations": "social_sciences",
    "security_studies": "social_sciences", "sociology": "social_sciences", "us_foreign_policy": "social_sciences",
    "virology": "other", "world_religions": "humanities",
}


def settings(evaluation, limit: int | None) -> dict[str, Any]:
    return {
        "format": "lm-eval mmlu: subject description, dev-split first-n shots, A.-D. choices, 'Answer:'",
        "scoring": "log-likelihood of ' A'..' D' (acc)",
        "shots": SHOTS,
        "limit": limit,
        "seed": evaluation.seed,
    }


def load(data_dir) -> TaskData:
    test, dev, source = data.mmlu_rows(data_dir)
    unknown = sorted({r["subject"] for r in test} - set(SUBJECTS))
    if unknown:
        raise InputError(f"{source}: subjects {unknown[:3]} are not MMLU's 57 subjects.",
                         fix="point --data-dir at the MMLU release (test/ and dev/ CSVs) or cais/mmlu files")
    fewshot: dict[str, list[dict]] = {}
    for row in dev:
        fewshot.setdefault(row["subject"], []).append(data.without_item_id(row))
    items = []
    for item_id, row in zip(data.item_ids(test, source, lambda row: row["subject"]), test):
        subject = row["subject"]
        if not fewshot.get(subject):
            raise InputError(f"{source}: subject {subject} has test questions but no dev-split exemplars.",
                             fix="include the dev split (dev/<subject>_dev.csv)")
        items.append(Item(id=item_id, stratum=subject, doc=data.without_item_id(row)))
    return TaskData(items=items, fewshot=fewshot, source=source)


# --------------------------------------------------------------------------- prompt


def description(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"


def format_question(doc: dict) -> str:
    choices = "".join(f"\n{letter}. {choice}" for letter, choice in zip(LETTERS, doc["choices"]))
    return f"{doc['question'].strip()}{choices}\nAnswer:"


def build_prompt(doc: dict, exemplars: Sequence[dict], shots: int = SHOTS) -> str:
    shots_text = "".join(f"{format_question(ex)} {ex['answer']}\n\n" for ex in exemplars[:shots])
    return description(doc["subject"]) + shots_text + format_question(doc)


# --------------------------------------------------------------------------- scoring


def run(model: LanguageModel, items: Sequence[Item], task_data: TaskData, settings: dict, *, batch_size: int,
        input_limit: int, progress) -> list[dict]:
    """Score every item; one ``model.score`` call per ``batch_size`` questions of one subject.

    Questions of one subject share the description and few-shot block, so each call's contexts
    share a long token prefix (an in-process runtime computes it once), and the four letters of one
    question share the whole context.
    """
    tok = model.tokenizer
    by_subject: dict[str, list[Item]] = {}
    for item in items:
        by_subject.setdefault(item.doc["subject"], []).append(item)
    records: dict[str, dict] = {}
    for subject, group in by_subject.items():
        pool = task_data.fewshot[subject][: settings["shots"]]
        ready, failed = _prepare(tok, group, pool, settings["shots"], input_limit)
        for record in failed:
            records[record["id"]] = record
        progress.update(len(failed))
        ready.sort(key=lambda p: len(p["context"]))  # similar lengths per runtime batch: less padding
        for start in range(0, len(ready), batch_size):
            chunk = ready[start : start + batch_size]
            scores = model.score([p["context"] for p in chunk for _ in LETTERS],
                                   [c for p in chunk for c in p["letters"]])
            for i, p in enumerate(chunk):
                logprobs = [lp for lp, _ in scores[4 * i : 4 * i + 4]]
                records[p["record"]["id"]] = _record(p, logprobs)
            progress.update(len(chunk))
    return [records[item.id] for item in items]


def _prepare(tok, group: list[Item], pool: list[dict], shots: int, limit: int) -> tuple[list[dict], list[dict]]:
    """Token ids of each question's context and four letters, with as many shots as fit ``limit``.

    Returns (ready, failed): failed are records of questions whose zero-shot prompt is too long.
    """
    ready, pending = [], list(group)
    for k in range(shots, -1, -1):
        if not pending:
            break
        prompts = [build_prompt(item.doc, pool, k) for item in pending]
        pairs = tokens.encode_pairs(tok, [(prompt, f" {letter}") for prompt in prompts for letter in LETTERS])
        too_long = []
        for j, (item, prompt) in enumerate(zip(pending, prompts)):
            four = pairs[4 * j : 4 * j + 4]
            if max(len(c) + len(x) for c, x in four) > limit:
                too_long.append(item)
                continue
            record = {"id": item.id, "subject": item.doc["subject"], "target": item.doc["answer"],
                      "prompt_sha256": prompt_sha256(prompt), **({"shots": k} if k < shots else {})}
            ready.append({"record": record, "context": four[0][0], "letters": [x for _, x in four]})
        pending = too_long
    failed = [{"id": item.id, "subject": item.doc["subject"], "target": item.doc["answer"], "correct": None,
               "prediction": None, "error": f"the zero-shot prompt does not fit the engine's {limit}-token input limit"}
              for item in pending]
    return ready, failed


def _record(prepared: dict, logprobs: list[float]) -> dict:
    record = prepared["record"]
    best = max(range(len(LETTERS)), key=lambda i: logprobs[i])  # first of ties, as numpy's argmax
    prediction = LETTERS[best]
    return {**record, "correct": prediction == record["target"], "prediction": prediction,
            "logprobs": [round(lp, 6) for lp in logprobs]}


def subscores(records: Sequence[dict]) -> dict[str, dict[str, dict]]:
    """Accuracy per category and per subject (items scored only)."""
    by_category: dict[str, list[bool]] = {c: [] for c in CATEGORIES}
    by_subject: dict[str, list[bool]] = {}
    for r in records:
        if r.get("correct") is None:
            continue
        by_category[SUBJECTS[r["subject"]]].append(r["correct"])
        by_subject.setdefault(r["subject"], []).append(r["correct"])
    return {"category": {c: summarize(v) for c, v in by_category.items() if v},
            "subject": {s: summarize(v) for s, v in sorted(by_subject.items())}}


TASK = Task(name="mmlu", label="MMLU", settings=settings, load=load, run=run, subscores=subscores,
            max_drop=1.0, demo_limits=(20, 4))
