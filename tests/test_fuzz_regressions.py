"""Bugs the differential fuzzer (benchmarks/fuzz.py) found, each as its smallest program.

Each test asserts what the documentation promises. The ones graphopt does not do yet are
marked xfail(strict=True): they fail the suite as soon as the bug is fixed, so the mark is
removed with the fix (and the bug's name with it from fuzz.KNOWN_BUGS, which
tests/test_fuzz.py steers clear of).
"""
import numpy as np
import pytest

import graphopt as go
from graphopt import ops, optim
from graphopt.errors import GraphoptError


def eager(fn, *args):
    """fn run op by op on graphopt tensors (eager mode)."""
    return fn(*[go.EagerTensor(a) if isinstance(a, np.ndarray) else a for a in args])


def bits(a):
    a = np.asarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


# -- rsqrt (and the activations) on f16/bf16: one rounding in llvm, several in numpy ------------
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_low_precision_rsqrt_gives_the_interpreters_bits(dtype):
    x = np.linspace(0.5, 4.0, 200).astype(go.ir.to_dtype(dtype).np_dtype)
    ref = go.jit(ops.rsqrt, backend="interpreter")(x)
    got = go.jit(ops.rsqrt, backend="llvm")(x)
    assert (bits(got) == bits(ref)).all()


def test_f16_gelu_is_within_one_ulp_of_the_interpreter():
    """Both compute in f32 and round once (it was numpy rounding 1 + tanh(...) to f16 that
    cancelled). Where 1 + tanh(z) cancels (x < -3) the two tanh (numpy's and graphopt's
    inline one), a last bit apart, still give results apart by 0.5 |x| 2^-24: an absolute
    tolerance of that."""
    x = np.linspace(-6.0, 6.0, 400).astype(np.float16)
    ref = go.jit(ops.gelu, backend="interpreter")(x).astype(np.float64)
    got = go.jit(ops.gelu, backend="llvm")(x).astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=2 ** -10 + 2e-5, atol=3.2 * 2 ** -24)


# -- a multi-tensor kernel whose first tensor is 0-d ----------------------------------------------
def test_a_multi_tensor_step_whose_first_parameter_is_0d_updates_every_element():
    ps = [go.Parameter(np.full((), 2.0), name="a"), go.Parameter(np.full(5, 2.0), name="b")]
    opt = optim.SGD(ps, lr=0.5)
    step = go.jit(lambda grads: opt.step(grads), backend="llvm")
    step([np.ones(()), np.ones(5)])
    np.testing.assert_array_equal(ps[0].numpy(), 1.5)
    np.testing.assert_array_equal(ps[1].numpy(), np.full(5, 1.5))  # llvm: [1.5, 2, 2, 2, 2]


# -- gradients scaled by a scalar of their own, mapped over the parameters ------------------------
@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_each_gradient_keeps_its_own_scale_in_a_mapped_step(backend):
    ps = [go.Parameter(np.zeros(3, np.float32), name=f"w{i}") for i in range(2)]
    opt = optim.SGD(ps, lr=1.0)

    def step(g0, s0, g1, s1):
        opt.step([g0 * s0, g1 * s1])

    go.jit(step, backend=backend)(np.ones(3, np.float32), 1.0, np.ones(3, np.float32), 10.0)
    np.testing.assert_array_equal(ps[0].numpy(), np.full(3, -1.0, np.float32))
    np.testing.assert_array_equal(ps[1].numpy(), np.full(3, -10.0, np.float32))  # jit: -1


def test_a_mapped_step_with_one_shared_scale_is_right():
    """The same step with one scale for both gradients (what the fuzzer's CI slice makes)."""
    ps = [go.Parameter(np.zeros(3, np.float32), name=f"w{i}") for i in range(2)]
    opt = optim.SGD(ps, lr=1.0)

    def step(g0, g1, s):
        opt.step([g0 * s, g1 * s])

    go.jit(step, backend="llvm")(np.ones(3, np.float32), np.ones(3, np.float32), 10.0)
    for p in ps:
        np.testing.assert_array_equal(p.numpy(), np.full(3, -10.0, np.float32))


# -- max over an empty axis -------------------------------------------------------------------------
def test_max_of_an_empty_tensor_is_rejected_by_both_backends():
    x = np.zeros((0,), np.float32)
    with pytest.raises(GraphoptError):
        go.jit(lambda x: x.max(), backend="interpreter")(x)
    with pytest.raises(GraphoptError):
        go.jit(lambda x: x.max(), backend="llvm")(x)


# -- eager mode lets numpy's errors through ---------------------------------------------------------
@pytest.mark.parametrize("case", ["max of nothing", "integer to a negative power"])
def test_eager_raises_a_graphopt_error_where_jit_does(case):
    fn, x = {"max of nothing": (lambda x: x.max(), np.zeros((0,), np.float32)),
             "integer to a negative power": (lambda x: x ** -1, np.arange(1, 4, dtype=np.int32))
             }[case]
    with pytest.raises(GraphoptError):
        go.jit(fn, backend="interpreter")(x)
    with pytest.raises(GraphoptError):
        eager(fn, x)


# -- bf16 divided by a power of two -------------------------------------------------------------
@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_bf16_divided_by_a_power_of_two_compiles(backend):
    x = np.array([1.0, -3.0, 0.5], dtype=go.ir.to_dtype("bf16").np_dtype)
    got = go.jit(lambda x: x / 0.25, backend=backend)(x)
    assert (bits(got) == bits(eager(lambda x: x / 0.25, x).numpy())).all()


# -- the sign of zero: maximum/minimum of +0 and -0, and sign(-0) ---------------------------------
def _signbits(fn, *args):
    ref = go.jit(fn, backend="interpreter")(*args)
    got = go.jit(fn, backend="llvm")(*args)
    return np.signbit(got.astype(np.float32)).tolist(), np.signbit(ref.astype(np.float32)).tolist()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_and_minimum_of_signed_zeros_give_the_interpreters_zero(op, dtype):
    x = np.array([0.0, -0.0, 0.0, -0.0] * 4, dtype)
    y = np.array([-0.0, 0.0, 0.0, -0.0] * 4, dtype)
    got, want = _signbits(getattr(ops, op), x, y)
    assert got == want


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64"])
def test_sign_of_negative_zero_gives_the_interpreters_zero(dtype):
    x = np.array([-0.0, 0.0, 1.0, -2.0] * 4, go.ir.to_dtype(dtype).np_dtype)
    got, want = _signbits(ops.sign, x)
    assert got == want


# -- a full sum of a transposed value: eager and the interpreter add in different orders ----------
def test_eager_and_jit_sum_a_transposed_value_alike():
    x = np.random.default_rng(0).standard_normal((64, 65)).astype(np.float32)

    def f(x):
        return (x.T * 100.0).sum()

    assert bits(eager(f, x).numpy()) == bits(go.jit(f, backend="interpreter")(x))


# -- the memory plan: a value an assign gives a parameter lives until the commit -------------------
def test_a_value_assigned_from_numpy_is_not_overwritten_by_a_later_one_in_the_plan():
    """Seeds 1000077, 1000126, 1000140: a scalar parameter's new value, made by numpy nodes
    (into the plan's arena), was committed after the step, when the arena bytes had been
    given to a later value: the assign's read was taken as its last."""
    rng = np.random.default_rng(0)
    ws = [go.Parameter(np.ones(s, np.float32), name=f"w{i}")
          for i, s in enumerate([(), (4, 3), (4, 3), (33,)])]

    def step(c, *gs):
        acc = []
        for w, g in zip(ws, gs):
            v = (0.25 - ops.maximum(c, g)) * 100.0
            go.assign(w, v)
            acc.append((w * w).mean())
        return tuple(acc)

    args = (np.float32(-1.0), *[rng.standard_normal(w.shape).astype(np.float32) for w in ws])
    expected = [(0.25 - np.maximum(args[0], g)) * np.float32(100.0) for g in args[1:]]
    go.jit(step, backend="llvm")(*args)
    for w, e in zip(ws, expected):
        np.testing.assert_array_equal(w.numpy(), e)


# -- whole-step fusion: a "sum" over a scalar space reduces no axis ----------------------------------
@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_lamb_on_a_scalar_parameter_runs_as_eager_does(backend):
    """Seed 1000041: LAMB's norms of a 0-d parameter are "sum" outputs of kernels over the
    space [], which reduce nothing; wholestep moved the update reading one into a finish
    stage of zero axes, which the type rule rejects (1 <= k)."""
    def run(jit):
        w = go.Parameter(np.float32(0.75), name="w")
        opt = optim.LAMB([w], lr=0.5, weight_decay=0.1)

        def step(g):
            opt.step([g])
        fn = go.jit(step, backend=backend) if jit else step
        for g in (0.5, -1.25, 2.0):
            fn(np.float32(g) if jit else go.EagerTensor(np.float32(g)))
        return w.numpy()
    np.testing.assert_allclose(run(True), run(False), rtol=1e-6)
