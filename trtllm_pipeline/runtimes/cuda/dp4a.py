"""The integer dot-product instruction that both INT4 GEMVs (quant_gemv, quant_gemv_ws) are built on."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dp4a(a, b, c, B_SIGNED: tl.constexpr, ASM: tl.constexpr):
    """``c + sum_i a_i b_i`` over the four bytes of int32 ``a`` (unsigned) and ``b`` (signed or unsigned): one
    dp4a instruction on the GPU; the same sum from shifts in Triton's interpreter, which cannot run PTX."""
    if ASM:
        if B_SIGNED:
            c = tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                          is_pure=True, pack=1)
        else:
            c = tl.inline_asm_elementwise("dp4a.u32.u32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                          is_pure=True, pack=1)
    else:
        for i in tl.static_range(4):
            if B_SIGNED:
                bi = (b << (24 - 8 * i)) >> 24
            else:
                bi = (b >> (8 * i)) & 0xFF
            c += ((a >> (8 * i)) & 0xFF) * bi
    return c
