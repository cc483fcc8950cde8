"""Every op graphopt knows, declared once: type rule and numpy semantics (see registry.py).

Type rules are strict, as in MLIR: the inputs of an elementwise op share one dtype (the
frontend casts weakly typed Python scalars first) and their shapes broadcast as in numpy.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..errors import OpTypeError
from .registry import (CONSTANT, CONTROL, EFFECT, ELEMENTWISE, LINALG, REDUCTION, SHAPE, OpDef,
                       register)
from .types import DType, TensorType, Type, bool_, to_dtype, token

NUM = ("float", "int")
FLOAT = ("float",)
BOOL = ("bool",)
ANY = ("float", "int", "bool")


# -- type-rule helpers ------------------------------------------------------------------------
def _tensors(op: str, types: Sequence[Type], n: int) -> list[TensorType]:
    if len(types) != n:
        raise OpTypeError(f"{op} takes {n} input{'s' * (n != 1)}, got {len(types)}")
    for t in types:
        if not isinstance(t, TensorType):
            raise OpTypeError(f"{op}: an effect token is not a tensor operand "
                              f"(use it in after(...) to order, not as data)")
    return list(types)  # type: ignore[arg-type]


def _broadcast(op: str, types: Sequence[TensorType]) -> tuple[int, ...]:
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
                 result: DType | None = None, doc: str = "") -> OpDef:
    def infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
        ts = _tensors(name, types, n)
        d = _one_dtype(name, ts, kinds)
        return [TensorType(_broadcast(name, ts), result or d)]
    return register(OpDef(name, ELEMENTWISE, infer, impl, doc=doc))


# -- elementwise --------------------------------------------------------------------------------
_elementwise("add", 2, np.add, NUM)
_elementwise("subtract", 2, np.subtract, NUM)
_elementwise("multiply", 2, np.multiply, NUM)
_elementwise("divide", 2, np.divide, FLOAT)
_elementwise("power", 2, np.power, NUM)
_elementwise("maximum", 2, np.maximum, NUM, doc="NaN-propagating, like numpy.maximum")
_elementwise("minimum", 2, np.minimum, NUM, doc="NaN-propagating, like numpy.minimum")
_elementwise("negative", 1, np.negative, NUM)
_elementwise("abs", 1, np.abs, NUM)
_elementwise("sign", 1, np.sign, NUM)
_elementwise("sqrt", 1, np.sqrt, FLOAT)
_elementwise("rsqrt", 1, lambda x: np.reciprocal(np.sqrt(x)), FLOAT, doc="1 / sqrt(x)")
_elementwise("exp", 1, np.exp, FLOAT)
_elementwise("log", 1, np.log, FLOAT)
_elementwise("isfinite", 1, np.isfinite, ANY, result=bool_)
_elementwise("less", 2, np.less, NUM, result=bool_)
_elementwise("less_equal", 2, np.less_equal, NUM, result=bool_)
_elementwise("greater", 2, np.greater, NUM, result=bool_)
_elementwise("greater_equal", 2, np.greater_equal, NUM, result=bool_)
_elementwise("equal", 2, np.equal, ANY, result=bool_)
_elementwise("not_equal", 2, np.not_equal, ANY, result=bool_)
_elementwise("logical_and", 2, np.logical_and, BOOL)
_elementwise("logical_or", 2, np.logical_or, BOOL)
_elementwise("logical_not", 1, np.logical_not, BOOL)


def _where_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    cond, x, y = _tensors("where", types, 3)
    if cond.dtype != bool_:
        raise OpTypeError(f"where: the condition must be bool, got {cond}")
    d = _one_dtype("where", [x, y], ANY)
    return [TensorType(_broadcast("where", [cond, x, y]), d)]


register(OpDef("where", ELEMENTWISE, _where_infer, np.where,
               doc="where(cond, x, y): x where cond is true, else y"))


def _cast_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    (x,) = _tensors("cast", types, 1)
    return [TensorType(x.shape, to_dtype(attrs["dtype"]))]


register(OpDef("cast", ELEMENTWISE, _cast_infer,
               lambda x, dtype: x.astype(to_dtype(dtype).np_dtype), attrs=("dtype",),
               doc="convert to dtype (floats to ints truncate toward zero, like numpy)"))


# -- reductions ---------------------------------------------------------------------------------
def _check_axes(op: str, axes: Any, ndim: int) -> tuple[int, ...]:
    axes = tuple(axes)
    if any(not isinstance(a, (int, np.integer)) or not 0 <= a < ndim for a in axes) \
            or len(set(axes)) != len(axes) or list(axes) != sorted(axes):
        raise OpTypeError(f"{op}: axes {list(axes)} must be distinct, sorted, in [0, {ndim})")
    return axes


def _reduction(name: str, impl: Callable[..., Any], kinds: tuple[str, ...]) -> OpDef:
    def infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
        (x,) = _tensors(name, types, 1)
        _one_dtype(name, [x], kinds)
        axes = _check_axes(name, attrs["axes"], x.ndim)
        if attrs["keepdims"]:
            shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
        else:
            shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
        return [TensorType(shape, x.dtype)]

    def run(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        return impl(x, axis=tuple(axes), keepdims=keepdims)

    return register(OpDef(name, REDUCTION, infer, run, attrs=("axes", "keepdims")))


_reduction("sum", np.sum, NUM)
_reduction("max", np.max, NUM)
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


register(OpDef("reshape", SHAPE, _reshape_infer,
               lambda x, shape: np.reshape(x, tuple(shape)), attrs=("shape",)))
register(OpDef("broadcast_to", SHAPE, _broadcast_to_infer,
               lambda x, shape: np.broadcast_to(x, tuple(shape)), attrs=("shape",)))
register(OpDef("transpose", SHAPE, _transpose_infer,
               lambda x, perm: np.transpose(x, tuple(perm)), attrs=("perm",)))


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


register(OpDef("matmul", LINALG, _matmul_infer, np.matmul,
               doc="numpy.matmul: batched, 1-D operands promoted and the axis removed"))


# -- constants ----------------------------------------------------------------------------------
def _constant_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    _tensors("constant", types, 0)
    t = TensorType(tuple(attrs["shape"]), to_dtype(attrs["dtype"]))
    value = attrs["value"]
    if isinstance(value, np.ndarray) and value.shape != t.shape:
        raise OpTypeError(f"constant: value of shape {list(value.shape)} for type {t}")
    if not isinstance(value, (np.ndarray, bool, int, float)):
        raise OpTypeError(f"constant: value {value!r} is not a number or an array")
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
               doc="a scalar value filled over the shape, or an array of exactly the shape"))


# -- effects and ordering -----------------------------------------------------------------------
def _assign_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    p, v = _tensors("assign", types, 2)
    if p != v:
        raise OpTypeError(f"assign: value {v} does not match the parameter's type {p}")
    return [token]


def _depend_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    if len(types) != 1:
        raise OpTypeError(f"depend takes 1 input (and after edges), got {len(types)}")
    return [types[0]]


register(OpDef("assign", EFFECT, _assign_infer,
               doc="assign @p, v: at the end of the step @p holds v; yields a token"))
register(OpDef("depend", CONTROL, _depend_infer, lambda x: x,
               doc="depend x after(t...): x, ordered after the values and tokens t"))
