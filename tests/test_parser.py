"""The text parser: parse(str(g)) prints as g does, and malformed text fails at the right place."""
from __future__ import annotations

import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphopt.errors import ParseError
from graphopt.ir import (REGISTRY, Graph, Location, OpDef, TensorType, bf16, bool_, f16, f32, f64,
                         get_op, i32, i64, parse, token)
from graphopt.ir import parser
from graphopt.ir.registry import ELEMENTWISE


def T(*shape: int, dtype=f32) -> TensorType:
    return TensorType(shape, dtype)


def roundtrip(g: Graph, *, locs: bool = False) -> Graph:
    """Parse g's text, check it prints the same and that every node re-type-checks."""
    text = g.format(locs=locs)
    g2 = parse(text)
    assert g2.format(locs=locs) == text
    assert g2.name == g.name
    assert [(v.kind, v.name, v.type) for v in g2.inputs] == [(v.kind, v.name, v.type)
                                                            for v in g.inputs]
    assert [n.op for n in g2.nodes] == [n.op for n in g.nodes]
    for n in g2.nodes:
        inferred = get_op(n.op).infer([v.type for v in n.inputs], n.attrs)
        assert inferred == [v.type for v in n.outputs], n
    return g2


def err(text: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse(text)
    return info.value


def body(*lines: str) -> str:
    """A graph whose node lines start at line 3 (line 2 declares %x: f32[4])."""
    return "graph g {\n  arg %x: f32[4]\n" + "".join(f"{ln}\n" for ln in lines) + "  return\n}\n"


# -- round trips --------------------------------------------------------------------------------
def test_printer_docstring_example():
    text = ("graph step {  # bytes per run: 340 B (read 196 B, written 144 B)\n"
            "  param @w: f32[4,3]\n  arg %g: f32[4,3]\n"
            "  %0 = constant {value=0.1} : f32[]\n  %1 = multiply %0, %g : f32[4,3]\n"
            "  %2 = subtract @w, %1 : f32[4,3]\n  %3 = assign @w, %2 : token\n"
            "  return after(%3)\n}")
    g = parse(text)
    assert str(g) == text
    assert g.param("w").type == T(4, 3)
    # The value is stored rounded to the dtype, as the tracer stores it; it prints as 0.1.
    assert g.nodes[0].attrs == {"value": float(np.float32(0.1)), "shape": (), "dtype": f32}
    assert g.effects == [g.nodes[3].out] and g.outputs == []
    assert g.nodes[2].inputs == [g.inputs[0], g.nodes[1].out]


def test_elementwise_and_dotted_names():
    g = Graph("ew")
    a = g.add_input("arg", "grads.0", T(4, 3))
    b = g.add_input("arg", "grads.1", T(3))
    p = g.add_input("param", "layer.w", T(4, 3))
    s = g.add_node("add", [a, b]).out
    m = g.add_node("multiply", [s, p]).out
    q = g.add_node("sqrt", [g.add_node("abs", [m]).out]).out
    c = g.add_node("isfinite", [q]).out
    w = g.add_node("where", [g.add_node("logical_not", [c]).out, q, a]).out
    lt = g.add_node("less", [w, b]).out
    g.outputs += [w, lt]
    g2 = roundtrip(g)
    assert "%grads.0" in str(g2) and "@layer.w" in str(g2)
    assert g2.inputs[0].name == "grads.0" and g2.inputs[2].is_param
    assert g2.outputs[1].type == T(4, 3, dtype=bool_)
    assert g2.nodes[0].inputs == g2.inputs[:2]


def test_reductions_keep_tuple_axes():
    g = Graph()
    x = g.add_input("arg", "x", T(2, 3, 4))
    s = g.add_node("sum", [x], {"axes": [0, 2], "keepdims": True}).out
    m = g.add_node("mean", [x], {"axes": (1,), "keepdims": False}).out
    mx = g.add_node("max", [x], {"axes": (), "keepdims": False}).out
    g.outputs += [s, m, mx]
    g2 = roundtrip(g)
    assert "{axes=[0, 2], keepdims=true}" in str(g2)
    attrs = [n.attrs for n in g2.nodes]
    assert attrs == [{"axes": (0, 2), "keepdims": True}, {"axes": (1,), "keepdims": False},
                     {"axes": (), "keepdims": False}]
    assert all(type(a["axes"]) is tuple and type(a["keepdims"]) is bool for a in attrs)
    assert [v.type for v in g2.outputs] == [T(1, 3, 1), T(2, 4), T(2, 3, 4)]


def test_shape_ops_and_matmul():
    g = Graph()
    x = g.add_input("arg", "x", T(4, 3))
    r = g.add_node("reshape", [x], {"shape": [3, 4]}).out
    t = g.add_node("transpose", [r], {"perm": (1, 0)}).out
    b = g.add_node("broadcast_to", [g.add_input("arg", "bias", T(3))], {"shape": (4, 3)}).out
    mm = g.add_node("matmul", [t, g.add_node("transpose", [b], {"perm": [1, 0]}).out]).out
    g.outputs.append(mm)
    g2 = roundtrip(g)
    assert g2.nodes[0].attrs == {"shape": (3, 4)} and type(g2.nodes[0].attrs["shape"]) is tuple
    assert g2.nodes[1].attrs["perm"] == (1, 0)
    assert g2.nodes[2].attrs["shape"] == (4, 3)
    assert g2.outputs[0].type == T(4, 4)


@pytest.mark.parametrize("value, dtype", [(0.1, f32), (-0.0, f64), (3, i32), (True, bool_),
                                          (1e-08, bf16), (0.1, f16), (float("nan"), f16),
                                          (float("-inf"), f32), (2**40, i64)])
def test_scalar_constants_stay_python_scalars(value, dtype):
    g = Graph()
    attrs = {"value": value, "shape": (2,), "dtype": dtype}
    g.outputs.append(g.add_node("constant", [], attrs).out)
    g2 = roundtrip(g)
    got = g2.nodes[0].attrs
    assert type(got["value"]) is type(value)
    # The printer may round a float to the digits its dtype holds: compare in that dtype.
    same = np.asarray(got["value"], dtype.np_dtype) == np.asarray(value, dtype.np_dtype)
    assert same or (math.isnan(value) and math.isnan(got["value"]))
    assert got["shape"] == (2,) and got["dtype"] is dtype


@pytest.mark.parametrize("array", [
    np.array([[1.0, 2.0]], np.float32),
    np.array([0.1, -2.5, 65504.0], np.float16),
    np.array([[0.1, 3.0], [1e-3, -7.0]], ml_dtypes.bfloat16),
    np.array([[1, -2], [3, 2**31 - 1]], np.int32),
    np.array([True, False, True], np.bool_),
    np.array([np.nan, np.inf, -np.inf, -0.0, 1e300], np.float64),
    np.zeros((0, 3), np.float32),
])
def test_array_constants(array):
    dtype = {d.np_dtype: d for d in (f16, bf16, f32, f64, i32, i64, bool_)}[array.dtype]
    g = Graph()
    node = g.add_node("constant", [], {"value": array, "shape": array.shape, "dtype": dtype})
    g.outputs.append(node.out)
    g2 = roundtrip(g)
    value = g2.nodes[0].attrs["value"]
    assert isinstance(value, np.ndarray)
    assert value.dtype == array.dtype and value.shape == array.shape
    assert np.array_equal(value.astype(np.float64), array.astype(np.float64), equal_nan=True)


def test_constant_text_by_hand():
    g = parse("graph c {\n  %0 = constant {value=[[1.0, 2.0]]} : f32[1,2]\n  return %0\n}")
    value = g.nodes[0].attrs["value"]
    assert value.dtype == np.float32 and value.shape == (1, 2) and value.tolist() == [[1.0, 2.0]]
    assert g.nodes[0].attrs["shape"] == (1, 2) and g.nodes[0].attrs["dtype"] is f32


def test_cast_dtype_attr():
    g = Graph()
    x = g.add_input("arg", "x", T(4))
    g.outputs.append(g.add_node("cast", [g.add_node("cast", [x], {"dtype": bf16}).out],
                                {"dtype": i64}).out)
    g2 = roundtrip(g)
    assert "cast %x {dtype=bf16} : bf16[4]" in str(g2)
    assert g2.nodes[0].attrs["dtype"] is bf16 and g2.nodes[1].attrs["dtype"] is i64


def sgd_momentum() -> Graph:
    g = Graph("sgd_momentum")
    w, v = g.add_input("param", "w", T(4, 3)), g.add_input("param", "v", T(4, 3))
    grad, lr = g.add_input("arg", "grads.0", T(4, 3)), g.add_input("arg", "lr", T())
    mu = g.add_node("constant", [], {"value": 0.9, "shape": (), "dtype": f32},
                    loc=Location("/home/me/train.py", 12)).out
    v_new = g.add_node("add", [g.add_node("multiply", [mu, v]).out, grad],
                       loc=Location("/home/me/train.py", 13)).out
    w_new = g.add_node("subtract", [w, g.add_node("multiply", [lr, v_new]).out]).out
    t_v = g.add_node("assign", [v, v_new], loc=Location("optim.py", 40)).out
    t_w = g.add_node("assign", [w, w_new], after=[t_v]).out
    loss = g.add_node("depend", [g.add_node("sum", [grad], {"axes": (0, 1), "keepdims": False})
                                 .out], after=[t_w]).out
    g.outputs.append(loss)
    g.effects += [t_v, t_w]
    return g


def test_assign_after_edges_and_depend():
    g2 = roundtrip(sgd_momentum())
    assign_v, assign_w = g2.assigns()
    assert assign_w.after == [assign_v.out] and assign_v.after == []
    assert assign_w.inputs[0] is g2.param("w") and assign_v.out.type == token
    depend = g2.nodes[-1]
    assert depend.op == "depend" and depend.after == [assign_w.out]
    assert g2.outputs == [depend.out] and g2.effects == [assign_v.out, assign_w.out]
    assert "return %8 after(%5, %6)" in str(g2)


def test_locations_round_trip():
    g = sgd_momentum()
    text = g.format(locs=True)
    assert '%0 = constant {value=0.9} : f32[]  loc("train.py":12)' in text
    g2 = roundtrip(g, locs=True)
    assert g2.nodes[0].loc == Location("train.py", 12)
    assert g2.nodes[5].loc == Location("optim.py", 40) and g2.nodes[3].loc is None
    assert "loc(" not in str(g2)  # locations print only when asked


def test_multi_output_and_no_output_nodes(monkeypatch):
    def two(types, attrs):
        return [types[0], TensorType((), types[0].dtype)]
    monkeypatch.setitem(REGISTRY, "split2", OpDef("split2", ELEMENTWISE, two))
    monkeypatch.setitem(REGISTRY, "sink", OpDef("sink", ELEMENTWISE, lambda types, attrs: []))
    g = Graph()
    x = g.add_input("arg", "x", T(4))
    a, b = g.add_node("split2", [x]).outputs
    g.add_node("sink", [b])
    g.outputs += [a, b]
    text = str(g)
    assert "%0, %1 = split2 %x : f32[4], f32[]" in text
    g2 = roundtrip(g)
    assert g2.outputs == g2.nodes[0].outputs and g2.nodes[1].outputs == []
    assert g2.nodes[1].inputs == [g2.nodes[0].outputs[1]]


def test_all_attr_value_kinds(monkeypatch):
    monkeypatch.setitem(REGISTRY, "note", OpDef("note", ELEMENTWISE, lambda t, a: [t[0]]))
    text = ('graph g {  # bytes per run: 8 B (read 4 B, written 4 B)\n  arg %x: f32[]\n  %0 = note %x {a=true, b=-3, c=nan, d=-inf, e=inf, '
            'f=1e-08, g=bool, h="tab\\t \\"q\\" # not a comment", i=[[0, 1], [], [2.5]]} : f32[]'
            '\n  return %0\n}')
    g = parse(text)
    assert str(g) == text
    a = g.nodes[0].attrs
    assert a["a"] is True and a["b"] == -3 and type(a["b"]) is int and math.isnan(a["c"])
    assert a["d"] == -math.inf and a["e"] == math.inf and a["f"] == 1e-08 and a["g"] is bool_
    assert a["h"] == 'tab\t "q" # not a comment'
    assert a["i"] == ((0, 1), (), (2.5,))


def test_comments_blank_lines_and_return_forms():
    text = """# a hand-written graph

graph hand {   # the header
  param @p: f32[2]
  arg %x: f32[2]   # per-call

  %0 = add @p, %x : f32[2]
  %1 = assign @p, %0 : token
  return %0, %x after(%1)
}
# trailing comment
"""
    g = parse(text)
    assert str(g) == ("graph hand {  # bytes per run: 40 B (read 24 B, written 16 B)\n"
                      "  param @p: f32[2]\n  arg %x: f32[2]\n"
                      "  %0 = add @p, %x : f32[2]\n  %1 = assign @p, %0 : token\n"
                      "  return %0, %x after(%1)\n}")
    assert g.outputs == [g.nodes[0].out, g.inputs[1]] and g.effects == [g.nodes[1].out]
    assert parse("graph e {\n  return\n}").outputs == []
    assert parse("graph e {\n  arg %x: f32[]\n  return %x\n}").outputs[0].name == "x"


def test_forward_references_and_cycles_parse():
    g = parse(body("  %0 = add %1, %x : f32[4]", "  %1 = negative %x : f32[4]"))
    assert g.nodes[0].inputs == [g.nodes[1].out, g.inputs[0]]
    cyc = parse(body("  %0 = negative %1 : f32[4]", "  %1 = negative %0 : f32[4]"))
    assert cyc.nodes[0].inputs == [cyc.nodes[1].out] and cyc.nodes[1].inputs == [cyc.nodes[0].out]


def test_quoted_names():
    g = parse('graph "my step" {\n  arg %"a b": f32[]\n  %0 = negative %"a b" : f32[]\n'
              '  return %0\n}')
    assert g.name == "my step" and g.inputs[0].name == "a b"
    assert g.nodes[0].inputs == [g.inputs[0]]




def _rules(text: str) -> dict[str, str]:
    """The productions of an EBNF text: name -> right-hand side, spaces and comments dropped."""
    text = re.sub(r"\(\*.*?\*\)", "", text, flags=re.S)
    return {m[1]: " ".join(m[2].split()) for m in re.finditer(r"(\w+)\s*=\s*(.*?)\s;", text, re.S)}


def test_the_ir_page_grammar_is_the_parsers():
    """docs/ir.md's grammar blocks (not run) are the grammar parser.py implements and states,
    and name its dtypes and bare attribute words."""
    page = (Path(__file__).parent.parent / "docs" / "ir.md").read_text()
    shown: dict[str, str] = {}
    for block in re.findall(r'```ebnf title="not run: a grammar"\n(.*?)```', page, re.S):
        shown.update(_rules(block))  # the second block extends `node` with a kernel's body
    assert shown == _rules(parser.__doc__.split("Grammar", 1)[1].split("\n\n")[1])
    assert re.findall(r'"(\w+)"', shown["dtype"]) == list(parser.DTYPES)
    assert {"true", "false", "nan", "inf"} == set(parser._WORDS) <= set(
        re.findall(r'"(\w+)"', shown["attr"]))

# -- errors, with their exact place -------------------------------------------------------------
@pytest.mark.parametrize("lines, line, col, message", [
    (["  %0 = frobnicate %x : f32[4]"], 3, 8, "unknown op 'frobnicate'"),
    (["  %0 = negative %y : f32[4]"], 3, 17, "undefined value %y"),
    (["  %0 = negative %x : f32[4]", "  %0 = negative %x : f32[4]"], 4, 3, "%0 is defined twice"),
    (["  %x = negative %x : f32[4]"], 3, 3, "%x is defined twice"),
    (["  %0 = negative %x : f32[4,x]"], 3, 28, "expected a dimension"),
    (["  %0 = negative %x : f32(4)"], 3, 25, "expected '['"),
    (["  %0 = negative %x : 4"], 3, 22, "expected a type"),
    (["  %0 = negative %x : f33[4]"], 3, 22, "unknown dtype 'f33'"),
    (["  %0 = cast %x {dtype=f33} : f32[4]"], 3, 23, "unknown dtype or attribute value 'f33'"),
    (["  %0 negative %x : f32[4]"], 3, 6, "expected '='"),
    (["  %0 = sum %x {axes=[0], keepdims=false : f32[]"], 3, 41, "expected ',' or '}'"),
    (["  %0 = sum %x {axes=[0]"], 3, 24, "expected ',' or '}'"),
    (["  %0 = negative %x ! : f32[4]"], 3, 20, "unexpected '!'"),
    (["  %0 = negative %x : f32[4] junk"], 3, 29, "expected the end of the line"),
    (["  %0 = negative %x %x : f32[4]"], 3, 20, "expected ':'"),
    (["  %0, %1 = negative %x : f32[4]"], 3, 24, "2 result name(s) but 1 type(s)"),
    (['  %0 = cast %x {dtype="f32} : f32[4]'], 3, 23, "unterminated string"),
    (["  %0 = constant {value=1.0, shape=[4]} : f32[4]"], 3, 29, "given by the result type"),
    (["  %0 = constant {value=[[1.0], [2.0, 3.0]]} : f32[2,1]"], 3, 24, "not an array of f32"),
    (["  @w = negative %x : f32[4]"], 3, 3, "a node defines %names"),
])
def test_parse_errors(lines, line, col, message):
    e = err(body(*lines))
    assert (e.line, e.col) == (line, col)
    assert message in e.message
    assert f"line {line}, column {col}" in str(e) and lines[line - 3] in str(e)
    assert str(e).endswith("\n  " + " " * (col - 1) + "^")  # the caret under the token


def test_structural_errors():
    e = err("graph g {\n  arg %x: f32[4]\n}")
    assert (e.line, e.col) == (3, 1) and "expected 'return'" in e.message
    e = err("graph g {\n  param %x: f32[4]\n  return\n}")
    assert (e.line, e.col) == (2, 9) and "param names start with '@'" in e.message
    e = err("graph g {\n  return\n}\ngraph h {")
    assert (e.line, e.col) == (4, 1) and "end of the text" in e.message
    e = err("grph g {\n  return\n}")
    assert (e.line, e.col) == (1, 1) and "expected 'graph'" in e.message
    e = err("graph g {\n  return after(%t\n}")
    assert (e.line, e.col) == (2, 18) and "to close after(...)" in e.message
    assert isinstance(e, ValueError)


# -- property: random elementwise chains round-trip ---------------------------------------------
DTYPES = [f16, bf16, f32, f64, i32, i64, bool_]
OPS = [  # (name, arity, kinds it accepts)
    ("add", 2, "fi"), ("subtract", 2, "fi"), ("multiply", 2, "fi"), ("maximum", 2, "fi"),
    ("power", 2, "fi"), ("divide", 2, "f"), ("negative", 1, "fi"), ("abs", 1, "fi"),
    ("sqrt", 1, "f"), ("rsqrt", 1, "f"), ("exp", 1, "f"), ("log", 1, "f"),
    ("isfinite", 1, "fib"), ("less", 2, "fi"), ("equal", 2, "fib"), ("logical_and", 2, "b"),
    ("logical_not", 1, "b"),
]


def scalar(dtype):
    if dtype.kind == "bool":
        return st.booleans()
    if dtype.kind == "int":
        return st.integers(-2**31, 2**31 - 1)
    width = {"f16": 16, "f32": 32}.get(dtype.name, 64)
    # bf16 values are drawn as f64 and rounded to bf16, so they print and read back exactly.
    return st.floats(width=width).map(lambda x: float(np.asarray(x, dtype.np_dtype)))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_elementwise_chains_round_trip(data):
    base = data.draw(st.lists(st.integers(1, 4), max_size=3), label="shape")

    def sub_shape():  # broadcasts with base: a suffix of it, some axes set to 1
        k = data.draw(st.integers(0, len(base)))
        return tuple(1 if data.draw(st.booleans()) else s for s in base[len(base) - k:])

    g = Graph("random")
    pool = [g.add_input("arg", f"in.{i}", TensorType(sub_shape(),
                                                         data.draw(st.sampled_from(DTYPES))))
            for i in range(data.draw(st.integers(1, 3)))]
    for step in range(data.draw(st.integers(1, 12))):
        loc = Location("gen.py", step + 1) if data.draw(st.booleans()) else None
        choice = data.draw(st.sampled_from(["op", "op", "op", "cast", "constant"]))
        x = data.draw(st.sampled_from(pool))
        if choice == "cast":
            node = g.add_node("cast", [x], {"dtype": data.draw(st.sampled_from(DTYPES))}, loc=loc)
        elif choice == "constant":
            dtype, shape = data.draw(st.sampled_from(DTYPES)), sub_shape()
            if data.draw(st.booleans()):
                value = data.draw(scalar(dtype))
            else:
                items = data.draw(st.lists(scalar(dtype), min_size=math.prod(shape),
                                           max_size=math.prod(shape)))
                value = np.array(items, dtype.np_dtype).reshape(shape)
            node = g.add_node("constant", [], {"value": value, "shape": shape, "dtype": dtype},
                              loc=loc)
        else:
            ops = [(n, k) for n, k, kinds in OPS if x.dtype.kind[0] in kinds]
            name, arity = data.draw(st.sampled_from(ops))
            same = [v for v in pool if v.dtype == x.dtype]
            operands = [x] + [data.draw(st.sampled_from(same)) for _ in range(arity - 1)]
            node = g.add_node(name, operands, loc=loc)
        pool.append(node.out)
    g.outputs += data.draw(st.lists(st.sampled_from(pool), max_size=3))
    roundtrip(g)
    g2 = roundtrip(g, locs=True)
    assert [n.loc for n in g2.nodes] == [n.loc for n in g.nodes]


def test_an_input_named_like_a_number_keeps_the_results_apart():
    # A node's result is numbered past any input of that name, so the text parses back.
    text = "graph g {\n  arg %0: f32[2]\n  %1 = exp %0 : f32[2]\n  return %1\n}\n"
    printed = str(parse(text))
    assert "%0 = exp" not in printed and str(parse(printed)) == printed
