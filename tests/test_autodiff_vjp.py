"""Every VJP rule against central finite differences in f64, over shapes drawn by hypothesis
(broadcasting included), and the same gradients under jit (after the pass pipeline)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import graphopt as go
from graphopt import ops
from graphopt.autodiff.rules import NOT_DIFFERENTIABLE, VJP
from graphopt.ir import REGISTRY

SIDE = dict(max_side=3)


@dataclass
class Example:
    inputs: list[np.ndarray]  # every input of the function, in order
    diff: tuple[int, ...]  # the float inputs the gradient is checked for


@dataclass
class Case:
    fn: Callable[..., Any]
    example: Callable[[st.DataObject, np.random.Generator], Example]
    eps: float = 1e-6
    tol: float = 1e-6


# -- drawing inputs -----------------------------------------------------------------------------
def normal(rng, shape, low=None):
    """Normal values; with `low`, values in [low, low + 2] (a domain like log's)."""
    if low is not None:
        return np.asarray(low + 2 * rng.random(shape))
    return np.asarray(rng.standard_normal(shape))


def unary(low=None):
    def example(data, rng):
        shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, **SIDE))
        return Example([normal(rng, shape, low)], (0,))
    return example


def binary(low_x=None, low_y=None):
    def example(data, rng):
        shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3,
                                                             **SIDE)).input_shapes
        return Example([normal(rng, shapes[0], low_x), normal(rng, shapes[1], low_y)], (0, 1))
    return example


def where_example(data, rng):
    c, x, y = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3,
                                                          **SIDE)).input_shapes
    return Example([rng.random(c) < 0.5, normal(rng, x), normal(rng, y)], (1, 2))


def reduction_example(data, rng):
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, **SIDE))
    axes = data.draw(st.sets(st.integers(0, len(shape) - 1)) if shape else st.just(set()))
    keepdims = data.draw(st.booleans())
    return Example([normal(rng, shape), sorted(axes), keepdims], (0,))


def reshape_example(data, rng):
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, **SIDE))
    new = data.draw(st.sampled_from([(int(np.prod(shape)),), tuple(reversed(shape)),
                                     (1,) + shape]))
    return Example([normal(rng, shape), new], (0,))


def broadcast_to_example(data, rng):
    b = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=1, max_dims=3, **SIDE))
    return Example([normal(rng, b.input_shapes[0]), b.result_shape], (0,))


def transpose_example(data, rng):
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, **SIDE))
    perm = data.draw(st.permutations(range(len(shape))))
    return Example([normal(rng, shape), tuple(perm)], (0,))


def concat_example(data, rng):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, **SIDE))
    axis = data.draw(st.integers(0, len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    parts = [normal(rng, shape[:axis] + (n,) + shape[axis + 1:]) for n in sizes]
    return Example(parts + [axis], tuple(range(len(parts))))


def index_example(data, rng):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, **SIDE))
    return Example([normal(rng, shape), data.draw(hnp.basic_indices(shape, allow_newaxis=True))],
                   (0,))


def index_update_example(data, rng):
    x, key = index_example(data, rng).inputs
    return Example([x, key, normal(rng, x[key].shape)], (0, 2))


def matmul_example(data, rng):
    m, k, n = (data.draw(st.integers(1, 3)) for _ in range(3))
    batch = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, **SIDE))
    a_shape = data.draw(st.sampled_from([(k,), batch.input_shapes[0] + (m, k)]))
    b_shape = data.draw(st.sampled_from([(k,), batch.input_shapes[1] + (k, n)]))
    return Example([normal(rng, a_shape), normal(rng, b_shape)], (0, 1))


def axis_example(data, rng):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, **SIDE))
    return Example([normal(rng, shape), data.draw(st.integers(-len(shape), len(shape) - 1))],
                   (0,))


def cross_entropy_example(data, rng):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, **SIDE))
    labels = rng.integers(0, shape[-1], shape[:-1]).astype(data.draw(st.sampled_from(
        [np.int32, np.int64])))
    return Example([normal(rng, shape), labels], (0,))


def gather_example(data, rng):
    table = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, **SIDE))
    idx_shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=2, **SIDE))
    return Example([normal(rng, table), rng.integers(0, table[0], idx_shape)], (0,))


def scatter_add_example(data, rng):
    x = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, **SIDE))
    idx_shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=2, **SIDE))
    idx = rng.integers(0, x[0], idx_shape)  # repeated rows are likely: they must accumulate
    return Example([normal(rng, x), idx, normal(rng, idx_shape + x[1:])], (0, 2))


def rows_example(data, rng):
    """A tensor with an axis 0, which a collective splits or gathers."""
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, **SIDE))
    return Example([normal(rng, shape)], (0,))


def _reduce(name):
    return lambda x, axes, keepdims: getattr(ops, name)(x, axes, keepdims)


# One case per op that has a VJP rule (test_every_vjp_is_checked holds the table to that).
CASES: dict[str, Case] = {
    "add": Case(ops.add, binary()),
    "subtract": Case(ops.subtract, binary()),
    "multiply": Case(ops.multiply, binary()),
    "divide": Case(ops.divide, binary(low_y=0.5)),
    "power": Case(ops.power, binary(low_x=0.5)),
    "maximum": Case(ops.maximum, binary()),
    "minimum": Case(ops.minimum, binary()),
    "negative": Case(ops.negative, unary()),
    "abs": Case(ops.abs, unary()),
    "sign": Case(ops.sign, unary()),
    "sqrt": Case(ops.sqrt, unary(low=0.5)),
    "rsqrt": Case(ops.rsqrt, unary(low=0.5)),
    "exp": Case(ops.exp, unary()),
    "log": Case(ops.log, unary(low=0.5)),
    "sin": Case(ops.sin, unary()),
    "cos": Case(ops.cos, unary()),
    "where": Case(ops.where, where_example),
    # f64 -> f32 -> f64: linear, so a wide step only has f32 rounding to fight.
    "cast": Case(lambda x: ops.cast(ops.cast(x, go.f32) * 3, go.f64), unary(), eps=1e-2,
                 tol=1e-4),
    "sum": Case(_reduce("sum"), reduction_example),
    "mean": Case(_reduce("mean"), reduction_example),
    "max": Case(_reduce("max"), reduction_example),
    "reshape": Case(ops.reshape, reshape_example),
    "broadcast_to": Case(ops.broadcast_to, broadcast_to_example),
    "transpose": Case(ops.transpose, transpose_example),
    "slice": Case(ops.index, index_example),
    "concat": Case(lambda *xs: ops.concat(xs[:-1], xs[-1]), concat_example),
    "slice_scatter": Case(ops.index_update, index_update_example),
    "matmul": Case(ops.matmul, matmul_example),
    "depend": Case(ops.depend, unary()),
    "relu": Case(ops.relu, unary()),
    "tanh": Case(ops.tanh, unary()),
    "sigmoid": Case(ops.sigmoid, unary()),
    "softplus": Case(ops.softplus, unary()),
    "gelu": Case(ops.gelu, unary()),
    "log_softmax": Case(ops.log_softmax, axis_example),
    "softmax_cross_entropy": Case(ops.softmax_cross_entropy, cross_entropy_example),
    "mse_loss": Case(ops.mse_loss, binary()),
    "gather": Case(ops.gather, gather_example),
    "scatter_add": Case(ops.scatter_add, scatter_add_example),
    # In the world of this one process (tests/test_collectives.py has N ranks): the rules
    # are collectives, chained after the forward's under jit.
    "all_reduce": Case(lambda x: ops.all_reduce(x) * ops.all_reduce(x, "mean"), unary()),
    "reduce_scatter": Case(lambda x: ops.reduce_scatter(x) * ops.reduce_scatter(x, "mean"),
                           rows_example),
    "all_gather": Case(lambda x: ops.all_gather(x) * x, rows_example),
    "embedding": Case(ops.embedding, gather_example),  # (dense: a row gradient is not an array)
}


# -- checking -----------------------------------------------------------------------------------
def autodiff_grads(case: Case, ex: Example, ct: np.ndarray, jit: bool) -> list[np.ndarray]:
    """d sum(case.fn(inputs) * ct) / d inputs[diff], by value_and_grad (eager or jitted)."""
    def loss(xs):  # the other inputs (shapes, axes, labels) are constants of the graph
        args = list(ex.inputs)
        for i, x in zip(ex.diff, xs):
            args[i] = x
        return ops.sum(case.fn(*args) * ct)

    g = go.grad(loss)
    grads = (go.jit(g) if jit else g)(tuple(ex.inputs[i] for i in ex.diff))
    return [np.asarray(a) for a in grads]


def numeric_grad(case: Case, ex: Example, ct: np.ndarray, i: int) -> np.ndarray:
    """Central differences of sum(fn(inputs) * ct) in input i, one element at a time."""
    x = ex.inputs[i]
    out = np.zeros_like(x)
    for j in np.ndindex(x.shape):
        values = []
        for step in (case.eps, -case.eps):
            moved = x.copy()
            moved[j] += step
            args = list(ex.inputs)
            args[i] = moved
            values.append(np.sum(np.asarray(case.fn(*args)) * ct))
        out[j] = (values[0] - values[1]) / (2 * case.eps)
    return out


def check(name: str, data: st.DataObject, jit: bool = False) -> None:
    case = CASES[name]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    ex = case.example(data, rng)
    out_shape = np.shape(np.asarray(case.fn(*ex.inputs)))
    ct = rng.standard_normal(out_shape)
    for i, g in zip(ex.diff, autodiff_grads(case, ex, ct, jit)):
        assert g.shape == np.shape(ex.inputs[i]) and g.dtype == np.float64
        np.testing.assert_allclose(g, numeric_grad(case, ex, ct, i), rtol=case.tol,
                                   atol=case.tol, err_msg=f"{name}: input {i}")


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_vjp_matches_finite_differences(name, data):
    check(name, data)


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=2, deadline=None)
@given(data=st.data())
def test_vjp_under_jit_matches_finite_differences(name, data):
    check(name, data, jit=True)


def test_every_op_says_how_it_differentiates():
    assert not set(VJP) & NOT_DIFFERENTIABLE
    assert set(REGISTRY) - NOT_DIFFERENTIABLE - set(VJP) == set(), "add a VJP rule or say none"
    assert set(VJP) | NOT_DIFFERENTIABLE <= set(REGISTRY), "a rule for an op that is not declared"


def test_every_vjp_is_checked():
    with_rules = {name for name, rules in VJP.items() if rules is not None}
    # stop_gradient is the one op whose gradient is zero on purpose (test_autodiff.py).
    assert with_rules - set(CASES) == {"stop_gradient"}, "add a finite-difference case"
