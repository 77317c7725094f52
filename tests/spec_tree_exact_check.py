"""Run by tests/test_fast_decode.py in a subprocess: a tree node on the CUDA fast path's verify step computes its
path's logits bit for bit as that path verified as a chain does (and so as 1-token steps do), through Triton's
interpreter on the CPU. Prints JSON.

Two requests, each a tree row whose kept path is not its first nodes (a decoy child of the root first) and whose
nodes' slots cross a 64-key tile edge (and a 32-token block's) where the path's positions do not: by slot, a node's
keys fell into other tiles than a 1-token step's (the H100's FP8 SmolLM2 then parted from plain greedy on grounded
prompts, issue 35). Their 9 tokens fit bucket 9, whose verify step attends as one request's decode batch, not as
two's (4 key splits against 2 here): the step must run where two requests' chains do. Then the kept path's K/V moved
into place as the runtime moves it: the chains' cache, bit for bit.

    python tests/spec_tree_exact_check.py CHECKPOINT_DIR
"""

from __future__ import annotations

import itertools
import json
import sys
import types
from pathlib import Path

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch

from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime
from trtllm_pipeline.runtimes.torch_engine.speculative.tree import DraftTree, row_parents

# trees of up to 8 nodes: verify buckets 9 (one request's) and 18 (two's) beside the decode buckets 1 and 2
TREES = types.SimpleNamespace(method="ngram", num_draft_tokens=8, adaptive=False, ngram_min=1, ngram_max=3,
                              tree=types.SimpleNamespace(max_depth=8, max_nodes=8, min_occurrences=1))
ARGS = dict(device="cpu", dtype="bfloat16", max_batch_size=2, max_seq_len=256, kv_block_size=32,
            graph_batch_sizes=[1, 2], fast_decode=True, speculative=TREES)
# per request: its context (the last token the row's root), the decoy, the path; the path's nodes sit one slot past
# their positions: 190, 191 at slots 191, 192 (a tile and a block edge at 192); 125..127 at 126..128 (a tile at 128)
CASES = [(list(range(1000, 1190)), 7, [5, 6]), (list(range(2000, 2125)), 9, [1, 2, 3])]


def prefilled(rt: TorchRuntime, rid, context: list[int]) -> list[int]:
    assert rt.kv.admit(rid, context, len(context) + 8, use_cache=False, watermark=False) == 0
    rt._forward([PlanRow(rid, context[:-1], 0, rt.kv.tables[rid], True)])
    return rt.kv.tables[rid]


def row_kv(rt: TorchRuntime, table: list[int], start: int, n: int) -> torch.Tensor:
    """The K/V at positions start .. start + n - 1, every layer."""
    bs = rt.engine.block_size
    blocks = torch.tensor([table[p // bs] for p in range(start, start + n)])
    within = torch.tensor([p % bs for p in range(start, start + n)])
    return torch.stack([c[:, blocks, :, within] for c in (rt.engine.cache_k, rt.engine.cache_v)])


def main() -> None:
    ckpt = Path(sys.argv[1])
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", **ARGS)
    dec = rt.decoder
    starts = [len(context) - 1 for context, _, _ in CASES]
    got = {}
    for kind in ("chain", "tree"):
        rids = [(kind, i) for i in range(len(CASES))]
        tables = [prefilled(rt, rid, context) for rid, (context, _, _) in zip(rids, CASES)]
        rows, parents, path_rows = [], [], []
        for context, decoy, path in CASES:
            if kind == "chain":
                rows.append([context[-1], *path])
                parents.append(None)
                path_rows.append(list(range(1 + len(path))))
            else:
                tree = DraftTree.of_paths([[decoy], path])  # the decoy first: the path at row indices 2..
                rows.append([context[-1], *tree.tokens])
                parents.append(row_parents(tree))
                path_rows.append([0] + [2 + j for j in range(len(path))])
        logits, greedy = dec.verify(rows, tables, starts, rids, **({"parents": parents} if kind == "tree" else {}))
        firsts = list(itertools.accumulate((len(row) for row in rows), initial=0))  # each row's first token row
        at = [firsts[i] + j for i, mine in enumerate(path_rows) for j in mine]
        kv = []
        for (_, _, path), table, start, mine in zip(CASES, tables, starts, path_rows):
            if kind == "tree":  # the kept path into place, as TorchRuntime._move_path does
                rt.executor.move_kv(table, [start + j for j in mine[1:]], [start + 1 + d for d in range(len(path))])
            kv.append(row_kv(rt, table, start, 1 + len(path)))
        got[kind] = (logits[at].clone(), greedy[at].clone(), kv)
        dec.release(rids)
        for rid in rids:
            rt.kv.free(rid)
    (chain_logits, chain_greedy, chain_kv), (tree_logits, tree_greedy, tree_kv) = got["chain"], got["tree"]
    print(json.dumps({
        "decode_path": rt.decode_path, "buckets": dec.buckets,
        "logits_equal": torch.equal(tree_logits, chain_logits),
        "max_logit_difference": float((tree_logits.float() - chain_logits.float()).abs().max()),
        "greedy_equal": torch.equal(tree_greedy, chain_greedy),
        "kv_equal": all(torch.equal(a, b) for a, b in zip(tree_kv, chain_kv)),
    }))


if __name__ == "__main__":
    main()
