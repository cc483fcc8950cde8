"""Whole-step fusion (passes/wholestep.py): a bias's update runs in the finish stage of the
kernel that reduces its gradient (ir/kernel.py), and the gradient is never stored. Checked
against the graph without the pass (the gradient stored and read back): the interpreter's
results and the LLVM backend's are each the same bits, for any thread count."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import graphopt as go
from graphopt import ops, optim
from graphopt.errors import CollectiveError, VerifyError
from graphopt.ir import kernel as kernel_ir
from graphopt.ir.parser import parse
from graphopt.ir.printer import format_graph
from graphopt.ir.traffic import graph_bytes
from graphopt.passes import DEFAULT_PIPELINE

WITHOUT = [p for p in DEFAULT_PIPELINE if p != "wholestep"]


def mlp(rng: np.random.Generator, sizes: list[int]) -> dict[str, go.Parameter]:
    params = {}
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        params[f"w{i}"] = go.Parameter((rng.standard_normal((a, b)) / np.sqrt(a))
                                       .astype(np.float32), name=f"w{i}")
        params[f"b{i}"] = go.Parameter(rng.standard_normal(b).astype(np.float32) * 0.1,
                                       name=f"b{i}")
    return params


def make_step(opt_name: str, batch: int = 64, sizes=(5, 16, 16, 3), seed: int = 0):
    """An MLP training step over fresh parameters: (step, params, x, labels)."""
    rng = np.random.default_rng(seed)
    params = mlp(rng, list(sizes))
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], batch).astype(np.int32)
    opt = optim.AdamW(params, lr=0.01, weight_decay=1e-3) if opt_name == "adamw" else \
        optim.SGD(params, lr=0.05, momentum=0.9)
    n = len(sizes) - 1

    def logits(x):
        h = x
        for i in range(n):
            h = h @ params[f"w{i}"] + params[f"b{i}"]
            if i < n - 1:
                h = ops.relu(h)
        return h

    grad = go.value_and_grad(lambda x, y: ops.softmax_cross_entropy(logits(x), y), wrt=params)

    def step(x, y):
        loss, grads = grad(x, y)
        opt.step(grads)
        return loss
    return step, params, x, labels


def run(opt_name: str, backend: str, passes, steps: int = 3, **kw):
    step, params, x, labels = make_step(opt_name, **kw)
    fn = go.jit(step, backend=backend, passes=passes, cache=False)
    losses = [np.asarray(fn(x, labels)) for _ in range(steps)]
    return fn.lower(x, labels), losses, {k: p.numpy() for k, p in params.items()}


def finish_kernels(graph) -> list:
    return [n for n in graph.nodes if n.op == "kernel" and kernel_ir.finish_reductions(n.body)]


@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_the_bias_updates_run_in_the_bias_gradient_kernels(opt_name):
    exe, *_ = run(opt_name, "interpreter", None, steps=0)
    fused = finish_kernels(exe.graph)
    stored = {v.name for k in fused for v in kernel_ir.written(k)}
    assert {"b0", "b1", "b2"} <= stored
    assert all(kernel_ir.stages(k.body).k == 1 for k in fused)
    # the weights' update stays one multi-tensor kernel, of the three weights
    (update,) = [n for n in exe.graph.nodes if n.op == "kernel" and len(n.attrs["spaces"]) > 1]
    assert {v.name for v in kernel_ir.written(update)} >= {"w0", "w1", "w2"}
    assert not {"b0", "b1", "b2"} & {v.name for v in kernel_ir.written(update)}
    # no bias gradient is a kernel output any more, and the bytes say so
    before, _, _ = run(opt_name, "interpreter", WITHOUT, steps=0)
    assert sum(n.op == "kernel" for n in exe.graph.nodes) <= \
        sum(n.op == "kernel" for n in before.graph.nodes)
    # The bias gradients (f32) are not written: the bias elements' share of the update's
    # reads (their gradient among them) goes, and the finish stages read what their kernels
    # did not read already (the bias, its state, the update's scalars), once.
    elements = 16 + 16 + 3
    (old_update,) = [n for n in before.graph.nodes if n.op == "kernel" and
                     len(n.attrs["spaces"]) > 1]
    moved = kernel_ir.cost(old_update).read_per_element * elements
    new = 0
    for k in fused:
        st = kernel_ir.stages(k.body)
        element = {v for n in st.element for v in n.inputs} | {m.inputs[0] for m in
                                                              st.reductions}
        new += sum(k.inputs[j].type.nbytes for j in st.finish_inputs
                   if k.body.inputs[j] not in element)
    (read, written), (read0, written0) = graph_bytes(exe.graph), graph_bytes(before.graph)
    assert (read0 - read, written0 - written) == (moved - new, 4 * elements)


@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_the_interpreter_gives_the_unfused_bits(opt_name):
    _, losses, params = run(opt_name, "interpreter", None)
    _, ref_losses, ref = run(opt_name, "interpreter", WITHOUT)
    assert [a.tobytes() for a in losses] == [a.tobytes() for a in ref_losses]
    for k in params:
        assert params[k].tobytes() == ref[k].tobytes(), k


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_llvm_gives_the_unfused_bits_and_agrees_with_the_interpreter(opt_name, threads,
                                                                     monkeypatch):
    """A batch of 4096 rows: the bias-gradient kernels split over the threads, and the
    finisher adds the blocks' partials in one order whoever ran them."""
    monkeypatch.setenv("GRAPHOPT_THREADS", threads)
    exe, losses, params = run(opt_name, "llvm", None, batch=4096)
    assert not exe.program.fallbacks and finish_kernels(exe.graph)
    assert all(k.abi.finishes for k in exe.program.kernels
               if kernel_ir.finish_reductions(k.node.body))
    _, ref_losses, ref = run(opt_name, "llvm", WITHOUT, batch=4096)
    assert [a.tobytes() for a in losses] == [a.tobytes() for a in ref_losses]
    for k in params:
        assert params[k].tobytes() == ref[k].tobytes(), k
    _, i_losses, i_params = run(opt_name, "interpreter", None, batch=4096)
    for k in params:
        np.testing.assert_allclose(params[k], i_params[k], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses, i_losses, rtol=1e-5)


def test_eager_and_jit_agree():
    """Eager runs the step op by op (the update kernel opt.step makes, whole): jit's
    interpreter, with the bias updates moved, gives its bits."""
    step, params, x, labels = make_step("adamw")
    eager = [np.asarray(step(x, labels)) for _ in range(2)]
    eager_params = {k: p.numpy() for k, p in params.items()}
    _, losses, jit_params = run("adamw", "interpreter", None, steps=2)
    assert [a.tobytes() for a in eager] == [a.tobytes() for a in losses]
    for k in eager_params:
        assert eager_params[k].tobytes() == jit_params[k].tobytes(), k


@settings(max_examples=12, deadline=None)
@given(batch=st.integers(1, 300), features=st.integers(1, 40), threads=st.sampled_from("12"),
       seed=st.integers(0, 2**16))
def test_any_shape_gives_the_unfused_bits(batch, features, threads, seed):
    """A bias's SGD-momentum update in the finish stage, over shapes whose blocks cut the
    batch anywhere: the same bits as stored and read back, on both backends."""
    rng = np.random.default_rng(seed)
    dy = rng.standard_normal((batch, features)).astype(np.float32)
    results = {}
    for backend in ("interpreter", "llvm"):
        for passes in (None, WITHOUT):
            b = go.Parameter(rng.standard_normal(features).astype(np.float32) * 0 + 1, name="b")
            opt = optim.SGD([b], lr=0.1, momentum=0.9)

            def step(dy):
                g = ops.sum(ops.tanh(dy) * 3.0, axis=0)
                opt.step([g])
                return ops.sum(dy)
            fn = go.jit(step, backend=backend, passes=passes, cache=False)
            import os
            os.environ["GRAPHOPT_THREADS"] = threads
            try:
                out = [np.asarray(fn(dy)).tobytes() for _ in range(2)]
            finally:
                del os.environ["GRAPHOPT_THREADS"]
            if passes is None:
                assert finish_kernels(fn.lower(dy).graph)
            results[backend, passes is None] = out, b.numpy().tobytes()
    assert results["interpreter", True] == results["interpreter", False]
    assert results["llvm", True] == results["llvm", False]


class _Unreachable:
    """A group of 2 whose other rank never answers: its collectives raise."""

    rank, size = 0, 2

    def all_reduce(self, x, reduce):
        raise CollectiveError("rank 1 did not arrive (test)")


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
def test_a_failure_after_the_finish_stage_changes_nothing(backend, monkeypatch):
    """The bias's update (and its momentum's) runs in the finish of the kernel that also
    makes the cotangent; the weight's gradient, a matmul of that cotangent, goes through a
    collective that fails, after that kernel stored: every parameter is as it was."""
    from graphopt import comm
    monkeypatch.setitem(comm._GROUPS, "unreachable", _Unreachable())
    rng = np.random.default_rng(3)
    w = go.Parameter(rng.standard_normal((4, 6)).astype(np.float32), name="w")
    b = go.Parameter(rng.standard_normal(6).astype(np.float32), name="b")
    opt = optim.SGD([w, b], lr=0.1, momentum=0.9)
    grad = go.value_and_grad(lambda x: ops.sum(ops.tanh(x @ w + b)), wrt=[w, b])

    def step(x):
        loss, (gw, gb) = grad(x)
        opt.step([ops.all_reduce(gw, group="unreachable"), gb])
        return loss

    x = rng.standard_normal((8, 4)).astype(np.float32)
    fn = go.jit(step, backend=backend, cache=False)
    exe = fn.lower(x)
    (k,) = finish_kernels(exe.graph)
    stored = {v.name for v in kernel_ir.written(k)}
    assert "b" in stored and len(stored) == 2  # the bias and its momentum buffer
    if backend == "llvm":
        assert exe.program.needs_backup
        assert stored <= {v.name for v in exe.program.backed_up}
    owned = [w, b] + opt.parameters()
    before = [p.numpy().copy() for p in owned]
    with pytest.raises(CollectiveError, match="rank 1 did not arrive"):
        fn(x)
    for p, was in zip(owned, before):
        assert p.numpy().tobytes() == was.tobytes(), p.name


def two_layers(backend: str):
    """make_step's network of two layers, whose step also returns w0's transpose: (jit
    function, parameters, x, labels)."""
    step, params, x, labels = make_step("sgd", batch=8, sizes=(4, 6, 3), seed=5)

    def with_w0_t(x, labels):
        w0_t = params["w0"].T  # (before the step: the old value)
        return step(x, labels), w0_t
    return go.jit(with_w0_t, backend=backend, cache=False), params, x, labels


def test_a_weights_transpose_is_copied_only_when_read_after_its_own_store():
    """The bias's finish stage stores before the backward's matmuls (they read the cotangent
    its kernel makes): w1's transpose, which they read before w1's update, is read where it
    lies (in w1, by the products); w0's, returned (read once the step is whole, after w0's store), keeps its old value
    by a copy."""
    fn, params, x, labels = two_layers("llvm")
    old_w0 = params["w0"].numpy().copy()
    prog = fn.lower(x, labels).program
    stores = {v.name: i for i, n in enumerate(prog.nodes) if id(n) in prog.native
              for v in kernel_ir.written(n)}
    # (the matmuls read it in w1 itself, as the BLAS's trans flag: its node is not made)
    assert not [n for n in prog.nodes if n.op == "transpose" and n.inputs[0].name == "w1"]
    readers = [i for i, n in enumerate(prog.nodes) if id(n) in prog.products and any(
        r.source.name == "w1" and r.strides is not None for r in prog.products[id(n)].reads)]
    assert stores["b1"] < min(readers) and max(readers) < stores["w1"], (stores, readers)
    assert [(v.node.op, p.name) for v, p in prog.copies] == [("transpose", "w0")]
    # and it is the only value a step checks as it is made (the activations' transposes view
    # the memory plan's buffers, never a parameter)
    assert prog.read_late == {v for v, _ in prog.copies}
    loss, w0_t = fn(x, labels)
    np.testing.assert_array_equal(w0_t, old_w0.T)
    ref_fn, ref_params, _, _ = two_layers("interpreter")
    ref_loss, _ = ref_fn(x, labels)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    for k, p in params.items():
        np.testing.assert_allclose(p.numpy(), ref_params[k].numpy(), rtol=1e-5, atol=1e-6)


FINISH = """graph finish {
  param @b: f32[3]
  param @m: f32[3]
  arg %dy: f32[4,3]
  arg %lr: f32[]
  %0, %1 = kernel %dy, @m, %lr, @b {spaces=[[4, 3]], outputs=["map"], shared=[]} : f32[4,3], token {
    arg %x0: f32[]
    arg %x1: f32[]
    arg %x2: f32[]
    arg %x3: f32[]
    %0 = exp %x0 : f32[]
    %1 = sum %0 {axes=[0], keepdims=false} : f32[]
    %2 = constant {value=0.9} : f32[]
    %3 = multiply %x1, %2 : f32[]
    %4 = add %3, %1 : f32[]
    %5 = multiply %x2, %4 : f32[]
    %6 = subtract %x3, %5 : f32[]
    %7 = store %x1, %4 : token
    %8 = store %x3, %6 : token
    return %0 after(%7, %8)
  }
  return %0 after(%1)
}
"""


def test_a_finish_stage_prints_and_parses_back_and_runs():
    g = parse(FINISH)
    g.verify()
    text = format_graph(g)
    assert format_graph(parse(text)) == text
    (k,) = g.nodes
    st = kernel_ir.stages(k.body)
    assert st.k == 1 and [j for j, _ in st.finish_stores] == [1, 3]
    assert [n.op for n in st.finish] == ["constant", "multiply", "add", "multiply", "subtract"]
    cost = kernel_ir.cost(k)  # dy streams in, the map out; m, b read and written once, lr read
    assert (cost.read_per_element, cost.write_per_element) == (4, 4)
    assert (cost.fixed_bytes, cost.fixed_written) == (12 + 12 + 4 + 12 + 12, 24)
    rng = np.random.default_rng(0)
    dy = rng.standard_normal((4, 3)).astype(np.float32)
    m, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    from graphopt.backends import base
    outs, writes = kernel_ir.run(k, [dy, m, np.float32(0.5), b], base._fused)
    grad = np.exp(dy).sum(axis=0, dtype=np.float32)
    new_m = m * np.float32(0.9) + grad
    got = {v.name: a for v, a in writes}
    assert got["m"].tobytes() == new_m.tobytes()
    assert got["b"].tobytes() == (b - np.float32(0.5) * new_m).tobytes()
    np.testing.assert_array_equal(outs[0], np.exp(dy))


@pytest.mark.parametrize("old, new, message", [
    ("return %0 after(%7, %8)", "return %4 after(%7, %8)",
     "body output 0 is computed in the finish stage"),
    ("%8 = store %x3, %6", "%8 = store %x0, %6", "operand 0 (f32[4,3]) is stored in the finish"),
    ("%3 = multiply %x1, %2", "%3 = multiply %x0, %2",
     "operand 0 (f32[4,3]) is read in the finish stage"),
    ("%1 = sum %0 {axes=[0], keepdims=false}", "%1 = sum %0 {axes=[1], keepdims=false}",
     "a finish reduction reduces the leading axes"),
])
def test_the_verifier_rejects_a_malformed_finish_stage(old, new, message):
    assert old in FINISH
    with pytest.raises(VerifyError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        parse(FINISH.replace(old, new)).verify()
