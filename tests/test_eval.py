"""The eval stage end to end on the tiny model (torch runtime, real data), and the gate on its results."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml
from click.testing import CliRunner

from conftest import CONFIGS, run_cli
from trtllm_pipeline import artifacts, machine
from trtllm_pipeline.cli import main
from trtllm_pipeline.config import config_from_dict
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.eval import evaluate, output_path, runtime_identity

BF16, FP8 = "tiny-qwen2-bf16-tp1", "tiny-qwen2-fp8-tp1"
MMLU_LIMIT, GSM8K_LIMIT, GSM8K_TOKENS = 40, 4, 24


def tiny(name: str, **evaluation):
    """The shipped config under its own name (so its built engine is used), with a short GSM8K budget."""
    data = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    data["evaluation"].update({"gsm8k_max_new_tokens": GSM8K_TOKENS, **evaluation})
    return config_from_dict(data, name=name, path=CONFIGS / f"{name}.yaml")


@pytest.fixture(scope="module")
def evaluated(built, engines_dir, data_dir):
    """{config: {task: EvalResult}} for the BF16 baseline and the FP8 candidate."""
    runs = {}
    for name in (BF16, FP8):
        built(name)
        runs[name] = {}
        for task, limit in (("mmlu", MMLU_LIMIT), ("gsm8k", GSM8K_LIMIT)):
            (result,) = evaluate(tiny(name), engines_dir=engines_dir, tasks=[task], limit=limit, data_dir=data_dir)
            runs[name][task] = result
    return runs


# --------------------------------------------------------------------------- fast


def test_output_paths(tmp_path):
    default = artifacts.artifact_paths(tmp_path, "cfg").eval
    assert output_path(default, "mmlu", None, several=True) == tmp_path / "cfg" / "eval" / "mmlu.json"
    assert output_path(default, "mmlu", tmp_path / "x.json", several=False) == tmp_path / "x.json"
    assert output_path(default, "gsm8k", tmp_path / "out", several=True) == tmp_path / "out" / "gsm8k.json"
    with pytest.raises(InputError, match="one file cannot hold"):
        output_path(default, "mmlu", tmp_path / "x.json", several=True)


def test_unbuilt_engine_and_unknown_task_are_input_errors(tmp_path):
    runner = CliRunner()
    cfg = str(CONFIGS / f"{BF16}.yaml")
    out = runner.invoke(main, ["eval", "-c", cfg, "--engines-dir", str(tmp_path), "--tasks", "mmlu"])
    assert out.exit_code == 2 and "holds no built engine" in out.output and "trtllm-pipeline build" in out.output
    out = runner.invoke(main, ["eval", "-c", cfg, "--engines-dir", str(tmp_path), "--tasks", "mmlu,arc"])
    assert out.exit_code == 2 and "unknown task(s) arc" in out.output


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_results_files_are_complete_and_consistent(evaluated, engines_dir):
    for name, tasks in evaluated.items():
        for task, result in tasks.items():
            r = json.loads(result.path.read_text())
            assert result.path == engines_dir / name / "eval" / f"{task}.json" and not result.cache_hit
            assert (r["task"], r["config"], r["runtime"], r["model"]) == (task, name, "torch", "builtin:tiny-qwen2")
            assert r["complete"] is True and r["n"] == r["n_selected"] == len(r["items"])
            assert r["n"] == (MMLU_LIMIT if task == "mmlu" else GSM8K_LIMIT)
            assert r["score"] == sum(it["correct"] for it in r["items"]) / r["n"]
            assert r["ci95"][0] <= r["score"] <= r["ci95"][1]
            assert r["settings"]["limit"] == r["n"] and r["settings"]["seed"] == 1234
            assert r["timings"]["items_per_s"] > 0
            for item in r["items"]:
                assert {"id", "correct", "prediction", "target", "prompt_sha256"} <= item.keys()
    mmlu = json.loads(evaluated[BF16]["mmlu"].path.read_text())
    assert mmlu["settings"]["shots"] == 5 and set(mmlu["subscores"]["category"]) <= {
        "stem", "humanities", "social_sciences", "other"}
    assert sum(s["n"] for s in mmlu["subscores"]["category"].values()) == MMLU_LIMIT
    for item in mmlu["items"]:  # the prediction is the letter with the highest log-likelihood
        assert item["prediction"] == "ABCD"[item["logprobs"].index(max(item["logprobs"]))]
        assert item["correct"] == (item["prediction"] == item["target"])
    gsm = json.loads(evaluated[BF16]["gsm8k"].path.read_text())
    assert gsm["settings"]["max_new_tokens"] == GSM8K_TOKENS and gsm["settings"]["mode"] == "lm-eval"
    assert all(it["output_tokens"] <= GSM8K_TOKENS and it["finish_reason"] in ("length", "stop", "end_id")
               for it in gsm["items"])


@pytest.mark.slow
def test_same_items_across_configs_and_runs(evaluated, engines_dir, data_dir):
    base = json.loads(evaluated[BF16]["mmlu"].path.read_text())
    cand = json.loads(evaluated[FP8]["mmlu"].path.read_text())
    assert [it["id"] for it in base["items"]] == [it["id"] for it in cand["items"]]
    assert [it["prompt_sha256"] for it in base["items"]] == [it["prompt_sha256"] for it in cand["items"]]
    assert base["settings"] == cand["settings"]
    # FP8 really ran: its log-likelihoods are not the BF16 ones.
    assert any(b["logprobs"] != c["logprobs"] for b, c in zip(base["items"], cand["items"]))
    # The same command again is a cache hit; forced, it regenerates the same outputs.
    (again,) = evaluate(tiny(BF16), engines_dir=engines_dir, tasks=["mmlu"], limit=MMLU_LIMIT, data_dir=data_dir)
    assert again.cache_hit and again.results["items"] == base["items"]
    before = json.loads(evaluated[BF16]["gsm8k"].path.read_text())
    (forced,) = evaluate(tiny(BF16), engines_dir=engines_dir, tasks=["gsm8k"], limit=GSM8K_LIMIT,
                         data_dir=data_dir, force=True)
    assert not forced.cache_hit
    assert forced.results["items"] == before["items"] and forced.results["score"] == before["score"]


@pytest.mark.slow
def test_a_runtime_setting_that_changes_the_numerics_is_not_a_cache_hit(evaluated, engines_dir, data_dir, tmp_path):
    # The cached MMLU results, copied where this test may overwrite them.
    copy = tmp_path / "mmlu.json"
    shutil.copy(evaluated[BF16]["mmlu"].path, copy)
    (same,) = evaluate(tiny(BF16), engines_dir=engines_dir, tasks=["mmlu"], limit=MMLU_LIMIT, data_dir=data_dir,
                       output=copy)
    assert same.cache_hit
    changed = tiny(BF16).with_runtime(compute_dtype="float32")
    (other,) = evaluate(changed, engines_dir=engines_dir, tasks=["mmlu"], limit=MMLU_LIMIT, data_dir=data_dir,
                        output=copy)
    assert not other.cache_hit and other.results["inputs_hash"] != same.results["inputs_hash"]


def test_device_auto_evaluated_on_a_gpu_is_not_the_cpu_run_s_cache_entry(monkeypatch):
    """``runtime.device: auto`` runs on the GPU where there is one (bfloat16 there, float32 on a CPU): an engines
    directory evaluated on both must not answer one with the other's results. A CPU's key is what it was."""
    cfg = tiny(BF16)
    assert cfg.runtime.device == "auto"
    monkeypatch.setattr(machine, "cuda_available", lambda: False)  # (this machine has none: said, not assumed)
    on_cpu = runtime_identity(cfg)
    assert on_cpu == {"device": "auto", "compute_dtype": cfg.runtime.compute_dtype, "tp_mode": cfg.runtime.tp_mode,
                      "fast_decode": cfg.runtime.fast_decode}
    monkeypatch.setattr(machine, "cuda_available", lambda: True)
    assert runtime_identity(cfg) == {**on_cpu, "resolved_device": "cuda"}
    pinned = cfg.with_runtime(device="cpu")  # a pinned device is its own key wherever it runs
    assert runtime_identity(pinned)["device"] == "cpu" and "resolved_device" not in runtime_identity(pinned)


@pytest.mark.slow
def test_gate_on_real_results(evaluated, tmp_path):
    base, cand = evaluated[BF16]["mmlu"].path, evaluated[FP8]["mmlu"].path
    runner = CliRunner()
    out = runner.invoke(main, ["gate", "--baseline", str(base), "--candidate", str(cand), "--max-drop", "100"])
    assert out.exit_code == 0 and "PASS" in out.output and f"mmlu  {FP8}  {BF16}  {MMLU_LIMIT}" in out.output
    baseline = json.loads(base.read_text())
    assert sum(it["correct"] for it in baseline["items"]) >= 6  # enough right answers for a significant loss
    tampered = json.loads(cand.read_text())
    for item in tampered["items"]:
        item["correct"] = False
    (tmp_path / "flags.json").write_text(json.dumps(tampered))
    out = runner.invoke(main, ["gate", "--baseline", str(base), "--candidate", str(tmp_path / "flags.json"),
                               "--max-drop", "1"])
    assert out.exit_code == 1 and "FAIL" in out.output
    fewer = json.loads(cand.read_text())
    fewer["items"], fewer["n"] = fewer["items"][1:], fewer["n"] - 1
    (tmp_path / "fewer.json").write_text(json.dumps(fewer))
    out = runner.invoke(main, ["gate", "--baseline", str(base), "--candidate", str(tmp_path / "fewer.json"),
                               "--max-drop", "1"])
    assert out.exit_code == 2 and "different items" in out.output
    gsm = runner.invoke(main, ["gate", "--baseline", str(base), "--candidate",
                               str(evaluated[FP8]["gsm8k"].path), "--max-drop", "1"])
    assert gsm.exit_code == 2 and "different tasks" in gsm.output


@pytest.mark.slow
def test_cli_cache_hit_and_offline_hub(evaluated, engines_dir, data_dir, tmp_path):
    cfg = str(CONFIGS / f"{BF16}.yaml")
    out = run_cli("eval", "-c", cfg, "--engines-dir", str(engines_dir), "--tasks", "mmlu", "--limit",
                  str(MMLU_LIMIT), "--data-dir", str(data_dir))
    assert out.returncode == 0, out.stderr
    assert "[cache hit]" in out.stdout and f"on {MMLU_LIMIT} items" in out.stdout
    offline = run_cli("eval", "-c", cfg, "--engines-dir", str(engines_dir), "--tasks", "mmlu",
                      env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path), "TRTLLM_PIPELINE_DATA_DIR": ""})
    assert offline.returncode == 3 and "cais/mmlu" in offline.stderr and "--data-dir" in offline.stderr


@pytest.mark.slow
def test_reasoning_mode_runs_through_the_chat_template(built, engines_dir, data_dir, tmp_path):
    built(BF16)
    (result,) = evaluate(tiny(BF16, gsm8k_mode="reasoning", gsm8k_max_new_tokens=8), engines_dir=engines_dir,
                         tasks=["gsm8k"], limit=2, data_dir=data_dir, output=tmp_path / "reasoning.json")
    r = json.loads((tmp_path / "reasoning.json").read_text())
    assert result.path == tmp_path / "reasoning.json" and r["complete"] and r["n"] == 2
    assert r["settings"]["mode"] == "reasoning" and r["settings"]["shots"] == 0
    assert all(it["output_tokens"] <= 8 for it in r["items"])
    for item in r["items"]:  # an unclosed <think> block has no strict answer
        assert "</think>" in item["output"] or (item["prediction"] is None and item["correct"] is False)
    assert os.path.exists(engines_dir / BF16 / "eval" / "gsm8k.json")  # the default results were left alone


@pytest.mark.slow
def test_served_model_scores_like_the_engine_in_process(served, engines_dir, data_dir, tmp_path):
    server = served(FP8)
    url = f"127.0.0.1:{server.grpc_port}"
    cfg = tiny(FP8, gsm8k_max_new_tokens=8)
    remote = {r.task: r.results for r in evaluate(cfg, engines_dir=engines_dir, tasks=["mmlu", "gsm8k"], limit=8,
                                                    data_dir=data_dir, url=url)}
    local = {r.task: r.results for r in evaluate(cfg, engines_dir=engines_dir, tasks=["mmlu", "gsm8k"], limit=8,
                                                   data_dir=data_dir, output=tmp_path)}
    assert remote["mmlu"]["runtime_info"] == {"runtime": "served", "url": url, "protocol": "grpc"}
    assert (engines_dir / FP8 / "eval" / "served" / "mmlu.json").is_file()
    for task in ("mmlu", "gsm8k"):
        assert remote[task]["complete"] and remote[task]["settings"] == local[task]["settings"]
        for r, l in zip(remote[task]["items"], local[task]["items"]):
            assert (r["id"], r["prompt_sha256"], r["prediction"]) == (l["id"], l["prompt_sha256"], l["prediction"])
            if task == "mmlu":
                assert r["logprobs"] == pytest.approx(l["logprobs"], abs=1e-3)
            else:
                assert (r["output"], r["finish_reason"]) == (l["output"], l["finish_reason"])
    # What is served can be gated against the in-process run: the same items, prompts and settings.
    out = CliRunner().invoke(main, ["gate", "--baseline", str(tmp_path / "mmlu.json"), "--candidate",
                                    str(engines_dir / FP8 / "eval" / "served" / "mmlu.json"), "--max-drop", "0"])
    assert out.exit_code == 0 and "+0.00" in out.output
