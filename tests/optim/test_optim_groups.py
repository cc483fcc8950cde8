"""Parameter groups, hyper-parameters as data (no retrace), and bad input."""
import numpy as np
import pytest

import graphopt as go
from graphopt import optim
from graphopt.errors import CheckpointError, GraphoptError, OptimizerError
from optim_reference import Reference, problem


def make(dtype=np.float64, names=("fc.w", "fc.b")):
    params0, grads = problem(0, dtype)
    return [go.Parameter(p, name=n) for p, n in zip(params0, names)], params0, grads


def test_changing_lr_between_jitted_steps_does_not_retrace_and_takes_effect():
    params, params0, grads = make()
    opt = optim.Adam(params, lr=1e-2)
    step = go.jit(opt.step)
    ref = Reference("Adam", [p.copy() for p in params0], lr=1e-2)
    for k, gs in enumerate(grads[:20]):
        if k == 10:
            opt.param_groups[0]["lr"] = 1e-4
            opt.param_groups[0]["betas"] = (0.8, 0.9)
            ref.o.update(lr=1e-4, betas=(0.8, 0.9))
        step(gs)
        ref.step(gs)
    assert step.cache_info().traces == 1 and step.cache_info().compiles == 1
    assert opt.param_groups[0]["lr"] == 1e-4 and opt.param_groups[0]["betas"] == (0.8, 0.9)
    for p, w in zip(params, ref.params):
        np.testing.assert_allclose(p.numpy(), w, rtol=1e-12, atol=1e-14)


def test_hyper_parameters_are_f64_parameters_the_graph_reads():
    params, _, grads = make(np.float32)
    opt = optim.SGD(params, lr=0.1, momentum=0.9, name="sgd")
    text = str(go.trace(opt.step, grads[0]))
    assert "param @sgd.group0.lr: f64[]" in text and "param @sgd.group0.momentum: f64[]" in text
    # Rounded where it meets f32: inside the update mapped over both parameters (hypermap),
    # which reads @sgd.group0.lr as an operand every parameter shares.
    kernel = next(n for n in go.trace(opt.step, grads[0]).nodes if n.op == "kernel")
    lr = kernel.inputs.index(next(v for v in kernel.inputs if v.name == "sgd.group0.lr"))
    x = kernel.body.inputs[kernel.attrs["shared"][lr - len(kernel.inputs) +
                                                 len(kernel.attrs["shared"])]]
    assert any(n.op == "cast" and n.inputs == [x] and n.attrs["dtype"] == go.f32
               for n in kernel.body.nodes)


def test_groups_have_their_own_hyper_parameters_and_state_names():
    params, params0, grads = make()
    opt = optim.SGD([{"params": [params[0]], "lr": 0.1, "momentum": 0.9},
                     {"params": [params[1]]}], lr=0.01)
    assert opt.params == params
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.01]
    assert set(opt.state["fc.w"]) == {"momentum_buffer"} and opt.state["fc.b"] == {}
    assert opt.state["fc.w"]["momentum_buffer"].name == "fc.w.momentum_buffer"
    step = go.jit(opt.step)
    ref_w = Reference("SGD", [params0[0].copy()], lr=0.1, momentum=0.9)
    ref_b = Reference("SGD", [params0[1].copy()], lr=0.01)
    for gs in grads[:10]:
        step({"fc.b": gs[1], "fc.w": gs[0]})  # a dict by name, in any order
        ref_w.step(gs[:1])
        ref_b.step(gs[1:])
    np.testing.assert_allclose(params[0].numpy(), ref_w.params[0], rtol=1e-12)
    np.testing.assert_allclose(params[1].numpy(), ref_b.params[0], rtol=1e-12)


def test_decay_groups_by_ndim_and_name():
    w = go.Parameter(np.ones((3, 2)), name="fc.w")
    b = go.Parameter(np.ones(2), name="fc.b")
    ln = go.Parameter(np.ones((2, 2)), name="layernorm.scale")
    decay, no_decay = optim.decay_groups([w, b, ln], 0.1)
    assert decay == {"params": [w], "weight_decay": 0.1}
    assert no_decay == {"params": [b, ln], "weight_decay": 0.0}
    opt = optim.AdamW(optim.decay_groups({"fc.w": w, "fc.b": b}, 0.05), lr=1e-3)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]
    custom = optim.decay_groups([w, b, ln], 0.1, no_decay=lambda p: p.name.startswith("fc"))
    assert custom[0]["params"] == [ln]


def test_a_schedule_as_lr():
    params, params0, grads = make()
    sched = optim.schedules.WarmupCosine(1e-2, warmup_steps=5, total_steps=30, min_lr=1e-4)
    opt = optim.Adam(params, lr=sched)
    step = go.jit(opt.step)
    ref = Reference("Adam", [p.copy() for p in params0])
    for k, gs in enumerate(grads[:40]):
        step(gs)
        ref.step(gs, lr=sched.value(k))
    assert step.cache_info().traces == 1
    for p, w in zip(params, ref.params):
        np.testing.assert_allclose(p.numpy(), w, rtol=1e-12, atol=1e-14)
    with pytest.raises(OptimizerError, match="schedule"):
        opt.param_groups[0]["lr"] = 1e-3


def test_structural_options_cannot_change():
    params, _, _ = make()
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    opt.param_groups[0]["momentum"] = 0.5  # data: fine
    for key, value in [("nesterov", True), ("momentum", 0.0)]:
        with pytest.raises(OptimizerError, match=key):
            opt.param_groups[0][key] = value
    assert opt.param_groups[0]["momentum"] == 0.5
    with pytest.raises(OptimizerError, match="amsgrad"):
        optim.Adam(params).param_groups[0]["amsgrad"] = True


BAD_OPTIONS = [
    (optim.SGD, dict(lr=-1.0), "lr must be >= 0"),
    (optim.SGD, dict(lr=float("nan")), "lr must be >= 0"),
    (optim.SGD, dict(momentum=-0.1), "momentum"),
    (optim.SGD, dict(nesterov=True), "Nesterov"),
    (optim.SGD, dict(lr="fast"), "lr must be a number"),
    (optim.Adam, dict(betas=(0.9, 1.0)), r"betas\[1\] must be in \[0, 1\)"),
    (optim.Adam, dict(betas=(-0.1, 0.9)), r"betas\[0\]"),
    (optim.Adam, dict(betas=0.9), "betas must be a pair"),
    (optim.Adam, dict(eps=-1e-8), "eps"),
    (optim.AdamW, dict(weight_decay=-1.0), "weight_decay"),
    (optim.Adam, dict(amsgrad=1), "amsgrad must be True or False"),
    (optim.Adagrad, dict(initial_accumulator_value=-1.0), "initial_accumulator_value"),
    (optim.RMSprop, dict(alpha=-0.5), "alpha"),
    (optim.Adam, dict(state_dtype="i32"), "state_dtype"),
]


@pytest.mark.parametrize("cls, options, message", BAD_OPTIONS,
                         ids=[f"{c.__name__}-{m[:12]}" for c, _, m in BAD_OPTIONS])
def test_bad_hyper_parameters_are_named(cls, options, message):
    params, _, _ = make()
    with pytest.raises(OptimizerError, match=message):
        cls(params, **options)


def test_bad_values_set_later_change_nothing():
    params, _, _ = make()
    opt = optim.Adam(params, lr=1e-3)
    g = opt.param_groups[0]
    for key, value, message in [("lr", -1.0, "lr must be >= 0"),
                                ("betas", (0.9, 1.5), r"betas\[1\]"),
                                ("momentum", 0.9, "unknown hyper-parameter 'momentum'"),
                                ("params", [], "fixed")]:
        with pytest.raises(OptimizerError, match=message):
            g[key] = value
    assert g["lr"] == 1e-3 and g["betas"] == (0.9, 0.999)
    with pytest.raises(OptimizerError, match="unknown hyper-parameter 'momentum'"):
        optim.Adam([{"params": params, "momentum": 0.9}])


def test_setting_a_hyper_parameter_inside_a_trace_is_an_error():
    params, _, grads = make()
    opt = optim.SGD(params, lr=0.1)

    def step(gs):
        opt.param_groups[0]["lr"] = 0.2
        opt.step(gs)

    with pytest.raises(OptimizerError, match="between steps"):
        go.jit(step)(grads[0])


def test_parameters_in_two_groups_or_twice_are_named():
    params, _, _ = make()
    with pytest.raises(OptimizerError, match="'fc.w' is in groups 0 and 1"):
        optim.SGD([{"params": params}, {"params": [params[0]]}])
    with pytest.raises(OptimizerError, match="'fc.b' is twice"):
        optim.SGD([params[1], params[1]])
    with pytest.raises(OptimizerError, match="i64"):
        optim.SGD([go.Parameter(np.zeros(3, np.int64), name="count")])
    with pytest.raises(OptimizerError, match="single Parameter"):
        optim.SGD(params[0])


@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_bad_gradients_are_named_and_change_nothing(mode):
    params, params0, grads = make(np.float32)
    opt = optim.Adam(params)
    step = go.jit(opt.step) if mode == "jit" else opt.step
    before = [p.numpy() for p in opt.parameters()]
    w, b = grads[0]
    cases = [
        ([w.T.copy(), b], r"'fc.w' is f32\[3,4\], expected f32\[4,3\]"),
        ([w.astype(np.float64), b], r"'fc.w' is f64\[4,3\]"),
        ([w], "1 gradients for 2 parameters .*missing for 'fc.b'"),
        ([w, b, b], "1 too many"),
        ({"fc.w": w}, "missing for 'fc.b'"),
        ({"fc.w": w, "fc.b": b, "fc.c": b}, "unknown 'fc.c'"),
        ([w, None], "'fc.b' is None"),
        (w, "grads must be a sequence"),
    ]
    for bad, message in cases:
        with pytest.raises(GraphoptError, match=message):
            step(bad)
    for p, v in zip(opt.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), v)


def test_step_where_false_changes_nothing_bit_for_bit():
    params, _, grads = make(np.float32)
    opt = optim.NAdam(params, weight_decay=0.01)

    @go.jit
    def step(gs, ok):
        opt.step(gs, where=ok)

    step(grads[0], np.bool_(True))
    before = [p.numpy() for p in opt.parameters()]
    step(grads[1], np.bool_(False))
    for p, v in zip(opt.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), v)
    step(grads[1], np.bool_(True))
    assert int(opt.step_count.numpy()) == 2 and step.cache_info().traces == 1
    with pytest.raises(OptimizerError, match="where= must be a bool scalar"):
        opt.step(grads[0], where=np.ones(2, bool))


def test_state_dict_round_trip_and_checks():
    params, _, grads = make()
    opt = optim.Adam(params, amsgrad=True)
    for gs in grads[:3]:
        opt.step(gs)
    sd = opt.state_dict()
    assert sd["state"]["opt.step"] == 3 and "fc.w.max_exp_avg_sq" in sd["state"]
    other = optim.Adam([go.Parameter(p.numpy(), name=p.name) for p in params], amsgrad=True)
    other.load_state_dict(sd)
    assert other.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    for a, b in zip(opt.parameters(), other.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    plain = optim.Adam(params)
    with pytest.raises(CheckpointError, match="amsgrad"):
        plain.load_state_dict(sd)
    broken = {**sd, "state": {k: v for k, v in sd["state"].items() if k != "fc.b.exp_avg"}}
    with pytest.raises(CheckpointError, match="missing.*fc.b.exp_avg"):
        other.load_state_dict(broken)


def test_an_optimizer_shows_its_groups():
    params, _, _ = make()
    text = repr(optim.SGD(params, lr=0.5))
    assert "lr=0.5" in text and "fc.w" in text
