"""Tree speculation in the torch runtime on CPU (tiny model; issue 35): the frequency tree and the tree acceptance on
hand-made histories; a tree row's attention (each node sees the context and its ancestors only, at the position of
its depth) against linear rows of its paths; greedy output token for token plain greedy's with trees whose accepted
path is not their first nodes (its K/V moved into place), no block leaked; a chain-shaped tree exactly linear
verification; the config's refusals."""

from __future__ import annotations

import types
from array import array

import pytest
import torch
import yaml
from conftest import CONFIGS, run_cli
from spec_oracle import DecoyTree, Oracle, greedy

from trtllm_pipeline.config import SpeculativeSection, config_from_dict
from trtllm_pipeline.errors import ConfigError
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch, PlanRow
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime
from trtllm_pipeline.runtimes.torch_engine.speculative.acceptance import (accept_greedy, accept_tree_greedy,
                                                                         tree_path)
from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import lookup
from trtllm_pipeline.runtimes.torch_engine.speculative.registry import PROPOSERS
from trtllm_pipeline.runtimes.torch_engine.speculative.tree import DraftTree, frequency_tree, row_parents

NAME = "tiny-qwen2-bf16-tp1"
PASSAGE = list(range(3000, 3030))
# repetitive prompts (prompt lookup hits) beside a random one
PROMPTS = [PASSAGE + [7, 8] + PASSAGE[:6], list(range(4000, 4021)), PASSAGE[5:] + PASSAGE[:9],
           [11, 12, 13, 11, 12, 13, 11, 12], [5, 6, 7, 8] * 6 + [5, 6]]
HISTORY = [1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 3, 7, 1, 2]  # "1 2" three times before the end: 3 9 / 4 8 / 3 7 after


@pytest.fixture(scope="module")
def ckpt(built):
    return built(NAME).engine_dir.parent / "checkpoint"


def _rt(ckpt, spec=None, **kw) -> TorchRuntime:
    args = dict(max_batch_size=4, max_seq_len=256, dtype="float32", kv_block_size=4)
    if isinstance(spec, dict):
        spec = SpeculativeSection(**spec)
    return TorchRuntime(ckpt, ckpt / "tokenizer", speculative=spec, **{**args, **kw})


@pytest.fixture(scope="module")
def plain(ckpt):
    return _rt(ckpt)


@pytest.fixture(scope="module")
def expected(plain):
    return _greedy(plain)


def _greedy(rt, prompts=PROMPTS, n=24, check=False):
    return greedy(rt, prompts, n, check)


def _decoy_settings(answers, k=6, chain_only=False):
    PROPOSERS["decoy-tree"] = lambda settings, target: DecoyTree(answers, chain_only=chain_only)
    return types.SimpleNamespace(method="decoy-tree", num_draft_tokens=k, adaptive=False,
                                 tree=types.SimpleNamespace(max_depth=k, max_nodes=32, min_occurrences=1))


def test_the_frequency_tree_and_tree_acceptance_on_hand_made_histories():
    tree = frequency_tree(array("i", HISTORY), 3, 4, 1, 4, 1)
    # counts: 3 twice, the rest once: 3, then 4 (shallower), then 3 7 and 4 8 (the most recent first)
    assert (tree.tokens, tree.parents) == ([3, 4, 7, 8], [-1, -1, 0, 1])
    assert tree.chain() == [3, 7] and tree.depth == 2 and tree.depths() == [1, 1, 2, 2]
    assert tree.truncated(2).tokens == [3, 4] and tree.limited(1).tokens == [3, 4]
    assert frequency_tree(array("i", [1, 2, 3]), 3, 8, 1, 4, 1).tokens == []  # no suffix occurred before
    # a looping history: the continuation cut by its end repeats its period, as ``lookup``'s
    assert frequency_tree(array("i", [5, 9, 5, 9, 5]), 4, 8, 1, 4, 1).chain() == lookup(array("i", [5, 9, 5, 9, 5]),
                                                                                        4, 1, 4)
    paths = DraftTree.of_paths([[3, 7, 1], [4, 8], [3, 9]])
    assert (paths.tokens, paths.parents) == ([3, 7, 1, 4, 8, 9], [-1, 0, 1, -1, 3, 0])
    parents = row_parents(paths)  # the row: the last token at 0
    tokens = [2] + paths.tokens
    assert parents == [-1, 0, 1, 2, 0, 4, 1]
    # argmax per row index: after the root 3, after 3 -> 9 (node 6), after 9 -> 5: keeps 3 9, emits 5
    argmax = [3, 9, 0, 0, 0, 0, 5]
    assert accept_tree_greedy(argmax, tokens, parents) == [3, 9, 5]
    assert tree_path(tokens, parents, [3, 9]) == [1, 6]
    assert accept_tree_greedy([4, 0, 0, 0, 8, 6, 0], tokens, parents) == [4, 8, 6]
    assert accept_tree_greedy([5, 0, 0, 0, 0, 0, 0], tokens, parents) == [5]
    chain = [2, 5, 6, 7]
    for argmax in ([5, 6, 9, 1], [5, 6, 7, 1], [4, 0, 0, 0]):  # a chain: the linear rule's tokens
        assert accept_tree_greedy(argmax, chain, row_parents(DraftTree.of_chain(chain[1:]))) == \
            accept_greedy(argmax, chain[1:])
    with pytest.raises(ValueError, match="topological"):
        DraftTree([1, 2], [1, -1])


def _prefilled(rt, rid, context):
    assert rt.kv.admit(rid, context, len(context) + 16, use_cache=False, watermark=False) == 0
    rt._forward([PlanRow(rid, list(context), 0, rt.kv.tables[rid], True)])
    return rt.kv.tables[rid]


def test_a_tree_row_sees_its_ancestors_only_at_the_positions_of_their_depths(plain):
    """Each node's hidden state in one tree row equals the last one of a linear row feeding its root path (the same
    context, in blocks of its own); a chain given as parents is bit for bit the linear row."""
    rt, context = plain, PROMPTS[1]
    start = len(context) - 1
    paths = [[7, 8, 9], [7, 5], [6, 1, 2, 3]]
    tree = DraftTree.of_paths(paths)
    row = [context[-1]] + tree.tokens
    parents = row_parents(tree)
    try:
        table = _prefilled(rt, "t", context[:-1])
        hidden = rt._forward([PlanRow("t", row, start, table, True, draft=len(tree), parents=parents)])
        for d, path in enumerate(paths):
            lin = _prefilled(rt, ("lin", d), context[:-1])
            linear = rt._forward([PlanRow(("lin", d), [context[-1]] + path, start, lin, True, draft=len(path))])
            nodes = [0] + tree_path(row, parents, path)
            torch.testing.assert_close(hidden[nodes], linear, rtol=1e-4, atol=1e-4)
        chain = [context[-1]] + paths[2]
        as_chain = rt._forward([PlanRow("t", chain, start, table, True, draft=4, parents=[-1, 0, 1, 2, 3])])
        linear = rt._forward([PlanRow(("lin", 2), chain, start, rt.kv.tables[("lin", 2)], True, draft=4)])
        assert torch.equal(as_chain, linear)
        assert PagedBatch.of([PlanRow("t", chain, start, table, True, parents=[-1, 0, 1, 2, 3])]).parents is not None
    finally:
        for rid in ["t"] + [("lin", d) for d in range(len(paths))]:
            rt.kv.free(rid)


def test_tree_greedy_is_plain_greedy_moving_the_kept_path_and_leaking_no_block(ckpt, expected):
    rt = _rt(ckpt, _decoy_settings(expected))
    free = rt.kv.free_blocks
    moved = []
    move = rt.executor.move_kv
    rt.executor.move_kv = lambda *a: (moved.append(a), move(*a))
    assert rt.tree_verify and _greedy(rt, check=True) == expected
    stats = rt.stats()
    rows = stats["spec_decode_verify_rows"]
    print(f"decoy tree, k 6: {rows} verify rows, {stats['spec_decode_accepted_tokens']} drafts kept of "
          f"{stats['spec_decode_draft_tokens']} verified, acceptance length {stats['spec_decode_acceptance_length']:.2f}, "
          f"{rt.phase_times()['steps']} steps for {sum(map(len, expected))} tokens")
    assert moved  # the truth was never the tree's first branch: its K/V moved
    assert stats["spec_decode_acceptance_length"] > 3  # the truth's 6 drafts, the last wrong every other step
    assert rt.kv.free_blocks == free and not rt.kv.tables


def test_a_chain_shaped_tree_is_linear_verification(ckpt, expected):
    """The same drafts as a chain-shaped tree and as linear drafts: the same outputs, steps and counters."""

    runs = []
    for settings in (_decoy_settings(expected, chain_only=True), None):
        if settings is None:  # the linear run: the same truth, the same last token wrong every other call
            class Linear(Oracle):
                calls = 0

                def propose(self, batch):
                    out = []
                    for r in batch:
                        Linear.calls += 1
                        truth = list(self.answers[r.request_id][len(r.generated) : len(r.generated) + r.k])
                        if truth and Linear.calls % 2:
                            truth[-1] += 1
                        out.append(truth)
                    return out

            PROPOSERS["linear"] = lambda s, t: Linear(expected)
            settings = types.SimpleNamespace(method="linear", num_draft_tokens=6, adaptive=False)
        rt = _rt(ckpt, settings)
        out = _greedy(rt, check=True)
        stats = {k: v for k, v in rt.stats().items() if k.startswith("spec_")}
        runs.append((out, stats, rt.phase_times()["steps"]))
    assert runs[0] == runs[1] and runs[0][0] == expected


def test_ngram_trees_give_plain_greedy_and_sampled_requests_take_the_trees_chain(ckpt, expected):
    spec = {"method": "ngram", "ngram_min": 1, "adaptive": False, "tree": {"max_nodes": 16, "max_depth": 8}}
    rt = _rt(ckpt, spec)
    assert rt.tree_verify and "trees of up to 16 nodes" in rt.describe()["speculative"]
    free = rt.kv.free_blocks
    assert _greedy(rt, check=True) == expected
    stats = rt.stats()
    print(f"ngram tree (16 nodes, depth 8): {stats['spec_decode_verify_rows']} verify rows, "
          f"{stats['spec_decode_accepted_tokens']} kept of {stats['spec_decode_draft_tokens']}, "
          f"{rt.phase_times()['steps']} steps for {sum(map(len, expected))} tokens")
    assert stats["spec_decode_draft_tokens"] > 0 and rt.kv.free_blocks == free
    params = SamplingParams(max_tokens=16, temperature=0.8, top_k=50, seed=3, end_id=-1)
    runs = [[c.token_ids for c in rt.generate(PROMPTS[3:], params)] for _ in range(2)]
    assert runs[0] == runs[1] and all(len(t) == 16 for t in runs[0])
    assert rt.kv.free_blocks == free


def test_tree_config_refusals(tmp_path):
    base = yaml.safe_load((CONFIGS / f"{NAME}.yaml").read_text())

    def data(spec):
        return {**base, "runtime": {**base["runtime"], "speculative": spec}}

    def error(spec):
        with pytest.raises(ConfigError) as exc:
            config_from_dict(data(spec), name="t", path=CONFIGS / "t.yaml")
        return str(exc.value)

    assert "tree is set but method is 'draft'" in error({"method": "draft", "draft_checkpoint": "x",
                                                         "tree": {"max_nodes": 8}})
    assert "Fix: set method: ngram, or remove tree" in error({"method": "none", "tree": {}})
    assert "runtime.speculative.tree.max_nodes" in error({"method": "ngram", "tree": {"max_nodes": 0}})
    assert "runtime.speculative.tree.max_node" in error({"method": "ngram", "tree": {"max_node": 8}})
    ok = config_from_dict(data({"method": "ngram", "tree": {"max_nodes": 8}}), name="t").runtime.speculative
    assert (ok.tree.max_nodes, ok.tree.max_depth, ok.tree.min_occurrences) == (8, 32, 4)
    bad = tmp_path / "tree.yaml"
    bad.write_text(yaml.safe_dump(data({"method": "self", "tree": {"max_nodes": 8}})))
    proc = run_cli("quantize", "-c", str(bad), "--engines-dir", str(tmp_path / "engines"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "runtime.speculative.tree" in proc.stderr and "Fix: set method: ngram" in proc.stderr


def test_an_executor_that_cannot_verify_trees_gets_their_chains_and_says_so(ckpt, expected, caplog):
    """Tensor-parallel ranks take no tree rows (``Executor.trees``): each request drafts its tree's first path,
    linear rows, the output unchanged."""
    rt = _rt(ckpt)
    rt.executor.trees = False
    with caplog.at_level("WARNING"):
        rt.speculator = rt._speculator(_decoy_settings(expected))
    assert not rt.tree_verify and "most frequent path instead" in caplog.text
    planned = []
    schedule = rt.scheduler.schedule
    rt.scheduler.schedule = lambda: (plan := schedule(), planned.extend(plan.rows))[0]
    assert _greedy(rt, check=True) == expected
    assert any(r.draft for r in planned) and all(r.parents is None for r in planned)
