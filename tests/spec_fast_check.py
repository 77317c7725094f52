"""Run by tests/test_fast_decode.py in a subprocess: speculative decoding's verify step on the CUDA fast path, through
Triton's interpreter on the CPU (as fast_decode_check.py), against eager decoding without speculation, also with
tokens banned (min_tokens' end id, a bad word) at the verified positions. Prints JSON.

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
    # two batch buckets, each run once when prepared: 2 (plain decode, the two requests) and the verify bucket of a
    # full batch, 8 rows (2 requests x (1 + 3) tokens)
    args = dict(device="cpu", dtype="bfloat16", max_batch_size=2, max_seq_len=128, kv_block_size=4,
                graph_batch_sizes=[2])
    eager = TorchRuntime(ckpt, ckpt / "tokenizer", fast_decode=False, **args)
    expected = greedy(eager, 6)
    # Bans at verification (the in-step argmax knows none: rows with bans take the argmax of their masked logits):
    # request 0 with the end id its second token, banned to the end (min_tokens = max_tokens), which the oracle
    # drafts; request 1 with the bad word of its tokens 3 and 4, both drafted in one row (the oracle lies at 2 and 5)
    tok = eager.tokenizer
    word = tok.decode(expected[1][3:5])
    banned_params = [SamplingParams(max_tokens=6, min_tokens=6, end_id=expected[0][1]),
                     SamplingParams(max_tokens=6, end_id=-1, bad_words=(word,))]
    banned_expected = [c.token_ids for c in eager.generate(PROMPTS, banned_params)]
    fast = TorchRuntime(ckpt, ckpt / "tokenizer", fast_decode=True, speculative=oracle_settings(expected, 3), **args)
    verify_ready = sorted(fast.decoder.verify_buffers) == fast.decoder.buckets  # at load, not in generation
    calls = {"verify": 0}
    verify = fast.decoder.verify

    def counted(*a):
        calls["verify"] += 1
        return verify(*a)

    fast.decoder.verify = counted
    out = greedy(fast, 6)
    fast.kv.check()
    stats = fast.stats()
    steps = calls["verify"]
    banned_fast = [c.token_ids for c in fast.generate(PROMPTS, banned_params)]
    fast.kv.check()
    after = fast.stats()
    print(json.dumps({"decode_path": fast.decode_path, "verify_ready": verify_ready, "expected": expected, "fast": out,
                      "verify_steps": steps, "accepted": stats["spec_decode_accepted_tokens"],
                      "drafted": stats["spec_decode_draft_tokens"], "blocks_back": fast.kv.free_blocks
                      == fast.kv.usable_blocks,
                      "word_ids": tok.encode(word, add_special_tokens=False),
                      "banned_expected": banned_expected, "banned_fast": banned_fast,
                      "banned_verify_steps": calls["verify"] - steps,
                      "banned_accepted": after["spec_decode_accepted_tokens"] - stats["spec_decode_accepted_tokens"]}))


if __name__ == "__main__":
    main()
