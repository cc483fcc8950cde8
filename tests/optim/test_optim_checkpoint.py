"""save/load: a run resumed from a checkpoint continues bit for bit."""
import ml_dtypes
import numpy as np
import pytest

import graphopt as go
from graphopt import amp, optim
from graphopt.errors import CheckpointError
from optim_reference import problem


def build():
    """A run with every kind of state: f16 and f32 weights, bf16 moments, f32 masters, a
    schedule, hyper-parameters, accumulation and a dynamic loss scale."""
    params0, _ = problem(11, np.float32)
    ps = [go.Parameter(params0[0].astype(np.float16), name="fc.w"),
          go.Parameter(params0[1], name="fc.b")]
    opt = optim.AdamW(ps, lr=optim.schedules.WarmupCosine(1e-2, 3, 30), state_dtype="bf16",
                      amsgrad=True)
    acc = optim.Accumulate(opt, steps=2)
    scaler = amp.DynamicLossScaler(init_scale=256.0, growth_interval=3)
    return ps, opt, acc, scaler


def run(ps, acc, scaler, grads, mode):
    step = (lambda gs: scaler.step(acc, gs)) if mode == "eager" else \
        go.jit(lambda gs: scaler.step(acc, gs))
    for gs in grads:
        step(gs)


def scaled_grads(n):
    _, grads = problem(12, np.float32, steps=n)
    grads = [[g[0].astype(np.float16) * np.float16(256), g[1] * 256] for g in grads]
    grads[7][0][0, 0] = np.inf  # one overflow in the run
    return grads


@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_resume_is_bit_for_bit(tmp_path, mode):
    grads = scaled_grads(24)
    ps, opt, acc, scaler = build()
    opt.param_groups[0]["weight_decay"] = 0.05  # a hyper-parameter changed mid-run
    run(ps, acc, scaler, grads, mode)
    whole = [p.numpy() for p in ps + acc.parameters() + scaler.parameters()]

    ps, opt, acc, scaler = build()
    opt.param_groups[0]["weight_decay"] = 0.05
    run(ps, acc, scaler, grads[:11], mode)  # stop mid-accumulation
    go.save(tmp_path / "run.npz", ps, acc, scaler)

    ps, opt, acc, scaler = build()  # a fresh start, as a new process would
    go.load(tmp_path / "run.npz", ps, acc, scaler)
    assert opt.param_groups[0]["weight_decay"] == 0.05
    run(ps, acc, scaler, grads[11:], mode)
    resumed = [p.numpy() for p in ps + acc.parameters() + scaler.parameters()]
    assert len(whole) == len(resumed) == 19
    for a, b in zip(whole, resumed):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_bf16_arrays_round_trip_exactly(tmp_path):
    values = np.array([1.0, -0.0078125, 3.3e38, np.inf], ml_dtypes.bfloat16)
    p = go.Parameter(values, name="x")
    go.save(tmp_path / "x.npz", [p])
    q = go.Parameter(np.zeros(4, ml_dtypes.bfloat16), name="x")
    go.load(tmp_path / "x.npz", {"x": q})
    assert q.numpy().dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(q.numpy().view(np.uint16), values.view(np.uint16))


def test_load_checks_everything_before_changing_anything(tmp_path):
    ps, opt, acc, scaler = build()
    go.save(tmp_path / "run.npz", ps, opt)
    ps2, opt2, _, _ = build()
    opt2.param_groups[0]["betas"] = (0.5, 0.5)
    before = [p.numpy() for p in ps2 + opt2.parameters()]
    wrong_shape = go.Parameter(np.zeros(5, np.float32), name="fc.b")
    cases = [
        (([ps2[0], wrong_shape], opt2), r"'fc.b' is f32\[3\], the parameter is f32\[5\]"),
        (([ps2[0]], opt2), r"unexpected \['fc.b'\]"),
        ((ps2, opt2, scaler), r"missing \['loss_scale'"),
    ]
    for args, message in cases:
        with pytest.raises(CheckpointError, match=message):
            go.load(tmp_path / "run.npz", *args)
    for p, v in zip(ps2 + opt2.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), v)
    np.savez(tmp_path / "plain.npz", x=np.zeros(2))
    with pytest.raises(CheckpointError, match="not a graphopt checkpoint"):
        go.load(tmp_path / "plain.npz", ps2)
