"""Weak types (docs/ir.md, "Python scalars: weak types"): each row of the promotion table,
eagerly and under jit on both backends, result dtypes and values against numpy.

numpy computes the references the way the rules say: a weak value in its weak dtype (f64, i64,
bool), rounded once to the dtype of the strong tensor it meets.
"""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphopt as go
from graphopt import ops
from graphopt.errors import AssignError, OpTypeError

MODES = ["eager", "interpreter", "llvm"]
FLOATS = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
INTS = [np.int32, np.int64]
ALL = FLOATS + INTS + [np.bool_]


def dtype_id(d) -> str:
    return np.dtype(d).name


def run(mode: str, fn, *args):
    """fn run eagerly (arrays as EagerTensors, so graphopt and not numpy computes), or jitted
    on one backend: its result(s) as numpy arrays."""
    if mode == "eager":
        out = fn(*(go.EagerTensor(a) if isinstance(a, np.ndarray) else a for a in args))
    else:
        out = go.jit(fn, backend=mode)(*args)
    return tuple(map(np.asarray, out)) if isinstance(out, tuple) else np.asarray(out)


def assert_same(got, want) -> None:
    """Same dtype, shape and values."""
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    if got.dtype == ml_dtypes.bfloat16:  # compared exactly, as the f64 values they are
        got, want = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(got, want)


def raises_in(mode: str, error, match: str, fn, *args) -> None:
    with pytest.raises(error, match=match):
        run(mode, fn, *args)


def array(dtype, shape=(3,)) -> np.ndarray:
    """Distinct small values: 0.75, 1.5, ... (floats), 1, 2, ... (ints), alternating (bool)."""
    n = np.arange(1, math.prod(shape) + 1).reshape(shape)
    if dtype is np.bool_:
        return n % 2 == 0
    return (n * 0.75).astype(dtype) if dtype in FLOATS else n.astype(dtype)


# Weak values of each kind: a Python scalar, or an op on Python scalars only; with the value
# numpy gives it in its weak dtype.
WEAK_FLOATS = [("0.5", lambda: 0.5, np.float64(0.5)),
               ("abs(-0.5)", lambda: ops.abs(-0.5), np.float64(0.5)),
               ("sqrt(2.0)+1", lambda: ops.sqrt(2.0) + 1, np.sqrt(2.0) + 1),
               ("int+float", lambda: ops.add(ops.abs(-1), 0.25), np.float64(1.25))]
WEAK_INTS = [("3", lambda: 3, np.int64(3)),
             ("abs(-3)", lambda: ops.abs(-3), np.int64(3)),
             ("True+2", lambda: ops.add(True, 2), np.int64(3))]
WEAK_BOOLS = [("True", lambda: True, np.True_),
              ("not(False)", lambda: ops.logical_not(False), np.True_)]


def ids(cases) -> list[str]:
    return [c[0] for c in cases]


# -- strong meets strong ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL, ids=dtype_id)
def test_strong_meets_the_same_strong_dtype(mode, dtype):
    x, y = array(dtype), array(dtype)[::-1].copy()
    if dtype is np.bool_:
        assert_same(run(mode, lambda x, y: x & y, x, y), x & y)
    else:
        assert_same(run(mode, lambda x, y: x + y, x, y), x + y)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("a,b", [(np.float32, np.float64), (np.float16, ml_dtypes.bfloat16),
                                 (np.int32, np.int64), (np.int32, np.float32)],
                         ids=["f32-f64", "f16-bf16", "i32-i64", "i32-f32"])
def test_strong_meets_another_strong_dtype_is_an_error(mode, a, b):
    raises_in(mode, OpTypeError, "different dtypes", lambda x, y: x * y, array(a), array(b))


# -- weak meets strong --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("name,weak,value", WEAK_FLOATS + WEAK_INTS + WEAK_BOOLS,
                         ids=ids(WEAK_FLOATS + WEAK_INTS + WEAK_BOOLS))
def test_weak_takes_the_strong_float_dtype(mode, dtype, name, weak, value):
    x = array(dtype)
    w = np.asarray(value).astype(dtype)  # rounded once, to x's dtype
    got = run(mode, lambda x: (x * weak(), weak() - x, ops.maximum(x, weak())), x)
    for g, want in zip(got, (x * w, w - x, np.maximum(x, w))):
        assert_same(g, want)


@pytest.mark.parametrize("mode", MODES)
def test_the_issue_examples(mode):
    x64, x16 = array(np.float64), array(np.float16)
    assert_same(run(mode, lambda x: x / (ops.abs(0.5) + 0.5), x64), x64 / (np.abs(0.5) + 0.5))
    assert_same(run(mode, lambda x: ops.sqrt(2.0) * x, x16), np.float16(np.sqrt(2.0)) * x16)
    # The weak value keeps f64 precision until it meets x: exact in an f64 step.
    assert_same(run(mode, lambda x: ops.sqrt(2.0) * x, x64), np.sqrt(2.0) * x64)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", INTS, ids=dtype_id)
@pytest.mark.parametrize("name,weak,value", WEAK_INTS + WEAK_BOOLS, ids=ids(WEAK_INTS + WEAK_BOOLS))
def test_weak_int_or_bool_takes_the_strong_int_dtype(mode, dtype, name, weak, value):
    k = array(dtype)
    w = np.asarray(value).astype(dtype)
    got = run(mode, lambda k: (k + weak(), weak() * k, ops.maximum(k, weak())), k)
    for g, want in zip(got, (k + w, w * k, np.maximum(k, w))):
        assert_same(g, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", INTS, ids=dtype_id)
@pytest.mark.parametrize("name,weak,value", WEAK_FLOATS, ids=ids(WEAK_FLOATS))
def test_weak_float_meets_strong_int_is_an_error(mode, dtype, name, weak, value):
    name = go.ir.types.to_dtype(dtype).name
    raises_in(mode, OpTypeError, f"Python float.* cannot take the dtype {name}",
              lambda k: k * weak(), array(dtype))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,weak,value", WEAK_BOOLS, ids=ids(WEAK_BOOLS))
def test_weak_bool_takes_the_strong_bool_dtype(mode, name, weak, value):
    a = array(np.bool_)
    got = run(mode, lambda a: (a & weak(), ops.logical_or(weak(), a), a == weak()), a)
    for g, want in zip(got, (a & value, value | a, a == value)):
        assert_same(g, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,weak,value", WEAK_INTS + WEAK_FLOATS,
                         ids=ids(WEAK_INTS + WEAK_FLOATS))
def test_weak_number_meets_strong_bool_is_an_error(mode, name, weak, value):
    raises_in(mode, OpTypeError, "cannot take the dtype bool", lambda a: ops.equal(a, weak()),
              array(np.bool_))


# -- weak meets weak ----------------------------------------------------------------------------
WEAK_ONLY = [("float+int", lambda: ops.add(1, 0.5), np.float64(1.5)),
             ("bool+int", lambda: ops.add(True, 1), np.int64(2)),
             ("int*int", lambda: ops.multiply(2, 3), np.int64(6)),
             ("weak int+float", lambda: ops.add(ops.abs(-1), 0.5), np.float64(1.5)),
             ("abs(float)", lambda: ops.abs(-0.5), np.float64(0.5)),
             ("sqrt", lambda: ops.sqrt(2.0), np.sqrt(2.0)),
             ("not(bool)", lambda: ops.logical_not(True), np.False_)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,weak,value", WEAK_ONLY, ids=ids(WEAK_ONLY))
def test_weak_only_gives_the_weak_dtype_of_the_highest_kind(mode, name, weak, value):
    x16 = array(np.float16)
    alone, met = run(mode, lambda x: (weak(), weak() * x), x16)
    assert_same(alone, value)  # as an output: its weak dtype
    assert_same(met, np.asarray(value).astype(np.float16) * x16)  # still weak: takes f16


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op,a,b,want", [(ops.add, 1, 0.5, np.float64(1.5)),
                                         (ops.add, True, 2, np.int64(3)),
                                         (ops.add, 2, 3, np.int64(5)),
                                         (ops.logical_or, True, False, np.True_)],
                         ids=["int-float", "bool-int", "int-int", "bool-bool"])
def test_python_scalar_arguments_promote_like_literals(mode, op, a, b, want):
    # Under jit a and b are weak graph inputs (f64, i64, bool), eagerly Python scalars.
    assert_same(run(mode, op, a, b), want)


@pytest.mark.parametrize("mode", MODES)
def test_weak_int_only_in_a_float_only_op_is_an_error(mode):
    raises_in(mode, OpTypeError, "sqrt: dtype i64 is not supported", lambda: ops.sqrt(2))
    raises_in(mode, OpTypeError, "divide: dtype i64 is not supported", lambda: ops.divide(1, 2))


# -- ops that give a strong result ---------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_comparisons_give_strong_bool(mode):
    x16 = array(np.float16)
    got = run(mode, lambda x: (ops.less(0.5, 1.0), ops.sqrt(2.0) > 1, ops.isfinite(0.5),
                               x > 0.5, ops.equal(ops.abs(-1), 1)), x16)
    for g, want in zip(got, (np.True_, np.True_, np.True_, x16 > np.float16(0.5), np.True_)):
        assert_same(g, want)
    # A strong bool does not turn into a float where a weak one (True) would.
    raises_in(mode, OpTypeError, "different dtypes", lambda x: x * ops.less(0.5, 1.0), x16)
    assert_same(run(mode, lambda x: x * True, x16), x16)


@pytest.mark.parametrize("mode", MODES)
def test_casts_and_asarray_give_strong_results(mode):
    x16 = array(np.float16)
    assert_same(run(mode, lambda x: x * ops.cast(0.5, "f16"), x16), x16 * np.float16(0.5))
    assert_same(run(mode, lambda x: x * ops.asarray(0.1, "f16"), x16), x16 * np.float16(0.1))
    assert_same(run(mode, lambda: ops.asarray(ops.sqrt(2.0))), np.sqrt(2.0))
    for strong in (lambda: ops.cast(0.5, "f32"), lambda: ops.sqrt(2.0).astype("f32"),
                   lambda: ops.asarray(0.5), lambda: ops.asarray(ops.abs(-0.5))):
        raises_in(mode, OpTypeError, "different dtypes", lambda x: x * strong(), x16)


@pytest.mark.parametrize("mode", MODES)
def test_constants_are_strong(mode):
    x16, x32, k32 = array(np.float16), array(np.float32), array(np.int32)
    assert_same(run(mode, lambda x: x * ops.full((), 0.5, "f16"), x16), x16 * np.float16(0.5))
    raises_in(mode, OpTypeError, "different dtypes", lambda x: x * ops.full((), 0.5), x16)
    raises_in(mode, OpTypeError, "different dtypes", lambda x, y: x + ops.zeros_like(y), x16, x32)
    raises_in(mode, OpTypeError, "different dtypes", lambda k: k + ops.arange(3), k32)


# -- reductions, shape ops, where, matmul: weak in, weak out ------------------------------------
def fill(s, shape):
    return np.broadcast_to(np.float64(s), shape)


PROPAGATING = [
    ("sum", lambda s: ops.sum(ops.broadcast_to(s, (3,))), lambda s: np.sum(fill(s, (3,)))),
    ("mean", lambda s: ops.mean(ops.broadcast_to(s, (4,))), lambda s: np.mean(fill(s, (4,)))),
    ("max", lambda s: ops.max(ops.broadcast_to(s, (2, 3)), 0), lambda s: fill(s, (2, 3)).max(0)),
    ("reshape", lambda s: ops.reshape(ops.broadcast_to(s, (3,)), (3, 1)),
     lambda s: fill(s, (3, 1))),
    ("transpose", lambda s: ops.transpose(ops.broadcast_to(s, (3, 1))), lambda s: fill(s, (1, 3))),
    ("where", lambda s: ops.where(np.array([True, False, True]), s, 2.0),
     lambda s: np.where([True, False, True], np.float64(s), 2.0)),
    ("matmul", lambda s: ops.matmul(ops.broadcast_to(s, (2,)), ops.broadcast_to(2.0, (2, 3))),
     lambda s: fill(s, (2,)) @ fill(2.0, (2, 3))),
    ("log_softmax", lambda s: ops.log_softmax(ops.broadcast_to(s, (3,))),
     lambda s: np.full(3, -np.log(3.0))),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,weak,reference", PROPAGATING, ids=ids(PROPAGATING))
def test_ops_on_weak_values_only_stay_weak(mode, name, weak, reference):
    x16, s = array(np.float16), 0.75
    # s a literal eagerly, a weak f64 argument under jit (nothing to fold away there).
    alone, met = run(mode, lambda x, s: (weak(s), x * weak(s)), x16, s)
    want = np.asarray(reference(s))
    assert_same(alone, want)
    assert_same(met, x16 * want.astype(np.float16))


@pytest.mark.parametrize("mode", MODES)
def test_ops_on_strong_values_stay_strong(mode):
    x32, x16 = array(np.float32), array(np.float16)
    c = np.array([True, False, True])
    assert_same(run(mode, lambda x: ops.where(c, x, 0.0), x32), np.where(c, x32, np.float32(0)))
    raises_in(mode, OpTypeError, "different dtypes", lambda x, y: y * ops.sum(x), x32, x16)
    raises_in(mode, OpTypeError, "different dtypes",
              lambda x, y: y * ops.where(c, x, 0.0), x32, x16)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_reductions_of_strong_values_are_strong_and_take_weak_scalars(mode, dtype):
    x = array(dtype, (2, 3))
    got = run(mode, lambda x: (ops.sum(x) * 0.5, ops.max(x, 0) - ops.sqrt(2.0),
                               ops.mean(x, 1) + 1), x)
    wide = x.astype(np.float64)  # these sums are exact in every dtype and order
    want = (np.sum(wide).astype(dtype) * dtype(0.5),
            x.max(0) - np.asarray(np.sqrt(2.0)).astype(dtype),
            np.mean(wide, 1).astype(dtype) + dtype(1))
    for g, w in zip(got, want):
        assert_same(g, w)


# -- the weak flag itself ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_the_weak_flag(mode):
    flags = []

    def step(x):
        made = [ops.abs(0.5), ops.where(x > 0, 1.0, 2.0), ops.sum(ops.broadcast_to(2, (3,))),
                ops.less(0.5, 1.0), ops.cast(0.5, "f64"), ops.asarray(0.5),
                ops.multiply(x, 0.5), ops.negative(x)]
        flags[:] = [t.weak for t in made]
        return x

    run(mode, step, array(np.float64))
    assert flags == [True, True, True, False, False, False, False, False]


# -- where a weak value ends up: outputs, arguments, parameters -----------------------------------
@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_a_weak_value_at_a_jit_output_keeps_its_weak_dtype(backend):
    for fn, want in [(lambda: 0.5, np.float64(0.5)), (lambda: 3, np.int64(3)),
                     (lambda: True, np.True_), (lambda: ops.sqrt(2.0), np.sqrt(2.0))]:
        assert_same(go.jit(fn, backend=backend)(), want)
    graph = go.jit(lambda lr: lr * 2, backend=backend).lower(0.1).graph
    assert [str(v.type) for v in graph.args] == ["f64[]"]
    assert str(graph.outputs[0].type) == "f64[]"


@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_an_eager_weak_result_passed_to_jit_stays_weak(backend):
    x16 = array(np.float16)
    s = ops.sqrt(2.0)  # eager: a weak EagerTensor
    assert s.weak and s.dtype == go.f64
    step = go.jit(lambda x, s: x * s, backend=backend)
    assert_same(step(x16, s), x16 * np.float16(np.sqrt(2.0)))
    assert [str(v.type) for v in step.lower(x16, s).graph.args] == ["f16[3]", "f64[]"]
    with pytest.raises(OpTypeError, match="different dtypes"):
        step(x16, ops.asarray(s))  # strong: f64 meets f16


@pytest.mark.parametrize("mode", MODES)
def test_assign_treats_the_parameter_as_the_strong_side(mode):
    p = go.Parameter(np.zeros(3, np.float16), name="p")
    k = go.Parameter(np.zeros(3, np.int32), name="k")

    def step(s):
        go.assign(p, ops.sqrt(s))  # a weak scalar fills the parameter, rounded once to f16
        go.assign(k, ops.abs(-2))

    run(mode, step, 2.0)
    assert_same(p.numpy(), np.full(3, np.sqrt(2.0), np.float16))
    assert_same(k.numpy(), np.full(3, 2, np.int32))
    for value in (lambda: 0.5, lambda: ops.sqrt(2.0)):
        raises_in(mode, AssignError, "Python float.*cannot be stored in a i32 parameter",
                  lambda: go.assign(k, value()))
    assert_same(k.numpy(), np.full(3, 2, np.int32))


# -- properties ----------------------------------------------------------------------------------
def weak_chain(x, s, n):
    """A weak float and a weak int computed from Python scalars, then met by x."""
    return x * (ops.sqrt(ops.abs(s) + 1.0) - n)


def weak_chain_numpy(x, s, n):
    return x * (np.sqrt(np.abs(np.float64(s)) + 1.0) - np.int64(n)).astype(x.dtype)


JITTED = {backend: go.jit(weak_chain, backend=backend) for backend in ("interpreter", "llvm")}


@settings(deadline=None, max_examples=60)
@given(dtype=st.sampled_from(FLOATS), s=st.floats(-1e4, 1e4), n=st.integers(-100, 100))
def test_eager_and_jit_round_weak_values_once(dtype, s, n):
    x = array(dtype, (2, 3))
    want = weak_chain_numpy(x, s, n)
    assert_same(weak_chain(x, s, n), want)
    for jitted in JITTED.values():
        assert_same(jitted(x, s, n), want)  # s, n: weak f64 and i64 graph inputs


def int_chain(k, a, b):
    return k * ops.abs(a) + ops.add(b, a)


INT_JITTED = {backend: go.jit(int_chain, backend=backend) for backend in ("interpreter", "llvm")}


@settings(deadline=None, max_examples=40)
@given(dtype=st.sampled_from(INTS), a=st.integers(-1000, 1000), b=st.booleans())
def test_weak_ints_and_bools_meet_int_tensors(dtype, a, b):
    k = array(dtype)
    want = k * dtype(abs(a)) + dtype(b + a)
    assert_same(int_chain(k, a, b), want)
    for jitted in INT_JITTED.values():
        assert_same(jitted(k, a, b), want)  # a, b: weak i64 and bool graph inputs
