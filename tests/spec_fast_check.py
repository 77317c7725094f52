"""Run by tests/test_fast_decode.py in a subprocess: speculative decoding's verify step on the CUDA fast path, through
Triton's interpreter on the CPU (as fast_decode_check.py), against eager decoding without speculation. Prints JSON.

    python tests/spec_fast_check.py CHECKPOINT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import triton_interpreter  # noqa: F401  (before any kernel module is imported)

from spec_oracle import oracle_settings
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

PROMPTS = [list(range(300, 305)), list(range(900, 940))]


def greedy(rt: TorchRuntime, n: int) -> list[list[int]]:
    return [c.token_ids for c in rt.generate(PROMPTS, SamplingParams(max_tokens=n, end_id=-1))]


def main() -> None:
    ckpt = Path(sys.argv[1])
    # one batch bucket (8 rows: 2 requests x (1 + 3) tokens): the interpreter compiles and runs each bucket once
    args = dict(device="cpu", dtype="bfloat16", max_batch_size=8, max_seq_len=128, kv_block_size=4,
                graph_batch_sizes=[8])
    expected = greedy(TorchRuntime(ckpt, ckpt / "tokenizer", fast_decode=False, **args), 6)
    fast = TorchRuntime(ckpt, ckpt / "tokenizer", fast_decode=True, speculative=oracle_settings(expected, 3), **args)
    calls = {"verify": 0}
    verify = fast.decoder.verify

    def counted(*a):
        calls["verify"] += 1
        return verify(*a)

    fast.decoder.verify = counted
    out = greedy(fast, 6)
    fast.kv.check()
    stats = fast.stats()
    print(json.dumps({"decode_path": fast.decode_path, "expected": expected, "fast": out,
                      "verify_steps": calls["verify"], "accepted": stats["spec_decode_accepted_tokens"],
                      "drafted": stats["spec_decode_draft_tokens"], "blocks_back": fast.kv.free_blocks
                      == fast.kv.usable_blocks}))


if __name__ == "__main__":
    main()
