"""The integer dot-product instruction that the GEMVs (quant_gemv, quant_gemv_ws, quant_gemv_int8) are built on."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dp4a(a, b, c, B_SIGNED: tl.constexpr, ASM: tl.constexpr, A_SIGNED: tl.constexpr = False):
    """``c + sum_i a_i b_i`` over the four bytes of int32 ``a`` (unsigned, or A_SIGNED) and ``b`` (signed or
    unsigned): one dp4a instruction on the GPU; in Triton's interpreter, which cannot run PTX, the same exact sum from
    the words' bytes (``_word_bytes``)."""
    if ASM:
        if A_SIGNED and B_SIGNED:  # (int8 weights against int8 inputs, or a high-byte plane: quant_gemv_int8)
            c = tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                          is_pure=True, pack=1)
        elif A_SIGNED:  # (int8 weights against a low-byte plane)
            c = tl.inline_asm_elementwise("dp4a.s32.u32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                          is_pure=True, pack=1)
        elif B_SIGNED:
            c = tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                          is_pure=True, pack=1)
        else:
            c = tl.inline_asm_elementwise("dp4a.u32.u32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                          is_pure=True, pack=1)
    else:
        c += tl.sum(_word_bytes(a, A_SIGNED) * _word_bytes(b, B_SIGNED), axis=len(a.shape))
    return c


@triton.jit
def _word_bytes(w, SIGNED: tl.constexpr):
    """The four bytes of each int32 word of ``w`` along a new last axis, sign-extended or not: the interpreter's
    dp4a in a few whole-tile operations (the interpreter's cost is per operation, not per element)."""
    R: tl.constexpr = len(w.shape)
    shifts = tl.reshape(tl.arange(0, 4) * 8, [1] * R + [4])
    if SIGNED:
        return (tl.expand_dims(w, R) << (24 - shifts)) >> 24
    return (tl.expand_dims(w, R) >> shifts) & 0xFF
