"""GSM8K (Cobbe et al.): grade-school math word problems, scored by exact match of the final number.

Two prompt formats (``evaluation.gsm8k_mode``):

* ``lm-eval``: lm-evaluation-harness's ``gsm8k`` task. Five train-split exemplars as
  ``Question: ...\\nAnswer: <worked solution ending in #### N>``, blank-line separated, then the
  test question and ``Answer:``; greedy generation until ``Question:`` (256 new tokens). Two
  extractions, as lm-eval's filters: ``strict-match`` takes the first ``#### N``,
  ``flexible-extract`` the last number in the output. lm-eval draws fresh random exemplars per
  question; here one seeded draw serves every question (same exemplars on every run, and one
  shared prefix), recorded through each item's prompt hash.
* ``reasoning``: for R1-distill models, as DeepSeek evaluates them: the chat template, zero-shot,
  the question followed by "Please reason step by step, and put your final answer within
  \\boxed{}.", a long budget (4096 new tokens). The answer is read after ``</think>``:
  ``strict-match`` is the last ``\\boxed{}`` there (nothing when the model never closed its
  reasoning), ``flexible-extract`` the last ``\\boxed{}`` anywhere, else the last number.

The item's ``correct`` is strict-match; both are reported. Numbers compare as numbers after
lm-eval's normalisation (commas, ``$`` and a trailing period dropped): ``18.00`` matches ``18``,
which lm-eval's string comparison counts wrong; no other difference.
"""

from __future__ import annotations

import random
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Sequence

from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.tasks import data, tokens
from trtllm_pipeline.tasks.base import Item, Task, TaskData, prompt_sha256
from trtllm_pipeline.tasks.model import LanguageModel
from trtllm_pipeline.tasks.stats import summarize

LM_EVAL_SHOTS = 5
LM_EVAL_STOP = ("Question:", "</s>", "<|im_end|>")
REASONING_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
DEFAULT_MAX_NEW_TOKENS = {"lm-eval": 256, "reasoning": 4096}
FILTERS = ("strict-match", "flexible-extract")

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")  # lm-eval gsm8k strict-match
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # lm-eval gsm8k flexible-extract (last match)
NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")


def settings(evaluation, limit: int | None) -> dict[str, Any]:
    mode = evaluation.gsm8k_mode
    budget = evaluation.gsm8k_max_new_tokens or DEFAULT_MAX_NEW_TOKENS[mode]
    common = {"mode": mode, "limit": limit, "seed": evaluation.seed, "max_new_tokens": budget, "sampling": "greedy"}
    if mode == "lm-eval":
        return {"format": "lm-eval gsm8k: 'Question: ...\\nAnswer:' with train exemplars",
                "shots": LM_EVAL_SHOTS, "stop": list(LM_EVAL_STOP), **common}
    return {"format": "chat template, zero-shot, step-by-step with \\boxed{} answer", "shots": 0,
            "instruction": REASONING_INSTRUCTION, "stop": [], **common}


def load(data_dir) -> TaskData:
    test, train, source = data.gsm8k_rows(data_dir)
    items = [Item(id=item_id, stratum=_difficulty(row["answer"]), doc=data.without_item_id(row))
             for item_id, row in zip(data.item_ids(test, source, lambda row: "test"), test)]
    return TaskData(items=items, fewshot={"train": [data.without_item_id(row) for row in train]}, source=source)


def _difficulty(solution: str) -> str:
    """Stratum for --limit: the reference solution's number of steps (lines before '####'), 2..8+."""
    steps = len(solution.split("####")[0].strip().splitlines())
    return f"{min(max(steps, 2), 8)} steps"


# --------------------------------------------------------------------------- prompts


def exemplars(train: Sequence[dict], seed: int, shots: int = LM_EVAL_SHOTS) -> list[dict]:
    return [train[i] for i in random.Random(seed).sample(range(len(train)), shots)]


def lm_eval_prompt(question: str, shots: Sequence[dict]) -> str:
    fewshot = "".join(f"Question: {ex['question']}\nAnswer: {ex['answer']}\n\n" for ex in shots)
    return f"{fewshot}Question: {question}\nAnswer:"


def reasoning_prompt(tokenizer, question: str) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("gsm8k reasoning mode needs the model's chat template, and this tokenizer has none.",
                         fix="set evaluation.gsm8k_mode: lm-eval for a base model")
    message = {"role": "user", "content": f"{question}\n{REASONING_INSTRUCTION}"}
    return tokenizer.apply_chat_template([message], tokenize=False, add_generation_prompt=True)


# --------------------------------------------------------------------------- answers


def target_number(solution: str) -> str:
    return normalize_number(solution.split("####")[-1])


def normalize_number(text: str | None) -> str | None:
    """Canonical form of an extracted answer: lm-eval's normalisation, then as a decimal number.

    Drops commas, ``$`` and a trailing period (lm-eval's ``regexes_to_ignore``), then writes the
    number without exponent or trailing zeros: "1,000" -> "1000", "$18.00" -> "18", "-3." -> "-3".
    Text that is not a number is kept, lower-cased, and matches only the same text.
    """
    if text is None:
        return None
    text = re.sub(r"\.$", "", text.strip().replace("\u2212", "-").replace(",", "").replace("$", ""))
    try:
        value = Decimal(text)
    except InvalidOperation:
        return text.lower()
    if not value.is_finite():
        return text.lower()
    canonical = format(value.normalize(), "f")
    return "0" if canonical in ("-0", "0") else canonical


def extract_strict(output: str) -> str | None:
    match = STRICT.search(output)
    return match.group(1).strip() if match else None


def extract_flexible(output: str) -> str | None:
    matches = FLEXIBLE.findall(output)
    if not matches:
        return None
    return next(group for group in matches[-1] if group).strip()


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; ``\\boxed 5`` too."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:].split("box", 1)[1].removeprefix("ed")
    if rest.startswith(" "):
        match = NUMBER.search(rest)
        return match.group(0) if match and rest[: match.start()].strip() == "" else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return rest[1:i]
    return None  # unbalanced: the output was cut off inside the box


def boxed_number(content: str | None) -> str | None:
    """The number in a boxed answer, LaTeX dressing removed: ``18\\text{ dollars}``, ``\\$1{,}000``,
    ``x = 5``, ``\\frac{3}{4}``; the content itself when it holds no number."""
    if content is None:
        return None
    cleaned = re.sub(r"\\text\{[^{}]*\}|\\[,!;: ]|\{,\}|\\\$|\\%|%|\$", "", content).replace("\u2212", "-")
    cleaned = re.sub(r"(?<=\d),(?=\d{3}\b)", "", cleaned).rsplit("=", 1)[-1].strip()
    fraction = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", cleaned)
    if fraction and int(fraction.group(3)):
        return fraction.group(1) + format(Decimal(fraction.group(2)) / Decimal(fraction.group(3)), "f")
    match = NUMBER.search(cleaned)
    return match.group(0) if match else cleaned


def extract_reasoning(output: str, opened_think: bool) -> tuple[str | None, str | None]:
    """(strict, flexible) answers of a reasoning-mode output."""
    closed = "</think>" in output
    answer = output.rsplit("</think>", 1)[1] if closed else output
    strict = boxed_number(last_boxed(answer)) if closed or not opened_think else None
    flexible = boxed_number(last_boxed(output))
    if flexible is None:
        flexible = extract_flexible(answer)
    return strict, flexible


# --------------------------------------------------------------------------- generation


def run(model: LanguageModel, items: Sequence[Item], task_data: TaskData, settings: dict, *, batch_size: int,
        input_limit: int, progress) -> list[dict]:
    """Generate greedily for every item, ``batch_size`` requests in flight per ``generate`` call."""
    tok = model.tokenizer
    params = SamplingParams(max_tokens=settings["max_new_tokens"], temperature=0.0,
                            stop_words=tuple(settings["stop"]))
    pool = exemplars(task_data.fewshot["train"], settings["seed"]) if settings["mode"] == "lm-eval" else []
    records: dict[str, dict] = {}
    ready = []
    for item in items:
        prepared = _prepare(tok, item, pool, settings, input_limit)
        if "error" in prepared["record"]:
            records[item.id] = prepared["record"]
            progress.update(1)
        else:
            ready.append(prepared)
    for start in range(0, len(ready), batch_size):
        chunk = ready[start : start + batch_size]
        for p, completion in zip(chunk, model.generate([p["ids"] for p in chunk], params)):
            records[p["record"]["id"]] = _record(p, completion, settings["mode"])
        progress.update(len(chunk))
    return [records[item.id] for item in items]


def _prepare(tok, item: Item, pool: list[dict], settings: dict, limit: int) -> dict:
    record = {"id": item.id, "target": target_number(item.doc["answer"])}
    if settings["mode"] == "reasoning":
        candidates = [(reasoning_prompt(tok, item.doc["question"]), 0)]
    else:
        candidates = [(lm_eval_prompt(item.doc["question"], pool[:k]), k) for k in range(len(pool), -1, -1)]
    for prompt, shots in candidates:
        ids = tokens.encode(tok, prompt)
        if len(ids) <= limit:
            record["prompt_sha256"] = prompt_sha256(prompt)
            if shots < settings["shots"]:
                record["shots"] = shots
            return {"record": record, "ids": ids, "opened_think": prompt.rstrip().endswith("<think>")}
    record.update(correct=None, prediction=None,
                  error=f"the prompt does not fit the engine's {limit}-token input limit")
    return {"record": record}


def _record(prepared: dict, completion, mode: str) -> dict:
    record, output = prepared["record"], completion.text
    if mode == "reasoning":
        strict, flexible = extract_reasoning(output, prepared["opened_think"] or "<think>" in output)
    else:
        strict, flexible = extract_strict(output), extract_flexible(output)
    target = record["target"]
    return {**record, "correct": normalize_number(strict) == target, "prediction": strict,
            "correct_flexible": normalize_number(flexible) == target, "prediction_flexible": flexible,
            "output": output, "output_tokens": len(completion.token_ids), "finish_reason": completion.finish_reason}


def subscores(records: Sequence[dict]) -> dict[str, dict[str, dict]]:
    scored = [r for r in records if r.get("correct") is not None]
    return {"filter": {"strict-match": summarize([r["correct"] for r in scored]),
                       "flexible-extract": summarize([r["correct_flexible"] for r in scored])}}


TASK = Task(name="gsm8k", label="GSM8K", settings=settings, load=load, run=run, subscores=subscores,
            max_drop=2.0, demo_limits=(4, 2))
