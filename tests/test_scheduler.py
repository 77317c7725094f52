"""The step plan's prefill chunks: a step's token budgets, and prompts kept whole for a prefill graph."""

from __future__ import annotations

from trtllm_pipeline.runtimes.torch_engine.kv_cache import KVCacheManager
from trtllm_pipeline.runtimes.torch_engine.scheduler import Scheduler, Sequence


def _scheduler(chunk: int, whole: bool) -> Scheduler:
    sched = Scheduler(KVCacheManager(64, 4), max_running=8, max_num_tokens=64, prefill_chunk_tokens=chunk)
    sched.whole_first_chunks = whole
    return sched


def _steps(sched: Scheduler, prompts: dict[str, int], steps: int) -> list[list[tuple[str, int, int]]]:
    """Each step's prefill rows as (request, start, tokens), each step's plan carried out (every sampled token 7)."""
    seqs = {rid: Sequence(rid, list(range(100, 100 + n))) for rid, n in prompts.items()}
    for seq in seqs.values():
        sched.add(seq)
    out = []
    for _ in range(steps):
        plan = sched.schedule()
        out.append([(r.request_id, r.start, len(r.tokens)) for r in plan.rows if not r.is_decode])
        for row in plan.rows:
            seq = seqs[row.request_id]
            sched.advance(seq, len(row.tokens))
            if row.sample:
                seq.generated.append(7)
    return out


def test_prompts_that_fit_a_step_whole_are_not_split_beside_first_chunks():
    prompts = {"a": 7, "b": 7, "c": 7, "d": 7}
    # filling the budget: c's first 2 tokens beside a and b, its rest (a later chunk) beside d
    assert _steps(_scheduler(16, False), prompts, 3) == [[("a", 0, 7), ("b", 0, 7), ("c", 0, 2)],
                                                         [("c", 2, 5), ("d", 0, 7)], []]
    # kept whole while under a quarter of the chunk is left: every step's prefill rows are first chunks (one prefill
    # graph each), and the prompts finish in as many steps
    assert _steps(_scheduler(16, True), prompts, 3) == [[("a", 0, 7), ("b", 0, 7)], [("c", 0, 7), ("d", 0, 7)], []]


def test_prompts_are_still_split_where_much_is_left_long_prompts_and_beside_a_later_chunk():
    # 6 of 16 left: more than a graph step would win; b is split as before
    assert _steps(_scheduler(16, True), {"a": 10, "b": 10}, 2) == [[("a", 0, 10), ("b", 0, 6)], [("b", 6, 4)]]
    # a prompt longer than a chunk is split whatever the step holds, and beside its later chunk a short one is split
    # too (that step is an eager forward anyway)
    steps = _steps(_scheduler(20, True), {"long": 38, "short": 12}, 3)
    assert steps == [[("long", 0, 20)], [("long", 20, 18), ("short", 0, 2)], [("short", 2, 10)]]
    # alone in a step a prompt that fits is never held back
    assert _steps(_scheduler(16, True), {"a": 16}, 1) == [[("a", 0, 16)]]
