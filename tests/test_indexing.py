"""Basic indexing (x[0], x[1:3], x[:, None], x[..., -1], x[::-1]): the `slice` op in eager
mode, on the interpreter and on the LLVM backend, whose kernels read a slice (or a transpose,
a broadcast) where it lies in its base's memory, with the strides of the view."""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import graphopt as go
from graphopt import ops
from graphopt.errors import OpTypeError
from graphopt.ir.parser import parse
from graphopt.ir.printer import format_graph
from support import line_of

KEYS = [0, -1, (1, 2), (slice(None), None), (Ellipsis, -1), (slice(None, None, -1),),
        (0, slice(1, 3), slice(None, None, 2)), (slice(5, 1),), (slice(None), slice(None, None, -2), 1),
        (None, Ellipsis, None), (slice(-2, None), slice(3, 0, -1))]


def program(fn, *args, backend="llvm"):
    """The LLVM program of a jitted function (to look at its kernels), and its result."""
    f = go.jit(fn, backend=backend)
    out = f(*args)
    return f.lower(*args).program, out


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_a_key_means_what_numpy_says_eager_and_on_both_backends(key, cpu_level):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    want = x[key] * 2 + 1
    np.testing.assert_array_equal(np.asarray(ops.index(x, key) * 2 + 1), want)
    for backend in ("interpreter", "llvm"):
        out = go.jit(lambda a: a[key] * 2.0 + 1.0, backend=backend)(x)
        assert np.asarray(out).shape == want.shape
        np.testing.assert_array_equal(np.asarray(out), want, err_msg=backend)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_basic_index_in_a_kernel_matches_numpy(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=5))
    key = data.draw(hnp.basic_indices(shape, allow_newaxis=True))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y = np.float32(0.5)
    f = go.jit(lambda a, b: (a[key] * b + 1.0, ops.sum(a[key] * a[key])))
    mapped, total = f(x, y)
    np.testing.assert_array_equal(np.asarray(mapped), x[key] * y + np.float32(1))
    np.testing.assert_allclose(np.asarray(total), np.sum(x[key].astype(np.float64) ** 2),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make, strides", [
    (lambda a: a[1:3, ::2], None),  # read in place: a slice of rows, every other column
    (lambda a: a[::-1], None),  # backwards
    (lambda a: a.T, None),  # a transpose
    (lambda a: a[:, None, 1], None),  # a column with an axis added
])
def test_a_kernel_reads_a_view_where_it_lies(make, strides):
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    prog, out = program(lambda a: make(a) * 3.0, x)
    np.testing.assert_array_equal(np.asarray(out), make(x) * 3)
    (k,) = prog.kernels
    assert k.views and all(base.is_input for base, _, _ in k.views.values())
    # No node makes the view: the whole step is the kernel, one native call (the sink).
    assert [n.op for n in prog.nodes] == ["kernel"] and prog.sink


def test_kernels_of_views_with_other_strides_are_other_code_and_offsets_are_not():
    x = np.arange(40, dtype=np.float32)

    def name(make):
        prog, out = program(lambda a: make(a) + 1.0, x)
        np.testing.assert_array_equal(np.asarray(out), make(x) + 1)
        return prog.kernels[0].name

    assert name(lambda a: a[0:20:2]) == name(lambda a: a[1:21:2])  # a pointer apart
    assert name(lambda a: a[0:20:2]) != name(lambda a: a[0:40:4][:10]) != name(lambda a: a[:10])
    assert name(lambda a: a[19::-2]) != name(lambda a: a[0:20:2])


@pytest.mark.parametrize("threads", ["1", "2"])
def test_large_strided_kernels_split_over_threads(threads, monkeypatch):
    monkeypatch.setenv("GRAPHOPT_THREADS", threads)
    x = np.random.default_rng(1).standard_normal((700, 1200)).astype(np.float32)
    f = go.jit(lambda a: (a[::-1, 1::2] * 2.0, ops.sum(a.T[::2])))
    mapped, total = f(x)
    np.testing.assert_array_equal(np.asarray(mapped), x[::-1, 1::2] * 2)
    np.testing.assert_allclose(np.asarray(total), np.sum(x.T[::2], dtype=np.float64), rtol=1e-5)


def test_a_slice_of_a_parameter_read_before_its_update_is_read_in_place():
    w = go.Parameter(np.arange(12, dtype=np.float32).reshape(3, 4))
    w_ref = go.Parameter(w.numpy())

    def step(p, x):
        loss = ops.sum(p[1:, ::-2] * x)  # reads p before the update below
        go.assign(p, p * 0.5)
        return loss

    x = np.ones((2, 2), np.float32)
    prog, loss = program(lambda x: step(w, x), x)
    ref = go.jit(lambda x: step(w_ref, x), backend="interpreter")(x)
    np.testing.assert_array_equal(np.asarray(loss), np.asarray(ref))
    np.testing.assert_array_equal(w.numpy(), w_ref.numpy())
    reader = next(k for k in prog.kernels if not k.node.body.effects)
    assert reader.views  # the update's kernel stores later: reading in place is safe


@pytest.mark.parametrize("update", [
    lambda p: p[::-1] + 1.0,  # the kernel that stores p would read elements it has written
    lambda p: p.T * 2.0,
    lambda p: p[:, ::-1] - p,
])
def test_a_kernel_storing_a_parameter_never_reads_it_through_a_view(update):
    start = np.arange(16, dtype=np.float32).reshape(4, 4)
    w, w_ref = go.Parameter(start.copy()), go.Parameter(start.copy())
    prog, _ = program(lambda: go.assign(w, update(w)) or 0.0)
    go.jit(lambda: go.assign(w_ref, update(w_ref)) or 0.0, backend="interpreter")()
    np.testing.assert_array_equal(w.numpy(), w_ref.numpy())
    np.testing.assert_array_equal(w.numpy(), update(start))
    assert not any(k.views for k in prog.kernels)


def test_a_multi_tensor_update_of_sliced_gradients_copies_them():
    params = [go.Parameter(np.ones(3, np.float32)), go.Parameter(np.ones(3, np.float32))]
    ref = [go.Parameter(np.ones(3, np.float32)), go.Parameter(np.ones(3, np.float32))]
    g = np.arange(12, dtype=np.float32)
    opt, opt_ref = go.optim.SGD(params, lr=0.5), go.optim.SGD(ref, lr=0.5)
    go.jit(lambda g: opt.step([g[0:6:2], g[11:8:-1]]))(g)
    go.jit(lambda g: opt_ref.step([g[0:6:2], g[11:8:-1]]), backend="interpreter")(g)
    for p, r in zip(params, ref):
        np.testing.assert_array_equal(p.numpy(), r.numpy())
    np.testing.assert_array_equal(params[1].numpy(), 1 - 0.5 * g[11:8:-1])


def test_index_update_is_setitem_as_a_new_tensor():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for backend in ("interpreter", "llvm"):
        out = go.jit(lambda a: ops.index_update(a, (slice(None), -1), a[:, 0]), backend=backend)(x)
        want = x.copy()
        want[:, -1] = x[:, 0]
        np.testing.assert_array_equal(np.asarray(out), want)


def test_gradients_flow_through_slices():
    w = go.Parameter(np.arange(12, dtype=np.float64).reshape(3, 4))
    loss, grad = go.jit(go.value_and_grad(lambda p: ops.sum(p[1:, ::-2] ** 2)))(w)
    want = np.zeros((3, 4))
    want[1:, ::-2] = 2 * w.numpy()[1:, ::-2]
    np.testing.assert_array_equal(np.asarray(grad), want)
    assert float(np.asarray(loss)) == np.sum(w.numpy()[1:, ::-2] ** 2)


def test_the_ir_text_of_slices_parses_back():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    exe = go.jit(lambda a: ops.index_update(a, (0, None), 2.0)[1:, ::-1] + a[-1]).lower(x)
    text = format_graph(exe.graph)
    assert "slice %" in text and "slice_scatter %" in text
    assert format_graph(parse(text)) == text


@pytest.mark.parametrize("text, says", [
    ("slice %x {starts=[0], stops=[9], steps=[1]} : f32[9]", "is not a slice of 4 elements"),
    ("slice %x {starts=[3], stops=[-1], steps=[0]} : f32[4]", "step != 0"),
    ("slice %x {starts=[0, 0], stops=[4, 4], steps=[1, 1]} : f32[4]", "one entry per axis"),
    ("slice %x {starts=[0], stops=[4], steps=[2]} : f32[4]", "not the slice's shape [2]"),
    ("slice %x {starts=[0], stops=[4], steps=[1.5]} : f32[4]", "must be a list of integers"),
])
def test_the_verifier_rejects_a_bad_slice(text, says):
    with pytest.raises(go.GraphoptError, match=re.escape(says)):
        parse(f"graph g {{\n  arg %x: f32[4]\n  %0 = {text}\n  return %0\n}}\n").verify()


def _index_at_a_line(x, key):
    return x[key]  # indexed here


@pytest.mark.parametrize("key, says", [
    (np.array([0, 1]), "ops.gather"),
    ([0, 1], "ops.gather"),
    (np.array([True, False, True]), "ops.where"),
    (True, "ops.where"),
    (3, "index 3 is out of bounds for axis 0 with 3 elements"),
    (-4, "index -4 is out of bounds"),
    ((0, 0, 0), "too many indices: 3 for a tensor of 2 axes"),
    ((Ellipsis, 0, Ellipsis), "a single ellipsis"),
    (slice(None, None, 0), "step cannot be zero"),
    (slice(0.5, 2), "a slice's start must be an int or None, got 0.5"),
    ("a", "only basic indexing"),
])
def test_a_bad_key_is_an_error_at_the_users_line(key, says):
    line = line_of(__file__, "indexed here")
    x = np.zeros((3, 4), np.float32)
    for run in (lambda: go.jit(lambda a: _index_at_a_line(a, key))(x),
                lambda: _index_at_a_line(go.Parameter(x), key)):
        with pytest.raises(OpTypeError, match=says) as e:
            run()
        assert e.value.loc is not None and e.value.loc.line == line


def test_a_traced_index_names_gather():
    with pytest.raises(go.GraphoptError, match="ops.gather"):
        go.jit(lambda a, i: a[i])(np.zeros(3, np.float32), np.int64(1))


def test_setitem_says_what_to_use():
    def step(a):
        a[0] = 1.0
        return a
    with pytest.raises(OpTypeError, match="index_update"):
        go.jit(step)(np.zeros(3, np.float32))
