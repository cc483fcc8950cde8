"""lr schedules: the graph's values against the textbook formulas and torch's schedulers."""
import math

import numpy as np
import pytest

import graphopt as go
from graphopt import optim
from graphopt.errors import OptimizerError
from graphopt.optim import schedules as S
from optim_reference import warmup_cosine

FORMULAS = [
    (S.Constant(0.1), lambda k: 0.1),
    (S.ExponentialDecay(0.1, 0.9), lambda k: 0.1 * 0.9 ** k),
    (S.ExponentialDecay(0.1, 0.5, decay_steps=4), lambda k: 0.1 * 0.5 ** (k / 4)),
    (S.ExponentialDecay(0.1, 0.5, 4, staircase=True), lambda k: 0.1 * 0.5 ** (k // 4)),
    (S.StepDecay(0.1, step_size=7, gamma=0.3), lambda k: 0.1 * 0.3 ** (k // 7)),
    (S.LinearWarmup(0.1, 10), lambda k: 0.1 * min(k, 10) / 10),
    (S.LinearWarmup(0.1, 8, start_factor=0.25, end_factor=0.5),
     lambda k: 0.1 * (0.25 + 0.25 * min(k, 8) / 8)),
    (S.CosineDecay(0.1, 20, min_lr=0.01),
     lambda k: 0.01 + 0.09 * (1 + math.cos(math.pi * min(k, 20) / 20)) / 2),
    (S.WarmupCosine(0.1, 5, 30, min_lr=0.001), lambda k: warmup_cosine(k, 0.1, 5, 30, 0.001)),
    (S.WarmupCosine(0.1, 0, 30), lambda k: warmup_cosine(k, 0.1, 0, 30)),
]


@pytest.mark.parametrize("schedule, formula", FORMULAS, ids=[repr(s) for s, _ in FORMULAS])
def test_schedule_matches_formula_in_graph_and_eager(schedule, formula):
    steps = go.Parameter(np.float64(0), name="steps")

    @go.jit
    def lr_now():
        lr = schedule(steps)
        go.assign(steps, steps + 1.0)
        return lr

    for k in range(40):
        want = formula(k)
        assert lr_now() == pytest.approx(want, rel=1e-13, abs=1e-17)
        assert schedule.value(k) == pytest.approx(want, rel=1e-13, abs=1e-17)
    assert lr_now.cache_info().traces == 1


def test_the_first_step_uses_lr_of_zero_steps_and_skipped_steps_do_not_count():
    p = go.Parameter(np.ones(2), name="p")
    opt = optim.SGD([p], lr=S.LinearWarmup(1.0, 4))
    step = go.jit(lambda g, ok: opt.step([g], where=ok))
    g = np.ones(2)
    step(g, np.bool_(True))  # lr(0) = 0: nothing moves
    np.testing.assert_array_equal(p.numpy(), [1.0, 1.0])
    step(g, np.bool_(False))  # skipped: the step count stays 1
    step(g, np.bool_(True))  # lr(1) = 0.25
    np.testing.assert_array_equal(p.numpy(), [0.75, 0.75])


@pytest.mark.parametrize("args, message", [
    ((S.WarmupCosine, 1.0, 10, 10), "warmup_steps must be an integer in"),
    ((S.CosineDecay, 1.0, 0), "decay_steps must be an integer >= 1"),
    ((S.Constant, -1.0), "lr must be a finite number >= 0"),
    ((S.StepDecay, 1.0, 2.5), "decay_steps"),
])
def test_bad_schedules(args, message):
    with pytest.raises(OptimizerError, match=message):
        args[0](*args[1:])


def _torch():
    return pytest.importorskip("torch")


def _torch_lrs(make_scheduler, steps=40):
    torch = _torch()
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = make_scheduler(opt)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


@pytest.mark.parametrize("ours, theirs", [
    (S.ExponentialDecay(0.1, 0.9), lambda o, t: t.ExponentialLR(o, gamma=0.9)),
    (S.StepDecay(0.1, 7, 0.3), lambda o, t: t.StepLR(o, step_size=7, gamma=0.3)),
    (S.LinearWarmup(0.1, 8, 0.25, 0.5),
     lambda o, t: t.LinearLR(o, start_factor=0.25, end_factor=0.5, total_iters=8)),
    (S.CosineDecay(0.1, 40, 0.01), lambda o, t: t.CosineAnnealingLR(o, T_max=40, eta_min=0.01)),
    (S.WarmupCosine(0.1, 5, 40, 0.0), lambda o, t: t.LambdaLR(
        o, lambda k: k / 5 if k < 5 else 0.5 * (1 + math.cos(math.pi * (k - 5) / 35)))),
], ids=["ExponentialLR", "StepLR", "LinearLR", "CosineAnnealingLR", "warmup-cosine"])
def test_schedule_matches_torch(ours, theirs):
    torch = _torch()
    want = _torch_lrs(lambda o: theirs(o, torch.optim.lr_scheduler))
    # torch's chainable schedulers update the lr recursively: equal up to rounding.
    np.testing.assert_allclose([ours.value(k) for k in range(40)], want, rtol=1e-12, atol=1e-15)
