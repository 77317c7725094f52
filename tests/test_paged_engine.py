"""The torch engine under load on CPU: paged attention against the unpaged math, chunked prefill, the prefix cache,
preemption and resume, more requests than blocks, refusal of what can never fit."""

from __future__ import annotations

import pytest
import torch

from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.model import quantize_fp8
from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

NAME = "tiny-qwen2-bf16-tp1"
SYSTEM = list(range(1000, 1040))  # a shared "system prompt": 10 blocks of 4
QUESTIONS = [list(range(2000 + 7 * i, 2000 + 7 * i + 5 + i)) for i in range(6)]


@pytest.fixture(scope="module")
def ckpt(built):
    return built(NAME).engine_dir.parent / "checkpoint"


@pytest.fixture(scope="module")
def plain(ckpt):
    """The references: a pool as large as before paging (4 x 256 tokens), no prefix cache, whole prefills."""
    return _rt(ckpt, prefill_chunk_tokens=2048)


def _rt(ckpt, **kw) -> TorchRuntime:
    args = dict(max_batch_size=4, max_seq_len=256, dtype="float32", kv_block_size=4)
    return TorchRuntime(ckpt, ckpt / "tokenizer", **{**args, **kw})


def _greedy(rt: TorchRuntime, prompts, n: int = 12) -> list[list[int]]:
    return [c.token_ids for c in rt.generate(prompts, SamplingParams(max_tokens=n, end_id=-1))]


def _contiguous_greedy(rt: TorchRuntime, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens from the unpaged math: the whole sequence again for every token, no cache."""
    seq, first = list(prompt), None
    for _ in range(n):
        logits = rt.engine.logits(rt.engine.forward_contiguous(torch.tensor(seq))[-1])
        first = logits if first is None else first
        seq.append(int(logits.argmax()))
    return seq[len(prompt):], first


def _paged_equals_unpaged(rt: TorchRuntime, prompts, n: int = 10) -> list[list[int]]:
    """``rt``'s greedy tokens for ``prompts`` (batched, paged, in its chunks), each equal to the unpaged math's, and
    each prompt's last logits within 1e-5 of it; the tokens."""
    outs = _greedy(rt, prompts, n=n)
    for prompt, out in zip(prompts, outs):
        ref, ref_logits = _contiguous_greedy(rt, prompt, n)
        assert out == ref
        paged = rt.engine.logits(rt.hidden_states(prompt)[-1])
        assert float((paged - ref_logits).norm() / ref_logits.norm()) < 1e-5
    return outs


def test_paged_chunked_prefill_and_decode_match_the_unpaged_math(ckpt, plain):
    # prefill in chunks of 8 over blocks of 4, decodes batched beside other rows' chunks
    rt = _rt(ckpt, prefill_chunk_tokens=8)
    prompts = [SYSTEM + q for q in QUESTIONS[:3]]
    outs = _paged_equals_unpaged(rt, prompts)
    # whole prompts in one step each give the same tokens
    assert _greedy(plain, prompts, n=10) == outs
    assert rt.kv.free_blocks == rt.kv.usable_blocks  # every block back


def test_prefix_cache_hits_evicts_and_changes_no_output(ckpt, plain):
    prompts = [SYSTEM + q for q in QUESTIONS]
    expected = _greedy(plain, prompts)
    # a pool of 40 blocks: the six requests' cached prefixes cannot all stay, so old ones are evicted
    rt = _rt(ckpt, enable_kv_cache_reuse=True, kv_cache_blocks=40, max_batch_size=2)
    first = _greedy(rt, prompts[:1])
    assert rt.stats()["prefix_cache_hits"] == 0 and rt.kv.cached  # full blocks kept, with no reference
    again = [_greedy(rt, [p])[0] for p in prompts]  # one at a time: each finds the system prompt cached
    stats = rt.stats()
    assert first + again[1:] == expected and again[0] == expected[0]
    assert stats["prefix_cache_hits"] >= 6 * len(SYSTEM)  # every later request reused the 10 system blocks
    assert stats["prefix_cache_queries"] > stats["prefix_cache_hits"]
    assert _greedy(rt, prompts) == expected  # side by side, sharing blocks
    rt.kv.check()
    # evictions: a long unrelated prompt needs blocks the cache holds; the LRU ones go, the output is unchanged
    long = list(range(3000, 3120))
    assert _greedy(rt, [long]) == _greedy(plain, [long])
    assert len(rt.kv.cached) < 40 and stats["kv_cache_usage"] >= 0 and rt.stats()["kv_cache_usage"] == 0


def test_the_warm_up_leaves_no_request_count_or_block_behind(ckpt, plain):
    """``warm_up`` (run at load on CUDA) prefills past a chunk and decodes through the eager model, then leaves the
    runtime as it found it: no request, the step counters and prefix-cache counts as before, every block free or
    cached, and the same greedy tokens afterwards."""
    prompts = [SYSTEM + q for q in QUESTIONS[:3]]
    rt = _rt(ckpt, enable_kv_cache_reuse=True, prefill_chunk_tokens=8)
    before = rt.stats()
    phases = rt.phase_times()
    assert rt.warm_up() > 0
    assert rt.stats() == before and rt.phase_times() == phases and not rt.has_work()
    assert rt.kv.free_blocks == rt.kv.usable_blocks and rt.kv.cached  # its prompt's blocks only cached
    rt.kv.check()
    assert _greedy(rt, prompts, n=10) == _greedy(plain, prompts, n=10)


def test_requests_arriving_together_compute_their_shared_prefix_once(ckpt, plain):
    """Four requests with one system prompt submitted at once: the first computes it, the others wait one step
    for its blocks and take all of them from the cache (without the deferral each would compute it side by side)."""
    prompts = [SYSTEM + q for q in QUESTIONS[:4]]
    rt = _rt(ckpt, enable_kv_cache_reuse=True)
    for i, p in enumerate(prompts):
        rt.submit(i, p, SamplingParams(max_tokens=8, end_id=-1))
    rt.step()
    assert rt.stats()["requests_running"] == 1 and rt.scheduler.deferred == 3
    tokens = {i: [] for i in range(4)}
    while rt.has_work():
        for e in rt.step():
            tokens[e.request_id] += e.token_ids
    # the first event of request 0 came in the first step
    assert [tokens[i] for i in range(1, 4)] == _greedy(plain, prompts[1:], n=8)
    assert rt.stats()["prefix_cache_hits"] == 3 * len(SYSTEM)  # every later request hit all 10 system blocks
    assert not rt.kv.pending and rt.kv.free_blocks == rt.kv.usable_blocks


def test_preemption_recomputes_and_finishes_with_the_same_tokens(ckpt, plain):
    prompts = [SYSTEM + q for q in QUESTIONS[:4]]
    alone = _greedy(plain, prompts, n=24)
    # 4 requests of ~45 tokens + 24 generated need ~70 blocks of 4; the pool has 40: decodes run out and the
    # latest admitted request is preempted, then recomputed from its prompt and generated tokens. With reuse the
    # system prompt's 10 blocks are computed once and shared: ~42 blocks in all, so a pool of 28
    for reuse in (False, True):
        rt = _rt(ckpt, kv_cache_blocks=28 if reuse else 40, enable_kv_cache_reuse=reuse)
        assert _greedy(rt, prompts, n=24) == alone
        assert rt.stats()["preemptions"] > 0
        assert rt.kv.free_blocks == rt.kv.usable_blocks and not rt.kv.tables


def test_more_requests_than_rows_and_blocks_all_finish_in_order(ckpt, plain):
    rt = _rt(ckpt, kv_cache_blocks=24, max_batch_size=3, max_num_tokens=16)
    prompts = [QUESTIONS[i % 6] + [i] for i in range(10)]
    for i, p in enumerate(prompts):
        rt.submit(i, p, SamplingParams(max_tokens=6, end_id=-1))
    assert rt.stats()["requests_waiting"] == 10
    order, tokens = [], {i: [] for i in range(10)}
    while rt.has_work():
        stats = rt.stats()
        assert stats["requests_running"] <= 3
        for e in rt.step():
            tokens[e.request_id] += e.token_ids
            if e.finish_reason:
                assert e.finish_reason == "length"
                order.append(e.request_id)
    assert sorted(order) == list(range(10)) and all(len(t) == 6 for t in tokens.values())
    assert [tokens[i] for i in range(10)] == _greedy(plain, prompts, n=6)


def test_a_request_that_can_never_fit_is_refused_with_the_limit(ckpt):
    rt = _rt(ckpt, kv_cache_blocks=10)
    with pytest.raises(InputError, match=r"up to 50 tokens of KV cache; the whole pool holds 40 \(10 blocks of 4\)"):
        rt.submit("big", list(range(100, 130)), SamplingParams(max_tokens=20))
    rt.submit("ok", list(range(100, 130)), SamplingParams(max_tokens=10, end_id=-1))
    assert len(_drain(rt)["ok"]) == 10


def _drain(rt) -> dict:
    out: dict = {}
    while rt.has_work():
        for e in rt.step():
            out.setdefault(e.request_id, []).extend(e.token_ids)
    return out


def test_an_fp8_kv_cache_stores_e4m3_and_every_path_reads_it_alike(built, kv_scaled, ckpt, plain):
    """``quantization.kv_cache: fp8``: the same weights (the tiny BF16 model), keys and values stored as E4M3 at a
    token's quarter of float32's bytes; chunked paged prefill and decode equal the unpaged math, which reads its keys
    and values as the cache would hold them; the cache holds exactly ``x / scale`` in E4M3 (layer 0, whose keys
    nothing quantized before); and the outputs are not those of the unquantized cache."""
    name = "tiny-qwen2-bf16-fp8kv-tp1"
    modelopt = _rt(built(name).engine_dir.parent / "checkpoint")
    assert modelopt.engine.kv_unit_scale and modelopt.engine.kv_scale.tolist() == [1.0] * 4  # clamped to >= 1
    rt = _rt(kv_scaled(name, 0.005), prefill_chunk_tokens=8)  # keys saturate, every value is rounded by the scale
    assert rt.engine.cache_k.dtype == rt.engine.cache_v.dtype == torch.float8_e4m3fn and not rt.engine.kv_unit_scale
    assert rt.describe()["kv_cache_dtype"] == "float8_e4m3fn" and plain.describe()["kv_cache_dtype"] == "float32"
    assert rt.describe()["kv_bytes_per_token"] * 4 == plain.describe()["kv_bytes_per_token"]
    for r in (rt, plain):  # the pool is sized (on CUDA: from the memory free) by what a block really takes
        assert r.kv_block_bytes == r.engine.kv_bytes_per_token() * r.kv.block_size
    prompts = [SYSTEM + q for q in QUESTIONS[:3]]
    _paged_equals_unpaged(rt, prompts)
    unquantized = _rt(ckpt, prefill_chunk_tokens=8)
    prompt = prompts[0]
    logits = [r.engine.logits(r.hidden_states(prompt)[-1]) for r in (rt, unquantized)]
    assert float((logits[0] - logits[1]).norm() / logits[1].norm()) > 1e-3
    # layer 0's keys and values of the prompt's first block, as each pool holds them
    for r in (rt, unquantized):
        r.kv.admit("p", prompt, len(prompt), use_cache=False, watermark=False)
        r._forward([PlanRow("p", prompt, 0, r.kv.tables["p"], False)])
    saturated = 0
    for name in ("cache_k", "cache_v"):
        got = getattr(rt.engine, name)[0, rt.kv.tables["p"][0]]
        want = getattr(unquantized.engine, name)[0, unquantized.kv.tables["p"][0]]
        assert torch.equal(got.view(torch.uint8), quantize_fp8(want, rt.engine.kv_inv[0]).view(torch.uint8))
        saturated += int((got.float().abs() == 448).sum())
    assert saturated > 0


def test_first_chunks_attend_over_a_slice_only_where_their_rows_are_whole_and_adjacent(plain):
    """A group of first chunks whose rows are all as long as its widest and packed next to each other (a prefill
    graph's R x L) attends over a slice of the step's tensors instead of gathered copies, with the same output; rows
    of 5 and 7 around another prompt's 2 span 14 = 2 x 7 tokens but are neither, and keep the gathers."""
    e = plain.engine
    tables = torch.zeros((3, 8), dtype=torch.long)

    def spans(lengths):
        return [g.get("span") for g in e.paged_attention(tables[: len(lengths)], [0] * len(lengths), lengths).groups]

    assert spans([4, 4]) == [(0, 8)] and spans([5, 2, 7]) == [(5, 7), None] and spans([3, 4]) == [None]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(8, e.heads, e.head_dim, generator=gen)
    k, v = (torch.randn(8, e.kv_heads, e.head_dim, generator=gen) for _ in range(2))
    attention = e.paged_attention(tables[:2], [0, 0], [4, 4])
    sliced = attention(0, q, k, v)
    attention.groups[0].pop("span")
    assert torch.equal(attention(0, q, k, v), sliced)


def test_a_first_chunk_through_the_prefill_graph_path_gives_the_eager_tokens(ckpt, plain):
    """``cuda/prefill_graphs`` without CUDA (its forward run directly over the static inputs, padded to the bucket): a
    lone prompt's first chunk padded up to its bucket (the padding after the prompt, its K/V past the prompt's end or
    in the null block) gives the eager forward's tokens; a prompt longer than a chunk takes its first chunk there and
    the rest eagerly, over the first's K/V and rewriting the padding's; a chunk past every bucket, and a step of two
    prompts longer than any two-row shape holds, stay eager. Several prompts a step run from a graph of R rows (R x
    length within the largest bucket), a missing row padded (its K/V in the null block): the eager tokens again; and
    with the scheduler keeping prompts whole beside first chunks, a third prompt waits a step rather than split."""
    from trtllm_pipeline.runtimes.torch_engine.cuda.prefill_graphs import PrefillGraphs, buckets_for, shapes_of

    assert buckets_for(2048) == [256, 512, 768, 1024, 1536, 2048] and buckets_for(1000)[-1] == 1024
    assert shapes_of([256, 512, 1024]) == [(1, 256), (1, 512), (1, 1024), (2, 256), (2, 512), (4, 256)]
    prompts = [list(range(3000, 3005)), list(range(3100, 3113)), list(range(3200, 3240)), list(range(3300, 3324))]
    expected = [_greedy(plain, [p])[0] for p in prompts]
    rt = _rt(ckpt, prefill_chunk_tokens=16)
    rt.prefill_graphs = PrefillGraphs(rt.engine, [8, 16], use_graphs=False)
    rt.prefill_graphs.prepare()
    assert [_greedy(rt, [p])[0] for p in prompts] == expected
    assert rt.stats()["graph_prefills"] == 4  # each prompt's first chunk: 5 -> 8, 13 -> 16, 16 of 40, 16 of 24
    assert _greedy(rt, prompts[:2]) == expected[:2] and rt.stats()["graph_prefills"] == 4  # two rows a step: eager
    rt.kv.check()
    wide = _rt(ckpt, prefill_chunk_tokens=32)
    wide.prefill_graphs = PrefillGraphs(wide.engine, [8, 16], use_graphs=False)
    assert _greedy(wide, [prompts[2]])[0] == expected[2] and wide.stats()["graph_prefills"] == 0  # 32 > 16
    several = _rt(ckpt, prefill_chunk_tokens=32)
    graphs = several.prefill_graphs = PrefillGraphs(several.engine, [8, 16, 32], use_graphs=False)
    graphs.prepare()
    short = [list(range(3400, 3407)), list(range(3500, 3503))]  # with prompts[0]: three prompts, one 4 x 8 graph
    expected += [_greedy(plain, [p])[0] for p in short]
    assert graphs.shape_for([5, 13]) == (2, 16) and graphs.shape_for([5, 7, 3]) == (4, 8)
    assert _greedy(several, prompts[:2]) == expected[:2] and several.stats()["graph_prefills"] == 2
    assert _greedy(several, [prompts[0], *short]) == [expected[0], *expected[4:]]
    assert several.stats()["graph_prefills"] == 5
    # three prompts of 13 in chunks of 32: with whole first chunks (the runtime's setting where prefill graphs are)
    # the third waits a step instead of starting in the 6 tokens left: the first two from one graph (the third's
    # step, here without a fast path, runs eagerly with the others' decodes; on a GPU they take the fast path)
    thirteen = [list(range(3600 + 100 * i, 3613 + 100 * i)) for i in range(3)]
    expected_13 = [_greedy(plain, [p])[0] for p in thirteen]
    several.scheduler.whole_first_chunks = True
    assert _greedy(several, thirteen) == expected_13 and several.stats()["graph_prefills"] == 7
    several.kv.check()
