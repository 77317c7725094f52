"""Which rows of a step the torch runtime gives its fast path, and which of their logits it reads back (``_split``,
``_run_fast``, ``_settle``), on the CPU without Triton's interpreter: the runtime's ``DecodeGraphs`` over a decode step
that runs no model and "predicts" each position's token + 1. A request's first token then tells which position's
prediction was read (its prompt's last, wherever the prompt ran), and every later one that it fed its own token back.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from continuous_batching import staggered
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine import runtime as runtime_module
from trtllm_pipeline.runtimes.torch_engine.cuda import greedy
from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import DecodeGraphs
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime


@dataclasses.dataclass
class _Buffers:  # what the host side of DecodeGraphs reads and writes of decode_step.StepBuffers
    batch: int
    inputs: torch.Tensor
    logits: torch.Tensor
    greedy: torch.Tensor
    attention_passes: int = 1


class _PlusOne:
    """A decode step whose prediction at each row is the row's token + 1; rows and passes counted."""

    def __init__(self, engine, vocab: int):
        self.engine, self.vocab, self.rows = engine, vocab, []

    def buffers(self, batch: int, tables):  # inputs: token, position, table row, ban (``StepBuffers.inputs``)
        return _Buffers(batch, torch.zeros((4, batch), dtype=torch.long), torch.zeros((batch, self.vocab)),
                        torch.zeros(batch, dtype=torch.long))

    def run(self, buf) -> None:
        buf.logits.zero_()
        buf.logits[torch.arange(buf.batch), torch.remainder(buf.inputs[0] + 1, self.vocab)] = 1.0
        greedy.argmax_torch(buf.logits, buf.greedy, buf.inputs[3])  # the step's argmax skips each row's ban
        self.rows.append(buf.batch)

    def weight_bytes(self) -> int:
        return 0


def _plus_one_runtime(built, buckets=(1, 2, 4, 8), max_seq_len=256, **kwargs) -> TorchRuntime:
    """The tiny model's runtime (4 requests, eager prefill) whose fast decode step is ``_PlusOne`` in ``buckets``."""
    ckpt = built("tiny-qwen2-bf16-tp1").engine_dir.parent / "checkpoint"
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", device="cpu", max_batch_size=4, max_seq_len=max_seq_len,
                      fast_decode=False, **kwargs)
    decoder = DecodeGraphs(_PlusOne(rt.engine, rt.vocab_size), list(buckets), use_graphs=False)
    decoder.prepare()
    rt.attach_decoder(decoder)
    return rt


def _lookup(k=4):
    from trtllm_pipeline.config import SpeculativeSection

    return SpeculativeSection(method="ngram", num_draft_tokens=k, ngram_min=1, ngram_max=2)


@pytest.fixture
def runtime(built):
    rt = _plus_one_runtime(built)
    yield rt
    rt.close()


def test_short_prompts_prefill_as_rows_of_fast_steps_beside_the_decodes(runtime):
    # 3 + 5 fit the largest bucket (8) beside one decode; 9 tokens never fit: eager; 2 joins three decodes
    prompts = [list(range(10, 13)), list(range(20, 25)), list(range(30, 39)), list(range(40, 42))]
    out = staggered(runtime, prompts, SamplingParams(max_tokens=5, end_id=-1))
    for i, prompt in enumerate(prompts):
        if len(prompt) <= 8:  # read at the prompt's last position of the fast step, then its own tokens fed back
            assert out[i] == [prompt[-1] + 1 + j for j in range(5)], i
        else:  # the eager model's first token (the tiny random model's), then the fast path's +1 from it
            assert out[i][1:] == [out[i][0] + 1 + j for j in range(4)], i
    assert runtime.phase_rows["fast_prefill_rows"] == 3
    assert runtime.phase_rows["eager_rows"] == 1  # the 9-token prompt
    assert max(runtime.decoder.step.rows) == 8  # a prefill's rows and the decodes in one bucket


def test_fast_prefill_can_be_turned_off(runtime, monkeypatch):
    monkeypatch.setenv("TRTLLM_PIPELINE_FAST_PREFILL", "0")
    assert not runtime_module.fast_prefill_enabled()
    prompts = [list(range(10, 13)), list(range(20, 25))]
    out = staggered(runtime, prompts, SamplingParams(max_tokens=3, end_id=-1))
    assert runtime.phase_rows["fast_prefill_rows"] == 0 and runtime.phase_rows["eager_rows"] == 2
    assert all(t[1:] == [t[0] + 1, t[0] + 2] for t in out)


def _wave(rt, prompts, params) -> list[list[int]]:
    """Every prompt submitted at once (a closed-loop benchmark's wave), then steps until all are done."""
    for i, prompt in enumerate(prompts):
        rt.submit(i, prompt, params)
    out: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    while rt.has_work():
        for event in rt.step():
            out[event.request_id] += event.token_ids
    return [out[i] for i in range(len(prompts))]


@pytest.mark.parametrize("wait", ["0", "1"])
def test_a_wave_of_short_prompts_waits_for_room_on_the_fast_path_unless_told_not_to(runtime, monkeypatch, wait):
    # four 3-token prompts at once: two fit the largest bucket (8) a step. Waiting, the others take the next steps'
    # room (all on the fast path: each first token is its prompt's last + 1); else they prefill eagerly at once
    monkeypatch.setenv("TRTLLM_PIPELINE_PREFILL_WAIT", wait)
    prompts = [list(range(10 * i, 10 * i + 3)) for i in range(1, 5)]
    out = _wave(runtime, prompts, SamplingParams(max_tokens=4, end_id=-1))
    n = runtime.phase_rows
    if wait == "1":
        assert out == [[p[-1] + 1 + j for j in range(4)] for p in prompts]
        assert n["fast_prefill_rows"] == 4 and n["eager_rows"] == 0
    else:
        assert n["fast_prefill_rows"] == 2 and n["eager_rows"] == 2
        assert all(t[1:] == [t[0] + 1 + j for j in range(3)] for t in out)
    assert runtime.kv.stats()["kv_cache_usage"] == 0  # every block back


def test_fast_prefill_buckets_follow_the_engines_row_limit_and_the_environment(monkeypatch):
    monkeypatch.delenv("TRTLLM_PIPELINE_FAST_PREFILL_ROWS", raising=False)
    assert runtime_module.fast_prefill_buckets(1024) == (128, 256, 512, 1024)  # BF16 / FP8 on one GPU
    assert runtime_module.fast_prefill_buckets(256) == (128, 256)  # the 4- and 8-bit formats' one-tile kernels
    monkeypatch.setenv("TRTLLM_PIPELINE_FAST_PREFILL_ROWS", "256")  # the A/B: the buckets before waves fitted
    assert runtime_module.fast_prefill_buckets(1024) == (128, 256)
    monkeypatch.setenv("TRTLLM_PIPELINE_FAST_PREFILL_ROWS", "lots")
    with pytest.raises(runtime_module.InputError, match="FAST_PREFILL_ROWS"):
        runtime_module.fast_prefill_buckets(1024)


def test_a_decode_step_samples_every_row_without_gathering_its_logits(runtime, monkeypatch):
    """All rows sampled in order: the step's logits go to the sampler as they are, the decode buffer itself (no
    indexed copy of [rows, vocab] float32 logits each step)."""
    own = []
    real = runtime_module.TorchRuntime._sample

    def spy(self, reqs, logits, greedy=None):
        own.append(logits.data_ptr() in {b.logits.data_ptr() for b in self.decoder.buffers.values()})
        return real(self, reqs, logits, greedy)

    monkeypatch.setattr(runtime_module.TorchRuntime, "_sample", spy)
    runtime.chaining = False  # (chained steps read only the argmax: ``test_chained_...``)
    staggered(runtime, [list(range(10, 13)), list(range(20, 22))], SamplingParams(max_tokens=4, end_id=-1))
    assert own.count(True) >= 3 and False in own  # decode steps: the buffer; a prefill's last position: a copy


def test_decode_steps_left_running_give_their_tokens_at_the_next_step(runtime):
    """Overlap (``_may_leave_running``): a decode step is launched and its tokens come back from the next ``step()``,
    so the caller handles one step's events while the next one runs; the tokens are those of the synchronous
    path."""
    prompts = [list(range(10, 13)), list(range(20, 25)), list(range(30, 39))]
    params = SamplingParams(max_tokens=6, end_id=-1)
    assert runtime.overlap
    overlapped = staggered(runtime, prompts, params)
    runtime.overlap = False
    synchronous = staggered(runtime, prompts, params)
    assert overlapped == synchronous and all(len(t) == 6 for t in overlapped)
    runtime.overlap = True
    runtime.submit("a", list(range(50, 53)), params)
    assert runtime.step() == [] and runtime._launched is not None  # its prompt as rows of a fast step, left running
    assert [e.token_ids for e in runtime.step()] == [[53]]  # ... read as its first decode step is launched
    assert [e.token_ids for e in runtime.step()] == [[54]]  # ... and that one's as the next is


def test_a_request_cancelled_while_its_decode_step_runs_is_skipped(runtime):
    params = SamplingParams(max_tokens=8, end_id=-1)
    runtime.submit("a", list(range(10, 13)), params)
    runtime.submit("b", list(range(20, 23)), params)
    while runtime._launched is None:
        runtime.step()
    runtime.cancel("a")
    events = runtime.step()
    assert [e.request_id for e in events] == ["b"] and not any(e.finish_reason == "error" for e in events)
    rest = []
    while runtime.has_work():
        rest += runtime.step()
    assert {e.request_id for e in rest} == {"b"} and rest[-1].finish_reason == "length"
    assert runtime.kv.free_blocks == runtime.kv.usable_blocks and not runtime.kv.tables  # every block back


def _run(rt, submits, steps_between=0):
    """Requests (id, prompt, params) submitted after ``steps_between`` steps each; every request's tokens and how it
    ended."""
    tokens, ends = {}, {}
    for rid, prompt, params in submits:
        rt.submit(rid, prompt, params)
        tokens[rid] = []
        for _ in range(steps_between):
            for e in rt.step():
                tokens[e.request_id] += e.token_ids
                ends[e.request_id] = e.finish_reason or ends.get(e.request_id)
    while rt.has_work():
        for e in rt.step():
            tokens[e.request_id] += e.token_ids
            ends[e.request_id] = e.finish_reason or ends.get(e.request_id)
    return tokens, ends


def test_chained_decode_steps_give_the_synchronous_tokens_and_ends(runtime):
    """Chained steps (``_chain``: the next decode step launched on the running one's argmax, taken on the device)
    emit exactly the synchronous path's tokens, and end each request where it would: by length (its last row held
    back), on its end id (its row in the step chained after it dropped), mixed lengths in one batch."""
    submits = [("a", list(range(10, 13)), SamplingParams(max_tokens=9, end_id=-1)),
               ("b", list(range(20, 25)), SamplingParams(max_tokens=3, end_id=-1)),
               ("c", list(range(30, 33)), SamplingParams(max_tokens=20, end_id=37)),  # 33, 34, .. ends on 37
               ("d", list(range(40, 42)), SamplingParams(max_tokens=12, end_id=-1)),
               # prefilled eagerly (past the largest bucket) beside a decode step left running (its forward launched
               # before that step's tokens are read): its first decode row then joins a chained step with a token of
               # its own
               ("e", list(range(60, 70)), SamplingParams(max_tokens=6, end_id=-1))]
    assert runtime.chaining
    mixed = []
    chain_tokens, verify, verified = runtime.decoder._chain_tokens, runtime.decoder.verify, []
    runtime.decoder._chain_tokens = lambda tokens, sources, m: (mixed.append(m), chain_tokens(tokens, sources, m))

    def spy(*args, sources=None):
        verified.append(sources is not None)
        return verify(*args, sources=sources)

    runtime.decoder.verify = spy
    early, launch_early = [], runtime._launch_eager_early
    runtime._launch_eager_early = lambda rows: (launched := launch_early(rows), early.append(launched is not None))[0]
    chained = _run(runtime, submits, steps_between=1)
    assert runtime.phase_rows["chained_steps"] >= 6 and True in mixed
    assert True in verified  # a prompt's rows in a step chained on the running decodes' argmax
    assert True in early  # e's prefill launched before the running step's tokens were read, sampled after
    runtime.chaining = runtime.overlap = False
    synchronous = _run(runtime, submits, steps_between=1)
    assert chained == synchronous
    tokens, ends = chained
    assert tokens["a"] == list(range(13, 22)) and ends["a"] == "length"
    assert tokens["b"] == [25, 26, 27] and ends["b"] == "length"
    assert tokens["c"] == [33, 34, 35, 36] and ends["c"] == "end_id"
    assert tokens["d"] == list(range(42, 54)) and ends["d"] == "length"
    assert tokens["e"][1:] == [tokens["e"][0] + 1 + j for j in range(5)]  # the eager model's first token, then + 1
    assert runtime.kv.free_blocks == runtime.kv.usable_blocks and not runtime.kv.tables


def test_chained_steps_skip_the_end_id_before_min_tokens_and_wait_for_bad_words_and_sampling(runtime):
    """A decode step's own argmax skips each row's end id before min_tokens (``DecodeGraphs.decode``'s ``bans``), so
    such rows chain on, with the synchronous tokens. A row whose token is not the argmax as it stands (a bad word
    banned, or sampled) cannot feed the argmax on: those steps settle first, and the tokens are the synchronous
    ones."""
    greedy_params = SamplingParams(max_tokens=8, end_id=-1)
    banned = SamplingParams(max_tokens=8, min_tokens=6, end_id=15)  # 13, 14, (15 banned: the argmax of the rest, 0)
    submits = [("g", list(range(20, 23)), greedy_params), ("m", list(range(10, 13)), banned)]
    tokens, ends = _run(runtime, submits)
    assert tokens["g"] == list(range(23, 31)) and tokens["m"] == [13, 14, 0, 1, 2, 3, 4, 5]
    assert ends["m"] == "length"
    assert runtime.phase_rows["chained_steps"] >= 6  # every decode step after the first, min_tokens or not
    runtime.chaining = runtime.overlap = False
    assert _run(runtime, submits) == (tokens, ends)
    runtime.chaining = runtime.overlap = True
    before = runtime.phase_rows["chained_steps"]
    # sampled (logits 100 at t + 1 against 0: still t + 1)
    sampled = SamplingParams(max_tokens=6, temperature=0.01, end_id=-1, seed=1)
    tokens, _ = _run(runtime, [("s", list(range(30, 33)), sampled), ("g2", list(range(40, 43)), greedy_params)])
    assert tokens["s"] == list(range(33, 39)) and tokens["g2"] == list(range(43, 51))
    assert runtime.phase_rows["chained_steps"] - before <= 2  # only the steps after "s" ended


def test_a_request_cancelled_while_chained_steps_run_is_dropped_from_the_chain(runtime):
    params = SamplingParams(max_tokens=10, end_id=-1)
    runtime.submit("a", list(range(10, 13)), params)
    runtime.submit("b", list(range(20, 23)), params)
    out = {"a": [], "b": []}
    while runtime.phase_rows["chained_steps"] < 2:
        for e in runtime.step():
            out[e.request_id] += e.token_ids
    runtime.cancel("a")
    while runtime.has_work():
        for e in runtime.step():
            out[e.request_id] += e.token_ids
    assert out["b"] == list(range(23, 33)) and out["a"] == list(range(13, 13 + len(out["a"])))
    assert runtime.kv.free_blocks == runtime.kv.usable_blocks and not runtime.kv.tables


def test_chained_steps_under_preemption_finish_every_request_and_return_every_block(built):
    """A pool too small for the batch: the scheduler preempts while steps are chained (a request preempted with its
    token pending gets it when the running step is read, and is recomputed later). Every request still ends by length
    with all its tokens, none fails, and every block comes back."""
    rt = _plus_one_runtime(built, max_seq_len=64, kv_block_size=4, kv_cache_blocks=14, enable_kv_cache_reuse=True)
    try:
        params = SamplingParams(max_tokens=18, end_id=-1)
        tokens, ends = _run(rt, [(i, list(range(10 * i + 10, 10 * i + 14)), params) for i in range(4)],
                            steps_between=1)
        assert rt.kv.stats()["preemptions"] > 0 and rt.phase_rows["chained_steps"] > 0
        assert all(len(t) == 18 for t in tokens.values()) and set(ends.values()) == {"length"}
        assert rt.kv.free_blocks == rt.kv.usable_blocks and not rt.kv.tables
    finally:
        rt.close()


def test_speculation_that_turns_itself_down_lets_decode_steps_chain(built):
    """Prompt lookup on prompts whose n-grams never predict the "+1" step's tokens: every draft misses, the adaptive
    speculator turns each request down (``Speculator.drafts_next`` false during its backoff), and the decode steps
    in between chain, as without speculation; its probes still run (verify steps), and the tokens are plain
    decoding's."""
    rt = _plus_one_runtime(built, (1, 2, 4, 8, 16), speculative=_lookup())
    try:
        # each prompt repeats a pair, so "after 3 comes 4" is looked up while the step says 3 -> 4, 4 -> 5, ...: the
        # lookup for 4 finds 3 ("4 3"), a miss every time
        prompts = [[3, 4, 3, 4, 3], [13, 14, 13, 14, 13]]
        params = SamplingParams(max_tokens=40, end_id=-1)
        tokens, ends = _run(rt, [(i, p, params) for i, p in enumerate(prompts)])
        assert tokens == {0: list(range(4, 44)), 1: list(range(14, 54))} and set(ends.values()) == {"length"}
        stats = rt.speculator.stats() if hasattr(rt.speculator, "stats") else {}
        assert rt.speculator.verify_rows > 0 and rt.speculator.accepted_tokens == 0, stats
        assert rt.phase_rows["chained_steps"] >= 20
    finally:
        rt.close()


@pytest.mark.parametrize("device", ["1", "0"])
def test_prompt_lookup_drafted_on_the_device_chains_verify_steps(built, monkeypatch, device):
    """Prompt lookup drafted on the device (``cuda/drafted``, here its torch reference under a stand-in step: the
    token + 1 at every row) on prompts whose earlier text the step then repeats: drafts kept in runs and rejected
    where the copy departs from + 1, verify steps launched on the running step before its tokens are read (their
    token, drafts and positions made on the device), the step's tokens exactly, a request ending on its end id
    inside a kept run, and every block back. ``TRTLLM_PIPELINE_SPEC_DEVICE=0``: the same tokens, drafted on the
    host, no verify step chained."""
    monkeypatch.setenv("TRTLLM_PIPELINE_SPEC_DEVICE", device)
    rt = _plus_one_runtime(built, (1, 2, 4, 8, 16, 32), speculative=_lookup())
    assert rt.device_drafting == (device == "1")
    chained_verify = []
    decoder = rt.decoder
    verify = decoder.verify

    def counted(*a, **kw):
        chained_verify.append(2 in (kw.get("tracked") or ()))
        return verify(*a, **kw)

    decoder.verify = counted
    try:
        # after 5 the prompt has 6, 7, 8, 9 (the step's + 1: kept) and then 5 again (the step says 10: rejected)
        submits = [("a", [5, 6, 7, 8, 9, 5], SamplingParams(max_tokens=30, end_id=-1)),
                   ("b", [40, 41, 42, 43, 44, 45, 40], SamplingParams(max_tokens=25, end_id=-1)),
                   ("c", [70, 71, 72, 73, 74, 75, 76, 70], SamplingParams(max_tokens=30, end_id=74))]
        tokens, ends = _run(rt, submits)
        assert tokens == {"a": list(range(6, 36)), "b": list(range(41, 66)), "c": [71, 72, 73]}
        assert ends == {"a": "length", "b": "length", "c": "end_id"}
        assert rt.speculator.accepted_tokens > 0 and rt.speculator.accepted_tokens < rt.speculator.draft_tokens
        assert any(chained_verify) == (device == "1")
        rt.kv.check()
        assert rt.kv.free_blocks == rt.kv.usable_blocks and not rt.kv.tables
    finally:
        rt.close()


@pytest.mark.parametrize("rules", ["1", "0"])
def test_device_drafting_s_lag_rules_change_widths_not_tokens(built, monkeypatch, rules):
    """Device drafting's settling (``DeviceDrafting._settle_tracked``, the stand-in step's + 1 as above): a row the
    device filled with the filler (the lookup before it found nothing: the prompt's span copied, the step's counting
    goes past it) is counted but does not turn the width down, and at batch 1 a partial row sets the width back to
    k; with several requests running, kept + 1 as before. ``TRTLLM_PIPELINE_SPEC_LAG_RULES=0``: every row adapts as
    on the host. The tokens are the step's either way."""
    from trtllm_pipeline.runtimes.torch_engine.speculative.speculator import Speculator

    monkeypatch.setenv("TRTLLM_PIPELINE_SPEC_LAG_RULES", rules)
    monkeypatch.setenv("TRTLLM_PIPELINE_SPEC_QUIET", "0")  # a lookup every step: filler rows at every miss
    told = []
    verified = Speculator.verified

    def record(self, request_id, drafted, accepted, depth=None, **kw):
        told.append((request_id, kw.get("adapt", True), kw.get("wide", False)))
        return verified(self, request_id, drafted, accepted, depth, **kw)

    monkeypatch.setattr(Speculator, "verified", record)
    rt = _plus_one_runtime(built, (1, 2, 4, 8, 16, 32), speculative=_lookup())
    try:
        # "a" alone first (batch 1), then "b" beside it: spans of the prompt kept, then lookups of tokens past the
        # prompt's, which find nothing
        submits = [("a", [5, 6, 7, 8, 9, 5], SamplingParams(max_tokens=30, end_id=-1)),
                   ("b", [40, 41, 42, 43, 44, 45, 40], SamplingParams(max_tokens=12, end_id=-1))]
        tokens, _ = _run(rt, submits, steps_between=12)
        assert tokens == {"a": list(range(6, 36)), "b": list(range(41, 53))}
        assert rt.device_drafting and told
        fillers, wide = sum(not adapt for _, adapt, _ in told), sum(w for _, _, w in told)
        if rules == "1":
            assert fillers > 0 and wide > 0, told
            assert not any(w for rid, _, w in told if rid == "b"), told  # "b" never ran alone
        else:
            assert fillers == 0 and wide == 0, told
        rt.kv.check()
    finally:
        rt.close()


def test_tree_rows_go_to_the_fast_verify_step_where_it_takes_them(runtime, monkeypatch):
    """``_split``: a tree verify row to the fast path where its decoder verifies trees (``tree_tokens``) and the row is
    no longer than that; else (too long, a decoder without trees, ``TRTLLM_PIPELINE_FAST_TREES=0``) eagerly."""
    from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import TREE_TOKENS
    from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow

    rows = [PlanRow("t", [1, 2, 3, 4], 10, [1, 2, 3, 4], True, draft=3, parents=[-1, 0, 0, 1]),
            PlanRow("c", [5, 6], 10, [5, 6, 7], True, draft=1)]
    fast, eager = runtime._split(rows)
    assert [r.request_id for r in fast] == ["t", "c"] and not eager and TREE_TOKENS == 65
    monkeypatch.setattr(runtime.decoder, "tree_tokens", 3)  # the tree row past what the step takes
    assert [r.request_id for r in runtime._split(rows)[1]] == ["t"]
    monkeypatch.setattr(runtime.decoder, "tree_tokens", 0)  # a decoder without trees (tensor parallel's)
    assert [r.request_id for r in runtime._split(rows)[1]] == ["t"]
    monkeypatch.undo()
    monkeypatch.setenv("TRTLLM_PIPELINE_FAST_TREES", "0")
    fast, eager = runtime._split(rows)
    assert [r.request_id for r in fast] == ["c"] and [r.request_id for r in eager] == ["t"]


def test_a_tree_steps_inputs_place_each_node_at_its_depth_and_its_ancestors_keys_at_theirs():
    """``graphs.tree_inputs``: per token row its virtual position (start + depth: where it is rotated, and as a
    1-token step at which it attends) and the slot shifts of the positions before it (byte j % 8 of word j // 8: the
    position j back's, an ancestor's row index less its depth; the row's first token and the context in place); a
    linear row's: its positions, nothing shifted, as a chain given as parents."""
    from trtllm_pipeline.runtimes.torch_engine.cuda.attention import TREE_WORDS
    from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import tree_inputs

    def shifts(words, row):  # row's shift of each position back, 1 .. 63
        return {j: (words[j // 8][row] >> (8 * (j % 8))) & 0xFF for j in range(1, 64)
                if (words[j // 8][row] >> (8 * (j % 8))) & 0xFF}

    # row 0: root, then nodes a (parent 0), b (parent 0), c (parent 1 = a), d (parent 2 = b); row 1 linear
    rot, words = tree_inputs([[9, 1, 2, 3, 4], [7, 8]], [20, 5], [[-1, 0, 0, 1, 2], None])
    assert rot == [20, 21, 21, 22, 22, 5, 6] and len(words) == TREE_WORDS
    # c (depth 2, at 22) reads a (depth 1, index 1) in place; d reads b (depth 1, index 2) one slot on
    assert [shifts(words, i) for i in range(7)] == [{}, {}, {}, {}, {1: 1}, {}, {}]
    chain = tree_inputs([[1, 2, 3]], [4], [[-1, 0, 1]])
    assert chain == tree_inputs([[1, 2, 3]], [4], [None]) == ([4, 5, 6], [[0, 0, 0]] * TREE_WORDS)
    # the longest row a step takes: a decoy first, then a path of 63 nodes at indices 2..64 (each one slot on)
    wide = [-1, 0, 0] + list(range(2, 64))
    rot, words = tree_inputs([[0] * 65], [0], [wide])
    assert rot[64] == 63 and shifts(words, 64) == {j: 1 for j in range(1, 63)}  # 63 back: the root, in place
    assert min(min(w) for w in words) >= 0  # (shifts under 128: no word's sign bit set)
    with pytest.raises(ValueError, match="65 at most"):
        tree_inputs([[0] * 66], [0], [list(range(-1, 65))])
