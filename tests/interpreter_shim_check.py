"""tests/triton_interpreter.py runs two GPU instructions the kernels emulate for the interpreter (cuda/dp4a.py's dp4a,
quant_gemv_w4a8's prmt) as one numpy operation each: here a kernel calling both, every sign combination of dp4a, on
seeded random words (extremes included), run once through the shim and once through the kernels' own emulations
(the shim's table emptied); prints the two runs' mismatch counts as JSON. Run with tests/interpreter_site on the
path."""

from __future__ import annotations

import json

import triton_interpreter  # noqa: F401  (first: the interpreter and its shim)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.cuda.dp4a import dp4a  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_w4a8 import prmt  # noqa: E402

N = 256


@triton.jit
def _kernel(a_ptr, b_ptr, c_ptr, sel_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    a, b, c, sel = tl.load(a_ptr + i), tl.load(b_ptr + i), tl.load(c_ptr + i), tl.load(sel_ptr + i)
    tl.store(out_ptr + i, dp4a(a, b, c, False, False))
    tl.store(out_ptr + N + i, dp4a(a, b, c, True, False))
    tl.store(out_ptr + 2 * N + i, dp4a(a, b, c, False, False, True))
    tl.store(out_ptr + 3 * N + i, dp4a(a, b, c, True, False, True))
    tl.store(out_ptr + 4 * N + i, prmt(a, b, sel, False))


def run(words) -> torch.Tensor:
    out = torch.zeros(5 * N, dtype=torch.int32)
    _kernel[(1,)](*words, out, N=N)
    return out


def main() -> None:
    g = torch.Generator().manual_seed(7)
    words = [torch.randint(-2**31, 2**31, (N,), dtype=torch.int64, generator=g).to(torch.int32) for _ in range(4)]
    for w in words[:3]:  # the extremes: all bytes 0x00, 0x7F, 0x80, 0xFF
        w[:4] = torch.tensor([0, 0x7F7F7F7F, -0x7F7F7F80, -1], dtype=torch.int32)
    words[3] &= 0xFFFF  # prmt's selectors: four nibbles
    cache = interpreter.InterpretedFunction.rewritten_fn

    def ran() -> list[str]:  # what each instruction ran as: the shim's closure, or the kernels' rewritten function
        return [cache[f.fn].__qualname__ for f in (dp4a, prmt)]

    native = run(words)
    native_ran = ran()
    saved = dict(triton_interpreter._NATIVE)
    triton_interpreter._NATIVE.clear()
    cache.clear()
    emulated = run(words)
    emulated_ran = ran()
    triton_interpreter._NATIVE.update(saved)
    parts = ["dp4a_uu", "dp4a_us", "dp4a_su", "dp4a_ss", "prmt"]
    print(json.dumps({"mismatches": {p: int((native[i * N:(i + 1) * N] != emulated[i * N:(i + 1) * N]).sum())
                                     for i, p in enumerate(parts)},
                      "native_ran": native_ran, "emulated_ran": emulated_ran,
                      "distinct_outputs": int(native.unique().numel())}))


if __name__ == "__main__":
    main()
