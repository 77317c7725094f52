"""Run by tests/test_fast_decode.py in a subprocess: an FP8 KV cache whose layers' scales differ from 1 and from each
other, through each writer of the cache and the fast decode step, against the eager model (``Qwen2Engine.kv_store``
/ ``kv_load`` define what the cache holds and what an attention reads). Prints JSON.

    python tests/fp8_kv_check.py CHECKPOINT_DIR

The prompts are prefilled twice into the same block tables: by the eager layers (the CPU's forward) and by the fused
layers (``cuda/prefill``, the CUDA forward, here through Triton's interpreter); their cache bytes are compared. Then
the first decode step from the eager prefill's cache (the order ``benchmarks/model_check.py`` runs on a GPU): eager's
logits and the new token's stored keys and values against the fast step's (the decode kernel quantizes them in
registers), and both against the float32 model over the same E4M3 cache.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch
from near_ties import near_greedy

from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.cuda import prefill
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch, PlanRow
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

TOKENS = [7, 8, 9]  # each row's decode token


def runtime(ckpt: Path, dtype: str, fast: bool) -> TorchRuntime:
    return TorchRuntime(ckpt, ckpt / "tokenizer", device="cpu", dtype=dtype, max_batch_size=4, max_seq_len=128,
                        fast_decode=fast, kv_cache_blocks=24)


def admit(rt: TorchRuntime, prompts) -> list[list[int]]:
    for i, prompt in enumerate(prompts):
        rt.kv.admit(("check", i), prompt, len(prompt) + 1, use_cache=False, watermark=False)
    return [rt.kv.tables[("check", i)] for i in range(len(prompts))]


def pool(rt: TorchRuntime) -> tuple[torch.Tensor, torch.Tensor]:
    return rt.engine.cache_k.view(torch.uint8).clone(), rt.engine.cache_v.view(torch.uint8).clone()


def eager_step(rt: TorchRuntime, prompts, tables) -> torch.Tensor:
    hidden = rt._forward([PlanRow(("check", i), [t], len(p), table, True)
                          for i, (p, t, table) in enumerate(zip(prompts, TOKENS, tables))])
    return rt.engine.logits(hidden).float()


def main(ckpt: Path) -> None:
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(100, 2000, (n,), generator=gen).tolist() for n in (5, 40, 23)]
    fast, eager, fp32 = runtime(ckpt, "bfloat16", True), runtime(ckpt, "bfloat16", False), runtime(ckpt, "float32", False)
    engine = eager.engine
    tables = admit(eager, prompts)
    assert admit(fast, prompts) == tables and admit(fp32, prompts) == tables
    blocks = sorted({b for t in tables for b in t})

    # the prompts' K/V: the eager layers (paged, as the CPU forward runs them) and the fused layers, the same tables
    rows = [PlanRow(("check", i), p, 0, t, False) for i, (p, t) in enumerate(zip(prompts, tables))]
    eager_hidden = eager._forward(rows)
    batch = PagedBatch.of([(p, 0, t) for p, t in zip(prompts, tables)])
    fused_hidden = prefill.layers(fast.engine, batch.tokens, *fast.engine.paged(batch))
    (ek, ev), (fk, fv) = pool(eager), pool(fast)
    saturated = int((ek[:, blocks].view(torch.float8_e4m3fn).float().abs() == 448).sum())
    prefill_equal = bool(torch.equal(ek[:, blocks], fk[:, blocks]) and torch.equal(ev[:, blocks], fv[:, blocks]))

    # the first decode step from the eager prefill's cache, fast and eager; the float32 model over its own prefill
    fast.engine.cache_k.view(torch.uint8).copy_(ek)
    fast.engine.cache_v.view(torch.uint8).copy_(ev)
    logits_eager = eager_step(eager, prompts, tables)
    logits_fast = fast.decoder.decode(TOKENS, tables, [len(p) for p in prompts]).float().clone()
    # no writes outside the rows' blocks (the bucket's padding row writes the null block)
    unowned = [b for b in range(1, fast.kv.num_blocks) if b not in blocks]
    padding_ok = bool(fast.engine.cache_k.view(torch.uint8)[:, unowned].sum() == 0)
    fp32._forward(rows)
    logits_fp32 = eager_step(fp32, prompts, tables)

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    # the new tokens' keys and values as each path stored them: [layers, rows, kv_heads, D] bytes
    bs = engine.block_size
    where = [(t[len(p) // bs], len(p) % bs) for p, t in zip(prompts, tables)]

    def stored(rt: TorchRuntime, name: str) -> torch.Tensor:
        return torch.stack([getattr(rt.engine, name).view(torch.uint8)[:, b, :, w] for b, w in where], 1)

    per_layer = {}
    for name in ("cache_k", "cache_v"):
        e8, f8 = stored(eager, name).view(torch.float8_e4m3fn), stored(fast, name).view(torch.float8_e4m3fn)
        per_layer[name] = {
            "bytes_equal": [float((e8[i].view(torch.uint8) == f8[i].view(torch.uint8)).float().mean())
                            for i in range(len(engine.layers))],
            # the values the attentions read, each layer at its own scale
            "rel": [rel(engine.kv_load(i, f8[i]).float(), engine.kv_load(i, e8[i]).float())
                    for i in range(len(engine.layers))],
        }
    greedy = SamplingParams(max_tokens=4, end_id=-1)
    for rt in (fast, eager):
        for i in range(len(prompts)):
            rt.kv.free(("check", i))
    greedy_fast = [c.token_ids for c in fast.generate(prompts, greedy)]
    greedy_eager = [c.token_ids for c in eager.generate(prompts, greedy)]
    print(json.dumps({
        "decode_path": fast.describe()["decode_path"],
        "kv_scale": engine.kv_scale.tolist(), "kv_unit_scale": engine.kv_unit_scale,
        "prefill_bytes_equal": prefill_equal,
        "prefill_saturated_keys": saturated,
        "prefill_hidden_rel": rel(fused_hidden.float(), eager_hidden.float()),
        "new_kv": per_layer,
        "padding_wrote_scratch_only": padding_ok,
        "fast_vs_eager": rel(logits_fast, logits_eager),
        "fast_vs_fp32": rel(logits_fast, logits_fp32), "eager_vs_fp32": rel(logits_eager, logits_fp32),
        "argmax_equal": logits_fast.argmax(-1).tolist() == logits_eager.argmax(-1).tolist(),
        "greedy_fast": greedy_fast, "greedy_eager": greedy_eager,
        # where the two part: both eager's greedy choice within bfloat16 rounding at every token (a misread scale is
        # far from any tie)
        "greedy_parted_near_ties": all(near_greedy(eager, p, f, tol=0.1) and near_greedy(eager, p, e, tol=0.1)
                                       for p, f, e in zip(prompts, greedy_fast, greedy_eager) if f != e),
    }))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
