"""The frontend: tracing (operators, methods, ops, weak scalars, Parameters, assigns and their
write-after-read edges, locations), eager mode against jit, and the jit signature cache.

Expected values are always computed with numpy on the same inputs, never written by hand.
"""
import copy
import os
import pickle
import re
import warnings

import numpy as np
import pytest
import support

import graphopt as go
from graphopt import ops
from graphopt.errors import OpTypeError, SignatureError
from graphopt.frontend.traces import current_trace

# Bit-for-bit comparisons with numpy: on the reference backend (see conftest.py).
pytestmark = pytest.mark.usefixtures("reference_backend")

HERE = os.path.basename(__file__)


# -- helpers ------------------------------------------------------------------------------------
def line_of(marker: str) -> int:
    """The line of this file ending in `# <marker>` (exactly one)."""
    return support.line_of(__file__, marker)


def nodes(graph: go.Graph, op: str) -> list:
    return [n for n in graph.nodes if n.op == op]


def op_names(graph: go.Graph) -> list[str]:
    return [n.op for n in graph.nodes if n.op != "constant"]


def producer_of(graph: go.Graph, value):
    return next(n for n in graph.nodes if value in n.outputs)


def ancestors(graph: go.Graph, value) -> set[int]:
    """ids of the nodes `value` depends on, through data and after edges (itself included)."""
    producer = {v: n for n in graph.nodes for v in n.outputs}
    seen, stack = set(), [value]
    while stack:
        n = producer.get(stack.pop())
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        stack.extend(n.operands())
    return seen


def assert_same(got, want) -> None:
    """Same dtype, shape and values (NaN equal to NaN)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want)


def run_jit(fn, *args):
    """fn run once under a fresh jit; results as numpy arrays."""
    return go.jit(fn)(*args)


@pytest.fixture
def x34(rng):
    return rng.uniform(0.5, 2.0, (3, 4))  # positive: valid for log, sqrt, power


@pytest.fixture
def y34(rng):
    return rng.uniform(0.5, 2.0, (3, 4))


# -- operators and ops: the graph they build, and what it computes -------------------------------
# power's reference: the C library's pow (docs/ir.md), which numpy's is not on AVX-512 CPUs
from graphopt.ir.libm import power as c_power  # noqa: E402
BINARY_OPERATORS = [
    ("add", lambda a, b: a + b, np.add),
    ("subtract", lambda a, b: a - b, np.subtract),
    ("multiply", lambda a, b: a * b, np.multiply),
    ("divide", lambda a, b: a / b, np.divide),
    ("power", lambda a, b: a ** b, c_power),
    ("less", lambda a, b: a < b, np.less),
    ("less_equal", lambda a, b: a <= b, np.less_equal),
    ("greater", lambda a, b: a > b, np.greater),
    ("greater_equal", lambda a, b: a >= b, np.greater_equal),
    ("equal", lambda a, b: a == b, np.equal),
    ("not_equal", lambda a, b: a != b, np.not_equal),
]


@pytest.mark.parametrize("name,operator,reference", BINARY_OPERATORS,
                         ids=[b[0] for b in BINARY_OPERATORS])
def test_binary_operator_traces_one_node_and_computes_numpy(name, operator, reference, x34, y34):
    y34[0, :2] = x34[0, :2]  # some equal elements, so == and <= see both outcomes
    g = go.trace(operator, x34, y34)
    assert op_names(g) == [name]
    node = g.nodes[0]
    assert node.inputs == g.args  # x then y, in order
    want = reference(x34, y34)
    assert str(node.out.type) == f"{'bool' if want.dtype == bool else 'f64'}[3,4]"
    assert_same(run_jit(operator, x34, y34), want)
    # The same function on numpy arrays through graphopt.ops (eager) gives the same result.
    assert_same(getattr(ops, name)(x34, y34), want)


@pytest.mark.parametrize("name,operator,reference", BINARY_OPERATORS,
                         ids=[b[0] for b in BINARY_OPERATORS])
def test_reflected_operator_with_numpy_array_on_the_left(name, operator, reference, x34, y34):
    # ndarray (op) tensor must build a graph node, not let numpy loop over the tensor.
    g = go.trace(lambda y: operator(x34, y), y34)
    (const,) = nodes(g, "constant")
    np.testing.assert_array_equal(const.attrs["value"], x34)
    (node,) = [n for n in g.nodes if n.op != "constant"]
    # numpy hands its ufunc to the tensor (__array_ufunc__), comparisons too: the array
    # stays the left operand.
    assert node.op == name and node.inputs == [const.out, g.args[0]]
    assert_same(run_jit(lambda y: operator(x34, y), y34), reference(x34, y34))


def test_matmul_operator_and_reflected(rng):
    a = rng.standard_normal((2, 3))
    b = rng.standard_normal((3, 4))
    assert op_names(go.trace(lambda a, b: a @ b, a, b)) == ["matmul"]
    assert_same(run_jit(lambda a, b: a @ b, a, b), a @ b)
    assert_same(run_jit(lambda b: a @ b, b), a @ b)  # ndarray @ tensor
    v = rng.standard_normal(3)
    assert_same(run_jit(lambda v, b: v @ b, v, b), v @ b)  # 1-D operand promoted and removed
    batch = rng.standard_normal((5, 2, 3))
    assert_same(run_jit(lambda x, b: x @ b, batch, b), batch @ b)


def test_unary_operators(x34):
    x = x34 - 1.25  # both signs
    g = go.trace(lambda x: -x, x)
    assert op_names(g) == ["negative"]
    assert_same(run_jit(lambda x: -x, x), -x)
    assert_same(run_jit(lambda x: abs(x), x), np.abs(x))
    assert op_names(go.trace(lambda x: abs(x), x)) == ["abs"]
    assert op_names(go.trace(lambda x: +x, x)) == []  # unary plus is the tensor itself


def test_logical_operators(rng):
    a = rng.random(10) < 0.5
    b = rng.random(10) < 0.5
    fn = lambda a, b: (a & b) | ~a  # noqa: E731
    assert op_names(go.trace(fn, a, b)) == ["logical_and", "logical_not", "logical_or"]
    assert_same(run_jit(fn, a, b), (a & b) | ~a)
    assert_same(run_jit(lambda a: True & a, a), a)  # reflected, with a weak Python bool
    assert_same(run_jit(lambda a: False | a, a), a)


def test_comparison_results_combine_with_logical_operators(x34):
    fn = lambda x: ~(x > 1.0) & (x < 1.5) | (x == 0.75)  # noqa: E731
    want = ~(x34 > 1.0) & (x34 < 1.5) | (x34 == 0.75)
    assert_same(run_jit(fn, x34), want)


UNARY_OPS = [("negative", np.negative), ("abs", np.abs), ("sign", np.sign), ("sqrt", np.sqrt),
             ("rsqrt", lambda x: 1.0 / np.sqrt(x)), ("exp", np.exp), ("log", np.log),
             ("isfinite", np.isfinite)]


@pytest.mark.parametrize("name,reference", UNARY_OPS, ids=[u[0] for u in UNARY_OPS])
def test_unary_ops(name, reference, x34):
    fn = getattr(ops, name)
    g = go.trace(fn, x34)
    assert op_names(g) == [name]
    want = reference(x34)
    jitted = run_jit(fn, x34)
    assert_same(jitted, want)
    assert_same(fn(x34), jitted)  # eager and jit agree exactly


BINARY_OPS = [("add", np.add), ("subtract", np.subtract), ("multiply", np.multiply),
              ("divide", np.divide), ("power", c_power), ("maximum", np.maximum),
              ("minimum", np.minimum), ("less", np.less), ("less_equal", np.less_equal),
              ("greater", np.greater), ("greater_equal", np.greater_equal),
              ("equal", np.equal), ("not_equal", np.not_equal)]


@pytest.mark.parametrize("name,reference", BINARY_OPS, ids=[b[0] for b in BINARY_OPS])
def test_binary_ops_broadcast(name, reference, rng):
    x = rng.uniform(0.5, 2.0, (3, 1))
    y = rng.uniform(0.5, 2.0, (4,))
    fn = getattr(ops, name)
    g = go.trace(fn, x, y)
    assert op_names(g) == [name]
    assert g.nodes[0].out.type.shape == (3, 4)
    assert_same(run_jit(fn, x, y), reference(x, y))
    assert_same(fn(x, y), reference(x, y))


@pytest.mark.parametrize("name,reference", [("logical_and", np.logical_and),
                                            ("logical_or", np.logical_or)])
def test_logical_ops(name, reference, rng):
    a, b = rng.random((2, 6)) < 0.5
    fn = getattr(ops, name)
    assert op_names(go.trace(fn, a, b)) == [name]
    assert_same(run_jit(fn, a, b), reference(a, b))
    assert_same(run_jit(ops.logical_not, a), np.logical_not(a))


def test_integer_ops_keep_integer_dtypes(rng):
    a = rng.integers(-5, 5, (4,)).astype(np.int32)
    b = rng.integers(1, 4, (4,)).astype(np.int32)
    for fn, ref in [(ops.add, np.add), (ops.multiply, np.multiply), (ops.power, np.power),
                    (ops.maximum, np.maximum), (ops.minimum, np.minimum)]:
        assert_same(run_jit(fn, a, b), ref(a, b))
    assert_same(run_jit(ops.abs, a), np.abs(a))
    assert_same(run_jit(ops.sign, a), np.sign(a))
    assert_same(run_jit(lambda a: a.sum(), a), np.sum(a, dtype=np.int32))


def test_where(x34, y34):
    fn = lambda x, y: ops.where(x > y, x, y)  # noqa: E731
    g = go.trace(fn, x34, y34)
    assert op_names(g) == ["greater", "where"]
    assert_same(run_jit(fn, x34, y34), np.where(x34 > y34, x34, y34))
    # Weak Python scalars in the branches take the tensor's dtype; the condition broadcasts.
    f32 = x34.astype(np.float32)
    fn2 = lambda x: ops.where(x > 1.0, x, 0.0)  # noqa: E731
    assert_same(run_jit(fn2, f32), np.where(f32 > 1.0, f32, np.float32(0.0)))
    cond = np.array([True, False, True, False])
    assert_same(run_jit(lambda x: ops.where(cond, x, -x), x34), np.where(cond, x34, -x34))


def test_cast_and_astype(x34):
    x = (x34 - 1.25) * 10
    for dtype, np_dtype in [(go.f32, np.float32), ("f16", np.float16), (np.int32, np.int32),
                            (go.i64, np.int64), (go.bool_, np.bool_), ("f64", np.float64)]:
        g = go.trace(lambda x: x.astype(dtype), x)
        assert op_names(g) == ["cast"]
        assert g.nodes[0].attrs["dtype"] == go.ir.to_dtype(np_dtype)
        assert_same(run_jit(lambda x: x.astype(dtype), x), x.astype(np_dtype))
        assert_same(run_jit(lambda x: ops.cast(x, dtype), x), x.astype(np_dtype))


def test_bf16_cast_round_trips_through_numpy(x34):
    import ml_dtypes
    want = x34.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = run_jit(lambda x: x.astype(go.bf16).astype(go.f32), x34)
    assert_same(got, want)


# -- reductions ---------------------------------------------------------------------------------
REDUCTIONS = [("sum", np.sum), ("mean", np.mean), ("max", np.max)]
AXES = [None, 0, 1, -1, (0, 2), (2, 0), (-3, -1), (0, 1, 2)]


@pytest.mark.parametrize("name,reference", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_as_methods_and_ops(name, reference, axis, keepdims, rng):
    x = rng.standard_normal((2, 3, 4))
    want = reference(x, axis=axis, keepdims=keepdims)
    method = lambda x: getattr(x, name)(axis=axis, keepdims=keepdims)  # noqa: E731
    g = go.trace(method, x)
    assert op_names(g) == [name]
    assert list(g.nodes[0].attrs["axes"]) == sorted(range(3) if axis is None else
                                                   {a % 3 for a in np.atleast_1d(axis)})
    assert g.nodes[0].out.type.shape == want.shape
    got = run_jit(method, x)
    np.testing.assert_allclose(got, want, rtol=1e-14)  # summation order may differ
    assert got.dtype == want.dtype and got.shape == want.shape
    func = lambda x: getattr(ops, name)(x, axis, keepdims)  # noqa: E731
    assert_same(run_jit(func, x), got)
    assert_same(method(go.Parameter(x)), got)  # eager gives the jit result exactly


def test_reduction_positional_axis_and_numpy_integer_axis(rng):
    x = rng.standard_normal((3, 5))
    assert_same(run_jit(lambda x: x.sum(1), x), x.sum(1))
    assert_same(run_jit(lambda x: x.max(np.int64(0)), x), x.max(0))
    assert_same(run_jit(lambda x: x.mean(axis=[np.int32(1)]), x), x.mean(axis=1))


# -- shape ops ----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(12,), (4, 3), (2, -1), (-1, 6), (-1,), (1, 2, 1, 6),
                                   (2, 2, -1)], ids=str)
def test_reshape(shape, x34):
    want = x34.reshape(shape)
    for fn in (lambda x: x.reshape(shape), lambda x: x.reshape(*shape),
               lambda x: ops.reshape(x, shape)):
        g = go.trace(fn, x34)
        assert op_names(g) == ["reshape"]
        assert tuple(g.nodes[0].attrs["shape"]) == want.shape  # -1 resolved in the IR
        assert_same(run_jit(fn, x34), want)


def test_reshape_to_scalar_and_from_scalar():
    x = np.array([3.5])
    assert_same(run_jit(lambda x: x.reshape(()), x), x.reshape(()))
    s = np.array(2.5)
    assert_same(run_jit(lambda s: s.reshape(1, 1), s), s.reshape(1, 1))
    assert_same(run_jit(lambda s: s.reshape(-1), s), s.reshape(-1))


@pytest.mark.parametrize("axes", [None, (1, 0, 2), (2, 0, 1), (-1, 0, 1), (0, -2, -1)],
                         ids=str)
def test_transpose(axes, rng):
    x = rng.standard_normal((2, 3, 4))
    want = np.transpose(x, axes)
    fns = [lambda x: x.transpose(axes) if axes is not None else x.transpose(),
           lambda x: ops.transpose(x, axes)]
    if axes is not None:
        fns.append(lambda x: x.transpose(*axes))
    for fn in fns:
        g = go.trace(fn, x)
        assert op_names(g) == ["transpose"]
        assert list(g.nodes[0].attrs["perm"]) == [a % 3 for a in (axes or (2, 1, 0))]
        assert_same(run_jit(fn, x), want)


def test_T_property(rng):
    m = rng.standard_normal((2, 3))
    assert_same(run_jit(lambda m: m.T, m), m.T)
    assert_same(run_jit(lambda m: m @ m.T, m), m @ m.T)
    v = rng.standard_normal(3)
    assert_same(run_jit(lambda v: v.T, v), v.T)  # 1-D: unchanged
    s = np.array(1.5)
    assert_same(run_jit(lambda s: s.T, s), s.T)  # 0-D: unchanged


def test_broadcast_to(rng):
    x = rng.standard_normal((3, 1))
    fn = lambda x: ops.broadcast_to(x, (2, 3, 4))  # noqa: E731
    assert op_names(go.trace(fn, x)) == ["broadcast_to"]
    assert_same(run_jit(fn, x), np.broadcast_to(x, (2, 3, 4)))


def test_tensor_shape_properties(x34):
    seen = {}

    def fn(x):
        seen.update(shape=x.shape, ndim=x.ndim, size=x.size, dtype=x.dtype, len=len(x))
        return x

    go.trace(fn, x34)
    assert seen == {"shape": (3, 4), "ndim": 2, "size": 12, "dtype": go.f64, "len": 3}


# -- constants ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["f32", "f16", "i32", "i64", "bool", "f64"])
def test_full_zeros_ones(dtype):
    npd = go.ir.to_dtype(dtype).np_dtype
    g = go.trace(lambda: ops.full((2, 3), 1, dtype))
    (node,) = g.nodes
    assert node.op == "constant" and str(node.out.type) == f"{dtype}[2,3]"
    assert_same(run_jit(lambda: ops.full((2, 3), 1, dtype)), np.full((2, 3), 1, npd))
    assert_same(run_jit(lambda: ops.zeros(4, dtype)), np.zeros(4, npd))
    assert_same(run_jit(lambda: ops.ones((), dtype)), np.ones((), npd))


def test_full_default_dtype_is_f32():
    assert_same(run_jit(lambda: ops.full(3, 2.5)), np.full(3, 2.5, np.float32))
    assert_same(run_jit(lambda: ops.zeros((2, 2))), np.zeros((2, 2), np.float32))


def test_like_constructors_follow_the_operand(rng):
    x = rng.standard_normal((2, 3)).astype(np.float16)
    assert_same(run_jit(lambda x: ops.zeros_like(x), x), np.zeros_like(x))
    assert_same(run_jit(lambda x: ops.ones_like(x), x), np.ones_like(x))
    assert_same(run_jit(lambda x: ops.full_like(x, 7.5), x), np.full_like(x, 7.5))
    assert_same(run_jit(lambda x: ops.ones_like(x, "i32"), x), np.ones_like(x, np.int32))
    p = go.Parameter(np.zeros((4,), np.int32), name="like_p")
    assert_same(run_jit(lambda: ops.full_like(p, 3)), np.full((4,), 3, np.int32))


def test_numpy_arrays_are_captured_as_constants(rng):
    c = rng.standard_normal((2, 3))
    fn = go.jit(lambda x: x + c)
    x = rng.standard_normal((2, 3))
    g = fn.lower(x).graph
    (const,) = nodes(g, "constant")
    assert str(const.out.type) == "f64[2,3]"
    np.testing.assert_array_equal(const.attrs["value"], c)
    first = fn(x)
    assert_same(first, x + c)
    # The compiled step holds the array as it was traced, not a view of the user's array.
    c_before = c.copy()
    c[...] = 100.0
    assert fn.cache_info().traces == 1
    assert_same(fn(x), x + c_before)
    assert fn.cache_info().traces == 1


def test_numpy_scalar_is_strongly_typed(rng):
    x = rng.standard_normal(3).astype(np.float32)
    assert_same(run_jit(lambda x: x * np.float32(3), x), x * np.float32(3))
    with pytest.raises(OpTypeError, match="different dtypes"):
        go.trace(lambda x: x * np.float64(3), x)


# -- weakly typed Python scalars --------------------------------------------------------------
def test_python_float_takes_f16(rng):
    x = rng.standard_normal(5).astype(np.float16)
    g = go.trace(lambda x: x * 0.5, x)
    (const,) = nodes(g, "constant")
    assert str(const.out.type) == "f16[]"
    assert str(g.outputs[0].type) == "f16[5]"
    assert_same(run_jit(lambda x: x * 0.5, x), x * np.float16(0.5))
    assert_same(run_jit(lambda x: 1.0 - x, x), np.float16(1.0) - x)
    assert_same(run_jit(lambda x: 2 ** x, x), np.float16(2) ** x)


@pytest.mark.parametrize("np_dtype", [np.int32, np.int64])
def test_python_int_takes_the_integer_dtype(np_dtype, rng):
    x = rng.integers(-10, 10, 6).astype(np_dtype)
    g = go.trace(lambda x: x * 2 + 1, x)
    assert all(n.out.type.dtype.np_dtype == np_dtype for n in g.nodes)
    assert_same(run_jit(lambda x: x * 2 + 1, x), x * np_dtype(2) + np_dtype(1))
    assert_same(run_jit(lambda x: x > 0, x), x > 0)


def test_python_int_takes_a_float_dtype(rng):
    x = rng.standard_normal(4).astype(np.float32)
    assert_same(run_jit(lambda x: x * 3, x), x * np.float32(3))


@pytest.mark.parametrize("np_dtype", [np.int32, np.int64])
def test_python_float_with_an_int_tensor_is_an_error(np_dtype):
    x = np.arange(3, dtype=np_dtype)
    with pytest.raises(OpTypeError, match="Python float"):
        go.trace(lambda x: x * 0.5, x)
    with pytest.raises(OpTypeError, match="Python float"):
        go.Parameter(x) * 0.5  # eager too


def test_python_bool_with_bool_tensor(rng):
    a = rng.random(5) < 0.5
    assert_same(run_jit(lambda a: a == True, a), a == True)  # noqa: E712
    assert_same(run_jit(lambda a: ops.logical_and(a, True), a), a)


def test_scalar_only_expressions_use_default_dtypes():
    # The weak dtypes, as for a Python scalar argument (tests/test_weak_types.py has the rest).
    assert_same(run_jit(lambda: ops.add(1.5, 2)), np.float64(3.5))
    assert_same(run_jit(lambda: ops.add(1, 2)), np.int64(3))


def test_python_scalar_argument_is_weak_and_rounded_once(rng):
    x = rng.standard_normal(4).astype(np.float32)
    lr = 0.1  # not exact in f32: the step must round it once, to the nearest f32
    g = go.jit(lambda x, lr: x * lr).lower(x, lr).graph
    (lr_in,) = [v for v in g.args if v.name == "lr"]
    assert str(lr_in.type) == "f64[]"  # kept at full precision until it meets a tensor
    assert_same(go.jit(lambda x, lr: x * lr)(x, lr), x * np.float32(lr))
    assert_same(go.jit(lambda x, lr: x * lr)(x.astype(np.float16), lr),
                x.astype(np.float16) * np.float16(lr))
    with pytest.raises(OpTypeError, match="Python float"):
        go.jit(lambda x, lr: x * lr)(np.arange(3, dtype=np.int32), lr)


def test_python_int_argument_with_int32_tensor(rng):
    x = rng.integers(0, 10, 5).astype(np.int32)
    assert_same(go.jit(lambda x, k: x + k)(x, 3), x + np.int32(3))


# -- nested arguments ---------------------------------------------------------------------------
def test_nested_arguments_name_the_graph_inputs(rng):
    def step(grads, state, pair, lr):
        return ([g * lr for g in grads], state["m"] + state["v"], pair[0] - pair[1])

    grads = [rng.standard_normal(3), rng.standard_normal((2, 2))]
    state = {"m": rng.standard_normal(2), "v": rng.standard_normal(2)}
    pair = (rng.standard_normal(1), rng.standard_normal(1))
    g = go.trace(step, grads, state, pair, 0.5)
    text = str(g)
    for line in ["arg %grads.0: f64[3]", "arg %grads.1: f64[2,2]", "arg %state.m: f64[2]",
                 "arg %state.v: f64[2]", "arg %pair.0: f64[1]", "arg %pair.1: f64[1]",
                 "arg %lr: f64[]"]:
        assert f"  {line}\n" in text
    assert [v.name for v in g.args] == ["grads.0", "grads.1", "state.m", "state.v", "pair.0",
                                        "pair.1", "lr"]
    out = go.jit(step)(grads, state, pair, 0.5)
    assert isinstance(out, tuple) and isinstance(out[0], list) and len(out[0]) == 2
    assert_same(out[0][0], grads[0] * 0.5)
    assert_same(out[0][1], grads[1] * 0.5)
    assert_same(out[1], state["m"] + state["v"])
    assert_same(out[2], pair[0] - pair[1])


def test_nested_output_structure_is_rebuilt(rng):
    x = rng.standard_normal(3)
    out = go.jit(lambda x: {"a": x, "b": [x * 2, (x + 1,)], "c": None})(x)
    assert set(out) == {"a", "b", "c"} and out["c"] is None
    assert_same(out["a"], x)
    assert_same(out["b"][0], x * 2)
    assert isinstance(out["b"][1], tuple)
    assert_same(out["b"][1][0], x + 1)


def test_keyword_and_default_arguments(rng):
    x = rng.standard_normal(3)

    def fn(x, scale=2.0, *, shift):
        return x * scale + shift

    g = go.trace(fn, x, shift=1.0)
    assert [v.name for v in g.args] == ["x", "shift"]  # a default not passed is a constant
    assert [v.name for v in go.trace(fn, x, 3.0, shift=1.0).args] == ["x", "scale", "shift"]
    assert_same(go.jit(fn)(x, shift=1.0), x * 2.0 + 1.0)
    assert_same(go.jit(fn)(x, 3.0, shift=1.0), x * 3.0 + 1.0)


# -- Parameters ---------------------------------------------------------------------------------
def test_parameter_basics(rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    p = go.Parameter(a, name="layer.w")
    assert p.name == "layer.w" and p.shape == (2, 3) and p.dtype == go.f32
    kept = a.copy()
    got = p.numpy()
    assert_same(got, kept)
    got[...] = 0  # a copy
    assert_same(p.numpy(), kept)
    a[...] = 0  # the Parameter owns its own buffer
    assert_same(p.numpy(), kept)
    assert go.Parameter(np.ones(2)).name != go.Parameter(np.ones(2)).name  # fresh default names
    assert go.Parameter([1, 2], dtype="f16").dtype == go.f16


def test_parameter_captured_by_closure_is_a_param_input(rng):
    w0 = rng.standard_normal(3)
    w = go.Parameter(w0, name="w")

    def step(g):
        go.assign(w, w - 0.1 * g)

    graph = go.trace(step, np.ones(3))
    assert [(v.kind, v.name) for v in graph.inputs] == [("arg", "g"), ("param", "w")]
    assert "param @w: f64[3]" in str(graph)
    g = rng.standard_normal(3)
    go.jit(step)(g)
    assert_same(w.numpy(), w0 - 0.1 * g)


def test_parameter_passed_as_argument(rng):
    w0, v0 = rng.standard_normal(3), rng.standard_normal(3)
    w, v = go.Parameter(w0, name="w"), go.Parameter(v0, name="v")

    @go.jit
    def step(p, g):
        go.assign(p, p - g)
        return p * 2

    g = rng.standard_normal(3)
    out = step(w, g)
    assert_same(w.numpy(), w0 - g)
    assert_same(out, (w0 - g) * 2)
    graph = step.lower(w, g).graph
    assert [(x.kind, x.name) for x in graph.inputs] == [("arg", "g"), ("param", "w")]
    step(v, g)  # another Parameter is another signature
    assert_same(v.numpy(), v0 - g)
    assert_same(w.numpy(), w0 - g)
    assert step.cache_info().traces == 2


def test_parameter_in_nested_arguments(rng):
    ws = [go.Parameter(rng.standard_normal(2), name=f"w{i}") for i in range(3)]
    before = [w.numpy() for w in ws]

    def step(params, grads):
        for p, g in zip(params, grads):
            go.assign(p, p - g)

    grads = [rng.standard_normal(2) for _ in ws]
    graph = go.trace(step, ws, grads)
    assert [v.name for v in graph.params] == ["w0", "w1", "w2"]
    assert [v.name for v in graph.args] == ["grads.0", "grads.1", "grads.2"]
    go.jit(step)(ws, grads)
    for w, b, g in zip(ws, before, grads):
        assert_same(w.numpy(), b - g)


def test_read_after_assign_gives_the_new_value(rng):
    p0 = rng.standard_normal(3)
    p = go.Parameter(p0, name="p")

    def step():
        go.assign(p, p + 1)
        return p * 2

    g = go.trace(step)
    (mul,) = nodes(g, "multiply")
    (add,) = nodes(g, "add")
    assert mul.inputs[0] is add.out  # reads the new value, not @p
    assert_same(go.jit(step)(), (p0 + 1) * 2)
    assert_same(p.numpy(), p0 + 1)


def test_repeated_assigns_merge_into_one(rng):
    p0 = rng.standard_normal(3)
    p = go.Parameter(p0, name="p")

    def step(g):
        go.assign(p, p + g)
        go.assign(p, p * 3)
        go.assign(p, p - 1)

    graph = go.trace(step, np.ones(3))
    (assign,) = graph.assigns()
    assert assign.inputs[0] is graph.param("p")
    assert producer_of(graph, assign.inputs[1]).op == "subtract"
    assert graph.effects == [assign.out]
    g = rng.standard_normal(3)
    go.jit(step)(g)
    assert_same(p.numpy(), (p0 + g) * 3 - 1)


def test_assign_of_python_scalar_and_array(rng):
    p = go.Parameter(rng.standard_normal((2, 2)).astype(np.float32), name="p")
    q = go.Parameter(np.zeros(3, np.int32), name="q")
    c = rng.standard_normal((2, 2)).astype(np.float32)

    def step():
        go.assign(p, 0.25)
        go.assign(q, 7)

    go.jit(step)()
    assert_same(p.numpy(), np.full((2, 2), 0.25, np.float32))
    assert_same(q.numpy(), np.full(3, 7, np.int32))
    go.jit(lambda: go.assign(p, c))()
    assert_same(p.numpy(), c)


def test_assigned_but_never_read_parameter_is_an_input():
    p = go.Parameter(np.zeros(2), name="p")
    g = go.trace(lambda x: go.assign(p, x), np.ones(2))
    assert g.param("p").kind == "param"
    (assign,) = g.assigns()
    assert assign.inputs == [g.param("p"), g.args[0]]


# -- write-after-read edges ---------------------------------------------------------------------
def check_write_after_read(graph: go.Graph) -> None:
    """after edges exactly on the readers of @p that the new value does not depend on."""
    for a in graph.assigns():
        target, value = a.inputs
        before_value = ancestors(graph, value)
        readers = [n for n in graph.nodes if n.op != "assign" and target in n.inputs]
        want = [n.outputs[0] for n in readers if id(n) not in before_value]
        assert a.after == want, (str(graph), a)


def test_no_after_edge_when_the_new_value_depends_on_every_reader(rng):
    p = go.Parameter(rng.standard_normal(3), name="p")

    def step(g):
        y = p * 2
        go.assign(p, y + p - g)  # every read of @p is an ancestor of the new value

    graph = go.trace(step, np.ones(3))
    (assign,) = graph.assigns()
    assert assign.after == []
    check_write_after_read(graph)


def test_after_edge_for_a_reader_the_new_value_does_not_use(rng):
    p0 = rng.standard_normal(3)
    p = go.Parameter(p0, name="p")

    def step(g):
        old = p * 2  # read of @p, returned, not part of the new value
        go.assign(p, g)
        return old

    graph = go.trace(step, np.ones(3))
    (assign,) = graph.assigns()
    (mul,) = nodes(graph, "multiply")
    assert assign.after == [mul.out]
    check_write_after_read(graph)
    g = rng.standard_normal(3)
    assert_same(go.jit(step)(g), p0 * 2)  # the old value, though @p was overwritten
    assert_same(p.numpy(), g)


def test_after_edge_for_a_reader_that_is_dead(rng):
    p0 = rng.standard_normal(3)
    p = go.Parameter(p0, name="p")

    def step():
        _unused = ops.exp(p)  # read, never used
        go.assign(p, p + 1)

    graph = go.trace(step)  # verifies
    (assign,) = graph.assigns()
    (exp,) = nodes(graph, "exp")
    assert assign.after == [exp.out]
    check_write_after_read(graph)
    go.jit(step)()
    assert_same(p.numpy(), p0 + 1)


def test_after_edges_only_for_the_assigned_parameter(rng):
    p = go.Parameter(rng.standard_normal(3), name="p")
    q = go.Parameter(rng.standard_normal(3), name="q")

    def step():
        s = p + q  # reads both
        go.assign(p, q * 2)  # s reads @p and is not an ancestor: an after edge
        go.assign(q, s)  # s is the new value of q: no after edge for q
        return s

    graph = go.trace(step)
    check_write_after_read(graph)
    a_p, a_q = graph.assigns()
    (add,) = nodes(graph, "add")
    assert a_p.after == [add.out]
    assert a_q.after == [nodes(graph, "multiply")[0].out]  # q*2 reads @q, not in s


def test_swap_through_snapshots(rng):
    a0, b0 = rng.standard_normal(4), rng.standard_normal(4)
    a, b = go.Parameter(a0, name="a"), go.Parameter(b0, name="b")

    def swap():
        old_a, old_b = a * 1, b * 1
        go.assign(a, old_b)
        go.assign(b, old_a)

    graph = go.trace(swap)
    assign_a, assign_b = graph.assigns()
    assert assign_a.after and assign_b.after  # each ordered after the other's read
    check_write_after_read(graph)
    go.jit(swap)()
    assert_same(a.numpy(), b0)
    assert_same(b.numpy(), a0)


def test_swap_through_a_temporary_parameter(rng):
    a0, b0 = rng.standard_normal(4), rng.standard_normal(4)
    a, b = go.Parameter(a0, name="a"), go.Parameter(b0, name="b")
    tmp = go.Parameter(np.zeros(4), name="tmp")

    def swap():
        go.assign(tmp, a)  # tmp := old a
        go.assign(a, b)  # a := old b
        go.assign(b, tmp)  # reading tmp after its assign: old a

    graph = go.trace(swap)
    by_target = {n.inputs[0].name: n for n in graph.assigns()}
    assert by_target["a"].after and by_target["b"].after
    check_write_after_read(graph)
    fn = go.jit(swap)
    fn()
    assert_same(a.numpy(), b0)
    assert_same(b.numpy(), a0)
    assert_same(tmp.numpy(), a0)
    fn()  # and back
    assert_same(a.numpy(), a0)
    assert_same(b.numpy(), b0)
    swap()  # eager gives the same
    assert_same(a.numpy(), b0)
    assert_same(b.numpy(), a0)


def test_assign_b_then_a_is_sequential_not_a_swap(rng):
    """`assign(a, b); assign(b, a)`: the second reads `a` after its assign, i.e. old b
    (issue 2: a read after an assign gives the new value). Both end as old b, in every mode."""
    a0, b0 = rng.standard_normal(4), rng.standard_normal(4)
    a, b = go.Parameter(a0, name="a"), go.Parameter(b0, name="b")

    def step():
        go.assign(a, b)
        go.assign(b, a)

    graph = go.trace(step)
    check_write_after_read(graph)
    go.jit(step)()
    assert_same(a.numpy(), b0)
    assert_same(b.numpy(), b0)
    a2, b2 = go.Parameter(a0, name="a"), go.Parameter(b0, name="b")
    go.assign(a2, b2)
    go.assign(b2, a2)
    assert_same(a2.numpy(), b0)
    assert_same(b2.numpy(), b0)


def test_copy_one_parameter_into_another(rng):
    a0, b0 = rng.standard_normal(4), rng.standard_normal(4)
    a, b = go.Parameter(a0, name="a"), go.Parameter(b0, name="b")

    def step():
        go.assign(a, b)
        go.assign(b, b * 2)

    graph = go.trace(step)
    check_write_after_read(graph)
    go.jit(step)()
    assert_same(a.numpy(), b0)
    assert_same(b.numpy(), b0 * 2)


def test_adam_like_step_has_valid_edges(rng):
    shapes = [(3,), (2, 2)]
    ws = [go.Parameter(rng.standard_normal(s), name=f"w{i}") for i, s in enumerate(shapes)]
    ms = [go.Parameter(np.zeros(s), name=f"m{i}") for i, s in enumerate(shapes)]
    t = go.Parameter(np.zeros(()), name="t")

    def step(grads):
        go.assign(t, t + 1)
        for w, m, g in zip(ws, ms, grads):
            go.assign(m, 0.9 * m + 0.1 * g)
            go.assign(w, w - 0.01 * m / (1 - 0.9 ** t))

    graph = go.trace(step, [np.ones(s) for s in shapes])
    assert len(graph.assigns()) == 5
    check_write_after_read(graph)


# -- locations ----------------------------------------------------------------------------------
def test_locations_point_at_the_users_lines(rng):
    p = go.Parameter(np.zeros(3), name="p")

    def step(g, lr):
        d = g * lr  # loc:mul
        go.assign(p, p - d)  # loc:assign

    graph = go.trace(step, np.ones(3), 0.5)
    text = graph.format(locs=True)
    mul_line, assign_line = line_of("loc:mul"), line_of("loc:assign")
    (mul,) = nodes(graph, "multiply")
    (sub,) = nodes(graph, "subtract")
    (assign,) = graph.assigns()
    assert mul.loc.line == mul_line and os.path.basename(mul.loc.file) == HERE
    assert sub.loc.line == assign_line and assign.loc.line == assign_line
    assert f'loc("{HERE}":{mul_line})' in text
    assert re.search(rf'= assign @p, %\d+ : token  loc\("{HERE}":{assign_line}\)', text)
    assert "loc(" not in graph.format()  # off by default
    assert "loc(" not in str(graph)


def test_locations_of_operators_and_methods(rng):
    def fn(x):
        y = x.sum(axis=0)  # loc:sum
        return -y  # loc:neg

    g = go.trace(fn, np.ones((2, 2)))
    assert nodes(g, "sum")[0].loc.line == line_of("loc:sum")
    assert nodes(g, "negative")[0].loc.line == line_of("loc:neg")


# -- eager mode against jit ---------------------------------------------------------------------
def _chain(x, y):
    return ops.exp(-x * 0.5) + ops.sqrt(ops.abs(y)) / (1.0 + x * x) - ops.log(ops.abs(y) + 1.0)


def _reductions(x, y):
    return x.sum(axis=0) * y.max(axis=1, keepdims=True).sum() + x.mean()


def _linalg(x, y):
    return ops.maximum((x @ y.T) - x.sum(), 0.0).T @ x


def _select(x, y):
    return ops.where((x > 0) & ~(y > 0.5), x, y * 2) + ops.minimum(x, y)


def _casts(x, y):
    i = (x * 10).astype("i32")
    return (i * 3 + 1).astype(np.float64) + y.astype("f16").astype("f64"), i > 0


def _broadcasting(x, y):
    col = x.sum(axis=1, keepdims=True)  # (3, 1)
    row = y.mean(axis=0)  # (4,)
    return col * row - ops.broadcast_to(row, (2, 3, 4)) + ops.ones_like(col)


def _signs_and_powers(x, y):
    return ops.sign(x) * ops.abs(x) ** 1.5 + ops.rsqrt(ops.abs(y) + 1) ** 2


def _constants(x, y):
    return ops.full(x.shape, 0.5, x.dtype) * x + ops.zeros_like(y) + ops.full_like(y, 2)


def _scalar_only(x, y):
    return ops.add(x.sum(), 1) * 2.5


EAGER_CASES = [_chain, _reductions, _linalg, _select, _casts, _broadcasting, _signs_and_powers,
               _constants, _scalar_only]


@pytest.mark.parametrize("fn", EAGER_CASES, ids=[f.__name__ for f in EAGER_CASES])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_eager_and_jit_agree(fn, dtype, rng):
    x = rng.standard_normal((3, 4)).astype(dtype)
    y = rng.standard_normal((3, 4)).astype(dtype)
    eager = fn(go.EagerTensor(x), go.EagerTensor(y))  # op by op through graphopt
    jitted = go.jit(fn)(x, y)
    eager_leaves = eager if isinstance(eager, tuple) else (eager,)
    jit_leaves = jitted if isinstance(jitted, tuple) else (jitted,)
    assert len(eager_leaves) == len(jit_leaves)
    for e, j in zip(eager_leaves, jit_leaves):
        assert isinstance(e, go.EagerTensor)
        assert isinstance(j, np.ndarray)
        assert_same(e.numpy(), j)


def test_eager_matches_numpy(rng):
    x = rng.standard_normal((3, 4))
    y = rng.standard_normal((3, 4))
    want = np.exp(-x * 0.5) + np.sqrt(np.abs(y)) / (1.0 + x * x) - np.log(np.abs(y) + 1.0)
    ex, ey = go.EagerTensor(x), go.EagerTensor(y)
    np.testing.assert_allclose(_chain(ex, ey).numpy(), want, rtol=1e-15)
    want_sel = np.where((x > 0) & ~(y > 0.5), x, y * 2) + np.minimum(x, y)
    assert_same(_select(ex, ey).numpy(), want_sel)


def test_eager_tensors_use_the_operators(rng):
    x = rng.standard_normal(4)
    e = ops.exp(x)
    assert isinstance(e, go.EagerTensor)
    assert_same((e * 2 - 1).numpy(), np.exp(x) * 2 - 1)
    assert_same(np.asarray(e.T), np.exp(x))
    assert_same((e > 1).numpy(), np.exp(x) > 1)
    assert float(e.sum()) == pytest.approx(np.exp(x).sum(), rel=1e-15)
    assert bool(e.max() > 0)  # eager values can drive Python control flow


def test_eager_assign_updates_the_parameter_immediately(rng):
    p0 = rng.standard_normal(3)
    p = go.Parameter(p0, name="p")
    seen = []

    def step(g):
        go.assign(p, p - g)
        seen.append(p.numpy())
        go.assign(p, p * 2)
        return p + 0

    g = rng.standard_normal(3)
    out = step(g)
    assert_same(seen[0], p0 - g)  # visible right after the assign
    assert_same(p.numpy(), (p0 - g) * 2)
    assert_same(out.numpy(), (p0 - g) * 2)
    # The jitted step gives the same state and result.
    q = go.Parameter(p0, name="p")

    def step_q(g):
        go.assign(q, q - g)
        go.assign(q, q * 2)
        return q + 0

    assert_same(go.jit(step_q)(g), out.numpy())
    assert_same(q.numpy(), p.numpy())


def test_eager_value_read_before_assign_keeps_the_old_value(rng):
    """A shape op of a Parameter read before an assign is the old value, eager as in jit."""
    p0 = rng.standard_normal((2, 3))

    def make():
        p = go.Parameter(p0, name="p")

        def step():
            t = p.T  # a view in numpy
            r = p.reshape(-1)
            d = ops.depend(p)
            go.assign(p, p * 2)
            return t, r, d + 0

        return p, step

    p, step = make()
    eager = step()
    assert_same(p.numpy(), p0 * 2)
    q, step_q = make()
    jitted = go.jit(step_q)()
    assert_same(q.numpy(), p0 * 2)
    for e, j, want in zip(eager, jitted, (p0.T, p0.reshape(-1), p0)):
        assert_same(j, want)
        assert_same(e.numpy(), want)


def test_eager_adam_step_matches_jit_and_numpy(rng):
    """Adam written directly with ops and assigns: eager, jit and numpy agree."""
    shapes = [(4, 3), (5,)]

    def make():
        ws = [go.Parameter(np.linspace(-1, 1, np.prod(s)).reshape(s), name=f"w{i}")
              for i, s in enumerate(shapes)]
        ms = [go.Parameter(np.zeros(s), name=f"m{i}") for i, s in enumerate(shapes)]
        vs = [go.Parameter(np.zeros(s), name=f"v{i}") for i, s in enumerate(shapes)]
        t = go.Parameter(np.zeros(()), name="t")

        def step(grads, lr):
            go.assign(t, t + 1)
            for w, m, v, g in zip(ws, ms, vs, grads):
                go.assign(m, 0.9 * m + 0.1 * g)
                go.assign(v, 0.999 * v + 0.001 * g * g)
                mhat = m / (1 - 0.9 ** t)
                vhat = v / (1 - 0.999 ** t)
                go.assign(w, w - lr * mhat / (ops.sqrt(vhat) + 1e-8))
        return ws, step

    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(3)]
    ws_e, step_e = make()
    ws_j, step_j = make()
    jitted = go.jit(step_j)
    w = [np.linspace(-1, 1, np.prod(s)).reshape(s) for s in shapes]
    m = [np.zeros(s) for s in shapes]
    v = [np.zeros(s) for s in shapes]
    for k, gs in enumerate(grads):
        lr = 0.01 * (k + 1)
        step_e(gs, lr)
        jitted(gs, lr)
        t = k + 1
        for i, g in enumerate(gs):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            w[i] = w[i] - lr * (m[i] / (1 - 0.9 ** t)) / (np.sqrt(v[i] / (1 - 0.999 ** t)) + 1e-8)
    for we, wj, wn in zip(ws_e, ws_j, w):
        assert_same(we.numpy(), wj.numpy())
        np.testing.assert_allclose(wj.numpy(), wn, rtol=1e-12)
    assert jitted.cache_info().traces == 1


# -- the jit cache ------------------------------------------------------------------------------
def test_cache_info_counts_traces_compiles_and_hits(rng):
    calls = []

    @go.jit
    def fn(x, lr):
        calls.append(1)  # runs only while tracing
        return x * lr

    info = fn.cache_info()
    assert (info.traces, info.compiles, info.hits, info.size) == (0, 0, 0, 0)
    x = rng.standard_normal(3)
    assert_same(fn(x, 0.5), x * 0.5)
    assert fn.cache_info() == type(info)(traces=1, compiles=1, hits=0, size=1)
    assert_same(fn(x, 0.25), x * 0.25)  # a new scalar value: no retrace, the new value used
    assert_same(fn(x + 1, 2.0), (x + 1) * 2.0)
    assert fn.cache_info() == type(info)(traces=1, compiles=1, hits=2, size=1)
    assert len(calls) == 1


def test_new_shape_or_dtype_retraces(rng):
    fn = go.jit(lambda x: x * 2)
    fn(np.ones(3))
    fn(np.ones(4))  # shape
    fn(np.ones(4, np.float32))  # dtype
    fn(np.ones((4, 1), np.float32))  # rank
    assert (fn.cache_info().traces, fn.cache_info().size) == (4, 4)
    fn(np.ones(3))  # each stays cached
    fn(np.ones(4, np.float32))
    info = fn.cache_info()
    assert (info.traces, info.compiles, info.hits) == (4, 4, 2)
    assert_same(fn(np.arange(4, dtype=np.float32)), np.arange(4, dtype=np.float32) * 2)


def test_scalar_kind_is_part_of_the_signature(rng):
    fn = go.jit(lambda x, s: x * s)
    x = rng.standard_normal(3)
    fn(x, 2.0)
    fn(x, 3.0)
    assert fn.cache_info().traces == 1
    assert_same(fn(x, 2), x * 2)  # an int is another signature (its dtype is i64)
    assert fn.cache_info().traces == 2


def test_numpy_scalar_argument_is_an_array_leaf(rng):
    fn = go.jit(lambda x, s: x * s)
    x = rng.standard_normal(3).astype(np.float32)
    assert_same(fn(x, np.float32(2)), x * np.float32(2))
    assert_same(fn(x, np.float32(3)), x * np.float32(3))
    assert fn.cache_info().traces == 1


def test_different_structure_is_a_signature_error(rng):
    fn = go.jit(lambda xs: [x * 2 for x in xs])
    fn([np.ones(2), np.ones(2)])
    with pytest.raises(SignatureError, match="list of 2 items.*list of 3 items"):
        fn([np.ones(2)] * 3)
    with pytest.raises(SignatureError, match="tuple"):
        fn((np.ones(2), np.ones(2)))
    with pytest.raises(SignatureError):
        fn(np.ones(2))
    assert fn.cache_info().traces == 1
    assert_same(fn([np.ones(2), np.zeros(2)])[1], np.zeros(2))


def test_dict_with_other_keys_is_a_signature_error():
    fn = go.jit(lambda d: d["a"] + 1)
    fn({"a": np.ones(2)})
    with pytest.raises(SignatureError, match=r"keys \['a'\].*keys \['b'\]"):
        fn({"b": np.ones(2)})
    with pytest.raises(SignatureError, match=r"keys \['a', 'c'\]"):
        fn({"a": np.ones(2), "c": np.ones(2)})


def test_missing_or_extra_argument_is_a_signature_error():
    fn = go.jit(lambda x, y: x + y)
    with pytest.raises(SignatureError, match="missing"):
        fn(np.ones(2))
    with pytest.raises(SignatureError):
        fn(np.ones(2), np.ones(2), np.ones(2))
    with pytest.raises(SignatureError):
        fn(np.ones(2), z=np.ones(2))
    assert fn.cache_info().traces == 0


@pytest.mark.parametrize("leaf", ["a string", b"bytes", object(), {1, 2}, 1 + 2j],
                         ids=["str", "bytes", "object", "set", "complex"])
def test_unsupported_leaf_is_a_signature_error(leaf):
    fn = go.jit(lambda x, y: x)
    with pytest.raises(SignatureError, match="argument 'y'"):
        fn(np.ones(2), leaf)
    assert fn.cache_info().traces == 0


def test_unsupported_array_dtype_is_a_signature_error():
    with pytest.raises(SignatureError, match="unsupported dtype"):
        go.jit(lambda x: x)(np.ones(2, np.complex128))
    with pytest.raises(SignatureError):
        go.jit(lambda x: x)(np.array(["a"]))


def test_lower_returns_the_compiled_step_and_its_graph(rng):
    w = go.Parameter(np.zeros(3), name="w")

    def step(g, lr):
        go.assign(w, w - lr * g)
        return w.sum()

    fn = go.jit(step)
    g = rng.standard_normal(3)
    exe = fn.lower(g, 0.1)
    assert isinstance(exe.graph, go.Graph)
    assert str(exe.traced_graph) == str(go.trace(step, g, 0.1))
    assert [n.op for n in exe.graph.nodes] == ["kernel"]  # after the default pipeline
    assert fn.cache_info().traces == 1
    assert_same(w.numpy(), np.zeros(3))  # lowering runs nothing
    assert fn.lower(g, 0.2) is exe  # a cache hit
    out = exe(g, 0.5)  # the compiled step is callable
    assert_same(w.numpy(), -0.5 * g)
    assert_same(out, np.sum(-0.5 * g))
    fn(g, 0.5)
    assert_same(w.numpy(), -1.0 * g)
    assert fn.cache_info().traces == 1


def test_a_jitted_step_and_its_parameters_are_freed_after_their_last_use(rng):
    """Nothing of graphopt's keeps a step function alive once its JittedFunction is gone:
    the function closes over its Parameters, so a cache of signatures holding it (as an
    lru_cache keyed by it did) kept every step's weights in memory for good."""
    import gc
    import weakref

    w = go.Parameter(rng.standard_normal(3), name="w")

    def step(g):
        go.assign(w, w - 0.1 * g)
        return w.sum()

    fn = go.jit(step)
    fn(rng.standard_normal(3))
    fn(rng.standard_normal(3))  # (a cache hit too)
    gone = weakref.ref(step), weakref.ref(w)
    del fn, step, w
    gc.collect()
    assert [ref() for ref in gone] == [None, None]


def test_jit_decorator_forms(rng):
    x = rng.standard_normal(2)

    @go.jit(backend="interpreter")
    def a(x):
        return x + 1

    b = go.jit(lambda x: x + 1, backend="interpreter")
    assert_same(a(x), x + 1)
    assert_same(b(x), x + 1)
    assert a.__name__ == "a"


def test_jitted_function_inside_a_trace_is_inlined(rng):
    w0 = rng.standard_normal(3)
    w = go.Parameter(w0, name="w")

    @go.jit
    def update(g, lr):
        go.assign(w, w - lr * g)
        return ops.sqrt(ops.abs(w))

    def outer(g):
        return update(g, 0.5) * 2

    graph = go.trace(outer, np.ones(3))
    assert update.cache_info().traces == 0  # not traced on its own: inlined
    assert [v.name for v in graph.args] == ["g"]
    assert op_names(graph) == ["multiply", "subtract", "abs", "sqrt", "multiply", "assign"]
    g = rng.standard_normal(3)
    out = go.jit(outer)(g)
    assert_same(out, np.sqrt(np.abs(w0 - 0.5 * g)) * 2)
    assert_same(w.numpy(), w0 - 0.5 * g)
    assert update.cache_info().traces == 0


def test_trace_stack_is_clean_after_a_failed_trace():
    def bad(x):
        raise RuntimeError("user bug")

    with pytest.raises(RuntimeError, match="user bug"):
        go.trace(bad, np.ones(2))
    assert current_trace() is None
    assert isinstance(ops.add(np.ones(2), 1.0), go.EagerTensor)  # eager again


def test_no_numpy_warnings_in_eager_or_jit():
    x = np.array([0.0, -1.0, np.inf, np.nan, 1.0])
    fn = lambda x: ops.log(x) + ops.sqrt(x) + x / x - x * np.inf  # noqa: E731
    with np.errstate(all="raise"), warnings.catch_warnings():
        warnings.simplefilter("error")
        eager = fn(go.EagerTensor(x)).numpy()
        jitted = go.jit(fn)(x)
    with np.errstate(all="ignore"):
        want = np.log(x) + np.sqrt(x) + x / x - x * np.inf
    assert_same(eager, want)
    assert_same(jitted, want)


def test_dtypes_exist_once_also_through_copy_and_pickle():
    """Types compare dtypes by identity (fast), so a copied or unpickled dtype must be the
    same object."""
    for d in (go.f16, go.bf16, go.f32, go.f64, go.i32, go.i64, go.bool_):
        assert copy.deepcopy(d) is d and pickle.loads(pickle.dumps(d)) is d
    t = go.Parameter(np.ones((2, 3), np.float32)).type
    assert pickle.loads(pickle.dumps(t)) == t and copy.deepcopy(t).dtype is go.f32
