"""Family 4: `*args` and `**kwargs` step functions are traced like any other argument
structure: a tuple and a dict of leaves, the same result eager and under jit on both backends,
and a call of another structure is a SignatureError."""
import numpy as np
import pytest

import graphopt as go
from graphopt import ops
from graphopt.errors import SignatureError

BACKENDS = ["interpreter", "llvm"]
x = np.array([1.0, -2.0, 3.0], np.float32)
y = np.array([0.5, 4.0, -1.0], np.float32)
z = np.array([2.0, 2.0, 0.25], np.float32)


def first(*a):
    return a[0]


def add_two(*a):
    return a[0] + a[1]


def add_all(*a):
    return sum(a[1:], a[0])


def scaled(x, **kw):
    return x * kw["scale"] + kw["shift"]


def mixed(a, /, b, *rest, c=2.0, **kw):
    out = a * b + c
    for r in rest:
        out = out + ops.exp(r)
    for k in sorted(kw):
        out = out - kw[k]
    return out


def returns_structure(*a, **kw):
    return {"args": a, "kw": kw}


# (function, positional arguments, keyword arguments)
CASES = [
    (first, (x, y), {}),
    (first, (x,), {}),
    (add_two, (x, y), {}),
    (add_all, (x, y, z), {}),
    (add_all, (x, 0.5), {}),
    (scaled, (x,), {"scale": y, "shift": z}),
    (scaled, (x,), {"shift": 1.5, "scale": y}),
    (mixed, (x, y), {}),
    (mixed, (x, y, z, y), {"c": 0.5}),
    (mixed, (x, y), {"d": z, "e": y}),
    (mixed, (x,), {"b": y, "d": z}),
    (returns_structure, (x, y), {"k": z}),
]


def eager(fn, args, kwargs):
    out = fn(*[go.EagerTensor(a) if isinstance(a, np.ndarray) else a for a in args],
             **{k: go.EagerTensor(v) if isinstance(v, np.ndarray) else v
                for k, v in kwargs.items()})
    return out


def as_arrays(out):
    leaves, _, tree = go.frontend.pytree.flatten(out)
    return [np.asarray(leaf) for leaf in leaves], tree


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, args, kwargs", CASES,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_varargs_steps_match_eager_and_numpy(backend, fn, args, kwargs):
    want, want_tree = as_arrays(fn(*args, **kwargs))  # plain numpy
    got, got_tree = as_arrays(go.jit(fn, backend=backend, cache=False)(*args, **kwargs))
    ea, ea_tree = as_arrays(eager(fn, args, kwargs))
    assert got_tree == want_tree == ea_tree
    for g, e, w in zip(got, ea, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
        np.testing.assert_allclose(e, w, rtol=1e-6)


def test_star_args_are_a_tuple_of_arguments_in_the_ir():
    graph = go.jit(add_two, backend="interpreter").lower(x, y).traced_graph
    assert [v.name for v in graph.args] == ["a.0", "a.1"]
    graph = go.jit(scaled, backend="interpreter").lower(x, shift=z, scale=y).traced_graph
    assert [v.name for v in graph.args] == ["x", "kw.scale", "kw.shift"]


def test_keyword_order_does_not_retrace():
    step = go.jit(scaled, backend="interpreter")
    a = step(x, scale=y, shift=z)
    b = step(x, shift=z, scale=y)
    np.testing.assert_array_equal(a, b)
    info = step.cache_info()
    assert (info.traces, info.hits) == (1, 1)


@pytest.mark.parametrize("fn, first_call, second_call, where", [
    (add_all, ((x, y), {}), ((x, y, z), {}), "a"),
    (add_all, ((x, y, z), {}), ((x, y), {}), "a"),
    (scaled, ((x,), {"scale": y, "shift": z}), ((x,), {"scale": y, "shift": z, "more": x}),
     "kw"),
    (scaled, ((x,), {"scale": y, "shift": z}), ((x,), {"scale": y, "other": z}), "kw"),
    (mixed, ((x, y, z), {}), ((x, y), {}), "rest"),
], ids=["more-args", "fewer-args", "more-kwargs", "other-kwargs", "rest"])
def test_a_call_of_another_structure_is_a_signature_error(fn, first_call, second_call, where):
    step = go.jit(fn, backend="interpreter")
    step(*first_call[0], **first_call[1])
    with pytest.raises(SignatureError, match=rf"argument '{fn.__name__}\.{where}'"):
        step(*second_call[0], **second_call[1])


@pytest.mark.parametrize("args, kwargs", [((), {}), ((x,), {"x": y}), ((x, y), {"z": z})])
def test_a_call_python_would_refuse_is_a_signature_error(args, kwargs):
    def two(x, y):
        return x + y
    with pytest.raises(SignatureError, match=r"two\(\)"):
        go.jit(two, backend="interpreter")(*args, **kwargs)


def test_value_and_grad_of_a_varargs_function():
    w = go.Parameter(np.array([1.0, 2.0, 3.0], np.float32), name="w")

    def loss(*a, **kw):
        return ((w * a[0] + kw["b"]) ** 2).sum()

    @go.jit(backend="interpreter")
    def step(*a, **kw):
        return go.grad(loss, wrt=w)(*a, **kw)

    g = step(x, b=y)
    np.testing.assert_allclose(g, 2 * (w.numpy() * x + y) * x, rtol=1e-6)
