"""Applying ops: `bind`, `assign` and `depend`, in a trace and in eager mode alike.

Every op goes through `bind`: it resolves weakly typed values (Python scalars, and what ops
make of them only: see docs/ir.md), checks the op's type rule (errors carry the user's
file:line), then hands the operands to the active trace (traces.py), which appends a node to
its graph or, in eager mode, computes the result with the op's numpy semantics.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import AssignError, GraphoptError, OpTypeError
from ..ir.graph import Location
from ..ir.registry import OpDef, get_op
from ..ir.types import DType, RowsType, TensorType, bool_, f64, i64, type_of_array
from .parameter import Parameter
from .rows import Rows
from .tensor import EagerTensor, Tensor, TracedTensor
from .traces import BaseTrace, active_trace, user_location

# -- binding ops --------------------------------------------------------------------------------
# The dtype of a weakly typed value: a Python scalar, or what ops compute from such values only.
# It keeps full precision until it meets a strongly typed tensor, where a cast rounds it once:
# lr=1e-3 or sqrt(2.0) in an f64 step is exact, not the nearest f32 (JAX with x64 enabled).
WEAK_DTYPE = {bool: bool_, int: i64, float: f64}
_KIND = {"bool": bool, "int": int, "float": float}
_KIND_ORDER = (bool, int, float)  # weak meets weak: the later kind wins (True + 1 + 0.5 is float)


def py_kind(x: Any) -> type | None:
    if isinstance(x, (bool, np.bool_)):
        return bool
    if isinstance(x, (int, np.integer)) and not isinstance(x, np.integer):
        return int
    if isinstance(x, float) and not isinstance(x, np.floating):
        return float
    return None


def _fits(kind: type, d: DType) -> bool:
    """Whether a weak value of `kind` may take dtype d (never float into an int)."""
    return kind is bool or (kind is int and d.kind != "bool") or d.is_float


class _Operand:
    """One operand on its way into an op: a Value (trace), an array (eager) or a Python scalar
    still waiting for its dtype."""

    __slots__ = ("payload", "type", "weak")

    def __init__(self, payload: Any, type: TensorType | None, weak: bool):
        self.payload, self.type, self.weak = payload, type, weak

    def kind(self) -> type:
        """bool, int or float: what promotion sees of a weak operand."""
        return py_kind(self.payload) if self.type is None else _KIND[self.type.dtype.kind]

    def describe(self) -> str:
        """How an error names a weak operand."""
        kind = self.kind().__name__
        return f"a Python {kind}" if self.type is None else \
            f"a weakly typed value (a Python {kind}, or computed from Python scalars only)"


def _operand(x: Any, trace: BaseTrace) -> _Operand:
    if isinstance(x, TracedTensor):
        if x.trace is not trace:
            v = trace.foreign(x)
            return _Operand(v, v.type, x.weak)
        return _Operand(x.value, x.type, x.weak)
    if isinstance(x, Parameter):
        v = trace.read_param(x)  # in a map trace: one element of it
        return _Operand(v, trace.param_type(x), False)
    if isinstance(x, EagerTensor):
        o = _operand(x.array, trace)
        o.weak = x.weak
        return o
    if isinstance(x, Rows):
        if x.trace is not trace and x.trace is not None:
            return _Operand(trace.foreign(x), x.type, False)
        if x.trace is None and not trace.eager:
            raise GraphoptError("a row gradient computed eagerly is used in a traced step: "
                                "pass it to the step as an argument", loc=user_location())
        return _Operand(x.payload, x.type, False)
    if py_kind(x) is not None:
        return _Operand(x, None, True)
    if isinstance(x, (np.ndarray, np.generic)):
        a = np.asarray(x)
        try:
            return _Operand(a, type_of_array(a), False)
        except TypeError as e:
            raise OpTypeError(str(e), loc=user_location()) from None
    raise OpTypeError(f"cannot use a {type(x).__name__} as a tensor operand", loc=user_location())


def _resolve_weak(op: OpDef, operands: list[_Operand], trace: BaseTrace,
                  loc: Location | None) -> bool:
    """Give each weak operand a dtype, by JAX's rule within the op's dtype group (an operand
    outside it, like where's condition, on its own), and say whether the result is weak: when
    the whole group is and the op does not fix the result's dtype (comparisons, cast)."""
    if not any(o.weak for o in operands):  # the common case, quickly
        return False
    group = range(len(operands)) if op.dtype_group is None else op.dtype_group
    _promote(op.name, [operands[i] for i in group], trace, loc)
    for i, o in enumerate(operands):
        if i not in group:
            _promote(op.name, [o], trace, loc)
    return bool(group) and not op.fixed_dtype and all(operands[i].weak for i in group)


def _promote(opname: str, members: list[_Operand], trace: BaseTrace,
             loc: Location | None) -> None:
    """The weak members take the dtype of the strong ones (the type rule checks that those
    agree), or, when all are weak, the weak dtype of the highest kind among them."""
    weak = [o for o in members if o.weak]
    if not weak:
        return
    strong = [o.type.dtype for o in members if not o.weak]
    target = strong[0] if strong else \
        WEAK_DTYPE[max((o.kind() for o in weak), key=_KIND_ORDER.index)]
    for o in weak:
        if not _fits(o.kind(), target):
            raise OpTypeError(f"{opname}: {o.describe()} cannot take the dtype {target} of the "
                              f"tensor it meets; cast explicitly with .astype(...)", loc=loc)
        _take_dtype(o, target, trace, loc)


def _take_dtype(o: _Operand, d: DType, trace: BaseTrace, loc: Location | None) -> None:
    """A weak operand gets dtype d: a Python scalar as its type, a weak tensor by a cast."""
    if o.type is None:
        o.type = TensorType((), d)
    elif o.type.dtype != d:
        _convert(o, "cast", {"dtype": d}, TensorType(o.type.shape, d), trace, loc)


def _convert(o: _Operand, opname: str, attrs: dict[str, Any], t: TensorType, trace: BaseTrace,
             loc: Location | None) -> None:
    """Apply a cast or broadcast_to to an operand: a node in a trace, computed now in eager."""
    o.payload = trace.apply(get_op(opname), [trace.value(o.payload, o.type, loc)], attrs, [t],
                            loc)[0]
    o.type = t


def bind(opname: str, operands: Sequence[Any], attrs: dict[str, Any] | None = None) -> Tensor:
    """Apply a registered op in the active trace: a node in a graph, or its value now."""
    op = get_op(opname)
    attrs = dict(attrs or {})
    loc = user_location()
    trace = active_trace()
    trace.check_op(op, loc)
    ops_in = [_operand(x, trace) for x in operands]
    weak_result = _resolve_weak(op, ops_in, trace, loc)
    try:
        out_types = op.infer([o.type for o in ops_in], attrs)
    except OpTypeError as e:
        raise OpTypeError(e.message, loc=loc) from None
    inputs = [trace.value(o.payload, o.type, loc) for o in ops_in]
    result = trace.apply(op, inputs, attrs, out_types, loc)[0]
    if isinstance(out_types[0], RowsType):
        return trace.rows(result, out_types[0])
    return trace.tensor(result, weak_result)


def assign(param: Parameter, value: Any) -> None:
    """At the end of the step, `param` holds `value`; reads after this see `value`. A row
    gradient of unique rows (`coalesce`'s) as the value replaces those rows only."""
    loc = user_location()
    if not isinstance(param, Parameter):
        raise AssignError(f"assign needs a graphopt.Parameter as its target, got "
                          f"{type(param).__name__}", loc=loc)
    trace = active_trace()
    want = trace.param_type(param)
    o = _operand(value, trace)
    if o.weak:  # a weak value takes the parameter's dtype where its kind allows; a scalar fills it
        if not _fits(o.kind(), param.dtype):
            raise AssignError(f"assign to {param.name}: {o.describe()} cannot be stored in a "
                              f"{param.dtype} parameter", loc=loc)
        if o.type is None:
            o.type = want
        elif o.type.shape in ((), want.shape):
            _take_dtype(o, param.dtype, trace, loc)
            if o.type != want:
                _convert(o, "broadcast_to", {"shape": want.shape}, want, trace, loc)
    if isinstance(o.type, RowsType) and o.type.dense == want and not o.type.unique:
        raise AssignError(f"assign to {param.name}: the rows {o.type} may repeat an index; "
                          f"coalesce them first (graphopt.ops.coalesce)", loc=loc)
    if o.type != want and not (isinstance(o.type, RowsType) and o.type.dense == want):
        raise AssignError(f"assign to {param.name}: the value is {o.type} but the parameter is "
                          f"{want}", loc=loc)
    trace.record_assign(param, trace.value(o.payload, o.type, loc), loc)


def depend(x: Any, *after: Any) -> Tensor:
    """x, ordered after the given tensors: an ordering edge with no data (eager: x's value)."""
    loc = user_location()
    trace = active_trace()
    v, weak = payload(x, trace, loc)
    return trace.depend(v, [_operand(a, trace).payload for a in after], weak, loc)


def payload(x: Any, trace: BaseTrace, loc: Location | None) -> tuple[Any, bool]:
    """x as a payload of the trace (a Python scalar at its weak dtype), and whether it is
    weak: what depend passes on, and what a traced function returns."""
    o = _operand(x, trace)
    if o.type is None:
        o.type = TensorType((), WEAK_DTYPE[o.kind()])
    return trace.value(o.payload, o.type, loc), o.weak
