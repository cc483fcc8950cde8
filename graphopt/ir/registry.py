"""The op registry: each op is declared once, with everything every part of graphopt needs.

An `OpDef` holds the op's name, category, attribute names, type rule and numpy reference
semantics. The tracer, verifier, interpreter, printer, parser and passes read only this
table; the layers above keep their own per-op tables (VJP rules in autodiff/rules.py, LLVM
lowerings in backends/llvm/lowering.py). The declarations themselves live in `opdefs.py`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import GraphoptError, OpTypeError
from .types import DTYPES, DType, RowsArray, RowsType, TensorType, Type, bf16, f16, shape_problem

# Categories that passes match on.
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
SHAPE = "shape"
LINALG = "linalg"
CONSTANT = "constant"
EFFECT = "effect"
CONTROL = "control"
KERNEL = "kernel"
INDEX = "index"  # gather, scatter_add, row gradients: data-dependent addressing along axis 0
NN = "nn"  # composite network ops with a fused numpy reference: log_softmax, losses
# Ops whose value depends on the process group they run in (its rank, the other ranks'
# values): all_reduce, all_gather, ..., shard (ir/collectives.py). Never evaluated at compile
# time, never inside a kernel.
COLLECTIVE = "collective"
CATEGORIES = (ELEMENTWISE, REDUCTION, SHAPE, LINALG, CONSTANT, EFFECT, CONTROL, KERNEL, INDEX,
              NN, COLLECTIVE)


@dataclass(frozen=True)
class AttrKind:
    """The values an attribute takes, declared with its op (OpDef.attr_kinds) and checked by
    the verifier before the type rule reads them: `test(x)` says whether x has the form
    (`what` names it in the error), `detail(x)` what else is wrong with it, or None."""

    what: str
    test: Callable[[Any], bool]
    detail: Callable[[Any], str | None] = lambda x: None

    def problem(self, x: Any) -> str | None:
        return f"must be {self.what}" if not self.test(x) else self.detail(x)


def _is_int(x: Any) -> bool:
    """An integer; a bool is not one (nor is 1.0)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_ints(x: Any) -> bool:
    return isinstance(x, (tuple, list)) and all(map(_is_int, x))


def _int64_problem(ints: Any) -> str | None:
    if any(not -2**63 <= i < 2**63 for i in ints):
        return "holds an integer out of the range of int64"
    return None


def _distinct(shapes: Any) -> set[tuple]:
    """The distinct shapes of a list of them, in C loops: a kernel has thousands of spaces."""
    return set(shapes) if set(map(type, shapes)) <= {tuple} else set(map(tuple, shapes))


def _is_shapes(x: Any) -> bool:
    return isinstance(x, (tuple, list)) and set(map(type, x)) <= {tuple, list} and \
        all(map(_is_ints, _distinct(x)))


def _shapes_problem(shapes: Any, what: str = "holds a shape") -> str | None:
    for shape in _distinct(shapes):
        problem = shape_problem(shape)
        if problem is not None:
            return f"{what} with {problem}"
    return None


# The kinds of attribute values (the text form reads a list as a tuple; code may use lists).
BOOL_ATTR = AttrKind("true or false", lambda x: isinstance(x, (bool, np.bool_)))
INT_ATTR = AttrKind("an integer", _is_int, lambda x: _int64_problem([x]))
INTS_ATTR = AttrKind("a list of integers", _is_ints, _int64_problem)
SHAPE_ATTR = AttrKind("a shape (a list of integers >= 0)", _is_ints,
                      lambda x: _shapes_problem([x], "is a shape"))
SHAPES_ATTR = AttrKind("a list of shapes", _is_shapes, _shapes_problem)
DTYPE_ATTR = AttrKind(f"a dtype ({', '.join(DTYPES)})", lambda x: isinstance(x, DType))
STRINGS_ATTR = AttrKind("a list of strings", lambda x: isinstance(x, (tuple, list)) and
                        all(isinstance(e, str) for e in x))
VALUE_ATTR = AttrKind("a number or an array",
                      lambda x: isinstance(x, (np.ndarray, bool, int, float)))
STRING_ATTR = AttrKind("a string", lambda x: isinstance(x, str),
                       lambda x: "is empty" if not x else None)


def one_of(*choices: str) -> AttrKind:
    """The kind of a string attribute that takes one of a few words (a reduction's name)."""
    shown = ", ".join(f'"{c}"' for c in choices)
    return AttrKind(f"one of {shown}", lambda x: isinstance(x, str) and x in choices)


def at_least(low: int) -> AttrKind:
    """The kind of an integer attribute that is `low` or more (a number of ranks)."""
    return AttrKind(f"an integer >= {low}", _is_int,
                    lambda x: f"is below {low}" if x < low else _int64_problem([x]))


# A view rule (OpDef.view): how an op's result addresses the elements of its first input
# without copying them, as numpy's strided arrays do. view(in_shape, in_strides, out_shape,
# attrs) -> (offset, strides), in elements, of the result given the input's strides; None
# where that layout cannot be expressed (the result must be a copy).
ViewRule = Callable[..., "tuple[int, tuple[int, ...]] | None"]


# Emit(role, op, inputs, attrs, type) -> a new value: how a decomposition adds one node (its
# part named `role`, for explain) to the graph being rewritten.
Emit = Callable[[str, str, list, dict, Type], Any]


@dataclass(frozen=True)
class Decomposition:
    """An nn op written as the ops it is made of, so fusion can put them in kernels (XLA's
    expanders): `why_not(input_types, attrs)` says why this node is kept whole (None: it is
    not), `write(emit, inputs, attrs)` emits the parts and returns the value that replaces
    the op's result. The op's numpy implementation computes the same parts op by op, so the
    interpreter gives the same bits before and after."""

    why_not: Callable[[Sequence[Type], dict[str, Any]], str | None]
    write: Callable[[Emit, list, dict[str, Any]], Any]


@dataclass(frozen=True)
class OpDef:
    """One op. `infer(input_types, attrs) -> output types` raises OpTypeError on bad input;
    `impl(*arrays, **attrs)` computes the result with numpy (None for effect/control ops,
    which the interpreter handles itself)."""

    name: str
    category: str
    infer: Callable[[Sequence[Type], dict[str, Any]], list[Type]]
    impl: Callable[..., Any] | None = None
    attrs: tuple[str, ...] = ()
    # The kind of each attribute, in the order of `attrs` (the verifier checks them).
    attr_kinds: tuple[AttrKind, ...] = ()
    # Attributes read off the printed result type instead of printed (shape, dtype).
    type_attrs: tuple[str, ...] = ()
    doc: str = ""
    # Type promotion (the frontend's weak types, frontend/bind.py): the inputs whose dtypes
    # the type rule requires to agree (None: all of them), and whether the op fixes its
    # result's dtype itself (a comparison's bool, a cast's attribute) instead of taking theirs.
    dtype_group: tuple[int, ...] | None = None
    fixed_dtype: bool = False
    # A view (reshape, transpose, slice, ...): its result is its first input's elements, read
    # in a new layout; a backend may read them where they lie instead of making the result.
    view: ViewRule | None = None
    # Its result holds its inputs' arrays as they are (a row gradient holds its values): a
    # backend keeps those buffers, unwritten, for as long as the result is read.
    aliases: bool = False
    # Traits passes and backends read (MLIR's Commutative; "can fail at run time"):
    commutative: bool = False  # op(x, y) == op(y, x): cse merges either order
    may_raise: bool = True  # running it may raise (anything that allocates: a MemoryError)
    # `into(out, *arrays, **attrs)` computes the one result into `out`, an array of exactly
    # the result type (numpy's out=), so a backend can give it a buffer planned in advance.
    into: Callable[..., Any] | None = None
    # Every rank runs it, in the same order as the other ordered ops; no pass merges, folds,
    # fuses or reorders it (a collective that communicates: all_reduce, all_gather, ...). The
    # tracer chains the ordered nodes by after edges, and the verifier checks the chain.
    ordered: bool = False
    # `sends(input_types, output_types, attrs) -> int`: the bytes one rank sends to the others
    # in one run of the op (a collective's, by a ring algorithm); None: it sends nothing.
    sends: Callable[..., int] | None = None
    # Its last operand is a bool scalar that says whether it communicates on this run
    # (all_reduce_when); `sends` is the bytes of a run that does, and the attribute `every`
    # how many runs it takes per such run. The predicate must be the same on every rank: the
    # verifier checks that it is computed from rank-independent values only.
    predicated: bool = False
    # Its result is the same on every rank of its group (all_reduce, all_gather, broadcast),
    # whatever each rank gave it: a value computed from such results, Parameters and
    # constants only is rank-independent, and may be a collective's predicate.
    uniform: bool = False
    # How passes write it as other ops (an nn op: passes/decompose.py), or None.
    decompose: Decomposition | None = None

    @property
    def has_effect(self) -> bool:
        """Whether the op changes state (assign, store): never removed, merged or moved."""
        return self.category == EFFECT


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    """Add an op to the registry and return it. Each name is declared once, in a known
    category, with a kind for each attribute (asserted)."""
    assert op.category in CATEGORIES, op.category
    assert op.name not in REGISTRY, f"op {op.name} declared twice"
    assert len(op.attr_kinds) == len(op.attrs), f"op {op.name}: declare a kind per attribute"
    REGISTRY[op.name] = op
    return op


class UnknownOpError(GraphoptError, KeyError):
    """An op name that the registry does not declare."""


def get_op(name: str) -> OpDef:
    """The declaration of the op `name`.

    Raises:
        UnknownOpError: no op has that name; the message lists the known ones.
    """
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownOpError(f"unknown op '{name}'; known ops: {', '.join(sorted(REGISTRY))}") \
            from None


def check_attrs(op: OpDef, attrs: dict[str, Any]) -> None:
    extra = set(attrs) - set(op.attrs)
    missing = set(op.attrs) - set(attrs)
    if extra or missing:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(sorted(missing))}")
        if extra:
            parts.append(f"unknown {', '.join(sorted(extra))}")
        raise OpTypeError(f"{op.name}: attributes {'; '.join(parts)} "
                          f"(expects {', '.join(op.attrs) or 'none'})")


def check_attr_kinds(op: OpDef, attrs: dict[str, Any]) -> None:
    """Every attribute is of its declared kind (check_attrs has found them all)."""
    for name, kind in zip(op.attrs, op.attr_kinds):
        problem = kind.problem(attrs[name])
        if problem is not None:
            from .printer import format_attr
            try:
                shown = format_attr(attrs[name])
            except TypeError:  # not a kind of value the text form has
                shown = repr(attrs[name])
            raise OpTypeError(f"{op.name}: attribute '{name}' {problem}, got {shown}")


_HALVES = (f16.np_dtype, bf16.np_dtype)


def _widened(op: OpDef, arrays: Sequence[Any]) -> Sequence[Any]:
    """An elementwise op on f16 or bf16 computes in f32 and rounds once, to its result's
    dtype: what numpy's own f16 functions do, and the LLVM backend for every op. An op that
    numpy computes in several calls (rsqrt, sigmoid, gelu) would round after each."""
    if op.category != ELEMENTWISE or not any(getattr(a, "dtype", None) in _HALVES
                                              for a in arrays):
        return arrays
    return [a.astype(np.float32) if getattr(a, "dtype", None) in _HALVES else a for a in arrays]


def evaluate_element(op: OpDef, arrays: Sequence[Any], attrs: dict[str, Any],
                     out_type: Type) -> np.ndarray:
    """An elementwise op of a kernel body on whole arrays: the declared dtype, any shape."""
    return np.asarray(op.impl(*_widened(op, arrays), **attrs)).astype(out_type.dtype.np_dtype,
                                                                     copy=False)


def writes_into(op: OpDef, types: Sequence[Type]) -> bool:
    """Whether `evaluate_into` can compute this op on inputs of these types into a given
    array: ops that declare `into`, and numpy ufuncs that need no widening (not f16/bf16)."""
    if op.into is not None:
        return True
    return isinstance(op.impl, np.ufunc) and op.category == ELEMENTWISE and not any(
        isinstance(t, TensorType) and t.dtype.np_dtype in _HALVES for t in types)


def evaluate_into(op: OpDef, arrays: Sequence[np.ndarray], attrs: dict[str, Any],
                  out: np.ndarray) -> np.ndarray:
    """`evaluate` of an op that `writes_into`, into `out`; returns `out`."""
    if op.into is not None:
        op.into(out, *arrays, **attrs)
    else:
        op.impl(*arrays, out=out, **attrs)
    return out


def evaluator(op: OpDef, attrs: dict[str, Any], in_types: Sequence[Type],
              out_types: Sequence[Type]) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    """`evaluate` for one node, arrays -> results, with what depends only on its op and types
    worked out once: a program runs each node every step, and a node of a small step costs
    about as much in these checks as in numpy."""
    halves = any(isinstance(t, TensorType) and t.dtype.np_dtype in _HALVES for t in in_types)
    if len(out_types) != 1 or not isinstance(out_types[0], TensorType) or (
            halves and op.category == ELEMENTWISE):
        return lambda arrays: evaluate(op, arrays, attrs, out_types)
    impl, dtype, shape = op.impl, out_types[0].dtype.np_dtype, out_types[0].shape

    def one(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:  # (evaluate's steps)
        r = impl(*arrays, **attrs)
        if isinstance(r, tuple) and not isinstance(r, RowsArray):
            r = r[0]
        a = np.asarray(r)
        if a.dtype != dtype:
            a = a.astype(dtype)
        assert a.shape == shape, (op.name, a.shape, shape)
        return [a]
    return one


def evaluate(op: OpDef, arrays: Sequence[np.ndarray], attrs: dict[str, Any],
             out_types: Sequence[Type]) -> list[np.ndarray]:
    """Run an op's numpy semantics and return arrays of exactly the declared output types."""
    result = op.impl(*_widened(op, arrays), **attrs)
    results = result if isinstance(result, tuple) and not isinstance(result, RowsArray) \
        else (result,)
    out = []
    for r, t in zip(results, out_types):
        if isinstance(t, RowsType):
            assert isinstance(r, RowsArray) and r.values.shape == t.values_type.shape, (op.name, t)
            out.append(r)
            continue
        assert isinstance(t, TensorType)
        a = np.asarray(r)
        if a.dtype != t.dtype.np_dtype:
            a = a.astype(t.dtype.np_dtype)
        assert a.shape == t.shape, (op.name, a.shape, t.shape)
        out.append(a)
    return out
