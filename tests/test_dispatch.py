"""Cheap dispatch between kernels: what a step decides once (the NodeLoop's closures, the
argument binding of a plain step) gives what deciding it every call gave."""
import inspect

import numpy as np
import pytest

import graphopt as go
from graphopt import ops, optim
from graphopt.errors import ExecutionError
from graphopt.frontend.tracer import bind_arguments
from graphopt.ir.graph import Node


def mlp_step(seed=0):
    rng = np.random.default_rng(seed)
    params = {"w1": go.Parameter(rng.standard_normal((8, 16)).astype(np.float32), name="w1"),
              "b1": go.Parameter(np.zeros(16, np.float32), name="b1"),
              "w2": go.Parameter(rng.standard_normal((16, 4)).astype(np.float32), name="w2")}
    opt = optim.AdamW(params, lr=1e-2)

    def loss(x, y):
        h = ops.relu(x @ params["w1"] + params["b1"])
        return ops.softmax_cross_entropy(h @ params["w2"], y)
    grads = go.value_and_grad(loss, wrt=params)

    def step(x, y):
        value, g = grads(x, y)
        opt.step(g)
        return value
    return step, params


def batch(seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((5, 8)).astype(np.float32), rng.integers(0, 4, 5)


def test_a_compiled_step_looks_up_no_op_facts_while_it_runs(monkeypatch):
    """Every node's op function, attributes and operands are in its closure from compile
    time on: with Node.opdef made to fail, llvm steps run on, and give the interpreter's
    losses (whose kernels numpy runs body node by body node, looking each op up)."""
    x, y = batch()
    losses = {}
    for backend in ("llvm", "interpreter"):
        step, params = mlp_step()
        fn = go.jit(step, backend=backend, cache=False)
        losses[backend] = [float(fn(x, y))]
        with monkeypatch.context() as m:
            if backend == "llvm":
                def no_lookup(self):
                    raise AssertionError(f"{self.op}: an op fact looked up during a step")
                m.setattr(Node, "opdef", property(no_lookup))
            losses[backend] += [float(fn(x, y)) for _ in range(3)]
    np.testing.assert_allclose(losses["llvm"], losses["interpreter"], rtol=1e-5)
    assert losses["llvm"][-1] < losses["llvm"][0]


def test_a_failing_numpy_node_still_names_itself_and_changes_no_parameter():
    step, params = mlp_step()
    fn = go.jit(step, backend="llvm", cache=False)
    x, y = batch()
    fn(x, y)
    before = {n: p.numpy().copy() for n, p in params.items()}
    with pytest.raises(ExecutionError, match="check_bounds failed while the step "
                                             "ran: .*no parameter was changed") as e:
        fn(x, np.full_like(y, 7))  # a label outside the 4 classes
    assert e.value.loc is not None and e.value.loc.file.endswith("test_dispatch.py")
    for n, p in params.items():
        np.testing.assert_array_equal(p.numpy(), before[n])


def plain(a, b): ...
def defaults(a, b=2): ...
def star(a, *rest, **named): ...
def keyword_only(a, *, b): ...


@pytest.mark.parametrize("fn, args, kwargs", [
    (plain, (1, 2), {}), (plain, (1,), {"b": 2}), (defaults, (1,), {}),
    (defaults, (1, 3), {}), (star, (1, 2, 3), {"z": 1, "a0": 2}), (star, (1,), {}),
    (keyword_only, (1,), {"b": 2})])
def test_binding_a_plain_call_quickly_binds_as_python_does(fn, args, kwargs):
    bound = inspect.signature(fn).bind(*args, **kwargs).arguments
    got = bind_arguments(fn, args, kwargs)
    assert list(got) == [k for k in inspect.signature(fn).parameters if k in got]
    for name, value in bound.items():
        want = dict(sorted(value.items())) if isinstance(value, dict) else value
        assert got[name] == want


@pytest.mark.parametrize("args, kwargs", [((1,), {}), ((1, 2, 3), {}), ((1,), {"c": 3})])
def test_a_call_that_does_not_bind_is_still_a_signature_error(args, kwargs):
    with pytest.raises(go.errors.SignatureError, match=r"plain\(\)"):
        bind_arguments(plain, args, kwargs)


def sink_step(backend, n=3000):
    """A step the graph sink runs whole (llvm): an SGD update, the sum of the squared
    gradient, and a value made from the parameter."""
    p = go.Parameter(np.linspace(-1, 1, n, dtype=np.float32), name="p")

    def step(g):
        go.assign(p, p - 0.125 * g)
        return ops.sum(g * g), p * 2
    return go.jit(step, backend=backend, cache=False), p


def test_a_sink_step_reads_the_arrays_of_each_call():
    """The graph sink fills its pointer tables again only when an input is another array
    than the last call's: a new array, the same one changed in place, the first one again,
    each gives the interpreter's values, and a result is not changed by the next call."""
    rng = np.random.default_rng(3)
    first, second = (rng.standard_normal(3000).astype(np.float32) for _ in range(2))
    got = {}
    for backend in ("llvm", "interpreter"):
        fn, p = sink_step(backend)
        g1, g2 = first.copy(), second.copy()
        if backend == "llvm":
            assert fn.lower(g1).program.sink
        results = []
        for g in (g1, g1, g2, g2, g1):
            results.append(fn(g))
            results.append(p.numpy())
            g += 1  # the same array, another value, for the next call that passes it
        got[backend] = results
    for a, b in zip(got["llvm"], got["interpreter"]):
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            np.testing.assert_allclose(x, y, rtol=1e-4)
    assert not np.array_equal(got["llvm"][0][1], got["llvm"][2][1])  # each call's own result


def test_a_sink_program_reads_the_parameter_arrays_it_is_given():
    """Run on copies of the parameters (as LLVMProgram.node_times's callers do), a program
    that ran the Parameters' own buffers before stores into the copies and leaves the
    Parameters alone."""
    fn, p = sink_step("llvm")
    g = np.ones(3000, np.float32)
    exe = fn.lower(g)
    fn(g)
    fn(g)
    before = p.numpy()
    copy = before.copy()
    inputs = {v: copy for v, _ in exe.param_inputs}
    inputs.update(zip(exe.graph.args, [g]))
    exe.program.run(inputs)
    np.testing.assert_array_equal(p.numpy(), before)
    np.testing.assert_allclose(copy, before - 0.125, rtol=1e-6)
    fn(g)  # and the Parameter's own buffer again
    np.testing.assert_allclose(p.numpy(), before - 0.125, rtol=1e-6)


def test_a_kernel_called_alone_runs_the_units_of_the_current_thread_count(monkeypatch):
    """A kernel called one by one (a matmul between kernels: no graph sink) reads its units
    from a record set with the thread count: a step on 2 threads, then on 1, then on 2 again
    computes every element each time, as the interpreter does."""
    n = 4 * (1 << 17)  # large enough to split over 2 threads
    rng = np.random.default_rng(5)
    x0, w0 = rng.standard_normal((n // 4, 4)).astype(np.float32), np.eye(4, dtype=np.float32)
    got = {}
    for backend in ("llvm", "interpreter"):
        w = go.Parameter(w0, name="w")

        def step(x):
            h = ops.exp(x * 0.5) @ w  # a kernel, then a matmul
            go.assign(w, w * 0.5)
            return ops.sum(h * h)
        fn = go.jit(step, backend=backend, cache=False)
        results = []
        for threads in ("2", "1", "2", "1"):
            monkeypatch.setenv("GRAPHOPT_THREADS", threads)
            results.append(float(fn(x0)))
        got[backend] = results
        if backend == "llvm":
            assert not fn.lower(x0).program.sink
    np.testing.assert_allclose(got["llvm"], got["interpreter"], rtol=1e-4)


def _two_runs(step_factory, args, monkeypatch, steps=3):
    """The losses and parameters of `steps` steps of a fresh step from step_factory, run with
    its segments and with each native node called on its own (no segments)."""
    from graphopt.backends.llvm import runtime
    out = {}
    for mode in ("segments", "node by node"):
        with monkeypatch.context() as m:
            if mode == "node by node":
                m.setattr(runtime, "_segments", lambda *a: [])
            step, params = step_factory()
            fn = go.jit(step, backend="llvm", cache=False)
            losses = [np.asarray(fn(*args)).copy() for _ in range(steps)]
            out[mode] = (losses, {n: p.numpy().copy() for n, p in params.items()},
                         fn.lower(*args).program)
    return out


@pytest.mark.parametrize("threads", ["1", "2"])
def test_runs_of_kernels_and_products_are_one_native_call_each(threads, monkeypatch):
    """Between numpy nodes, consecutive kernels and products run as one call of the graph
    sink (a segment): a training step makes a native call per segment, and its losses and
    parameters are those of the same step calling each node on its own, bit for bit."""
    monkeypatch.setenv("GRAPHOPT_THREADS", threads)
    out = _two_runs(mlp_step, batch(), monkeypatch)
    (losses, params, program), (want_losses, want_params, alone) = \
        out["segments"], out["node by node"]
    assert program.segments and not alone.segments and not program.sink
    grouped = {id(n) for s in program.segments for n in s.nodes}
    assert all(id(n) in program.native or id(n) in program.products for n in
               (n for s in program.segments for n in s.nodes))
    assert program.native_calls == len(program.segments) + sum(
        id(n) not in grouped for n in program.nodes
        if id(n) in program.native or id(n) in program.products) < alone.native_calls
    for got, want in zip(losses, want_losses):
        assert got.tobytes() == want.tobytes()
    for name, p in params.items():
        assert p.tobytes() == want_params[name].tobytes(), name
    assert "one native call runs" in program.listing()


def test_a_segment_whose_product_numpy_runs_goes_node_by_node(monkeypatch):
    """A product whose operand the BLAS cannot read where it lies (a misaligned argument:
    numpy runs it) inside a segment: that step runs the segment's nodes one by one, with
    the results of the interpreter."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    raw = np.zeros(32 * 16 * 4 + 2, np.uint8)
    w = np.frombuffer(raw.data, np.float32, 32 * 16, offset=2).reshape(32, 16)
    w[...] = rng.standard_normal((32, 16)).astype(np.float32)
    assert not w.flags.aligned

    def step(x, w):
        return ops.sum(ops.exp(ops.relu(x * 0.5) @ w * 0.01))
    llvm = go.jit(step, backend="llvm", cache=False)
    got = [float(llvm(x, w)) for _ in range(2)]
    program = llvm.lower(x, w).program
    (segment,) = program.segments
    (product,) = program.products.values()
    assert product in segment.parts and product._numpy and product.calls == 0
    want = float(go.jit(step, backend="interpreter")(x, w))
    np.testing.assert_allclose(got, [want, want], rtol=1e-6)
