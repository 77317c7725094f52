"""Speculative decoding in the torch runtime on CPU (tiny model): greedy output token for token the same as without
(n-gram and draft proposers, mixed rows, preemption), KV rollback leaving the allocator consistent, the rejection
rule preserving the target's distribution, the proposer pieces, and the config's refusals."""

from __future__ import annotations

import json
import shutil
from array import array

import pytest
import torch
import yaml
from conftest import CONFIGS
from spec_oracle import oracle_settings

from trtllm_pipeline.config import SpeculativeSection, config_from_dict
from trtllm_pipeline.errors import ConfigError
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine import sampling
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime
from trtllm_pipeline.runtimes.torch_engine.speculative.acceptance import accept_greedy, accept_sampled
from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import lookup

NAME = "tiny-qwen2-bf16-tp1"
PASSAGE = list(range(3000, 3030))
# repetitive prompts (lookups hit) beside random ones (they rarely do): speculating and plain rows in one batch
PROMPTS = [PASSAGE + [7, 8] + PASSAGE[:6], list(range(4000, 4021)), PASSAGE[5:] + PASSAGE[:9],
           [11, 12, 13, 11, 12, 13, 11, 12]]


@pytest.fixture(scope="module")
def ckpt(built):
    return built(NAME).engine_dir.parent / "checkpoint"


def _rt(ckpt, spec: dict | None = None, **kw) -> TorchRuntime:
    args = dict(max_batch_size=4, max_seq_len=256, dtype="float32", kv_block_size=4)
    return TorchRuntime(ckpt, ckpt / "tokenizer", speculative=SpeculativeSection(**spec) if spec else None,
                        **{**args, **kw})


@pytest.fixture(scope="module")
def plain(ckpt):
    return _rt(ckpt)


@pytest.fixture(scope="module")
def expected(plain):
    """Plain greedy decoding's tokens for PROMPTS: what every speculative run must give."""
    return _greedy(plain)


def _oracle_rt(ckpt, expected, k=4, **kw):
    args = dict(max_batch_size=4, max_seq_len=256, dtype="float32", kv_block_size=4)
    return TorchRuntime(ckpt, ckpt / "tokenizer", speculative=oracle_settings(expected, k), **{**args, **kw})


def _greedy(rt, prompts=PROMPTS, n=24, check=False):
    for i, p in enumerate(prompts):
        rt.submit(i, p, SamplingParams(max_tokens=n, end_id=-1))
    out = {i: [] for i in range(len(prompts))}
    while rt.has_work():
        for e in rt.step():
            out[e.request_id] += e.token_ids
        if check:
            rt.kv.check()  # after every rollback: no block leaked, none freed twice
    return [out[i] for i in range(len(prompts))]


def test_verified_drafts_give_plain_greedy_token_for_token_and_roll_back_cleanly(ckpt, expected):
    rt = _oracle_rt(ckpt, expected)
    assert _greedy(rt, check=True) == expected
    stats = rt.stats()
    assert 0 < stats["spec_decode_accepted_tokens"] < stats["spec_decode_draft_tokens"]  # kept some, rejected some
    assert stats["spec_decode_acceptance_length"] > 1.5
    assert stats["spec_decode_verify_rows"] < sum(len(o) for o in expected)  # several tokens a step
    assert rt.kv.free_blocks == rt.kv.usable_blocks and not rt.kv.tables


def test_speculation_under_preemption_prefix_cache_and_a_tight_token_budget(ckpt, expected):
    # 24 blocks of 4 cannot hold the 4 requests with their drafts: the latest is preempted and recomputed; a budget
    # of 10 tokens a step cuts drafts short; the prefix cache keys only accepted tokens (rt.kv.check each step)
    rt = _oracle_rt(ckpt, expected, k=8, kv_cache_blocks=24, enable_kv_cache_reuse=True, max_num_tokens=10)
    assert _greedy(rt, check=True) == expected
    assert rt.stats()["preemptions"] > 0 and rt.stats()["spec_decode_accepted_tokens"] > 0
    assert rt.kv.free_blocks == rt.kv.usable_blocks and not rt.kv.tables


def test_ngram_greedy_is_plain_greedy_with_rows_mixed(ckpt, expected):
    rt = _rt(ckpt, {"method": "ngram", "num_draft_tokens": 4, "ngram_min": 1})
    assert _greedy(rt, check=True) == expected
    assert rt.stats()["spec_decode_draft_tokens"] > 0  # the repetitive prompts' lookups hit (the others: no drafts)


def test_draft_model_greedy_is_plain_greedy(ckpt, expected):
    rt = _rt(ckpt, {"method": "draft", "num_draft_tokens": 3, "draft_checkpoint": str(ckpt), "adaptive": False})
    assert _greedy(rt, check=True) == expected
    stats = rt.stats()
    # the model drafting for itself: the target keeps (nearly) every draft
    assert stats["spec_decode_draft_tokens"] > 0
    assert stats["spec_decode_accepted_tokens"] >= 0.95 * stats["spec_decode_draft_tokens"]
    assert stats["spec_decode_acceptance_length"] > 3.5
    rt.close()


def test_self_speculation_greedy_is_plain_greedy(ckpt, expected):
    rt = _rt(ckpt, {"method": "self", "num_draft_tokens": 2, "draft_layers": 2, "adaptive": False})
    assert _greedy(rt, check=True) == expected
    assert rt.stats()["spec_decode_draft_tokens"] > 0  # the first 2 of 4 layers drafted
    with pytest.raises(ConfigError, match="draft_layers: 4 is not fewer than the target's 4 layers"):
        _rt(ckpt, {"method": "self", "draft_layers": 4})


def test_seeded_sampling_with_speculation_is_reproducible(ckpt):
    rt = _rt(ckpt, {"method": "ngram", "ngram_min": 1})
    params = SamplingParams(max_tokens=20, temperature=0.8, top_k=50, top_p=0.95, seed=7, end_id=-1)
    runs = [[c.token_ids for c in rt.generate(PROMPTS[:2], params)] for _ in range(2)]
    assert runs[0] == runs[1] and all(len(t) == 20 for t in runs[0])
    assert rt.stats()["spec_decode_draft_tokens"] > 0
    rt.kv.check()


def test_rejection_sampling_preserves_the_target_distribution(plain):
    """The first token a verify row emits, over many draws, against the target's own distribution p (total variation
    distance): for a fixed draft token (an n-gram's point mass) and for drafts drawn from a draft distribution q
    (a draft model's). Fixed seed: deterministic."""
    logits = plain.engine.logits(plain.hidden_states([3000, 3001, 3002, 3003])[-2:])
    p = sampling.filtered_probs(logits, [SamplingParams(temperature=1.5, top_k=12)] * 2)  # p0, p1
    q = sampling.filtered_probs(logits[:1], [SamplingParams(temperature=4.0, top_k=30)])  # flatter, wider: a draft's
    support = ((p > 0).any(0) | (q[0] > 0)).nonzero().flatten()  # outside it p = q = 0: the same rule, less work
    p, q = p[:, support], q[:, support]
    gen = torch.Generator().manual_seed(1234)
    second = int(torch.argsort(p[0], descending=True)[1])
    n = 4000
    for name in ("point mass", "draft distribution"):
        counts = torch.zeros_like(p[0])
        drafted = torch.zeros_like(p[0])
        for _ in range(n):
            draft = second if name == "point mass" else int(torch.multinomial(q[0], 1, generator=gen))
            drafted[draft] += 1
            counts[accept_sampled(p, [draft], gen, None if name == "point mass" else q)[0]] += 1
        tv = 0.5 * float((counts / n - p[0]).abs().sum())
        assert tv < 0.03, (name, tv)
        # the test has power: the drafts themselves are far from p
        assert 0.5 * float((drafted / n - p[0]).abs().sum()) > 0.2, name


def test_acceptance_rules_and_prompt_lookup():
    assert accept_greedy([5, 6, 9, 1], [5, 6, 7]) == [5, 6, 9]
    assert accept_greedy([5, 6, 7, 1], [5, 6, 7]) == [5, 6, 7, 1]
    assert accept_greedy([4], []) == [4]
    certain = torch.zeros(3, 10)
    certain[0, 2] = certain[1, 3] = certain[2, 4] = 1.0
    assert accept_sampled(certain, [2, 3], torch.Generator().manual_seed(0)) == [2, 3, 4]
    assert accept_sampled(certain, [2, 9], torch.Generator().manual_seed(0)) == [2, 3]
    hist = array("i", [1, 2, 3, 4, 5, 9, 2, 3])
    assert lookup(hist, 3, 1, 3) == [4, 5, 9]  # "2 3" occurred before: what followed it
    assert lookup(array("i", [1, 2, 3, 4]), 3, 1, 3) == []
    # the latest occurrence wins, and the match is on whole tokens (int32s), never across two
    assert lookup(array("i", [7, 1, 7, 2, 7]), 2, 1, 1) == [2, 7]
    assert lookup(array("i", [256, 1, 0, 1]), 2, 1, 1) == [0, 1]


def test_speculative_config_refusals(ckpt, tmp_path):
    base = yaml.safe_load((CONFIGS / "tiny-qwen2-bf16-tp1.yaml").read_text())

    def error(spec):
        data = {**base, "runtime": {**base["runtime"], "speculative": spec}}
        with pytest.raises(ConfigError) as exc:
            config_from_dict(data, name="t", path=CONFIGS / "t.yaml")
        return str(exc.value)

    assert "runtime.speculative.num_draft_tokens" in error({"method": "ngram", "num_draft_tokens": 9})
    assert "runtime.speculative.method" in error({"method": "eagle"})
    assert "ngram_min (4) exceeds ngram_max (2)" in error({"method": "ngram", "ngram_min": 4, "ngram_max": 2})
    assert "needs runtime.speculative.draft_checkpoint" in error({"method": "draft"})
    assert "would be ignored" in error({"method": "ngram", "draft_checkpoint": "x"})
    assert "draft_layers is set but method is 'draft'" in error({"method": "draft", "draft_checkpoint": "x",
                                                                 "draft_layers": 2})
    assert config_from_dict(base, name="t").runtime.speculative.method == "none"  # off by default
    # a draft whose tokenizer is not the target's: refused, naming both
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(ckpt / "config.json", other / "config.json")
    shutil.copytree(ckpt / "tokenizer", other / "tokenizer")
    tok = json.loads((other / "tokenizer" / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer" / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ConfigError) as exc:
        _rt(ckpt, {"method": "draft", "draft_checkpoint": str(other)})
    assert str(other / "tokenizer") in exc.value.message and str(ckpt / "tokenizer") in exc.value.message
    with pytest.raises(ConfigError, match="not a checkpoint directory"):
        _rt(ckpt, {"method": "draft", "draft_checkpoint": str(tmp_path / "missing")})


def test_bench_in_process_speculative_reports_both_workloads(built, engines_dir, tmp_path):
    from trtllm_pipeline.bench.speculative import SpeculativeSettings, run_speculative

    built(NAME)
    settings = SpeculativeSettings(method="ngram", num_draft_tokens=2, output_tokens=8)
    result = run_speculative(config_from_dict(yaml.safe_load((CONFIGS / f"{NAME}.yaml").read_text()), name=NAME),
                             engines_dir=engines_dir, settings=settings, output=tmp_path / "spec.json",
                             progress=lambda line: None)
    runs = json.loads((tmp_path / "spec.json").read_text())["runs"]
    assert [(r["workload"], r["batch"]) for r in runs] == [("grounded", 1), ("random", 1)]
    assert all(r["identical"] and r["output_tokens"] == 8 and r["acceptance_length"] >= 1 for r in runs)
    assert "speedup" in result.table()[0] and "ngram, up to 2 drafts" in result.table()[-1]

