"""The pass manager, the whole pipeline on optimizer steps, and semantics kept by every pass."""
import io
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import graphopt as go
from graphopt import ops, passes
from graphopt.ir import kernel, parse
from graphopt.passes import PassError
from support import run_program


def sgd_graph():
    w = go.Parameter(np.ones((4, 3), np.float32), name="w")
    m = go.Parameter(np.zeros((4, 3), np.float32), name="w.momentum")

    def step(g, lr):
        go.assign(m, 0.9 * m + g)
        go.assign(w, w - lr * m)
        return (g * g).sum()

    return go.trace(step, np.ones((4, 3), np.float32), 0.1)


def test_unknown_pass_lists_the_known_ones():
    with pytest.raises(PassError, match="unknown pass nope; known passes: bucket, cse, dce, fold, fuse, hfuse, one_rank, rowfuse"):
        passes.run(sgd_graph(), "dce,nope")
    with pytest.raises(PassError):
        go.jit(lambda x: x, passes="dce,nope")


def test_run_leaves_the_input_graph_alone_and_reports_each_pass():
    g = sgd_graph()
    before = str(g)
    result = passes.run(g, "dce,cse,fuse")
    assert str(g) == before
    assert [s.name for s in result.stats] == ["dce", "cse", "fuse"]
    fuse = result.stats[-1]
    assert fuse.changed and fuse.kernels_formed == fuse.kernels_after > 0
    assert fuse.nodes_after < fuse.nodes_before
    assert not result.stats[0].changed and result.stats[0].diff == ""
    assert fuse.bytes_read < result.stats[0].bytes_read  # fusion moves fewer bytes
    table = str(result)
    assert "fuse" in table and "kernels" in table


def test_print_after_by_name_regex_and_change():
    g = sgd_graph()
    out = io.StringIO()
    passes.run(g, "dce,cse,fuse", print_after=["c.e"], out=out)
    assert re.findall(r"IR after (\w+)", out.getvalue()) == ["cse"]
    out = io.StringIO()
    passes.run(g, "dce,cse,fuse", print_after_change=True, out=out)
    assert re.findall(r"IR after (\w+)", out.getvalue()) == ["fuse"]
    out = io.StringIO()
    passes.run(g, "dce,fuse", print_after_all=True, print_before="fuse", out=out)
    assert re.findall(r"IR (before|after) (\w+)", out.getvalue()) == [
        ("after", "dce"), ("before", "fuse"), ("after", "fuse")]
    assert "IR after dce (no change)" in out.getvalue()


def test_a_pass_that_breaks_the_graph_is_named():
    @passes.register("break_it")
    def break_it(graph, ctx):
        """Drops the first node (a test pass)."""
        graph.nodes = graph.nodes[1:]

    try:
        with pytest.raises(PassError, match="after pass 'break_it'"):
            passes.run(sgd_graph(), "dce,break_it")
    finally:
        del passes.PASSES["break_it"]


def test_a_taken_pass_name_is_refused_unless_it_is_the_same_definition():
    def define():
        @passes.register("twice")
        def twice(graph, ctx):
            """Changes nothing (a test pass)."""
        return twice

    try:
        first = define()
        second = define()  # the same definition run again (a file loaded twice): replaces it
        assert passes.PASSES["twice"].run is second is not first
        with pytest.raises(PassError, match=r"test_passes.py:\d+: the pass name 'cse' is taken, "
                                            r"by cse \(.*cse.py:\d+\)"):
            @passes.register("cse")
            def not_cse(graph, ctx):
                """Another pass under cse's name."""
        assert passes.PASSES["cse"].run.__module__ == "graphopt.passes.cse"
    finally:
        del passes.PASSES["twice"]


def test_verification_names_where_the_graph_broke():
    broken = sgd_graph()
    broken.nodes = broken.nodes[1:]  # a node reads a value no node defines now
    with pytest.raises(PassError, match=r"input graph does not verify \(before any pass\)"):
        passes.run(broken, "dce")
    # "last" (what jit does) verifies only the result; with no pass, that is the input
    for pipeline, shown in (("dce,cse", "dce,cse"), ("", "(none)")):
        with pytest.raises(PassError, match=re.escape(f"after the pipeline {shown} "
                                                      f"(GRAPHOPT_VERIFY=each")):
            passes.run(broken, pipeline, verify="last")


def adam_graph(n_params=10, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [tuple(rng.integers(1, 9, size=rng.integers(1, 3))) for _ in range(n_params)]
    ps = [go.Parameter(rng.standard_normal(s).astype(dtype), name=f"p{i}")
          for i, s in enumerate(shapes)]
    ms = [go.Parameter(np.zeros(s, dtype), name=f"p{i}.m") for i, s in enumerate(shapes)]
    vs = [go.Parameter(np.zeros(s, dtype), name=f"p{i}.v") for i, s in enumerate(shapes)]
    t = go.Parameter(np.zeros((), dtype), name="t")

    def adam(grads, lr):
        go.assign(t, t + 1)
        bc1, bc2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        for p, m, v, g in zip(ps, ms, vs, grads):
            go.assign(m, 0.9 * m + 0.1 * g)
            go.assign(v, 0.999 * v + 0.001 * g * g)
            go.assign(p, p - lr * (m / bc1) / (ops.sqrt(v / bc2) + 1e-8))

    grads = [rng.standard_normal(s).astype(dtype) for s in shapes]
    return adam, grads, ps + ms + vs + [t]


def test_adam_over_ten_parameters_is_one_multi_tensor_kernel_of_28_bytes_per_element():
    adam, grads, _ = adam_graph(10)
    graph = passes.run(go.trace(adam, grads, 1e-3)).graph
    multi = [n for n in graph.nodes if n.body is not None and len(n.attrs["spaces"]) > 1]
    assert len(multi) == 1
    (k,) = multi
    assert len(k.attrs["spaces"]) == 10
    stored = {v.name for v in kernel.written(k)}
    assert stored == {f"p{i}{s}" for i in range(10) for s in ("", ".m", ".v")}
    assert not graph.assigns()  # every update became an in-place store
    cost = kernel.cost(k)
    assert (cost.read_per_element, cost.write_per_element) == (16, 12)
    assert cost.bytes_per_element == 28
    assert "28 B/elem" in str(graph)


def run_graph(graph, params, args):
    """Run a graph on copies of the parameters' values: (outputs, new parameter values)."""
    from graphopt.backends import interpreter
    by_name = {p.name: p for p in params}
    inputs = {}
    it = iter(args)
    for v in graph.inputs:
        inputs[v] = by_name[v.name].numpy() if v.kind == "param" else np.asarray(next(it))
    outs, updates = interpreter.run(graph, inputs)
    return outs, updates


def assert_same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)  # NaN equals NaN here; bit-level sameness otherwise


def test_adam_pipeline_gives_the_same_bits():
    adam, grads, params = adam_graph(6, np.float64, seed=3)
    traced = go.trace(adam, grads, 1e-3)
    args = grads + [np.float64(1e-3)]
    o1, u1 = run_graph(traced, params, args)
    o2, u2 = run_graph(passes.run(traced).graph, params, args)
    assert sorted(u1) == sorted(u2)
    for name in u1:
        assert_same(u1[name], u2[name])


def test_explain_shows_diffs_and_refusals():
    w = go.Parameter(np.ones(4, np.float32), name="w")

    def step(g):
        s = (g * g).sum()  # a reduction ...
        go.assign(w, w - g / s)  # ... used by an elementwise node of the same space
        return s

    out = io.StringIO()
    result = go.explain(step, np.ones(4, np.float32), out=out)
    text = out.getvalue()
    assert "=== fuse" in text and "+++ after fuse" in text and "no change" in text
    assert "is a full reduction" in text
    assert any("full reduction" in r.reason for r in result.refusals)


# -- semantics: random programs, before and after the pipeline ---------------------------------
SPACE = (3, 4)
SHAPES = [(), (4,), (3, 1), SPACE]
UNARY = [ops.negative, ops.abs, ops.exp, ops.sqrt, lambda x: x * x, ops.sign,
         lambda x: x.astype(go.f64).astype(go.f32)]
BINARY = [ops.add, ops.subtract, ops.multiply, ops.divide, ops.maximum, ops.minimum]

program = st.lists(st.tuples(st.sampled_from(["unary", "binary", "where", "const", "sum",
                                              "assign", "partial_sum", "pow"]),
                             st.integers(0, 1000), st.integers(0, 1000),
                             st.sampled_from([0.0, -0.0, 1.0, 2.0, 0.5, 4.0, 3.0, float("nan"),
                                              float("inf")])),
                   min_size=1, max_size=14)


def interpret(prog, params, args):
    return run_program(prog, params, args, UNARY, BINARY)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prog=program, seed=st.integers(0, 2**16), fast=st.booleans())
@example(
    prog=[('unary', 0, 0, 0.0),
     ('unary', 0, 0, 0.0),
     ('unary', 4, 0, 0.0),
     ('unary', 0, 0, 0.0),
     ('unary', 0, 0, 0.0),
     ('const', 23, 0, 0.0),
     ('assign', 13, 0, 0.0)],
    seed=0,
    fast=True,
)  # simplify (fastmath x*0 -> 0) left a dead reader of @p0 for dce
def test_pipeline_keeps_semantics(prog, seed, fast):
    rng = np.random.default_rng(seed)
    params = [go.Parameter(rng.standard_normal(s).astype(np.float32), name=f"p{i}")
              for i, s in enumerate(SHAPES)]
    args = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    graph = go.trace(lambda a, b, c, d: interpret(prog, params, [a, b, c, d]), *args)
    o1, u1 = run_graph(graph, params, args)
    pipeline = passes.run(graph, fastmath=False)  # fastmath may change bits; keep it exact
    o2, u2 = run_graph(pipeline.graph, params, args)
    assert sorted(u1) == sorted(u2)
    for x, y in zip(o1, o2):
        assert_same(x, y)
    for name in u1:
        assert_same(u1[name], u2[name])
    if fast:  # every pass keeps the graph valid with fastmath too
        passes.run(graph, fastmath=True).graph.verify()


@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_cse_keeps_maximum_and_minimum_in_their_order(backend):
    """Of +0 and -0, maximum and minimum give the second: max(a, b) and max(b, a) differ in
    the sign of the zero, so cse must not merge them (they are not declared commutative)."""
    a, b = np.zeros(4, np.float32), np.full(4, -0.0, np.float32)
    outs = go.jit(lambda x, y: (ops.maximum(x, y), ops.maximum(y, x), ops.minimum(x, y),
                                ops.minimum(y, x)), backend=backend)(a, b)
    signs = [bool(np.signbit(np.asarray(o)).all()) for o in outs]
    assert signs == [True, False, True, False]


def test_a_reductions_result_is_bytes_written_not_read():
    """A sum kernel reads its operand once and writes its one result: the pass table's
    MB read / MB written split the cost comment's `B once` by direction."""
    from graphopt.passes.cost import node_bytes
    graph = passes.run(go.parse("graph g {\n  arg %x: f32[1000]\n"
                                "  %0 = multiply %x, %x : f32[1000]\n"
                                "  %1 = sum %0 {axes=[0], keepdims=false} : f32[]\n"
                                "  return %1\n}"), "fuse").graph
    (kernel,) = graph.nodes
    assert node_bytes(kernel) == (4000, 4)


# -- diffs that pair values by identity -------------------------------------------------------
def _diff_lines(diff):
    """The node lines a diff removes and adds (the header, whose comment totals the bytes,
    aside)."""
    body = [l for l in diff.splitlines() if not l.startswith(("---", "+++", "@@", "-graph ",
                                                              "+graph "))]
    return [l[1:].strip() for l in body if l[:1] == "-"], [l[1:].strip() for l in body if l[:1] == "+"]


def _defined(lines):
    return {l.split(" = ")[0] for l in lines if " = " in l}


def test_a_cse_merge_diffs_as_the_one_node_that_went_away():
    g = parse("""graph g {
      arg %x: f32[4]
      %0 = multiply %x, %x : f32[4]
      %1 = multiply %x, %x : f32[4]
      %2 = exp %0 : f32[4]
      %3 = exp %2 : f32[4]
      %4 = negative %3 : f32[4]
      %5 = add %4, %1 : f32[4]
      return %5
    }""")
    removed, added = _diff_lines(passes.run(g, "cse", diffs=True).stats[0].diff)
    assert _defined(removed) - _defined(added) == {"%1"}, (removed, added)
    assert added == ["%5 = add %4, %0 : f32[4]"]  # its one reader, which reads %0 now
    assert not any(l.startswith(("%2", "%3", "%4")) for l in removed + added)  # no renumbering


def test_a_removed_node_renumbers_nothing_and_a_fused_node_keeps_its_name():
    g = parse("""graph g {
      arg %x: f32[4]
      %0 = negative %x : f32[4]
      %1 = exp %x : f32[4]
      %2 = log %1 : f32[4]
      %3 = transpose %2 {perm=[0]} : f32[4]
      return %3
    }""")
    removed, added = _diff_lines(passes.run(g, "dce", diffs=True).stats[0].diff)
    assert (removed, added) == (["%0 = negative %x : f32[4]"], [])
    # after dce the values keep their names (%1 = exp, %2 = log, %3 = transpose): the
    # kernel takes log's place and name
    removed, added = _diff_lines(passes.run(g, "dce,fuse", diffs=True).stats[1].diff)
    assert [l for l in added if " = kernel " in l][0].startswith("%2 = kernel %x")
    assert removed == ["%1 = exp %x : f32[4]", "%2 = log %1 : f32[4]"]
    assert not any(l.startswith("%3 = transpose") for l in added)  # unchanged
