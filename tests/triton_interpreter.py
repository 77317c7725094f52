"""Run the fast path's Triton kernels on the CPU, through Triton's interpreter, for the CI tests.

Import this before any module that defines kernels. Triton 3.6's interpreter models bfloat16 and
FP8 with its own bit arithmetic, which rounds half-up without carrying into the exponent (124.9
becomes 64.0 in E4M3) and multiplies bfloat16 operands as raw integers. GPUs round to nearest even,
so these two conversions are replaced by torch's, which do; nothing else of the interpreter changes.
"""

from __future__ import annotations

import dataclasses
import functools
import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.semantic import TritonSemantic  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

_TORCH = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2, tl.bfloat16: torch.bfloat16,
          tl.float16: torch.float16, tl.float32: torch.float32}
_BITS = {8: torch.uint8, 16: torch.int16, 32: torch.int32}


def _convert_float(data, src_dtype, dst_dtype, rounding_mode):
    src = torch.from_numpy(np.ascontiguousarray(data)).view(_TORCH[src_dtype])
    out = src.to(_TORCH[dst_dtype]).view(_BITS[dst_dtype.primitive_bitwidth]).numpy()
    return out.view(getattr(np, f"uint{dst_dtype.primitive_bitwidth}"))


def _as_float32(handle):
    if handle.dtype.scalar in (tl.float8e4nv, tl.float8e5, tl.bfloat16):
        return _convert_float(handle.data, handle.dtype.scalar, tl.float32, None).view(np.float32)
    return handle.data


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    # Summed in float64, then rounded once: a row's result must not depend on where the row sits in the tile, as an
    # MMA's does not. A float32 np.matmul goes to OpenBLAS, whose kernels (picked by the CPU: DYNAMIC_ARCH) sum the
    # tail rows of a tile in another order than the rest: on an AMD EPYC a tree node's logits came 1 ulp from its
    # chain's in the same step (tests/spec_tree_exact_check.py), where an Intel machine's kernel gave them equal.
    # The products of float32 operands are exact in float64, so the order no longer shows.
    product = np.matmul(_as_float32(a).astype(np.float64), _as_float32(b).astype(np.float64))
    if np.issubdtype(d.data.dtype, np.floating):  # (integer dots: exact in float64, so straight to the accumulator)
        product = product.astype(np.float32)
    return interpreter.TensorHandle(product.astype(d.data.dtype) + d.data, d.dtype.scalar)


interpreter._convert_float = _convert_float
interpreter.InterpreterBuilder.create_dot = _create_dot


# Speed only, the numerics untouched: every call of a @triton.jit helper from inside a kernel patches
# triton.language again (inspect.getmembers over its modules), though the kernel's launch has patched those very
# modules already and restores them when it ends: a quarter of a fast-decode check's time went there. A helper
# whose language modules the running launch has patched runs without patching them again.
_launches: list[set[int]] = []  # per running launch: the ids of the language modules it has patched
_patch_lang = interpreter._patch_lang
_grid_call = interpreter.GridExecutor.__call__


@functools.cache
def _languages(fn) -> frozenset[int]:  # the language modules a kernel's module imports (at its top)
    return frozenset(id(value) for value in fn.__globals__.values()
                     if isinstance(value, type(tl)) and value in (tl, tl.core))


def _patch_lang_once(fn):
    languages = _languages(fn)
    if _launches and languages and languages <= _launches[-1]:
        return interpreter._LangPatchScope()  # nothing to restore: the launch's own scope restores them
    scope = _patch_lang(fn)
    if _launches:
        _launches[-1] |= languages
    return scope


def _launch(self, *args, **kwargs):
    _launches.append(set())
    try:
        return _grid_call(self, *args, **kwargs)
    finally:
        _launches.pop()


interpreter._patch_lang = _patch_lang_once
interpreter.GridExecutor.__call__ = _launch


# Speed only, the numerics untouched: every int32 add, sub and mul of a kernel is checked for overflow (the operands
# cast to int64, the operation again, two comparisons and an and) whose only use is a device_assert, and the
# interpreter's device_assert returns at once unless its options' debug is on (never, in Triton 3.6: nothing sets
# it). A third of a fast-decode check's time went to these dead checks; with debug off they are not made.
_builder_init = interpreter.InterpreterBuilder.__init__


def _without_dead_overflow_checks(builder):
    if not builder.options.debug:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


def _builder_init_unchecked(self, *args, **kwargs):
    _builder_init(self, *args, **kwargs)
    _without_dead_overflow_checks(self)


interpreter.InterpreterBuilder.__init__ = _builder_init_unchecked
_without_dead_overflow_checks(interpreter.interpreter_builder)


# Speed only, the same values: the numpy dtype of a Triton type, looked up per operand of every operation, from a
# table the original rebuilds on each call; here the original's answer, kept per scalar type.
_np_dtype_of = interpreter._get_np_dtype
_np_dtypes: dict = {}
_UINT64 = np.dtype(np.uint64)


def _get_np_dtype(tt_dtype):
    scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
    if isinstance(scalar, tl.pointer_type):
        return _UINT64
    found = _np_dtypes.get(scalar)
    if found is None:
        found = _np_dtypes[scalar] = _np_dtype_of(scalar)
    return found


interpreter._get_np_dtype = _get_np_dtype


# Speed only: every tensor and block shape the interpreter makes builds a tuple type whose printed name (only read to
# print or mangle it) cost a tenth of a check's time; the name is made when first read instead.
_tuple_type_init = tl.core.tuple_type.__init__


def _tuple_type_init_unnamed(self, types, fields=None):
    self.types = types
    self.fields = fields or [''] * len(types)


def _tuple_type_name(self, attr):
    if attr != "name":
        raise AttributeError(attr)
    self.name = '[' + ','.join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + ']'
    return self.name


assert "name" not in vars(tl.core.tuple_type) and not hasattr(tl.core.tuple_type, "__getattr__")
tl.core.tuple_type.__init__ = _tuple_type_init_unnamed
tl.core.tuple_type.__getattr__ = _tuple_type_name


# Speed only, the same types: every operation makes its result's block type anew (shape unwrapped, validated, named)
# and every tensor a Triton tuple of its shape; two fifths of a speculative check's time. A block type of a hashable
# element type and a shape is made once and kept (block types are never changed once made), and with it its tensors'
# shape tuple and element count (Triton tuples are never changed either: ``tuple._setitem`` has no caller).
_block_types: dict = {}
_block_type_init = tl.core.block_type.__init__


def _block_type_new(cls, element_ty, shape):
    if cls is tl.core.block_type:
        try:
            key = (element_ty, *(s.value if isinstance(s, tl.constexpr) else s for s in shape))
            found = _block_types.get(key)
        except TypeError:  # an unhashable element type (pointers): made each time, as before
            return object.__new__(cls)
        if found is None:
            found = _block_types[key] = object.__new__(cls)
        return found
    return object.__new__(cls)


def _block_type_init_once(self, element_ty, shape):
    if "numel" not in self.__dict__:
        _block_type_init(self, element_ty, shape)


_SCALAR_SHAPE = (tl.constexpr(1), tl.core.tuple([]))


def _tensor_init(self, handle, type):
    self.handle, self.type, self.dtype = handle, type, type.scalar
    if type.is_block():
        shaped = type.__dict__.get("_tensor_shape")
        if shaped is None:
            shape = tl.core.tuple([tl.constexpr(s) for s in type.shape])
            shaped = type._tensor_shape = (tl.constexpr(type.numel), shape)
        self.numel, self.shape = shaped
    else:
        self.numel, self.shape = _SCALAR_SHAPE


assert tl.core.block_type.__new__ is object.__new__ and tl.core.tensor.__init__.__code__.co_argcount == 3
tl.core.block_type.__new__ = _block_type_new
tl.core.block_type.__init__ = _block_type_init_once
tl.core.tensor.__init__ = _tensor_init


# Speed only, the same values: two blocks of one shape are broadcast to it anyway (Triton compares the shape tuple with
# a list, never equal), each a view of itself made through two new tensors, for every binary operation.
_broadcast_impl_value = TritonSemantic.broadcast_impl_value


def _broadcast_unless_equal(self, lhs, rhs):
    if lhs.type.is_block() and rhs.type.is_block() and lhs.type.shape == rhs.type.shape:
        return lhs, rhs
    return _broadcast_impl_value(self, lhs, rhs)


TritonSemantic.broadcast_impl_value = _broadcast_unless_equal
