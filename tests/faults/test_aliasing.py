"""Family 9: memory shared where an in-place update would break. A Parameter made with
copy=False over an array is that array: a step that updates the Parameter refuses (an
AliasingError at the call, naming the argument and the Parameter) an argument that shares the
array's memory, on both backends and at every entry point that runs a step on the caller's
arrays (a jitted step, a compiled Executable called directly, value_and_grad called eagerly,
an optimizer's step in eager mode); a second Parameter over one array is refused when made."""
import numpy as np
import pytest

import graphopt as go
from graphopt import optim
from graphopt.errors import AliasingError, ParameterError, SignatureError

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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", list(VIEWS))
def test_a_compiled_step_called_directly_refuses_an_aliasing_argument(backend, view):
    a, p, step = make(backend)
    exe = step.lower(np.ones(8, np.float32))  # lowering runs nothing and checks no alias
    with pytest.raises(AliasingError, match=r"argument 'x' shares memory with Parameter 'p'"):
        exe(VIEWS[view](a))
    np.testing.assert_array_equal(p.numpy(), np.arange(8))
    np.testing.assert_array_equal(exe(np.array(a)), np.arange(8) * 2)  # a copy is fine
    np.testing.assert_array_equal(a, np.arange(8) * 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_compiled_step_refuses_a_memoryview_as_jit_does(backend):
    """np.asarray would make a memoryview of the Parameter's array a view of it; a compiled
    step takes what jit takes, numpy arrays and Python scalars."""
    a, p, step = make(backend)
    exe = step.lower(np.ones(8, np.float32))
    for run in (exe, step):
        with pytest.raises(SignatureError, match="argument 'x' is a memoryview"):
            run(memoryview(a))
    np.testing.assert_array_equal(p.numpy(), np.arange(8))


def grad_assigning(p):
    """value_and_grad of a function that also updates p (a running statistic, say)."""
    def loss(x):
        go.assign(p, p + x)
        return (x * x).sum()
    return go.value_and_grad(loss)


@pytest.mark.parametrize("view", list(VIEWS))
def test_eager_value_and_grad_refuses_an_aliasing_argument(view):
    a = np.arange(8, dtype=np.float32)
    p = go.Parameter(a, copy=False, name="p")
    with pytest.raises(AliasingError, match=r"argument 'args\.0' shares memory with Parameter 'p'"):
        grad_assigning(p)(VIEWS[view](a))
    np.testing.assert_array_equal(p.numpy(), np.arange(8))
    value, g = grad_assigning(p)(np.array(a))
    assert float(value) == float((np.arange(8) ** 2).sum())
    np.testing.assert_array_equal(np.asarray(g), 2 * np.arange(8))
    np.testing.assert_array_equal(a, 2 * np.arange(8))


@pytest.mark.parametrize("backend", BACKENDS)
def test_value_and_grad_in_a_jitted_step_refuses_an_aliasing_argument(backend):
    a = np.arange(8, dtype=np.float32)
    p = go.Parameter(a, copy=False, name="p")
    step = go.jit(lambda x: grad_assigning(p)(x)[0], backend=backend, cache=False)
    with pytest.raises(AliasingError, match=r"argument 'x'.*Parameter 'p'"):
        step(a[::-1])
    np.testing.assert_array_equal(p.numpy(), np.arange(8))


def test_eager_value_and_grad_reading_an_aliased_parameter_is_allowed():
    a = np.arange(4, dtype=np.float32)
    p = go.Parameter(a, copy=False, name="p")
    value, g = go.value_and_grad(lambda x: (p * x).sum(), wrt=[p])(a)
    assert float(value) == float((a * a).sum())
    np.testing.assert_array_equal(np.asarray(g[0]), a)


OPTIMIZERS = {
    "sgd-momentum": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam": lambda ps: optim.Adam(ps, lr=0.1),
    "lion": lambda ps: optim.Lion(ps, lr=0.1),  # reads the gradient after it writes p
    "accumulate": lambda ps: optim.Accumulate(optim.Adam(ps, lr=0.1), steps=1),
}


def snapshot(opt):
    params = opt.opt.parameters() if isinstance(opt, optim.Accumulate) else opt.parameters()
    return {p.name: p.numpy() for p in params + opt.params}


@pytest.mark.parametrize("make_opt", list(OPTIMIZERS.values()), ids=list(OPTIMIZERS))
@pytest.mark.parametrize("view", ["itself", "reversed", "eager-tensor"])
def test_an_eager_optimizer_step_refuses_a_gradient_aliasing_a_parameter(make_opt, view):
    a = np.arange(8, dtype=np.float32)
    p = go.Parameter(a, copy=False, name="p")
    q = go.Parameter(np.ones(8, np.float32), name="q")
    opt = make_opt([q, p])
    before = snapshot(opt)
    kind = type(opt).__name__ if not isinstance(opt, optim.Accumulate) else "Adam"
    for grads in ([np.ones(8, np.float32), VIEWS[view](a)],
                  {"q": np.ones(8, np.float32), "p": VIEWS[view](a)}):
        with pytest.raises(AliasingError, match=rf"{kind}\.step: the gradient of 'p' shares "
                                                rf"memory with Parameter 'p'"):
            opt.step(grads)
        after = snapshot(opt)
        assert all(np.array_equal(after[k], before[k]) for k in before)  # nothing changed
    opt.step([np.ones(8, np.float32), np.array(a)])  # a copy is fine
    assert not np.array_equal(p.numpy(), np.arange(8))


def test_an_eager_step_of_graphopt_owned_parameters_checks_nothing():
    a = np.arange(4, dtype=np.float32)
    p = go.Parameter(a, name="p")  # a copy: the gradient may be the array it was made from
    optim.SGD([p], lr=1.0).step([a])
    np.testing.assert_array_equal(p.numpy(), np.zeros(4))


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
