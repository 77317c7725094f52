"""Run the fast path's Triton kernels on the CPU, through Triton's interpreter, for the CI tests.

Import this before any module that defines kernels. Triton 3.6's interpreter models bfloat16 and
FP8 with its own bit arithmetic, which rounds half-up without carrying into the exponent (124.9
becomes 64.0 in E4M3) and multiplies bfloat16 operands as raw integers. GPUs round to nearest even,
so these two conversions are replaced by torch's, which do; nothing else of the interpreter changes.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
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
    if src_dtype is tl.bfloat16 and dst_dtype is tl.float32:  # exact: the bits, 16 places up (torch's too, faster)
        return data.astype(np.uint32) << np.uint32(16)
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
# and every tensor a Triton tuple of its shape; two fifths of a speculative check's time. A block type of an element
# type (a pointer's by its fields) and a shape is made once and kept (block types are never changed once made), and
# with it its tensors' shape tuple and element count (Triton tuples are never changed either: ``tuple._setitem`` has
# no caller).
_block_types: dict = {}
_block_type_init = tl.core.block_type.__init__


def _block_type_new(cls, element_ty, shape):
    if cls is tl.core.block_type:
        try:
            if type(element_ty) is tl.core.pointer_type:  # (unhashable: its fields, as its __eq__ compares them)
                if element_ty.element_ty.is_ptr():
                    raise TypeError("a pointer to pointers")
                key = (element_ty.element_ty, element_ty.address_space, element_ty.const, "ptr", *shape)
            else:  # (a shape of constexprs keeps its own entry: the same type)
                key = (element_ty, *shape)
            found = _block_types.get(key)
        except TypeError:  # an unhashable element type: made each time, as before
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


# Speed only: every tl.* call inside a kernel goes through the launch's patch (interpreter._patch_attr: a lambda that
# copies the keyword arguments to set _semantic) and then through the builtin's wrapper (core.builtin: it checks that
# _semantic was given, which the patch always does). Here the patch sets _semantic and calls the builtin's own function.
_BUILTIN_WRAPPER = tl.core.builtin(lambda: None).__code__
_patch_attr = interpreter._patch_attr


def _patch_attr_direct(obj, name, member, builder, scope):
    if getattr(member, "__code__", None) is not _BUILTIN_WRAPPER:
        return _patch_attr(obj, name, member, builder, scope)
    semantic, fn = TritonSemantic(builder), member.__wrapped__

    def patched(*args, **kwargs):
        kwargs["_semantic"] = semantic
        return fn(*args, **kwargs)

    scope.set_attr(obj, name, patched)


interpreter._patch_attr = _patch_attr_direct


# Speed only, the same values: tl.core._unwrap_if_constexpr, called several times per operation, tests a value against
# list and two tuple types before constexpr; the values it mostly sees (tensors, numbers, None) first.
_unwrap = tl.core._unwrap_if_constexpr
_PLAIN = (tl.core.tensor, int, float, bool, str, type(None))


def _unwrap_if_constexpr(o):
    kind = type(o)
    if kind in _PLAIN:
        return o
    if kind is tl.core.constexpr:
        return o.value
    return _unwrap(o)


tl.core._unwrap_if_constexpr = _unwrap_if_constexpr


# Speed only, the same types: under the interpreter a type's IR type is the type itself (InterpreterBuilder.get_*_ty
# return Triton's dtypes; get_block_ty a block type of the same element and shape, made once above), yet every splat and
# cast made one anew, element type and all. A block type of a plain element type stands for itself.
_block_to_ir = tl.core.block_type.to_ir


def _block_type_to_ir(self, builder):
    if type(builder) is interpreter.InterpreterBuilder and not self.element_ty.is_ptr():
        return self
    return _block_to_ir(self, builder)


tl.core.block_type.to_ir = _block_type_to_ir


# Speed only, the same values: the broadcast of a block and a scalar (the scalar splatted to the block's shape) and of
# two blocks of different shapes (both broadcast to the common shape, each a view), made as TritonSemantic's does
# without its per-call re-derivation of the types and the common shape (kept per pair of shapes).
_common_shapes: dict = {}


def _common_shape(lhs_shape: tuple, rhs_shape: tuple):
    found = _common_shapes.get((lhs_shape, rhs_shape))
    if found is None:
        rank = max(len(lhs_shape), len(rhs_shape))
        left, right = (1,) * (rank - len(lhs_shape)) + lhs_shape, (1,) * (rank - len(rhs_shape)) + rhs_shape
        if any(a != b and a != 1 and b != 1 for a, b in zip(left, right)):
            return None  # not compatible: TritonSemantic's error
        found = _common_shapes[lhs_shape, rhs_shape] = (tuple(b if a == 1 else a for a, b in zip(left, right)),
                                                       len(left) - len(lhs_shape), len(right) - len(rhs_shape))
    return found


def _splat(value, shape: list):  # InterpreterBuilder.create_splat of a scalar's handle
    handle = value.handle
    data = np.full(shape, handle.data, dtype=_get_np_dtype(handle.dtype))
    return tl.core.tensor(interpreter.TensorHandle(data, handle.dtype.scalar), tl.core.block_type(value.type, shape))


def _broadcast_to(value, expand: int, shape: tuple):  # create_expand_dims (axis 0) ``expand`` times, create_broadcast
    data = value.handle.data
    if expand:
        data = data.reshape((1,) * expand + data.shape)
    data = np.broadcast_to(data, shape)
    block = tl.core.block_type(value.type.element_ty, list(shape))
    return tl.core.tensor(interpreter.TensorHandle(data, value.handle.dtype.scalar), block)


def _broadcast(self, lhs, rhs):
    lhs_ty, rhs_ty = lhs.type, rhs.type
    lhs_block, rhs_block = type(lhs_ty) is tl.core.block_type, type(rhs_ty) is tl.core.block_type
    if lhs_block and rhs_block:
        lhs_shape, rhs_shape = lhs_ty.shape.values, rhs_ty.shape.values
        if lhs_shape == rhs_shape:  # (Triton broadcasts each to its own shape: a view of itself)
            return lhs, rhs
        common = _common_shape(tuple(lhs_shape), tuple(rhs_shape))
        if common is not None:
            shape, lhs_expand, rhs_expand = common
            return _broadcast_to(lhs, lhs_expand, shape), _broadcast_to(rhs, rhs_expand, shape)
    elif lhs_block and not rhs_ty.is_block() and not isinstance(rhs.handle.dtype, tl.core.block_type):
        return lhs, _splat(rhs, lhs_ty.shape.values)
    elif rhs_block and not lhs_ty.is_block() and not isinstance(lhs.handle.dtype, tl.core.block_type):
        return _splat(lhs, rhs_ty.shape.values), rhs
    return _broadcast_impl_value(self, lhs, rhs)


TritonSemantic.broadcast_impl_value = _broadcast


# Speed only, the same values: a cast to the type a value has already is the value (TritonSemantic.cast's first test,
# an equality of names) and the binary operations' result type depends on the operands' types alone
# (computation_type_impl: kept per pair).
_cast = TritonSemantic.cast


def _cast_unless_same(self, input, dst_ty, fp_downcast_rounding=None):
    if input.type.scalar is dst_ty.scalar:
        return input
    return _cast(self, input, dst_ty, fp_downcast_rounding)


TritonSemantic.cast = _cast_unless_same
_computation_type = TritonSemantic.computation_type_impl
_computation_types: dict = {}


def _computation_type_once(self, a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod):
    key = (a_ty.name, a_is_scalar, b_ty.name, b_is_scalar, div_or_mod)
    found = _computation_types.get(key)
    if found is None:  # (an error: raised each time)
        found = _computation_types[key] = _computation_type(self, a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod)
    return found


TritonSemantic.computation_type_impl = _computation_type_once


# Speed only, the same values: the type checks of a binary operation (TritonSemantic.binary_op_type_checking_impl) for
# its two common cases, two tensors and a tensor with a Python int or float, done as the original does them but without
# its numbers.Number tests (an ABC's) and without making the Python number's constant twice (once at its own type,
# thrown away, once at the result type). Pointers, bools and anything else: the original.
_checking = TritonSemantic.binary_op_type_checking_impl


def _number_type(x):  # TritonSemantic.to_tensor's type for a Python int or float
    if type(x) is int:
        if -2**31 <= x < 2**31:
            return tl.int32
        if 2**31 <= x < 2**32:
            return tl.uint32
        if -2**63 <= x < 2**63:
            return tl.int64
        return tl.uint64 if 2**63 <= x < 2**64 else None
    if x != x or x in (0.0, float("inf"), float("-inf")) or 2**-126 <= abs(x) <= (2 - 2**-23) * 2**127:
        return tl.float32
    return tl.float64


def _with_number(self, t, x, number_first: bool, div_or_mod: bool):
    """``t`` (a tensor of a non-pointer type) and the Python number ``x`` as the original leaves them, or None for
    the original to do (or to raise)."""
    x_ty, t_ty = _number_type(x), t.type.scalar
    if x_ty is None:
        return None
    ret = (self.computation_type_impl(x_ty, True, t_ty, False, div_or_mod) if number_first else
           self.computation_type_impl(t_ty, False, x_ty, True, div_or_mod))
    if ret.is_int() and (x < 0 and ret.is_int_unsigned() or
                         not ret.get_int_min_value() <= x <= ret.get_int_max_value()):
        return None
    x, t = self.scalar_constant(x, dtype=ret), self.cast(t, ret)
    return self.broadcast_impl_value(x, t) if number_first else self.broadcast_impl_value(t, x)


def _checking_fast(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False, arithmetic_check=True,
                   div_or_mod=False):
    lhs_kind, rhs_kind = type(lhs), type(rhs)
    if lhs_kind is tl.core.tensor and rhs_kind is tl.core.tensor:
        lhs_sca_ty, rhs_sca_ty = lhs.type.scalar, rhs.type.scalar
        self.check_ptr_type_impl(lhs_sca_ty, rhs_sca_ty, allow_lhs_ptr)
        self.check_ptr_type_impl(rhs_sca_ty, lhs_sca_ty, allow_rhs_ptr)
        if arithmetic_check and not lhs_sca_ty.is_ptr() and not rhs_sca_ty.is_ptr():
            ret_sca_ty = self.computation_type_impl(lhs_sca_ty, False, rhs_sca_ty, False, div_or_mod)
            lhs, rhs = self.cast(lhs, ret_sca_ty), self.cast(rhs, ret_sca_ty)
        return self.broadcast_impl_value(lhs, rhs)
    if arithmetic_check:
        done = None
        if lhs_kind is tl.core.tensor and rhs_kind in (int, float) and not lhs.type.scalar.is_ptr():
            done = _with_number(self, lhs, rhs, False, div_or_mod)
        elif rhs_kind is tl.core.tensor and lhs_kind in (int, float) and not rhs.type.scalar.is_ptr():
            done = _with_number(self, rhs, lhs, True, div_or_mod)
        if done is not None:
            return done
    return _checking(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)


TritonSemantic.binary_op_type_checking_impl = _checking_fast


# Speed only, the same answers: dtype's kind tests, each a membership in a list built anew per call (SINT + UINT).
_names = tl.core.dtype
_INT, _SINT, _UINT = (frozenset(_names.SINT_TYPES + _names.UINT_TYPES), frozenset(_names.SINT_TYPES),
                      frozenset(_names.UINT_TYPES))
_FP, _STANDARD_FP = frozenset(_names.FP_TYPES), frozenset(_names.STANDARD_FP_TYPES)
tl.core.dtype.is_int = lambda self: self.name in _INT
tl.core.dtype.is_int_signed = lambda self: self.name in _SINT
tl.core.dtype.is_int_unsigned = lambda self: self.name in _UINT
tl.core.dtype.is_floating = lambda self: self.name in _FP
tl.core.dtype.is_standard_floating = lambda self: self.name in _STANDARD_FP


# Speed only: the interpreter wraps every assignment in a kernel in to_tensor (ASTTransformer.visit_Assign), which
# tests bool, int, float and constexpr before it finds the tensor it mostly is.
_to_tensor = TritonSemantic.to_tensor


def _to_tensor_fast(self, x, check_type: bool = True):
    return x if type(x) is tl.core.tensor else _to_tensor(self, x, check_type)


TritonSemantic.to_tensor = _to_tensor_fast


# Speed only, the same integers: two GPU instructions the kernels emulate for the interpreter in a dozen interpreted
# operations or more a call (half of a GEMV check's time), run here as the GPU runs them, as one operation each, on the
# tensors' numpy arrays; the kernels around them run unchanged. dp4a (cuda/dp4a.py): c + the sum of the four byte
# products of a and b (int32, wrapping), bytes unsigned or, with A_SIGNED / B_SIGNED, sign-extended. prmt
# (quant_gemv_w4a8.py, PTX's prmt.b32): byte i of the result is byte sel[4i+2:4i] of {b, a}, or where sel's bit 4i+3
# is set, that byte's sign replicated. Any other call (not int32 blocks, or the PTX path): the kernels' own code.
_BYTE_SHIFTS = np.arange(0, 32, 8, dtype=np.int32)


def _word_bytes(words: np.ndarray, signed: bool) -> np.ndarray:
    w = words[..., None]
    return (w << (24 - _BYTE_SHIFTS)) >> 24 if signed else (w >> _BYTE_SHIFTS) & 0xFF


def _int32_blocks(*values) -> bool:
    return all(type(v) is tl.core.tensor and v.type.is_block() and v.dtype is tl.int32 for v in values)


def _int32_tensor(data: np.ndarray):
    return tl.core.tensor(interpreter.TensorHandle(data, tl.int32), tl.core.block_type(tl.int32, list(data.shape)))


def _dp4a(emulated):
    def dp4a(a, b, c, B_SIGNED, ASM, A_SIGNED=False):
        if tl.core._unwrap_if_constexpr(ASM) or not _int32_blocks(a, b, c):
            return emulated(a, b, c, B_SIGNED, ASM, A_SIGNED)
        a_signed, b_signed = (bool(tl.core._unwrap_if_constexpr(s)) for s in (A_SIGNED, B_SIGNED))
        products = _word_bytes(a.handle.data, a_signed) * _word_bytes(b.handle.data, b_signed)
        return _int32_tensor((c.handle.data + products.sum(-1, dtype=np.int32)).astype(np.int32, copy=False))

    return dp4a


def _prmt(emulated):
    def prmt(a, b, sel, ASM):
        if tl.core._unwrap_if_constexpr(ASM) or not _int32_blocks(a, b, sel):
            return emulated(a, b, sel, ASM)
        pair = (b.handle.data.astype(np.int64) << 32) | (a.handle.data.astype(np.int64) & 0xFFFFFFFF)
        selectors = sel.handle.data
        out = np.zeros(selectors.shape, dtype=np.int32)
        for i in range(4):
            nibble = (selectors >> (4 * i)) & 0xF
            byte = ((pair >> ((nibble & 7) * 8).astype(np.int64)) & 0xFF).astype(np.int32)
            byte = np.where((nibble & 8) != 0, np.where(byte >= 128, 255, 0), byte).astype(np.int32)
            out = out | (byte << (8 * i))
        return _int32_tensor(out)

    return prmt


_NATIVE = {("trtllm_pipeline.runtimes.torch_engine.cuda.dp4a", "dp4a", ("a", "b", "c", "B_SIGNED", "ASM", "A_SIGNED")):
           _dp4a,
           ("trtllm_pipeline.runtimes.torch_engine.cuda.quant_gemv_w4a8", "prmt", ("a", "b", "sel", "ASM")): _prmt}
_rewrite = interpreter.InterpretedFunction.rewrite


def _rewrite_native(self):
    found = self.rewritten_fn.get(self.fn)
    if found is None:
        found = _rewrite(self)  # (kept: the emulation, for the calls the native one leaves to it)
        fn = self.fn
        native = _NATIVE.get((fn.__module__, fn.__qualname__, tuple(inspect.signature(fn).parameters)))
        if native is not None:
            found = self.rewritten_fn[fn] = native(found)
    return found


interpreter.InterpretedFunction.rewrite = _rewrite_native
