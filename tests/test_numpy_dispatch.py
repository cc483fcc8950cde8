"""numpy's ufuncs and common functions on graphopt tensors run graphopt's ops: eager, and under
jit on both backends, with numpy's results; what has no op is an OpTypeError naming it."""
import numpy as np
import pytest

import graphopt as go
from graphopt.errors import OpTypeError

MODES = ["eager", "interpreter", "llvm"]
x = np.array([[0.5, -1.0, 2.0], [3.0, 0.25, -0.5]], np.float32)
y = np.array([[1.5, 2.0, -2.0], [0.5, 4.0, 1.0]], np.float32)

CASES = {
    "exp": lambda a, b: np.exp(a),
    "sqrt-abs": lambda a, b: np.sqrt(np.abs(a)),
    "log-square": lambda a, b: np.log(np.square(a) + 1.0),
    "sin-cos-tanh": lambda a, b: np.sin(a) + np.cos(b) * np.tanh(a),
    "add-multiply": lambda a, b: np.add(a, np.multiply(b, 2.0)),
    "divide-power": lambda a, b: np.divide(a, b) + np.power(b, 2.0),
    "ndarray-times-tensor": lambda a, b: y * a - y,
    "maximum-minimum": lambda a, b: np.maximum(a, b) - np.minimum(a, 0.0),
    "where": lambda a, b: np.where(a > b, a, b),
    "sum": lambda a, b: np.sum(a),
    "sum-axis-keepdims": lambda a, b: np.sum(a, axis=1, keepdims=True),
    "mean-axis": lambda a, b: np.mean(a * b, axis=0),
    "max": lambda a, b: np.max(a, axis=-1),
    "matmul": lambda a, b: np.matmul(a, np.transpose(b)),
    "dot": lambda a, b: np.dot(np.transpose(a), b),
    "reshape": lambda a, b: np.reshape(a, (3, 2)) * 2.0,
    "transpose-axes": lambda a, b: np.transpose(a, (1, 0)),
    "clip": lambda a, b: np.clip(a, -0.5, 1.0),
    "zeros_like-ones_like": lambda a, b: np.zeros_like(a) + np.ones_like(b),
    "comparisons": lambda a, b: np.logical_and(np.greater(a, 0.0), np.less_equal(b, 2.0)),
    "sign-negative": lambda a, b: np.sign(a) * np.negative(b),
    "isfinite": lambda a, b: np.isfinite(a / b),
    "broadcast_to": lambda a, b: np.broadcast_to(np.sum(a, axis=0), (4, 3)),
}


def run(mode, fn):
    if mode == "eager":
        return np.asarray(fn(go.EagerTensor(x), go.EagerTensor(y)))
    return go.jit(fn, backend=mode, cache=False)(x, y)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CASES))
def test_numpy_functions_on_tensors_match_numpy(mode, name):
    fn = CASES[name]
    want = fn(x, y)
    got = run(mode, fn)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_a_traced_numpy_call_is_a_node_not_a_constant():
    graph = go.jit(lambda a, b: np.exp(a) + np.sum(b), backend="interpreter").lower(x, y)
    ops = [n.op for n in graph.traced_graph.nodes]
    assert "exp" in ops and "sum" in ops and "constant" not in ops


def test_numpy_on_a_parameter_in_a_trace_reads_it_at_run_time():
    p = go.Parameter(np.ones(3, np.float32), name="p")
    step = go.jit(lambda a: np.sum(np.exp(p) * a), backend="interpreter")
    first = step(np.ones(3, np.float32))
    go.assign(p, np.zeros(3, np.float32))
    np.testing.assert_allclose(step(np.ones(3, np.float32)), 3.0)
    np.testing.assert_allclose(first, 3 * np.e, rtol=1e-6)


def test_numpy_functions_on_a_parameter_outside_a_trace_see_its_value():
    p = go.Parameter(np.arange(3, dtype=np.float32), name="p")
    assert np.allclose(p, [0, 1, 2])
    np.testing.assert_array_equal(np.concatenate([p, p]), [0, 1, 2, 0, 1, 2])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call, match", [
    (lambda a: np.floor(a), r"numpy\.floor .*no op"),
    (lambda a: np.log1p(a), r"numpy\.log1p .*ops\.log\(1 \+ x\)"),
    (lambda a: np.add.reduce(a), r"numpy\.add\.reduce .*graphopt\.ops\.sum"),
    (lambda a: np.exp(a, out=np.empty((2, 3), np.float32)), r"takes no out="),
    (lambda a: np.sum(a, dtype=np.float64), r"numpy\.sum .*dtype= is not supported"),
    (lambda a: np.min(a), r"numpy\.min .*-ops\.max\(-x\)"),
    (lambda a: np.concatenate([a, a]), r"numpy\.concatenate .*no op"),
    (lambda a: np.where(a > 0), r"numpy\.where\(condition\)"),
], ids=["floor", "log1p", "reduce", "out", "dtype", "min", "concatenate", "where-1"])
def test_numpy_without_a_graphopt_op_is_an_op_type_error(mode, call, match):
    with pytest.raises(OpTypeError, match=match):
        run(mode, lambda a, b: call(a))
