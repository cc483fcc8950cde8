"""Row reductions fused into kernels (fuse, ir/kernel.py, codegen's row passes): a LayerNorm and
a softmax written by hand become one kernel, the LLVM backend gives what the interpreter gives
(shapes [B, D] and [B, T, D], rows from axis 1 or 2, f32 and f64, stores in place, a bias
gradient in the same kernel, two threads), a LayerNorm training step trains alike on both,
and a kernel that breaks the rules says which rule."""
import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphopt as go
from graphopt import ops
from graphopt.errors import GraphoptError
from graphopt.ir.kernel import cost, row_passes
from graphopt.ir.verifier import verify

TOL = {np.float32: (1e-5, 1e-5), np.float64: (1e-12, 1e-12)}


def layernorm(x, g, b, axes):
    mu = x.mean(axis=axes, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(axis=axes, keepdims=True)
    rstd = ops.rsqrt(var + 1e-5)
    return xc * rstd * g + b, mu, rstd


def softmax(x, axes):
    e = ops.exp(x - x.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


def kernels(fn, *args):
    return [k.node for k in fn.lower(*args).kernels]


def assert_close(a, b, dtype):
    rtol, atol = TOL[dtype]
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def test_a_hand_written_layernorm_is_one_kernel_and_explain_says_so():
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    g, b = np.ones(16, np.float32), np.zeros(16, np.float32)
    fn = go.jit(lambda x, g, b: layernorm(x, g, b, (1,)), backend="llvm", cache=False)
    (k,) = kernels(fn, x, g, b)
    assert sorted(k.attrs["outputs"]) == ["map", "row@1", "row@1"]
    assert [n.op for n in k.body.nodes if n.op == "mean"] == ["mean", "mean"]
    out = io.StringIO()
    go.explain(fn, x, g, b, out=out)
    text = out.getvalue()
    assert "kernels=1" in text and "row_reductions=2" in text, text
    assert "stays outside kernels" not in text, text
    # Each row pass reads x again: three reads of 4 bytes per element (two passes, the last).
    assert cost(k).read_per_element == 3 * 4 + 2 * 0  # g and b: rows, counted once
    ref = go.jit(lambda x, g, b: layernorm(x, g, b, (1,)), backend="interpreter")(x, g, b)
    for r, o in zip(ref, fn(x, g, b)):
        assert_close(o, r, np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_layernorm_forward_and_backward_is_one_kernel(dtype):
    """The backward's row sums come as sum-then-reshape (a gradient's unbroadcast: simplify
    makes them keepdims sums) and broadcast_to (a mean's gradient: fuse reads what it
    broadcasts), so all of it joins the forward's kernel: three row passes (the mean; the
    variance and the backward's first row sum, which needs only the mean; the second), the
    parameters' gradients as "sum@1" outputs."""
    rng = np.random.default_rng(2)
    x, dy = (rng.standard_normal((33, 70)).astype(dtype) for _ in range(2))
    g0, b0 = (rng.standard_normal(70).astype(dtype) for _ in range(2))

    def run(backend):
        g, b = go.Parameter(g0, name="g"), go.Parameter(b0, name="b")
        grad = go.value_and_grad(lambda x, dy: (layernorm(x, g, b, (1,))[0] * dy).sum(),
                                 argnums=0, wrt=[g, b])
        fn = go.jit(grad, backend=backend, cache=False)
        if backend == "llvm":
            (k,) = kernels(fn, x, dy)
            assert [len(p) for p in row_passes(k.body)] == [1, 2, 1]
            assert sorted(k.attrs["outputs"]) == ["map", "sum", "sum@1", "sum@1"]
        return go.frontend.pytree.flatten(fn(x, dy))[0]

    for a, c in zip(run("interpreter"), run("llvm")):
        assert_close(c, a, dtype)


def test_the_interpreter_runs_a_row_kernel_as_the_unfused_nodes_bit_for_bit():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3, 7)).astype(np.float32)
    g, b = rng.standard_normal(7).astype(np.float32), rng.standard_normal(7).astype(np.float32)

    def step(x, g, b):
        return (*layernorm(x, g, b, (2,)), softmax(x, (1, 2)), ops.log_softmax(x * 2))

    fused = go.jit(step, backend="interpreter", cache=False)
    unfused = go.jit(step, backend="interpreter", cache=False, passes="")
    assert any("row@" in str(k.attrs["outputs"]) for k in fused.lower(x, g, b).graph.nodes
               if k.op == "kernel")
    for a, c in zip(fused(x, g, b), unfused(x, g, b)):
        assert np.asarray(a).tobytes() == np.asarray(c).tobytes()


@pytest.mark.usefixtures("cpu_level")
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from([(7, 33), (1, 9), (64, 5), (3, 1), (2, 3, 17), (4, 1, 6),
                              (1, 5, 3)]),
       rows_from_1=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2 ** 16))
def test_row_kernels_match_the_interpreter(shape, rows_from_1, dtype, seed):
    """A LayerNorm whose output updates a parameter in place and whose sum over the leading
    axes ("sum@k", a bias gradient) comes from the same kernel, then a softmax of it, in the
    same kernel too (four row passes: mean, variance, max, sum): rows from axis 1, or, in
    three dimensions, from axis 2."""
    r = 1 if rows_from_1 or len(shape) == 2 else 2
    axes = tuple(range(r, len(shape)))
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    g = rng.standard_normal(shape[r:]).astype(dtype)
    b = rng.standard_normal(shape[r:]).astype(dtype)

    def run(backend):
        w = go.Parameter(np.ones(shape, dtype), name="w")

        def step(x, g, b):
            y, mu, rstd = layernorm(x, g, b, axes)
            go.assign(w, w - 0.5 * y)
            return mu, rstd, y.sum(axis=tuple(range(r))), softmax(y, axes)

        fn = go.jit(step, backend=backend, cache=False)
        if backend == "llvm":
            (k,) = kernels(fn, x, g, b)
            rk = f"row@{r}" if np.prod(shape[r:]) > 1 else "map"  # (rows of one: the space)
            assert sorted(k.attrs["outputs"]) == sorted(["map", rk, rk, f"sum@{r}"])
            assert [len(p) for p in row_passes(k.body)] == [1, 1, 1, 1] and k.body.effects
        return [np.asarray(o) for o in fn(x, g, b)] + [w.numpy()]

    for a, c in zip(run("interpreter"), run("llvm")):
        assert_close(c, a, dtype)


@pytest.mark.usefixtures("cpu_level")
def test_a_log_softmax_over_the_last_axis_is_a_kernel():
    """Decomposed (max, exp, sum, log), it fuses with what makes its input and what reads it;
    its gradient (a softmax cross-entropy written with it) trains alike on both backends."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((40, 10))
    onehot = np.eye(10)[rng.integers(0, 10, 40)]

    def run(backend):
        w = go.Parameter(np.random.default_rng(7).standard_normal((10, 10)) * 0.3, name="w")
        grad_fn = go.value_and_grad(
            lambda x, y: -(ops.log_softmax(ops.tanh(x @ w)) * y).sum() / 40, wrt=[w])

        def train(x, y):
            loss, (g,) = grad_fn(x, y)
            go.assign(w, w - 0.5 * g)
            return loss

        fn = go.jit(train, backend=backend, cache=False)
        losses = [float(fn(x, onehot)) for _ in range(5)]
        if backend == "llvm":
            graph = fn.lower(x, onehot).graph
            assert not any(n.op == "log_softmax" for n in graph.nodes)
            assert any(n.op == "kernel" and any(m.op == "log" for m in n.body.nodes)
                       for n in graph.nodes)
        return losses, w.numpy()

    (l1, w1), (l2, w2) = run("interpreter"), run("llvm")
    assert l2[-1] < l2[0]
    np.testing.assert_allclose(l2, l1, rtol=1e-12)
    np.testing.assert_allclose(w2, w1, rtol=1e-11, atol=1e-13)


@pytest.mark.usefixtures("cpu_level")
def test_two_threads_split_rows_and_give_the_same_bits(monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6001, 67)).astype(np.float32)
    g, b = rng.standard_normal(67).astype(np.float32), rng.standard_normal(67).astype(np.float32)

    def step(x, g, b):
        return (*layernorm(x, g, b, (1,)), softmax(x, (1,)))

    ref = go.jit(step, backend="interpreter", cache=False)(x, g, b)
    bits = []
    for n in ("1", "2"):
        monkeypatch.setenv("GRAPHOPT_THREADS", n)
        fn = go.jit(step, backend="llvm", cache=False)
        got = fn(x, g, b)
        assert [len(k.splits()) for k in fn.lower(x, g, b).kernels] == [int(n)]
        for a, c in zip(ref, got):
            assert_close(c, a, np.float32)
        bits.append([np.asarray(o).tobytes() for o in got])
    assert bits[0] == bits[1]


def test_a_layernorm_training_step_trains_alike_on_both_backends():
    rng = np.random.default_rng(4)
    x, target = rng.standard_normal((32, 24)), rng.standard_normal((32, 24))

    def run(backend):
        w = go.Parameter(np.random.default_rng(5).standard_normal((24, 24)) * 0.2, name="w")
        g = go.Parameter(np.ones(24), name="g")
        b = go.Parameter(np.zeros(24), name="b")
        params = {"w": w, "g": g, "b": b}
        opt = go.optim.Adam(params, lr=1e-2)

        def loss_fn(x, t):
            y = layernorm(x @ w, g, b, (1,))[0]
            return ((y - t) * (y - t)).mean()

        grad_fn = go.value_and_grad(loss_fn, wrt=params)

        def train_step(x, t):
            loss, grads = grad_fn(x, t)
            opt.step(grads)
            return loss

        step = train_step if backend == "eager" else go.jit(train_step, backend=backend,
                                                             cache=False)
        if backend == "llvm":
            assert any(k.node.body is not None and any(n.op == "mean" for n in k.node.body.nodes)
                       for k in step.lower(x, target).kernels)
        return [float(step(x, target)) for _ in range(10)] + [w.numpy().copy()]

    losses = {backend: run(backend) for backend in ("eager", "interpreter", "llvm")}
    assert losses["llvm"][9] < losses["llvm"][0]
    for other in ("eager", "interpreter"):
        np.testing.assert_allclose(losses["llvm"][:10], losses[other][:10], rtol=1e-10)
        np.testing.assert_allclose(losses["llvm"][10], losses[other][10], rtol=1e-9, atol=1e-12)


KERNEL = """graph bad {{
  arg %x: f32[4,3]
  %0 = kernel %x {{spaces=[[4,3]], outputs=["{kind}"], shared=[]}} : {out} {{
    arg %x0: f32[]
    %1 = {op} %x0 {{axes={axes}, keepdims={keep}}} : f32[]
    %2 = subtract %x0, %1 : f32[]
    return {ret}
  }}
  return %0
}}"""


@pytest.mark.parametrize("kind,out,op,axes,keep,ret,message", [
    ("map", "f32[4,3]", "sum", "[0]", "true", "%2", r"a row reduction reduces the trailing"),
    ("map", "f32[4,3]", "sum", "[1]", "false", "%2", r"keepdims=false.*keepdims=true"),
    ("map", "f32[4,3]", "sum", "[0, 1]", "true", "%2", r"1 <= r < the rank"),
    ("row@1", "f32[4,1]", "max", "[1]", "true", "%2", r"'row@1' output must be the same"),
    ("row@2", "f32[4,1]", "max", "[1]", "true", "%1", r"outputs=\['row@2'\]"),
])
def test_a_row_kernel_that_breaks_a_rule_says_which(kind, out, op, axes, keep, ret, message):
    text = KERNEL.format(kind=kind, out=out, op=op, axes=axes, keep=keep, ret=ret)
    with pytest.raises(GraphoptError, match=message):
        verify(go.parse(text))


def test_a_well_formed_row_kernel_round_trips_through_its_text():
    text = KERNEL.format(kind="row@1", out="f32[4,1]", op="mean", axes="[1]", keep="true",
                         ret="%1")
    g = go.parse(text)
    verify(g)
    assert str(go.parse(str(g))) == str(g)
