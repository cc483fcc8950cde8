"""Row kernels: an optimizer's row rule becomes one row kernel (rowfuse), several tables share
one (hfuse), the LLVM backend compiles it, and a compiled step gives the interpreter's bits
(hypothesis: table and row sizes, K, repeated ids, no ids, padding_idx, dtypes, one or two
threads); its cost grows with the rows touched, not with the table."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphopt as go
from graphopt import ops, optim
from graphopt.ir.kernel import cost

RULES = {"SparseAdam": dict(lr=0.01), "LazyAdam": dict(lr=0.01, weight_decay=0.1,
                                                       use_nesterov=True),
         "Adagrad": dict(lr=0.1, lr_decay=0.01), "SGD": dict(lr=0.1),
         "FTRL": dict(lr=0.1, l1=0.01, l2=0.01)}


def train(backend, kind, tables, ids, pads, dtype, steps=2, state_dtype=None):
    """Two steps of `kind` on embedding tables (their initial values), each looked up by ids;
    the tables and every state after them."""
    params = [go.Parameter(t.copy(), name=f"t{i}") for i, t in enumerate(tables)]
    opt = getattr(optim, kind)(params, **RULES[kind], state_dtype=state_dtype)

    @go.jit(backend=backend)
    def step(*ids):
        def loss():
            out = 0
            for p, i, pad in zip(params, ids, pads):
                e = ops.embedding(p, i, sparse=True, padding_idx=pad)
                out = out + (e * e).astype(go.f32).sum() + e.astype(go.f32).sum()
            return out
        _, grads = go.value_and_grad(loss, wrt=params)()
        opt.step(grads)

    for _ in range(steps):
        step(*ids)
    return [p.numpy() for p in params] + [v.numpy() for s in opt.state.values()
                                          for v in s.values()], step.lower(*ids)


@st.composite
def problems(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16]))
    count = draw(st.integers(1, 2))
    tables, ids, pads = [], [], []
    rng = np.random.default_rng(draw(st.integers(0, 99)))
    for _ in range(count):
        n = draw(st.integers(1, 40))
        row = draw(st.sampled_from([(1,), (3,), (8,), (2, 5), (17,)]))
        k = draw(st.integers(0, 30))
        high = draw(st.integers(1, n))  # a small range: repeated ids
        tables.append(rng.standard_normal((n,) + row).astype(dtype))
        ids.append(rng.integers(0, high, (k,)))
        pads.append(draw(st.sampled_from([None, 0, n - 1])))
    return dtype, tables, ids, pads


@settings(max_examples=25, deadline=None,  # (setenv is the same on every example)
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=problems(), kind=st.sampled_from(sorted(RULES)), threads=st.sampled_from([1, 2]))
def test_the_compiled_row_kernel_gives_the_interpreters_bits(problem, kind, threads,
                                                             monkeypatch):
    monkeypatch.setenv("GRAPHOPT_THREADS", str(threads))
    dtype, tables, ids, pads = problem
    want, _ = train("interpreter", kind, tables, ids, pads, dtype)
    got, exe = train("llvm", kind, tables, ids, pads, dtype)
    assert any(n.op == "row_kernel" for n in exe.graph.nodes)
    assert not exe.program.fallbacks, [f.reason for f in exe.program.fallbacks]
    for g, w in zip(got, want):
        if kind == "FTRL":  # pow: the C library's in LLVM, numpy's own in numpy
            np.testing.assert_allclose(g, w, rtol=1e-3 if dtype == np.float16 else 1e-5)
        else:
            np.testing.assert_array_equal(g, w)


def test_tables_of_one_rule_share_one_row_kernel_and_only_their_rows_move():
    rng = np.random.default_rng(0)
    tables = [rng.standard_normal((1000, 8)).astype(np.float32),
              rng.standard_normal((300, 4)).astype(np.float32)]
    ids = [np.array([5, 7, 5, 999]), np.array([0, 1])]
    got, exe = train("llvm", "SparseAdam", tables, ids, [None, None], np.float32, steps=1,
                     state_dtype=go.bf16)
    rows = [n for n in exe.graph.nodes if n.op == "row_kernel"]
    assert len(rows) == 1 and len(rows[0].attrs["spaces"]) == 2
    assert not any(n.op in ("take_rows", "with_values", "assign") and
                   n.inputs[0].name.startswith("t") for n in exe.graph.nodes if n.inputs)
    for table, new, i in zip(tables, got, ids):
        moved = np.flatnonzero((new != table).any(axis=1))
        np.testing.assert_array_equal(moved, np.unique(i))


def test_a_row_kernel_moves_bytes_by_the_rows_touched_not_the_tables_size():
    def kernel_bytes(n):
        table = np.zeros((n, 16), np.float32)
        _, exe = train("interpreter", "SparseAdam", [table], [np.arange(64) % 50], [None],
                       np.float32, steps=1)
        (k,) = [n for n in exe.graph.nodes if n.op == "row_kernel"]
        return cost(k).total_bytes, cost(k).elements

    small, big = kernel_bytes(100), kernel_bytes(100_000)
    assert small == big and small[1] == 64 * 16
    # p, m, v read and written, the values read: 7 f32 per element; the 64 indices; scalars
    assert 64 * 16 * 7 * 4 + 64 * 8 < small[0] < 64 * 16 * 7 * 4 + 64 * 8 + 64


def test_the_llvm_listing_shows_a_vectorized_row_loop():
    table = np.zeros((100, 32), np.float32)
    _, exe = train("llvm", "Adagrad", [table], [np.arange(10)], [None], np.float32, steps=1)
    listing = exe.llvm_ir()
    assert "<8 x float>" in listing or "<4 x float>" in listing
