"""Row gradients: the rows type (text form, verifier, drawing), the ops on it against plain
numpy, ops.embedding's row VJP against gather's dense one (hypothesis: sizes, repeated ids,
padding_idx, no ids at all), eager and under jit, and row gradients as step arguments and
results."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphopt as go
from graphopt import ops
from graphopt.errors import AssignError, ExecutionError, OpTypeError, VerifyError
from graphopt.ir import parse
from graphopt.ir.types import RowsType, TensorType, f32


def reference_coalesce(idx, values, n):
    """Each index once, where it first comes, the sum of its duplicates in the order they
    come; later duplicates and no-row entries the index n with zeros: what ops.coalesce
    gives, by a Python loop."""
    first = {}
    out_idx = np.full(len(idx), n)
    out = np.zeros_like(values)
    for k, (i, v) in enumerate(zip(idx.tolist(), values)):
        if i < n and i in first:
            out[first[i]] += v
        elif i < n:
            first[i] = k
            out_idx[k], out[k] = i, v
    return out_idx, out


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 6), k=st.integers(0, 20), d=st.integers(1, 3), seed=st.integers(0, 99),
       dtype=st.sampled_from([np.float32, np.float64, np.float16]))
def test_coalesce_sums_duplicates_in_order(n, k, d, seed, dtype):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n + 1, k)  # n: no row
    values = rng.standard_normal((k, d)).astype(dtype)
    got = ops.coalesce(ops.rows(idx, values, (n, d)))
    assert got.unique and got.type == RowsType(k, TensorType((n, d), go.ir.to_dtype(dtype)), True)
    want_idx, want = reference_coalesce(idx, values.astype(np.float32 if dtype == np.float16
                                                           else dtype), n)
    np.testing.assert_array_equal(got.indices.numpy(), want_idx)
    np.testing.assert_array_equal(got.values.numpy(), want.astype(dtype))
    dense = np.zeros((n, d), dtype)
    for i, v in zip(idx, values):
        if i < n:
            dense[i] += v
    np.testing.assert_allclose(ops.densify(ops.rows(idx, values, (n, d))).numpy(), dense,
                               rtol=1e-3 if dtype == np.float16 else 1e-12)


def test_many_duplicates_of_a_row_take_numpys_add_at():
    idx = np.array([2] * 30 + [0, 2])
    values = np.arange(32.0)[:, None]
    got = ops.coalesce(ops.rows(idx, values, (4, 1)))
    np.testing.assert_array_equal(got.indices.numpy(), [2] + [4] * 29 + [0, 4])
    np.testing.assert_array_equal(got.values.numpy()[[0, 30], 0], [sum(range(30)) + 31.0, 30.0])
    assert not got.values.numpy()[1:30].any() and not got.values.numpy()[31:].any()


def test_take_put_and_assign_rows_leave_the_other_rows():
    x = np.arange(12.0).reshape(6, 2)
    r = ops.coalesce(ops.rows(np.array([4, 6, 1]), -np.ones((3, 2)), (6, 2)))
    np.testing.assert_array_equal(ops.take_rows(x, r).numpy(), [x[4], [0, 0], x[1]])
    want = x.copy()
    want[[1, 4]] = -1
    np.testing.assert_array_equal(ops.put_rows(x, r).numpy(), want)
    p = go.Parameter(x, name="p")
    go.jit(lambda i, v: go.assign(p, ops.coalesce(ops.rows(i, v, (6, 2)))))(
        np.array([4, 6, 1]), -np.ones((3, 2)))
    np.testing.assert_array_equal(p.numpy(), want)


def test_only_unique_rows_are_assigned():
    p = go.Parameter(np.zeros((3, 2)), name="p")
    with pytest.raises(AssignError, match="coalesce them first"):
        go.assign(p, ops.rows(np.array([1]), np.ones((1, 2)), (3, 2)))


def test_a_read_after_a_row_assign_sees_the_new_rows():
    p = go.Parameter(np.zeros((3, 2)), name="p")

    @go.jit(backend="interpreter")
    def step(v):
        go.assign(p, ops.coalesce(ops.rows(np.array([2]), v, (3, 2))))
        return p * 1

    np.testing.assert_array_equal(step(np.ones((1, 2))), [[0, 0], [0, 0], [1, 1]])
    assert "put_rows" in str(step.lower(np.ones((1, 2))).graph)


@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_an_index_out_of_range_fails_the_step_and_changes_nothing(backend):
    table = go.Parameter(np.ones((5, 2), np.float32), name="table")
    opt = go.optim.SparseAdam([table])

    @go.jit(backend=backend)
    def step(i, v):
        opt.step([ops.rows(i, v, (5, 2))])

    step(np.array([0, 5]), np.ones((2, 2), np.float32))  # 5: no row
    before = table.numpy(), opt.state["table"]["exp_avg"].numpy(), opt.step_count.numpy()
    for bad in (6, -1):
        with pytest.raises(ExecutionError, match=f"rows: index {bad} is outside"):
            step(np.array([0, bad]), np.ones((2, 2), np.float32))
    after = table.numpy(), opt.state["table"]["exp_avg"].numpy(), opt.step_count.numpy()
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ExecutionError, match="embedding: index 5 is outside"):
        go.jit(lambda ids: ops.embedding(table, ids), backend=backend)(np.array([5]))


def test_the_rows_type_prints_parses_verifies_and_draws():
    text = """graph g {  # bytes per run: 200 B (read 112 B, written 88 B)
  arg %i: i64[3]
  arg %v: f32[3,2]
  param @p: f32[5,2]
  %0 = rows %i, %v : rows<3, f32[5,2]>
  %1 = coalesce %0 : rows<3, f32[5,2], unique>
  %2 = take_rows @p, %1 : f32[3,2]
  %3 = with_values %1, %2 : rows<3, f32[5,2], unique>
  %4 = assign @p, %3 : token
  %5 = rows_values %0 : f32[3,2]
  return %5 after(%4)
}"""
    g = parse(text)
    assert str(g) == text
    g.verify()
    assert "rows&lt;3, f32[5,2]&gt;" in g.to_dot().source or "rows<3, f32[5,2]>" in \
        g.to_dot().source
    with pytest.raises(VerifyError, match="assign: rows"):
        parse(text.replace("%4 = assign @p, %3", "%4 = assign @p, %0")).verify()
    with pytest.raises(VerifyError, match="returns? gives the row gradient"):
        parse(text.replace("return %5 after(%4)", "return %1 after(%4)")).verify()
    with pytest.raises(VerifyError, match="not a tensor operand"):
        parse(text.replace("%5 = rows_values %0", "%5 = negative %0")).verify()
    with pytest.raises(go.errors.ParseError, match="unique"):
        parse(text.replace("f32[5,2], unique>", "f32[5,2], sorted>"))


def test_rows_are_step_arguments_and_results():
    r = ops.rows(np.array([3, 1, 3]), np.ones((3, 2), np.float32), (4, 2))
    got = go.jit(lambda r: ops.coalesce(r))(r)
    assert isinstance(got, go.Rows) and got.type == RowsType(3, TensorType((4, 2), f32), True)
    np.testing.assert_array_equal(got.indices.numpy(), [3, 1, 4])
    np.testing.assert_array_equal(got.dense().numpy(), r.dense().numpy())
    with pytest.raises(go.GraphoptError, match="pass it to the step as an argument"):
        go.jit(lambda: ops.coalesce(r))()
    with pytest.raises(OpTypeError, match="not a tensor operand"):
        ops.add(r, 1.0)


def lookups(data):
    n = data.draw(st.integers(1, 6))
    row = data.draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
    ids = data.draw(st.lists(st.integers(0, n - 1), max_size=12))  # repeats are likely
    shape = data.draw(st.sampled_from([(len(ids),), (1, len(ids))]))
    pad = data.draw(st.sampled_from([None, *range(-n, n)]))
    seed = data.draw(st.integers(0, 99))
    return n, row, np.array(ids, np.int64).reshape(shape), pad, seed


@settings(max_examples=40, deadline=None)
@given(data=st.data(), jit=st.booleans())
def test_the_row_vjp_densified_is_the_dense_vjp(data, jit):
    n, row, ids, pad, seed = lookups(data)
    rng = np.random.default_rng(seed)
    table = go.Parameter(rng.standard_normal((n,) + row), name="table")
    ct = rng.standard_normal(ids.shape + row)

    def loss(sparse):
        return lambda: (ops.embedding(table, ids, sparse=sparse, padding_idx=pad) * ct).sum()

    def grad(sparse):
        f = go.value_and_grad(loss(sparse), wrt=table)
        return (go.jit(f, backend="interpreter") if jit else f)()[1]

    rows, dense = grad(True), grad(False)
    assert isinstance(rows, go.Rows) and rows.num_rows == ids.size
    # gather's dense VJP, with the padding row's gradient zero
    want = go.value_and_grad(lambda: (ops.gather(table, ids) * ct).sum(), wrt=table)()[1].numpy()
    if pad is not None:
        want[pad % n] = 0
    np.testing.assert_array_equal(rows.dense().numpy(), want)
    np.testing.assert_array_equal(np.asarray(dense), want)
    if pad is not None:  # the padding row's lookups are no rows
        assert not np.isin(pad % n, rows.indices.numpy())


def test_cotangents_of_two_lookups_add_up():
    table = go.Parameter(np.arange(8.0).reshape(4, 2), name="table")
    a, b = np.array([1, 2]), np.array([2, 3])
    two = go.value_and_grad(lambda: (ops.embedding(table, a, sparse=True) ** 2).sum() +
                            ops.embedding(table, b, sparse=True).sum(), wrt=table)()[1]
    assert isinstance(two, go.Rows) and two.num_rows == 4
    mixed = go.value_and_grad(lambda: (ops.embedding(table, a, sparse=True) ** 2).sum() +
                              table.sum(), wrt=table)()[1]
    want = np.ones((4, 2))
    want[a] += 2 * table.numpy()[a]
    np.testing.assert_array_equal(mixed.numpy(), want)
    want[3] += 1
    want[2] += 1
    np.testing.assert_array_equal(two.dense().numpy() + 1, want)
