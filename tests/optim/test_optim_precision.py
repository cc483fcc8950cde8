"""Mixed precision (f16/bf16 parameters, f32 master copies) and state_dtype=bf16."""
import ml_dtypes
import numpy as np
import pytest

import graphopt as go
from graphopt import optim
from optim_reference import Reference, problem

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("low", [np.float16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("kind", ["SGD", "Adam", "Lion"])
@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_low_precision_parameters_update_an_f32_master(low, kind, mode):
    params0, grads = problem(8, np.float32, steps=20)
    options = {"lr": 1e-2, **({"momentum": 0.9} if kind == "SGD" else {})}
    ps = [go.Parameter(p.astype(low), name=f"m{i}") for i, p in enumerate(params0)]
    opt = getattr(optim, kind)(ps, **options)
    step = go.jit(opt.step) if mode == "jit" else opt.step
    # The reference: the same rule in f32, on the rounded start values and gradients.
    ref = Reference(kind, [p.astype(low).astype(np.float32) for p in params0], **options)
    for gs in grads:
        low_gs = [g.astype(low) for g in gs]
        step(low_gs)
        ref.step([g.astype(np.float32) for g in low_gs])
        for p, r in zip(ps, ref.params):
            master = opt.state[p.name]["master"].numpy()
            assert master.dtype == np.float32 and p.dtype.np_dtype == low
            np.testing.assert_array_equal(master, r)
            np.testing.assert_array_equal(p.numpy(), r.astype(low))  # rounded to nearest


def test_f32_gradients_are_accepted_for_f16_parameters():
    p = go.Parameter(np.ones(3, np.float16), name="h")
    opt = optim.SGD([p], lr=0.25)
    opt.step([np.full(3, 1e-6, np.float32)])  # below f16's range, fine in f32
    assert opt.state["h"]["master"].numpy()[0] == np.float32(1) - np.float32(0.25 * 1e-6)


def test_without_master_weights_the_update_is_computed_in_f16():
    params0, grads = problem(9, np.float16, steps=10)
    ps = [go.Parameter(p, name=f"n{i}") for i, p in enumerate(params0)]
    opt = optim.SGD(ps, lr=0.1, momentum=0.9, master_weights=False)
    assert "master" not in opt.state["n0"]
    ref = Reference("SGD", [p.copy() for p in params0], lr=0.1, momentum=0.9)
    for gs in grads:
        opt.step(gs)
        ref.step(gs)
    for p, r in zip(ps, ref.params):
        np.testing.assert_array_equal(p.numpy(), r)


def adam_with_rounded_state(params, grads, state_dtype, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8):
    """Adam in f32 whose moments are rounded to state_dtype after each update (the
    parameter update of a step uses the unrounded moments)."""
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t, gs in enumerate(grads, start=1):
        for i, (p, g) in enumerate(zip(params, gs)):
            mi = m[i] + np.float32(1 - b1) * (g - m[i])
            vi = v[i] * np.float32(b2) + np.float32(1 - b2) * g * g
            denom = np.sqrt(vi) / np.float32((1 - b2 ** t) ** 0.5) + np.float32(eps)
            params[i] = p + np.float32(-lr / (1 - b1 ** t)) * mi / denom
            m[i] = mi.astype(state_dtype).astype(np.float32)
            v[i] = vi.astype(state_dtype).astype(np.float32)
    return params


def test_bf16_state_halves_the_bytes_and_rounds_on_store():
    params0, grads = problem(10, np.float32)
    ps = [go.Parameter(p, name=f"s{i}") for i, p in enumerate(params0)]
    opt = optim.Adam(ps, lr=1e-2, state_dtype="bf16")
    step = go.jit(opt.step)
    for gs in grads:
        step(gs)
    assert opt.state["s0"]["exp_avg"].dtype == go.bf16
    assert opt.state["s0"]["exp_avg"].numpy().nbytes == params0[0].nbytes // 2
    want = adam_with_rounded_state([p.copy() for p in params0], grads, BF16)
    for p, w in zip(ps, want):
        np.testing.assert_array_equal(p.numpy(), w)
    # Against f32 state: after 50 steps of lr 1e-2 the parameters differ by < 1e-3.
    exact = Reference("Adam", [p.copy() for p in params0], lr=1e-2)
    for gs in grads:
        exact.step(gs)
    assert max(np.abs(p.numpy() - e).max() for p, e in zip(ps, exact.params)) < 1e-3


def test_bf16_state_and_bf16_parameters_together():
    p = go.Parameter(np.ones((2, 2), BF16), name="b")
    opt = optim.AdamW([p], state_dtype=go.bf16)
    assert {k: v.dtype.name for k, v in opt.state["b"].items()} == \
        {"master": "f32", "exp_avg": "bf16", "exp_avg_sq": "bf16"}
    step = go.jit(opt.step)
    step([np.ones((2, 2), BF16)])
    # A step of 1e-3 is below bf16's spacing at 1 (2^-7): only the master copy moves...
    master = opt.state["b"]["master"]
    assert (p.numpy() == 1).all() and (master.numpy() < 1).all()
    for _ in range(9):
        step([np.ones((2, 2), BF16)])
    # ...and the small steps add up there, instead of being rounded away one by one.
    np.testing.assert_array_equal(p.numpy(), master.numpy().astype(BF16))
    assert (p.numpy() < 1).all()
