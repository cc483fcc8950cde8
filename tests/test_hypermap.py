"""hypermap: an optimizer's update rule traced once and mapped over all its parameters."""
import numpy as np
import pytest

import graphopt as go
from graphopt import optim
from graphopt.errors import AssignError
from graphopt.frontend.hypermap import MapUnsupported, hypermap


def params_and_grads(n, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    shapes = [tuple(rng.integers(1, 9, size=rng.integers(1, 3))) for _ in range(n)]
    ps = [go.Parameter(rng.standard_normal(s).astype(dtype), name=f"w{i}")
          for i, s in enumerate(shapes)]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(5)]
    return ps, grads


def test_the_traced_update_is_one_multi_tensor_kernel():
    ps, grads = params_and_grads(50)
    opt = optim.Adam(ps, lr=1e-2)
    graph = go.trace(opt.step, grads[0])
    kernels = [n for n in graph.nodes if n.op == "kernel"]
    assert len(kernels) == 1 and len(kernels[0].attrs["spaces"]) == 50
    assert len(graph.nodes) < 30  # not 50 copies of the rule
    assert not graph.assigns()[1:]  # one assign: the step counter; the rest are stores


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adamax",
                                  "NAdam", "Lion"])
def test_mapped_steps_give_the_per_parameter_bits(name, monkeypatch):
    """On the reference backend the mapped kernel and eager per-parameter steps agree
    exactly: the same numpy operations on the same values."""
    monkeypatch.setenv("GRAPHOPT_BACKEND", "interpreter")
    runs = []
    for mode in ("jit", "eager"):
        ps, grads = params_and_grads(6, seed=1)
        opt = getattr(optim, name)(ps, lr=1e-2)
        step = go.jit(opt.step) if mode == "jit" else opt.step
        for g in grads:
            step(g)
        runs.append([p.numpy() for p in ps])
    for a, b in zip(*runs):
        assert a.tobytes() == b.tobytes()


def test_a_rule_with_a_norm_is_traced_parameter_by_parameter():
    ps, grads = params_and_grads(4)
    graph = go.trace(optim.LAMB(ps).step, grads[0])
    assert not any(n.op == "kernel" for n in graph.nodes)
    assert len(graph.assigns()) == 1 + 3 * 4  # each weight and its two moments, and the step


def test_reading_a_parameter_after_the_step_gives_its_new_value():
    ps, grads = params_and_grads(3)
    before = [p.numpy() for p in ps]
    opt = optim.SGD(ps, lr=0.5)

    def step(g):
        old = ps[1] * 1  # the value before the update (ordered before the in-place store)
        opt.step(g)
        return old, ps[1] + 0  # after: the new value

    old, new = go.jit(step)(grads[0])
    np.testing.assert_array_equal(old, before[1])
    np.testing.assert_allclose(new, before[1] - 0.5 * grads[0][1], rtol=1e-6)
    np.testing.assert_array_equal(ps[1].numpy(), new)


def test_assigning_a_mapped_parameter_again_is_an_error():
    ps, grads = params_and_grads(3)
    opt = optim.SGD(ps, lr=0.5)

    def step(g):
        opt.step(g)
        go.assign(ps[0], ps[0] * 0)

    with pytest.raises(AssignError, match="mapped update"):
        go.trace(step, grads[0])


def test_unsupported_rules_leave_no_trace_and_say_why():
    ps, _ = params_and_grads(2)

    def step():
        hypermap(lambda: go.assign(ps[0], ps[0] * ps[0].sum()),
                 [{"p": ps[0]}, {"p": ps[1]}])

    with pytest.raises(MapUnsupported, match="sum is not elementwise"):
        go.trace(step)


def test_a_thousand_parameters_make_a_graph_of_a_few_nodes():
    """The size of what is traced, passed over and compiled does not grow with the number of
    parameters (compile time is measured in benchmarks/adam.py, not here)."""
    ps, grads = params_and_grads(1000, seed=2)
    exe = go.jit(optim.Adam(ps, lr=1e-3).step, cache=False).lower(grads[0])
    assert len(exe.traced_graph.nodes) < 30 and len(exe.graph.nodes) < 20
    assert [len(k.node.attrs["spaces"]) for k in exe.kernels].count(1000) == 1


def test_a_clipped_gradient_is_computed_inside_the_mapped_update():
    """clip_grad_norm scales every gradient by one scalar; that multiply is copied into the
    update's body, so the kernel reads the raw gradients once and writes nothing else."""
    def run(mode):
        ps, grads = params_and_grads(8)
        opt = optim.Adam(ps, lr=1e-2)

        def step(g):
            clipped, norm = optim.clip_grad_norm(g, max_norm=1.0)
            opt.step(clipped)
            return norm

        fn = go.jit(step, backend="interpreter") if mode == "jit" else step
        for g in grads:
            fn(g)
        return [p.numpy() for p in ps], go.trace(step, grads[0]), grads

    jit_params, traced, grads = run("jit")
    graph = go.passes.run(traced).graph
    (update,) = [n for n in graph.nodes if n.op == "kernel" and n.body.effects
                 and len(n.attrs["spaces"]) == 8]
    assert sum(v in set(graph.args) for v in update.inputs) == 8  # the raw gradients
    from graphopt.ir.kernel import cost
    assert cost(update).bytes_per_element == 28
    eager_params, _, _ = run("eager")  # parameter by parameter, op by op
    for a, b in zip(jit_params, eager_params):
        assert a.tobytes() == b.tobytes()
