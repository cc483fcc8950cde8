"""Family 9: memory shared where an in-place update would break. A Parameter made with
copy=False over an array is that array: a step that updates the Parameter refuses (an
AliasingError at the call, naming the argument and the Parameter) an argument that shares the
array's memory, on both backends; a second Parameter over one array is refused when made."""
import numpy as np
import pytest

import graphopt as go
from graphopt.errors import AliasingError, ParameterError

BACKENDS = ["interpreter", "llvm"]

VIEWS = {
    "itself": lambda a: a,
    "reshaped": lambda a: a.reshape(2, 4).reshape(8),
    "reversed": lambda a: a[::-1],
    "eager-tensor": lambda a: go.EagerTensor(a),
}


def make(backend):
    a = np.arange(8, dtype=np.float32)
    p = go.Parameter(a, copy=False, name="p")

    @go.jit(backend=backend, cache=False)
    def step(x):
        go.assign(p, p + x)
        return x * 2.0

    return a, p, step


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", list(VIEWS))
def test_an_argument_aliasing_an_updated_parameter_is_refused(backend, view):
    a, p, step = make(backend)
    before = p.numpy()
    with pytest.raises(AliasingError, match=r"argument 'x' shares memory with Parameter 'p'"):
        step(VIEWS[view](a))
    np.testing.assert_array_equal(p.numpy(), before)  # nothing ran


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_aliasing_argument_is_refused_after_fast_path_calls(backend):
    a, p, step = make(backend)
    ones = np.ones(8, np.float32)
    for _ in range(3):  # the repeated-call fast path is set up
        step(ones)
    with pytest.raises(AliasingError):
        step(a)
    np.testing.assert_array_equal(p.numpy(), np.arange(8) + 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_aliasing_argument_in_a_structure_is_named_by_its_path(backend):
    a = np.zeros(4, np.float32)
    p = go.Parameter(a, copy=False, name="p")

    @go.jit(backend=backend, cache=False)
    def step(batch):
        go.assign(p, p + batch["g"][1])

    with pytest.raises(AliasingError, match=r"argument 'batch\.g\.1'.*Parameter 'p'"):
        step({"g": [np.ones(4, np.float32), a[::-1]]})


@pytest.mark.parametrize("backend", BACKENDS)
def test_reading_an_aliased_parameter_without_updating_it_is_allowed(backend):
    a = np.arange(4, dtype=np.float32)
    p = go.Parameter(a, copy=False, name="p")
    q = go.Parameter(np.zeros(4, np.float32), name="q")

    @go.jit(backend=backend, cache=False)
    def step(x):
        go.assign(q, p * x)

    step(a)
    np.testing.assert_array_equal(q.numpy(), a * a)


@pytest.mark.parametrize("backend", BACKENDS)
def test_copies_and_other_arrays_are_accepted(backend):
    a, p, step = make(backend)
    out = step(np.array(a))
    np.testing.assert_array_equal(out, np.arange(8) * 2)
    np.testing.assert_array_equal(p.numpy(), np.arange(8) * 2)
    np.testing.assert_array_equal(a, np.arange(8) * 2)  # copy=False: a is the buffer


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_copied_parameter_is_never_aliased(backend):
    a = np.arange(4, dtype=np.float32)
    p = go.Parameter(a, name="p")  # copy=True: the buffer is graphopt's own

    @go.jit(backend=backend, cache=False)
    def step(x):
        go.assign(p, p + x)

    step(a)
    step(a)
    np.testing.assert_array_equal(p.numpy(), 3 * np.arange(4))


@pytest.mark.parametrize("name", [None, "q"])
def test_two_parameters_over_one_array_are_refused(name):
    a = np.ones(4, np.float32)
    p = go.Parameter(a, copy=False, name="first")
    with pytest.raises(AliasingError, match="already the buffer of Parameter 'first'"):
        go.Parameter(a, copy=False, name=name)
    assert issubclass(AliasingError, ParameterError)
    q = go.Parameter(a, name="second")  # a copy is fine
    assert q._value is not p._value


def test_a_dead_parameter_frees_its_array_for_another():
    a = np.ones(4, np.float32)
    p = go.Parameter(a, copy=False, name="first")
    del p
    import gc
    gc.collect()
    assert go.Parameter(a, copy=False, name="second")._value is a


def test_the_repeated_call_path_costs_no_more_without_exposed_parameters():
    """A step over 1,000 gradients with graphopt-owned Parameters: the alias check is one
    attribute test on the fast path (the time per call stays within a few microseconds of a
    call that skips the check)."""
    ps = [go.Parameter(np.zeros(4, np.float32), name=f"w{i}") for i in range(1000)]

    @go.jit(backend="interpreter", cache=False)
    def step(gs):
        for p, g in zip(ps, gs):
            go.assign(p, p - g)

    gs = [np.ones(4, np.float32) for _ in ps]
    step(gs)
    assert step._last is not None and not step._last.exposed
