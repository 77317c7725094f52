"""The fidelity task: its statistics, its text set, the gate's rules on it, and a real run on the tiny model."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from conftest import CONFIGS, load
from trtllm_pipeline.cli import main
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.eval import evaluate
from trtllm_pipeline.gating import FidelityLimits, judge_fidelity, load_gates
from trtllm_pipeline.results import EVAL_SCHEMA
from trtllm_pipeline.tasks import fidelity

BF16, FP8 = "tiny-qwen2-bf16-tp1", "tiny-qwen2-fp8-tp1"
CHUNKS = 2  # --limit: chunks of the text set, 255 scored tokens each
SCORED = fidelity.CHUNK_TOKENS - 1 - fidelity.CHUNK_TOKENS // 2


def token(i: int, kld: float, nll: float, nll_ref: float, same: bool = True) -> dict:
    return {"id": f"chunk0/{256 + i}", "correct": same, "prediction": 1, "target": 1 if same else 2, "token": 3,
            "kld": kld, "nll": nll, "nll_reference": nll_ref}


def results(config: str, items: list[dict], reference: dict | None, engine: str = "e-" + BF16) -> dict:
    return {"schema": EVAL_SCHEMA, "task": "fidelity", "config": config, "settings": {"chunks": 16},
            "items": items, "n": len(items), "complete": True, "engine": engine, "reference": reference,
            "score": sum(it["correct"] for it in items) / len(items)}


# --------------------------------------------------------------------------- fast


def test_statistics_are_llama_cpps():
    items = [token(i, kld=i / 100, nll=2.0 + (i % 2) * 0.2, nll_ref=2.0, same=i % 4 != 0) for i in range(101)]
    s = fidelity.summarize(items)
    assert s["tokens"] == 101
    assert s["kld_mean"] == pytest.approx(0.5)
    assert s["kld_median"] == pytest.approx(0.5) and s["kld_max"] == pytest.approx(1.0)
    assert s["kld_p99"] == pytest.approx(0.99)  # linear between order statistics: 0.99 * 100 -> the 99th
    assert s["top1"] == pytest.approx(75 / 101)
    assert s["ppl_reference"] == pytest.approx(math.exp(2.0))
    mean_nll = (2.0 * 51 + 2.2 * 50) / 101
    assert s["ppl"] == pytest.approx(math.exp(mean_nll))
    assert s["ppl_ratio"] == pytest.approx(math.exp(mean_nll - 2.0)) and s["ppl_ratio_error"] > 0


def test_the_gate_judges_kld_agreement_and_ppl_ratio():
    base = results(BF16, [token(i, 0.0, 2.0, 2.0) for i in range(10)], None)
    cand_items = [token(i, 0.02, 2.05, 2.0, same=i != 0) for i in range(10)]
    cand = results(FP8, cand_items, {"config": BF16, "engine": "e-" + BF16}, engine="e-" + FP8)
    verdict = judge_fidelity(base, cand, FidelityLimits(max_mean_kld=0.05, min_top1=0.85, max_ppl_ratio=1.1))
    assert verdict.status == "pass" and "mean KLD 0.0200 <= 0.05" in verdict.reason and not verdict.notes
    for limits, says in ((FidelityLimits(max_mean_kld=0.01), "mean KLD 0.0200 > 0.01"),
                         (FidelityLimits(min_top1=0.95), "top-1 agreement 90.00% < 95%"),
                         (FidelityLimits(max_ppl_ratio=1.01), "PPL ratio 1.0513 > 1.01")):
        verdict = judge_fidelity(base, cand, limits)
        assert verdict.status == "fail" and verdict.reason == says
    itself = results(FP8, cand_items, None)
    with pytest.raises(InputError, match=f"{FP8} was compared with itself, not {BF16}"):
        judge_fidelity(base, itself, FidelityLimits())
    stale = results(FP8, cand_items, {"config": BF16, "engine": "an older build"})
    with pytest.raises(InputError, match="rebuilt since"):
        judge_fidelity(base, stale, FidelityLimits())
    other_text = {**cand, "settings": {"chunks": 8}}
    with pytest.raises(InputError, match="different settings"):
        judge_fidelity(base, other_text, FidelityLimits())


def test_gates_file_thresholds_and_the_cli_exit_codes(tmp_path):
    gates = load_gates(CONFIGS.parent / "eval" / "gates.yaml")
    assert gates.fidelity.max_mean_kld > 0 and gates.entry(BF16, FP8).fidelity.min_top1 == 0.5
    base = results(BF16, [token(i, 0.0, 2.0, 2.0) for i in range(10)], None)
    cand = results(FP8, [token(i, 0.3, 2.5, 2.0) for i in range(10)], {"config": BF16, "engine": "e-" + BF16})
    paths = {}
    for name, data in (("base", base), ("cand", cand)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    strict = tmp_path / "gates.yaml"
    strict.write_text("fidelity: {max_mean_kld: 0.5, min_top1: 0.9, max_ppl_ratio: 1.2}\n")
    runner = CliRunner()
    args = ["gate", "--baseline", str(paths["base"]), "--candidate", str(paths["cand"]), "--gates", str(strict)]
    out = runner.invoke(main, args)
    assert out.exit_code == 1 and "PPL ratio 1.6487 > 1.2" in out.output and "mean KLD" in out.output
    strict.write_text("fidelity: {max_mean_kld: 0.5, min_top1: 0.9, max_ppl_ratio: 2}\n")
    out = runner.invoke(main, args)
    assert out.exit_code == 0 and "PASS" in out.output
    strict.write_text("fidelity: {max_mean_kld: -1}\n")
    out = runner.invoke(main, args)
    assert out.exit_code == 2 and "fidelity.max_mean_kld" in out.output


def test_the_reference_is_a_config_name_beside_the_config_or_a_file(tmp_path):
    import yaml

    from trtllm_pipeline.config import config_from_dict
    from trtllm_pipeline.errors import ConfigError
    from trtllm_pipeline.eval import reference_config

    data = yaml.safe_load((CONFIGS / f"{FP8}.yaml").read_text())

    def with_reference(name):
        data["evaluation"]["fidelity_reference"] = name
        return config_from_dict(data, name=FP8, path=CONFIGS / f"{FP8}.yaml")

    assert reference_config(with_reference(None), None) is None
    assert reference_config(with_reference(BF16), None).name == BF16
    assert reference_config(with_reference(FP8), None) is None  # itself
    assert reference_config(with_reference(None), CONFIGS / f"{BF16}.yaml").name == BF16
    with pytest.raises(ConfigError, match="no such config file"):
        reference_config(with_reference("no-such-build"), None)


def test_text_set_is_fixed_chunks_of_the_eval_data(data_dir):
    from transformers import PreTrainedTokenizerFast

    from trtllm_pipeline.model.builtin import tokenizer_asset

    task_data = fidelity.load(data_dir)
    assert [it.id for it in task_data.items] == [f"chunk{i}" for i in range(fidelity.CHUNKS)]
    documents = task_data.fewshot["documents"]
    assert {d["id"].split("/")[0] for d in documents[:50]} == {"mmlu", "gsm8k"}  # both sources, interleaved
    assert documents == fidelity.load(data_dir).fewshot["documents"]  # the same order every time
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_asset()))  # the tiny model's
    chunks = fidelity.chunks(tokenizer, documents)
    assert len(chunks) == fidelity.CHUNKS and all(len(c) == fidelity.CHUNK_TOKENS for c in chunks)
    bos = tokenizer("", add_special_tokens=True)["input_ids"]  # what the tokenizer starts a text with
    assert len(bos) == 1 and {c[0] for c in chunks} == set(bos)  # and so each chunk
    assert tokenizer.decode(chunks[0][1:]).startswith(documents[0]["text"][:40])
    assert tokenizer.decode(chunks[0][1:] + chunks[1][1:]) in "\n\n".join(d["text"] for d in documents)


# --------------------------------------------------------------------------- a real run


@pytest.fixture(scope="module")
def measured(built, engines_dir, data_dir):
    """(baseline results, candidate results): BF16 as its own reference, FP8 against BF16."""
    for name in (BF16, FP8):
        built(name)
    (base,) = evaluate(load(BF16), engines_dir=engines_dir, tasks=["fidelity"], limit=CHUNKS, data_dir=data_dir)
    (cand,) = evaluate(load(FP8), engines_dir=engines_dir, tasks=["fidelity"], limit=CHUNKS, data_dir=data_dir,
                       reference=CONFIGS / f"{BF16}.yaml")
    return base, cand


@pytest.mark.slow
def test_fidelity_of_fp8_against_bf16(measured, engines_dir, data_dir):
    base, cand = measured
    for r in (base, cand):
        assert r.results["complete"] and r.results["n"] == CHUNKS * SCORED and r.results["settings"]["limit"] == CHUNKS
    assert all(it["kld"] == 0 and it["correct"] and it["nll"] == it["nll_reference"] for it in base.results["items"])
    assert base.results["reference"] is None
    assert cand.results["reference"]["config"] == BF16
    assert cand.results["reference"]["engine"] == base.results["engine"]
    s = fidelity.summarize(cand.results["items"])
    assert 0 < s["kld_mean"] < 1 and s["kld_max"] >= s["kld_p99"] >= s["kld_median"] >= 0
    assert s["ppl_reference"] == pytest.approx(fidelity.summarize(base.results["items"])["ppl"], rel=1e-6)
    assert [it["id"] for it in cand.results["items"]] == [it["id"] for it in base.results["items"]]
    # The same inputs are a cache hit; another reference is another result.
    (again,) = evaluate(load(FP8), engines_dir=engines_dir, tasks=["fidelity"], limit=CHUNKS, data_dir=data_dir,
                        reference=CONFIGS / f"{BF16}.yaml")
    assert again.cache_hit
    out = CliRunner().invoke(main, ["gate", "--baseline", str(base.path), "--candidate", str(cand.path)])
    assert out.exit_code == 0 and f"fidelity  {FP8}  {BF16}  {CHUNKS * SCORED}" in out.output


@pytest.mark.slow
def test_sequence_logprobs_agree_with_score(built, engines_dir, data_dir):
    from trtllm_pipeline.runtimes.registry import load_runtime

    built(BF16)
    runtime = load_runtime(load(BF16), engines_dir)
    try:
        tokens = fidelity.chunks(runtime.tokenizer, fidelity.load(data_dir).fewshot["documents"])[0][:80]
        rows = runtime.sequence_logprobs(tokens, 60)
        assert rows.shape == (20, runtime.vocab_size)
        assert float(rows.exp().sum(-1).sub(1).abs().max()) < 1e-4
        for k in (61, 70, 79):  # the log-likelihood score() gives the token after tokens[:k]
            (logprob, _), = runtime.score([tokens[:k]], [[tokens[k]]])
            assert float(rows[k - 1 - 60, tokens[k]]) == pytest.approx(logprob, abs=1e-5)
    finally:
        runtime.close()
