"""Run by tests/test_fast_decode.py in a subprocess: the INT4 GEMV's prepared input (runtimes/torch_engine/cuda/gemv_input.py)
written by its standalone kernel through Triton's interpreter, read back from the planes and compared with
``gemv_input.reference``. Prints JSON: one row per (dtype, block)."""

from __future__ import annotations

import json

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch

from trtllm_pipeline.runtimes.torch_engine.cuda import gemv_input


def planes_values(planes: torch.Tensor, k: int, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_int, C, 2^E) read back from one prepared row."""
    hi = planes[: k // 4].contiguous().view(torch.int8).to(torch.int32)
    lo = planes[k // 4: k // 2].contiguous().view(torch.uint8).to(torch.int32)
    c = planes[k // 2: k // 2 + k // block]
    step = planes[k // 2 + k // block:].contiguous().view(torch.float32)
    return 256 * hi + lo, c, step


def case(dtype: torch.dtype, block: int, k: int = 256) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, k, generator=gen) * 2
    x[0, :block] = torch.linspace(-1, 1, block) * 2.0 ** torch.linspace(-20, 0, block)  # one wide block
    x[0, block:2 * block] = 0  # and a zero one
    x = x.to(dtype)
    pqs = (0.5 + torch.rand(k, generator=gen)).to(dtype)
    p = gemv_input.prepare(x, gemv_input.empty(1, k, block, pqs, "cpu"), dtype)
    x_in = (x * pqs).to(dtype).float()  # the consumer's input, as the eager product rounds it
    want = gemv_input.reference(x_in, block)[0]
    x_int, c, step = planes_values(p.planes[0], k, block)
    got = (x_int.reshape(-1, block).float() * step[:, None]).reshape(-1)
    blocks_in, blocks_want = x_in[0].reshape(-1, block), want.reshape(-1, block)
    amax = blocks_in.abs().amax(1)
    err = (blocks_want - blocks_in).abs().amax(1)
    spread = amax / torch.where(blocks_in != 0, blocks_in.abs(), amax[:, None]).amin(1)
    narrow = spread < 2 ** 7
    return {"dtype": str(dtype).removeprefix("torch."), "block": block,
            "planes_equal_reference": bool(torch.equal(got, want)),
            "block_sums_equal": bool(torch.equal(c, -8 * x_int.reshape(-1, block).sum(1))),
            "max_error_over_block_max": float((err / torch.where(amax > 0, amax, 1)).max()),
            "narrow_blocks_exact": bool((err[narrow] == 0).all()), "narrow_blocks": int(narrow.sum()),
            "wide_block_inexact": bool(err[0] > 0), "zero_block_zero": bool((got[block:2 * block] == 0).all())}


def main() -> None:
    print(json.dumps([case(dt, b) for dt in (torch.bfloat16, torch.float16) for b in (16, 8)]))


if __name__ == "__main__":
    main()
