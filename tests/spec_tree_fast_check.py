"""Run by tests/test_fast_decode.py in a subprocess: tree verify rows on the CUDA fast path's verify step (issue 35),
through Triton's interpreter on the CPU (as spec_fast_check.py). Prints JSON:

- a tree row (beside a linear row, in one step) against the eager model's tree row over the same context, both
  against float32 eager: each node rotated at its depth and seeing the context and its ancestors only;
- a chain given as parents (a tree step, the mask's and rotary inputs' path) against the same row as a linear verify
  step: bit for bit;
- greedy decoding with tree drafts whose kept path is never their first nodes (their K/V moved in the pool the fast
  step reads) against eager decoding without speculation.

    python tests/spec_tree_fast_check.py CHECKPOINT_DIR
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch

from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime
from trtllm_pipeline.runtimes.torch_engine.speculative.registry import PROPOSERS
from trtllm_pipeline.runtimes.torch_engine.speculative.tree import DraftTree, row_parents

from spec_oracle import DecoyTree  # (tests/ is this script's directory)

PROMPTS = [list(range(300, 305)), list(range(900, 940))]
ARGS = dict(device="cpu", max_batch_size=2, max_seq_len=128, kv_block_size=4, graph_batch_sizes=[2])


def prefilled(rt: TorchRuntime, rid, context: list[int]) -> list[int]:
    assert rt.kv.admit(rid, context, len(context) + 16, use_cache=False, watermark=False) == 0
    rt._forward([PlanRow(rid, list(context), 0, rt.kv.tables[rid], True)])
    return rt.kv.tables[rid]


def eager_logits(rt: TorchRuntime, rows: list[PlanRow]) -> torch.Tensor:
    return rt.executor.logits(rt._forward(rows)).float()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def step_logits(fast: TorchRuntime, eager: TorchRuntime, fp32: TorchRuntime) -> dict:
    """One fast tree step (a tree row and a linear row) against eager bfloat16 and float32 over the same contexts."""
    context, other = PROMPTS[1], PROMPTS[0]
    tree = DraftTree.of_paths([[7, 8, 9], [7, 5], [6, 1, 2, 3]])
    row, parents = [context[-1]] + tree.tokens, row_parents(tree)
    linear = [other[-1], 11, 12]
    start, other_start = len(context) - 1, len(other) - 1
    out = {}
    for name, rt in (("eager", eager), ("fp32", fp32), ("fast", fast)):
        tables = [prefilled(rt, (name, 0), context[:-1]), prefilled(rt, (name, 1), other[:-1])]
        if rt is fast:
            logits, _ = fast.decoder.verify([row, linear], tables, [start, other_start], [(name, 0), (name, 1)],
                                            parents=[parents, None])
            out[name] = logits.float().clone()
            fast.decoder.release([(name, 0), (name, 1)])
        else:
            out[name] = eager_logits(rt, [PlanRow((name, 0), row, start, tables[0], True, draft=len(tree),
                                                  parents=parents),
                                          PlanRow((name, 1), linear, other_start, tables[1], True, draft=2)])
        for rid in ((name, 0), (name, 1)):
            rt.kv.free(rid)
    n = len(row)
    return {"tree_fast_vs_fp32": rel(out["fast"][:n], out["fp32"][:n]),
            "tree_eager_vs_fp32": rel(out["eager"][:n], out["fp32"][:n]),
            "linear_fast_vs_fp32": rel(out["fast"][n:], out["fp32"][n:]),
            "linear_eager_vs_fp32": rel(out["eager"][n:], out["fp32"][n:]),
            "tree_argmax_equal": out["fast"][:n].argmax(-1).tolist() == out["fp32"][:n].argmax(-1).tolist()}


def chain_as_tree(fast: TorchRuntime) -> dict:
    """A chain as parents (the tree step) and as a linear row (today's verify step): the same logits and K/V, bit
    for bit."""
    context = PROMPTS[1]
    chain, start = [context[-1], 7, 8, 9, 10], len(context) - 1
    got = {}
    for kind, parents in (("tree", [[-1, 0, 1, 2, 3]]), ("linear", None)):
        rid = ("chain", kind)
        table = prefilled(fast, rid, context[:-1])
        logits, greedy = fast.decoder.verify([chain], [table], [start], [rid],
                                             **({"parents": parents} if parents else {}))
        e, bs = fast.engine, fast.engine.block_size
        blocks = torch.tensor([table[p // bs] for p in range(start, start + len(chain))])
        within = torch.tensor([p % bs for p in range(start, start + len(chain))])
        kv = torch.stack([c[:, blocks, :, within] for c in (e.cache_k, e.cache_v)])  # the row's slots, every layer
        got[kind] = (logits.clone(), greedy.clone(), kv)
        fast.decoder.release([rid])
        fast.kv.free(rid)
    used = sorted(fast.decoder.tree_buffers)
    return {"chain_logits_equal": torch.equal(got["tree"][0], got["linear"][0]),
            "chain_greedy_equal": torch.equal(got["tree"][1], got["linear"][1]),
            "chain_kv_equal": torch.equal(got["tree"][2], got["linear"][2]), "tree_buckets": used}


def greedy_run(fast_args: dict, ckpt: Path, expected: list[list[int]], fast_trees: bool = True) -> dict:
    # (its decoy one node: a row cut to the tokens a request has left keeps the truth)
    PROPOSERS["decoy-tree"] = lambda settings, target: DecoyTree(expected, decoy=1)
    k = 3
    settings = types.SimpleNamespace(method="decoy-tree", num_draft_tokens=k, adaptive=False,
                                     tree=types.SimpleNamespace(max_depth=k, max_nodes=8, min_occurrences=1))
    os.environ["TRTLLM_PIPELINE_FAST_TREES"] = "1" if fast_trees else "0"
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", fast_decode=True, speculative=settings, **fast_args)
    calls = {"tree_steps": 0, "eager_tree_rows": 0, "moves": 0}
    verify, forward, move = rt.decoder.verify, rt._forward, rt.executor.move_kv

    def counted(*a, **kw):
        calls["tree_steps"] += kw.get("parents") is not None
        return verify(*a, **kw)

    def eager(rows):
        calls["eager_tree_rows"] += sum(r.parents is not None for r in rows)
        return forward(rows)

    def moved(*a):
        calls["moves"] += 1
        return move(*a)

    rt.decoder.verify, rt._forward, rt.executor.move_kv = counted, eager, moved
    free = rt.kv.free_blocks
    out = [c.token_ids for c in rt.generate(PROMPTS, SamplingParams(max_tokens=len(expected[0]), end_id=-1))]
    rt.kv.check()
    stats = rt.stats()
    return {**calls, "fast_trees": out, "describe": rt.describe()["speculative"],
            "accepted": stats["spec_decode_accepted_tokens"], "drafted": stats["spec_decode_draft_tokens"],
            "blocks_back": rt.kv.free_blocks == free}


def main() -> None:
    ckpt = Path(sys.argv[1])
    eager = TorchRuntime(ckpt, ckpt / "tokenizer", fast_decode=False, dtype="bfloat16", **ARGS)
    fp32 = TorchRuntime(ckpt, ckpt / "tokenizer", fast_decode=False, dtype="float32", **ARGS)
    # one bucket of 16 rows: the tree row and the linear row (15 token rows), the chain (5)
    fast = TorchRuntime(ckpt, ckpt / "tokenizer", fast_decode=True, dtype="bfloat16",
                        **{**ARGS, "max_batch_size": 16, "graph_batch_sizes": [16]})
    result = {"decode_path": fast.decode_path, **step_logits(fast, eager, fp32), **chain_as_tree(fast)}
    expected = [c.token_ids for c in eager.generate(PROMPTS, SamplingParams(max_tokens=6, end_id=-1))]
    result.update(expected=expected, **greedy_run({**ARGS, "dtype": "bfloat16"}, ckpt, expected))
    # the same trees verified eagerly (TRTLLM_PIPELINE_FAST_TREES=0): the same drafts kept
    off = greedy_run({**ARGS, "dtype": "bfloat16"}, ckpt, expected, fast_trees=False)
    result.update({f"off_{k}": off[k] for k in ("fast_trees", "tree_steps", "eager_tree_rows", "accepted", "drafted")})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
