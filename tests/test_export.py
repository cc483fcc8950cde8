"""Tests of graphopt.ir.export: DOT drawing, networkx export and dump()."""
from __future__ import annotations

import re
import shutil

import graphviz
import networkx as nx
import numpy as np
import pytest

from graphopt.errors import GraphoptError, RenderError
from graphopt.ir import Graph, Location, Node, f32, parse, token
from graphopt.ir import export
from graphopt.ir.types import TensorType


def sgd_graph() -> Graph:
    """An SGD step: w -= lr * g, returning mean(g) after the update.

        param @w: f32[4,3]
        arg %g: f32[4,3]
        %0 = constant {value=0.1} : f32[]
        %1 = multiply %0, %g : f32[4,3]
        %2 = subtract @w, %1 : f32[4,3]
        %3 = sum %g {axes=[0, 1], keepdims=false} : f32[]
        %4 = assign @w, %2 after(%3) : token
        %5 = depend %3 after(%4) : f32[]
        return %5 after(%4)
    """
    g = Graph("sgd")
    w = g.add_input("param", "w", TensorType((4, 3), f32))
    grad = g.add_input("arg", "g", TensorType((4, 3), f32))
    lr = g.add_node("constant", [], {"value": 0.1, "shape": (), "dtype": f32},
                    loc=Location("/src/train.py", 7)).out
    scaled = g.add_node("multiply", [lr, grad]).out
    new_w = g.add_node("subtract", [w, scaled], loc=Location("/src/train.py", 8)).out
    total = g.add_node("sum", [grad], {"axes": (0, 1), "keepdims": False}).out
    tok = g.add_node("assign", [w, new_w], after=[total]).out
    out = g.add_node("depend", [total], after=[tok]).out
    g.outputs = [out]
    g.effects = [tok]
    return g


KERNEL_IR = """graph fused {
  param @x: f32[8]
  arg %y: f32[8]
  %0, %1 = kernel @x, %y {spaces=[[8]], outputs=["map"], shared=[]} : f32[8], token {
    arg %a: f32[]
    arg %b: f32[]
    %0 = multiply %a, %b : f32[]
    %1 = add %0, %a : f32[]
    %2 = store %a, %1 : token
    return %1 after(%2)
  }
  return %0 after(%1)
}"""


def kernel_graph() -> Graph:
    """A graph with one kernel node whose body computes a * b + a and stores it into @x."""
    return parse(KERNEL_IR).verify()


def edges_with(source: str, pattern: str) -> list[str]:
    """The DOT edge lines (`a -> b [...]`) whose text matches `pattern`."""
    return [ln for ln in source.splitlines() if "->" in ln and re.search(pattern, ln)]


def node_line(source: str, node_id: str) -> str:
    (line,) = [ln for ln in source.splitlines()
               if ln.strip().startswith(node_id + " ") and "->" not in ln]
    return line


# -- DOT ----------------------------------------------------------------------------------------
def test_dot_has_one_node_per_input_node_and_return():
    src = export.to_dot(sgd_graph()).source
    ids = {ln.split()[0] for ln in src.splitlines()
           if re.match(r"\s+\w+ \[", ln) and "->" not in ln} - {"node", "edge"}  # defaults
    assert ids == {"in0", "in1", "n0", "n1", "n2", "n3", "n4", "n5", "return"}


def test_dot_labels_use_printer_names():
    src = export.to_dot(sgd_graph()).source
    assert "@w" in node_line(src, "in0")
    assert "%g" in node_line(src, "in1")
    assert "%1 = multiply" in node_line(src, "n1")
    assert "axes=[0, 1]" in node_line(src, "n3")
    assert "%5 = depend" in node_line(src, "n5")


def test_dot_params_args_and_assigns_are_styled_apart():
    src = export.to_dot(sgd_graph()).source
    param, arg, assign = node_line(src, "in0"), node_line(src, "in1"), node_line(src, "n4")
    assert "shape=cylinder" in param and "fillcolor" in param
    assert "shape=ellipse" in arg and "cylinder" not in arg
    assert "assign @w" in assign
    assert "color=red" in assign and "bold" in assign and "shape=box" in assign


def test_dot_ordering_edges_are_dashed_and_data_edges_solid():
    src = export.to_dot(sgd_graph()).source
    # after(%3) on the assign, after(%4) on the depend, the return's effect %4.
    assert len(edges_with(src, r"^\s*n3 -> n4 .*dashed")) == 1
    assert len(edges_with(src, r"^\s*n4 -> n5 .*dashed")) == 1
    assert len(edges_with(src, r"^\s*n4 -> return .*dashed")) == 1
    # The data edge from %5 to the return is solid and labelled with its type.
    (ret_data,) = edges_with(src, r"^\s*n5 -> return")
    assert "dashed" not in ret_data and "f32[]" in ret_data
    # Data edges: multiply's two inputs, subtract's two inputs, each solid.
    for line in edges_with(src, r"-> n[12] "):
        assert "dashed" not in line


def test_dot_assign_writes_back_to_its_parameter():
    src = export.to_dot(sgd_graph()).source
    (writes,) = edges_with(src, r"^\s*n4 -> in0 ")
    assert "writes" in writes and "dashed" in writes and "constraint=false" in writes


def test_dot_op_colours_are_stable_and_per_op():
    assert export.op_color("multiply") == export.op_color("multiply")
    assert export.op_color("multiply") in export.PALETTE
    src = export.to_dot(sgd_graph()).source
    assert f'fillcolor="{export.op_color("multiply")}"' in node_line(src, "n1")
    assert f'fillcolor="{export.op_color("subtract")}"' in node_line(src, "n2")
    # Same source text on a second build: nothing depends on memory addresses or hash seeds.
    assert export.to_dot(sgd_graph()).source == src


def test_dot_long_labels_are_cut():
    g = Graph("big")
    g.add_node("constant", [], {"value": 1.0, "shape": (), "dtype": f32})
    big = g.add_node("constant", [], {"value": np.arange(100.0),
                                      "shape": (100,), "dtype": "f64"})
    g.outputs = [big.out]
    src = export.to_dot(g).source
    label = re.search(r'label="([^"]*)"', node_line(src, "n1")).group(1)
    assert all(len(part) <= export.MAX_LABEL for part in label.split("\\n"))
    assert "…" in label


def test_dot_node_with_body_is_a_cluster():
    src = export.to_dot(kernel_graph()).source
    assert "subgraph cluster_n0 {" in src
    cluster = src[src.index("subgraph cluster_n0 {"):]
    # The body's inputs, nodes and return are inside the cluster, with their own ids.
    for body_id in ("n0_in0", "n0_in1", "n0_n0", "n0_n1", "n0_n2", "n0_return"):
        assert f"\t\t{body_id} [" in cluster
    assert "%0 = multiply" in node_line(src, "n0_n0")
    assert "%1 = add" in node_line(src, "n0_n1")
    # The outer inputs feed the kernel node; the kernel feeds the outer return.
    assert edges_with(src, r"^\s*in0 -> n0 ") and edges_with(src, r"^\s*in1 -> n0 ")
    assert edges_with(src, r"^\s*n0 -> return ")
    # The kernel updates @x in place: a dashed red "writes" edge, as for an assign.
    (writes,) = edges_with(src, r"^\s*n0 -> in0 .*writes")
    assert "dashed" in writes and "red" in writes


def test_dot_source_renders():
    dot = export.to_dot(kernel_graph())
    assert isinstance(dot, graphviz.Digraph)
    if shutil.which("dot"):
        assert b"<svg" in dot.pipe(format="svg")


def test_graph_to_dot_method_calls_export():
    g = sgd_graph()
    assert g.to_dot().source == export.to_dot(g).source


# -- networkx -----------------------------------------------------------------------------------
def test_networkx_nodes_and_attributes():
    g = export.to_networkx(sgd_graph())
    assert isinstance(g, nx.MultiDiGraph)
    assert set(g.nodes) == {"@w", "%g", "%0", "%1", "%2", "%3", "%4", "%5", "return"}
    assert g.nodes["@w"] == {"op": "param", "label": "@w", "type": "f32[4,3]", "loc": None}
    assert g.nodes["%g"]["op"] == "arg"
    assert g.nodes["%0"] == {"op": "constant", "label": "%0", "type": "f32[]",
                             "loc": "/src/train.py:7"}
    assert g.nodes["%2"]["loc"] == "/src/train.py:8"
    assert g.nodes["%4"]["op"] == "assign" and g.nodes["%4"]["type"] == "token"
    assert g.nodes["return"]["op"] == "return"


def test_networkx_edges_one_per_operand():
    g = export.to_networkx(sgd_graph())
    # 2 (multiply) + 2 (subtract) + 1 (sum) + 2 data & 1 after (assign) + 1 data & 1 after
    # (depend) + 1 output & 1 effect (return).
    assert g.number_of_edges() == 12
    kinds = [d["kind"] for _, _, d in g.edges(data=True)]
    assert kinds.count("data") == 9 and kinds.count("after") == 2 and kinds.count("effect") == 1
    # Operand positions: subtract @w, %1.
    sub = {d["index"]: u for u, _, d in g.in_edges("%2", data=True)}
    assert sub == {0: "@w", 1: "%1"}
    # The assign: data @w, %2, then after(%3) at position 2.
    assign = sorted((d["index"], u, d["kind"], d["type"]) for u, _, d in g.in_edges("%4", data=True))
    assert assign == [(0, "@w", "data", "f32[4,3]"), (1, "%2", "data", "f32[4,3]"),
                      (2, "%3", "after", "f32[]")]
    (effect,) = [d for u, _, d in g.in_edges("return", data=True) if d["kind"] == "effect"]
    assert effect["type"] == "token" and effect["value"] == "%4"


def test_networkx_repeated_operand_is_two_edges():
    g = Graph("square")
    x = g.add_input("arg", "x", TensorType((3,), f32))
    g.outputs = [g.add_node("multiply", [x, x]).out]
    nxg = export.to_networkx(g)
    assert nxg.number_of_edges("%x", "%0") == 2
    assert sorted(d["index"] for _, _, d in nxg.in_edges("%0", data=True)) == [0, 1]


def test_networkx_is_a_dag_whose_order_respects_effects():
    g = export.to_networkx(sgd_graph())
    assert nx.is_directed_acyclic_graph(g)
    order = list(nx.topological_sort(g))
    assert order.index("%3") < order.index("%4") < order.index("%5") < order.index("return")


def test_networkx_body_region():
    g = export.to_networkx(kernel_graph())
    assert set(g.nodes) == {"@x", "%y", "%0", "return"}
    body = g.nodes["%0"]["body"]
    assert set(body.nodes) == {"%a", "%b", "%0", "%1", "%2", "return"}
    assert body.nodes["%1"]["op"] == "add"


# -- dump ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("ext", ["txt", "gir"])
def test_dump_text_parses_back(tmp_path, ext):
    g = sgd_graph()
    out = export.dump(g, tmp_path / f"step.{ext}")
    assert out == tmp_path / f"step.{ext}"
    text = out.read_text()
    assert text.strip() == g.format(locs=True)
    assert 'loc("train.py":8)' in text
    assert parse(text).format(locs=True) == text.strip()


def test_dump_dot_and_gv(tmp_path):
    g = sgd_graph()
    for name in ("step.dot", "step.gv"):
        out = export.dump(g, str(tmp_path / name))
        assert out.read_text() == export.to_dot(g).source
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step.dot", "step.gv"]


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_dump_svg_writes_exactly_that_file(tmp_path):
    out = export.dump(sgd_graph(), tmp_path / "step.svg")
    data = out.read_bytes()
    assert data.startswith(b"<?xml") or b"<svg" in data
    assert b"assign @w" in data
    assert [p.name for p in tmp_path.iterdir()] == ["step.svg"]


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_dump_png(tmp_path):
    out = export.dump(sgd_graph(), tmp_path / "step.PNG")
    assert out.read_bytes().startswith(b"\x89PNG")


def test_dump_unknown_extension(tmp_path):
    with pytest.raises(GraphoptError, match=r"\.html.*supported: \.gir, \.txt, \.dot, \.gv, \.svg"):
        export.dump(sgd_graph(), tmp_path / "step.html")
    assert not (tmp_path / "step.html").exists()


def test_dump_without_dot_on_path(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(RenderError) as err:
        export.dump(sgd_graph(), tmp_path / "step.svg")
    msg = str(err.value)
    for hint in ("apt install graphviz", "brew install graphviz", "conda install graphviz",
                 ".dot", ".txt"):
        assert hint in msg
    assert not (tmp_path / "step.svg").exists()
    # Text formats still work without Graphviz.
    assert export.dump(sgd_graph(), tmp_path / "step.dot").exists()


def test_dump_when_dot_cannot_be_run(tmp_path, monkeypatch):
    # `which` claims dot exists, but PATH has no dot: graphviz raises ExecutableNotFound.
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: "/nonexistent/dot")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RenderError, match="apt install graphviz"):
        export.dump(sgd_graph(), tmp_path / "step.pdf")
    assert not (tmp_path / "step.pdf").exists()
