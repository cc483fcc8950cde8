"""Optimizers on row gradients: SparseAdam, sparse Adagrad and SGD against numpy references of
torch's sparse formulas (bit for bit) and against torch.optim itself (20 steps, repeated rows,
f32 and f64), LazyAdam and FTRL against references written from docs/optim.md (dense and
rows; Keras's Ftrl on dense gradients where Keras is installed), the rows no gradient
touched left bit-identical, and the dispatch on the kind of gradient."""
import contextlib
import math

import numpy as np
import pytest

import graphopt as go
from graphopt import ops, optim
from graphopt.errors import OptimizerError
# x ** y as graphopt defines it (the C library's pow/powf, on every CPU: docs/ir.md), which
# numpy's own power differs from on AVX-512 CPUs
from graphopt.ir.libm import power as c_power

N, D, K, STEPS = 48, 6, 40, 20
UNTOUCHED = N // 4  # the last rows: no step looks them up


def problem(seed, dtype, repeats=True):
    """A table and 20 row gradients. Values are multiples of 1/64, so that however repeated
    rows are summed (torch's coalesce does not keep their order) the sums are exact."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((N, D)).astype(dtype)
    grads = []
    for _ in range(STEPS):
        touched = N - UNTOUCHED
        idx = rng.integers(0, touched, K) if repeats else rng.permutation(touched)[:K]
        grads.append((idx, (rng.integers(-256, 256, (len(idx), D)) / 64).astype(dtype)))
    return table, grads


def coalesced(idx, values):
    rows = sorted(set(idx.tolist()))
    sums = np.stack([values[idx == r].sum(0) for r in rows])  # exact: see problem()
    return np.array(rows), sums


def S(x, like):
    return like.dtype.type(x)  # a Python float where it meets a tensor of that dtype


# -- references: torch's sparse branches (torch 2.13), and docs/optim.md's formulas ----------------
def sparse_adam(p, st, t, idx, g, o):
    m, v = st.setdefault("m", np.zeros_like(p)), st.setdefault("v", np.zeros_like(p))
    (b1, b2), eps = o.get("betas", (0.9, 0.999)), o.get("eps", 1e-8)
    g = g + S(o.get("weight_decay", 0.0), p) * p[idx]
    m_new = m[idx] + (g - m[idx]) * S(1 - b1, p)
    v_new = v[idx] + (g * g - v[idx]) * S(1 - b2, p)
    d = m_new * S(b1, p) + S(1 - b1, p) * g if o.get("use_nesterov") else m_new
    step = o["lr"] * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    m[idx], v[idx] = m_new, v_new
    p[idx] = p[idx] - S(step, p) * (d / (np.sqrt(v_new) + S(eps, p)))


def adagrad(p, st, t, idx, g, o):
    s = st.setdefault("sum", np.full_like(p, o.get("initial_accumulator_value", 0.0)))
    s[idx] = s[idx] + g * g
    clr = o["lr"] / (1 + (t - 1) * o.get("lr_decay", 0.0))
    p[idx] = p[idx] - S(clr, p) * (g / (np.sqrt(s[idx]) + S(o.get("eps", 1e-10), p)))


def sgd(p, st, t, idx, g, o):
    p[idx] = p[idx] - S(o["lr"], p) * g


def ftrl(w, st, t, idx, g, o):
    """docs/optim.md's FTRL on the rows idx (every row, for a dense gradient)."""
    n = st.setdefault("n", np.full_like(w, o.get("initial_accumulator_value", 0.1)))
    z = st.setdefault("z", np.zeros_like(w))
    lr, power = o["lr"], -o.get("lr_power", -0.5)
    l1, l2, shrink, beta = (o.get(k, 0.0) for k in ("l1", "l2", "l2_shrinkage", "beta"))
    wi, ni = w[idx], n[idx]
    n_new = ni + g * g
    p_new = c_power(n_new, S(power, w))
    z_new = z[idx] + ((g + S(2 * shrink, w) * wi) - (p_new - c_power(ni, S(power, w))) /
                      S(lr, w) * wi)
    quadratic = p_new / S(lr, w) + S(2 * (l2 + beta / (2 * lr)), w)
    w[idx] = (np.minimum(np.maximum(z_new, S(-l1, w)), S(l1, w)) - z_new) / quadratic
    n[idx], z[idx] = n_new, z_new


REFERENCES = {"SparseAdam": sparse_adam, "LazyAdam": sparse_adam, "Adagrad": adagrad,
              "SGD": sgd, "FTRL": ftrl}
CASES = [
    ("SparseAdam", dict(lr=2 ** -6)),
    ("SparseAdam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6)),
    ("LazyAdam", dict(lr=0.01, weight_decay=0.1, use_nesterov=True)),
    ("Adagrad", dict(lr=2 ** -4, initial_accumulator_value=0.1)),
    ("Adagrad", dict(lr=0.05, lr_decay=0.01, eps=1e-6)),
    ("SGD", dict(lr=2 ** -4)),
    ("FTRL", dict(lr=0.1)),
    ("FTRL", dict(lr=0.05, lr_power=-0.7, l1=0.01, l2=0.02, l2_shrinkage=0.01, beta=0.5,
                  initial_accumulator_value=0.2)),
]
IDS = [f"{k}-{i}" for i, (k, _) in enumerate(CASES)]


def run_graphopt(kind, options, table, grads, mode="jit", dense=False):
    p = go.Parameter(table.copy(), name="emb")
    opt = getattr(optim, kind)([p], **options)

    def step(i, v):
        g = ops.rows(i, v, table.shape)
        opt.step([g.dense() if dense else g])

    if mode != "eager":  # "jit": the reference backend (conftest), or "llvm"
        step = go.jit(step, backend=None if mode == "jit" else mode)
    for idx, v in grads:
        step(idx, v)
    return p.numpy()


def run_reference(kind, options, table, grads, dense=False):
    p, state = table.copy(), {}
    every = np.arange(len(table))
    for t, (idx, v) in enumerate(grads, 1):
        rows, g = coalesced(idx, v)
        if dense:
            full = np.zeros_like(p)
            full[rows] = g
            rows, g = every, full
        REFERENCES[kind](p, state, t, rows, g, options)
    return p


@pytest.mark.parametrize("kind, options", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("mode", ["jit", "eager", "llvm"])
def test_matches_the_reference_bit_for_bit(kind, options, dtype, mode):
    table, grads = problem(0, dtype)
    got = run_graphopt(kind, options, table, grads, mode)
    want = run_reference(kind, options, table, grads)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[-UNTOUCHED:], table[-UNTOUCHED:])  # bit-identical


@pytest.mark.parametrize("kind, options", [c for c in CASES if c[0] in ("LazyAdam", "FTRL")],
                         ids=[i for i, c in zip(IDS, CASES) if c[0] in ("LazyAdam", "FTRL")])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_dense_gradients_update_every_element(kind, options, dtype):
    table, grads = problem(1, dtype)
    got = run_graphopt(kind, options, table, grads, dense=True)
    np.testing.assert_array_equal(got, run_reference(kind, options, table, grads, dense=True))
    if kind == "FTRL":  # a dense step sets the untouched rows' weights from z (= 0)
        assert not np.array_equal(got[-UNTOUCHED:], table[-UNTOUCHED:])


def test_lazy_adam_is_sparse_adam_on_rows_and_reads_them_once():
    table, grads = problem(2, np.float32)
    lazy = run_graphopt("LazyAdam", dict(lr=0.01), table, grads)
    np.testing.assert_array_equal(lazy, run_graphopt("SparseAdam", dict(lr=0.01), table, grads))
    p = go.Parameter(table.copy(), name="emb")
    opt = optim.LazyAdam([p])
    graph = go.jit(lambda i, v: opt.step([ops.rows(i, v, table.shape)]),
                   passes="").lower(*grads[0]).graph
    assert [n.op for n in graph.nodes].count("coalesce") == 1


# -- against torch.optim ---------------------------------------------------------------------------
torch = None


def run_torch(kind, options, table, grads, ieee_sqrt=False):
    global torch
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.from_numpy(table.copy()))
    opt = getattr(torch.optim, kind)([p], **options)
    with _ieee_sqrt(ieee_sqrt):
        for idx, v in grads:
            p.grad = torch.sparse_coo_tensor(torch.from_numpy(idx[None]), torch.from_numpy(v),
                                             table.shape)
            opt.step()
    return p.detach().numpy()


@contextlib.contextmanager
def _ieee_sqrt(on):
    """torch's in-place sqrt (the one its sparse optimizers call) correctly rounded: taken in
    f64 and rounded once, which for sqrt is the correctly rounded f32 result."""
    if not on:
        yield
        return
    own = torch.Tensor.sqrt_
    torch.Tensor.sqrt_ = lambda t: t.copy_(own(t.double()))
    try:
        yield
    finally:
        torch.Tensor.sqrt_ = own


# Per element, |graphopt - torch| <= bound · max(|torch|, |initial|): 1e-15 in f64, 1e-7 in f32
# where torch does the same arithmetic. Where it does not, the bound is what its difference
# adds up to over the 20 steps:
# - torch's own f32 sqrt is not correctly rounded (1 ulp off for about 1 result in 6, on AVX2
#   and on its default CPU path alike, torch 2.13): the "ieee" runs give its optimizers a
#   correctly rounded one (`_ieee_sqrt`), the "torch" runs keep its own: 2e-6;
# - torch's sparse Adagrad adds -clr·(g/std) into p with one rounding (an axpy, fused): 4e-7;
# - torch's sparse SGD adds repeated rows into p one by one (graphopt sums them first, as
#   coalescing does): 2e-7 in f32, 1e-14 in f64.
TORCH = [c for c in CASES if c[0] in ("SparseAdam", "Adagrad", "SGD")]
F32_APART = {"Adagrad": 4e-7, ("SGD", True): 2e-7}


def torch_bound(kind, dtype, repeats, sqrt):
    if dtype == np.float64:
        return 1e-14 if kind == "SGD" and repeats else 1e-15
    if sqrt == "torch":
        return 2e-6
    return F32_APART.get(kind, F32_APART.get((kind, repeats), 1e-7))


@pytest.mark.parametrize("kind, options", TORCH, ids=[f"{k}-{i}" for i, (k, _) in enumerate(TORCH)])
@pytest.mark.parametrize("dtype, sqrt", [(np.float32, "ieee"), (np.float32, "torch"),
                                         (np.float64, "torch")], ids=["f32", "f32-torch-sqrt", "f64"])
@pytest.mark.parametrize("repeats", [True, False], ids=["repeats", "distinct"])
def test_matches_torch(kind, options, dtype, sqrt, repeats):
    table, grads = problem(3, dtype, repeats)
    got = run_graphopt(kind, options, table, grads)
    want = run_torch(kind, options, table, grads, ieee_sqrt=sqrt == "ieee")
    scale = np.maximum(np.abs(want), np.abs(table))
    bound = torch_bound(kind, dtype, repeats, sqrt)
    assert (np.abs(got - want) <= bound * scale).all(), np.max(np.abs(got - want) / scale)
    if kind == "SGD" and not repeats:  # p - lr·g with lr a power of 2: torch's FMA agrees
        np.testing.assert_array_equal(got, want)
    if kind == "SparseAdam" and sqrt == "ieee":  # the same arithmetic, step for step
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[-UNTOUCHED:], table[-UNTOUCHED:])


def test_sgd_with_momentum_keeps_torchs_dense_buffer():
    table, grads = problem(4, np.float64)
    options = dict(lr=0.05, momentum=0.9)
    got = run_graphopt("SGD", options, table, grads)
    want = run_torch("SGD", options, table, grads)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    dense = run_graphopt("SGD", options, table, grads, dense=True)
    np.testing.assert_array_equal(got, dense)


def test_ftrl_matches_keras_on_dense_gradients():
    keras = pytest.importorskip("keras", reason="Keras is not installed: its Ftrl is optional")
    table, grads = problem(5, np.float32)
    options = dict(lr=0.1, l1=0.01, l2=0.02, l2_shrinkage=0.01)
    got = run_graphopt("FTRL", options, table, grads, dense=True)
    v = keras.Variable(table.copy())
    opt = keras.optimizers.Ftrl(learning_rate=0.1, l1_regularization_strength=0.01,
                                l2_regularization_strength=0.02,
                                l2_shrinkage_regularization_strength=0.01)
    for idx, g in grads:
        rows, sums = coalesced(idx, g)
        full = np.zeros_like(table)
        full[rows] = sums
        opt.apply_gradients([(keras.ops.convert_to_tensor(full), v)])
    np.testing.assert_allclose(got, np.asarray(v), rtol=1e-5, atol=1e-6)


# -- dispatch ------------------------------------------------------------------------------------
def test_each_parameter_gets_the_rule_of_its_gradients_kind():
    rng = np.random.default_rng(6)
    t0, w0, g_w = (rng.standard_normal(s) for s in ((N, D), (3, 2), (3, 2)))
    table, weight = go.Parameter(t0, name="table"), go.Parameter(w0, name="w")
    opt = optim.LazyAdam([table, weight], lr=0.01)
    idx, v = problem(6, np.float64)[1][0]
    go.jit(lambda i, v, gw: opt.step([ops.rows(i, v, (N, D)), gw]))(idx, v, g_w)
    np.testing.assert_array_equal(table.numpy(),
                                  run_reference("LazyAdam", dict(lr=0.01), t0, [(idx, v)]))
    p, state = w0.copy(), {}
    sparse_adam(p, state, 1, np.arange(3), g_w, dict(lr=0.01))  # every row: the dense rule
    np.testing.assert_array_equal(weight.numpy(), p)


def test_a_gradient_of_a_kind_without_a_rule_is_refused_before_anything_changes():
    table = go.Parameter(np.ones((4, 2)), name="table")
    rows = ops.rows(np.array([1]), np.ones((1, 2)), (4, 2))
    adam = optim.Adam([table])
    with pytest.raises(OptimizerError, match="'table' is a row gradient .*Optimizers that "
                                             "take row gradients: Adagrad, FTRL, LazyAdam, "
                                             "SGD, SparseAdam"):
        adam.step([rows])
    with pytest.raises(OptimizerError, match="SparseAdam takes row gradients only"):
        optim.SparseAdam([table]).step([np.ones((4, 2))])
    with pytest.raises(OptimizerError, match="the gradient of 'table' is rows<1, f64\\[5,2\\]>"):
        optim.SparseAdam([table]).step([ops.rows(np.array([1]), np.ones((1, 2)), (5, 2))])
    np.testing.assert_array_equal(table.numpy(), 1)
    assert adam.step_count.numpy() == 0


def test_where_false_leaves_every_row_and_state():
    table, grads = problem(7, np.float32)
    p = go.Parameter(table.copy(), name="emb")
    opt = optim.SparseAdam([p])
    step = go.jit(lambda i, v, ok: opt.step([ops.rows(i, v, table.shape)], where=ok))
    step(*grads[0], np.bool_(True))
    before = p.numpy(), opt.state["emb"]["exp_avg"].numpy()
    step(*grads[1], np.bool_(False))
    np.testing.assert_array_equal(p.numpy(), before[0])
    np.testing.assert_array_equal(opt.state["emb"]["exp_avg"].numpy(), before[1])


def test_master_weights_and_bf16_state_on_rows():
    table = (np.random.default_rng(8).standard_normal((N, D))).astype(np.float16)
    p = go.Parameter(table, name="emb")
    opt = optim.SparseAdam([p], lr=0.01, state_dtype=go.bf16)
    idx, v = problem(8, np.float32)[1][0]
    go.jit(lambda i, v: opt.step([ops.rows(i, v, (N, D))]))(idx, v)
    master = opt.state["emb"]["master"].numpy()
    touched = np.unique(idx)
    assert not np.array_equal(master[touched], table[touched].astype(np.float32))
    np.testing.assert_array_equal(p.numpy(), master.astype(np.float16))
    untouched = np.setdiff1d(np.arange(N), touched)
    np.testing.assert_array_equal(p.numpy()[untouched], table[untouched])


@pytest.mark.parametrize("kind", ["SparseAdam", "LazyAdam"])
@pytest.mark.parametrize("mode", ["jit", "llvm"])
def test_per_row_step_corrects_each_row_by_its_own_count(kind, mode):
    table, grads = problem(9, np.float32)
    got = run_graphopt(kind, dict(lr=0.01, per_row_step=True), table, grads, mode)
    p, m, v, count = table.copy(), *(np.zeros_like(table) for _ in range(3))
    f = np.float32
    for idx, values in grads:
        rows, g = coalesced(idx, values)
        m[rows] = m[rows] + (g - m[rows]) * f(1 - 0.9)
        v[rows] = v[rows] + (g * g - v[rows]) * f(1 - 0.999)
        count[rows] += 1  # each row's own t: per element, in f32
        t = count[rows]
        step = f(0.01) * np.sqrt(f(1) - c_power(f(0.999), t)) / (f(1) - c_power(f(0.9), t))
        p[rows] = p[rows] - step * (m[rows] / (np.sqrt(v[rows]) + f(1e-8)))
    np.testing.assert_array_equal(got, p)
    assert not np.array_equal(got, run_graphopt(kind, dict(lr=0.01), table, grads, mode))


def test_per_row_step_needs_a_state_dtype_that_counts():
    with pytest.raises(OptimizerError, match="per_row_step counts in the state dtype, bf16"):
        optim.SparseAdam([go.Parameter(np.ones((3, 2)), name="t")], per_row_step=True,
                         state_dtype=go.bf16)


@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_accumulate_refuses_row_gradients_and_changes_nothing(mode):
    table, grads = problem(10, np.float32)
    p = go.Parameter(table.copy(), name="emb")
    acc = optim.Accumulate(optim.SparseAdam([p]), steps=2)

    def step(i, v):
        acc.step([ops.rows(i, v, table.shape)])

    with pytest.raises(OptimizerError, match="'emb' is a row gradient.*g.dense"):
        (go.jit(step) if mode == "jit" else step)(*grads[0])
    np.testing.assert_array_equal(p.numpy(), table)
    assert int(acc.count.numpy()) == 0
