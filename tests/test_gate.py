"""The accuracy gate: its statistics on cases with known answers, its verdicts and its exit codes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import CONFIGS, REPO
from trtllm_pipeline.cli import main
from trtllm_pipeline.errors import InputError
from trtllm_pipeline import gating
from trtllm_pipeline.gating import Thresholds, judge, load_gates
from trtllm_pipeline.results import EVAL_SCHEMA
from trtllm_pipeline.tasks.stats import (binomial_cdf_half, compare_paired, mcnemar_exact_p, summarize,
                                         wilson_interval)

# --------------------------------------------------------------------------- statistics


def test_exact_binomial_and_mcnemar_values():
    assert binomial_cdf_half(3, 10) == 176 / 1024  # (1 + 10 + 45 + 120) / 2^10
    assert mcnemar_exact_p(10, 0) == 2 / 1024
    assert mcnemar_exact_p(6, 2) == 2 * (1 + 8 + 28) / 256
    assert mcnemar_exact_p(5, 5) == 1.0 and mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(25, 10) == mcnemar_exact_p(10, 25) == pytest.approx(0.0166738, abs=1e-6)
    # Thousands of discordant items stay exact (integer arithmetic, no underflow).
    assert mcnemar_exact_p(600, 500) == pytest.approx(0.0028195, abs=1e-6)
    assert 0.7 < mcnemar_exact_p(7000, 7042) < 0.75


def test_wilson_interval_known_values():
    assert wilson_interval(50, 100) == pytest.approx((0.403832, 0.596168), abs=1e-6)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(3.8415 / 13.8415, abs=1e-4)  # z^2 / (n + z^2)
    assert summarize([True, False, True, True]) == {"n": 4, "score": 0.75, "ci95": list(wilson_interval(3, 4))}


def test_paired_comparison_counts_and_agresti_min_interval():
    base = [True] * 60 + [False] * 40
    cand = [False] * 10 + [True] * 50 + [False] * 40  # loses 10 items, gains none
    c = compare_paired(base, cand)
    assert (c.n, c.lost, c.gained, c.baseline_score, c.candidate_score) == (100, 10, 0, 0.6, 0.5)
    assert c.drop == 10.0 and c.p_value == 2 / 1024
    # (10.5 - 0.5) / 102 +- 1.96 * sqrt((11/102 - (10/102)^2) / 102), in points
    assert c.drop_ci95 == pytest.approx((3.7215, 15.8863), abs=1e-3)
    same = compare_paired(base, base)
    assert same.drop == 0 and same.p_value == 1.0 and same.drop_ci95[0] < 0 < same.drop_ci95[1]


# --------------------------------------------------------------------------- verdicts


def results(config: str, flags: list[bool], *, task: str = "mmlu", **overrides) -> dict:
    """A results file as `eval` writes it, for flags of items s/0, s/1, ..."""
    items = [{"id": f"s/{i}", "correct": f, "prediction": "A" if f else "B", "target": "A",
              "prompt_sha256": f"p{i}"} for i, f in enumerate(flags)]
    score = sum(flags) / len(flags)
    return {"schema": EVAL_SCHEMA, "task": task, "config": config, "runtime": "torch", "model": "m",
            "settings": {"shots": 5, "limit": None, "seed": 1234, "data_sha256": "d"}, "n": len(items),
            "n_selected": len(items), "score": score, "ci95": list(wilson_interval(sum(flags), len(flags))),
            "complete": True, "items": items, **overrides}


def flags(n: int, correct: int, lose: int = 0, gain: int = 0) -> tuple[list[bool], list[bool]]:
    """Baseline with ``correct`` of ``n`` right; candidate losing ``lose`` of them and gaining ``gain``."""
    base = [i < correct for i in range(n)]
    cand = list(base)
    for i in range(lose):
        cand[i] = False
    for i in range(gain):
        cand[correct + i] = True
    return base, cand


LIMITS = Thresholds(max_drop=1.0, min_score=None, alpha=0.05)


@pytest.mark.parametrize("n, correct, lose, gain, status", [
    (1000, 600, 0, 0, "pass"),       # identical runs
    (1000, 600, 25, 10, "fail"),     # drop 1.5 points, p = 0.017: real
    (100, 60, 6, 2, "pass"),         # drop 4 points but p = 0.29: a few items flipping, noise
    (1000, 600, 20, 10, "pass"),     # drop exactly max-drop: not above it
    (1000, 600, 5, 40, "pass"),      # the candidate is better
    (100, 60, 10, 0, "fail"),        # drop 10 points, p = 0.002
])
def test_fail_needs_a_drop_beyond_max_drop_that_is_significant(n, correct, lose, gain, status):
    base, cand = flags(n, correct, lose, gain)
    verdict = judge(results("bf16", base), results("fp8", cand), LIMITS)
    assert verdict.status == status
    assert verdict.comparison.drop == pytest.approx(100 * (lose - gain) / n)


def test_small_subsets_are_flagged_as_unable_to_resolve_max_drop():
    base, cand = flags(100, 60, 6, 2)
    verdict = judge(results("bf16", base), results("fp8", cand), LIMITS)
    assert any("too few items to resolve" in note for note in verdict.notes)


def test_min_score_is_an_absolute_floor():
    base, cand = flags(100, 40)
    verdict = judge(results("bf16", base), results("fp8", cand), Thresholds(1.0, 0.5, 0.05))
    assert verdict.status == "fail" and "below min-score" in verdict.reason


@pytest.mark.parametrize("change, message", [
    (lambda r: r.update(task="gsm8k"), "different tasks"),
    (lambda r: r["settings"].update(limit=200), "different settings"),
    (lambda r: r.update(items=r["items"][:-3], n=r["n"] - 3), "different items"),
    (lambda r: r["items"][4].update(target="C"), "differ in `target`"),
    (lambda r: r["items"][4].update(prompt_sha256="other"), "differ in `prompt_sha256`"),
])
def test_runs_that_are_not_comparable_cannot_be_judged(change, message):
    base, cand = flags(50, 30)
    candidate = results("fp8", cand)
    change(candidate)
    with pytest.raises(InputError, match=message):
        judge(results("bf16", base), candidate, LIMITS)


# --------------------------------------------------------------------------- CLI and exit codes


def write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def gate_cli(*args: str):
    return CliRunner().invoke(main, ["gate", *args], catch_exceptions=False)


@pytest.fixture()
def pair(tmp_path):
    base, cand = flags(400, 200, lose=3, gain=2)
    return (write(tmp_path / "base.json", results("tiny-bf16", base)),
            write(tmp_path / "cand.json", results("tiny-fp8", cand)))


def test_passing_pair_prints_the_table_and_exits_0(pair):
    out = gate_cli("--baseline", str(pair[0]), "--candidate", str(pair[1]), "--max-drop", "1.0")
    assert out.exit_code == 0, out.output
    header, rule, row = out.output.splitlines()[:3]
    for column in ("baseline", "candidate", "drop", "drop 95% CI", "McNemar p", "verdict"):
        assert column in header
    assert row.split()[:7] == ["mmlu", "tiny-fp8", "tiny-bf16", "400", "50.00", "49.75", "+0.25"]
    assert row.endswith("PASS") and "gate passed" in out.output


def test_flags_turned_false_fail_the_gate_with_exit_1(pair):
    candidate = json.loads(pair[1].read_text())
    for item in candidate["items"]:
        item["correct"] = False  # the header's score is left as it was: the items are what is judged
    write(pair[1], candidate)
    out = gate_cli("--baseline", str(pair[0]), "--candidate", str(pair[1]), "--max-drop", "1.0")
    assert out.exit_code == 1
    assert "FAIL" in out.output and "accuracy gate failed" in out.output and "disagrees with its items" in out.output


@pytest.mark.parametrize("change, message", [
    (lambda r: r.update(items=r["items"][:-5]), "`n` is 400 but the file holds 395 items"),
    (lambda r: r.update(items=r["items"][:-5], n=395), "different items"),
    (lambda r: r.update(complete=False, n=390), "incomplete"),
    (lambda r: r.update(score=math.nan), "not a finite number"),
    (lambda r: r["items"][0].update(correct=None), "not true/false"),
    (lambda r: r["items"][1].update(id="s/0"), "appears twice"),
    (lambda r: r.update(schema=99), "not a results file"),
])
def test_unjudgeable_candidates_exit_2(pair, change, message):
    candidate = json.loads(pair[1].read_text())
    change(candidate)
    write(pair[1], candidate)
    out = gate_cli("--baseline", str(pair[0]), "--candidate", str(pair[1]), "--max-drop", "1.0")
    assert out.exit_code == 2 and message in out.output, out.output


def test_corrupt_or_missing_files_exit_2(pair, tmp_path):
    write(pair[1], '{"schema": 1, "task": "mm')
    out = gate_cli("--baseline", str(pair[0]), "--candidate", str(pair[1]), "--max-drop", "1")
    assert out.exit_code == 2 and "not valid JSON" in out.output
    out = gate_cli("--baseline", str(pair[0]), "--candidate", str(tmp_path / "none.json"), "--max-drop", "1")
    assert out.exit_code == 2 and "cannot read the results file" in out.output


def test_thresholds_come_from_the_gates_file(tmp_path):
    base, cand = flags(1000, 600, lose=25, gain=10)  # drop 1.5, significant
    b = write(tmp_path / "b.json", results("tiny-bf16", base))
    c = write(tmp_path / "c.json", results("tiny-fp8", cand))
    gates = write(tmp_path / "gates.yaml", "max_drop: {mmlu: 1.0}\ngates:\n"
                  "  - {baseline: tiny-bf16, candidates: [tiny-fp8], max_drop: {mmlu: 2.0}}\n")
    assert gate_cli("--baseline", str(b), "--candidate", str(c), "--gates", str(gates)).exit_code == 0  # entry: 2.0
    assert gate_cli("--baseline", str(b), "--candidate", str(c), "--gates", str(gates),
                    "--max-drop", "1.0").exit_code == 1  # the command line wins
    write(gates, "max_drop: {mmlu: 1.0}\n")
    assert gate_cli("--baseline", str(b), "--candidate", str(c), "--gates", str(gates)).exit_code == 1  # default
    out = gate_cli("--baseline", str(b), "--candidate", str(c), "--gates", str(tmp_path / "absent.yaml"))
    assert out.exit_code == 2 and "gates file" in out.output
    write(gates, "max_drop: {mmlu: 1.0}\nmax_dorp: {}\n")
    assert gate_cli("--baseline", str(b), "--candidate", str(c), "--gates", str(gates)).exit_code == 2


def test_running_the_gates_file_judges_every_listed_pair(tmp_path):
    engines = tmp_path / "engines"
    base, cand = flags(200, 100, lose=1)
    for config, fl in (("b", base), ("c1", cand), ("c2", [False] * 200)):
        (engines / config / "eval").mkdir(parents=True)
        write(engines / config / "eval" / "mmlu.json", results(config, fl))
    gates = write(tmp_path / "gates.yaml", "max_drop: {mmlu: 1.0}\ngates:\n"
                  "  - {baseline: b, candidates: [c1], tasks: [mmlu]}\n")
    args = ["--gates", str(gates), "--engines-dir", str(engines)]
    assert gate_cli(*args).exit_code == 0
    write(gates, "max_drop: {mmlu: 1.0}\ngates:\n  - {baseline: b, candidates: [c1], tasks: [mmlu, gsm8k]}\n")
    out = gate_cli(*args)
    assert out.exit_code == 2 and "CANNOT JUDGE" in out.output  # gsm8k results missing: fails closed
    write(gates, "max_drop: {mmlu: 1.0, gsm8k: 2.0}\ngates:\n"
          "  - {baseline: b, candidates: [c1, c2], tasks: [mmlu, gsm8k]}\n")
    out = gate_cli(*args)
    assert out.exit_code == 1 and "c2: fail" in out.output  # a definite failure outranks "cannot judge"
    out = gate_cli(*args, "--max-drop", "100")  # the command line overrides the file here too
    assert out.exit_code == 2 and "c2: pass" in out.output
    assert gate_cli(*args, "--only", "nothing").exit_code == 2


def test_shipped_gates_file_names_shipped_configs():
    gates = load_gates(REPO / "eval" / "gates.yaml")
    assert gates.max_drop == {"mmlu": 1.0, "gsm8k": 2.0} and gates.alpha == 0.05
    shipped = {p.stem for p in CONFIGS.glob("*.yaml")}
    for entry in gates.gates:
        assert {entry.baseline, *entry.candidates} <= shipped


# --------------------------------------------------------------------------- the gate fails closed


@pytest.fixture()
def big_drop(tmp_path):
    """25 points lost (10 of 40 items, none gained, p = 0.002): a gate must never pass this."""
    base, cand = flags(40, 20, lose=10)
    return (write(tmp_path / "base.json", results("tiny-bf16", base)),
            write(tmp_path / "cand.json", results("tiny-fp8", cand)))


@pytest.mark.parametrize("args, named", [
    (["--max-drop", "nan"], "--max-drop"), (["--max-drop", "inf"], "--max-drop"),
    (["--max-drop", "1", "--alpha", "nan"], "--alpha"), (["--max-drop", "1", "--min-score", "nan"], "--min-score"),
])
def test_non_finite_thresholds_on_the_command_line_exit_2(big_drop, args, named):
    out = CliRunner().invoke(main, ["gate", "--baseline", str(big_drop[0]), "--candidate", str(big_drop[1]), *args])
    assert out.exit_code == 2 and named in out.output and "Invalid value" in out.output, out.output


@pytest.mark.parametrize("text, named", [
    ("max_drop: {mmlu: .nan}\n", "max_drop.mmlu"), ("max_drop: {mmlu: .inf}\n", "max_drop.mmlu"),
    ("alpha: .nan\nmax_drop: {mmlu: 1.0}\n", "alpha"), ("max_drop: {mmlu: '1.0'}\n", "max_drop.mmlu"),
    ("max_drop: {mmlu: true}\n", "max_drop.mmlu"), ("max_drop: {mmlu: -3}\n", "max_drop.mmlu"),
    ("max_drop: {mmlu: 1.0}\nmin_score: {mmlu: .nan}\n", "min_score.mmlu"),
    ("max_drop: {mmlu: 1.0}\nmax_drop: {mmlu: 50.0}\n", "duplicate key 'max_drop'"),
    ("gates:\n  - {baseline: tiny-bf16, candidates: [tiny-fp8], max_drop: {mmlu: .nan}}\n", "max_drop.mmlu"),
])
def test_non_finite_or_ill_typed_thresholds_in_the_gates_file_exit_2(big_drop, tmp_path, text, named):
    gates = write(tmp_path / "gates.yaml", text)
    out = gate_cli("--baseline", str(big_drop[0]), "--candidate", str(big_drop[1]), "--gates", str(gates))
    assert out.exit_code == 2 and named in out.output, out.output


def test_thresholds_in_code_fail_closed_too():
    with pytest.raises(InputError, match="max-drop is nan"):
        gating.thresholds("mmlu", "b", "c", None, max_drop=math.nan)


@pytest.mark.parametrize("change, named", [
    (lambda r: r.update(score=True), "`score` is True"),
    (lambda r: r.update(ci95=[math.nan, 0.5]), "`ci95`"),
    (lambda r: r["items"][0].update(logprobs=[-1.0, math.nan, -2.0, -3.0]), "`items.0.logprobs.1`"),
    (lambda r: r.update(n=True), "`n` is True"),
    (lambda r: r["settings"].update(limit=math.inf), "`settings.limit`"),
])
def test_ill_typed_or_non_finite_results_exit_2(big_drop, change, named):
    candidate = json.loads(big_drop[1].read_text())
    change(candidate)
    big_drop[1].write_text(json.dumps(candidate))  # Python writes NaN/Infinity literals, as a careless tool would
    out = gate_cli("--baseline", str(big_drop[0]), "--candidate", str(big_drop[1]), "--max-drop", "1.0")
    assert out.exit_code == 2 and "cannot judge" in out.output, out.output
    assert named in out.output or "not a finite number" in out.output, out.output


def test_non_finite_results_made_in_code_cannot_be_judged():
    from trtllm_pipeline.results import eval_problem

    base, _ = flags(40, 20)
    r = results("b", base)
    r["items"][3]["logprobs"] = [0.0, math.nan, 0.0, 0.0]
    assert eval_problem(r) == "`items.3.logprobs.1` is not a finite number"
