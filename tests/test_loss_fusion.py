"""The losses decomposed into kernels (passes/decompose.py, their registry declarations):
softmax_cross_entropy and mse_loss leave no nn node in a compiled step, the LLVM backend
gives what the interpreter gives (values and gradients, shapes [B, C] and [B, T, C], f32 and
f64), the loss agrees with torch, the forward's log_softmax is the backward's (one kernel of
two row passes, writing neither the softmax nor the logits), and a label outside the classes
still fails the step before any parameter changes."""
import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphopt as go
from graphopt import ops
from graphopt.errors import ExecutionError

TOL = {np.float32: 2e-6, np.float64: 1e-13}
LOSSES = {
    "softmax_cross_entropy": lambda z, y, t: ops.softmax_cross_entropy(z, y),
    "mse_loss": lambda z, y, t: ops.mse_loss(z, t),
}


def loss_step(name, shape, dtype, backend):
    """A step: the loss of (x + @b) and its gradient with respect to @b (a "sum@k" of the
    logits' cotangent), as jit compiles it on `backend`."""
    b = go.Parameter(np.linspace(-1, 1, shape[-1]).astype(dtype), name="b")
    grad = go.value_and_grad(lambda x, y, t: LOSSES[name](x + b, y, t), wrt=[b])
    return go.jit(grad, backend=backend, cache=False)


def inputs(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    y = rng.integers(0, shape[-1], shape[:-1]).astype(np.int32)
    t = rng.standard_normal(shape[-1:]).astype(dtype)  # broadcast over the batch
    return x, y, t


@pytest.mark.usefixtures("cpu_level")
@given(name=st.sampled_from(sorted(LOSSES)),
       shape=st.sampled_from([(7, 33), (1, 9), (64, 5), (3, 1), (2, 3, 17), (300, 10)]),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_decomposed_losses_match_the_interpreter(name, shape, dtype, seed):
    args = inputs(shape, dtype, seed)
    fn = loss_step(name, shape, dtype, "llvm")
    graph = fn.lower(*args).graph
    assert not any(n.op in LOSSES or n.op == "log_softmax" for n in graph.nodes)
    (loss, (g,)) = fn(*args)
    (ref_loss, (ref_g,)) = loss_step(name, shape, dtype, "interpreter")(*args)
    assert np.asarray(loss).dtype == dtype and np.asarray(g).dtype == dtype
    np.testing.assert_allclose(loss, ref_loss, rtol=TOL[dtype], atol=TOL[dtype])
    np.testing.assert_allclose(g, ref_g, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_the_interpreter_gives_the_eager_bits(name):
    """The op's numpy implementation is its decomposition op by op: eager (the op whole) and
    the interpreter after the passes (its parts) agree bit for bit."""
    shape = (16, 11)
    args = inputs(shape, np.float32, 4)
    eager = go.value_and_grad(lambda x, y, t: LOSSES[name](x, y, t), argnums=0)
    jitted = go.jit(eager, backend="interpreter", cache=False)
    assert not any(n.op in LOSSES for n in jitted.lower(*args).graph.nodes)
    (a, ga), (b, gb) = eager(*args), jitted(*args)
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert np.asarray(ga).tobytes() == np.asarray(gb).tobytes()


def test_the_losses_agree_with_torch():
    torch = pytest.importorskip("torch")
    x, y, t = inputs((128, 40), np.float32, 9)
    ce = go.jit(lambda x, y: ops.softmax_cross_entropy(x, y), cache=False)(x, y)
    mse = go.jit(lambda x, t: ops.mse_loss(x, t), cache=False)(x, t)
    F = torch.nn.functional
    want_ce = F.cross_entropy(torch.tensor(x), torch.tensor(y).long()).item()
    want_mse = F.mse_loss(torch.tensor(x), torch.tensor(t).expand(128, 40)).item()
    assert float(ce) == pytest.approx(want_ce, rel=1e-6)
    assert float(mse) == pytest.approx(want_mse, rel=1e-6)


def test_a_cross_entropy_and_its_gradient_are_one_kernel_that_writes_no_logits():
    """The backward's log_softmax (autodiff's rule) is the forward's: merged after the
    decomposition, the forward and backward are one kernel of two row passes, whose outputs
    are the loss's sum and the bias gradient: neither the logits nor the softmax is stored."""
    x, y, t = inputs((32, 50), np.float32, 1)
    fn = loss_step("softmax_cross_entropy", x.shape, np.float32, "llvm")
    graph = fn.lower(x, y, t).graph
    rows = [n for n in graph.nodes if n.op == "kernel" and
            any(m.op == "max" for m in n.body.nodes)]
    assert len(rows) == 1
    (k,) = rows
    assert k.attrs["outputs"] == ["sum", "sum@1"]
    assert [m.op for m in k.body.nodes].count("log") == 1
    out = io.StringIO()
    go.explain(fn, x, y, t, out=out)
    # the loss and the gradient's log_softmax; the loss's mean waits for the full sum
    assert "decomposed=2" in out.getvalue() and "stays outside" not in out.getvalue()


@pytest.mark.parametrize("bad", [50, -1])
def test_a_label_outside_the_classes_fails_the_step_and_changes_nothing(bad):
    x, y, _ = inputs((8, 50), np.float32, 2)
    b = go.Parameter(np.zeros(50, np.float32), name="b")
    grad = go.value_and_grad(lambda x, y: ops.softmax_cross_entropy(x + b, y), wrt=[b])

    def step(x, y):
        loss, (g,) = grad(x, y)
        go.assign(b, b - 0.1 * g)
        return loss

    fn = go.jit(step, backend="llvm", cache=False)
    fn(x, y)
    before = b.numpy().copy()
    y[3] = bad
    with pytest.raises(ExecutionError, match=r"check_bounds failed.*a label is outside \[0, 50\)"):
        fn(x, y)
    np.testing.assert_array_equal(b.numpy(), before)
