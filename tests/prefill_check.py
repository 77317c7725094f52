"""Run by tests/test_fused_prefill.py in a subprocess: ``cuda/prefill``'s fused layers through Triton's interpreter
on the CPU, against the eager layers (``Qwen2Engine._layers``) on the same paged batch of a tiny checkpoint: a
first chunk, a later chunk (its prefix already cached) and a decode row; then with ``cuda/paged_prefill``'s kernel
attending for the rows a GPU gives it (the later chunk and the decode row), and for every row. Prints JSON.

    python tests/prefill_check.py CHECKPOINT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch

from trtllm_pipeline.runtimes.torch_engine.cuda import prefill
from trtllm_pipeline.runtimes.torch_engine.model import _PagedAttention
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime


def main(ckpt: Path) -> None:
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", device="cpu", dtype="bfloat16", max_batch_size=4, max_seq_len=128,
                      fast_decode=False)
    engine = rt.engine
    g = torch.Generator().manual_seed(0)
    vocab = engine.embedding.shape[0]
    seq = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (9, 20, 12)]
    tables = engine.slot_tables([0, 1, 2])
    # the second row's first 13 tokens and the third row's first 11 are cached already (eager)
    engine(PagedBatch.of([(seq[1][:13], 0, tables[1]), (seq[2][:11], 0, tables[2])]))
    batch = PagedBatch.of([(seq[0], 0, tables[0]), (seq[1][13:], 13, tables[1]), (seq[2][11:], 11, tables[2])])
    eager = engine._layers(batch.tokens, *engine.paged(batch)).float()
    fused = prefill.layers(engine, batch.tokens, *engine.paged(batch)).float()
    # float32 reference: the eager layers in float32 on the same weights would need another engine; instead the
    # fused result is held to eager's rounding (same rounding points, other summation order)
    rel = float((fused - eager).norm() / eager.norm())
    logits_e, logits_f = engine.logits(eager.to(engine.dtype)), engine.logits(fused.to(engine.dtype))
    # the paged prefill kernel's rows (as on a GPU): the later chunks and the decode row, then every row
    kernel = {}
    _PagedAttention.FORCE_KERNEL = True
    for rows in ("later", "all"):
        engine.paged_prefill_rows = rows
        attention = engine.paged_attention(batch.block_tables, batch.starts.tolist(), batch.lengths.tolist())
        hidden = prefill.layers(engine, batch.tokens, *engine.paged(batch)).float()
        logits = engine.logits(hidden.to(engine.dtype))
        kernel[rows] = {"rows": sorted({int(r) for r in attention.kernel_tiles[:, 0]}),
                        "hidden_rel": float((hidden - eager).norm() / eager.norm()),
                        "argmax_equal": int((logits_e.argmax(-1) == logits.argmax(-1)).sum())}
    print(json.dumps({
        "format": engine.layers[0]["qkv"].format,
        "fp8_inputs": [prefill._fp8_input(engine.layers[0][k]) is not None
                       for k in ("qkv", "dense", "fc_gate", "proj")],
        "fc_gate_pair": hasattr(engine.layers[0]["fc_gate"], "halves"),  # (fc and gate apart: unequal AWQ scales)
        "tokens": int(batch.tokens.shape[0]),
        "hidden_rel": rel,
        "argmax_equal": int((logits_e.argmax(-1) == logits_f.argmax(-1)).sum()),
        "finite": bool(torch.isfinite(fused).all()),
        "kernel": kernel,
    }))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
