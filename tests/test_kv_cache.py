"""The KV cache manager's allocator under random workloads (property-based), and its prefix cache."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trtllm_pipeline.runtimes.torch_engine.kv_cache import KVCacheManager

# A workload: prompts from a few shared stems (so that prefixes repeat), then admit / grow / commit / free in any
# order. Each op: (kind, request index, stem, length).
OPS = st.lists(st.tuples(st.sampled_from(["admit", "grow", "free", "preempt"]), st.integers(0, 7),
                         st.integers(0, 2), st.integers(1, 40)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, blocks=st.integers(2, 24), block_size=st.sampled_from([1, 2, 4, 8]), reuse=st.booleans())
def test_random_workloads_keep_the_allocator_consistent(ops, blocks, block_size, reuse):
    kv = KVCacheManager(blocks, block_size, enable_prefix_cache=reuse, watermark=0)
    stems = [[s * 1000 + i for i in range(64)] for s in range(3)]
    live: dict[int, list[int]] = {}  # request -> its tokens written so far
    for kind, rid, stem, length in ops:
        if kind == "admit" and rid not in live:
            tokens = stems[stem][:length]
            before = kv.free_blocks
            done = kv.admit(rid, tokens, len(tokens) + 1)
            if done is None:
                assert kv.free_blocks == before and rid not in kv.tables
            else:
                assert done % block_size == 0 and done < len(tokens)
                assert kv.tables[rid][: done // block_size] == kv.cached_prefix(tokens)[: done // block_size]
                live[rid] = tokens
                kv.commit(rid, tokens)
        elif kind == "grow" and rid in live:
            tokens = live[rid] + [7] * length
            if kv.grow(rid, len(tokens) + 1):
                live[rid] = tokens
                kv.commit(rid, tokens)
        elif kind in ("free", "preempt") and rid in live:
            (kv.free if kind == "free" else kv.preempted)(rid)
            del live[rid]
        kv.check()
        for rid, tokens in live.items():  # every live request holds blocks for all its positions
            assert len(kv.tables[rid]) >= kv.blocks_for(len(tokens))
    for rid in list(live):
        kv.free(rid)
    kv.check()
    assert kv.free_blocks == blocks - 1 and not kv.pending  # nothing leaked
    assert kv.stats()["kv_cache_usage"] == 0


def test_a_cached_prefix_is_shared_then_evicted_least_recently_used_first():
    kv = KVCacheManager(7, 4, enable_prefix_cache=True, watermark=0)
    a = list(range(10))  # blocks [0..3], [4..7] full; 8, 9 in a third
    assert kv.admit("a", a, 11) == 0
    kv.commit("a", a)
    assert kv.admit("b", a[:8] + [99, 98], 11) == 8  # two full blocks reused
    assert kv.tables["b"][:2] == kv.tables["a"][:2] and kv.ref[kv.tables["a"][0]] == 2
    assert kv.stats()["prefix_cache_hits"] == 8 and kv.stats()["prefix_cache_queries"] == 20
    kv.check()
    shared = kv.tables["a"][:2]
    kv.free("a")
    kv.free("b")
    kv.check()
    assert kv.free_blocks == 6 and set(shared) <= set(kv._evictable)
    # a request that needs every block evicts the cached ones (the prefix's deepest block went in first)
    assert kv.admit("c", list(range(500, 523)), 24) == 0
    assert not kv.cached and kv.free_blocks == 0
    kv.check()


def test_prompt_of_whole_blocks_still_runs_its_last_token():
    kv = KVCacheManager(9, 4, enable_prefix_cache=True, watermark=0)
    p = list(range(8))
    kv.admit("a", p, 9)
    kv.commit("a", p)
    assert kv.admit("b", p, 9) == 4  # not 8: the last token must run to give the first output's logits


def test_admission_leaves_the_watermark_and_refuses_without_change():
    kv = KVCacheManager(101, 1, watermark=0.05)
    assert kv.admit("a", [1] * 90, 96) is None  # 96 + 5 reserved > 100
    assert kv.free_blocks == 100 and not kv.tables
    assert kv.admit("a", [1] * 90, 95) == 0
    assert not kv.grow("a", 101) and len(kv.tables["a"]) == 95
    assert kv.grow("a", 100)
