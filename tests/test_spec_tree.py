"""benchmarks/spec_tree.py (issue 35's tree / suffix / oracle study): its candidate trees on a hand-made history,
its prompt lookup replaying as spec_simulate's (and so the runtime's) does, and the oracle bounding every lookup
proposer prompt by prompt, on the cached SmolLM2 outputs (no model: seconds)."""

from __future__ import annotations

import json
import sys
from array import array

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import spec_tree  # noqa: E402
from spec_simulate import replay as simulate  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import lookup  # noqa: E402

CACHE = REPO / "benchmarks" / "results" / "spec-simulate-smollm2-cpu" / "greedy-float32.json"
# "1 2" three times before the end, followed by 3 7 / 4 8 / 3 9 (most recent first)
HISTORY = [1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 3, 7, 1, 2]


def test_candidates_on_a_hand_made_history():
    # the prompt all but the last 2, which the prefill emits; then the output copies the oldest occurrence
    ctx = spec_tree.Context(HISTORY[:-1], [2, 3, 9, 1, 2, 4])
    total = len(HISTORY)
    assert ctx.occurrences(total, 2) == [10, 6, 2] and ctx.longest_match(total, 4) == 2
    tree = spec_tree.tree_candidates(ctx, total, 3, 4, 1, 4)
    assert tree == [[3, 7, 1], [4, 8, 1], [3, 9, 1]]  # the n 1 lookups offer the same three: nothing added
    assert tree[0] == lookup(array("i", HISTORY), 3, 1, 4)  # C 1: NgramProposer's draft
    assert spec_tree.tree_candidates(ctx, total, 3, 2, 1, 4) == tree[:2]
    # counts: 3 twice, the rest once; 3 nodes: 3, then 4 (shallower) before 3 7 (the most recent of its depth)
    assert sorted(spec_tree.freqtree_candidates(ctx, total, 3, 3, 1, 4, 1)) == [[3, 7], [4]]
    assert spec_tree.suffix_candidates(ctx, total, 3, 1, 4, "frequent", 0) == [[3, 7, 1]]  # 3 (twice), then recent
    assert spec_tree.suffix_candidates(ctx, total, 8, 1, 4, "recent", 1) == [[3, 7]]  # k: 1 x the 2-token match
    assert spec_tree.oracle_candidates(ctx, total, 3) == [[3, 9, 1]]
    # the replay: the prefill; a verify row of the 3-candidate tree (8 nodes + the last token) accepting 3 9 1 and
    # emitting the 2 after them; no room left to draft: a plain step (4). One candidate: 3 7 1 keeps 3 (9 emitted),
    # then "1 2 3 9" drafts 1 2: two verify rows
    run = spec_tree.replay(ctx, {"approach": "tree", "k": 3, "c": 4, "ngram_min": 1, "ngram_max": 4})
    assert (run["steps"], run["tokens"], run["verify_rows"], run["accepted"], run["widths"]) == (3, 6, 1, 3, [9])
    run = spec_tree.replay(ctx, {"approach": "ngram", "k": 3, "ngram_min": 1, "ngram_max": 4})
    assert (run["steps"], run["tokens"], run["verify_rows"], run["accepted"], run["widths"]) == (3, 6, 2, 3, [4, 3])


def test_prompt_lookup_replays_as_spec_simulate_and_the_oracle_bounds_every_proposer():
    workloads = json.loads(CACHE.read_text())["workloads"]
    settings = [{"approach": "tree", "k": 16, "c": 4, "ngram_min": 1, "ngram_max": 4},
                {"approach": "freqtree", "k": 16, "budget": 32, "ngram_min": 1, "ngram_max": 4, "min_occ": 4},
                {"approach": "suffix", "k": 16, "ngram_min": 1, "ngram_max": 8, "pick": "frequent", "kscale": 0}]
    steps = {}
    for workload, items in ((w, workloads[w]) for w in spec_tree.STUDIED):
        ctxs = [spec_tree.Context(it["prompt"], it["output"]) for it in items]
        ngram = [spec_tree.replay(c, {"approach": "ngram", "k": 16, "ngram_min": 1, "ngram_max": 4}) for c in ctxs]
        fixed = [simulate(it["prompt"], it["output"], k=16, ngram_min=1, ngram_max=4, adaptive=False) for it in items]
        assert [(r["steps"], r["accepted"], r["verify_rows"]) for r in ngram] == \
            [(r["steps"], r["accepted"], r["verify_rows"]) for r in fixed]
        oracle = [spec_tree.replay(c, {"approach": "oracle", "k": 16})["steps"] for c in ctxs]
        for s in settings:  # the oracle takes the fewest steps any proposer drafting from the context could
            runs = [spec_tree.replay(c, s)["steps"] for c in ctxs]
            assert all(o <= r for o, r in zip(oracle, runs))
        steps[workload] = sum(r["steps"] for r in ngram), sum(oracle)
    # (the cache remade 2026-12-07, its outputs uncut, a question per passage: the README's tree tables, of the
    # cache before, had 1385 / 839 grounded; random: 225 steps before NgramProposer repeated a period cut by the
    # context's end)
    assert steps == {"grounded": (1120, 691), "random": (88, 88)}
