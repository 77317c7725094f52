"""Run by tests/test_fast_decode.py in a subprocess: a speculative verify step's rows against 1-token steps, through
Triton's interpreter on the CPU. Prompts of 400 tokens (longer than a key tile, so that the key range's split
matters), one request and then two: the logits of a verify step of 1 + 3 tokens each and of the same tokens fed one a
step, bit for bit (the verify step attends with its requests' decode batch's splits: ``DecodeStep.verify_buffers``).
Prints JSON.

    python tests/verify_rows_check.py CHECKPOINT_DIR
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch

from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

SETTINGS = types.SimpleNamespace(method="ngram", num_draft_tokens=3, adaptive=True, ngram_min=1, ngram_max=3, tree=None)
PROMPT = 400
TOKENS = [[500, 501, 502, 503], [700, 701, 702, 703]]


def prefilled(rt: TorchRuntime, rid, seed: int) -> list[int]:
    prompt = [300 + (i * 37 + seed) % 2000 for i in range(PROMPT)]
    rt.kv.admit(rid, prompt, PROMPT + 8, use_cache=False, watermark=False)
    rt._forward([PlanRow(rid, prompt, 0, rt.kv.tables[rid], False)])
    return rt.kv.tables[rid]


def compare(rt: TorchRuntime, requests: int) -> dict:
    dec = rt.decoder
    verified, stepped = [("v", requests, i) for i in range(requests)], [("d", requests, i) for i in range(requests)]
    tables = [prefilled(rt, rid, i) for i, rid in enumerate(verified)]
    logits, _ = dec.verify(TOKENS[:requests], tables, [PROMPT] * requests, verified)
    fast = logits.float().clone().view(requests, len(TOKENS[0]), -1)
    release(rt, verified)
    tables = [prefilled(rt, rid, i) for i, rid in enumerate(stepped)]
    steps = [dec.decode([toks[j] for toks in TOKENS[:requests]], tables, [PROMPT + j] * requests, stepped)
             [:requests].float().clone() for j in range(len(TOKENS[0]))]
    release(rt, stepped)
    single = torch.stack(steps, dim=1)
    bucket = dec._verify_bucket(TOKENS[:requests])
    return {"bucket": bucket, "verify_splits": dec.verify_buffers[bucket].attn_o.shape[2],
            "bucket_splits": dec.buffers[bucket].attn_o.shape[2],
            "decode_splits": dec.buffers[min(b for b in dec.buckets if b >= requests)].attn_o.shape[2],
            "equal": bool(torch.equal(fast, single)), "max_diff": float((fast - single).abs().max())}


def release(rt: TorchRuntime, rids) -> None:
    rt.decoder.release(rids)
    for rid in rids:
        rt.kv.free(rid)


def main() -> None:
    ckpt = Path(sys.argv[1])
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", device="cpu", dtype="bfloat16", max_batch_size=2, max_seq_len=512,
                      kv_block_size=4, graph_batch_sizes=[1, 2], fast_decode=True, speculative=SETTINGS)
    one, two = compare(rt, 1), compare(rt, 2)
    dec = rt.decoder  # (every bucket's logits, decode and verify, are rows of one buffer)
    storages = {b.logits.untyped_storage().data_ptr() for b in [*dec.buffers.values(), *dec.verify_buffers.values()]}
    print(json.dumps({"decode_path": rt.decode_path, "buckets": dec.buckets, "logits_buffers": len(storages),
                      "verify_buckets": sorted(dec.verify_buffers), "one": one, "two": two}))


if __name__ == "__main__":
    main()
