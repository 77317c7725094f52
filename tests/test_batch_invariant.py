"""``runtime.batch_invariant``: every token computed by the same kernels whatever its batch, chunk or cached prefix
(the linears and logits through ``cuda/invariant_gemm``, every row's attention through ``cuda/paged_prefill``), on
the tiny checkpoints through Triton's interpreter; and the config key and the bench flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtllm_pipeline.cli import main as cli
from trtllm_pipeline.config import load_config
from trtllm_pipeline.eval import runtime_identity

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("name", ["tiny-qwen2-fp8-tp1", "tiny-llama-bf16-tp1"])
def test_batch_invariant_outputs_with_the_prefix_cache_equal_those_without(built, name):
    """Prompts sharing three KV blocks of prefix: with the prefix cache and 16-token prefill chunks (the first
    prompt's prefix in two chunks, the others' suffixes later chunks over its cached blocks, chunks beside decodes) the
    same greedy tokens as whole prompts without it, and as each prompt alone; every step eager, every linear through
    the invariant GEMM (FP8 from its E4M3 weight), every row's attention through the paged kernel; decode rows through
    ``cuda/row_graphs`` (run directly here) the eager forward's bits. A float32 engine is refused, naming the fix. (Through the interpreter a dot sums exact products: the GPU's own invariance is the
    queue's ``BATCH_INVARIANT=1 h200_run.sh prefix``.)"""
    pytest.importorskip("triton")
    ckpt = built(name).engine_dir.parent / "checkpoint"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(TESTS / "invariant_check.py"), str(ckpt)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["decode_path"] == "eager (runtime.batch_invariant)" and r["described"]
    assert r["linears_invariant"] and r["attention_rows"] == "all" and r["gemm_refusal"] is None
    assert r["prefix_hits"] >= 3 * 3  # three later prompts, three cached blocks each
    assert r["with_reuse_equal"] and r["one_at_a_time_equal"], r
    assert r["row_graphs_equal"]  # decode rows as the CUDA graphs run them (padded to a bucket): eager's bits
    assert all(len(t) == 6 for t in r["without_reuse"])
    # as accurate as the default mode: the next token's log-probabilities as far from float32's (seen: 1.5e-2 and
    # 1.4e-2 for the FP8 model, 6.0e-3 and 6.8e-3 for BF16); the tiny random models turn that rounding into other
    # tokens within a few steps, so the modes' outputs agree on the first token of most prompts, not on all six
    off = r["logprobs_from_float32"]
    assert off["invariant"] < 1.5 * off["default"] and r["default_mode_first_equal"] >= 2, r
    assert "batch_invariant" in r["float32_refused"] and "bfloat16" in r["float32_refused"]


def test_batch_invariant_is_a_runtime_key_and_a_bench_flag_of_in_process_runs(tmp_path):
    cfg = load_config(TESTS.parent / "build_configs" / "tiny-qwen2-fp8-tp1.yaml")
    on = cfg.with_runtime(batch_invariant=True)
    assert cfg.runtime.batch_invariant is False and on.runtime.batch_invariant
    # another result for eval's cache; results cached before the key existed keep theirs
    assert runtime_identity(on) == {**runtime_identity(cfg), "batch_invariant": True}
    assert "batch_invariant" not in runtime_identity(cfg)
    result = CliRunner().invoke(cli, ["bench", "--batch-invariant", "-c", "build_configs/tiny-qwen2-fp8-tp1.yaml"])
    assert result.exit_code == 2 and "--batch-invariant go with --in-process" in result.output
