"""Run by tests/test_fast_decode.py in a subprocess: the step's greedy-token kernel (runtimes/torch_engine/cuda/greedy.py)
through Triton's interpreter, against torch.argmax, on rows where the maximum sits in the first or last part of
the row, where it appears twice (the first is taken), where every logit is equal, and on widths that leave a
short last part, with the counters left at zero for the next launch; then with a token banned on some rows (the
argmax of the rest, by the kernel and by ``argmax_torch``). Prints JSON.

    python tests/greedy_check.py
"""

from __future__ import annotations

import json

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch

from trtllm_pipeline.runtimes.torch_engine.cuda import greedy


def main() -> None:
    gen = torch.Generator().manual_seed(3)
    cases = []
    for width in (151936, 152064, 1000, 2 * greedy.CPU_BLOCK + 7):  # (the parts and blocks the interpreter runs)
        logits = torch.randn(5, width, generator=gen)
        logits[1, 0] = 50.0  # in the first part
        logits[2, width - 1] = 50.0  # in the last (short) part
        logits[3, 3] = logits[3, width // 2] = 60.0  # twice, parts apart: the first
        logits[4] = -2.5  # all equal: index 0
        out = greedy.Greedy.empty(torch.full((5,), -1, dtype=torch.long))
        greedy.argmax(logits, out)
        # bans (a row's end id before min_tokens): row 1's maximum skipped, row 3's first maximum (its second then
        # wins), row 4's index 0 (all equal: index 1), none on rows 0 and 2; torch's argmax of the masked logits
        ban = torch.tensor([-1, 0, -1, 3, 0])
        banned = greedy.Greedy.empty(torch.full((5,), -1, dtype=torch.long))
        greedy.argmax(logits, banned, ban=ban)
        masked = logits.clone()
        masked[[1, 3, 4], [0, 3, 0]] = float("-inf")
        by_torch = torch.full((5,), -1, dtype=torch.long)
        greedy.argmax_torch(logits, by_torch, ban)
        cases.append({"width": width, "tokens": out.tokens.tolist(), "torch": logits.argmax(-1).tolist(),
                      "counters_left_zero": bool((out.counters == 0).all()), "banned": banned.tokens.tolist(),
                      "banned_torch": masked.argmax(-1).tolist(), "argmax_torch": by_torch.tolist()})
    print(json.dumps(cases))


if __name__ == "__main__":
    main()
