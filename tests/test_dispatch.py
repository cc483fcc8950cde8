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
