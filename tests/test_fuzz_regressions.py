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
@pytest.mark.xfail(strict=True, reason="llvm computes 1/sqrt(x) in f32 and rounds once; the "
                   "interpreter (numpy) rounds sqrt(x) to f16/bf16, then the reciprocal: 1 ulp "
                   "apart for ~30% of inputs, where docs/llvm.md promises the same bits")
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_low_precision_rsqrt_gives_the_interpreters_bits(dtype):
    x = np.linspace(0.5, 4.0, 200).astype(go.ir.to_dtype(dtype).np_dtype)
    ref = go.jit(ops.rsqrt, backend="interpreter")(x)
    got = go.jit(ops.rsqrt, backend="llvm")(x)
    assert (bits(got) == bits(ref)).all()


@pytest.mark.xfail(strict=True, reason="gelu on f16: numpy rounds 1 + tanh(...) to f16, which "
                   "cancels to 0 for x < -3 where llvm (one rounding) keeps a small value; "
                   "sigmoid differs by up to 3 ulps")
def test_f16_gelu_is_within_one_ulp_of_the_interpreter():
    x = np.linspace(-6.0, 6.0, 400).astype(np.float16)
    ref = go.jit(ops.gelu, backend="interpreter")(x).astype(np.float64)
    got = go.jit(ops.gelu, backend="llvm")(x).astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=2 ** -10 + 2e-5, atol=6e-8)


# -- a multi-tensor kernel whose first tensor is 0-d ----------------------------------------------
@pytest.mark.xfail(strict=True, reason="llvm gives each shared operand (lr, weight decay) the "
                   "stride of the first instance's space: for a 0-d first parameter the others "
                   "read lr at [unit], past its 8 bytes, and only their first element is updated")
def test_a_multi_tensor_step_whose_first_parameter_is_0d_updates_every_element():
    ps = [go.Parameter(np.full((), 2.0), name="a"), go.Parameter(np.full(5, 2.0), name="b")]
    opt = optim.SGD(ps, lr=0.5)
    step = go.jit(lambda grads: opt.step(grads), backend="llvm")
    step([np.ones(()), np.ones(5)])
    np.testing.assert_array_equal(ps[0].numpy(), 1.5)
    np.testing.assert_array_equal(ps[1].numpy(), np.full(5, 1.5))  # llvm: [1.5, 2, 2, 2, 2]


# -- gradients scaled by a scalar of their own, mapped over the parameters ------------------------
@pytest.mark.xfail(strict=True, reason="hypermap computes an elementwise gradient inside the "
                   "mapped update, and a scalar it reads becomes an operand every instance "
                   "shares: the first gradient's (s0) scales all of them")
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
@pytest.mark.xfail(strict=True, reason="llvm's full max of zero elements returns -inf (its "
                   "identity) where the interpreter raises ExecutionError: a step is rejected "
                   "by one backend and runs on the other")
def test_max_of_an_empty_tensor_is_rejected_by_both_backends():
    x = np.zeros((0,), np.float32)
    with pytest.raises(GraphoptError):
        go.jit(lambda x: x.max(), backend="interpreter")(x)
    with pytest.raises(GraphoptError):
        go.jit(lambda x: x.max(), backend="llvm")(x)


# -- eager mode lets numpy's errors through ---------------------------------------------------------
@pytest.mark.xfail(strict=True, reason="eager mode calls numpy without the interpreter's "
                   "wrapping: a ValueError, not the ExecutionError (a GraphoptError) jit raises")
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
@pytest.mark.xfail(strict=True, reason="simplify's x / c -> x * (1/c) asks np.finfo(bfloat16), "
                   "which numpy does not know (ml_dtypes.finfo does): ValueError out of jit")
@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_bf16_divided_by_a_power_of_two_compiles(backend):
    x = np.array([1.0, -3.0, 0.5], dtype=go.ir.to_dtype("bf16").np_dtype)
    got = go.jit(lambda x: x / 0.25, backend=backend)(x)
    assert (bits(got) == bits(eager(lambda x: x / 0.25, x).numpy())).all()
