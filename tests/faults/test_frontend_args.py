"""Family 19: every bad argument of a public constructor or function of the frontend and of
graphopt.ops is a GraphoptError subclass saying what is wrong (never a raw TypeError,
ValueError, MemoryError or AssertionError, and never a silently wrong result)."""
import numpy as np
import pytest

import graphopt as go
from graphopt import ops
from graphopt.errors import (ArgumentError, GradientError, GraphoptError, OpTypeError,
                             ParameterError)

x = np.ones((2, 3), np.float32)


def w():
    return go.Parameter(np.ones((2, 3), np.float32), name="w")


# (id, call, error class, a regex the message must match)
PARAMETER = [
    ("full-huge", lambda: go.Parameter.full((10**6, 10**6), 0.0, "f32"), "cannot be allocated"),
    ("full-too-big-for-int64", lambda: go.Parameter.full((2**40, 2**40), 0.0, "f32"),
     "more than any machine"),
    ("full-negative", lambda: go.Parameter.full((-100,), 0.0, "f32"), "non-negative, got -100"),
    ("full-minus-one", lambda: go.Parameter.full((-1,), 0.0, "f32"), "non-negative, got -1"),
    ("full-nan-into-i32", lambda: go.Parameter.full((3,), float("nan"), "i32"), "nan is not an"),
    ("full-fraction-into-i32", lambda: go.Parameter.full((3,), 2.5, "i32"), "2.5 is not an"),
    ("full-overflow-i32", lambda: go.Parameter.full((3,), 1e20, "i32"), "out of the range"),
    ("full-2-into-bool", lambda: go.Parameter.full((3,), 2, "bool"), "not a bool"),
    ("full-offset-str", lambda: go.Parameter.full((3,), 0.0, "f32", offset="x"),
     "offset must be an int"),
    ("full-offset-unaligned", lambda: go.Parameter.full((10**5,), 0.0, "f32", offset=3),
     "multiple of 64"),
    ("full-shape-str", lambda: go.Parameter.full("ab", 0.0, "f32"), "sequence of ints"),
    ("full-shape-float", lambda: go.Parameter.full((2.5,), 0.0, "f32"), "must be an int"),
    ("full-dtype", lambda: go.Parameter.full((2,), 0.0, "complex"), "unsupported dtype"),
    ("full-fill-str", lambda: go.Parameter.full((2,), "a", "f32"), "must be a number"),
    ("full-bad-name", lambda: go.Parameter.full((2,), 0.0, "f32", name="a b"),
     "must start with a letter"),
    ("init-offset-str", lambda: go.Parameter(x, offset="x"), "offset must be an int"),
    ("init-object", lambda: go.Parameter(object()), "unsupported dtype"),
    ("init-str", lambda: go.Parameter("abc"), "unsupported dtype"),
    ("init-dtype", lambda: go.Parameter(x, dtype="complex"), "unsupported dtype"),
    ("init-nan-into-i32", lambda: go.Parameter(np.array([1.0, np.nan]), dtype="i32"),
     "nan is not an integer"),
    ("init-overflow-i32", lambda: go.Parameter(np.array([1e12]), dtype="i32"),
     "out of the range"),
    ("init-i64-overflow-i32", lambda: go.Parameter(np.array([2**40]), dtype="i32"),
     "out of the range"),
    ("init-copy-str", lambda: go.Parameter(x, copy="no"), "copy must be True or False"),
]

OPS = [
    ("cast-complex", lambda: ops.cast(w(), "complex"), "cast: dtype: unsupported dtype"),
    ("cast-int", lambda: ops.cast(w(), 5), "unsupported dtype 5"),
    ("astype-complex", lambda: w().astype("complex"), "unsupported dtype"),
    ("sum-axis-str", lambda: ops.sum(w(), "x"), "sum: axis must be an int"),
    ("sum-axis-float", lambda: ops.sum(w(), 1.5), "sum: axis must be an int"),
    ("sum-axis-out-of-range", lambda: ops.sum(w(), 5), "out of range"),
    ("sum-axis-negative-out-of-range", lambda: ops.sum(w(), -5), "out of range"),
    ("sum-axis-repeated", lambda: ops.sum(w(), (0, -2)), "repeats an axis"),
    ("sum-keepdims-str", lambda: ops.sum(w(), 0, keepdims="yes"), "keepdims must be True"),
    ("mean-axis-str", lambda: ops.mean(w(), "x"), "mean: axis"),
    ("max-keepdims-int", lambda: w().max(0, 1), "keepdims must be True"),
    ("reshape-str", lambda: ops.reshape(w(), "ab"), "sequence of ints"),
    ("reshape-float", lambda: ops.reshape(w(), (2.5, 2)), "must be an int"),
    ("reshape-negative", lambda: ops.reshape(w(), (-2, -3)), "non-negative"),
    ("transpose-str", lambda: ops.transpose(w(), "x"), "sequence of ints"),
    ("transpose-floats", lambda: ops.transpose(w(), (1.0, 0.0)), "must be an int"),
    ("broadcast_to-str", lambda: ops.broadcast_to(w(), "x"), "sequence of ints"),
    ("full-negative", lambda: ops.full((-1,), 0.0), "non-negative"),
    ("full-str-shape", lambda: ops.full("ab", 0.0), "sequence of ints"),
    ("full-nan-into-i32", lambda: ops.full((2,), float("nan"), "i32"), "nan is not an"),
    ("full-value-str", lambda: ops.full((2,), "a"), "must be a number"),
    ("zeros-complex", lambda: ops.zeros((2,), "complex"), "unsupported dtype"),
    ("arange-negative", lambda: ops.arange(-1), "at least 0"),
    ("arange-str", lambda: ops.arange("x"), "must be an int"),
    ("arange-float", lambda: ops.arange(2.5), "must be an int"),
    ("one_hot-classes-str", lambda: ops.one_hot(np.array([0, 1]), "x"), "must be an int"),
    ("one_hot-negative", lambda: ops.one_hot(np.array([0, 1]), -1), "at least 0"),
    ("log_softmax-axis-str", lambda: ops.log_softmax(w(), "x"), "must be an int"),
    ("log_softmax-axis-out-of-range", lambda: ops.log_softmax(w(), 5), "out of range"),
    ("asarray-complex", lambda: ops.asarray(np.ones(2, np.complex64)), "unsupported dtype"),
    ("asarray-str", lambda: ops.asarray("x"), "unsupported dtype"),
    ("depend-str", lambda: ops.depend("a"), "str"),
    ("add-list", lambda: ops.add(w(), [1, 2, 3]), "list"),
    ("index-array", lambda: w()[np.array([0])], r"only basic indexing.*ops\.gather"),
    ("index-out-of-bounds", lambda: (w() * 1.0)[9], "out of bounds for axis 0"),
    ("index-float", lambda: w()[1.5], "only basic indexing"),
    ("slice-float", lambda: ops.slice(w(), (0.5,), (1,)), "slice: starts must be an int"),
    ("slice-out-of-range", lambda: ops.slice(w(), (0, 0), (9, 1)), "is not a slice of"),
    ("slice_scatter-shape", lambda: ops.slice_scatter(w(), np.ones(3, np.float32), (0, 0),
                                                      (1, 1)), "not the slice's shape"),
]

FUNCTIONS = [
    ("jit-int", lambda: go.jit(5), ArgumentError, "must be a function"),
    ("jit-passes-int", lambda: go.jit(lambda x: x, passes=5), ArgumentError, "passes must be"),
    ("jit-passes-list-of-int", lambda: go.jit(lambda x: x, passes=[1]), ArgumentError,
     "passes must be"),
    ("jit-passes-unknown", lambda: go.jit(lambda x: x, passes="nope"), GraphoptError,
     "unknown pass"),
    ("jit-backend-int", lambda: go.jit(lambda x: x, backend=5), ArgumentError,
     "backend must be a name"),
    ("jit-fastmath-str", lambda: go.jit(lambda x: x, fastmath="yes"), ArgumentError,
     "fastmath must be True"),
    ("jit-cache-str", lambda: go.jit(lambda x: x, cache="no"), ArgumentError,
     "cache must be True"),
    ("jit-decorator-passes-int", lambda: go.jit(passes=5)(lambda x: x), ArgumentError,
     "passes must be"),
    ("trace-int", lambda: go.trace(5, x), ArgumentError, "must be callable"),
    ("value_and_grad-int", lambda: go.value_and_grad(5), GradientError, "a function"),
    ("value_and_grad-has_aux-str", lambda: go.value_and_grad(lambda x: x, has_aux="y"),
     GradientError, "has_aux must be"),
]


@pytest.mark.parametrize("call, match", [c[1:] for c in PARAMETER], ids=[c[0] for c in PARAMETER])
def test_bad_parameter_arguments_are_parameter_errors(call, match):
    with pytest.raises(ParameterError, match=match):
        call()


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("call, match", [c[1:] for c in OPS], ids=[c[0] for c in OPS])
def test_bad_op_arguments_are_op_type_errors(mode, call, match):
    if mode == "eager":
        with pytest.raises(OpTypeError, match=match):
            call()
    else:
        with pytest.raises(OpTypeError, match=match):
            go.jit(lambda a: call(), backend="interpreter")(x)


@pytest.mark.parametrize("call, error, match", [c[1:] for c in FUNCTIONS],
                         ids=[c[0] for c in FUNCTIONS])
def test_bad_function_arguments_are_graphopt_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_an_op_argument_error_names_the_users_line():
    with pytest.raises(OpTypeError) as e:
        ops.sum(w(), "x")
    assert "test_frontend_args.py" in str(e.value)


@pytest.mark.parametrize("call, shape, fill", [
    (lambda: go.Parameter.full((0,), 1.0, "f32"), (0,), 1.0),
    (lambda: go.Parameter.full(3, 7, "i32"), (3,), 7),
    (lambda: go.Parameter.full((2,), 3.0, "i32"), (2,), 3),
    (lambda: go.Parameter.full((2,), True, "bool"), (2,), True),
    (lambda: go.Parameter(np.array([1.0, 2.0]), dtype="i32"), (2,), None),
    (lambda: go.Parameter(np.arange(3), dtype="bool"), None, None),
])
def test_good_arguments_still_work(call, shape, fill):
    if shape is None:
        with pytest.raises(ParameterError, match="not a bool"):  # 2 is not a bool
            call()
        return
    p = call()
    assert p.shape == shape
    if fill is not None:
        assert (p.numpy() == fill).all()
