"""The VJP table: for each op, how a cotangent of its output becomes one for each input.

A rule gets the output's cotangent `ct`, the output and the inputs as tensors, and the op's
attributes, and builds the gradient for one input out of graphopt.ops calls, so the backward
pass is made of ordinary nodes that every pass can see. A rule may return a gradient of the
broadcast (output) shape: the transformation sums it back to the input's shape in one place
(transform.py: `sum_to_shape`), so no rule repeats that.

Every op of the registry is either in `VJP` (one rule per input, None where no gradient flows:
an integer index, a condition) or in `NOT_DIFFERENTIABLE`; test_every_op_says_how_it_differentiates
holds the table to that. A rule may also refuse (NotDifferentiableError) for some attributes
(an all_reduce's max), and `WHY_NOT` says why an op of NOT_DIFFERENTIABLE has no rule where
that is not obvious.

The collectives' rules are collectives too, traced through graphopt.ops like any rule, so the
tracer chains them after the forward's: the cotangent of an all_reduce sum is the all_reduce
sum of the cotangents (every rank's output depends on every rank's input), an all_gather's
is the reduce_scatter sum of its cotangents, a reduce_scatter's the all_gather of its own.
"""
from __future__ import annotations

import builtins
import functools
from typing import Any, Callable

import numpy as np

from .. import ops
from ..errors import NotDifferentiableError
from ..ir.opdefs import GELU_A, GELU_C, gelu_inner

VjpRule = Callable[..., Any]  # rule(ct, out, *inputs, **attrs) -> the gradient of one input

# Ops no gradient goes through: their outputs are bools, tokens or fresh constants, or they
# exist only after autodiff (kernels and their stores).
# Row gradients are made by the backward pass, and read by optimizers after it: no gradient
# flows through them.
NOT_DIFFERENTIABLE = frozenset({
    "isfinite", "less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
    "logical_and", "logical_or", "logical_not", "constant", "assign", "kernel", "store",
    "broadcast", "shard", "all_reduce_when",
    "row_kernel", "rows", "rows_indices", "rows_values", "with_values", "coalesce",
    "densify", "take_rows", "put_rows", "check_bounds"})

# Why a gradient cannot go through an op of NOT_DIFFERENTIABLE, where the op's kind does not
# say it (autodiff's error adds it to its message).
WHY_NOT = {
    "broadcast": "its VJP depends on the rank: the root would get the sum of every rank's "
                 "cotangent and the other ranks zeros, and an op's attributes are the same on "
                 "every rank",
    "all_reduce_when": "it reduces gradients after autodiff (an accumulation's once-per-update "
                       "average); differentiate through all_reduce",
    "shard": "its VJP depends on the rank: the cotangent goes to this rank's part of axis 0 "
             "and zeros elsewhere, and an op's attributes are the same on every rank",
}


def _identity(ct: Any, out: Any, *inputs: Any, **attrs: Any) -> Any:
    """d out / d x = 1: the cotangent passes through (summed back to x's shape)."""
    return ct


def _extremum(wins: Callable[[Any, Any], Any]) -> tuple[VjpRule, VjpRule]:
    """maximum / minimum: the cotangent goes to the input that wins; a tie splits it in half,
    as JAX and torch do (both inputs are "the" maximum there)."""
    def share(ct: Any, a: Any, b: Any) -> Any:
        return ops.where(a == b, ct * 0.5, ops.where(wins(a, b), ct, 0))
    return (lambda ct, out, x, y: share(ct, x, y), lambda ct, out, x, y: share(ct, y, x))


def _power_dx(ct: Any, out: Any, x: Any, y: Any) -> Any:
    # y * x**(y-1); 0 where y == 0 (torch's convention: there x**(y-1) may be inf at x = 0).
    return ops.where(y == 0, 0, ct * y * x ** (y - 1))


def _power_dy(ct: Any, out: Any, x: Any, y: Any) -> Any:
    # x**y * log(x); 0 where x == 0 and y >= 0 (torch's convention: there log(x) is -inf).
    return ops.where((x == 0) & (y >= 0), 0, ct * out * ops.log(x))


def _unreduce(ct: Any, x: Any, axes: tuple[int, ...]) -> Any:
    """A reduction's cotangent put back on the reduced axes: reshape to the keepdims shape
    (a no-op for keepdims=True), then broadcast over x's shape."""
    kept = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    if ct.shape != kept:
        ct = ops.reshape(ct, kept)
    return ops.broadcast_to(ct, x.shape)


def _max(ct: Any, out: Any, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    # To the elements equal to the maximum, shared evenly between ties (as torch's amax and
    # JAX do), so the gradient sums to ct.
    hit = ops.cast(x == _unreduce(out, x, axes), x.dtype)
    return hit * _unreduce(ct, x, axes) / ops.sum(hit, axes, keepdims=True)


def _promote(ct: Any, a: Any, b: Any) -> tuple[Any, Any, Any]:
    """a, b and ct with numpy.matmul's 1-D promotion made explicit (a: [K] -> [1,K], b: [K] ->
    [K,1], ct given the axes the product removed), so both gradients are batched matmuls."""
    shape = list(ct.shape)
    if b.ndim == 1:
        shape.append(1)
    if a.ndim == 1:
        shape.insert(len(shape) - 1, 1)
    a2 = ops.reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = ops.reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    return a2, b2, ops.reshape(ct, shape) if tuple(shape) != ct.shape else ct


def _mT(x: Any) -> Any:
    """x with its last two axes swapped: the matrix transpose of every batch entry."""
    return ops.transpose(x, tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))


def _matmul_da(ct: Any, out: Any, a: Any, b: Any) -> Any:
    a2, b2, ct2 = _promote(ct, a, b)
    da = ops.matmul(ct2, _mT(b2))  # [..., M, K]; batch axes a was broadcast over are summed
    return ops.reshape(da, da.shape[:-2] + da.shape[-1:]) if a.ndim == 1 else da


def _matmul_db(ct: Any, out: Any, a: Any, b: Any) -> Any:
    a2, b2, ct2 = _promote(ct, a, b)
    db = ops.matmul(_mT(a2), ct2)  # [..., K, N]
    return ops.reshape(db, db.shape[:-1]) if b.ndim == 1 else db


def _gelu(ct: Any, out: Any, x: Any) -> Any:
    t = ops.tanh(gelu_inner(x))  # the forward's tanh, op for op: LLVM computes it once
    return ct * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_C * (1 + 3 * GELU_A * x * x))


def _cross_entropy(ct: Any, out: Any, logits: Any, labels: Any) -> Any:
    # d/dlogits of mean(-log softmax(logits)[label]) = (softmax - one_hot(label)) / examples
    target = ops.one_hot(labels, logits.shape[-1], logits.dtype)
    return (ops.softmax(logits, -1) - target) * (ct / labels.size)


def _no_max(op: str, reduce: str) -> None:
    if reduce == "max":
        raise NotDifferentiableError(
            f'{op} with reduce="max" has no gradient rule: which rank holds each maximum is '
            f'known only to the ranks that compare, so the cotangent cannot be sent back to '
            f'it; wrap its input in graphopt.stop_gradient if it needs none')


def _all_reduce(ct: Any, out: Any, x: Any, group: str, ranks: int, reduce: str) -> Any:
    # y = sum over ranks of x_r on every rank: d(sum over ranks of L_r)/d x_r is the sum of
    # every rank's cotangent (the mean's: its mean).
    _no_max("all_reduce", reduce)
    return ops.all_reduce(ct, reduce, group)


def _reduce_scatter(ct: Any, out: Any, x: Any, group: str, ranks: int, reduce: str) -> Any:
    # Rank s's part is the sum over ranks of x_r's part s: x_r's cotangent is every rank's
    # cotangent in its place, the all_gather of them (divided by ranks for the mean).
    _no_max("reduce_scatter", reduce)
    gathered = ops.all_gather(ct, group)
    return gathered / ranks if reduce == "mean" else gathered


def _mse(ct: Any, pred: Any, target: Any) -> Any:
    diff = pred - target
    return diff * (ct * (2 / max(diff.size, 1)))  # (an empty diff has an empty gradient)


class _PerInput:
    """The rules of a variadic op (concat): `rules[i]` is `rule(i, ...)` for every input i."""

    def __init__(self, rule: Callable[..., Any]):
        self.rule = rule

    def __getitem__(self, i: int) -> Callable[..., Any]:
        return functools.partial(self.rule, i)


def _concat(i: int, ct: Any, out: Any, *xs: Any, axis: int) -> Any:
    """Input i's part of the cotangent: its range along `axis`."""
    start = builtins.sum(x.shape[axis] for x in xs[:i])
    starts = [0] * ct.ndim
    stops = list(ct.shape)
    starts[axis], stops[axis] = start, start + xs[i].shape[axis]
    return ops.slice(ct, starts, stops, shape=xs[i].shape)


def _embedding(ct: Any, out: Any, table: Any, ids: Any, sparse: bool, padding_idx: int) -> Any:
    """The table's gradient: row ids[k] gets the cotangent's row k, an id equal to padding_idx
    none (it becomes the no-row index, as torch leaves it out), as a row gradient (sparse)
    or added into zeros."""
    n = table.shape[0]
    flat = ops.reshape(ids, (ids.size,))
    if padding_idx >= 0:
        flat = ops.where(flat == padding_idx, n, flat)
    g = ops.rows(flat, ops.reshape(ct, (ids.size,) + table.shape[1:]), table.shape)
    return g if sparse else ops.densify(g)


VJP: dict[str, tuple[VjpRule | None, ...]] = {
    # elementwise
    "add": (_identity, _identity),
    "subtract": (_identity, lambda ct, out, x, y: -ct),
    "multiply": (lambda ct, out, x, y: ct * y, lambda ct, out, x, y: ct * x),
    "divide": (lambda ct, out, x, y: ct / y, lambda ct, out, x, y: -ct * out / y),
    "power": (_power_dx, _power_dy),
    "maximum": _extremum(lambda a, b: a > b),
    "minimum": _extremum(lambda a, b: a < b),
    "negative": (lambda ct, out, x: -ct,),
    "abs": (lambda ct, out, x: ct * ops.sign(x),),
    "sign": (None,),  # piecewise constant: zero gradient
    "sqrt": (lambda ct, out, x: ct * 0.5 / out,),
    "rsqrt": (lambda ct, out, x: ct * -0.5 * out / x,),
    "exp": (lambda ct, out, x: ct * out,),
    "log": (lambda ct, out, x: ct / x,),
    "sin": (lambda ct, out, x: ct * ops.cos(x),),
    "cos": (lambda ct, out, x: -ct * ops.sin(x),),
    "where": (None, lambda ct, out, c, x, y: ops.where(c, ct, 0),
              lambda ct, out, c, x, y: ops.where(c, 0, ct)),
    # Only float-to-float casts carry a gradient: autodiff stops at integers.
    "cast": (lambda ct, out, x, dtype: ops.cast(ct, x.dtype),),
    "relu": (lambda ct, out, x: ops.where(x > 0, ct, 0),),
    "tanh": (lambda ct, out, x: ct * (1 - out * out),),
    "sigmoid": (lambda ct, out, x: ct * out * (1 - out),),
    "softplus": (lambda ct, out, x: ct * ops.sigmoid(x),),
    "gelu": (_gelu,),
    "stop_gradient": (None,),  # the one op whose gradient is zero on purpose
    # reductions
    "sum": (lambda ct, out, x, axes, keepdims: _unreduce(ct, x, axes),),
    "max": (_max,),
    "mean": (lambda ct, out, x, axes, keepdims:
             _unreduce(ct, x, axes) / int(np.prod([x.shape[a] for a in axes])),),
    # shapes
    "reshape": (lambda ct, out, x, shape: ops.reshape(ct, x.shape),),
    "broadcast_to": (_identity,),  # ct has the broadcast shape: it is summed back
    "transpose": (lambda ct, out, x, perm: ops.transpose(ct, tuple(np.argsort(perm))),),
    "slice": (lambda ct, out, x, starts, stops, steps, shape: ops.slice_scatter(
        ops.zeros(x.shape, x.dtype), ct, starts, stops, steps),),
    "slice_scatter": (lambda ct, out, x, src, starts, stops, steps: ops.slice_scatter(
                          ct, ops.zeros(src.shape, src.dtype), starts, stops, steps),
                      lambda ct, out, x, src, starts, stops, steps: ops.slice(
                          ct, starts, stops, steps, src.shape)),
    "concat": _PerInput(_concat),
    "matmul": (_matmul_da, _matmul_db),
    "depend": (_identity,),
    # network ops
    "log_softmax": (lambda ct, out, x, axis:
                    ct - ops.exp(out) * ops.sum(ct, axis, keepdims=True),),
    "softmax_cross_entropy": (_cross_entropy, None),
    "mse_loss": (lambda ct, out, p, t: _mse(ct, p, t), lambda ct, out, p, t: -_mse(ct, p, t)),
    # rows along axis 0
    "gather": (lambda ct, out, table, idx: ops.scatter_add(ops.zeros_like(table), idx, ct),
               None),
    "scatter_add": (_identity, None, lambda ct, out, x, idx, upd: ops.gather(ct, idx)),
    # collectives (broadcast and shard: WHY_NOT)
    "all_reduce": (_all_reduce,),
    "reduce_scatter": (_reduce_scatter,),
    # every rank's x is in every rank's output: the sum of the cotangents of its place
    "all_gather": (lambda ct, out, x, group, ranks: ops.reduce_scatter(ct, "sum", group),),
    "embedding": (_embedding, None),
}
