"""Every op graphopt knows, declared once: type rule, numpy semantics, attributes and traits
(see registry.py). What other layers know of an op lives with them, one entry per op: its VJP
in graphopt/autodiff/rules.py, its element lowering in graphopt/backends/llvm/lowering.py.

Type rules are strict, as in MLIR: the inputs of an elementwise op share one dtype (the
frontend casts weakly typed Python scalars first, see docs/ir.md "Python scalars") and their
shapes broadcast as in numpy.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import OpTypeError
from . import blas, libm
from .registry import (BOOL_ATTR, CONSTANT, CONTROL, DTYPE_ATTR, EFFECT, ELEMENTWISE, INDEX,
                       INT_ATTR, INTS_ATTR, LINALG, NN, REDUCTION, SHAPE, SHAPE_ATTR, VALUE_ATTR,
                       Decomposition, Emit, OpDef, at_least, register)
from .types import (DType, RowsArray, RowsType, TensorType, Type, bf16, bool_,
                    contiguous_strides, f16, to_dtype, token, value_problem)

NUM = ("float", "int")
FLOAT = ("float",)
BOOL = ("bool",)
ANY = ("float", "int", "bool")


# -- type-rule helpers ------------------------------------------------------------------------
def _tensors(op: str, types: Sequence[Type], n: int) -> list[TensorType]:
    if len(types) != n:
        raise OpTypeError(f"{op} takes {n} input{'s' * (n != 1)}, got {len(types)}")
    for t in types:
        if isinstance(t, RowsType):
            raise OpTypeError(f"{op}: a row gradient ({t}) is not a tensor operand (take its "
                              f"values with rows_values, or make it dense with densify)")
        if not isinstance(t, TensorType):
            raise OpTypeError(f"{op}: an effect token is not a tensor operand "
                              f"(use it in after(...) to order, not as data)")
    return list(types)  # type: ignore[arg-type]


def _broadcast(op: str, types: Sequence[TensorType]) -> tuple[int, ...]:
    first = types[0].shape
    if all(t.shape == first for t in types):  # the common case, without numpy's machinery
        return first
    try:
        return tuple(np.broadcast_shapes(*(t.shape for t in types)))
    except ValueError:
        shown = ", ".join(str(t) for t in types)
        raise OpTypeError(f"{op}: shapes do not broadcast: {shown}") from None


def _one_dtype(op: str, types: Sequence[TensorType], kinds: tuple[str, ...]) -> DType:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        shown = ", ".join(str(t) for t in types)
        raise OpTypeError(f"{op}: inputs have different dtypes: {shown}; "
                          f"cast one with .astype(...)")
    (d,) = dtypes
    if d.kind not in kinds:
        raise OpTypeError(f"{op}: dtype {d} is not supported (takes {' or '.join(kinds)} dtypes)")
    return d


def _elementwise(name: str, n: int, impl: Callable[..., Any], kinds: tuple[str, ...],
                 result: DType | None = None, doc: str = "", commutative: bool = False) -> OpDef:
    def infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
        ts = _tensors(name, types, n)
        d = _one_dtype(name, ts, kinds)
        return [TensorType(_broadcast(name, ts), result or d)]
    return register(OpDef(name, ELEMENTWISE, infer, impl, doc=doc, commutative=commutative,
                          fixed_dtype=result is not None))


# -- elementwise --------------------------------------------------------------------------------
_elementwise("add", 2, np.add, NUM, commutative=True)
_elementwise("subtract", 2, np.subtract, NUM)
_elementwise("multiply", 2, np.multiply, NUM, commutative=True)
_elementwise("divide", 2, np.divide, FLOAT)
_elementwise("power", 2, libm.power, NUM)  # the C library's pow on every CPU: see libm.py
# maximum and minimum: x where it wins or is NaN, else y. NaN-propagating like numpy's, and of
# two values that compare equal (+0 and -0) always the second: numpy's own loops choose by dtype
# and SIMD level; this, and the LLVM lowering, choose alike on every CPU.
def _maximum(x: Any, y: Any) -> Any:
    return np.where((x > y) | (x != x), x, y)


def _minimum(x: Any, y: Any) -> Any:
    return np.where((x < y) | (x != x), x, y)


_elementwise("maximum", 2, _maximum, NUM, doc="NaN-propagating, like numpy.maximum")
_elementwise("minimum", 2, _minimum, NUM, doc="NaN-propagating, like numpy.minimum")
_elementwise("negative", 1, np.negative, NUM)
_elementwise("abs", 1, np.abs, NUM)
_elementwise("sign", 1, np.sign, NUM)  # piecewise constant: zero gradient
_elementwise("sqrt", 1, np.sqrt, FLOAT)
_elementwise("rsqrt", 1, lambda x: np.reciprocal(np.sqrt(x)), FLOAT, doc="1 / sqrt(x)")
_elementwise("exp", 1, np.exp, FLOAT)
_elementwise("log", 1, np.log, FLOAT)
_elementwise("sin", 1, np.sin, FLOAT)
_elementwise("cos", 1, np.cos, FLOAT)
_elementwise("isfinite", 1, np.isfinite, ANY, result=bool_)
_elementwise("less", 2, np.less, NUM, result=bool_)
_elementwise("less_equal", 2, np.less_equal, NUM, result=bool_)
_elementwise("greater", 2, np.greater, NUM, result=bool_)
_elementwise("greater_equal", 2, np.greater_equal, NUM, result=bool_)
_elementwise("equal", 2, np.equal, ANY, result=bool_, commutative=True)
_elementwise("not_equal", 2, np.not_equal, ANY, result=bool_, commutative=True)
_elementwise("logical_and", 2, np.logical_and, BOOL, commutative=True)
_elementwise("logical_or", 2, np.logical_or, BOOL, commutative=True)
_elementwise("logical_not", 1, np.logical_not, BOOL)


def _where_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    cond, x, y = _tensors("where", types, 3)
    if cond.dtype != bool_:
        raise OpTypeError(f"where: the condition must be bool, got {cond}")
    d = _one_dtype("where", [x, y], ANY)
    return [TensorType(_broadcast("where", [cond, x, y]), d)]


register(OpDef("where", ELEMENTWISE, _where_infer, np.where,
               doc="where(cond, x, y): x where cond is true, else y", dtype_group=(1, 2)))


def _cast_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    (x,) = _tensors("cast", types, 1)
    return [TensorType(x.shape, to_dtype(attrs["dtype"]))]


register(OpDef("cast", ELEMENTWISE, _cast_infer,
               lambda x, dtype: x.astype(to_dtype(dtype).np_dtype), attrs=("dtype",),
               attr_kinds=(DTYPE_ATTR,),
               doc="convert to dtype (floats to ints truncate toward zero, like numpy)",
               fixed_dtype=True))


# -- reductions ---------------------------------------------------------------------------------
def _check_axes(op: str, axes: Any, ndim: int) -> tuple[int, ...]:
    axes = tuple(axes)
    if any(not isinstance(a, (int, np.integer)) or not 0 <= a < ndim for a in axes) \
            or len(set(axes)) != len(axes) or list(axes) != sorted(axes):
        raise OpTypeError(f"{op}: axes {list(axes)} must be distinct, sorted, in [0, {ndim})")
    return axes


def _reduction(name: str, impl: Callable[..., Any], kinds: tuple[str, ...],
               identity: bool = True) -> OpDef:
    """`identity`: whether the reduction of no elements is defined (a sum's 0, a mean's NaN
    as numpy gives it); a max of none is an error, at trace time, in every mode."""
    def infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
        (x,) = _tensors(name, types, 1)
        _one_dtype(name, [x], kinds)
        axes = _check_axes(name, attrs["axes"], x.ndim)
        if not identity and any(x.shape[a] == 0 for a in axes):
            raise OpTypeError(f"{name} over an empty axis of {x}: a {name} of no elements "
                              f"is undefined")
        if attrs["keepdims"]:
            shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
        else:
            shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
        return [TensorType(shape, x.dtype)]

    def into(out: np.ndarray | None, x: np.ndarray, axes: tuple[int, ...], keepdims: bool
             ) -> np.ndarray:
        # numpy adds in memory order: C order, as eager mode holds values, so a transposed
        # value sums alike in both
        x = np.asarray(x, order="C")
        if x.dtype in _HALVES:
            # f16 and bf16 accumulate in f32 and round once (numpy does so for f16 only; a
            # bf16 sum in bf16 stops growing after a few hundred elements)
            r = impl(x.astype(np.float32), axis=tuple(axes), keepdims=keepdims).astype(x.dtype)
            return r if out is None else np.copyto(out, r) or out
        return impl(x, axis=tuple(axes), keepdims=keepdims, out=out)

    def run(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        return into(None, x, axes, keepdims)

    return register(OpDef(name, REDUCTION, infer, run, attrs=("axes", "keepdims"),
                          attr_kinds=(INTS_ATTR, BOOL_ATTR), into=into))


_HALVES = (f16.np_dtype, bf16.np_dtype)


_reduction("sum", np.sum, NUM)
_reduction("max", np.max, NUM, identity=False)
_reduction("mean", np.mean, FLOAT)


# -- shape ops ----------------------------------------------------------------------------------
def _reshape_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    (x,) = _tensors("reshape", types, 1)
    out = TensorType(tuple(attrs["shape"]), x.dtype)
    if any(s < 0 for s in out.shape) or out.size != x.size:
        raise OpTypeError(f"reshape: cannot reshape {x} ({x.size} elements) to {list(out.shape)}")
    return [out]


def _broadcast_to_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    (x,) = _tensors("broadcast_to", types, 1)
    shape = tuple(attrs["shape"])
    if _broadcast("broadcast_to", [x, TensorType(shape, x.dtype)]) != shape:
        raise OpTypeError(f"broadcast_to: {x} does not broadcast to {list(shape)}")
    return [TensorType(shape, x.dtype)]


def _transpose_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    (x,) = _tensors("transpose", types, 1)
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(x.ndim)):
        raise OpTypeError(f"transpose: perm {list(perm)} is not a permutation of the "
                          f"{x.ndim} axes of {x}")
    return [TensorType(tuple(x.shape[p] for p in perm), x.dtype)]


# -- views: how a shape op's result lies in its input's memory (OpDef.view) -------------------
def _squeezed(shape: Sequence[int]) -> list[int]:
    return [n for n in shape if n != 1]


def _unit_axes_view(shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int]
                    ) -> tuple[int, ...]:
    """The strides of `out_shape`, which is `shape` with axes of size 1 dropped or added: the
    other axes keep theirs, in order (an axis of size 1 is never stepped along)."""
    kept = iter(s for n, s in zip(shape, strides) if n != 1)
    return tuple(0 if n == 1 else next(kept) for n in out_shape)


def _reshape_view(shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int],
                  attrs: dict[str, Any]) -> tuple[int, tuple[int, ...]] | None:
    if _squeezed(shape) == _squeezed(out_shape):
        return 0, _unit_axes_view(shape, strides, out_shape)
    kept = [(n, s) for n, s in zip(shape, strides) if n != 1]
    dense = contiguous_strides(tuple(n for n, _ in kept))
    if math.prod(shape) == 0 or all(s == d for (_, s), d in zip(kept, dense)):
        return 0, contiguous_strides(tuple(out_shape))
    return None  # a strided input regrouped: numpy copies, and so must a backend


def _transpose_view(shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int],
                    attrs: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
    return 0, tuple(strides[p] for p in attrs["perm"])


def _broadcast_to_view(shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int],
                       attrs: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
    lead = len(out_shape) - len(shape)
    return 0, (0,) * lead + tuple(0 if n == 1 else s for n, s in zip(shape, strides))


def _identity_view(shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int],
                   attrs: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
    return 0, tuple(strides)


# (The array's own reshape and transpose: np.reshape's and np.transpose's dispatch costs more
# than the view they make, and a step runs such views between every two matmuls.)
register(OpDef("reshape", SHAPE, _reshape_infer,
               lambda x, shape: np.asarray(x).reshape(shape), attrs=("shape",),
               attr_kinds=(SHAPE_ATTR,), view=_reshape_view))
register(OpDef("broadcast_to", SHAPE, _broadcast_to_infer,
               lambda x, shape: np.broadcast_to(x, tuple(shape)), attrs=("shape",),
               attr_kinds=(SHAPE_ATTR,),
               view=_broadcast_to_view))
register(OpDef("transpose", SHAPE, _transpose_infer,
               lambda x, perm: np.asarray(x).transpose(perm), attrs=("perm",),
               attr_kinds=(INTS_ATTR,),
               view=_transpose_view))


# -- slice and slice_scatter: basic indexing ------------------------------------------------------
# Along each axis the elements range(start, stop, step), Python's range: 0 <= start <= n,
# -1 <= stop <= n (-1: past the first element, for a negative step), step != 0; no wrap-around
# (the frontend resolves x[-1] and x[::-1] to this form). A slice's result may drop or add
# axes of size 1 (x[0], x[:, None]), as MLIR's rank-reducing extract_slice drops them.
def _slice_counts(op: str, x: TensorType, attrs: dict[str, Any]) -> tuple[int, ...]:
    starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise OpTypeError(f"{op}: starts, stops and steps need one entry per axis of {x}, got "
                          f"{len(starts)}, {len(stops)} and {len(steps)}")
    counts = []
    for axis, (n, a, b, c) in enumerate(zip(x.shape, starts, stops, steps)):
        r = range(a, b, c) if c else range(0)
        inside = 0 <= a <= n and -1 <= b <= n and (not r or 0 <= r[0] < n and 0 <= r[-1] < n)
        if c == 0 or not inside:
            raise OpTypeError(f"{op}: axis {axis} of {x}: range({a}, {b}, {c}) is not a slice "
                              f"of {n} elements (0 <= start <= {n}, -1 <= stop <= {n}, "
                              f"step != 0)")
        counts.append(len(r))
    return tuple(counts)


def _fits_counts(op: str, what: str, shape: Sequence[int], counts: Sequence[int]) -> None:
    if _squeezed(shape) != _squeezed(counts):
        raise OpTypeError(f"{op}: {what} {list(shape)} is not the slice's shape {list(counts)} "
                          f"(only axes of size 1 may be dropped or added)")


def _slice_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    (x,) = _tensors("slice", types, 1)
    shape = tuple(attrs["shape"])
    _fits_counts("slice", "the result shape", shape, _slice_counts("slice", x, attrs))
    return [TensorType(shape, x.dtype)]


def _slice_scatter_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    x, src = _tensors("slice_scatter", types, 2)
    if src.dtype != x.dtype:
        raise OpTypeError(f"slice_scatter: the source {src} must have the dtype of {x}")
    _fits_counts("slice_scatter", "the source's shape", src.shape,
                 _slice_counts("slice_scatter", x, attrs))
    return [x]


def _slices(starts: Sequence[int], stops: Sequence[int], steps: Sequence[int]) -> tuple:
    return tuple(slice(a, None if b < 0 else b, c) for a, b, c in zip(starts, stops, steps))


def _slice_impl(x: np.ndarray, starts, stops, steps, shape) -> np.ndarray:
    return x[_slices(starts, stops, steps)].reshape(tuple(shape))


def _slice_scatter_impl(x: np.ndarray, src: np.ndarray, starts, stops, steps) -> np.ndarray:
    out = np.array(x, copy=True)
    index = _slices(starts, stops, steps)
    out[index] = np.reshape(src, out[index].shape)
    return out


def _slice_view(shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int],
                attrs: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
    starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
    counts = [len(range(a, b, c)) for a, b, c in zip(starts, stops, steps)]
    offset = sum(a * s for a, s in zip(starts, strides)) if all(counts) else 0
    return offset, _unit_axes_view(counts, [c * s for c, s in zip(steps, strides)], out_shape)


_SLICE = ("starts", "stops", "steps")


register(OpDef("slice", SHAPE, _slice_infer, _slice_impl, attrs=_SLICE + ("shape",),
               attr_kinds=(INTS_ATTR, INTS_ATTR, INTS_ATTR, SHAPE_ATTR), type_attrs=("shape",),
               doc="the elements range(start, stop, step) along each axis (basic indexing)",
               view=_slice_view))
register(OpDef("slice_scatter", SHAPE, _slice_scatter_infer, _slice_scatter_impl, attrs=_SLICE,
               attr_kinds=(INTS_ATTR, INTS_ATTR, INTS_ATTR),
               doc="x with its slice (as in slice) replaced by the source"))



def _concat_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    if not types:
        raise OpTypeError("concat takes at least 1 input, got 0")
    xs = _tensors("concat", types, len(types))
    first = xs[0]
    axis = attrs["axis"]
    if not 0 <= axis < len(first.shape):
        raise OpTypeError(f"concat: axis {axis} is not an axis of {first} (0 <= axis < ndim)")
    for x in xs[1:]:
        if x.dtype != first.dtype or len(x.shape) != len(first.shape) or any(
                a != b for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != axis):
            raise OpTypeError(f"concat: {x} does not join {first} along axis {axis} (the same "
                              f"dtype and the same size on every other axis)")
    size = sum(x.shape[axis] for x in xs)
    return [TensorType(first.shape[:axis] + (size,) + first.shape[axis + 1:], first.dtype)]


register(OpDef("concat", SHAPE, _concat_infer, lambda *xs, axis: np.concatenate(xs, axis),
               attrs=("axis",), attr_kinds=(INT_ATTR,),
               into=lambda out, *xs, axis: np.concatenate(xs, axis, out=out),
               doc="the inputs joined along `axis` (numpy's concatenate); flat gradient "
                   "buckets are made with it"))

def _matmul_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    a, b = _tensors("matmul", types, 2)
    d = _one_dtype("matmul", [a, b], NUM)
    if a.ndim == 0 or b.ndim == 0:
        raise OpTypeError(f"matmul: operands must have at least one axis, got {a} @ {b}")
    ash = (1,) + a.shape if a.ndim == 1 else a.shape
    bsh = b.shape + (1,) if b.ndim == 1 else b.shape
    if ash[-1] != bsh[-2]:
        raise OpTypeError(f"matmul: contraction sizes differ: {a} @ {b} "
                          f"({ash[-1]} vs {bsh[-2]})")
    try:
        batch = tuple(np.broadcast_shapes(ash[:-2], bsh[:-2]))
    except ValueError:
        raise OpTypeError(f"matmul: batch axes do not broadcast: {a} @ {b}") from None
    shape = batch + ash[-2:-1] * (a.ndim > 1) + bsh[-1:] * (b.ndim > 1)
    return [TensorType(shape, d)]


register(OpDef("matmul", LINALG, _matmul_infer, blas.matmul,
               doc="numpy.matmul: batched, 1-D operands promoted and the axis removed; each "
                   "matrix's product one single-threaded BLAS call (ir/blas.py)",
               into=lambda out, a, b: blas.matmul(a, b, out)))


# -- constants ----------------------------------------------------------------------------------
def _constant_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    _tensors("constant", types, 0)
    t = TensorType(tuple(attrs["shape"]), to_dtype(attrs["dtype"]))
    value = attrs["value"]
    if isinstance(value, np.ndarray) and value.shape != t.shape:
        raise OpTypeError(f"constant: value of shape {list(value.shape)} for type {t}")
    if not isinstance(value, (np.ndarray, bool, int, float)):
        raise OpTypeError(f"constant: value {value!r} is not a number or an array")
    problem = value_problem(value, t.dtype)
    if problem is not None:
        raise OpTypeError(f"constant: {problem}")
    return [t]


def constant_value(value: Any, dtype: Any) -> Any:
    """The canonical form of a constant's value: a Python scalar rounded to the dtype (a fill),
    or an array of the dtype. Tracer, ops and parser all store values this way, so equal
    constants have equal attributes."""
    d = to_dtype(dtype)
    if isinstance(value, (np.ndarray, list)) and np.ndim(value) > 0:
        return np.array(value, dtype=d.np_dtype)
    scalar = np.asarray(value).astype(d.np_dtype).item()
    return {"float": float, "int": int, "bool": bool}[d.kind](scalar)


def _constant_impl(value: Any, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.array(np.broadcast_to(np.asarray(value), tuple(shape)), dtype=to_dtype(dtype).np_dtype)


register(OpDef("constant", CONSTANT, _constant_infer, _constant_impl,
               attrs=("value", "shape", "dtype"), type_attrs=("shape", "dtype"),
               attr_kinds=(VALUE_ATTR, SHAPE_ATTR, DTYPE_ATTR),
               fixed_dtype=True,
               doc="a scalar value filled over the shape, or an array of exactly the shape",
               into=lambda out, value, shape, dtype: np.copyto(out, value, casting="unsafe")))


# -- effects and ordering -----------------------------------------------------------------------
def _assign_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    if len(types) == 2 and isinstance(types[1], RowsType):  # rows of @p replaced
        (p,), v = _tensors("assign", types[:1], 1), types[1]
        if v.dense != p or not v.unique:
            raise OpTypeError(f"assign: rows {v} do not fit the parameter's type {p} (rows of "
                              f"its type, with unique indices: coalesce them first)")
        return [token]
    p, v = _tensors("assign", types, 2)
    if p != v:
        raise OpTypeError(f"assign: value {v} does not match the parameter's type {p}")
    return [token]


def _depend_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    if len(types) != 1:
        raise OpTypeError(f"depend takes 1 input (and after edges), got {len(types)}")
    return list(_tensors("depend", types, 1))


# Neither allocates: an assign only records its value, a depend passes one through.
register(OpDef("assign", EFFECT, _assign_infer, may_raise=False,
               doc="assign @p, v: at the end of the step @p holds v (for unique rows v: "
                   "put_rows(@p, v)); yields a token"))
register(OpDef("depend", CONTROL, _depend_infer, lambda x: x, may_raise=False,
               doc="depend x after(t...): x, ordered after the values and tokens t",
               view=_identity_view))


# -- activations: elementwise, for small networks -------------------------------------------------
# gelu is the tanh approximation (jax.nn.gelu's default, torch's approximate="tanh"): one
# elementwise formula that fuses like the others, where the exact form needs an erf op.
GELU_C = math.sqrt(2 / math.pi)
GELU_A = 0.044715


def gelu_inner(x: Any, add: Callable = operator.add, mul: Callable = operator.mul,
               const: Callable = lambda x, c: c) -> Any:
    """sqrt(2/pi) (x + 0.044715 x^3), the argument of gelu's tanh, in one order of operations
    for every place that computes it (this op's numpy function, its LLVM lowering, its VJP),
    so that the VJP's tanh is the forward's, to the bit: LLVM computes it once. numpy arrays
    and graph tensors take the defaults; the LLVM lowering passes its emitter's add, mul and
    constants."""
    return mul(const(x, GELU_C), add(x, mul(const(x, GELU_A), mul(x, mul(x, x)))))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(gelu_inner(x)))


_elementwise("relu", 1, lambda x: np.maximum(x, 0), NUM, doc="max(x, 0); gradient 0 at x = 0")
_elementwise("tanh", 1, np.tanh, FLOAT)
_elementwise("sigmoid", 1, lambda x: np.exp(-np.logaddexp(0, -x)), FLOAT,
             doc="1 / (1 + exp(-x)), computed as exp(-softplus(-x)): no overflow")
_elementwise("softplus", 1, lambda x: np.logaddexp(0, x), FLOAT,
             doc="log(1 + exp(x)), computed without overflow")
_elementwise("gelu", 1, _gelu, FLOAT, doc="0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))")
_elementwise("stop_gradient", 1, lambda x: x, ANY,
             doc="x itself; reverse-mode autodiff sends no gradient through it")


# -- network ops: log_softmax and losses (category nn) --------------------------------------------
# Each declares its decomposition (Decomposition): the elementwise ops and reductions it is
# made of, which fuse into kernels; its numpy implementation computes those parts op by op.
# Only in f32 or f64: numpy computes a 16-bit op in 16 bits, where kernel ops round each
# result from f32.
def _constant_attrs(value: Any, shape: tuple[int, ...], dtype: DType) -> dict[str, Any]:
    return {"value": value, "shape": shape, "dtype": dtype}


def _halves(x: np.ndarray) -> bool:
    """A 16-bit float: its nn ops are not decomposed, and numpy computes them as they were
    (np.mean of 16 bits accumulates in f32, where np.sum would in 16 bits)."""
    return x.dtype.itemsize < 4


def _not_f32_f64(op: str, t: Type) -> str | None:
    if t.dtype.name in ("f32", "f64"):
        return None
    return f"{op} of {t} is decomposed only in f32 or f64 (16-bit parts would round apart)"


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)  # exp of it never overflows
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _log_softmax_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    (x,) = _tensors("log_softmax", types, 1)
    _one_dtype("log_softmax", [x], FLOAT)
    _check_axes("log_softmax", [attrs["axis"]], x.ndim)
    return [x]


def _log_softmax_why_not(types: Sequence[Type], attrs: dict[str, Any]) -> str | None:
    (x,) = types
    if x.ndim < 2 or attrs["axis"] != x.ndim - 1:
        return (f"log_softmax over axis {attrs['axis']} of {x} is decomposed into row "
                f"reductions (max, exp, sum, log) only over the last axis of 2 or more")
    return _not_f32_f64("log_softmax", x)


def _log_softmax_write(emit: Emit, inputs: list, attrs: dict[str, Any]) -> Any:
    """m = max x {axes=[-1], keepdims}; s = x - m; s - log(sum(exp(s), {axes=[-1], keepdims}))"""
    (x,) = inputs
    row = TensorType(x.shape[:-1] + (1,), x.dtype)
    reduce = {"axes": [x.type.ndim - 1], "keepdims": True}
    m = emit("max", "max", [x], reduce, row)
    s = emit("shifted", "subtract", [x, m], {}, x.type)
    total = emit("sum", "sum", [emit("exp", "exp", [s], {}, x.type)], reduce, row)
    return emit("out", "subtract", [s, emit("log", "log", [total], {}, row)], {}, x.type)


register(OpDef("log_softmax", NN, _log_softmax_infer, _log_softmax, attrs=("axis",),
               attr_kinds=(INT_ATTR,),
               doc="x - log(sum(exp(x), axis, keepdims)), computed stably",
               decompose=Decomposition(_log_softmax_why_not, _log_softmax_write)))


def _check_bounds_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    (x,) = _tensors("check_bounds", types, 1)
    _one_dtype("check_bounds", [x], ("int",))
    return [x]


def _check_bounds(x: np.ndarray, limit: int) -> np.ndarray:
    # One reduction, not a min and a max (each costs microseconds on a step's few labels):
    # read as unsigned, a negative label is above any limit.
    if x.size and np.maximum.reduce(x.view(_UNSIGNED[x.dtype]), axis=None) >= limit:
        raise IndexError(f"a label is outside [0, {limit})")
    return x


_UNSIGNED = {np.dtype(np.int32): np.uint32, np.dtype(np.int64): np.uint64}


register(OpDef("check_bounds", INDEX, _check_bounds_infer, _check_bounds, attrs=("limit",),
               attr_kinds=(at_least(0),),
               doc="x itself, once every element is checked to be in [0, limit) (an "
                   "IndexError when the step runs, if not): the labels a decomposed "
                   "softmax_cross_entropy compares with the classes"))


def _cross_entropy_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    logits, labels = _tensors("softmax_cross_entropy", types, 2)
    _one_dtype("softmax_cross_entropy", [logits], FLOAT)
    _one_dtype("softmax_cross_entropy", [labels], ("int",))
    if logits.ndim == 0 or labels.shape != logits.shape[:-1]:
        raise OpTypeError(f"softmax_cross_entropy: labels {labels} must have the shape of the "
                          f"logits {logits} without their last (class) axis")
    return [TensorType((), logits.dtype)]


def _cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The parts _cross_entropy_write emits, op by op (one-hot by comparison with the classes:
    it fuses, where a gather would not)."""
    classes, d = logits.shape[-1], logits.dtype
    labels = _check_bounds(labels, classes)
    if _halves(logits):
        logp = _log_softmax(logits, logits.ndim - 1)
        return -np.mean(np.take_along_axis(logp, labels[..., None].astype(np.intp), axis=-1))
    hit = np.equal(labels[..., None], np.arange(classes, dtype=labels.dtype))
    picked = np.where(hit, _log_softmax(logits, logits.ndim - 1), d.type(0))
    total = np.sum(picked, axis=tuple(range(logits.ndim)))
    return np.negative(np.divide(total, d.type(labels.size)))


def _cross_entropy_why_not(types: Sequence[Type], attrs: dict[str, Any]) -> str | None:
    logits = types[0]
    if logits.ndim < 2:
        return (f"softmax_cross_entropy of one example ({logits}) is decomposed only with a "
                f"batch axis (its log_softmax is then a row reduction)")
    return _not_f32_f64("softmax_cross_entropy", logits)


def _cross_entropy_write(emit: Emit, inputs: list, attrs: dict[str, Any]) -> Any:
    """-sum(where(labels == classes, log_softmax(logits), 0)) / examples"""
    logits, labels = inputs
    t, n = logits.type, logits.type.ndim
    classes, scalar = t.shape[-1], TensorType((), t.dtype)
    checked = emit("labels", "check_bounds", [labels], {"limit": classes}, labels.type)
    column = emit("column", "reshape", [checked], {"shape": labels.shape + (1,)},
                  TensorType(labels.shape + (1,), labels.dtype))
    iota = emit("classes", "constant", [], _constant_attrs(
        np.arange(classes, dtype=labels.dtype.np_dtype), (classes,), labels.dtype),
        TensorType((classes,), labels.dtype))
    hit = emit("hit", "equal", [column, iota], {}, TensorType(t.shape, bool_))
    logp = emit("logp", "log_softmax", [logits], {"axis": n - 1}, t)
    zero = emit("zero", "constant", [], _constant_attrs(0.0, (), t.dtype), scalar)
    picked = emit("picked", "where", [hit, logp, zero], {}, t)
    total = emit("sum", "sum", [picked], {"axes": list(range(n)), "keepdims": False}, scalar)
    count = emit("count", "constant", [], _constant_attrs(
        float(np.prod(labels.shape, dtype=np.int64)), (), t.dtype), scalar)
    return emit("out", "negative", [emit("mean", "divide", [total, count], {}, scalar)], {},
                scalar)


register(OpDef("softmax_cross_entropy", NN, _cross_entropy_infer, _cross_entropy,
               doc="mean over the examples of -log softmax(logits)[label]; labels are class "
                   "indices in [0, classes), logits [..., classes]", dtype_group=(0,),
               decompose=Decomposition(_cross_entropy_why_not, _cross_entropy_write)))


def _mse_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    pred, target = _tensors("mse_loss", types, 2)
    d = _one_dtype("mse_loss", [pred, target], FLOAT)
    _broadcast("mse_loss", [pred, target])
    return [TensorType((), d)]


def _mse(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The parts _mse_write emits, op by op."""
    diff = np.subtract(pred, target)
    if _halves(diff):
        return np.mean(np.square(diff))
    total = np.sum(np.multiply(diff, diff), axis=tuple(range(diff.ndim)))
    return np.divide(total, diff.dtype.type(diff.size))


def _mse_why_not(types: Sequence[Type], attrs: dict[str, Any]) -> str | None:
    pred, target = types
    if not pred.ndim and not target.ndim:
        return "mse_loss of two scalars is one subtract and one multiply: nothing to fuse"
    return _not_f32_f64("mse_loss", pred)


def _mse_write(emit: Emit, inputs: list, attrs: dict[str, Any]) -> Any:
    """sum((pred - target)**2) / elements"""
    pred, target = inputs
    t = TensorType(np.broadcast_shapes(pred.shape, target.shape), pred.dtype)
    scalar = TensorType((), t.dtype)
    diff = emit("diff", "subtract", [pred, target], {}, t)
    total = emit("sum", "sum", [emit("square", "multiply", [diff, diff], {}, t)],
                 {"axes": list(range(t.ndim)), "keepdims": False}, scalar)
    count = emit("count", "constant", [], _constant_attrs(
        float(np.prod(t.shape, dtype=np.int64)), (), t.dtype), scalar)
    return emit("out", "divide", [total, count], {}, scalar)


register(OpDef("mse_loss", NN, _mse_infer, _mse,
               doc="mean((pred - target)**2) over the broadcast shape",
               decompose=Decomposition(_mse_why_not, _mse_write)))


# -- gather / scatter_add along axis 0 (category index) -------------------------------------------
def _gather_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    table, indices = _tensors("gather", types, 2)
    _one_dtype("gather", [indices], ("int",))
    if table.ndim == 0:
        raise OpTypeError(f"gather: the table must have at least one axis, got {table}")
    return [TensorType(indices.shape + table.shape[1:], table.dtype)]


def _scatter_add_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    x, indices, updates = _tensors("scatter_add", types, 3)
    _one_dtype("scatter_add", [indices], ("int",))
    _one_dtype("scatter_add", [x, updates], NUM)
    if x.ndim == 0 or updates.shape != indices.shape + x.shape[1:]:
        raise OpTypeError(f"scatter_add: updates {updates} must have the shape of the indices "
                          f"{indices} followed by the row shape of {x}")
    return [x]


def _scatter_add(x: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
    """np.add.at(out, indices, updates) on a copy of x (unbuffered: a repeated row accumulates
    every update, in the order of the indices). Done in layers: the k-th occurrence of every
    row is added in the k-th layer, one fancy-indexed add whose rows are distinct; the same
    additions in the same order as add.at (the same bits), 3x quicker on an embedding's
    gradient. A row repeated more than MAX_LAYERS times (all tokens alike) takes add.at's
    1-D fast path over every element's flat position instead."""
    out = x.copy()
    n, indices = x.shape[0], np.asarray(indices, np.intp).reshape(-1)
    if not indices.size:
        return out
    if not -n <= int(indices.min()) <= int(indices.max()) < n:
        bad = next(int(i) for i in indices if not -n <= i < n)
        raise IndexError(f"index {bad} is out of bounds for axis 0 with size {n}")
    indices = indices % n
    rows = out.reshape(n, -1)
    values = np.ascontiguousarray(updates).reshape(indices.size, rows.shape[1])
    order = np.argsort(indices, kind="stable")  # each row's occurrences, in their order
    ranked = indices[order]
    firsts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    rank = np.arange(ranked.size) - np.repeat(firsts, np.diff(np.r_[firsts, ranked.size]))
    layers = int(rank.max()) + 1
    if layers > _SCATTER_MAX_LAYERS:
        flat = (indices * rows.shape[1])[:, None] + np.arange(rows.shape[1], dtype=np.intp)
        np.add.at(out.reshape(-1), flat.reshape(-1), values.reshape(-1))
        return out
    for k in range(layers):
        at = order[rank == k]
        rows[indices[at]] += values[at]
    return out


_SCATTER_MAX_LAYERS = 32  # (a layer costs a few µs however few its rows)


register(OpDef("gather", INDEX, _gather_infer, lambda table, idx: np.take(table, idx, axis=0),
               doc="table[indices]: rows of the table (an embedding lookup), numpy.take axis 0",
               dtype_group=(0,)))
register(OpDef("scatter_add", INDEX, _scatter_add_infer, _scatter_add,
               doc="x with updates added at rows indices; repeated rows accumulate",
               dtype_group=(0, 2)))


# -- row gradients (category index): K rows of a dense tensor, see types.RowsType ----------------
# At run time a row gradient is a RowsArray; the index `dense_rows` (one past the last row)
# means "no row": coalesce pads with it, a padding_idx becomes it, and whatever reads or
# writes rows skips it.
def _rows_operand(op: str, t: Type) -> RowsType:
    if not isinstance(t, RowsType):
        raise OpTypeError(f"{op}: the operand must be a row gradient (rows<K, ...>), got {t}")
    return t


def _one_rows(op: str, types: Sequence[Type]) -> RowsType:
    if len(types) != 1:
        raise OpTypeError(f"{op} takes 1 input, got {len(types)}")
    return _rows_operand(op, types[0])


def _rows_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    indices, values = _tensors("rows", types, 2)
    _one_dtype("rows", [indices], ("int",))
    _one_dtype("rows", [values], FLOAT)
    shape = tuple(attrs["shape"])
    if indices.ndim != 1 or not shape or values.shape != indices.shape + shape[1:]:
        raise OpTypeError(f"rows: indices {indices} must be a vector [K] and values {values} "
                          f"[K, ...] with the row shape of the dense shape {list(shape)}")
    return [RowsType(indices.shape[0], TensorType(shape, values.dtype))]


def _rows(indices: np.ndarray, values: np.ndarray, shape: Sequence[int]) -> RowsArray:
    n = shape[0]
    if indices.size and (indices.min() < 0 or indices.max() > n):
        bad = indices[(indices < 0) | (indices > n)][0]
        raise IndexError(f"rows: index {bad} is outside [0, {n}] (a tensor of {n} rows; the "
                         f"index {n} means no row)")
    return RowsArray(indices.astype(np.int64, copy=False), values, n)


def _with_values_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    if len(types) != 2:
        raise OpTypeError(f"with_values takes 2 inputs, got {len(types)}")
    r = _rows_operand("with_values", types[0])
    (v,) = _tensors("with_values", types[1:], 1)
    _one_dtype("with_values", [v], FLOAT)
    if v.shape != r.values_type.shape:
        raise OpTypeError(f"with_values: values {v} must have the shape of the values of {r}")
    return [RowsType(r.rows, TensorType(r.shape, v.dtype), r.unique)]


def _halves_in_f32(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float32) if values.dtype in _HALVES else values


def _coalesce(r: RowsArray) -> RowsArray:
    """Each index once, where it first comes, its values the sum of its duplicates' in the
    order they come (f16 and bf16 summed in f32, rounded once); each later duplicate, and
    the no-row index, an entry of the no-row index N with zeros: K rows still, in r's order.
    The values stay where they are (a copy, one sequential pass, not a gather through the
    sort: the rows it would gather lie scattered over memory), and a row kernel after it
    streams through them. The duplicates are found by a stable order of the indices (a sort
    of index·K + place); then one addition per duplicate rank (numpy's add.at past a few)."""
    idx, values, n = r
    k = len(idx)
    if (n + 1) * max(k, 1) < 2**62:  # a stable order, from a plain sort of index·K + place
        ranked, order = np.divmod(np.sort(idx * k + np.arange(k)), max(k, 1))
    else:
        order = np.argsort(idx, kind="stable")
        ranked = idx[order]
    first = np.ones(k, bool)
    np.not_equal(ranked[1:], ranked[:-1], out=first[1:])
    later = np.flatnonzero(~first & (ranked < n))  # sorted places of the later duplicates
    none = np.flatnonzero(idx == n)
    out_idx = idx.astype(np.int64)
    out = values.astype(np.float32 if values.dtype in _HALVES else values.dtype)
    starts = np.flatnonzero(first)
    segment = np.cumsum(first) - 1
    rank = np.arange(k) - starts[segment]  # a duplicate's place among its row's
    into = order[starts][segment]  # the place of each sorted entry's first occurrence
    if later.size:
        if int(rank[later].max()) <= _RANKS_BY_LOOP:
            for q in range(1, int(rank[later].max()) + 1):  # the rows of one rank are distinct
                at = later[rank[later] == q]
                out[into[at]] += values[order[at]]
        else:  # many duplicates of a row: numpy's unbuffered add, in order too
            np.add.at(out, into[later], values[order[later]].astype(out.dtype))
    gone = np.concatenate([order[later], none])
    out_idx[gone] = n
    out[gone] = 0
    return RowsArray(out_idx, out.astype(values.dtype, copy=False), n)


_RANKS_BY_LOOP = 8  # up to this many duplicates of a row: one vectorized add per rank


def _densify_into(out: np.ndarray, r: RowsArray) -> np.ndarray:
    out.fill(0)
    keep = r.indices < r.dense_rows
    np.add.at(out, r.indices[keep], r.values[keep])  # unbuffered: duplicates add up
    return out


def _densify(r: RowsArray) -> np.ndarray:
    return _densify_into(np.empty((r.dense_rows,) + r.values.shape[1:], r.values.dtype), r)


def _take_rows_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    if len(types) != 2:
        raise OpTypeError(f"take_rows takes 2 inputs, got {len(types)}")
    (x,) = _tensors("take_rows", types[:1], 1)
    r = _rows_operand("take_rows", types[1])
    if x.shape != r.shape:
        raise OpTypeError(f"take_rows: {x} is not of the dense shape of {r}")
    return [TensorType(r.values_type.shape, x.dtype)]


def take_rows(x: np.ndarray, r: RowsArray) -> np.ndarray:
    """The rows of x at r's indices, zeros for the no-row index (numpy semantics)."""
    idx, _, n = r
    if n == 0:
        return np.zeros(idx.shape + x.shape[1:], x.dtype)
    out = np.take(x, np.minimum(idx, n - 1), axis=0)
    out[idx >= n] = 0
    return out


def _put_rows_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    if len(types) != 2:
        raise OpTypeError(f"put_rows takes 2 inputs, got {len(types)}")
    (x,) = _tensors("put_rows", types[:1], 1)
    r = _rows_operand("put_rows", types[1])
    if r.dense != x or not r.unique:
        raise OpTypeError(f"put_rows: rows {r} do not fit {x} (rows of its type, with unique "
                          f"indices)")
    return [x]


def write_rows(out: np.ndarray, r: RowsArray) -> None:
    """out's rows at r's indices replaced by r's values, in place (the no-row index skipped):
    what an assign of unique rows does to its parameter."""
    keep = r.indices < r.dense_rows
    out[r.indices[keep]] = r.values[keep]


def _put_rows(x: np.ndarray, r: RowsArray) -> np.ndarray:
    out = np.array(x, copy=True)
    write_rows(out, r)
    return out


def _embedding_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    (out,) = _gather_infer(types, attrs)
    n, pad = types[0].shape[0], attrs["padding_idx"]
    if not -1 <= pad < max(n, 1):
        raise OpTypeError(f"embedding: padding_idx {pad} is not a row of {types[0]} (-1: none)")
    return [out]


def _embedding(table: np.ndarray, ids: np.ndarray, sparse: bool, padding_idx: int) -> np.ndarray:
    n = table.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = ids[(ids < 0) | (ids >= n)].flat[0]
        raise IndexError(f"embedding: index {bad} is outside [0, {n}) (the table's rows)")
    return np.take(table, ids, axis=0)


register(OpDef("rows", INDEX, _rows_infer, _rows, attrs=("shape",), attr_kinds=(SHAPE_ATTR,),
               type_attrs=("shape",), dtype_group=(1,), aliases=True,
               doc="rows %indices, %values: a row gradient of the result's dense shape; each "
                   "index in [0, N], N meaning no row (else an error when the step runs)"))
register(OpDef("rows_indices", INDEX, lambda types, attrs: [
    _one_rows("rows_indices", types).indices_type], lambda r: r.indices, aliases=True,
    doc="the indices of a row gradient, i64[K]"))
register(OpDef("rows_values", INDEX, lambda types, attrs: [
    _one_rows("rows_values", types).values_type], lambda r: r.values, aliases=True,
    doc="the values of a row gradient, [K, ...]"))
register(OpDef("with_values", INDEX, _with_values_infer,
               lambda r, v: RowsArray(r.indices, v, r.dense_rows), dtype_group=(), aliases=True,
               doc="with_values %r, %v: the rows of %r (its indices) with the values %v"))
register(OpDef("coalesce", INDEX, lambda types, attrs: [
    RowsType(_one_rows("coalesce", types).rows, types[0].dense, True)], _coalesce,
    doc="the same rows with unique indices: each where it first comes, duplicates summed "
        "in the order they come, later ones the no-row index with zeros"))
register(OpDef("densify", INDEX, lambda types, attrs: [_one_rows("densify", types).dense],
               _densify, into=_densify_into,
               doc="the dense tensor of a row gradient: zeros, each row added at its index "
                   "(duplicates summed)"))
register(OpDef("take_rows", INDEX, _take_rows_infer, take_rows, dtype_group=(),
               doc="take_rows %x, %r: the rows of %x at the indices of %r (zeros for no row)"))
register(OpDef("put_rows", INDEX, _put_rows_infer, _put_rows, dtype_group=(),
               doc="put_rows %x, %r: %x with its rows at the unique indices of %r replaced by "
                   "their values"))
register(OpDef("embedding", INDEX, _embedding_infer, _embedding,
               attrs=("sparse", "padding_idx"), attr_kinds=(BOOL_ATTR, INT_ATTR),
               dtype_group=(0,),
               doc="embedding %table, %ids {sparse, padding_idx}: table[ids], ids in [0, N); "
                   "its gradient is a row gradient (sparse) or dense, the padding_idx row's "
                   "zero (-1: none)"))
