"""The accuracy table's GPU side (issue 33), checked here: jsonl read without ``datasets``, the subset data dir a device
call carries (``tools/accuracy_subset.py``) evaluating as the release does, and the CPU-vs-GPU comparison
(``benchmarks/accuracy_compare.py``) on real runs of the tiny model."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS, REPO, run_cli

from trtllm_pipeline.config import config_from_dict
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.eval import evaluate
from trtllm_pipeline.tasks import data, gsm8k, mmlu

sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "benchmarks"))
import accuracy_compare
import accuracy_subset

BF16, FP8 = "tiny-qwen2-bf16-tp1", "tiny-qwen2-fp8-tp1"
LIMITS = {"mmlu": 6, "gsm8k": 2, "fidelity": 1}


def tiny(name: str):
    """The shipped config under its own name (its engine), GSM8K cut to 16 new tokens (seconds, not minutes)."""
    raw = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    raw["evaluation"]["gsm8k_max_new_tokens"] = 16
    return config_from_dict(raw, name=name, path=CONFIGS / f"{name}.yaml")


def datasets_rows(path: Path) -> list[dict]:
    datasets = pytest.importorskip("datasets")
    return list(datasets.load_dataset("json", data_files=[str(path)], split="train"))


# --------------------------------------------------------------------------- jsonl without datasets


def test_jsonl_rows_are_what_datasets_gives(data_dir, tmp_path):
    for split in ("test", "train"):  # the real GSM8K files, 1319 and 7473 rows
        path = data_dir / "gsm8k" / f"{split}.jsonl"
        assert data._read_json(path) == datasets_rows(path)
    # blank lines, a key only some rows have (None in the others), lists, non-ASCII and U+2028 inside a string
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"a": 1, "b": "x\u2028y"}\n\n  \n{"a": 2, "c": ["é", "ü"]}\r\n{"b": "z"}\n', encoding="utf-8")
    assert data._read_json(odd) == datasets_rows(odd) == [
        {"a": 1, "b": "x\u2028y", "c": None}, {"a": 2, "b": None, "c": ["é", "ü"]}, {"a": None, "b": "z", "c": None}]


def test_a_bad_jsonl_line_is_named_with_file_and_line(tmp_path):
    root = tmp_path / "gsm8k"
    root.mkdir()
    ok = json.dumps({"question": "1+1?", "answer": "It is 2.\n#### 2"})
    (root / "train.jsonl").write_text(ok + "\n")
    for text, message in ((f"{ok}\n\n{{\"question\": \"2+2?\", \"answer\n", r"test.jsonl, line 3: not JSON \("),
                          (f"{ok}\n[1, 2]\n", r"test.jsonl, line 2: a JSON list, not an object"),
                          (b"\xff\xfe", r"test.jsonl: not UTF-8 text \(byte 0\)")):
        path = root / "test.jsonl"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(InputError, match=message) as err:
            gsm8k.load(tmp_path)
        assert err.value.exit_code == 2 and err.value.fix


def test_jsonl_data_is_read_where_datasets_cannot_be_imported(data_dir):
    # The GPU machine's image has no datasets (nor pyarrow): a data dir of jsonl files must not need it.
    code = ("import sys; sys.modules['datasets'] = None; sys.modules['pyarrow'] = None\n"
            "from trtllm_pipeline.tasks import gsm8k\n"
            f"print(len(gsm8k.load({str(data_dir)!r}).items))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "1319", out.stderr


def test_item_ids_keep_the_release_numbering(tmp_path):
    (tmp_path / "mmlu").mkdir()
    row = {"subject": "anatomy", "question": "What?", "choices": ["1", "2", "3", "4"], "answer": "B"}
    (tmp_path / "mmlu" / "dev.jsonl").write_text(json.dumps(row) + "\n")
    rows = [{"item_id": "anatomy/17", **row}, row, {**row, "subject": "virology"}]
    (tmp_path / "mmlu" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "mmlu" / "dev.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "subject": "virology"}))
    loaded = mmlu.load(tmp_path)
    # an item's own id, else its place among its subject's rows; the doc never holds the id (same prompts, same hash)
    assert [it.id for it in loaded.items] == ["anatomy/17", "anatomy/1", "virology/0"]
    assert all("item_id" not in it.doc for it in loaded.items) and loaded.items[0].doc == row
    (tmp_path / "mmlu" / "test.jsonl").write_text(json.dumps({"item_id": "anatomy/1", **row}) + "\n" + json.dumps(row))
    with pytest.raises(InputError, match="the item id 'anatomy/1' names two rows"):
        mmlu.load(tmp_path)
    (tmp_path / "mmlu" / "test.jsonl").write_text(json.dumps({"item_id": 7, **row}) + "\n")
    with pytest.raises(InputError, match="test.jsonl, row 1: `item_id` is 7"):
        mmlu.load(tmp_path)


# --------------------------------------------------------------------------- the subset data dir


@pytest.fixture(scope="module")
def subset(data_dir, tmp_path_factory):
    """The subset of the release for LIMITS and the tiny configs' seed, written by the tool, and its manifest."""
    out = tmp_path_factory.mktemp("subset") / "gpu_data"
    manifest = accuracy_subset.write_subset(data_dir, out, LIMITS, tiny(BF16).evaluation.seed)
    return out, manifest


@pytest.fixture(scope="module")
def engines(built, engines_dir, tmp_path_factory):
    """An engines dir of this module's own holding the tiny BF16 and FP8 builds (copies: cache hits), so that its
    results never meet another module's."""
    own = tmp_path_factory.mktemp("acc-engines")
    for name in (BF16, FP8):
        built(name)
        for part in ("checkpoint", "engine"):
            shutil.copytree(engines_dir / name / part, own / name / part, symlinks=True)
    return own


def test_the_subset_is_small_and_evaluates_as_the_release(subset, data_dir, engines, tmp_path):
    out, manifest = subset
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert size < 6e6 and len(manifest["items"]["mmlu"]) == LIMITS["mmlu"]  # a device call carries it (64 MiB)
    cfg = tiny(BF16)
    runs = {}
    for label, source in (("release", data_dir), ("subset", out)):
        runs[label] = {task: evaluate(cfg, engines_dir=engines, tasks=[task], limit=limit, data_dir=source,
                                      output=tmp_path / label / f"{task}.json")[0]
                       for task, limit in LIMITS.items()}
    assert not any(r.cache_hit for label in runs for r in runs[label].values())  # both evaluated
    runs = {label: {task: r.results for task, r in by_task.items()} for label, by_task in runs.items()}
    for task in LIMITS:
        release, sub = runs["release"][task], runs["subset"][task]
        assert sub["data_source"] != release["data_source"]
        # the same items, exemplars and prompts (the data hash), hence the same predictions and log-likelihoods
        assert sub["settings"] == release["settings"]
        assert sub["settings"]["data_sha256"] == manifest["data_sha256"][task]
        assert sub["items"] == release["items"] and sub["score"] == release["score"], task
    assert [r["id"] for r in runs["subset"]["mmlu"]["items"]] == manifest["items"]["mmlu"]
    assert all("logprobs" in r for r in runs["subset"]["mmlu"]["items"])


def test_the_subset_tool_from_the_command_line(data_dir, tmp_path):
    tool = [sys.executable, str(REPO / "tools" / "accuracy_subset.py")]
    out = subprocess.run([*tool, "--data-dir", str(data_dir), "--mmlu", "3", "--gsm8k", "1", "-o", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    manifest = json.loads((tmp_path / "d" / "subset.json").read_text())
    assert manifest["limits"] == {"mmlu": 3, "gsm8k": 1, "fidelity": 4} and manifest["seed"] == 1234
    assert not list(tmp_path.glob(".d*"))  # no temporary dir left beside it
    bad = subprocess.run([*tool, "--data-dir", str(tmp_path / "nowhere"), "-o", str(tmp_path / "e")],
                         capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 2 and "no such directory" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "e").exists()


def test_damaged_subset_data_exits_2_from_the_eval_cli(subset, engines, tmp_path):
    out, _ = subset
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    with open(broken / "gsm8k" / "test.jsonl", "a", encoding="utf-8") as f:
        f.write('{"question": "cut off\n')
    res = run_cli("eval", "-c", str(CONFIGS / f"{BF16}.yaml"), "--engines-dir", str(engines), "--tasks", "gsm8k",
                  "--limit", "2", "--data-dir", str(broken), "-o", str(tmp_path / "res"))
    assert res.returncode == 2, res.stderr
    assert "test.jsonl, line 3: not JSON" in res.stderr and "Traceback" not in res.stderr


# --------------------------------------------------------------------------- the comparison


@pytest.fixture(scope="module")
def extracted(subset, engines, tmp_path_factory):
    """The tiny BF16 and FP8 builds evaluated as accuracy_table does (the shipped configs, fidelity against BF16),
    extracted."""
    from trtllm_pipeline.config import load_config

    out, _ = subset
    for name in (BF16, FP8):
        for task, limit in LIMITS.items():
            evaluate(load_config(CONFIGS / f"{name}.yaml"), engines_dir=engines, tasks=[task], limit=limit,
                     data_dir=out, reference=CONFIGS / f"{BF16}.yaml" if task == "fidelity" and name != BF16 else None)
    directory = tmp_path_factory.mktemp("extract") / "cpu"
    assert accuracy_compare.extract(engines, "tiny-qwen2", ("bf16", "fp8"), directory) == ["bf16", "fp8"]
    return directory


def test_a_run_against_itself_agrees_in_full(extracted, tmp_path):
    assert accuracy_compare.main(["compare", str(extracted), str(extracted), "-o", str(tmp_path / "c.json")]) == 0
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["within"] and list(result["formats"]) == ["bf16", "fp8"]
    for r in result["formats"].values():
        assert r["same_checkpoint"] and r["mmlu"]["same"] == r["mmlu"]["n"] == LIMITS["mmlu"] and not r["mmlu"]["differ"]
        assert r["mmlu"]["max_dll"] == 0 and r["gsm8k"]["same_outputs"] == LIMITS["gsm8k"]
        assert r["fidelity"]["top1_miss"] == 0 and r["fidelity"]["max_dnll"] == 0
    record = json.loads((extracted / "fp8.json").read_text())
    assert record["fidelity"]["reference"] == BF16 and record["device"] == "cpu"


def perturbed(extracted: Path, tmp_path: Path) -> tuple[Path, dict]:
    """A copy of the runs as another machine might give them: FP8's first MMLU item's runner-up letter lifted past
    the prediction by 0.3 nats, a GSM8K output parted, every fidelity NLL 5% up; BF16 missing."""
    other = tmp_path / "gpu"
    other.mkdir()
    record = json.loads((extracted / "fp8.json").read_text())
    original = copy.deepcopy(record)
    item = record["mmlu"]["items"][0]
    order = sorted(range(4), key=lambda i: -item["logprobs"][i])
    item["logprobs"][order[1]] = item["logprobs"][order[0]] + 0.3
    item["prediction"] = "ABCD"[order[1]]
    record["gsm8k"]["items"][0]["output"] = record["gsm8k"]["items"][0]["output"][:3] + " parted"
    for chunk in record["fidelity"]["chunks"].values():
        chunk["nll"] = [x * 1.05 for x in chunk["nll"]]
    record["fidelity"]["summary"]["ppl"] *= 1.05
    (other / "fp8.json").write_text(json.dumps(record))
    return other, original


def test_a_perturbed_run_shows_each_difference(extracted, tmp_path, capsys):
    other, original = perturbed(extracted, tmp_path)
    assert accuracy_compare.main(["compare", str(extracted), str(other), "-o", str(tmp_path / "c.json")]) == 1
    result = json.loads((tmp_path / "c.json").read_text())
    assert not result["within"] and result["formats"]["bf16"] == {"within": False, "problems": ["no gpu run"],
                                                                  "missing": "gpu"}
    fp8 = result["formats"]["fp8"]
    assert fp8["tolerance_basis"] == "fixed" and fp8["tolerance"] == accuracy_compare.DEFAULT_TOLERANCE
    (flip,) = fp8["mmlu"]["differ"]
    item = original["mmlu"]["items"][0]
    best, second = sorted(item["logprobs"])[-2:][::-1]
    margin = best - second
    assert flip["id"] == item["id"] and flip["cpu"] == item["prediction"] and flip["gpu_margin"] == 0.3
    assert flip["cpu_margin"] == pytest.approx(margin, abs=1e-4)
    assert fp8["mmlu"]["max_dll"] == pytest.approx(margin + 0.3, abs=1e-4) and fp8["mmlu"]["same"] == LIMITS["mmlu"] - 1
    assert f"mmlu: max |ΔLL| {margin + 0.3:.3f} > 0.250" in fp8["problems"]  # a 0.3-nat shift is past 0.25
    assert fp8["gsm8k"]["same_outputs"] == LIMITS["gsm8k"] - 1 and fp8["gsm8k"]["differ"][0]["common_prefix_chars"] >= 3
    assert fp8["fidelity"]["stats"]["ppl"]["gpu"] > fp8["fidelity"]["stats"]["ppl"]["cpu"] * 1.04
    assert any(p.startswith("fidelity: PPL") for p in fp8["problems"])
    assert fp8["fidelity"]["max_dnll"] > 0 and fp8["fidelity"]["top1_miss"] == 0
    table = capsys.readouterr().out
    assert f"{flip['id']} {flip['cpu']}→{flip['gpu']}" in table and "no gpu run" in table
    # --formats: the formats a GPU part ran, and only those
    only = accuracy_compare.compare(extracted, other, ("fp8",))
    assert list(only["formats"]) == ["fp8"] and only["formats"]["fp8"] == fp8


def test_other_settings_are_not_compared(extracted, tmp_path):
    other = tmp_path / "gpu"
    other.mkdir()
    record = json.loads((extracted / "bf16.json").read_text())
    record["mmlu"]["settings"]["data_sha256"] = "0" * 64
    (other / "bf16.json").write_text(json.dumps(record))
    result = accuracy_compare.compare(extracted, other)
    assert result["formats"]["bf16"]["mmlu"] == {"comparable": False, "why": "settings differ: data_sha256"}
    assert "mmlu not comparable: settings differ: data_sha256" in result["formats"]["bf16"]["problems"]
    assert accuracy_compare.main(["compare", str(tmp_path / "nowhere"), str(other)]) == 2


def test_the_yardstick_sets_each_formats_tolerance(extracted, subset, engines, tmp_path):
    # The CPU's own bfloat16 runs (what rounding alone changes), and the float32 results left as they were
    results = engines / BF16 / "eval" / "mmlu.json"
    before = results.read_bytes()
    out, _ = subset
    yard = tmp_path / "bf16-compute"
    assert accuracy_compare.yardstick(engines, "tiny-qwen2", ("fp8", "bf16"), out, LIMITS, yard) == ["bf16", "fp8"]
    assert results.read_bytes() == before
    record = json.loads((yard / "fp8.json").read_text())
    assert record["dtype"] == "bfloat16" and record["fidelity"]["reference"] == BF16
    # A run that differs from the float32 one as much as the yardstick did is within the tolerance it sets
    result = accuracy_compare.compare(extracted, yard, yardstick_dir=yard)
    assert result["within"], result
    for fmt, r in result["formats"].items():
        rounding = accuracy_compare.measure(json.loads((extracted / f"{fmt}.json").read_text()), record
                                            if fmt == "fp8" else json.loads((yard / "bf16.json").read_text()))
        assert r["tolerance_basis"] == "the CPU's bfloat16 rounding"
        assert r["tolerance"]["max_dll"] == round(3 * max(rounding["mmlu"]["max_dll"], 0.05), 5)
        assert r["cpu_bfloat16"]["mmlu_same"] == r["mmlu"]["same"]
    # The yardstick measured from a base of its own (h200_run.sh: the GPU's bfloat16 against its own float32, the
    # rounding still the CPU's): the bfloat16 runs against themselves agree in full, within the base's tolerance
    own = accuracy_compare.compare(yard, yard, yardstick_dir=yard, yardstick_base=extracted)
    alone = accuracy_compare.compare(yard, yard, yardstick_dir=yard)  # (base: the first dir, itself: nothing moved)
    assert own["within"] and own["formats"] and alone["within"]
    for fmt, r in own["formats"].items():
        assert r["mmlu"]["max_dll"] == 0 and r["tolerance"] == result["formats"][fmt]["tolerance"]
        assert r["cpu_bfloat16"]["max_dll"] > 0 == alone["formats"][fmt]["cpu_bfloat16"]["max_dll"]


def test_a_float32_yardstick_on_the_cpu_is_the_float32_run_item_by_item(extracted, subset, engines, tmp_path):
    # What the GPU's float32 run is compared with (h200_run.sh accuracy, ACCURACY_F32): here, on the machine that made
    # the float32 runs, it is those runs again: every letter's log-likelihood and every token's NLL equal
    out, _ = subset
    f32 = tmp_path / "float32"
    assert accuracy_compare.main(["yardstick", "--engines-dir", str(engines), "--data-dir", str(out), "--model",
                                  "tiny-qwen2", "--formats", "bf16", "--compute-dtype", "float32", "--limits",
                                  ",".join(f"{k}={v}" for k, v in LIMITS.items()), "-o", str(f32)]) == 0
    assert json.loads((f32 / "bf16.json").read_text())["dtype"] == "float32"
    r = accuracy_compare.compare(extracted, f32, ("bf16",))["formats"]["bf16"]
    assert r["within"] and r["same_checkpoint"] and r["mmlu"]["max_dll"] == 0 and r["fidelity"]["max_dnll"] == 0
