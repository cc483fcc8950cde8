"""graphopt's ops for step functions, with numpy's names.

Each function binds one registered op (see graphopt/ir/opdefs.py): inside a trace it adds a
node, in eager mode it computes the result with numpy. Operands may be tensors, Parameters,
numpy arrays or Python scalars. Python scalars are weakly typed: they, and what an op computes
from them only, take the dtype of the tensor they meet (docs/ir.md, "Python scalars").
"""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from . import comm
from .errors import CollectiveError, OpTypeError
from .frontend import checks, indexing
from .frontend.rows import Rows
from .frontend.tensor import Tensor
from .frontend.bind import assign, bind, depend
from .frontend.traces import user_location
from .ir.collectives import REDUCES
from .ir.opdefs import constant_value
from .ir.types import f32

__all__ = [
    "add", "subtract", "multiply", "divide", "negative", "power", "sqrt", "rsqrt", "exp", "log",
    "sin", "cos",
    "abs", "sign", "maximum", "minimum", "where", "isfinite", "less", "less_equal", "greater",
    "greater_equal", "equal", "not_equal", "logical_and", "logical_or", "logical_not", "cast",
    "asarray",
    "sum", "max", "mean", "reshape", "broadcast_to", "transpose", "slice", "slice_scatter",
    "index", "index_update", "matmul", "full", "zeros",
    "ones", "full_like", "zeros_like", "ones_like", "depend", "assign",
    "relu", "tanh", "sigmoid", "softplus", "gelu", "stop_gradient", "log_softmax", "softmax",
    "softmax_cross_entropy", "mse_loss", "gather", "scatter_add", "one_hot", "arange",
    "all_reduce", "all_reduce_when", "reduce_scatter", "all_gather", "broadcast", "shard",
    "embedding", "rows", "rows_indices", "rows_values", "with_values", "coalesce", "densify",
    "take_rows", "put_rows",
]


def _error(message: str) -> OpTypeError:
    """A bad argument of an op, at the user's line."""
    return OpTypeError(message, loc=user_location())


def _to_dtype(dtype: Any, what: str = "dtype"):
    return checks.dtype(dtype, what, _error)


def _binary(name: str, doc: str):
    """The function of a two-input elementwise op; `doc` says what it computes."""
    def op(x: Any, y: Any) -> Tensor:
        return bind(name, [x, y])
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"{doc}, elementwise, with numpy broadcasting."
    return op


def _unary(name: str, doc: str):
    """The function of a one-input elementwise op; `doc` says what it computes."""
    def op(x: Any) -> Tensor:
        return bind(name, [x])
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"{doc}, elementwise."
    return op


add = _binary("add", "x + y")
subtract = _binary("subtract", "x - y")
multiply = _binary("multiply", "x * y")
divide = _binary("divide", "x / y, for float dtypes")
power = _binary("power", "x ** y")
maximum = _binary("maximum", "The larger of x and y, NaN where either is NaN (as numpy.maximum)")
minimum = _binary("minimum", "The smaller of x and y, NaN where either is NaN (as numpy.minimum)")
less = _binary("less", "x < y, as a bool tensor")
less_equal = _binary("less_equal", "x <= y, as a bool tensor")
greater = _binary("greater", "x > y, as a bool tensor")
greater_equal = _binary("greater_equal", "x >= y, as a bool tensor")
equal = _binary("equal", "x == y, as a bool tensor")
not_equal = _binary("not_equal", "x != y, as a bool tensor")
logical_and = _binary("logical_and", "x and y, for bool tensors")
logical_or = _binary("logical_or", "x or y, for bool tensors")
negative = _unary("negative", "-x")
abs = _unary("abs", "|x|")
sign = _unary("sign", "-1, 0 or 1 by the sign of x; its gradient is 0")
sqrt = _unary("sqrt", "The square root of x, for float dtypes")
rsqrt = _unary("rsqrt", "1 / sqrt(x), for float dtypes")
exp = _unary("exp", "e ** x, for float dtypes")
log = _unary("log", "The natural logarithm of x, for float dtypes")
sin = _unary("sin", "sin(x), for float dtypes")
cos = _unary("cos", "cos(x), for float dtypes")
isfinite = _unary("isfinite", "True where x is neither inf nor NaN, as a bool tensor")
logical_not = _unary("logical_not", "not x, for bool tensors")
relu = _unary("relu", "max(x, 0); its gradient at 0 is 0")
tanh = _unary("tanh", "tanh(x), for float dtypes")
sigmoid = _unary("sigmoid", "1 / (1 + exp(-x)), computed without overflow, for float dtypes")
softplus = _unary("softplus", "log(1 + exp(x)), computed without overflow, for float dtypes")
gelu = _unary("gelu", "GELU, the tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))")


def where(cond: Any, x: Any, y: Any) -> Tensor:
    """x where cond is true, else y (the graph's way to choose; Python `if` cannot)."""
    return bind("where", [cond, x, y])


def cast(x: Any, dtype: Any) -> Tensor:
    """x converted to dtype (also `x.astype(dtype)`); floats become ints by truncation
    toward zero, as in numpy."""
    return bind("cast", [x], {"dtype": _to_dtype(dtype, "cast: dtype")})


def asarray(x: Any, dtype: Any = None) -> Tensor:
    """x as a strongly typed tensor of `dtype` (by default its own: a Python float is f64): a
    Python scalar, or a value made from Python scalars only, then no longer takes the dtype
    of the tensors it meets."""
    return cast(x, _dtype(x) if dtype is None else dtype)


def _shape(x: Any) -> tuple[int, ...]:
    return x.shape if isinstance(x, Tensor) else np.shape(x)


def _axes(x: Any, axis: int | Sequence[int] | None, op: str = "axis") -> tuple[int, ...]:
    return checks.axes(axis, len(_shape(x)), f"{op}: axis", _error)


def sum(x: Any, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """Sum over `axis`: an int, a sequence of ints, or None for every axis. With
    `keepdims` each reduced axis stays, with size 1."""
    return bind("sum", [x], {"axes": _axes(x, axis, "sum"),
                             "keepdims": checks.flag(keepdims, "sum: keepdims", _error)})


def max(x: Any, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """Maximum over `axis` (every axis by default); `keepdims` as in `sum`."""
    return bind("max", [x], {"axes": _axes(x, axis, "max"),
                             "keepdims": checks.flag(keepdims, "max: keepdims", _error)})


def mean(x: Any, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """Mean over `axis` (every axis by default), for float dtypes; `keepdims` as in
    `sum`."""
    return bind("mean", [x], {"axes": _axes(x, axis, "mean"),
                             "keepdims": checks.flag(keepdims, "mean: keepdims", _error)})


def reshape(x: Any, shape: int | Sequence[int]) -> Tensor:
    """x with a new shape of the same size; one entry may be -1."""
    shape = checks.shape(shape, "reshape: shape", _error, wildcard=True)
    if shape.count(-1) == 1:
        known = int(np.prod([s for s in shape if s != -1]))
        size = int(np.prod(_shape(x)))
        if known and size % known == 0:
            shape = tuple(size // known if s == -1 else s for s in shape)
    return bind("reshape", [x], {"shape": shape})


def broadcast_to(x: Any, shape: Sequence[int]) -> Tensor:
    """x repeated to `shape` by numpy's broadcasting rules (a view: no data is copied).

    Raises:
        OpTypeError: x's shape does not broadcast to `shape`.
    """
    return bind("broadcast_to", [x], {"shape": checks.shape(shape, "broadcast_to: shape", _error)})


def transpose(x: Any, axes: Sequence[int] | None = None) -> Tensor:
    """x with its axes permuted (reversed by default, like numpy)."""
    ndim = len(_shape(x))
    # Only negative axes wrap (as in numpy): an axis past the end must fail the type rule,
    # not wrap around to a valid one.
    perm = tuple(reversed(range(ndim))) if axes is None else \
        checks.permutation(axes, ndim, "transpose: axes", _error)
    return bind("transpose", [x], {"perm": perm})


def slice(x: Any, starts: Sequence[int], stops: Sequence[int], steps: Sequence[int] | None = None,
          shape: Sequence[int] | None = None) -> Tensor:
    """The elements range(start, stop, step) along each axis (0 <= start <= n, -1 <= stop <= n:
    no wrap-around), like jax.lax.slice; `shape` may drop or add axes of size 1. x[key] is
    the same op with numpy's rules (`index`)."""
    starts, stops = (tuple(checks.integer(i, f"slice: {what}", _error) for i in v)
                     for what, v in (("starts", starts), ("stops", stops)))
    steps = (1,) * len(starts) if steps is None else \
        tuple(checks.integer(i, "slice: steps", _error) for i in steps)
    if shape is None:
        shape = tuple(len(range(a, b, c)) if c else 0
                      for a, b, c in zip(starts, stops, steps))
    return bind("slice", [x], {"starts": starts, "stops": stops, "steps": steps,
                               "shape": checks.shape(shape, "slice: shape", _error)})


def slice_scatter(x: Any, src: Any, starts: Sequence[int], stops: Sequence[int],
                  steps: Sequence[int] | None = None) -> Tensor:
    """x with the slice `slice(x, starts, stops, steps)` replaced by src (torch.slice_scatter
    over every axis at once); src has the slice's shape, up to axes of size 1."""
    steps = (1,) * len(starts) if steps is None else steps
    return bind("slice_scatter", [x, src],
                {what: tuple(checks.integer(i, f"slice_scatter: {what}", _error) for i in v)
                 for what, v in (("starts", starts), ("stops", stops), ("steps", steps))})



def concat(xs: Sequence[Any], axis: int = 0) -> Tensor:
    """The tensors of `xs` joined along `axis` (numpy's concatenate): the same dtype, the
    same size on every other axis."""
    xs = list(xs)
    if not xs:
        raise _error("concat: nothing to join (an empty list)")
    ndim = len(_shape(xs[0]))
    axis = checks.integer(axis, "concat: axis", _error)
    return bind("concat", xs, {"axis": axis + ndim if -ndim <= axis < 0 else axis})

def _basic_index(x: Any, key: Any) -> indexing.BasicIndex:
    shape = _shape(x)
    what = str(x.type) if isinstance(x, Tensor) else f"an array of shape {list(shape)}"
    return indexing.resolve(shape, key, _error, what)


def index(x: Any, key: Any) -> Tensor:
    """x[key] with numpy's basic indexing: ints, slices, None and ... (one `slice` op; a
    key that keeps every element only reshapes)."""
    ix = _basic_index(x, key)
    if ix.selects_all(_shape(x)):
        return reshape(x, ix.shape)
    return bind("slice", [x], ix._asdict())


def index_update(x: Any, key: Any, value: Any) -> Tensor:
    """x with x[key] set to value (broadcast to x[key]'s shape): numpy's x[key] = value as a
    new tensor, like JAX's x.at[key].set(value). A Parameter changes only by assign."""
    ix = _basic_index(x, key)
    src = broadcast_to(cast(value, _dtype(x)), ix.shape)
    return bind("slice_scatter", [x, src], {k: getattr(ix, k) for k in ("starts", "stops",
                                                                          "steps")})


def matmul(x: Any, y: Any) -> Tensor:
    """numpy.matmul: batched, 1-D operands promoted and the axis removed."""
    return bind("matmul", [x, y])


def full(shape: int | Sequence[int], value: builtins.float | int | bool, dtype: Any = f32) -> Tensor:
    """A constant tensor of `shape`, every element `value`.

    Args:
        shape: an int or a sequence of ints >= 0.
        value: a Python number that is a value of `dtype`: any number for a float dtype
            (rounded to it), an integer in range for an int dtype, 0, 1, True or False for
            bool.
        dtype: a graphopt dtype, its name ("f32") or a numpy dtype.

    Raises:
        OpTypeError: a bad shape, a dtype graphopt does not have, a value that is not one of
            the dtype's, or a tensor too large to allocate.
    """
    shape = checks.shape(shape, "full: shape", _error)
    d = _to_dtype(dtype, "full: dtype")
    checks.nbytes(shape, d, "full: shape", _error)
    value = checks.fill(value, d, "full: value", _error)
    return bind("constant", [], {"value": constant_value(value, d), "shape": shape, "dtype": d})


def zeros(shape: int | Sequence[int], dtype: Any = f32) -> Tensor:
    """`full(shape, 0, dtype)`."""
    return full(shape, 0, dtype)


def ones(shape: int | Sequence[int], dtype: Any = f32) -> Tensor:
    """`full(shape, 1, dtype)`."""
    return full(shape, 1, dtype)


def full_like(x: Any, value: builtins.float | int | bool, dtype: Any = None) -> Tensor:
    """A constant tensor of x's shape filled with `value`, in `dtype` (by default x's). Only
    x's type is read, not its values."""
    return full(_shape(x), value, dtype or _dtype(x))


def zeros_like(x: Any, dtype: Any = None) -> Tensor:
    """`full_like(x, 0, dtype)`."""
    return full_like(x, 0, dtype)


def ones_like(x: Any, dtype: Any = None) -> Tensor:
    """`full_like(x, 1, dtype)`."""
    return full_like(x, 1, dtype)


def _dtype(x: Any):
    return x.dtype if isinstance(x, Tensor) else \
        _to_dtype(np.asarray(x).dtype, "dtype of the operand")


def stop_gradient(x: Any) -> Tensor:
    """x itself, as a value autodiff treats as a constant: no gradient flows back through it."""
    return bind("stop_gradient", [x])


def _axis(x: Any, axis: int, op: str) -> int:
    return checks.axes(checks.integer(axis, f"{op}: axis", _error), len(_shape(x)),
                       f"{op}: axis", _error)[0]


def log_softmax(x: Any, axis: int = -1) -> Tensor:
    """log(softmax(x)) along `axis`, computed stably (one op)."""
    return bind("log_softmax", [x], {"axis": _axis(x, axis, "log_softmax")})


def softmax(x: Any, axis: int = -1) -> Tensor:
    """exp(x) / sum(exp(x)) along `axis`, as exp(log_softmax(x))."""
    return exp(log_softmax(x, axis))


def softmax_cross_entropy(logits: Any, labels: Any) -> Tensor:
    """Mean over the examples of -log softmax(logits)[label]: logits [..., classes], integer
    labels [...] in [0, classes). The labels get no gradient."""
    return bind("softmax_cross_entropy", [logits, labels])


def mse_loss(pred: Any, target: Any) -> Tensor:
    """Mean of (pred - target)**2 over the broadcast shape."""
    return bind("mse_loss", [pred, target])


def gather(table: Any, indices: Any) -> Tensor:
    """table[indices] along axis 0 (an embedding lookup): shape indices.shape + table.shape[1:]."""
    return bind("gather", [table, indices])


def scatter_add(x: Any, indices: Any, updates: Any) -> Tensor:
    """x with updates[i] added to row indices[i]; repeated rows accumulate (gather's VJP)."""
    return bind("scatter_add", [x, indices, updates])


def arange(n: int, dtype: Any = "i64") -> Tensor:
    """0, 1, ..., n-1 as a constant tensor."""
    n = checks.integer(n, "arange: n", _error, low=0)
    d = _to_dtype(dtype, "arange: dtype")
    return bind("constant", [], {"value": constant_value(np.arange(n), d), "shape": (n,),
                                 "dtype": d})


def one_hot(labels: Any, classes: int, dtype: Any = f32) -> Tensor:
    """[..., classes]: 1 where the class is the label, else 0 (labels: integer [...])."""
    classes = checks.integer(classes, "one_hot: classes", _error, low=0)
    labels = reshape(labels, _shape(labels) + (1,))
    return cast(equal(labels, arange(classes, _dtype(labels))), dtype)


# -- collectives: values exchanged between the ranks of a process group ---------------------------
def _group(group: Any, op: str) -> dict[str, Any]:
    """The attributes that name a process group: its name, and its number of ranks now, which
    the node keeps (a step traced for 4 ranks refuses to run on 2)."""
    if not isinstance(group, str):
        raise _error(f"{op}: group must be the name of a process group (a str), got {group!r}")
    try:
        return {"group": group, "ranks": comm.group(group).size}
    except CollectiveError as e:
        raise CollectiveError(e.message, loc=user_location()) from None


def _reduce(reduce: Any, op: str) -> str:
    return checks.choice(reduce, REDUCES, f"{op}: reduce", _error)


def all_reduce(x: Any, reduce: str = "sum", group: str = "world") -> Tensor:
    """The elementwise sum, max or mean of x over every rank of the process group, on every
    rank (graphopt.comm; the world is this one process unless a distributed runtime set
    one up). "mean" is the sum divided by the number of ranks, for float dtypes; a bool
    sum is a logical or.

    Raises:
        OpTypeError: a reduce that is not "sum", "max" or "mean"; "mean" of an integer or
            bool tensor.
        CollectiveError: no process group has that name.
    """
    return bind("all_reduce", [x], {**_group(group, "all_reduce"),
                                    "reduce": _reduce(reduce, "all_reduce")})


def all_reduce_when(x: Any, now: Any, every: int, reduce: str = "sum",
                    group: str = "world") -> Tensor:
    """all_reduce(x, reduce, group) on the runs where the bool scalar `now` is true, x itself on
    the others (without communicating): one compiled step that reduces on one call in
    `every` (a k-step gradient accumulation's k-th). `now` must be the same on every rank:
    computed from Parameters, constants and all_reduced values, never from a step input (the
    verifier checks it). `every` is what the cost model counts: bytes once per `every` runs.

    Raises:
        OpTypeError: `now` is not a bool scalar, `every` is below 1, or a bad reduce (as in
            all_reduce).
        CollectiveError: no process group has that name.
    """
    return bind("all_reduce_when", [x, now], {**_group(group, "all_reduce_when"),
                                              "reduce": _reduce(reduce, "all_reduce_when"),
                                              "every": every})


def reduce_scatter(x: Any, reduce: str = "sum", group: str = "world") -> Tensor:
    """The sum, max or mean of x over the ranks, split along axis 0 into one equal part per
    rank: this rank's part, of shape (x.shape[0] // ranks, *x.shape[1:]).

    Raises:
        OpTypeError: x.shape[0] is not a multiple of the number of ranks, x has no axis, or
            a bad reduce (as in all_reduce).
        CollectiveError: no process group has that name.
    """
    return bind("reduce_scatter", [x], {**_group(group, "reduce_scatter"),
                                        "reduce": _reduce(reduce, "reduce_scatter")})


def all_gather(x: Any, group: str = "world") -> Tensor:
    """Every rank's x, concatenated along axis 0 in rank order, on every rank: shape
    (ranks * x.shape[0], *x.shape[1:]).

    Raises:
        OpTypeError: x has no axis.
        CollectiveError: no process group has that name.
    """
    return bind("all_gather", [x], _group(group, "all_gather"))


def broadcast(x: Any, root: int = 0, group: str = "world") -> Tensor:
    """Rank `root`'s x, on every rank (the ranks' own values of x are not used).

    Raises:
        OpTypeError: root is not one of the ranks (0 <= root < ranks).
        CollectiveError: no process group has that name.
    """
    attrs = _group(group, "broadcast")
    return bind("broadcast", [x], {**attrs, "root": checks.integer(root, "broadcast: root",
                                                                    _error, low=0)})


def shard(x: Any, group: str = "world") -> Tensor:
    """This rank's part of x: axis 0 split into one equal part per rank, part number rank
    (x[r*k:(r+1)*k] with k = x.shape[0] // ranks). Nothing is sent; the value depends on the
    rank, so it is never computed at compile time.

    Raises:
        OpTypeError: x.shape[0] is not a multiple of the number of ranks, or x has no axis.
        CollectiveError: no process group has that name.
    """
    return bind("shard", [x], _group(group, "shard"))
def embedding(table: Any, ids: Any, sparse: bool = False, padding_idx: int | None = None
              ) -> Tensor:
    """table[ids], rows of an embedding table (torch's `nn.functional.embedding`): shape
    ids.shape + table.shape[1:]; ids are integers in [0, rows), anything else is an error
    when the step runs.

    Args:
        table: the table, [rows, ...].
        ids: integer ids, any shape.
        sparse: the gradient with respect to `table` is a row gradient (`Rows`: the ids
            and the cotangent's rows, torch's `sparse=True`), not a dense tensor of its shape.
        padding_idx: a row whose gradient is zero (its ids are left out of a row gradient),
            as in torch; negative counts from the end. None: no such row.
    """
    sparse = checks.flag(sparse, "embedding: sparse", _error)
    n = _shape(table)[0] if _shape(table) else 0
    if padding_idx is None:
        pad = -1
    else:
        pad = checks.integer(padding_idx, "embedding: padding_idx", _error)
        if not -n <= pad < n:
            raise _error(f"embedding: padding_idx {pad} is not a row of a table of {n} rows")
        pad %= n
    return bind("embedding", [table, ids], {"sparse": sparse, "padding_idx": pad})


def rows(indices: Any, values: Any, shape: Sequence[int]) -> Rows:
    """A row gradient of a dense tensor of `shape`: row `indices[k]` (an integer in
    [0, shape[0]], shape[0] meaning no row) has the values `values[k]`; indices may repeat
    (the rows add up). indices: [K]; values: float [K, *shape[1:]]."""
    shape = checks.shape(shape, "rows: shape", _error)
    return bind("rows", [indices, values], {"shape": shape})


def rows_indices(r: Rows) -> Tensor:
    """The indices of a row gradient, i64[K] (also `r.indices`)."""
    return bind("rows_indices", [r])


def rows_values(r: Rows) -> Tensor:
    """The values of a row gradient, [K, ...] (also `r.values`)."""
    return bind("rows_values", [r])


def with_values(r: Rows, values: Any) -> Rows:
    """The rows of `r` (its indices) with new values of the same shape."""
    return bind("with_values", [r, values])


def coalesce(r: Rows) -> Rows:
    """The same row gradient with unique indices (also `r.coalesce()`): sorted, the values
    of a repeated index summed in the order they come, then as many no-row entries (index
    shape[0], values 0) as it takes to keep K rows."""
    return bind("coalesce", [r])


def densify(r: Rows) -> Tensor:
    """The dense tensor of a row gradient (also `r.dense()`): zeros, each row's values added
    at its index (repeated indices add up; no-row entries are left out)."""
    return bind("densify", [r])


def take_rows(x: Any, r: Rows) -> Tensor:
    """The rows of x at the indices of `r`: [K, ...]; zeros for a no-row entry. x has the
    dense shape of `r`."""
    return bind("take_rows", [x, r])


def put_rows(x: Any, r: Rows) -> Tensor:
    """x with its rows at the indices of `r` replaced by r's values; `r` must have unique
    indices (coalesce it) and x's shape and dtype."""
    return bind("put_rows", [x, r])
