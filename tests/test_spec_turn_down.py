"""A draft model that the target never agrees with turns itself down, as prompt lookup does (``Speculator``), and stays
down across requests (``Proposer.learns_across_requests``): its probes, each an eager forward of the draft, fall to
about one per ``max_backoff`` decode steps, so its steps approach plain decoding's, and the outputs stay plain greedy's.

On the CPU with the tiny model: self-speculation with the target's first layer drafting, verified by a fast path whose
"model" predicts each token + 1 (``test_fast_step_routing._PlusOne``: a draft is never kept, and the steps chain as
on CUDA), and the same through the real model's eager verify steps. Counts, not timings: drafted tokens, verify rows,
the draft's forwards and the steps chained (a step chains only where no request drafts next)."""

from __future__ import annotations

import pytest
from test_fast_step_routing import _PlusOne

from trtllm_pipeline.config import SpeculativeSection
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import DecodeGraphs
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime
from trtllm_pipeline.runtimes.torch_engine.speculative.draft import DraftProposer
from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import NgramProposer
from trtllm_pipeline.runtimes.torch_engine.speculative.speculator import MAX_BACKOFF, Speculator

NAME = "tiny-qwen2-bf16-tp1"
SELF_1_LAYER = {"method": "self", "draft_layers": 1}  # the tiny model's first of 4 layers: it keeps ~6% of drafts
COUNTS = ("spec_decode_draft_tokens", "spec_decode_verify_rows")


@pytest.fixture(scope="module")
def ckpt(built):
    return built(NAME).engine_dir.parent / "checkpoint"


def _probes(sp: Speculator, requests: int, steps: int) -> list[list[int]]:
    """Per request, one after another, the decode steps at which it drafted, every draft missing."""
    out = []
    for rid in range(requests):
        drafted = []
        for step in range(steps):
            ahead = sp.drafts_next(rid)
            k = sp.budget(rid)
            assert ahead or k == 0, (rid, step)  # never "no drafts next" for a step that then drafts
            if k:
                drafted.append(step)
                sp.verified(rid, k, 0)
        sp.release(rid)
        out.append(drafted)
    return out


def test_a_missing_draft_model_waits_longer_and_a_new_request_goes_on_from_the_last(ckpt):
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", max_batch_size=4, max_seq_len=256, dtype="float32",
                      speculative=SpeculativeSection(**SELF_1_LAYER))
    assert isinstance(rt.speculator.proposer, DraftProposer)
    model = _probes(Speculator(rt.speculator.proposer, 4), requests=40, steps=64)
    rt.close()
    lookup = _probes(Speculator(NgramProposer(), 4), requests=40, steps=64)
    # prompt lookup: every request relearns from k (its text is its own): 4, 2, 1 drafts, then a probe after 4, 8, ...
    # 32 steps: 7 verify rows in every request of 64 steps
    assert lookup == [[0, 1, 2, 6, 14, 30, 62]] * 40
    # a model: the first request the same; the next ones go on waiting where the last stopped, the waits doubling up
    # to 512 steps (not MAX_BACKOFF's 64): 14 verify rows in 40 requests, against prompt lookup's 280
    assert model[0] == lookup[0] and sum(map(len, model)) == 14
    flat = [64 * i + s for i, steps in enumerate(model) for s in steps]
    assert [b - a for a, b in zip(flat, flat[1:])] == [1, 1, 4, 8, 16, 32, 64, 128, 256, 512, 512, 512, 512]
    assert DraftProposer.max_backoff == 512 > MAX_BACKOFF


@pytest.fixture
def plus_one(ckpt):
    """Self-speculation (its first layer) verified by a fast path that predicts token + 1: no draft is ever kept."""
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", device="cpu", max_batch_size=4, max_seq_len=512, fast_decode=False,
                      dtype="float32", speculative=SpeculativeSection(**SELF_1_LAYER))
    decoder = DecodeGraphs(_PlusOne(rt.engine, rt.vocab_size), [1, 2, 4, 8], use_graphs=False)
    decoder.prepare()
    rt.attach_decoder(decoder)
    yield rt
    rt.close()


def _counted_forwards(rt) -> list[int]:
    """The draft model's forwards, counted as they run (a list of one count)."""
    proposer, count = rt.speculator.proposer, [0]
    forward = proposer._next

    def counted(rows):
        count[0] += 1
        return forward(rows)

    proposer._next = counted
    return count


def _round(rt, prompts, n):
    """``prompts`` one after another, ``n`` tokens each: outputs, and what the round added to the counters."""
    before = {**rt.stats(), **rt.phase_times()}
    out = [rt.generate([p], SamplingParams(max_tokens=n, end_id=-1))[0].token_ids for p in prompts]
    after = {**rt.stats(), **rt.phase_times()}
    return out, {k: after.get(k, 0) - before.get(k, 0) for k in (*COUNTS, "chained_steps", "steps")}


def test_a_useless_draft_turns_itself_down_toward_plain_steps(plus_one):
    rt = plus_one
    forwards = _counted_forwards(rt)
    prompts = [[100 + 7 * i + j for j in range(6)] for i in range(4)]  # (short: prefilled on the fast path)
    rt.speculator.enabled = False
    plain, plain_counts = _round(rt, prompts, 48)
    rt.speculator.enabled = True
    rounds = []
    for _ in range(4):
        forwards[0] = 0
        out, counts = _round(rt, prompts, 48)
        assert out == plain  # the target's tokens, whatever was drafted
        rounds.append({**counts, "forwards": forwards[0]})
    assert plain_counts["spec_decode_draft_tokens"] == 0
    first, *later = rounds
    assert first["spec_decode_draft_tokens"] > 0 == rt.stats()["spec_decode_accepted_tokens"]
    # the first request learns (drafts 4, 2, 1, then probes), the later ones go on from it: drafts, verify rows and
    # the draft's forwards fall to at most one probe a round of 188 decode steps ...
    for r in later:
        assert r["spec_decode_draft_tokens"] == r["spec_decode_verify_rows"] == r["forwards"] <= 1, rounds
    assert first["forwards"] >= 10 and first["spec_decode_verify_rows"] >= 8, first
    # ... and nearly every step chains as plain decoding's do (a probe unchains the step before it and its own)
    assert first["chained_steps"] < plain_counts["chained_steps"] - 10
    for r in later:
        assert r["steps"] == plain_counts["steps"]
        assert r["chained_steps"] >= plain_counts["chained_steps"] - 2 * r["forwards"], (r, plain_counts)


def test_turned_down_self_speculation_keeps_plain_greedy_on_the_real_model(ckpt):
    """Eager verify steps of the real model (it keeps ~6% of its first layer's drafts): every round's outputs are plain
    greedy's, token for token, while the rounds after the first draft far less."""
    from test_speculative import PROMPTS

    args = dict(max_batch_size=4, max_seq_len=256, dtype="float32", kv_block_size=4)
    plain = TorchRuntime(ckpt, ckpt / "tokenizer", **args)
    want = _round(plain, PROMPTS, 32)[0]
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", speculative=SpeculativeSection(**SELF_1_LAYER), **args)
    rounds = []
    for _ in range(3):
        out, counts = _round(rt, PROMPTS, 32)
        assert out == want
        rounds.append(counts["spec_decode_draft_tokens"])
        rt.kv.check()
    assert rounds[0] > 0 and max(rounds[1:]) * 4 <= rounds[0], rounds
    rt.close()
