"""Gradient accumulation: k micro-batches give one step on their mean, in one graph."""
import numpy as np
import pytest

import graphopt as go
from graphopt import optim
from graphopt.errors import OptimizerError
from optim_reference import problem


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_k4_equals_one_step_on_the_mean_gradient(dtype, mode):
    params0, grads = problem(6, dtype, steps=12)
    ps = [go.Parameter(p, name=f"a{i}") for i, p in enumerate(params0)]
    acc = optim.Accumulate(optim.Adam(ps, lr=1e-2, weight_decay=0.01), steps=4)
    step = go.jit(acc.step) if mode == "jit" else acc.step
    ref_ps = [go.Parameter(p, name=f"a{i}") for i, p in enumerate(params0)]
    ref = optim.Adam(ref_ps, lr=1e-2, weight_decay=0.01, name="ref")
    for k in range(0, 12, 4):
        micro = grads[k:k + 4]
        for j, gs in enumerate(micro):
            applied = step(gs)
            assert bool(applied) == (j == 3)
            if j < 3:  # nothing moves before the 4th micro-batch
                np.testing.assert_array_equal(ps[0].numpy(), ref_ps[0].numpy())
        mean = [((m[0] + m[1]) + m[2] + m[3]) / dtype(4) for m in zip(*micro)]
        ref.step(mean)
        for p, r in zip(ps, ref_ps):
            np.testing.assert_array_equal(p.numpy(), r.numpy())
    assert int(acc.opt.step_count.numpy()) == 3 and int(acc.count.numpy()) == 0
    if mode == "jit":
        assert step.cache_info().traces == 1


def test_accumulation_with_a_schedule_counts_updates():
    p = go.Parameter(np.zeros(2), name="p")
    acc = optim.Accumulate(optim.SGD([p], lr=optim.schedules.LinearWarmup(1.0, 2)), steps=2)
    step = go.jit(acc.step)
    for _ in range(6):
        step([np.ones(2)])
    # updates use lr(0)=0, lr(1)=0.5, lr(2)=1.0 on the mean gradient 1
    np.testing.assert_array_equal(p.numpy(), [-1.5, -1.5])


def test_a_dropped_micro_batch_changes_nothing():
    params0, grads = problem(7, np.float32, steps=3)
    ps = [go.Parameter(p, name=f"d{i}") for i, p in enumerate(params0)]
    acc = optim.Accumulate(optim.SGD(ps, lr=0.1), steps=2)
    step = go.jit(acc.step)
    step(grads[0], where=np.bool_(True))
    before = [p.numpy() for p in acc.parameters()]
    step(grads[1], where=np.bool_(False))
    for p, v in zip(acc.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), v)
    assert bool(step(grads[2], where=np.bool_(True)))


def test_bad_accumulation():
    p = go.Parameter(np.zeros(2), name="p")
    with pytest.raises(OptimizerError, match="steps must be an integer >= 1"):
        optim.Accumulate(optim.SGD([p]), steps=0)
    with pytest.raises(OptimizerError, match="the gradient of 'p'"):
        optim.Accumulate(optim.SGD([p]), steps=2).step([np.zeros(3)])
