"""Collectives as IR ops: type rules and attribute kinds, the verifier's collective-order rule,
the text form, eager and jit semantics (world of one process, and N ranks modelled in this
process), the chain the tracer builds, and the VJPs. Pass behaviour is in tests/passes
(*.gir), failing steps in tests/faults/test_atomic_steps.py.

N ranks in one process: `Replicas` is a communicator of N identical replicas, each holding
this process's values (what every rank of a data-parallel step holds when their data agree):
an all_reduce sum is N*x, a max x, an all_gather x tiled N times along axis 0. Real runs on
several processes (mpiexec) are tested with the MPI runtime.
"""
from __future__ import annotations

import io
import re

import numpy as np
import pytest

import graphopt as go
from graphopt import comm, ops
from graphopt.errors import (CollectiveError, NotDifferentiableError, OpTypeError,
                             VerifyError)
from graphopt.frontend.hypermap import MapUnsupported, hypermap
from graphopt.ir import REGISTRY, Graph, TensorType, f32, i32, parse
from graphopt.ir.registry import COLLECTIVE
from graphopt.passes.cost import bytes_sent

BACKENDS = ["interpreter", "llvm"]
N = 3


class Replicas:
    """A group of `size` identical replicas, seen from rank `rank`. Records the collectives
    in the order they are issued."""

    def __init__(self, size: int, rank: int = 0):
        self.size, self.rank = size, rank
        self.calls: list[str] = []

    def _sum(self, x: np.ndarray, reduce: str) -> np.ndarray:
        if reduce == "max":
            return x.copy()
        return np.add.reduce(np.stack([x] * self.size), axis=0, dtype=x.dtype)

    def _part(self, x: np.ndarray) -> np.ndarray:
        k = x.shape[0] // self.size
        return x[self.rank * k:(self.rank + 1) * k].copy()

    def all_reduce(self, x, reduce):
        self.calls.append(f"all_reduce {reduce}")
        return self._sum(x, reduce)

    def reduce_scatter(self, x, reduce):
        self.calls.append(f"reduce_scatter {reduce}")
        return self._part(self._sum(x, reduce))

    def all_gather(self, x):
        self.calls.append("all_gather")
        return np.concatenate([x] * self.size)

    def broadcast(self, x, root):
        self.calls.append(f"broadcast {root}")
        return x.copy()

    def gather_objects(self, obj):
        return [obj] * self.size


@pytest.fixture
def replicas(monkeypatch):
    """Group "replicas": N identical replicas, rank 0 (set .rank to see another)."""
    group = Replicas(N)
    monkeypatch.setitem(comm._GROUPS, "replicas", group)
    return group


def rows(shape=(6, 2), dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype)


def run(fn, backend, *args):
    """fn eagerly (backend None), or jitted on a backend."""
    if backend is None:
        out = fn(*args)
    else:
        out = go.jit(fn, backend=backend, cache=False)(*args)
    return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]


# -- the registry ---------------------------------------------------------------------------------
def test_the_ops_are_collectives_and_all_but_shard_are_ordered():
    ours = {name: op for name, op in REGISTRY.items() if op.category == COLLECTIVE}
    assert set(ours) == {"all_reduce", "all_reduce_when", "reduce_scatter", "all_gather",
                         "broadcast", "shard"}
    assert {name for name, op in ours.items() if op.ordered} == set(ours) - {"shard"}
    assert {name for name, op in REGISTRY.items() if op.predicated} == {"all_reduce_when"}
    assert {name for name, op in REGISTRY.items() if op.uniform} == {"all_reduce", "all_gather",
                                                                     "broadcast"}
    assert not any(op.ordered for op in REGISTRY.values() if op.category != COLLECTIVE)
    assert all(op.doc for op in ours.values())


def node(op, x_type, **attrs):
    g = Graph()
    x = g.add_input("arg", "x", x_type)
    return g.add_node(op, [x], {"group": "world", "ranks": 4, **attrs})


@pytest.mark.parametrize("op, attrs, x, out", [
    ("all_reduce", {"reduce": "sum"}, TensorType((5, 3), f32), TensorType((5, 3), f32)),
    ("all_reduce", {"reduce": "max"}, TensorType((), i32), TensorType((), i32)),
    ("reduce_scatter", {"reduce": "mean"}, TensorType((8, 3), f32), TensorType((2, 3), f32)),
    ("all_gather", {}, TensorType((2, 3), i32), TensorType((8, 3), i32)),
    ("broadcast", {"root": 3}, TensorType((7,), f32), TensorType((7,), f32)),
    ("shard", {}, TensorType((4,), f32), TensorType((1,), f32)),
])
def test_result_types(op, attrs, x, out):
    assert node(op, x, **attrs).out.type == out


@pytest.mark.parametrize("op, attrs, x, message", [
    ("reduce_scatter", {"reduce": "sum"}, TensorType((6, 3), f32),
     "axis 0 of f32[6,3] (6) is not a multiple of ranks=4"),
    ("shard", {}, TensorType((3,), f32), "(3) is not a multiple of ranks=4"),
    ("all_gather", {}, TensorType((), f32), "f32[] has no axis 0"),
    ("reduce_scatter", {"reduce": "sum"}, TensorType((), f32), "has no axis 0"),
    ("all_reduce", {"reduce": "mean"}, TensorType((4,), i32),
     'all_reduce {reduce="mean"}: dtype i32 is not supported (takes float dtypes)'),
    ("reduce_scatter", {"reduce": "mean"}, TensorType((4,), i32), "takes float dtypes"),
    ("broadcast", {"root": 4}, TensorType((4,), f32), "root=4 is not one of the 4 ranks"),
    ("broadcast", {"root": -1}, TensorType((4,), f32), "0 <= root < ranks"),
])
def test_type_errors_say_what_is_wrong(op, attrs, x, message):
    with pytest.raises(OpTypeError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)").replace("{", r"\{")):
        node(op, x, **attrs)


GRAPH = """graph g {{
  arg %x: f32[8]
  %0 = {line} : f32[{size}]
  return %0
}}"""


@pytest.mark.parametrize("line, message", [
    ('all_reduce %x {group="world", ranks=0, reduce="sum"}', "'ranks' is below 1, got 0"),
    ('all_reduce %x {group="world", ranks=2.0, reduce="sum"}', "'ranks' must be an integer >= 1"),
    ('all_reduce %x {group="world", ranks=1, reduce="min"}',
     """'reduce' must be one of "sum", "max", "mean", got "min\""""),
    ('all_reduce %x {group=3, ranks=1, reduce="sum"}', "'group' must be a string, got 3"),
    ('all_reduce %x {group="", ranks=1, reduce="sum"}', "'group' is empty"),
    ('broadcast %x {group="world", ranks=1, root=true}', "'root' must be an integer"),
    ('all_gather %x {group="world"}', "attributes missing ranks"),
])
def test_attribute_kinds_are_verified(line, message):
    g = parse(GRAPH.format(line=line, size=8))
    with pytest.raises(VerifyError, match="attr-kind|known-op") as info:
        g.verify()
    assert message in str(info.value)


def test_the_frontend_checks_its_arguments(replicas):
    x = rows()
    with pytest.raises(OpTypeError, match="all_reduce: reduce must be one of 'sum', 'max', "
                                          "'mean', got 'min'"):
        ops.all_reduce(x, "min")
    with pytest.raises(OpTypeError, match="group must be the name of a process group"):
        ops.all_gather(x, group=0)
    with pytest.raises(CollectiveError, match="no process group named 'nope'; known: "
                                              "'replicas', 'world'") as info:
        ops.shard(x, group="nope")
    assert info.value.loc is not None and info.value.loc.file == __file__
    with pytest.raises(OpTypeError, match="broadcast: root must be at least 0"):
        ops.broadcast(x, root=-1)
    with pytest.raises(OpTypeError, match=r"not a multiple of ranks=3"):
        go.trace(lambda x: ops.reduce_scatter(x, group="replicas"), rows((4, 2)))


# -- the text form --------------------------------------------------------------------------------
def every_collective(x):
    a = ops.all_reduce(x, "mean")
    b = ops.reduce_scatter(a * 2, "max")
    c = ops.all_gather(b)
    d = ops.broadcast(c, root=0)
    return d + ops.shard(ops.all_gather(x)) * 0 + ops.all_reduce(x, "sum")


def test_print_parse_round_trip():
    g = go.trace(every_collective, rows())
    text = str(g)
    assert 'all_reduce %x {group="world", ranks=1, reduce="mean"} : f32[6,2]' in text
    again = parse(text)
    again.verify()
    assert str(again) == text
    attrs = next(n for n in again.nodes if n.op == "broadcast").attrs
    assert attrs == {"group": "world", "ranks": 1, "root": 0}
    assert type(attrs["group"]) is str and type(attrs["ranks"]) is int


def test_a_group_name_with_quotes_round_trips(monkeypatch):
    monkeypatch.setitem(comm._GROUPS, 'dp "a"\\b', Replicas(2))
    g = go.trace(lambda x: ops.all_reduce(x, group='dp "a"\\b'), rows())
    text = str(g)
    assert r'group="dp \"a\"\\b"' in text
    assert str(parse(text)) == text
    assert parse(text).nodes[0].attrs["group"] == 'dp "a"\\b'


# -- the tracer's chain, and the verifier's rule ----------------------------------------------------
def ordered_nodes(graph):
    return [n for n in graph.nodes if n.opdef.ordered]


def test_the_tracer_chains_ordered_ops_in_program_order(replicas):
    g = go.trace(every_collective, rows())
    chain = ordered_nodes(g)
    assert [n.op for n in chain] == ["all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                     "all_gather", "all_reduce"]
    assert list(chain[0].after) == []
    for before, n in zip(chain, chain[1:]):
        assert list(n.after) == [before.out]
    shard = next(n for n in g.nodes if n.op == "shard")
    assert list(shard.after) == []  # sends nothing: not ordered
    g.verify()


UNCHAINED = """graph two {
  arg %x: f32[4]
  %0 = all_reduce %x {group="world", ranks=2, reduce="sum"} : f32[4]
  %1 = exp %x : f32[4]
  %2 = all_reduce %1 {group="world", ranks=2, reduce="max"} : f32[4]
  return %0, %2
}"""


def test_two_unchained_all_reduces_are_rejected_naming_both():
    with pytest.raises(VerifyError) as info:
        parse(UNCHAINED).verify()
    e = info.value
    assert e.rule == "collective-order"
    assert '`%0 = all_reduce %x {group="world", ranks=2, reduce="sum"} : f32[4]`' in str(e)
    assert '`%2 = all_reduce %1 {group="world", ranks=2, reduce="max"} : f32[4]`' in str(e)
    assert e.node.op == "all_reduce" and e.node.inputs[0].node.op == "exp"


@pytest.mark.parametrize("how", [
    "after(%0)",  # an after edge to the one before
    "after(%d)",  # through a depend after it
])
def test_a_chain_by_after_edges_or_through_other_nodes_verifies(how):
    text = UNCHAINED.replace("  %2 = all_reduce %1 {group=\"world\", ranks=2, reduce=\"max\"}",
                             "  %d = depend %1 after(%0) : f32[4]\n"
                             f"  %2 = all_reduce %1 {{group=\"world\", ranks=2, reduce=\"max\"}} "
                             f"{how}")
    parse(text).verify()


def test_a_chain_by_data_verifies_and_skipping_a_link_does_not():
    text = """graph three {
  arg %x: f32[4]
  %0 = all_reduce %x {group="world", ranks=2, reduce="sum"} : f32[4]
  %1 = add %0, %x : f32[4]
  %2 = broadcast %1 {group="world", ranks=2, root=1} : f32[4]
  %3 = all_gather %1 {group="world", ranks=2} : f32[8]
  return %2, %3
}"""
    with pytest.raises(VerifyError, match="collective-order") as info:
        parse(text).verify()  # %3 depends on %0, but not on %2, the one before it
    assert "`%2 = broadcast" in str(info.value) and "`%3 = all_gather" in str(info.value)
    parse(text.replace(": f32[8]", "after(%2) : f32[8]")).verify()


def test_the_order_check_is_linear_in_the_graph():
    """A chain of 20,000 collectives, each also waiting for every tenth one before it: the
    check carries one number per value (a quadratic walk would take minutes)."""
    import time
    g = Graph("long")
    values = [g.add_input("arg", "x", TensorType((2,), f32))]
    for i in range(20000):
        values.append(g.add_node("all_reduce", [values[-1]], {"group": "world", "ranks": 1,
                                                              "reduce": "sum"},
                                 after=values[-1:] + values[-11:-10]).out)
    g.outputs = [values[-1]]
    start = time.perf_counter()
    g.verify()
    assert time.perf_counter() - start < 10


def test_a_hypermap_rule_cannot_hold_a_collective():
    ps = [go.Parameter(np.ones(3, np.float32), name=f"w{i}") for i in range(2)]

    def step():
        hypermap(lambda: go.assign(ps[0], ops.all_reduce(ps[0])), [{"p": p} for p in ps])

    with pytest.raises(MapUnsupported, match="all_reduce is an ordered op"):
        go.trace(step)


# -- semantics: the world of one process -------------------------------------------------------
@pytest.mark.parametrize("backend", [None] + BACKENDS)
def test_in_a_world_of_one_every_collective_is_the_identity(backend):
    x = rows()
    got = run(lambda x: (ops.all_reduce(x), ops.all_reduce(x, "max"), ops.all_reduce(x, "mean"),
                         ops.reduce_scatter(x), ops.reduce_scatter(x, "mean"),
                         ops.all_gather(x), ops.broadcast(x), ops.shard(x)), backend, x)
    for a in got:
        np.testing.assert_array_equal(a, x)
        assert a.dtype == x.dtype


@pytest.mark.parametrize("backend", [None] + BACKENDS)
def test_a_jitted_step_with_collectives_computes_what_eager_does(backend):
    x = rows((6, 3), np.float64, seed=1)
    np.testing.assert_allclose(run(every_collective, backend, x)[0],
                               run(every_collective, None, x)[0])


def test_eager_collectives_return_arrays_of_their_own():
    x = rows()
    out = ops.all_reduce(x).numpy()
    assert not np.shares_memory(out, x)
    out[:] = 0
    assert x.any()


# -- semantics: N replicas -------------------------------------------------------------------------
@pytest.mark.parametrize("backend", [None] + BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.bool_])
def test_sum_and_max_over_replicas(backend, dtype, replicas):
    x = (rows((6, 2), seed=2) * 3).astype(dtype)
    total, top = run(lambda x: (ops.all_reduce(x, group="replicas"),
                                ops.all_reduce(x, "max", group="replicas")), backend, x)
    np.testing.assert_array_equal(total, np.add.reduce(np.stack([x] * N), dtype=dtype))
    np.testing.assert_array_equal(top, x)
    assert total.dtype == dtype == top.dtype


@pytest.mark.parametrize("backend", [None] + BACKENDS)
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64"])
def test_mean_is_the_sum_divided_by_the_ranks_in_the_dtype(backend, dtype, replicas):
    np_dtype = go.ir.to_dtype(dtype).np_dtype
    x = rows((6, 2), seed=3).astype(np_dtype)
    (mean,) = run(lambda x: ops.all_reduce(x, "mean", group="replicas"), backend, x)
    total = np.add.reduce(np.stack([x] * N), dtype=np_dtype)
    expected = (total.astype(np.float32) / N).astype(np_dtype) if dtype in ("f16", "bf16") \
        else total / np_dtype.type(N)
    assert mean.dtype == np_dtype
    np.testing.assert_array_equal(mean, expected)


@pytest.mark.parametrize("backend", [None] + BACKENDS)
@pytest.mark.parametrize("rank", range(N))
def test_the_ops_on_axis_0_over_replicas(backend, rank, replicas):
    replicas.rank = rank
    x = rows((6, 2), np.float64, seed=4)

    def step(x):
        return (ops.reduce_scatter(x, group="replicas"),
                ops.reduce_scatter(x, "mean", group="replicas"),
                ops.reduce_scatter(x, "max", group="replicas"),
                ops.all_gather(x, group="replicas"), ops.broadcast(x, 2, group="replicas"),
                ops.shard(x, group="replicas"))

    scattered, mean, top, gathered, broadcast, shard = run(step, backend, x)
    part = x[2 * rank:2 * rank + 2]
    np.testing.assert_allclose(scattered, N * part)
    np.testing.assert_allclose(mean, part)
    np.testing.assert_array_equal(top, part)
    np.testing.assert_array_equal(gathered, np.concatenate([x] * N))
    np.testing.assert_array_equal(broadcast, x)
    np.testing.assert_array_equal(shard, part)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_issues_its_collectives_in_program_order(backend, replicas):
    def step(x, y):
        a = ops.all_gather(y, group="replicas")  # independent of x's
        b = ops.all_reduce(x * 2, "max", group="replicas")
        c = ops.broadcast(x + 1, 1, group="replicas")
        return ops.reduce_scatter(a, group="replicas"), b + c

    fn = go.jit(step, backend=backend, cache=False)
    for _ in range(2):
        replicas.calls.clear()
        fn(rows((3, 2)), rows((3, 2), seed=1))
        assert replicas.calls == ["all_gather", "all_reduce max", "broadcast 1",
                                  "reduce_scatter sum"]


def test_a_step_traced_for_n_ranks_refuses_another_size(replicas, monkeypatch):
    fn = go.jit(lambda x: ops.all_reduce(x, group="replicas"))
    fn(rows())
    monkeypatch.setitem(comm._GROUPS, "replicas", Replicas(2))
    with pytest.raises(CollectiveError, match="traced for 3 ranks in group 'replicas', which "
                                              "has 2 here"):
        fn(rows())


# -- the LLVM runtime and the memory plan -----------------------------------------------------------
def test_llvm_runs_collectives_as_numpy_nodes_in_chain_order_with_their_own_arrays(replicas):
    w = go.Parameter(rows((6, 2), seed=5), name="w")

    def step(g):
        s = ops.all_reduce(g * 2, group="replicas")
        go.assign(w, w - 0.1 * s)
        m = ops.all_reduce(w * w, "max", group="replicas")  # needs the stored w
        return ops.all_gather(m + 1, group="replicas").sum()

    exe = go.jit(step, backend="llvm", cache=False).lower(rows((6, 2)))
    program = exe.program
    assert not program.sink  # not every node is a kernel: no single native call
    chain = [n for n in program.nodes if n.opdef.ordered]
    assert [n.op for n in chain] == ["all_reduce", "all_reduce", "all_gather"]
    assert chain == ordered_nodes(exe.graph)  # the runtime's order is the graph's
    made = {v for n in chain for v in n.outputs}
    assert made <= set(program.plan.unplanned) and made.isdisjoint(program.plan.buffers)
    assert program.needs_backup  # a collective can fail after the in-place store of w
    g = rows((6, 2), seed=6)
    w0 = w.numpy().copy()
    expected = np.concatenate([(w0 - 0.1 * N * 2 * g) ** 2 + 1] * N).sum()
    np.testing.assert_allclose(exe(g), expected, rtol=1e-5)


# -- autodiff ---------------------------------------------------------------------------------------
def simulated(op, xs, rank, reduce="sum"):
    """What rank `rank` gets from op when the ranks hold the inputs xs (distinct values: the
    collectives' meaning, in numpy)."""
    total = np.sum(xs, axis=0) / (len(xs) if reduce == "mean" else 1)
    k = xs[0].shape[0] // len(xs) if xs[0].ndim else 0
    return {"all_reduce": lambda: total,
            "reduce_scatter": lambda: total[rank * k:(rank + 1) * k],
            "all_gather": lambda: np.concatenate(xs)}[op]()


def multi_rank_gradient(op, x, ct, rank, reduce="sum", eps=1e-6):
    """Central differences of the step's loss summed over the ranks, sum_r sum(y_r * ct) (ct
    the same on every rank, as a replica's), in rank `rank`'s input, every rank holding x."""
    grad = np.zeros_like(x)
    for j in np.ndindex(x.shape):
        values = []
        for step in (eps, -eps):
            xs = [x.copy() for _ in range(N)]
            xs[rank][j] += step
            values.append(sum(np.sum(simulated(op, xs, r, reduce) * ct) for r in range(N)))
        grad[j] = (values[0] - values[1]) / (2 * eps)
    return grad


VJP_CASES = [  # op, reduce, the formula's gradient for a rank's x given the cotangent ct
    ("all_reduce", "sum", lambda ct, rank: N * ct),  # all_reduce sum of ct
    ("all_reduce", "mean", lambda ct, rank: ct),  # all_reduce mean of ct
    ("reduce_scatter", "sum", lambda ct, rank: np.concatenate([ct] * N)),  # all_gather of ct
    ("reduce_scatter", "mean", lambda ct, rank: np.concatenate([ct] * N) / N),
    ("all_gather", None, lambda ct, rank: N * np.split(ct, N)[rank]),  # reduce_scatter sum
]


@pytest.mark.parametrize("backend", [None] + BACKENDS)
@pytest.mark.parametrize("op, reduce, formula", VJP_CASES, ids=lambda c: c if isinstance(c, str)
                         else None)
@pytest.mark.parametrize("rank", [0, 2])
def test_vjps_over_replicas_match_finite_differences_and_the_formulas(backend, op, reduce,
                                                                      formula, rank, replicas):
    replicas.rank = rank
    x = rows((6, 2), np.float64, seed=7)
    kwargs = {} if reduce is None else {"reduce": reduce}
    ct = rows(simulated(op, [x] * N, rank, reduce or "sum").shape, np.float64, seed=8)

    def loss(x):
        return ops.sum(getattr(ops, op)(x, group="replicas", **kwargs) * ct)

    grad = go.grad(loss)
    (g,) = run(grad, backend, x)
    np.testing.assert_allclose(g, formula(ct, rank), rtol=1e-12)
    np.testing.assert_allclose(g, multi_rank_gradient(op, x, ct, rank, reduce or "sum"),
                               rtol=1e-6, atol=1e-8)


def test_the_backward_collectives_are_chained_after_the_forward_ones(replicas):
    x = rows((6, 2), np.float64)

    def loss(x):
        y = ops.all_gather(ops.tanh(x), group="replicas")
        return ops.sum(ops.all_reduce(y * y, "mean", group="replicas"))

    g = go.trace(go.grad(loss), x)
    g.verify()
    assert [n.op for n in ordered_nodes(g)] == ["all_gather", "all_reduce", "all_reduce",
                                                "reduce_scatter"]
    assert [n.attrs.get("reduce") for n in ordered_nodes(g)] == [None, "mean", "mean", "sum"]
    replicas.calls.clear()
    go.jit(go.grad(loss), cache=False)(x)
    # (a mean is a sum to the communicator, divided by the ranks in the op)
    assert replicas.calls == ["all_gather", "all_reduce sum", "all_reduce sum",
                              "reduce_scatter sum"]


@pytest.mark.parametrize("op, fn, message", [
    ("all_reduce", lambda x: ops.all_reduce(x, "max"),
     'all_reduce with reduce="max" has no gradient rule'),
    ("reduce_scatter", lambda x: ops.reduce_scatter(x, "max"),
     'reduce_scatter with reduce="max" has no gradient rule'),
    ("broadcast", lambda x: ops.broadcast(x),
     "op 'broadcast' has no VJP rule (its VJP depends on the rank"),
    ("shard", lambda x: ops.shard(x), "op 'shard' has no VJP rule (its VJP depends on the rank"),
], ids=lambda c: c if isinstance(c, str) and " " not in c else "")
def test_what_has_no_gradient_says_why_and_where(op, fn, message):
    x = rows((6, 2), np.float64)

    def loss(x):
        return ops.sum(fn(x))

    for grad in (go.grad(loss), go.jit(go.grad(loss), cache=False)):
        with pytest.raises(NotDifferentiableError, match=message.replace("(", r"\(")) as info:
            grad(x)
        loc = info.value.loc  # the line that called the op
        assert loc is not None and loc.file == __file__
        with open(__file__) as f:
            assert f"ops.{op}(x" in f.readlines()[loc.line - 1]


# -- bytes sent, explain, the drawing, the step's domain -----------------------------------------
@pytest.mark.parametrize("ranks", [1, 4])
def test_bytes_sent_by_a_ring(ranks):
    g = parse(f"""graph sends {{
  arg %x: f32[8,250]
  %0 = all_reduce %x {{group="world", ranks={ranks}, reduce="sum"}} : f32[8,250]
  %1 = reduce_scatter %x {{group="world", ranks={ranks}, reduce="mean"}} after(%0) : f32[{8 // ranks},250]
  %2 = all_gather %x {{group="world", ranks={ranks}}} after(%1) : f32[{8 * ranks},250]
  %3 = broadcast %x {{group="world", ranks={ranks}, root=0}} after(%2) : f32[8,250]
  %4 = shard %x {{group="world", ranks={ranks}}} : f32[{8 // ranks},250]
  %5 = exp %x : f32[8,250]
  return %0, %1, %2, %3, %4, %5
}}""")
    g.verify()
    got = [bytes_sent(n) for n in g.nodes]
    nbytes = 8 * 250 * 4
    share = (ranks - 1) / ranks
    assert got == [2 * share * nbytes, share * nbytes, share * nbytes * ranks, share * nbytes,
                   0, 0]
    if ranks == 4:
        assert got[:4] == [12000, 6000, 24000, 6000]


def test_explain_lists_each_collective_with_its_bytes_and_the_total(replicas):
    out = io.StringIO()

    def step(x):
        return ops.all_reduce(x * 2, group="replicas"), ops.all_gather(x, group="replicas")

    go.explain(step, np.zeros((4, 250), np.float32), out=out)
    text = out.getvalue()
    assert "%2 = all_reduce [loc(" in text and "]: stays outside kernels: all_reduce is a " \
        "collective: it runs as a node of its own" in text
    # (named as the refusal and every printing of the run name them: %2 is the all_reduce)
    section = text[text.index("=== collectives"):text.index("=== llvm")]
    assert section.splitlines() == [
        "=== collectives: bytes each rank sends per step (a ring algorithm)",
        '  %2 = all_reduce %1 {group="replicas", ranks=3, reduce="sum"} : f32[4,250]  sends '
        "5,333 B",
        '  %3 = all_gather %x {group="replicas", ranks=3} after(%2) : f32[12,250]  sends '
        "8,000 B",
        "  total: 13,333 B sent per step",
    ]
    out = io.StringIO()
    go.explain(lambda x: x * 2, np.zeros(3, np.float32), out=out)
    assert "=== collectives" not in out.getvalue()


def test_the_drawing_shows_collectives_as_hexagons_and_their_chain_dashed(replicas):
    g = go.trace(lambda x: ops.all_gather(ops.all_reduce(x) + 1) * 2, rows())
    source = g.to_dot().source
    hexagons = [line for line in source.splitlines() if "shape=hexagon" in line]
    assert len(hexagons) == 2 and all("#c6dbef" in line for line in hexagons)
    assert any("all_reduce" in line for line in hexagons)
    assert sum("style=dashed" in line for line in source.splitlines()) == 1  # the chain


def test_steps_with_collectives_of_one_group_take_turns(replicas):
    a = go.jit(lambda x: ops.all_reduce(x, group="replicas"), cache=False).lower(rows())
    b = go.jit(lambda x: ops.all_gather(x, group="replicas"), cache=False).lower(rows())
    c = go.jit(lambda x: ops.all_reduce(x), cache=False).lower(rows())
    d = go.jit(lambda x: ops.shard(x, group="replicas") * 2, cache=False).lower(rows())
    root = a._domain.root()
    assert b._domain.root() is root
    assert c._domain.root() is not root and d._domain.root() is not root


# -- all_reduce_when: a collective under a predicate ------------------------------------------------
def counted_when(x, every=3, group="replicas"):
    """A step that all_reduces x on one call in `every`, by a counter Parameter."""
    count = go.Parameter(np.int64(0), name="count")

    def step(x):
        now = count + 1 == every
        go.assign(count, ops.where(now, 0, count + 1))
        return ops.all_reduce_when(x * 2, now, every, "sum", group=group)
    return step


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_reduce_when_communicates_only_where_its_predicate_is_true(backend, replicas):
    fn = go.jit(counted_when(rows()), backend=backend, cache=False)
    x = rows()
    for call in range(6):
        replicas.calls.clear()
        got = fn(x)
        now = call % 3 == 2
        assert replicas.calls == (["all_reduce sum"] if now else []), call
        np.testing.assert_allclose(got, (N if now else 1) * 2 * x, rtol=1e-6)


def test_all_reduce_when_sends_once_per_every_runs_and_explain_says_so(replicas):
    g = go.trace(counted_when(rows()), np.zeros((4, 250), np.float32))
    (when,) = [n for n in g.nodes if n.op == "all_reduce_when"]
    whole = 2 * (N - 1) * 4 * 250 * 4 // N
    assert (bytes_sent(when, per_run=False), bytes_sent(when)) == (whole, whole // 3)
    out = io.StringIO()
    go.explain(counted_when(rows()), np.zeros((4, 250), np.float32), out=out)
    text = out.getvalue()
    text = text[text.index("=== collectives"):]
    (line,) = [s for s in text.splitlines() if "= all_reduce_when" in s]
    assert re.search(rf"every=3}} : f32\[4,250\]  sends {whole:,} B once every 3 runs, when "
                     rf"%\d+: sends {whole // 3:,} B per run$", line), line
    assert f"total: {whole // 3:,} B sent per step" in text


def test_all_reduce_when_round_trips_and_checks_its_predicate():
    text = """graph g {  # bytes per run: 50 B (read 33 B, written 17 B)
  arg %x: f32[4]
  param @c: i64[]
  %0 = constant {value=2} : i64[]
  %1 = equal @c, %0 : bool[]
  %2 = all_reduce_when %x, %1 {group="world", ranks=1, reduce="mean", every=2} : f32[4]
  return %2
}"""
    g = parse(text)
    g.verify()
    assert str(g) == text
    for bad, message in [
            ("%1 = cast @c {dtype=f32} : f32[]",
             "the predicate (operand 2) must be a bool scalar, got f32[]"),
            ("%1 = equal @c, @c : bool[]", None)]:
        g = parse(text.replace("%1 = equal @c, %0 : bool[]", bad))
        if message is None:
            g.verify()  # a Parameter is the same on every rank
            continue
        with pytest.raises(VerifyError, match=re.escape(message)):
            g.verify()
    with pytest.raises(VerifyError, match="'every' is below 1"):
        parse(text.replace("every=2", "every=0")).verify()


@pytest.mark.parametrize("source, says", [
    ("%v = sum %x {axes=[0], keepdims=false} : f32[]",
     "computed from the step input %x, which may differ between the ranks"),
    (("%s = shard %x {group=\"world\", ranks=1} : f32[4]\n"
      "  %v = sum %s {axes=[0], keepdims=false} : f32[]"), "a rank's own value"),
])
def test_a_predicate_that_may_differ_between_ranks_is_refused(source, says):
    text = f"""graph g {{
  arg %x: f32[4]
  {source}
  %0 = constant {{value=0.0}} : f32[]
  %p = greater %v, %0 : bool[]
  %3 = all_reduce_when %x, %p {{group="world", ranks=1, reduce="sum", every=2}} : f32[4]
  return %3
}}"""
    with pytest.raises(VerifyError, match="collective-predicate") as info:
        parse(text).verify()
    assert says in str(info.value)
    # all_reduced first, it is the same on every rank
    fixed = text.replace("%3 = all_reduce_when %x, %p", "%m = all_reduce %p {group=\"world\", "
                         "ranks=1, reduce=\"max\"} : bool[]\n  %3 = all_reduce_when %x, %m")
    parse(fixed).verify()


@pytest.mark.parametrize("compare, refused", [("%x1", False), ("%x0", True)])
def test_a_predicate_fused_with_a_ranks_values_is_judged_by_what_it_is_computed_from(
        compare, refused):
    """Fusion may put the predicate and a rank's own value in one kernel: only the outputs its
    body computes from the rank's operands are the rank's."""
    text = f"""graph g {{
  arg %x: f32[]
  param @c: f32[]
  %0, %1 = kernel %x, @c {{spaces=[[]], outputs=["map", "map"], shared=[]}} : f32[], bool[] {{
    arg %x0: f32[]
    arg %x1: f32[]
    %0 = exp %x0 : f32[]
    %1 = constant {{value=0.0}} : f32[]
    %2 = greater {compare}, %1 : bool[]
    return %0, %2
  }}
  %3 = all_reduce_when %0, %1 {{group="world", ranks=1, reduce="sum", every=2}} : f32[]
  return %3
}}"""
    if refused:
        with pytest.raises(VerifyError, match="computed from the step input %x"):
            parse(text).verify()
    else:
        parse(text).verify()
