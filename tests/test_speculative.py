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
from conftest import CONFIGS, REPO, load, run_cli
from spec_oracle import greedy, oracle_settings

from trtllm_pipeline.config import SpeculativeSection, config_from_dict
from trtllm_pipeline.errors import ConfigError
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime
from trtllm_pipeline.runtimes.torch_engine import sampling
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime, _Request
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
    return greedy(rt, prompts, n, check)


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
    # not adaptive: a lookup at every step (the random model's text repeats itself once in a while, at no step set
    # in advance; adaptive, lookups that keep finding nothing are made less often)
    rt = _rt(ckpt, {"method": "ngram", "num_draft_tokens": 4, "ngram_min": 1, "adaptive": False})
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
    rt = _rt(ckpt, {"method": "ngram", "ngram_min": 1, "adaptive": False})  # (a lookup every step)
    params = SamplingParams(max_tokens=20, temperature=0.8, top_k=50, top_p=0.95, seed=7, end_id=-1)
    runs = [[c.token_ids for c in rt.generate(PROMPTS[:2], params)] for _ in range(2)]
    assert runs[0] == runs[1] and all(len(t) == 20 for t in runs[0])
    assert rt.stats()["spec_decode_draft_tokens"] > 0
    rt.kv.check()


# Bans at verification (``TorchRuntime._verify``): every position gets plain decoding's bans there. The tokens
# "BIN)\"" encodes to, 7420 324: a pair the tiny model writes after 3433, at positions 17-19 of BANNED_PROMPT's
# greedy output; that prompt holds the pair itself, so an n-gram lookup on 7420 drafts 324.
BAD_WORD, BAD_IDS = 'BIN)"', [7420, 324]
BANNED_PROMPT = BAD_IDS + list(range(4000, 4021))


def _run(rt, prompts, params):
    return [c.token_ids for c in rt.generate(prompts, params)]


def _self_drafted(ckpt):
    """The target drafting for itself: its drafts are the target's own greedy tokens, bans unknown to it (the end id
    where the target would end; a bad word's last token where the target would write it)."""
    return _rt(ckpt, {"method": "draft", "num_draft_tokens": 3, "draft_checkpoint": str(ckpt), "adaptive": False})


def _contains(tokens, word) -> bool:
    return any(list(tokens[j : j + len(word)]) == word for j in range(len(tokens) - len(word) + 1))


def _recording(rt) -> list[tuple[int, list[int]]]:
    """Each proposal, recorded: the tokens the request had generated, and its last token then its drafts (what its
    verify row feeds, if the step has room for them all)."""
    fed, propose = [], rt.speculator.proposer.propose

    def recorded(batch):
        out = propose(batch)
        fed.extend((len(r.generated), list(r.generated[-1:]) + list(d)) for r, d in zip(batch, out))
        return out

    rt.speculator.proposer.propose = recorded
    return fed


def test_min_tokens_rows_speculate_and_give_plain_greedy_token_for_token(ckpt, plain, expected):
    """bench's forced length (min_tokens = max_tokens) with the end id a token the model writes second: the end id is
    banned at every verified position, including after drafts, so the output is plain greedy's under the same ban,
    while the rows do speculate (they used to be left out of drafting)."""
    end_id = expected[0][1]
    params = SamplingParams(max_tokens=24, min_tokens=24, end_id=end_id)
    want = _run(plain, PROMPTS, params)
    assert all(len(t) == 24 and end_id not in t for t in want)
    rt = _self_drafted(ckpt)
    fed = _recording(rt)
    assert _run(rt, PROMPTS, params) == want
    stats = rt.stats()
    assert stats["spec_decode_draft_tokens"] > 0 and stats["spec_decode_accepted_tokens"] > 0
    assert any(end_id in f[1:] for _, f in fed)  # the drafts proposed the end id: the ban is what refused it
    # min_tokens reached inside a verify row: the end id is banned at its positions before min_tokens (the drafts
    # before them counted as generated) and allowed from there, so the request ends where plain decoding ends it
    at = 10  # the self-draft keeps all 3 drafts a row here: rows start at 1, 5, 9, so 10 is a row's second position
    end_id = expected[0][at]
    assert end_id not in expected[0][:at]
    params = SamplingParams(max_tokens=24, min_tokens=at, end_id=end_id)
    want = _run(plain, PROMPTS[:1], params)
    assert want == [expected[0][:at]]
    del fed[:]
    assert [(c.token_ids, c.finish_reason) for c in rt.generate(PROMPTS[:1], params)] == [(want[0], "end_id")]
    assert any(g < at <= g + len(f) - 1 for g, f in fed)  # a row verified position ``at`` after drafts
    rt.kv.check()
    rt.close()


@pytest.mark.parametrize("method", ["ngram", "self-draft"])
def test_a_bad_word_the_drafts_propose_is_never_emitted(ckpt, plain, method):
    """The n-gram lookup drafts the bad word's last token right after its first (the request's last token); the
    self-draft drafts the whole word inside one verify row (the ban at its second position follows from the draft at
    its first). Either way: never emitted, and the output is plain greedy's under the same bad word."""
    assert plain.tokenizer.encode(BAD_WORD, add_special_tokens=False) == BAD_IDS
    prompts = [BANNED_PROMPT] + PROMPTS[1:]
    assert _contains(_run(plain, prompts[:1], SamplingParams(max_tokens=24, end_id=-1))[0], BAD_IDS)  # unbanned
    params = SamplingParams(max_tokens=24, end_id=-1, bad_words=(BAD_WORD,))
    want = _run(plain, prompts, params)
    assert not any(_contains(t, BAD_IDS) for t in want)
    rt = (_rt(ckpt, {"method": "ngram", "num_draft_tokens": 4, "ngram_min": 1, "adaptive": False}) if method == "ngram"
          else _self_drafted(ckpt))
    fed = _recording(rt)
    assert _run(rt, prompts, params) == want
    assert rt.stats()["spec_decode_draft_tokens"] > 0
    assert any(_contains(f, BAD_IDS) for _, f in fed)  # proposed (in the self-draft's case, within the drafts)
    if method == "self-draft":
        assert any(_contains(f[1:], BAD_IDS) for _, f in fed) and rt.stats()["spec_decode_accepted_tokens"] > 0
    rt.kv.check()
    rt.close()


def test_seeded_sampling_with_min_tokens_and_bad_words_speculates_reproducibly(ckpt, expected):
    """Sampled rows with bans: the rejection rule runs over the banned, filtered distribution plain sampling draws
    from, so a drafted end id (before min_tokens) or bad word is never kept, and a seeded request is reproducible.
    A low temperature: unbanned, the end id would be kept (p ~ 0.9) where the self-draft proposes it, second."""
    end_id = expected[0][1]
    rt = _self_drafted(ckpt)
    fed = _recording(rt)
    params = [SamplingParams(max_tokens=20, min_tokens=20, temperature=0.1, top_k=40, seed=seed, end_id=end_id,
                             bad_words=(BAD_WORD,)) for seed in (11, 12, 13, 14)]
    prompts = [PROMPTS[0]] * 3 + [BANNED_PROMPT]
    runs = [_run(rt, prompts, params) for _ in range(2)]
    assert runs[0] == runs[1]
    assert all(len(t) == 20 and end_id not in t and not _contains(t, BAD_IDS) for t in runs[0])
    stats = rt.stats()
    assert stats["spec_decode_draft_tokens"] > 0 and stats["spec_decode_accepted_tokens"] > 0
    assert any(end_id in f[1:] for _, f in fed)
    rt.kv.check()
    rt.close()


def test_the_bans_at_a_verified_position_take_the_drafts_before_it_as_generated():
    req = _Request("r", [1, 2], generated=[7, 1], params=SamplingParams(max_tokens=9, min_tokens=4), end_id=5,
                   bad_ids=[[9], [1, 2, 3], [4, 4]])
    assert req.banned() == [5, 9]  # 2 generated < 4: the end id; a one-token word always
    assert req.banned([2]) == [5, 9, 3]  # "1 2" ends generated + drafts: "1 2 3"'s last token
    assert req.banned([2, 3]) == [9]  # 4 tokens: the end id is allowed
    assert req.banned([2, 4]) == [9, 4]  # "4 4"'s first token was drafted
    assert req.banned([4]) == [5, 9, 4]
    early = _Request("s", [1, 2], generated=[], params=SamplingParams(max_tokens=9), end_id=5, bad_ids=[[1, 2, 3]])
    # as plain decoding: a word is matched over generated tokens (here drafts), not the prompt's
    assert early.banned() == [] and early.banned([1]) == [] and early.banned([1, 2]) == [3]
    assert early.may_ban() and not _Request("t", [1], params=SamplingParams(max_tokens=9), end_id=5).may_ban()


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square distribution's quantile at the normal quantile ``z`` (3.09: 0.999), Wilson-Hilferty's cube."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_the_rejection_rule_emits_the_targets_distribution():
    """Speculative sampling's rule (``accept_sampled``) over a known target: the first emitted token is distributed
    as the target's first row whatever the draft (a point mass, as this project's proposers commit to one token, or
    a draft model's distribution q, its draft drawn from q), and after an accepted draft the next one as the second
    row. Chi-square against the target at the 0.999 quantile, 20,000 draws each, seeded."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.05, 0.40, 0.10, 0.30, 0.15], [0.25, 0.25, 0.10, 0.20, 0.20]], dtype=torch.float64)
    q = torch.tensor([0.50, 0.10, 0.20, 0.10, 0.10], dtype=torch.float64)
    n = 20_000
    for draft_probs in (None, q[None]):
        first, second = torch.zeros(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
        kept = 0
        for _ in range(n):
            d = 1 if draft_probs is None else int(torch.multinomial(q, 1, generator=gen))
            out = accept_sampled(p, [d], gen, draft_probs)
            first[out[0]] += 1
            if len(out) == 2:  # the draft was kept: the token after it is the second row's
                kept += 1
                second[out[1]] += 1
        assert _chi2(first, p[0]) < _chi2_critical(4), (draft_probs, first)
        assert _chi2(second, p[1]) < _chi2_critical(4), (draft_probs, second)
        # kept with probability sum min(p, q): 0.40 for the point mass on token 1, 0.70 for q
        want = 0.40 if draft_probs is None else float(torch.minimum(p[0], q).sum())
        assert abs(kept / n - want) < 4 * (want * (1 - want) / n) ** 0.5, (kept, want)


def test_sampling_with_speculation_draws_what_plain_sampling_draws(ckpt):
    """The tiny model end to end: 600 seeded requests sampled (temperature 1, top-k 3) with the target drafting for
    itself (its greedy drafts kept or rejected by the rule; from the second token on, a verify row) against 600
    plain ones: the three tokens' joint counts are one distribution (two-sample chi-square at the 0.999 quantile,
    sequences seen fewer than 10 times in all pooled)."""
    plain = _rt(ckpt, max_batch_size=32)
    spec = _rt(ckpt, {"method": "draft", "num_draft_tokens": 3, "draft_checkpoint": str(ckpt), "adaptive": False},
               max_batch_size=32)
    n, prompt = 600, PROMPTS[1]

    def pairs(rt, seeds) -> dict:
        out: dict = {}
        for i, seed in enumerate(seeds):
            rt.submit(i, prompt, SamplingParams(max_tokens=3, temperature=1.0, top_k=3, seed=seed, end_id=-1))
        got = {i: [] for i in range(len(seeds))}
        while rt.has_work():
            for e in rt.step():
                got[e.request_id] += e.token_ids
        for tokens in got.values():
            out[tuple(tokens)] = out.get(tuple(tokens), 0) + 1
        return out

    a, b = pairs(plain, range(n)), pairs(spec, range(n, 2 * n))
    assert spec.stats()["spec_decode_draft_tokens"] > 0 and spec.stats()["spec_decode_accepted_tokens"] > 0
    rare = {c for c in set(a) | set(b) if a.get(c, 0) + b.get(c, 0) < 10}
    for counts in (a, b):
        counts["rare"] = sum(counts.pop(c, 0) for c in rare)
    cells = [c for c in set(a) | set(b) if a.get(c, 0) + b.get(c, 0)]
    stat = sum((a.get(c, 0) - b.get(c, 0)) ** 2 / (a.get(c, 0) + b.get(c, 0)) for c in cells)
    print(f"two-sample chi-square {stat:.1f} over {len(cells)} cells (0.999 quantile {_chi2_critical(len(cells) - 1):.1f})")
    assert len(cells) > 5 and stat < _chi2_critical(len(cells) - 1), (stat, a, b)


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
    # a continuation cut by the history's end repeats its period: a looping output drafts k tokens, not one period
    assert lookup(array("i", [1, 2, 3, 1, 2, 3, 1, 2]), 8, 1, 4) == [3, 1, 2, 3, 1, 2, 3, 1]
    assert lookup(array("i", [5, 9, 9]), 3, 1, 1) == [9, 9, 9]


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
    # k by method where none is given (config.DEFAULT_DRAFT_TOKENS: prompt lookup's from benchmarks/spec_simulate.py)
    assert (SpeculativeSection(method="ngram").num_draft_tokens, SpeculativeSection(method="ngram").ngram_min) == (8, 1)
    assert SpeculativeSection(method="self").num_draft_tokens == 4
    assert SpeculativeSection(method="ngram", num_draft_tokens=3).num_draft_tokens == 3
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


def test_bench_in_process_speculative_reports_every_workload(built, engines_dir, tmp_path):
    """Batch 1 runs ``prompts`` prompts one after another, its figures their totals, each prompt's listed too; batch
    2 runs two together; k is the method's default where none is given (ngram: 8, in the file's name)."""
    from trtllm_pipeline.bench.speculative import SpeculativeSettings, run_speculative

    built(NAME)
    settings = SpeculativeSettings(method="ngram", output_tokens=8, prompts=3, batches=(1, 2), repeats=1,
                                   ignore_eos=True)
    result = run_speculative(config_from_dict(yaml.safe_load((CONFIGS / f"{NAME}.yaml").read_text()), name=NAME),
                             engines_dir=engines_dir, settings=settings, progress=lambda line: None)
    assert result.path == engines_dir / NAME / "bench" / "speculative-ngram-k8.json"
    data = json.loads(result.path.read_text())
    assert data["schema"] == "speculative-3" and data["settings"]["num_draft_tokens"] == 8
    runs = data["runs"]
    assert [(r["workload"], r["batch"], r["prompts"]) for r in runs] == [
        ("grounded", 1, 3), ("grounded", 2, 2), ("random", 1, 3), ("random", 2, 2), ("open", 1, 3), ("open", 2, 2)]
    # --ignore-eos: every request its 8 tokens, each batch-1 prompt's counted
    assert all(r["identical"] and r["output_tokens"] == 8 * r["prompts"] and r["acceptance_length"] >= 1
               for r in runs)
    assert all(p["output_tokens"] == 8 for r in runs if r["batch"] == 1 for p in r["per_prompt"])
    assert data["settings"]["ignore_eos"] and "requests end past the end id" in result.table()[-1]
    # the diagnosis beside ``identical``: the tiny model's outputs agree, plain with plain and spec with plain
    assert all(r["plain_deterministic"] and r["differing_prompts"] == 0 == r["near_tie_differences"] for r in runs)
    assert all(p["same"] and "margin" not in p for r in runs if r["batch"] == 1 for p in r["per_prompt"])
    assert all(r["differences"] == [] for r in runs if r["batch"] == 2)
    for r in (r for r in runs if r["batch"] == 1):
        each = r["per_prompt"]
        assert len(each) == 3 and abs(sum(p["spec_s"] for p in each) - r["spec_s"]) < 1e-9
        assert sum(p["draft_tokens"] for p in each) == r["draft_tokens"]
    assert all("per_prompt" not in r for r in runs if r["batch"] == 2)
    assert "speedup" in result.table()[0] and "ngram, up to 8 drafts" in result.table()[-1]
    assert all(" 3/3 " in line or " 2/2 " in line for line in result.table()[1:-1])


def test_the_bench_names_where_outputs_part_and_by_what_margin(plain):
    """``first_difference`` (what the bench reports per differing prompt), on plain greedy's own output against a
    copy with one token swapped for the model's least likely one: found where it was swapped, its margin recomputed
    eagerly and far from a tie (a bug's signature); a swap to the runner-up of a position is reported as such."""
    from trtllm_pipeline.bench.speculative import first_difference, is_near_tie

    prompt = PROMPTS[1]
    want = _greedy(plain, [prompt], n=12)[0]
    at = 5
    row = plain.executor.logits(plain.hidden_states(prompt + want[:at])[-1]).float()
    assert int(row.argmax()) == want[at]  # the eager forward agrees with what greedy decoding emitted
    worst = int(row.argmin())
    got = first_difference(plain, prompt, want, want[:at] + [worst] + want[at + 1 :])
    assert got["first_difference"] == at and (got["plain_token"], got["spec_token"]) == (want[at], worst)
    assert abs(got["margin"] - float(row[want[at]] - row[worst])) < 1e-4
    assert got["margin"] > 0 and not got["near_tie"]
    runner_up = int(row.topk(2).indices[1])
    close = first_difference(plain, prompt, want, want[:at] + [runner_up] * (len(want) - at))
    assert close["first_difference"] == at and close["near_tie"] == is_near_tie(close["margin"], float(row.max()))
    assert 0 <= close["margin"] <= got["margin"]
    assert first_difference(plain, prompt, want, list(want)) is None
    assert first_difference(plain, prompt, want, want[:-2])["margin"] is None  # stopped early: no token choice
    assert is_near_tie(0.01, 1.0) and is_near_tie(-0.3, 40.0) and not is_near_tie(0.3, 10.0)


def test_bench_in_process_speculative_with_trees_from_the_command_line(built, engines_dir, tmp_path):
    """``--tree-nodes``: prompt lookup drafts trees (runtime.speculative.tree), the outputs still plain greedy's, the
    file named by it; with another method it is refused before anything loads."""
    built(NAME)
    out = tmp_path / "tree.json"
    proc = run_cli("bench", "--in-process", "-c", str(CONFIGS / f"{NAME}.yaml"), "--engines-dir", str(engines_dir),
                   "--speculative", "ngram", "--tree-nodes", "8", "--prompts", "2", "--workload", "grounded",
                   "--output-tokens", "8", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["settings"]["tree_nodes"] == 8 and "trees of up to 8 nodes" in data["runtime"]["speculative"]
    assert [r["identical"] for r in data["runs"]] == [True]
    # by default a request ends at the end id, as served: at most --output-tokens each, each prompt's counted
    run = data["runs"][0]
    assert not data["settings"]["ignore_eos"] and all(p["output_tokens"] <= 8 for p in run["per_prompt"])
    assert sum(p["output_tokens"] for p in run["per_prompt"]) == run["output_tokens"]
    proc = run_cli("bench", "--in-process", "-c", "x.yaml", "--speculative", "draft", "--tree-nodes", "8")
    assert proc.returncode == 2 and "--tree-nodes goes with --speculative ngram" in proc.stderr
    proc = run_cli("bench", "--in-process", "-c", "x.yaml", "--ignore-eos")
    assert proc.returncode == 2 and "--ignore-eos goes with --speculative" in proc.stderr


def test_the_offline_study_replays_what_the_runtime_drafts_keeps_and_steps(built, engines_dir, monkeypatch):
    """benchmarks/spec_simulate.replay, which issue 35's study runs over cached greedy outputs, drafts, keeps,
    verifies and steps as the runtime does: SmolLM2 (a trained model, whose lookups both hit and miss; the tiny
    model's text never repeats) on the first grounded prompt, 48 tokens alone, under the default settings and under
    a fixed k of 8 with 1-token lookups; ``Runtime.stats()`` and the steps taken against the replay of the run's
    own output, with the settings read from the runtime's speculator."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from spec_simulate import replay

    from trtllm_pipeline.bench.speculative import SPEC_KEYS, workload_prompts

    monkeypatch.delenv("TRTLLM_PIPELINE_SPEC_QUIET", raising=False)
    name = "smollm2-135m-instruct-bf16-tp1"
    built(name)
    rt = load_runtime(load(name).with_runtime(speculative={"method": "ngram"}), engines_dir)
    try:
        prompt = workload_prompts(rt.tokenizer, "grounded", 1, seed=0)[0]
        for settings in (None, SpeculativeSection(method="ngram", num_draft_tokens=8, ngram_min=1, adaptive=False)):
            if settings is not None:
                rt.speculator = rt._speculator(settings)  # (as the runtime builds it from its config)
            sp = rt.speculator
            before, steps = rt.stats(), rt.phase_times()["steps"]
            out = rt.generate([prompt], SamplingParams(max_tokens=48, end_id=-1))[0].token_ids
            ran = {k: rt.stats()[k] - before[k] for k in SPEC_KEYS}
            replayed = replay(prompt, out, k=sp.k, ngram_min=sp.proposer.min_n, ngram_max=sp.proposer.max_n,
                              adaptive=sp.adaptive, quiet=sp.quiet_backoff)
            assert [ran[k] for k in SPEC_KEYS] == [replayed[k] for k in ("drafted", "accepted", "verify_rows")]
            assert rt.phase_times()["steps"] - steps == replayed["steps"]  # the prefill's step included
            assert 0 < ran["spec_decode_accepted_tokens"] < ran["spec_decode_draft_tokens"]  # kept some, not all
    finally:
        rt.close()


def test_lookups_that_find_nothing_are_made_less_often_and_said_so_a_step_ahead(monkeypatch):
    """``Speculator.found_nothing``: from the second empty lookup in a row the request looks again after 1, 2, 4, then
    at most 8 decode steps; ``drafts_next`` never says "no" for a step that then drafts (a decode step is chained on
    the one before only where it says no for every row: tests/test_fast_step_routing.py), and a found draft resets
    the count. ``TRTLLM_PIPELINE_SPEC_QUIET=0``: a lookup every step."""
    from trtllm_pipeline.runtimes.torch_engine.speculative.speculator import Speculator

    def lookups(sp, steps=40, found_at=()):
        made = []
        for step in range(steps):
            ahead = sp.drafts_next("r")
            k = sp.budget("r")
            assert ahead or k == 0, step
            if k:
                made.append(step)
                if step in found_at:
                    sp.verified("r", k, k)  # drafted and kept
                else:
                    sp.found_nothing("r")
        return made

    assert lookups(Speculator(None, 4)) == [0, 1, 3, 6, 11, 20, 29, 38]
    assert lookups(Speculator(None, 4), found_at={6}) == [0, 1, 3, 6, 7, 8, 10, 13, 18, 27, 36]
    monkeypatch.setenv("TRTLLM_PIPELINE_SPEC_QUIET", "0")
    assert lookups(Speculator(None, 4), steps=10) == list(range(10))


def test_a_row_told_not_to_adapt_is_counted_and_a_wide_partial_row_goes_back_to_k():
    """``Speculator.verified``: ``adapt=False`` (device drafting's filler row) counts the row and leaves the length;
    ``wide=True`` (device drafting at batch 1) sets it back to k after a partial row, where it is otherwise kept + 1;
    a row that keeps nothing halves it either way."""
    from trtllm_pipeline.runtimes.torch_engine.speculative.speculator import Speculator

    sp = Speculator(None, 8)
    assert sp.budget("r") == 8
    sp.verified("r", 8, 0, adapt=False)
    assert sp.budget("r") == 8 and (sp.verify_rows, sp.draft_tokens, sp.accepted_tokens) == (1, 8, 0)
    sp.verified("r", 8, 2)
    assert sp.budget("r") == 3
    sp.verified("r", 3, 1, wide=True)
    assert sp.budget("r") == 8
    sp.verified("r", 8, 0, wide=True)
    assert sp.budget("r") == 4
