"""MMLU here equals lm-evaluation-harness's ``mmlu`` item by item (benchmarks/lm_eval_mmlu.py on a few items).

The tiny Llama's BF16 build in the torch runtime (float32 compute) against lm-eval's ``--model hf``
on the same weights in float32, 5-shot, over the same questions: the same prediction for each and
log-likelihoods within 1e-4. lm-eval is an optional dependency (``pip install -e '.[lm-eval]'``);
without it the test is skipped. The real model's run is ``benchmarks/results/lm-eval-mmlu-smollm2.json``.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import CONFIGS, REPO

CONFIG = "tiny-llama-bf16-tp1"


@pytest.mark.slow
def test_mmlu_equals_lm_eval_item_by_item(built, engines_dir, data_dir):
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install -e '.[lm-eval]')")
    spec = importlib.util.spec_from_file_location("lm_eval_mmlu", REPO / "benchmarks" / "lm_eval_mmlu.py")
    script = sys.modules["lm_eval_mmlu"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    built(CONFIG)
    result = script.compare(CONFIGS / f"{CONFIG}.yaml", engines_dir, data_dir, limit=4, batch_size=4)
    assert result["items"] == 4 and len({row["id"].split("/")[0] for row in result["rows"]}) == 4
    assert result["predictions_identical"] == 4
    assert result["max_abs_delta_loglikelihood"] < 1e-4
