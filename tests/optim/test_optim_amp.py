"""Dynamic and static loss scaling: overflow skips the step exactly, the scale adapts as
torch.amp.GradScaler's does, one compiled step for every outcome."""
import numpy as np
import pytest

import graphopt as go
from graphopt import amp, optim
from graphopt.errors import OptimizerError
from optim_reference import problem


def setup(dtype=np.float32, **scaler_options):
    params0, grads = problem(4, dtype)
    params = [go.Parameter(p, name=f"fc.p{i}") for i, p in enumerate(params0)]
    opt = optim.Adam(params, lr=1e-2)
    scaler = amp.DynamicLossScaler(**scaler_options)
    step = go.jit(lambda gs: scaler.step(opt, gs))
    return params, opt, scaler, step, grads


def snapshot(*objects):
    return [p.numpy() for obj in objects for p in obj.parameters()]


def test_an_injected_inf_skips_the_step_exactly_and_halves_the_scale():
    params, opt, scaler, step, grads = setup(init_scale=1024.0)
    scaled = [[g * 1024 for g in gs] for gs in grads]
    assert bool(step(scaled[0])) is True
    before = snapshot(opt)
    bad = [g.copy() for g in scaled[1]]
    bad[1][2] = np.inf
    assert bool(step(bad)) is False
    for now, then in zip(snapshot(opt), before):
        np.testing.assert_array_equal(now, then)  # parameters, moments, step count
    assert scaler.scale_value == 512.0 and int(scaler.growth_tracker.numpy()) == 0
    bad[1][2] = np.nan
    assert bool(step(bad)) is False and scaler.scale_value == 256.0
    assert bool(step([g / 4 for g in scaled[1]])) is True
    assert int(opt.step_count.numpy()) == 2
    assert step.cache_info().traces == 1


def test_the_applied_steps_equal_plain_steps_on_unscaled_gradients():
    params, opt, scaler, step, grads = setup(init_scale=2.0 ** 10)
    ref_params = [go.Parameter(p.numpy(), name=p.name) for p in params]
    ref = optim.Adam(ref_params, lr=1e-2, name="ref")
    for k, gs in enumerate(grads[:10]):
        scaled = [g * np.float32(scaler.scale_value) for g in gs]
        if k == 4:
            scaled[0][0, 0] = np.inf
        else:
            ref.step(gs)  # scaling by a power of two and back is exact
        step(scaled)
    for p, r in zip(params, ref_params):
        np.testing.assert_array_equal(p.numpy(), r.numpy())


def test_growth_after_growth_interval_clean_steps():
    params, opt, scaler, step, grads = setup(init_scale=4.0, growth_interval=3)
    scales = []
    for gs in grads[:7]:
        step([g * np.float32(scaler.scale_value) for g in gs])
        scales.append(scaler.scale_value)
    assert scales == [4.0, 4.0, 8.0, 8.0, 8.0, 16.0, 16.0]


def test_scale_sequence_matches_torch_update_scale():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    overflow = rng.random(60) < 0.2
    options = dict(init_scale=2.0 ** 15, growth_factor=3.0, backoff_factor=0.25,
                   growth_interval=4)
    scaler = amp.DynamicLossScaler(**options)
    update = go.jit(lambda finite: scaler.update(finite))
    t_scale = torch.full((), options["init_scale"], dtype=torch.float32)
    t_tracker = torch.zeros((), dtype=torch.int32)
    for bad in overflow:
        update(np.bool_(not bad))
        torch._amp_update_scale_(t_scale, t_tracker, torch.full((), float(bad)),
                                 options["growth_factor"], options["backoff_factor"],
                                 options["growth_interval"])
        assert scaler.scale_value == float(t_scale)
        assert int(scaler.growth_tracker.numpy()) == int(t_tracker)


def test_unscale_is_grad_times_f32_inverse_and_f16_unscales_into_f32():
    scaler = amp.DynamicLossScaler(init_scale=3.0)
    g32 = np.linspace(-1, 1, 5).astype(np.float32)
    g16 = (np.linspace(-1, 1, 5) * 3e-5).astype(np.float16)
    (u32, u16), finite = go.jit(scaler.unscale)([g32, g16])
    inv = np.float32(1 / np.float64(3.0))  # GradScaler: scale.double().reciprocal().float()
    np.testing.assert_array_equal(u32, g32 * inv)
    assert u16.dtype == np.float32 and bool(finite)
    np.testing.assert_array_equal(u16, g16.astype(np.float32) * inv)


def test_f16_parameters_with_loss_scaling():
    w = go.Parameter(np.full(4, 0.5, np.float16), name="w")
    opt = optim.SGD([w], lr=0.5)
    scaler = amp.DynamicLossScaler(init_scale=2.0 ** 20)

    @go.jit
    def step(g):
        return scaler.step(opt, [scaler.scale(g)])

    g = np.full(4, 1e-3, np.float16)
    assert bool(step(g)) is False  # 1e-3 * 2**20 overflows f16: skipped, scale halved
    assert scaler.scale_value == 2.0 ** 19
    for _ in range(5):
        step(g)
    assert scaler.scale_value == 2.0 ** 15  # 1e-3 * 2**15 = 32.8 fits
    np.testing.assert_allclose(opt.state["w"]["master"].numpy(), 0.5 - 0.5 * 1e-3, rtol=1e-3)


def test_static_scaler():
    params, _, grads = problem(5, np.float32)[0], None, problem(5, np.float32)[1]
    ps = [go.Parameter(p, name=f"s{i}") for i, p in enumerate(params)]
    opt = optim.SGD(ps, lr=0.1)
    scaler = amp.StaticLossScaler(128.0)
    step = go.jit(lambda gs: scaler.step(opt, gs))
    bad = [g * 128 for g in grads[0]]
    bad[0][0, 0] = np.inf
    before = [p.numpy() for p in ps]
    assert bool(step(bad)) is False
    for p, v in zip(ps, before):
        np.testing.assert_array_equal(p.numpy(), v)
    scaler.set_scale(64.0)
    step([g * 64 for g in grads[1]])
    np.testing.assert_allclose(ps[1].numpy(), params[1] - np.float32(0.1) * grads[1][1],
                               rtol=1e-6)
    assert scaler.scale_value == 64.0 and step.cache_info().traces == 1


@pytest.mark.parametrize("options, message", [
    (dict(init_scale=0.0), "scale must be a finite number > 0"),
    (dict(growth_factor=1.0), "growth_factor"),
    (dict(backoff_factor=1.0), "backoff_factor"),
    (dict(growth_interval=0), "growth_interval"),
])
def test_bad_scaler_options(options, message):
    with pytest.raises(OptimizerError, match=message):
        amp.DynamicLossScaler(**options)


def test_scaled_loss_through_autodiff_in_one_jitted_step():
    w = go.Parameter(np.array([1.0, -2.0], np.float32), name="w")
    opt = optim.SGD([w], lr=0.1)
    scaler = amp.DynamicLossScaler(init_scale=1024.0, growth_interval=2)

    @go.jit
    def step(x):
        loss, (g,) = go.value_and_grad(lambda x: scaler.scale(go.ops.sum(w * x)), wrt=[w])(x)
        scaler.step(opt, [g])
        return loss

    x = np.array([0.5, 0.5], np.float32)
    assert float(step(x)) == 1024.0 * -0.5
    np.testing.assert_array_equal(w.numpy(), np.array([1.0, -2.0], np.float32) - 0.1 * x)
    step(x)
    assert scaler.scale_value == 2048.0 and step.cache_info().traces == 1


def test_eager_mode_gives_the_jitted_results():
    runs = []
    for mode in ("jit", "eager"):
        params, opt, scaler, step, grads = setup(init_scale=512.0, growth_interval=2)
        step = step if mode == "jit" else (lambda gs: scaler.step(opt, gs))
        for k, gs in enumerate(grads[:8]):
            scaled = [g * np.float32(scaler.scale_value) for g in gs]
            if k == 2:
                scaled[1][0] = np.nan
            step(scaled)
        runs.append(snapshot(opt, scaler))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
