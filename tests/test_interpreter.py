"""The numpy interpreter: runs any valid graph in order, commits assigns only at the end,
lets NaN and Inf through silently, and hands out results that alias nothing."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphopt as go
from graphopt import ops
from graphopt.backends import base, get_backend, interpreter
from graphopt.errors import ExecutionError

# Bit-for-bit comparisons with numpy: on the reference backend (see conftest.py).
pytestmark = pytest.mark.usefixtures("reference_backend")


def inputs_by_name(graph: go.Graph, **arrays) -> dict:
    return {v: arrays[v.name] for v in graph.inputs}


def assert_same(got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


STEP = """
graph step {
  param @w: f64[3]
  param @m: f64[3]
  arg %g: f64[3]
  arg %lr: f64[]
  %0 = constant {value=0.9} : f64[]
  %1 = multiply %0, @m : f64[3]
  %2 = add %1, %g : f64[3]
  %3 = multiply %lr, %2 : f64[3]
  %4 = subtract @w, %3 : f64[3]
  %5 = sum @w {axes=[0], keepdims=false} : f64[]
  %6 = assign @w, %4 after(%5) : token
  %7 = assign @m, %2 : token
  return %5, %4 after(%6, %7)
}
"""


def test_runs_a_hand_written_graph(rng):
    g = go.parse(STEP).verify()
    w, m, grad = rng.standard_normal((3, 3))
    w_in, m_in = w.copy(), m.copy()
    outputs, updates = interpreter.run(g, inputs_by_name(g, w=w, m=m, g=grad, lr=np.array(0.5)))
    new_m = 0.9 * m + grad
    new_w = w - 0.5 * new_m
    assert len(outputs) == 2
    assert_same(outputs[0], np.sum(w))  # the old @w: read before its assign
    assert_same(outputs[1], new_w)
    assert set(updates) == {"w", "m"}
    assert_same(updates["w"], new_w)
    assert_same(updates["m"], new_m)
    # The interpreter commits nothing itself: its input buffers are as they were.
    assert_same(w, w_in)
    assert_same(m, m_in)


def test_runs_nodes_in_graph_order(rng, monkeypatch):
    g = go.parse(STEP)
    seen = []
    real = base.evaluator  # (each node's numpy function, made once per program)

    def spy(op, attrs, in_types, out_types):
        compute = real(op, attrs, in_types, out_types)

        def run(arrays):
            seen.append(op.name)
            return compute(arrays)
        return run

    monkeypatch.setattr(base, "evaluator", spy)
    w, m, grad = rng.standard_normal((3, 3))
    interpreter.run(g, inputs_by_name(g, w=w, m=m, g=grad, lr=np.array(0.1)))
    assert seen == [n.op for n in g.nodes if n.op != "assign"]


def test_depend_and_after_edges(rng):
    text = """
graph dep {
  param @p: f32[2]
  arg %x: f32[2]
  %0 = exp %x : f32[2]
  %1 = multiply @p, %x : f32[2]
  %2 = assign @p, %0 after(%1) : token
  %3 = depend %1 after(%2) : f32[2]
  %4 = add %3, %0 : f32[2]
  return %4 after(%2)
}
"""
    g = go.parse(text).verify()
    p = rng.standard_normal(2).astype(np.float32)
    x = rng.standard_normal(2).astype(np.float32)
    outputs, updates = interpreter.run(g, inputs_by_name(g, p=p, x=x))
    # %1 read @p before the assign; depend passes it through, ordered after the effect.
    assert_same(outputs[0], p * x + np.exp(x))
    assert_same(updates["p"], np.exp(x))


def test_failure_after_an_assign_node_changes_nothing():
    text = """
graph late_failure {
  param @k: i64[3]
  arg %e: i64[3]
  %0 = constant {value=1} : i64[]
  %1 = add @k, %0 : i64[3]
  %2 = assign @k, %1 : token
  %3 = power %1, %e : i64[3]  loc("train.py":7)
  return %3 after(%2)
}
"""
    g = go.parse(text).verify()
    k = np.array([1, 2, 3])
    with pytest.raises(ExecutionError, match="power failed") as info:
        interpreter.run(g, inputs_by_name(g, k=k, e=np.array([1, -1, 1])))
    assert info.value.loc.line == 7 and "train.py:7" in str(info.value)
    assert_same(k, np.array([1, 2, 3]))


def test_nan_and_inf_pass_through_without_warnings():
    x = np.array([0.0, -1.0, np.inf, -np.inf, np.nan, 1e300], np.float64)

    def step(x):
        a = ops.log(x) + ops.sqrt(x)  # -inf, nan
        b = x / (x * 0) + ops.exp(x * 10)  # 0/0, inf/0 and overflow
        c = ops.maximum(x, 0.0) - ops.minimum(x, 0.0) * np.inf
        big = (x * 1e10).astype("f16")  # overflow in a cast
        i = ops.where(ops.isfinite(x), x, 0.0).astype("i32")
        return a, b, c, big, i, ops.isfinite(a + b)

    with np.errstate(all="raise"), warnings.catch_warnings():
        warnings.simplefilter("error")
        jitted = go.jit(step)(x)
        eager = [t.numpy() for t in step(go.EagerTensor(x))]
    with np.errstate(all="ignore"):
        want = (np.log(x) + np.sqrt(x), x / (x * 0) + np.exp(x * 10),
                np.maximum(x, 0.0) - np.minimum(x, 0.0) * np.inf,
                (x * 1e10).astype(np.float16),
                np.where(np.isfinite(x), x, 0.0).astype(np.int32))
        want = want + (np.isfinite(want[0] + want[1]),)
    for j, e, w in zip(jitted, eager, want):
        assert_same(j, w)
        assert_same(e, w)
    assert np.isnan(jitted[0][1]) and np.isneginf(jitted[0][0])


def test_nan_in_a_parameter_is_kept_bit_for_bit():
    nan_with_payload = np.array([0x7FF8000000000123], np.uint64).view(np.float64)
    p = go.Parameter(np.concatenate([nan_with_payload, [-0.0, np.inf]]), name="p")
    q = go.Parameter(np.zeros(3), name="q")
    before = p.numpy().tobytes()
    go.jit(lambda: go.assign(q, p))()  # a copy moves the bits
    assert q.numpy().tobytes() == before
    assert p.numpy().tobytes() == before


def test_outputs_are_copies(rng):
    p0 = rng.standard_normal((2, 3))
    p = go.Parameter(p0, name="p")
    q = go.Parameter(p0, name="q")
    x = rng.standard_normal(3)
    x_in = x.copy()

    @go.jit
    def step(x):
        go.assign(q, q * 2)
        return p, p.T, p.reshape(-1), q, x, ops.broadcast_to(x, (2, 3))

    outs = step(x)
    for o in outs:
        assert isinstance(o, np.ndarray) and o.flags.writeable and o.flags.owndata
        o[...] = 0  # scribbling on a result changes no Parameter and no argument
    assert_same(p.numpy(), p0)
    assert_same(q.numpy(), p0 * 2)
    assert_same(x, x_in)
    outs = step(x)  # and not the next step's results
    assert_same(outs[0], p0)
    assert_same(outs[3], p0 * 4)


def test_output_read_before_assign_is_the_old_value(rng):
    p0 = rng.standard_normal((2, 2))
    p = go.Parameter(p0, name="p")

    @go.jit
    def step():
        old = p.T  # a view of @p's buffer in the interpreter
        go.assign(p, p + 1)
        return old, p

    old, new = step()
    assert_same(old, p0.T)
    assert_same(new, p0 + 1)
    assert_same(p.numpy(), p0 + 1)


def test_commit_of_values_that_view_parameter_buffers(rng):
    a0, b0 = rng.standard_normal(4), rng.standard_normal(4)
    a, b = go.Parameter(a0, name="a"), go.Parameter(b0, name="b")

    def swap():
        ra, rb = a.reshape(2, 2).reshape(-1), b.reshape(-1)  # views of the two buffers
        go.assign(a, rb)
        go.assign(b, ra)

    go.jit(swap)()
    assert_same(a.numpy(), b0)
    assert_same(b.numpy(), a0)


def test_parameter_buffer_is_updated_in_place(rng):
    p = go.Parameter(rng.standard_normal(3), name="p")
    buffer = p._value
    go.jit(lambda g: go.assign(p, p - g))(np.ones(3))
    assert p._value is buffer


LABELS, ROWS = np.array([0, 2]), np.array([1, 0, 1])


def network_ops(x, y):
    """sin/cos (schedules) and the activations, losses and indexing ops of small networks,
    and row gradients: three rows of x's shape, rows 1, 0, 1 (y[1], y[0], y[1])."""
    r = ops.rows(ROWS, ops.gather(y, ROWS), x.shape)
    c = ops.coalesce(r)
    return [ops.sin(x), ops.cos(x), ops.relu(x - 1), ops.tanh(x), ops.sigmoid(x), ops.softplus(x), ops.gelu(x),
            ops.stop_gradient(x), ops.log_softmax(x), ops.softmax_cross_entropy(x, LABELS),
            ops.mse_loss(x, y), ops.gather(x, ROWS), ops.scatter_add(x, ROWS[:2], y),
            ops.embedding(x, ROWS, sparse=True), ops.rows_indices(c),
            ops.rows_values(ops.with_values(c, ops.take_rows(x, c))), ops.densify(r),
            ops.put_rows(x, c)]


def network_ops_numpy(x, y):
    shifted = x - x.max(-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return [np.sin(x), np.cos(x), np.maximum(x - 1, 0), np.tanh(x), np.exp(-np.logaddexp(0, -x)), np.logaddexp(0, x),
            0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), x,
            log_softmax, -log_softmax[[0, 1], LABELS].mean(), np.mean((x - y) ** 2), x[ROWS],
            x + y[[1, 0]],  # row 1 gets y[0], row 0 gets y[1]
            x[ROWS], np.array([1, 0, 2]),  # coalesced: rows 1, 0 where they first come, no row
            np.stack([x[1], x[0], np.zeros(3)]), np.stack([y[0], 2 * y[1]]),
            np.stack([y[0], 2 * y[1]])]


def test_every_op_in_the_registry_runs(rng):
    """A trace that uses each elementwise/reduction/shape/linalg op, against numpy."""
    x = rng.uniform(0.5, 2.0, (2, 3))
    y = rng.uniform(0.5, 2.0, (2, 3))

    def step(x, y):
        return [ops.add(x, y), ops.subtract(x, y), ops.multiply(x, y), ops.divide(x, y),
                ops.power(x, y), ops.maximum(x, y), ops.minimum(x, y), ops.negative(x),
                ops.abs(x - 1), ops.sign(x - 1), ops.sqrt(x), ops.rsqrt(x), ops.exp(x),
                ops.log(x), ops.isfinite(x), ops.less(x, y), ops.less_equal(x, y),
                ops.greater(x, y), ops.greater_equal(x, y), ops.equal(x, y),
                ops.not_equal(x, y), ops.logical_and(x > 1, y > 1),
                ops.logical_or(x > 1, y > 1), ops.logical_not(x > 1),
                ops.where(x > y, x, y), ops.cast(x, "f32"), ops.sum(x, 1), ops.max(x, 0),
                ops.mean(x), ops.reshape(x, (3, 2)), ops.broadcast_to(x, (4, 2, 3)),
                ops.transpose(x), ops.matmul(x, ops.transpose(y)), ops.full((2,), 3.0),
                ops.depend(x, y), ops.slice(x, (1, 2), (2, -1), (1, -2)),
                ops.slice_scatter(x, y[:1], (0, 0), (1, 3)), *network_ops(x, y),
                # in the world of this one process, each collective gives x back
                ops.all_reduce(x, "mean"), ops.reduce_scatter(x), ops.all_gather(x),
                ops.broadcast(x), ops.shard(x), ops.all_reduce_when(x, True, 2, "mean")]

    want = [x + y, x - y, x * y, x / y, x ** y, np.maximum(x, y), np.minimum(x, y), -x,
            np.abs(x - 1), np.sign(x - 1), np.sqrt(x), 1 / np.sqrt(x), np.exp(x), np.log(x),
            np.isfinite(x), x < y, x <= y, x > y, x >= y, x == y, x != y, (x > 1) & (y > 1),
            (x > 1) | (y > 1), ~(x > 1), np.where(x > y, x, y), x.astype(np.float32),
            x.sum(1), x.max(0), x.mean(), x.reshape(3, 2), np.broadcast_to(x, (4, 2, 3)), x.T,
            x @ y.T, np.full(2, 3.0, np.float32), x, x[1:2, 2::-2],
            np.concatenate([y[:1], x[1:]]), *network_ops_numpy(x, y), x, x, x, x, x, x]
    graph = go.trace(step, x, y)
    used = {n.op for n in graph.nodes}
    assert used == set(ops.__all__) - {"assign", "cast", "full", "zeros", "ones", "full_like",
                                       "zeros_like", "ones_like", "softmax", "one_hot",
                                       "arange", "asarray", "index", "index_update"} | \
        {"cast", "constant"}
    got = go.jit(step)(x, y)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-15, err_msg=f"output {i}")
        assert g.dtype == np.asarray(w).dtype, i


def test_backend_registry():
    assert get_backend("interpreter") is interpreter
    exe = go.jit(lambda x: x + 1).lower(np.ones(2))  # GRAPHOPT_BACKEND=interpreter here
    assert exe.backend_name == "interpreter"
    exe(np.ones(2))
    assert exe.last_step_seconds is not None and exe.last_step_seconds >= 0


DEAD_EFFECTS = """
graph step {
  param @w: f64[3]
  param @m: f64[3]
  arg %g: f64[3]
  %0 = add @w, %g : f64[3]
  %1 = assign @w, %0 : token
  %2, %3 = kernel @m, %g {spaces=[[3]], outputs=["map"], shared=[]} : f64[3], token {
    arg %x0: f64[]
    arg %x1: f64[]
    %0 = multiply %x0, %x1 : f64[]
    %1 = store %x0, %0 : token
    return %0 after(%1)
  }
  return %0
}
"""


@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_effects_the_return_does_not_reach_do_not_run(backend, rng):
    """DESIGN: an effect is live only if the return reaches it. Both backends run what dce
    keeps, so a graph means the same before and after dce."""
    g = go.parse(DEAD_EFFECTS).verify()
    w, m, grad = rng.standard_normal((3, 3))
    for graph in (g, go.passes.run(g, "dce").graph):
        m_buffer = m.copy()  # the LLVM backend stores in place into the buffer it is given
        inputs = {v: {"w": w, "m": m_buffer, "g": grad}[v.name] for v in graph.inputs}
        outputs, updates = get_backend(backend).compile(graph).run(inputs)
        assert_same(outputs[0], w + grad)
        assert updates == {} and np.array_equal(m_buffer, m)
    assert len(go.passes.run(g, "dce").graph.nodes) == 1


@given(rows=st.integers(1, 9), width=st.integers(0, 5), k=st.integers(0, 80),
       dtype=st.sampled_from(["f32", "f64", "bf16", "i32"]), seed=st.integers(0, 2 ** 16))
@settings(max_examples=60, deadline=None)
def test_scatter_add_is_numpys_add_at_bit_for_bit(rows, width, k, dtype, seed):
    """scatter_add adds in layers of distinct rows, or, past 32 repeats of a row, by each
    element's flat position (numpy's quick 1-D add.at): either way the same additions, in the
    same order, as add.at over rows, repeated and negative rows too."""
    rng = np.random.default_rng(seed)
    np_dtype = go.ir.to_dtype(dtype).np_dtype
    x = (rng.standard_normal((rows, width)) * 100).astype(np_dtype)
    idx = rng.integers(-rows, rows, k)
    upd = (rng.standard_normal((k, width)) * 100).astype(np_dtype)
    want = x.copy()
    np.add.at(want, idx, upd)
    got = np.asarray(go.jit(ops.scatter_add, backend="interpreter")(x, idx, upd))
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))
    with pytest.raises(ExecutionError, match=f"index {rows} is out of bounds for axis 0"):
        go.jit(ops.scatter_add, backend="interpreter")(x, np.array([0, rows]),
                                                       np.ones((2, width), np_dtype))
