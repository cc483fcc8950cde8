"""Gradient transforms: clip_grad_norm (torch's formula), clip_grad_value, centralization."""
import numpy as np
import pytest

import graphopt as go
from graphopt import optim


def grads(rng, dtype=np.float32, scale=1.0):
    return [(rng.standard_normal(s) * scale).astype(dtype) for s in [(4, 3), (3,), (2, 2, 2)]]


def numpy_clip(gs, max_norm, norm_type, eps=1e-6):
    """torch.nn.utils.clip_grad_norm_: the norm of the per-tensor norms, then one factor."""
    if norm_type == float("inf"):
        total = max(np.abs(g).max() for g in gs)
    else:
        norms = [np.sum(np.abs(g.astype(np.float64)) ** norm_type) ** (1 / norm_type) for g in gs]
        total = np.sum(np.array(norms) ** norm_type) ** (1 / norm_type)
    coef = min(max_norm / (total + eps), 1.0)
    return [g * coef for g in gs], total


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_clip_grad_norm_matches_numpy(rng, norm_type, max_norm, mode):
    gs = grads(rng, np.float64)
    fn = lambda gs: optim.clip_grad_norm(gs, max_norm, norm_type)  # noqa: E731
    clipped, total = (go.jit(fn) if mode == "jit" else fn)(gs)
    want, want_total = numpy_clip(gs, max_norm, norm_type)
    assert float(total) == pytest.approx(want_total, rel=1e-13)
    for c, w in zip(clipped, want):
        np.testing.assert_allclose(np.asarray(c), w, rtol=1e-13)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_matches_torch(rng, norm_type, max_norm):
    torch = pytest.importorskip("torch")
    gs = grads(rng, np.float32, scale=3.0)
    clipped, total = go.jit(lambda gs: optim.clip_grad_norm(gs, max_norm, norm_type))(gs)
    ps = [torch.nn.Parameter(torch.zeros(g.shape)) for g in gs]
    for p, g in zip(ps, gs):
        p.grad = torch.from_numpy(g.copy())
    want_total = torch.nn.utils.clip_grad_norm_(ps, max_norm, norm_type, foreach=False)
    # f32 sums in another order: equal to a few ulp.
    assert float(total) == pytest.approx(float(want_total), rel=1e-6)
    for c, p in zip(clipped, ps):
        np.testing.assert_allclose(c, p.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_clip_returns_a_dict_for_a_dict(rng):
    gs = dict(zip("abc", grads(rng)))
    clipped, _ = optim.clip_grad_norm(gs, 1.0)
    assert list(clipped) == ["a", "b", "c"]


def test_clip_grad_value(rng):
    gs = grads(rng, np.float64, scale=2.0)
    got = go.jit(lambda gs: optim.clip_grad_value(gs, 0.5))(gs)
    for g, w in zip(got, gs):
        np.testing.assert_array_equal(g, np.clip(w, -0.5, 0.5))
    torch = pytest.importorskip("torch")
    ps = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64)) for g in gs]
    for p, g in zip(ps, gs):
        p.grad = torch.from_numpy(g.copy())
    torch.nn.utils.clip_grad_value_(ps, 0.5, foreach=False)
    for g, p in zip(got, ps):
        np.testing.assert_array_equal(g, p.grad.numpy())


def test_centralize_gradients(rng):
    gs = grads(rng, np.float64)
    got = go.jit(optim.centralize_gradients)(gs)
    np.testing.assert_allclose(got[0], gs[0] - gs[0].mean(axis=1, keepdims=True), rtol=1e-14)
    np.testing.assert_array_equal(got[1], gs[1])  # rank 1: unchanged
    np.testing.assert_allclose(got[2], gs[2] - gs[2].mean(axis=(1, 2), keepdims=True),
                               rtol=1e-14)
    assert np.abs(got[0].sum(axis=1)).max() < 1e-14


def test_clip_then_step_in_one_graph(rng):
    p = go.Parameter(np.zeros((4, 3)), name="w")
    opt = optim.SGD([p], lr=1.0)

    @go.jit
    def step(g):
        (g,), norm = optim.clip_grad_norm([g], 1.0)
        opt.step([g])
        return norm

    g = np.full((4, 3), 2.0)
    assert step(g) == pytest.approx(np.sqrt(48))
    assert np.sqrt((p.numpy() ** 2).sum()) == pytest.approx(1.0 / (1 + 1e-6 / np.sqrt(48)))


@pytest.mark.parametrize("transform", ["norm", "norm-inf", "value", "centralize"])
@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_row_gradients_are_transformed_as_their_dense_gradient(rng, transform, mode):
    """A row gradient (repeated rows, a no-row entry) is transformed as the dense gradient it
    stands for, and stays a row gradient whose untouched rows stay untouched."""
    table = (5, 3)
    idx = np.array([4, 1, 4, 5, 0])  # 4 twice; 5: no row
    values = rng.standard_normal((5, 3))
    other = rng.standard_normal((2, 2))
    fns = {"norm": lambda gs: optim.clip_grad_norm(gs, 0.5)[0],
           "norm-inf": lambda gs: optim.clip_grad_norm(gs, 0.5, float("inf"))[0],
           "value": lambda gs: optim.clip_grad_value(gs, 0.3),
           "centralize": optim.centralize_gradients}

    def step(i, v, w):
        rows, dense = fns[transform]([go.ops.rows(i, v, table), w])
        assert isinstance(rows, go.Rows) and rows.unique
        return rows.dense(), dense

    got_rows, got_dense = (go.jit(step) if mode == "jit" else step)(idx, values, other)
    dense = np.zeros(table)
    np.add.at(dense, idx[idx < 5], values[idx < 5])
    want_rows, want_dense = fns[transform]([dense, other])
    np.testing.assert_allclose(np.asarray(got_rows), np.asarray(want_rows), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(np.asarray(got_dense), np.asarray(want_dense), rtol=1e-14)
    assert not np.asarray(got_rows)[[2, 3]].any()  # rows no index touched
