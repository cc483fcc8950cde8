"""Bad input: each is a GraphoptError subclass whose message names the problem and, where the
tracer knows it, the user's file:line (this file, the offending line, marked `# bad:...`).

A step that fails leaves every Parameter exactly as it was.
"""
import os

import numpy as np
import pytest
import support

import graphopt as go
from graphopt import ops
from graphopt.errors import (AssignError, BackendError, ExecutionError, GraphoptError,
                             OpTypeError, ParameterError, SignatureError, TracerBoolError)
from graphopt.frontend.traces import current_trace

HERE = os.path.basename(__file__)


def line_of(marker: str) -> int:
    """The line of this file ending in `# <marker>` (exactly one)."""
    return support.line_of(__file__, marker)


def assert_points_here(err: GraphoptError, marker: str) -> None:
    """The error carries this file and the marked line, and shows them in its message."""
    line = line_of(marker)
    assert err.loc is not None, str(err)
    assert os.path.basename(err.loc.file) == HERE
    assert err.loc.line == line, (err.loc, line)
    assert f"{HERE}:{line}" in str(err)
    assert str(err).startswith(f"{err.loc.file}:{line}: ")


def snapshot(*params: go.Parameter) -> list[bytes]:
    """Each Parameter's bytes, for bit-for-bit comparison (NaN payloads included)."""
    return [p.numpy().tobytes() for p in params]


# -- Python control flow on traced tensors -------------------------------------------------------
def test_if_on_a_traced_tensor():
    def step(x):
        if x.sum() > 0:  # bad:if
            return x
        return -x

    with pytest.raises(TracerBoolError) as info:
        go.trace(step, np.ones(3))
    err = info.value
    assert isinstance(err, GraphoptError) and isinstance(err, TypeError)
    assert "graphopt.ops.where" in str(err)
    assert "Python control flow" in str(err)
    assert "bool[]" in str(err)  # names the tensor it was asked about
    assert_points_here(err, "bad:if")


def test_if_under_jit_and_in_a_while_loop():
    @go.jit
    def step(x):
        while x.max() > 1:  # bad:while
            x = x / 2
        return x

    with pytest.raises(TracerBoolError, match="graphopt.ops.where") as info:
        step(np.ones(3))
    assert_points_here(info.value, "bad:while")
    assert current_trace() is None
    assert step.cache_info().size == 0


def test_and_or_on_traced_tensors():
    def step(x):
        return (x > 0) and (x < 1)  # bad:and

    with pytest.raises(TracerBoolError, match="graphopt.ops.where") as info:
        go.trace(step, np.ones(2))
    assert_points_here(info.value, "bad:and")


def test_bool_on_a_traced_tensor():
    def step(x):
        flag = bool(x.sum())  # bad:bool
        return x if flag else -x

    with pytest.raises(TracerBoolError, match=r"bool\(\)") as info:
        go.trace(step, np.ones(2))
    assert "graphopt.ops.where" in str(info.value)
    assert_points_here(info.value, "bad:bool")


def test_float_on_a_traced_tensor():
    def step(x):
        return x * float(x.mean())  # bad:float

    with pytest.raises(TracerBoolError, match=r"float\(\)") as info:
        go.trace(step, np.ones(2))
    assert "graphopt.ops.where" in str(info.value)
    assert_points_here(info.value, "bad:float")


def test_int_and_numpy_conversion_of_a_traced_tensor():
    def as_int(x):
        return x * int(x.sum())  # bad:int

    with pytest.raises(TracerBoolError, match=r"int\(\)") as info:
        go.trace(as_int, np.ones(2))
    assert_points_here(info.value, "bad:int")

    def as_numpy(x):
        return np.asarray(x)  # bad:asarray

    with pytest.raises(TracerBoolError, match="numpy array") as info:
        go.trace(as_numpy, np.ones(2))
    assert_points_here(info.value, "bad:asarray")


def test_bool_of_an_eager_tensor_is_fine():
    x = go.EagerTensor(np.array([1.0, 2.0]))
    assert bool(x.sum() > 0)
    assert float(x.sum()) == 3.0


# -- shapes and dtypes --------------------------------------------------------------------------
def test_shape_mismatch():
    def step(x, y):
        return x + y  # bad:shape

    with pytest.raises(OpTypeError) as info:
        go.trace(step, np.ones(3, np.float32), np.ones(4, np.float32))
    err = info.value
    assert "add" in str(err) and "broadcast" in str(err)
    assert "f32[3]" in str(err) and "f32[4]" in str(err)
    assert_points_here(err, "bad:shape")


def test_shape_mismatch_in_eager_mode_has_the_location_too():
    x = go.EagerTensor(np.ones(3, np.float32))
    with pytest.raises(OpTypeError, match="broadcast") as info:
        x * np.ones((2, 2), np.float32)  # bad:eager-shape
    assert_points_here(info.value, "bad:eager-shape")


def test_dtype_mismatch():
    def step(x, y):
        return x * y  # bad:dtype

    with pytest.raises(OpTypeError) as info:
        go.trace(step, np.ones(3, np.float32), np.ones(3, np.float64))
    err = info.value
    assert "different dtypes" in str(err) and "f32[3]" in str(err) and "f64[3]" in str(err)
    assert ".astype" in str(err)
    assert_points_here(err, "bad:dtype")


def test_python_float_with_int_tensor():
    def step(x):
        return x * 0.5  # bad:weak-float

    with pytest.raises(OpTypeError, match="Python float.*i32") as info:
        go.trace(step, np.arange(3, dtype=np.int32))
    assert_points_here(info.value, "bad:weak-float")


@pytest.mark.parametrize("fn,pattern", [
    (lambda x: ops.sqrt(x), "sqrt: dtype i64 is not supported"),
    (lambda x: x / x, "divide: dtype i64"),
    (lambda x: x.mean(), "mean: dtype i64"),
    (lambda x: ops.logical_not(x), "logical_not: dtype i64"),
    (lambda x: ops.where(x, x, x), "where: the condition must be bool"),
], ids=["sqrt", "divide", "mean", "logical_not", "where"])
def test_dtype_not_supported_by_the_op(fn, pattern):
    with pytest.raises(OpTypeError, match=pattern):
        go.trace(fn, np.arange(3))


@pytest.mark.parametrize("fn,pattern", [
    (lambda x: x.reshape(5, -1), r"reshape: cannot reshape f64\[2,3\]"),
    (lambda x: x.reshape(4), r"reshape: cannot reshape"),
    (lambda x: x.sum(axis=2), r"sum: axis 2 is out of range"),
    (lambda x: x.max(axis=(0, -2)), r"max: axis \[0, -2\] repeats an axis"),
    (lambda x: x.transpose(2, 0), r"transpose: perm \[2, 0\]"),
    (lambda x: x.transpose(0, 0), r"transpose: perm \[0, 0\]"),
    (lambda x: ops.broadcast_to(x, (3, 3)), "broadcast_to"),
    (lambda x: x @ x, "matmul: contraction sizes differ"),
    (lambda x: x @ x.sum(), "matmul: operands must have at least one axis"),
], ids=["reshape-1", "reshape", "sum-axis", "max-dup-axis", "transpose-range",
        "transpose-dup", "broadcast_to", "matmul", "matmul-scalar"])
def test_shape_op_errors(fn, pattern):
    with pytest.raises(OpTypeError, match=pattern) as info:
        go.trace(fn, np.ones((2, 3)))
    assert os.path.basename(info.value.loc.file) == HERE


def test_cannot_use_an_unsupported_operand():
    def step(x):
        return x + "1"  # bad:operand

    with pytest.raises(OpTypeError, match="cannot use a str") as info:
        go.trace(step, np.ones(2))
    assert_points_here(info.value, "bad:operand")


def test_traced_tensor_escaping_its_trace():
    kept = []

    def step(x):
        kept.append(x * 2)
        return x

    go.trace(step, np.ones(2))

    def other(y):
        return y + kept[0]  # bad:escape

    with pytest.raises(GraphoptError, match="outside the trace") as info:
        go.trace(other, np.ones(2))
    assert_points_here(info.value, "bad:escape")
    with pytest.raises(GraphoptError, match="outside the trace"):
        kept[0] + 1  # in eager mode too


# -- assign -------------------------------------------------------------------------------------
def test_assign_to_a_traced_tensor():
    def step(x):
        go.assign(x, x + 1)  # bad:assign-tensor

    with pytest.raises(AssignError, match="needs a graphopt.Parameter.*TracedTensor") as info:
        go.trace(step, np.ones(2))
    assert_points_here(info.value, "bad:assign-tensor")


def test_assign_to_a_numpy_array():
    target = np.zeros(2)

    def step(x):
        go.assign(target, x)  # bad:assign-array

    with pytest.raises(AssignError, match="ndarray") as info:
        go.trace(step, np.ones(2))
    assert_points_here(info.value, "bad:assign-array")
    with pytest.raises(AssignError, match="ndarray"):
        go.assign(target, np.ones(2))  # eager
    assert np.all(target == 0)


def test_assign_wrong_shape():
    p = go.Parameter(np.zeros(3, np.float32), name="p")

    def step(x):
        go.assign(p, x)  # bad:assign-shape

    with pytest.raises(AssignError) as info:
        go.trace(step, np.ones(4, np.float32))
    err = info.value
    assert "p" in str(err) and "f32[4]" in str(err) and "f32[3]" in str(err)
    assert_points_here(err, "bad:assign-shape")


def test_assign_does_not_broadcast():
    p = go.Parameter(np.zeros((2, 3)), name="p")
    with pytest.raises(AssignError, match=r"f64\[3\].*f64\[2,3\]"):
        go.trace(lambda x: go.assign(p, x), np.ones(3))


def test_assign_wrong_dtype():
    p = go.Parameter(np.zeros(3, np.float32), name="p")

    def step(x):
        go.assign(p, x * 2)  # bad:assign-dtype

    with pytest.raises(AssignError, match=r"f64\[3\].*f32\[3\]") as info:
        go.trace(step, np.ones(3, np.float64))
    assert_points_here(info.value, "bad:assign-dtype")


def test_assign_python_float_to_int_parameter():
    p = go.Parameter(np.zeros(3, np.int32), name="counter")

    def step():
        go.assign(p, 0.5)  # bad:assign-float

    with pytest.raises(AssignError, match="Python float.*i32") as info:
        go.trace(step)
    assert_points_here(info.value, "bad:assign-float")


def test_eager_assign_errors_leave_the_parameter_unchanged(rng):
    p = go.Parameter(rng.standard_normal(3).astype(np.float32), name="p")
    before = snapshot(p)
    with pytest.raises(AssignError, match="f64"):
        go.assign(p, rng.standard_normal(3))
    with pytest.raises(AssignError, match=r"f32\[2\]"):
        go.assign(p, np.ones(2, np.float32))
    assert snapshot(p) == before


# -- Parameters ---------------------------------------------------------------------------------
def test_two_parameters_with_one_name_read():
    a = go.Parameter(np.zeros(2), name="w")
    b = go.Parameter(np.ones(2), name="w")

    def step():
        return a + b  # bad:dup-read

    with pytest.raises(ParameterError, match="two different Parameters are named 'w'") as info:
        go.trace(step)
    assert_points_here(info.value, "bad:dup-read")


def test_two_parameters_with_one_name_assigned():
    a = go.Parameter(np.zeros(2), name="w")
    b = go.Parameter(np.ones(2), name="w")

    def read_then_assign():
        go.assign(a, b + 1)  # bad:dup-assign

    with pytest.raises(ParameterError, match="'w'") as info:
        go.trace(read_then_assign)
    assert_points_here(info.value, "bad:dup-assign")

    def assign_both(x):
        go.assign(a, x)
        go.assign(b, x)  # bad:dup-assign-both

    with pytest.raises(ParameterError, match="'w'") as info:
        go.trace(assign_both, np.ones(2))
    assert_points_here(info.value, "bad:dup-assign-both")


def test_two_parameters_with_one_name_as_arguments():
    a = go.Parameter(np.zeros(2), name="w")
    b = go.Parameter(np.ones(2), name="w")
    fn = go.jit(lambda ps: ps[0] + ps[1])
    with pytest.raises(ParameterError, match="'w'"):
        fn([a, b])
    np.testing.assert_array_equal(fn([a, a]), np.zeros(2))  # one Parameter twice is fine


def test_same_parameter_twice_is_fine():
    a = go.Parameter(np.arange(3.0), name="w")
    g = go.trace(lambda: a * a + a)
    assert len(g.params) == 1


@pytest.mark.parametrize("name", ["", "1w", "w-1", "a b", "@w"])
def test_bad_parameter_name(name):
    with pytest.raises(ParameterError, match="Parameter name"):
        go.Parameter(np.zeros(2), name=name)


def test_parameter_of_unsupported_dtype():
    with pytest.raises(ParameterError, match="unsupported dtype"):
        go.Parameter(np.zeros(2, np.complex64), name="c")
    with pytest.raises(ParameterError):
        go.Parameter(np.array(["a", "b"]), name="s")


# -- atomic steps -------------------------------------------------------------------------------
def _state(rng):
    w = go.Parameter(rng.standard_normal(4), name="w")
    k = go.Parameter(np.array([1, 2, 3], np.int64), name="k")
    nan = go.Parameter(np.array([np.nan, -0.0, np.inf]), name="nan")  # odd bits kept too
    return w, k, nan


def test_runtime_error_leaves_every_parameter_unchanged(rng):
    w, k, nan = _state(rng)

    @go.jit
    def step(g, e):
        go.assign(w, w - g)  # assigned before the failing node runs
        go.assign(nan, nan * 2)
        go.assign(k, k ** e)  # bad:runtime

    before = snapshot(w, k, nan)
    with pytest.raises(ExecutionError) as info:
        step(rng.standard_normal(4), np.array([1, -1, 2]))  # an int to a negative int power
    err = info.value
    assert isinstance(err, GraphoptError)
    assert "power" in str(err) and "no parameter was changed" in str(err)
    assert_points_here(err, "bad:runtime")
    assert snapshot(w, k, nan) == before
    # The compiled step still works, and only then changes state.
    g = rng.standard_normal(4)
    w0 = w.numpy()
    step(g, np.array([1, 2, 0]))
    np.testing.assert_array_equal(w.numpy(), w0 - g)
    np.testing.assert_array_equal(k.numpy(), np.array([1, 2, 3]) ** np.array([1, 2, 0]))
    assert step.cache_info().traces == 1


def test_runtime_error_on_a_cached_step(rng):
    w, k, nan = _state(rng)

    @go.jit
    def step(e):
        go.assign(w, w * 2)
        go.assign(k, k ** e)

    step(np.array([1, 1, 1]))
    before = snapshot(w, k, nan)
    with pytest.raises(ExecutionError, match="power"):
        step(np.array([0, -2, 1]))
    assert step.cache_info().traces == 1 and step.cache_info().hits == 1
    assert snapshot(w, k, nan) == before


@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_runtime_error_in_a_fused_op_names_it(rng, backend):
    """A kernel that numpy runs (llvm: an integer power has no lowering) names the fused op
    that failed and its line, not the kernel."""
    w, k, nan = _state(rng)

    @go.jit(backend=backend, cache=False)
    def step(e):
        go.assign(w, w * 2)
        go.assign(k, k ** e + 1)  # bad:fused

    before = snapshot(w, k, nan)
    with pytest.raises(ExecutionError) as info:
        step(np.array([1, -1, 2]))
    err = info.value
    assert "power (fused in a kernel) failed while the step ran" in str(err)
    assert str(err).endswith("; no parameter was changed")
    assert_points_here(err, "bad:fused")
    assert snapshot(w, k, nan) == before
    assert any(n.op == "kernel" and any(b.op == "power" for b in n.body.nodes)
               for n in step.lower(np.array([1, 1, 1])).graph.nodes)


def test_python_exception_after_an_assign_changes_nothing(rng):
    w, k, nan = _state(rng)

    class UserBug(Exception):
        pass

    @go.jit
    def step(g):
        go.assign(w, w - g)
        go.assign(k, k + 1)
        raise UserBug("stop half-way")

    before = snapshot(w, k, nan)
    with pytest.raises(UserBug):
        step(np.ones(4))
    assert snapshot(w, k, nan) == before
    assert current_trace() is None
    assert step.cache_info().size == 0


def test_graphopt_error_mid_trace_changes_nothing(rng):
    w, k, nan = _state(rng)

    @go.jit
    def step(g):
        go.assign(w, w - g)
        go.assign(k, k * 0.5)  # bad:mid-trace

    before = snapshot(w, k, nan)
    with pytest.raises(OpTypeError) as info:
        step(np.ones(4))
    assert_points_here(info.value, "bad:mid-trace")
    assert snapshot(w, k, nan) == before


def test_wrong_argument_shape_through_lower(rng):
    w, k, nan = _state(rng)

    @go.jit
    def step(g, lr):
        go.assign(w, w - lr * g)

    g = rng.standard_normal(4)
    exe = step.lower(g, 0.1)
    before = snapshot(w, k, nan)
    with pytest.raises(SignatureError, match=r"argument 'g' is float64\[5\].*f64\[4\]"):
        exe(np.ones(5), 0.1)
    with pytest.raises(SignatureError, match=r"float32\[4\].*f64\[4\]"):
        exe(np.ones(4, np.float32), 0.1)
    with pytest.raises(SignatureError):
        exe([g], 0.1)  # another structure
    with pytest.raises(SignatureError):
        exe(g)  # a missing argument
    with pytest.raises(SignatureError):
        exe("g", 0.1)
    assert snapshot(w, k, nan) == before
    exe(g, 0.1)
    np.testing.assert_array_equal(w.numpy(), np.frombuffer(before[0]) - 0.1 * g)
    assert step.cache_info().traces == 1


def test_signature_errors_on_a_jitted_function_change_nothing(rng):
    w, k, nan = _state(rng)

    @go.jit
    def step(gs):
        go.assign(w, w - gs[0] - gs[1])

    step([np.ones(4), np.ones(4)])
    before = snapshot(w, k, nan)
    with pytest.raises(SignatureError, match="list of 2 items.*list of 3 items"):
        step([np.ones(4)] * 3)
    with pytest.raises(SignatureError, match="argument 'gs.1' is a str"):
        step([np.ones(4), "x"])
    assert snapshot(w, k, nan) == before


def test_unknown_backend():
    with pytest.raises(BackendError, match="unknown backend 'gpu'.*interpreter"):
        go.jit(lambda x: x, backend="gpu")


def test_every_error_class_is_a_graphopt_error():
    import graphopt.errors as errors
    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, Exception) and c is not GraphoptError]
    assert len(classes) >= 10
    assert all(issubclass(c, GraphoptError) for c in classes)
