"""The task layer on the real MMLU/GSM8K files: data, prompts (pinned), tokenization, extraction, subsets."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONFIGS, run_cli

from trtllm_pipeline.errors import InputError
from trtllm_pipeline.tasks import gsm8k, mmlu, tokens
from trtllm_pipeline.tasks.base import Item
from trtllm_pipeline.tasks.subset import allocate, stratified_subset


@pytest.fixture(scope="module")
def mmlu_data(data_dir):
    return mmlu.load(data_dir)


@pytest.fixture(scope="module")
def gsm8k_data(data_dir):
    return gsm8k.load(data_dir)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from trtllm_pipeline.model.builtin import builtin_model_dir

    return AutoTokenizer.from_pretrained(builtin_model_dir("tiny-qwen2"))


# --------------------------------------------------------------------------- data


def test_mmlu_release_is_read_whole_and_exactly(mmlu_data):
    assert len(mmlu_data.items) == 14042
    assert len(mmlu_data.fewshot) == 57 and all(len(rows) == 5 for rows in mmlu_data.fewshot.values())
    by_id = {it.id: it.doc for it in mmlu_data.items}
    assert len(by_id) == 14042  # ids are unique
    assert sum(1 for it in mmlu_data.items if it.stratum == "professional_law") == 1534
    # A quoted field with newlines stays one field; "None" stays a string (no type guessing).
    doc = by_id["college_computer_science/10"]
    assert doc["question"].endswith("\nI. A singly linked list\nII. A doubly linked list\nIII. An array")
    assert doc["choices"] == ["None", "III only", "I and II only", "I, II, and III"] and doc["answer"] == "D"
    assert not any("\r" in it.doc["question"] or any("\r" in c for c in it.doc["choices"]) for it in mmlu_data.items)


def test_mmlu_field_text_is_kept_verbatim_crlf_included(mmlu_data, data_dir):
    # college_mathematics' dev row 2 holds the release's only CRLFs; lm-evaluation-harness keeps them, so do we.
    import csv

    with open(data_dir / "mmlu" / "dev" / "college_mathematics_dev.csv", newline="", encoding="utf-8") as f:
        raw = list(csv.reader(f))[2]
    row = mmlu_data.fewshot["college_mathematics"][2]
    assert "must be true?\r\nI. All of the entries" in row["question"]
    assert [row["question"], *row["choices"], row["answer"]] == raw
    item = next(it for it in mmlu_data.items if it.stratum == "college_mathematics")
    prompt = mmlu.build_prompt(item.doc, mmlu_data.fewshot["college_mathematics"])
    assert "must be true?\r\nI. All of the entries" in prompt
    assert prompt.count("\r") == prompt.count("\r\n") == row["question"].count("\r\n") == 3


def test_gsm8k_files_are_read_whole(gsm8k_data):
    assert len(gsm8k_data.items) == 1319 and len(gsm8k_data.fewshot["train"]) == 7473
    assert gsm8k_data.items[0].id == "test/0" and gsm8k_data.items[0].doc["question"].startswith("Janet’s ducks")
    assert gsm8k.target_number(gsm8k_data.items[0].doc["answer"]) == "18"


def test_hub_layout_parquet_gives_the_same_items_as_the_csv_release(mmlu_data, tmp_path):
    import datasets

    rows = [dict(it.doc) for it in mmlu_data.items if it.stratum in ("anatomy", "virology")]
    dev = [r for s in ("anatomy", "virology") for r in mmlu_data.fewshot[s]]
    hub_style = lambda rs: [{**r, "answer": "ABCD".index(r["answer"])} for r in rs]  # noqa: E731  cais/mmlu: 0..3
    (tmp_path / "all").mkdir()
    datasets.Dataset.from_list(hub_style(rows)).to_parquet(str(tmp_path / "all" / "test-00000-of-00001.parquet"))
    datasets.Dataset.from_list(hub_style(dev)).to_parquet(str(tmp_path / "all" / "dev-00000-of-00001.parquet"))
    loaded = mmlu.load(tmp_path)
    expected = [it for it in mmlu_data.items if it.stratum in ("anatomy", "virology")]
    assert [(it.id, it.doc) for it in loaded.items] == [(it.id, it.doc) for it in expected]
    assert loaded.fewshot == {s: mmlu_data.fewshot[s] for s in ("anatomy", "virology")}


def test_missing_local_data_is_a_clear_input_error(tmp_path):
    with pytest.raises(InputError, match="no mmlu data found") as err:
        mmlu.load(tmp_path)
    assert "--data-dir" in err.value.fix
    with pytest.raises(InputError, match="no such directory"):
        gsm8k.load(tmp_path / "nowhere")


def test_unreachable_hub_without_data_dir_says_what_to_do(tmp_path):
    code = ("from trtllm_pipeline.tasks import gsm8k\n"
            "try:\n gsm8k.load(None)\nexcept Exception as e:\n print(type(e).__name__, e)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("UnavailableError cannot load openai/gsm8k (main, test) from the Hugging Face hub")
    assert "--data-dir" in out


# --------------------------------------------------------------------------- prompts (pinned)

MMLU_ABSTRACT_ALGEBRA_0 = """\
The following are multiple choice questions (with answers) about abstract algebra.

Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.
A. 0
B. 1
C. 2
D. 3
Answer: B

Statement 1 | If aH is an element of a factor group, then |aH| divides |a|. Statement 2 | If H and K are subgroups of G then HK is a subgroup of G.
A. True, True
B. False, False
C. True, False
D. False, True
Answer: B

Statement 1 | Every element of a group generates a cyclic subgroup of the group. Statement 2 | The symmetric group S_10 has 10 elements.
A. True, True
B. False, False
C. True, False
D. False, True
Answer: C

Statement 1| Every function from a finite set onto itself must be one to one. Statement 2 | Every subgroup of an abelian group is abelian.
A. True, True
B. False, False
C. True, False
D. False, True
Answer: A

Find the characteristic of the ring 2Z.
A. 0
B. 3
C. 12
D. 30
Answer: A

Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.
A. 0
B. 4
C. 2
D. 6
Answer:"""


def test_mmlu_prompt_is_lm_eval_format(mmlu_data):
    item = mmlu_data.items[0]
    assert item.id == "abstract_algebra/0" and item.doc["answer"] == "B"
    assert mmlu.build_prompt(item.doc, mmlu_data.fewshot["abstract_algebra"]) == MMLU_ABSTRACT_ALGEBRA_0
    zero_shot = mmlu.build_prompt(item.doc, mmlu_data.fewshot["abstract_algebra"], shots=0)
    assert zero_shot == MMLU_ABSTRACT_ALGEBRA_0.split("\n\n")[0] + "\n\n" + MMLU_ABSTRACT_ALGEBRA_0.split("\n\n")[-1]


def test_gsm8k_lm_eval_prompt_is_pinned(gsm8k_data):
    train = gsm8k_data.fewshot["train"]
    shots = gsm8k.exemplars(train, seed=1234)
    assert shots == [train[i] for i in (6374, 3610, 957, 61, 742)]  # one seeded draw, the same every run
    prompt = gsm8k.lm_eval_prompt(gsm8k_data.items[0].doc["question"], shots)
    blocks = prompt.split("\n\nQuestion: ")
    assert len(blocks) == 6 and blocks[0].startswith("Question: " + train[6374]["question"] + "\nAnswer: ")
    assert blocks[0].endswith(train[6374]["answer"]) and blocks[0].split("\n")[-1].startswith("#### ")
    assert blocks[-1] == (
        "Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her "
        "friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. "
        "How much in dollars does she make every day at the farmers' market?\nAnswer:")
    # The whole text, pinned: any change to exemplars, separators or wording shows here.
    digest = hashlib.sha256(prompt.encode()).hexdigest()
    assert digest == "32680f263ba83280e98a8a24ceefed10a722a4cdcd9f4d78e93c45d43143ca66"


def test_gsm8k_reasoning_prompt_uses_the_chat_template(tokenizer):
    prompt = gsm8k.reasoning_prompt(tokenizer, "What is 2 + 3?")
    assert prompt == ("<｜begin▁of▁sentence｜><｜User｜>What is 2 + 3?\n"
                      "Please reason step by step, and put your final answer within \\boxed{}.<｜Assistant｜><think>\n")
    ids = tokens.encode(tokenizer, prompt)
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id  # BOS once, not twice


def test_continuations_are_split_from_a_joint_tokenization(tokenizer):
    (ctx, cont), (ctx2, cont2) = tokens.encode_pairs(tokenizer, [("Q?\nAnswer:", " B"), ("Q?\nAnswer: ", "B")])
    assert ctx[0] == tokenizer.bos_token_id  # the tokenizer's post-processor adds BOS, as R1's does
    assert ctx + cont == tokenizer.encode("Q?\nAnswer: B")
    assert len(cont) == 1 and tokenizer.decode(cont) == " B"
    assert (ctx2, cont2) == (ctx, cont)  # trailing space moves to the continuation (lm-eval convention)


def test_shots_are_dropped_until_the_prompt_fits(mmlu_data, tokenizer):
    item, pool = mmlu_data.items[0], mmlu_data.fewshot["abstract_algebra"]
    full = len(tokens.encode(tokenizer, mmlu.build_prompt(item.doc, pool))) + 1
    limit = full - 1  # one token short of the 5-shot prompt
    (ready,), failed = mmlu._prepare(tokenizer, [item], pool, 5, limit)
    kept = ready["record"]["shots"]
    assert not failed and kept < 5 and len(ready["context"]) + 1 <= limit
    assert ready["record"]["prompt_sha256"] == mmlu.prompt_sha256(mmlu.build_prompt(item.doc, pool, kept))
    assert len(tokens.encode(tokenizer, mmlu.build_prompt(item.doc, pool, kept + 1))) + 1 > limit
    ready, (failed,) = mmlu._prepare(tokenizer, [item], pool, 5, 10)
    assert not ready and failed["correct"] is None and "does not fit" in failed["error"]


# --------------------------------------------------------------------------- answer extraction


@pytest.mark.parametrize("output, strict, flexible", [
    ("She makes 9 * 2 = $18.\n#### 18", "18", "18"),
    ("#### 1,234 dollars in total", "1234", "1234"),
    ("The loss is #### -5", "-5", "-5"),
    ("#### $18.00.", None, "18"),  # strict-match wants digits right after '#### ', as lm-eval's regex
    ("It costs 3.5 per day, so 7 in total.", None, "7"),
    ("#### 12\n\nQuestion: and then 40", "12", "40"),
    ("no digits at all", None, None),
])
def test_lm_eval_extraction(output, strict, flexible):
    assert gsm8k.normalize_number(gsm8k.extract_strict(output)) == strict
    assert gsm8k.normalize_number(gsm8k.extract_flexible(output)) == flexible


@pytest.mark.parametrize("text, number", [
    ("1,000", "1000"), ("$18.00", "18"), ("-3.", "-3"), ("0.50", "0.5"), ("\u22124", "-4"), ("-0", "0"),
    ("100", "100"), ("seven", "seven"),
])
def test_numbers_compare_as_numbers(text, number):
    assert gsm8k.normalize_number(text) == number


@pytest.mark.parametrize("output, strict, flexible", [
    ("Let me add.</think>\n\nThe total is \\boxed{18}.", "18", "18"),
    ("so \\boxed{17} maybe</think>The answer is \\boxed{\\$1{,}000}", "1000", "1000"),
    ("</think>\\boxed{18 \\text{ dollars}}", "18", "18"),
    ("</think>\\boxed{x = -5}", "-5", "-5"),
    ("</think>\\boxed{\\frac{3}{4}}", "0.75", "0.75"),
    ("</think>So \\boxed{\\boxed{42}}", "42", "42"),
    ("Still thinking, \\boxed{7} perhaps", None, "7"),  # never closed </think>: no strict answer
    ("</think>The answer is 12.", None, "12"),
    ("</think>\\boxed{12", None, "12"),  # cut off inside the box
])
def test_reasoning_extraction(output, strict, flexible):
    got_strict, got_flexible = gsm8k.extract_reasoning(output, opened_think=True)
    assert gsm8k.normalize_number(got_strict) == strict
    assert gsm8k.normalize_number(got_flexible) == flexible


# --------------------------------------------------------------------------- --limit subsets


def test_allocation_is_proportional_with_every_stratum_seated():
    assert allocate({"a": 100, "b": 50, "c": 10}, 16) == {"a": 9, "b": 5, "c": 2}
    assert allocate({"a": 100, "b": 50, "c": 10}, 2) == {"a": 1, "b": 1, "c": 0}
    assert allocate({"a": 3, "b": 1}, 10) == {"a": 3, "b": 1}


def test_mmlu_subset_is_stratified_and_reproducible(mmlu_data):
    subset = stratified_subset(mmlu_data.items, 200, seed=1234)
    assert len(subset) == 200 and len({it.stratum for it in subset}) == 57
    law = sum(1 for it in subset if it.stratum == "professional_law")
    assert law == 1 + round(143 * 1533 / (14042 - 57))  # one seat each, the rest by size
    shuffled = list(mmlu_data.items)
    random.Random(0).shuffle(shuffled)
    assert {it.id for it in stratified_subset(shuffled, 200, seed=1234)} == {it.id for it in subset}
    assert [it.id for it in stratified_subset(mmlu_data.items, 200, seed=1234)] == [it.id for it in subset]
    assert {it.id for it in stratified_subset(mmlu_data.items, 200, seed=7)} != {it.id for it in subset}
    order = {it.id: i for i, it in enumerate(mmlu_data.items)}
    assert [order[it.id] for it in subset] == sorted(order[it.id] for it in subset)  # release order kept


def test_gsm8k_subset_follows_solution_length(gsm8k_data):
    subset = stratified_subset(gsm8k_data.items, 50, seed=1234)
    counts = {s: sum(1 for it in subset if it.stratum == s) for s in {it.stratum for it in gsm8k_data.items}}
    # One seat per stratum, the other 43 by size (largest remainder): 3-step solutions are the most common.
    assert counts == {"2 steps": 11, "3 steps": 13, "4 steps": 11, "5 steps": 7, "6 steps": 4, "7 steps": 2,
                      "8 steps": 2}


def test_no_limit_or_a_large_one_keeps_everything():
    items = [Item(f"x/{i}", "x", {}) for i in range(5)]
    assert stratified_subset(items, None, 1) == items and stratified_subset(items, 99, 1) == items


# --------------------------------------------------------------------------- damaged data names its file and row


def _mmlu_dir(tmp_path, data_dir, subject_text: bytes | None = None) -> Path:
    """A copy of two real subjects of the MMLU release, with ``astronomy_test.csv`` replaced."""
    import shutil

    root = tmp_path / "mmlu"
    for split in ("test", "dev"):
        (root / split).mkdir(parents=True)
        for subject in ("anatomy", "astronomy"):
            shutil.copy(data_dir / "mmlu" / split / f"{subject}_{split}.csv", root / split)
    if subject_text is not None:
        (root / "test" / "astronomy_test.csv").write_bytes(subject_text)
    return tmp_path


@pytest.mark.parametrize("text, message", [
    (b"", "astronomy_test.csv: no records (an empty subject file)"),
    (b"q,a,b,c,d,A\nWhat?,1,2,3,4,E\n", "astronomy_test.csv, record 2: the answer is 'E', not a letter A-D"),
    (b"q,a,b,c,d,A\nWh\x00at?,1,2,3,4,B\n", "astronomy_test.csv, record 2: a field holds a NUL byte"),
    (b"q,a,b,c,d\n", "astronomy_test.csv, record 1: expected 6 fields (question, 4 choices, answer), got 5"),
    (bytes(range(256)) * 4, "astronomy_test.csv: not UTF-8 text (byte 128)"),
], ids=["empty", "answer-E", "nul", "five-fields", "binary"])
def test_a_damaged_mmlu_csv_is_named_with_its_record(tmp_path, data_dir, text, message):
    root = _mmlu_dir(tmp_path, data_dir, text)
    with pytest.raises(InputError) as err:
        mmlu.load(root)
    assert message in err.value.message


def test_damaged_mmlu_and_gsm8k_tables_name_file_and_row(tmp_path):
    import json as _json

    (tmp_path / "mmlu").mkdir()
    good = {"subject": "anatomy", "question": "What?", "choices": ["1", "2", "3", "4"], "answer": 0}
    rows = [good, {**good, "question": 42}]
    (tmp_path / "mmlu" / "test.jsonl").write_text("".join(_json.dumps(r) + "\n" for r in rows))
    (tmp_path / "mmlu" / "dev.jsonl").write_text(_json.dumps(good) + "\n")
    with pytest.raises(InputError, match=r"test.jsonl, row 2: `question` is 42, not text"):
        mmlu.load(tmp_path)
    (tmp_path / "gsm8k").mkdir()
    ok = {"question": "1+1?", "answer": "It is 2.\n#### 2"}
    (tmp_path / "gsm8k" / "test.jsonl").write_text(_json.dumps(ok) + "\n" + _json.dumps({**ok, "answer": "2"}) + "\n")
    (tmp_path / "gsm8k" / "train.jsonl").write_text(_json.dumps(ok) + "\n")
    with pytest.raises(InputError, match=r"test.jsonl, row 2: the `answer` does not end in '#### N'"):
        gsm8k.load(tmp_path)


def test_damaged_data_exits_2_from_the_cli(tmp_path, data_dir, built, engines_dir):
    built("tiny-qwen2-fp8-tp1")
    root = _mmlu_dir(tmp_path, data_dir, bytes(range(256)) * 4)
    out = run_cli("eval", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp1.yaml"), "--engines-dir", str(engines_dir),
                  "--tasks", "mmlu", "--limit", "4", "--data-dir", str(root), "-o", str(tmp_path / "out"))
    assert out.returncode == 2 and "astronomy_test.csv: not UTF-8 text" in out.stderr, out.stderr
    assert "internal error" not in out.stderr
