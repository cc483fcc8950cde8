"""value_and_grad / grad: what they differentiate, the shape of their results, stop_gradient,
the backward in the step's own graph, errors on bad requests, eager and jit agreeing."""
from __future__ import annotations

import numpy as np
import pytest

import graphopt as go
from graphopt import ops
from graphopt.errors import GradientError, NotDifferentiableError
from graphopt.autodiff import GradLocation
from graphopt.ir.analysis import live_nodes
from graphopt.ir.registry import ELEMENTWISE, REGISTRY, OpDef


@pytest.fixture
def wb(rng):
    w = go.Parameter(rng.standard_normal((3, 2)), name="w")
    b = go.Parameter(rng.standard_normal(2), name="b")
    return w, b


def linear_loss(w, b, x):
    return ops.sum(ops.tanh(x @ w + b))


def expected_grads(w, b, x):
    """d sum(tanh(x @ w + b)) by hand, in numpy."""
    d = 1 - np.tanh(x @ w + b) ** 2
    return x.T @ d, d.sum(0)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_wrt_structures_are_mirrored(wb, rng, mode):
    w, b = wb
    x = rng.standard_normal((4, 3))
    dw, db = expected_grads(w.numpy(), b.numpy(), x)
    loss = lambda x: linear_loss(w, b, x)  # noqa: E731
    wrap = go.jit if mode == "jit" else (lambda f: f)
    for wrt, pick in [({"w": w, "b": b}, lambda g: (g["w"], g["b"])),
                      ([w, b], lambda g: tuple(g)), ((w, b), lambda g: g),
                      (w, lambda g: (g, db))]:
        value, grads = wrap(go.value_and_grad(loss, wrt=wrt))(x)
        assert type(grads) is type(wrt) or isinstance(wrt, go.Parameter)
        np.testing.assert_allclose(value, np.tanh(x @ w.numpy() + b.numpy()).sum(), rtol=1e-12)
        got_w, got_b = pick(grads)
        np.testing.assert_allclose(got_w, dw, rtol=1e-12)
        np.testing.assert_allclose(got_b, db, rtol=1e-12)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_argnums_and_wrt_together(wb, rng, mode):
    w, b = wb
    x = rng.standard_normal((4, 3))
    dw, db = expected_grads(w.numpy(), b.numpy(), x)
    wrap = go.jit if mode == "jit" else (lambda f: f)

    def loss(params, x):  # functional parameters (a dict argument), JAX style
        return linear_loss(params["w"], b, x)

    g = wrap(go.grad(loss))({"w": w.numpy()}, x)  # argnums=0 by default
    np.testing.assert_allclose(g["w"], dw, rtol=1e-12)
    g = wrap(go.grad(loss, argnums=None))({"w": w.numpy()}, x)  # None: the default
    np.testing.assert_allclose(g["w"], dw, rtol=1e-12)
    (g_args, g_params) = wrap(go.grad(loss, wrt=[b], argnums=(0, 1)))({"w": w.numpy()}, x)
    np.testing.assert_allclose(g_args[0]["w"], dw, rtol=1e-12)
    np.testing.assert_allclose(g_args[1], (1 - np.tanh(x @ w.numpy() + b.numpy()) ** 2)
                               @ w.numpy().T, rtol=1e-12)
    np.testing.assert_allclose(g_params[0], db, rtol=1e-12)


def test_argnums_count_positions_when_jit_passes_names(rng):
    x, y = rng.standard_normal(3), rng.standard_normal(3)
    step = go.jit(go.grad(lambda a, b: ops.sum(a * b * b), argnums=1))  # jit binds by name
    np.testing.assert_allclose(step(x, y), 2 * x * y, rtol=1e-12)
    np.testing.assert_allclose(step(a=x, b=y), 2 * x * y, rtol=1e-12)


def test_an_argument_passed_twice_gets_one_gradient_per_position(rng):
    x = rng.standard_normal(3)
    ga, gb = go.grad(lambda a, b: ops.sum(a * b * b), argnums=(0, 1))(x, x)
    np.testing.assert_allclose(ga, x * x, rtol=1e-12)
    np.testing.assert_allclose(gb, 2 * x * x, rtol=1e-12)


def test_has_aux(wb, rng):
    w, b = wb
    x = rng.standard_normal((4, 3))

    def loss(x):
        h = x @ w + b
        return ops.sum(ops.tanh(h)), {"h": h}

    (value, aux), grads = go.value_and_grad(loss, wrt=[w], has_aux=True)(x)
    np.testing.assert_allclose(aux["h"], x @ w.numpy() + b.numpy(), rtol=1e-12)
    grads2, aux2 = go.grad(loss, wrt=[w], has_aux=True)(x)
    np.testing.assert_allclose(grads2[0], grads[0], rtol=1e-12)
    with pytest.raises(GradientError, match=r"must return \(output, aux\)"):
        go.grad(lambda x: ops.sum(x), has_aux=True)(x)


def test_unreached_and_integer_variables_get_zeros(wb, rng):
    w, b = wb
    steps = go.Parameter(np.int64(3), name="steps")
    x = rng.standard_normal((4, 3))
    labels = np.array([0, 1, 1, 0])

    def loss(x, labels):
        logits = x @ w
        return ops.softmax_cross_entropy(logits, labels)  # b and steps are not used

    g_args, (gw, gb, gs) = go.grad(loss, wrt=[w, b, steps], argnums=(0, 1))(x, labels)
    gw, gb, gs, gx, glabels = map(np.asarray, (gw, gb, gs, *g_args))
    assert np.all(gb == 0) and gb.dtype == np.float64 and gb.shape == (2,)
    assert gs.dtype == np.int64 and gs == 0
    assert glabels.dtype == labels.dtype and np.all(glabels == 0)
    assert np.any(gw != 0) and np.any(gx != 0)


def test_comparisons_and_integer_casts_carry_no_gradient(rng):
    x = rng.standard_normal(5)
    g = go.grad(lambda x: ops.sum(ops.where(x > 0, x, 0.0) + ops.cast(ops.cast(x, go.i64), go.f64)
                                  * x))(x)
    # where passes the gradient to the chosen branch; the cast through i64 is a constant.
    np.testing.assert_allclose(g, (x > 0) + np.trunc(x), rtol=1e-12)


def test_stop_gradient_is_identity_with_zero_gradient(rng):
    x = rng.standard_normal(4)
    value, g = go.value_and_grad(lambda x: ops.sum(ops.stop_gradient(x * x) * x))(x)
    np.testing.assert_allclose(value, np.sum(x ** 3), rtol=1e-12)
    np.testing.assert_allclose(g, x * x, rtol=1e-12)  # not 3 x^2: x*x is a constant
    g = go.grad(lambda x: ops.sum(ops.stop_gradient(x)))(x)
    assert np.all(np.asarray(g) == 0)


def _stop_gradient_step(stop: bool):
    rng = np.random.default_rng(1)
    w1 = go.Parameter(rng.standard_normal((3, 4)), name="w1")
    w2 = go.Parameter(rng.standard_normal((4, 2)), name="w2")

    def loss(x):
        fit = ops.sum(ops.tanh(x @ w1) @ w2)
        penalty = ops.sum(w1 * w1)  # logged with the loss, not trained on when stopped
        return fit + (ops.stop_gradient(penalty) if stop else penalty)

    def step(x):
        return go.grad(loss, wrt=[w1, w2])(x)  # the step returns only the gradients

    return go.trace(step, np.ones((5, 3)))


def test_stop_gradient_cuts_the_backward_and_dce_removes_what_only_served_the_value():
    with_stop, without = _stop_gradient_step(True), _stop_gradient_step(False)

    def backward(g):
        return [n.op for n in g.nodes if isinstance(n.loc, GradLocation)]

    # Without the stop, the penalty's backward is there: sum's (reshape, broadcast_to),
    # multiply's two products (w1 * w1 reads w1 twice) and their sum, and the add into w1's
    # cotangent. With it, none of them is even emitted.
    extra = sorted(backward(without))
    for op in backward(with_stop):
        extra.remove(op)
    assert sorted(extra) == ["add", "add", "broadcast_to", "multiply", "multiply", "reshape"]
    # What DCE removes: forward nodes that only made the loss's value, which the step does
    # not return: the fit's last matmul and sum (their VJPs do not read their outputs), the
    # penalty (multiply, sum, stop_gradient) and the final add.
    dead = sorted(n.op for n in with_stop.nodes if id(n) not in live_nodes(with_stop))
    assert dead == ["add", "matmul", "multiply", "stop_gradient", "sum", "sum"]
    dead = sorted(n.op for n in without.nodes if id(n) not in live_nodes(without))
    assert dead == ["add", "matmul", "multiply", "sum", "sum"]  # the penalty's VJP reads w1
    try:
        from graphopt.passes import run
    except ImportError:
        return
    assert len(with_stop.nodes) - len(run(with_stop, "dce").graph.nodes) == 6


def test_backward_lands_in_the_step_graph(wb, rng):
    w, b = wb

    def step(x, lr):
        loss, (gw, gb) = go.value_and_grad(lambda x: linear_loss(w, b, x), wrt=(w, b))(x)
        go.assign(w, w - lr * gw)
        go.assign(b, b - lr * gb)
        return loss

    g = go.trace(step, np.ones((4, 3)), 0.1)
    ops_seen = [n.op for n in g.nodes]
    assert ops_seen.count("tanh") == 1  # the forward runs once; the backward reuses it
    assert ops_seen.count("matmul") == 2  # forward x @ w, backward x.T @ ct
    assert [n.op for n in g.nodes if isinstance(n.loc, GradLocation)]
    assert all(n.loc.file == __file__ for n in g.nodes if n.loc)
    text = g.format(locs=True)
    assert "assign @w" in text and "transpose %x" in text


def test_gradient_at_a_value_assigned_earlier_in_the_step(rng):
    w = go.Parameter(rng.standard_normal(3), name="w")
    x = rng.standard_normal(3)

    @go.jit
    def step(x):
        go.assign(w, 2 * w)
        return go.grad(lambda: ops.sum(w * w * x), wrt=w)()

    w0 = w.numpy()
    np.testing.assert_allclose(step(x), 2 * (2 * w0) * x, rtol=1e-12)
    np.testing.assert_allclose(w.numpy(), 2 * w0)


def test_eager_value_and_grad_commits_assigns(rng):
    counter = go.Parameter(np.float64(0), name="counter")
    x = rng.standard_normal(3)

    def loss(x):
        go.assign(counter, counter + 1)
        return ops.sum(x * x)

    value, g = go.value_and_grad(loss)(x)
    assert isinstance(g, go.EagerTensor) and float(counter.numpy()) == 1
    np.testing.assert_allclose(g, 2 * x, rtol=1e-12)


# -- bad requests ---------------------------------------------------------------------------------
def test_errors(wb, rng):
    w, b = wb
    x = rng.standard_normal((4, 3))
    with pytest.raises(GradientError, match=r"wrt\[1\] is a ndarray: wrt takes Parameters"):
        go.value_and_grad(linear_loss, wrt=[w, x])
    with pytest.raises(GradientError, match="argnums must be"):
        go.grad(linear_loss, argnums=-1)
    for bad in (1.5, "01", {0: 1}):  # not an int or a tuple: a GradientError, not a TypeError
        with pytest.raises(GradientError, match="argnums must be"):
            go.grad(linear_loss, argnums=bad)
    with pytest.raises(GradientError, match="argument 3 of linear_loss"):
        go.grad(linear_loss, argnums=3)(w, b, x)
    with pytest.raises(GradientError, match=r"returned f64\[4,2\]: value_and_grad "
                                            r"differentiates a float scalar"):
        go.grad(lambda x: ops.tanh(x @ w), wrt=w)(x)
    with pytest.raises(GradientError, match=r"returned i64\[\]"):
        go.grad(lambda x: ops.sum(ops.cast(x, go.i64)))(x)
    with pytest.raises(GradientError, match="got ndarray"):
        go.grad(lambda x: np.ones(()))(x)


def test_error_locations_point_at_the_user_line(wb, rng):
    w, _ = wb
    with pytest.raises(GradientError) as info:
        go.jit(go.grad(lambda x: x @ w, wrt=w))(rng.standard_normal((4, 3)))
    assert info.value.loc.file == __file__


def test_nested_value_and_grad_is_refused(rng):
    x = rng.standard_normal(3)
    inner = go.grad(lambda x: ops.sum(x * x))
    with pytest.raises(GradientError, match="higher-order gradients are not supported"):
        go.grad(lambda x: ops.sum(inner(x)))(x)
    with pytest.raises(GradientError, match="higher-order"):
        go.jit(go.grad(lambda x: ops.sum(inner(x))))(x)
    # One after the other in one step is fine.
    step = go.jit(lambda x: (inner(x), go.grad(lambda x: ops.sum(x * x * x))(x)))
    g1, g2 = step(x)
    np.testing.assert_allclose(g2, 3 * x * x, rtol=1e-12)


def test_assigning_a_differentiated_parameter_is_refused(wb, rng):
    w, b = wb

    def loss(x):
        go.assign(w, w * 2)
        return ops.sum(x @ w)

    with pytest.raises(GradientError, match="assigns Parameter 'w'"):
        go.grad(loss, wrt=[w])(rng.standard_normal((4, 3)))


def test_an_op_without_vjp_fails_only_when_a_gradient_must_cross_it(rng):
    name = "test_no_vjp"
    REGISTRY[name] = OpDef(name, ELEMENTWISE, REGISTRY["exp"].infer, np.exp)
    try:
        x = rng.standard_normal(3)
        with pytest.raises(NotDifferentiableError, match="op 'test_no_vjp' has no VJP rule") \
                as info:
            go.grad(lambda x: ops.sum(go.frontend.bind.bind(name, [x])))(x)
        assert info.value.loc.file == __file__
        g = go.grad(lambda x: ops.sum(x + go.frontend.bind.bind(name, [ops.stop_gradient(x)])))
        np.testing.assert_allclose(g(x), np.ones(3))
    finally:
        del REGISTRY[name]

