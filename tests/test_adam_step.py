"""An Adam step written with ops and assigns: eager, jit and plain numpy agree."""
import numpy as np
import pytest

import graphopt as go
from graphopt import ops

# Bit-for-bit comparisons with numpy: on the reference backend (see conftest.py).
pytestmark = pytest.mark.usefixtures("reference_backend")

SHAPES = [(4, 3), (5,), ()]


def make_state(rng, dtype=np.float64):
    ws = [go.Parameter(rng.standard_normal(s).astype(dtype), name=f"w{i}")
          for i, s in enumerate(SHAPES)]
    ms = [go.Parameter(np.zeros(s, dtype), name=f"w{i}.exp_avg") for i, s in enumerate(SHAPES)]
    vs = [go.Parameter(np.zeros(s, dtype), name=f"w{i}.exp_avg_sq") for i, s in enumerate(SHAPES)]
    t = go.Parameter(np.zeros((), dtype), name="step")
    return ws, ms, vs, t


def adam_step(ws, ms, vs, t, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    go.assign(t, t + 1)
    bc1 = 1 - b1 ** t  # reads the new step count
    bc2 = 1 - b2 ** t
    for w, m, v, g in zip(ws, ms, vs, grads):
        go.assign(m, b1 * m + (1 - b1) * g)
        go.assign(v, b2 * v + (1 - b2) * g * g)
        go.assign(w, w - lr * (m / bc1) / (ops.sqrt(v / bc2) + eps))


def numpy_adam(w, m, v, t, g, lr, b1=0.9, b2=0.999, eps=1e-8):
    t = t + 1
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    w = w - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return w, m, v, t


def run_mode(mode, rng_seed=0, steps=5, dtype=np.float64):
    rng = np.random.default_rng(rng_seed)
    ws, ms, vs, t = make_state(rng, dtype)
    grads = [[rng.standard_normal(s).astype(dtype) for s in SHAPES] for _ in range(steps)]

    def step(grads, lr):
        adam_step(ws, ms, vs, t, grads, lr)

    fn = go.jit(step) if mode == "jit" else step
    for k in range(steps):
        fn(grads[k], 1e-2 * (k + 1))
    return [w.numpy() for w in ws], fn, grads


def test_eager_jit_numpy_agree():
    ws_jit, jitted, grads = run_mode("jit")
    ws_eager, _, _ = run_mode("eager")
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(s) for s in SHAPES]
    state = [(w, np.zeros_like(w), np.zeros_like(w), 0.0) for w in ws]
    for k in range(5):
        state = [numpy_adam(w, m, v, t, g, 1e-2 * (k + 1))
                 for (w, m, v, t), g in zip(state, grads[k])]
    for a, b, (c, *_) in zip(ws_jit, ws_eager, state):
        np.testing.assert_allclose(a, c, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(b, c, rtol=1e-12, atol=1e-14)
    # A new learning rate each step is data, not a constant: one trace for five calls.
    info = jitted.cache_info()
    assert (info.traces, info.compiles, info.hits) == (1, 1, 4)


def test_adam_graph_orders_every_read_before_its_assign():
    rng = np.random.default_rng(1)
    ws, ms, vs, t = make_state(rng)
    grads = [np.ones(s) for s in SHAPES]
    g = go.trace(lambda grads, lr: adam_step(ws, ms, vs, t, grads, lr), grads, 0.1)
    assigns = g.assigns()
    assert len(assigns) == 1 + 3 * len(SHAPES)
    assert sorted(n.inputs[0].name for n in assigns) == sorted(p.name for p in g.params)
    assert len(g.effects) == len(assigns)
    # @step is read by `t + 1` only: later reads of t see the new value, not @step.
    step_readers = [n for n in g.nodes if g.param("step") in n.inputs and n.op != "assign"]
    assert len(step_readers) == 1
    text = str(g)
    assert text.count(" = assign ") == len(assigns)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_low_precision_jit_matches_eager(dtype):
    a, _, _ = run_mode("jit", dtype=dtype)
    b, _, _ = run_mode("eager", dtype=dtype)
    for x, y in zip(a, b):
        assert x.dtype == dtype
        np.testing.assert_array_equal(x, y)
