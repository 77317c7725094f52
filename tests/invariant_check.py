"""Run by tests/test_batch_invariant.py in a subprocess: the torch runtime with ``runtime.batch_invariant`` on a tiny
checkpoint, its kernels through Triton's interpreter on the CPU (or compiled, with ``cuda``). Prompts sharing a prefix
(several KV blocks) with distinct suffixes, greedy: generated with the prefix cache (their suffixes later chunks over
cached blocks, in small prefill chunks) against without it (whole prompts), and all together against one at a time;
decode rows through ``cuda/row_graphs`` (padded to its bucket) against the eager forward; and the default mode's
outputs and next-token log-probabilities on the same prompts, each mode's distance from a
float32 engine's, for comparison. Prints JSON.

    python tests/invariant_check.py CHECKPOINT_DIR
    python tests/invariant_check.py CHECKPOINT_DIR cuda
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cpu"
if DEVICE == "cpu":
    importlib.import_module("triton_interpreter")  # (before any kernel module is imported)
import torch  # noqa: E402

from trtllm_pipeline.errors import InputError  # noqa: E402
from trtllm_pipeline.runtimes.base import SamplingParams  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.cuda.row_graphs import RowGraphs  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime  # noqa: E402

PREFIX, SUFFIXES, TOKENS, BLOCK = 24, (3, 5, 7, 9), 6, 8


def runtime(ckpt: Path, **kw) -> TorchRuntime:
    # a pool of its own size, not a share of the free memory: four runtimes live at once (on an H100 the second
    # took what the first had left, and the third found no memory for a step: 2026-12-07)
    args = dict(device=DEVICE, dtype="bfloat16", max_batch_size=4, max_seq_len=96, kv_block_size=BLOCK,
                kv_cache_blocks=64)
    return TorchRuntime(ckpt, ckpt / "tokenizer", **{**args, **kw})


def greedy(rt: TorchRuntime, prompts: list[list[int]]) -> list[list[int]]:
    return [c.token_ids for c in rt.generate(prompts, SamplingParams(max_tokens=TOKENS, end_id=-1))]


def main(ckpt: Path) -> None:
    gen = torch.Generator().manual_seed(3)
    vocab = 1000
    prefix = torch.randint(3, vocab, (PREFIX,), generator=gen).tolist()
    prompts = [prefix + torch.randint(3, vocab, (n,), generator=gen).tolist() for n in SUFFIXES]

    plain = runtime(ckpt, batch_invariant=True, prefill_chunk_tokens=2048)
    without = greedy(plain, prompts)
    alone = [greedy(plain, [p])[0] for p in prompts]
    # the prefix cache on and prefill chunks of 16 tokens: the first prompt's prefix is computed in two chunks, the
    # others' suffixes are later chunks over its cached blocks, and the steps mix chunks with decodes
    reuse = runtime(ckpt, batch_invariant=True, enable_kv_cache_reuse=True, prefill_chunk_tokens=16)
    first = greedy(reuse, prompts[:1])
    rest = greedy(reuse, prompts[1:])
    default = runtime(ckpt, prefill_chunk_tokens=2048, fast_decode=False)  # (eager: no interpreted fast path)
    usual = greedy(default, prompts)
    # the last prompt's next-token log-probabilities in each mode (the reference: the eager default's)
    invariant_logits, usual_logits = (torch.tensor(rt.next_token_logprobs(prompts[-1])) for rt in (plain, default))
    # and float32's, which both round away from
    exact = torch.tensor(runtime(ckpt, dtype="float32", fast_decode=False).next_token_logprobs(prompts[-1]))
    apart = lambda a: float((a - exact).norm() / exact.norm())  # noqa: E731
    # decode rows through cuda/row_graphs (captured on CUDA, run directly on the CPU), padded to a bucket of 4, against
    # the eager forward of the same rows: the same bits
    engine, tables = plain.engine, plain.engine.slot_tables([0, 1, 2])
    engine(PagedBatch.of([(p, 0, t) for p, t in zip(prompts[:3], tables)]).to(engine.device))
    decode_rows = [(7 + i, len(p), t) for i, (p, t) in enumerate(zip(prompts[:3], tables))]
    eager_hidden = engine(PagedBatch.of([([tok], pos, t) for tok, pos, t in decode_rows]).to(engine.device))
    row_graphs = RowGraphs(engine, 4)
    row_graphs.prepare()
    graph_hidden = row_graphs.forward(decode_rows)
    refused = None
    try:
        runtime(ckpt, batch_invariant=True, dtype="float32")
    except InputError as exc:
        refused = exc.message
    print(json.dumps({
        "device": DEVICE,
        "decode_path": plain.decode_path,
        "described": plain.describe()["batch_invariant"] and not default.describe()["batch_invariant"],
        "linears_invariant": all(layer["qkv"].invariant and layer["proj"].invariant for layer in plain.engine.layers),
        "attention_rows": plain.engine.paged_prefill_rows,
        "gemm_refusal": plain.engine._invariant_gemm_refusal(),  # (made on CUDA only; here through the interpreter)
        "without_reuse": without,
        "one_at_a_time_equal": alone == without,
        "with_reuse_equal": first + rest == without,
        "prefix_hits": reuse.kv.hits,
        "default_mode_equal": sum(a == b for a, b in zip(usual, without)),
        "default_mode_first_equal": sum(a[0] == b[0] for a, b in zip(usual, without)),
        "logprobs_rel": float((invariant_logits - usual_logits).norm() / usual_logits.norm()),
        "logprobs_from_float32": {"invariant": apart(invariant_logits), "default": apart(usual_logits)},
        "float32_refused": refused,
        "row_graphs_equal": torch.equal(eager_hidden, graph_hidden),
    }))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
