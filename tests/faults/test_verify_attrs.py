"""Family 15: what used to pass the verifier and then failed in LLVM or computed nonsense.
Attributes have the kinds their op declares (OpDef.attr_kinds: an integer is an int, a flag a
bool, a shape a list of ints), a constant's value is one of its dtype's values (an integer in
range, not NaN, inf or a fraction; a bool 0/1/true/false), a token is never data, and only
ASCII digits are digits."""
from __future__ import annotations

import re

import numpy as np
import pytest

from graphopt.ir import REGISTRY, Graph, TensorType, bool_, f32, i32, i64, parse, token
from graphopt.ir.registry import check_attr_kinds
from irfaults import (check_attr_kind, check_place, cli_in_child, graph_text, kernel_text,
                      parse_error, verify_error)


def test_every_attribute_has_a_declared_kind():
    for op in REGISTRY.values():
        assert len(op.attr_kinds) == len(op.attrs), op.name


# -- a digit is 0-9 -----------------------------------------------------------------------------
@pytest.mark.parametrize("line, col", [
    ("  %0 = negative %x : f32[\u0663]", 26),                     # ARABIC-INDIC DIGIT THREE
    ("  %0 = sum %x {axes=[\u0660], keepdims=false} : f32[]", 22),
    ("  %0 = constant {value=\uff11} : f32[]", 24),                  # FULLWIDTH DIGIT ONE
])
def test_a_non_ascii_digit_is_not_a_number(line, col):
    text = graph_text(line)
    e = parse_error(text)
    check_place(e, 4, col, text)
    assert "unexpected" in str(e)


# -- constants fit their dtype ----------------------------------------------------------------
@pytest.mark.parametrize("value, type_, message", [
    ("nan", "i32[]", "nan is not an integer, so not an i32"),
    ("inf", "i64[]", "inf is not an integer, so not an i64"),
    ("-inf", "i32[4]", "-inf is not an integer"),
    ("2.5", "i32[]", "2.5 is not an integer"),
    ("[1, 1.5]", "i64[2]", "1.5 is not an integer"),
    ("2.5", "bool[]", "2.5 is not a bool (true, false, 0, 1)"),
    ("2", "bool[]", "2 is not a bool"),
    ("-1", "bool[3]", "-1 is not a bool"),
    ("nan", "bool[]", "nan is not a bool"),
    ("[true, 2]", "bool[2]", "2 is not a bool"),
    ("-2147483649", "i32[]", "-2147483649 is out of the range of i32"),
    ("9223372036854775808", "i64[]", "9223372036854775808 is out of the range of i64"),
    ('[1.0, "a"]', "f32[2]", "'a' is not a number"),
])
def test_a_constant_that_its_dtype_cannot_hold_is_a_parse_error(value, type_, message):
    text = graph_text(f"  %0 = constant {{value={value}}} : {type_}")
    e = parse_error(text)
    check_place(e, 4, 24, text)  # at the value
    assert f"constant: {message}" in str(e)


@pytest.mark.parametrize("value, type_, stored", [
    ("3.0", "i32[]", 3), ("-2147483648", "i32[]", -2**31), ("1", "bool[]", True),
    ("0.0", "bool[]", False), ("1e39", "f32[]", float("inf")),  # a float rounds, as in numpy
    ("[true, 0, 1]", "bool[3]", [True, False, True]), ("[2, 3.0]", "i64[2]", [2, 3]),
])
def test_a_constant_its_dtype_holds_is_read(value, type_, stored):
    g = parse(graph_text(f"  %0 = constant {{value={value}}} : {type_}"))
    g.verify()
    got = g.nodes[0].attrs["value"]
    assert (got.tolist() if isinstance(got, np.ndarray) else got) == stored


def constant_graph(value, dtype, shape=()) -> Graph:
    g = Graph()
    g.outputs.append(g.add_node("constant", [], {"value": value, "shape": shape, "dtype": dtype},
                                out_types=[TensorType(shape, dtype)]).out)
    return g


@pytest.mark.parametrize("value, dtype, message", [
    (float("nan"), i32, "nan is not an integer, so not an i32"),
    (2**40, i32, "1099511627776 is out of the range of i32"),
    (2.5, bool_, "2.5 is not a bool"),
    (np.array([1.5, 2.0]), i64, "an array with NaN, inf or a fraction is not an array of i64"),
    (np.array([np.inf], np.float32), i32, "an array with NaN, inf or a fraction"),
    (np.array([0, 2]), bool_, "an array with values outside [0, 1] is not an array of bool"),
    (np.array([2**40]), i32, "values outside [-2147483648, 2147483647]"),
    (np.array(["a"]), f32, "an array of <U1 is not an array of numbers"),
])
def test_a_constant_built_in_code_is_checked_by_the_verifier(value, dtype, message):
    shape = value.shape if isinstance(value, np.ndarray) else ()
    e = verify_error(constant_graph(value, dtype, shape))
    assert e.rule == "types" and "constant: " in str(e) and message in str(e)


def test_a_constant_value_of_another_kind_is_an_attr_kind_error():
    e = verify_error(graph_text('  %0 = constant {value="a"} : f32[]'))
    assert e.rule == "attr-kind" and "attribute 'value' must be a number or an array" in str(e)


# -- attribute kinds ----------------------------------------------------------------------------
KINDS = [  # (a graph, the attribute, what it must be)
    (graph_text("  %0 = reshape %x {shape=[4.0]} : f32[4]"), "shape",
     "a shape (a list of integers >= 0)"),
    (graph_text("  %0 = broadcast_to %x {shape=[true, 4]} : f32[4]"), "shape", "a shape"),
    (graph_text('  %0 = sum %x {axes=[0], keepdims="yes"} : f32[1]'), "keepdims", "true or false"),
    (graph_text("  %0 = sum %x {axes=[0], keepdims=1} : f32[1]"), "keepdims", "true or false"),
    (graph_text("  %0 = max %x {axes=[true], keepdims=false} : f32[]"), "axes",
     "a list of integers"),
    (graph_text("  %0 = mean %x {axes=[0.0], keepdims=false} : f32[]"), "axes",
     "a list of integers"),
    (graph_text("  %0 = transpose %x {perm=[0, 1.5]} : f32[4]"), "perm", "a list of integers"),
    (graph_text("  %0 = log_softmax %x {axis=0.0} : f32[4]"), "axis", "an integer"),
    (graph_text("  %0 = log_softmax %x {axis=true} : f32[4]"), "axis", "an integer"),
    (graph_text("  %0 = cast %x {dtype=[f32]} : f32[4]"), "dtype", "a dtype"),
    (kernel_text('spaces=[[4.0]], outputs=["map"], shared=[]'), "spaces", "a list of shapes"),
    (kernel_text('spaces=[4], outputs=["map"], shared=[]'), "spaces", "a list of shapes"),
    (kernel_text('spaces=[[4]], outputs=["map"], shared=[0.0]'), "shared", "a list of integers"),
    (kernel_text('spaces=[[4]], outputs=[1], shared=[]'), "outputs", "a list of strings"),
]


@pytest.mark.parametrize("text, attr, kind", KINDS, ids=[k[1] for k in KINDS])
def test_attributes_have_their_declared_kind(text, attr, kind):
    check_attr_kind(text, attr, kind)


@pytest.mark.parametrize("attrs", [
    {"axes": [0], "keepdims": False},                       # lists, as code writes them
    {"axes": (np.int64(0),), "keepdims": np.bool_(True)},   # numpy scalars, as VJPs make them
])
def test_attribute_kinds_take_what_code_builds(attrs):
    check_attr_kinds(REGISTRY["sum"], attrs)


@pytest.mark.parametrize("attrs, message", [
    ({"axes": np.array([0]), "keepdims": False}, "attribute 'axes' must be a list of integers"),
    ({"axes": [0], "keepdims": None}, "attribute 'keepdims' must be true or false, got None"),
    ({"axes": [2**63], "keepdims": False}, "holds an integer out of the range of int64"),
])
def test_attribute_kinds_in_code_built_graphs(attrs, message):
    g = Graph()
    x = g.add_input("arg", "x", TensorType((4,), f32))
    g.outputs.append(g.add_node("sum", [x], attrs, out_types=[TensorType((), f32)]).out)
    e = verify_error(g)
    assert e.rule == "attr-kind" and message in str(e)


# -- a token is not data ------------------------------------------------------------------------
@pytest.mark.parametrize("text, message", [
    ("graph g {\n  param @p: f32[4]\n  %0 = assign @p, @p : token\n  return %0\n}\n",
     "the return gives the token %0 as data"),
    ("graph g {\n  param @p: f32[4]\n  %0 = assign @p, @p : token\n  %1 = depend %0 : token\n"
     "  return after(%1)\n}\n", "depend: an effect token is not a tensor operand"),
    ("graph g {\n  arg %t: token\n  return after(%t)\n}\n",
     "graph input 't' is a token; inputs are tensors"),
    (kernel_text('spaces=[[4]], outputs=["map"], shared=[]',
                 body=("    arg %x0: token", "    %0 = constant {value=1.0} : f32[]",
                       "    return %0")), "graph input 'x0' is a token"),
    (kernel_text('spaces=[[4]], outputs=["map"], shared=[]', operands="@p",
                 body=("    arg %x0: f32[]", "    %0 = store %x0, %x0 : token", "    return %0")),
     "the return gives the token %0 as data"),
])
def test_a_token_is_never_data(text, message):
    e = verify_error(text)
    assert e.rule == "types" and message in str(e)


def test_a_token_in_after_edges_is_fine():
    text = ("graph g {\n  param @p: f32[4]\n  arg %x: f32[4]\n  %0 = assign @p, %x : token\n"
            "  %1 = depend %x after(%0) : f32[4]\n  return %1 after(%0)\n}\n")
    g = parse(text)
    g.verify()
    assert g.outputs[0].type == TensorType((4,), f32) and g.effects[0].type == token


# -- kernels: at least one instance, shared inputs distinct ------------------------------------
@pytest.mark.parametrize("attrs, operands, types, message", [
    ('spaces=[], outputs=["map"], shared=[]', "", "", "spaces=[]: a kernel has an iteration "
                                                      "space per instance, and at least one"),
    ('spaces=[], outputs=[], shared=[0]', "%x", "", "at least one instance"),
    ('spaces=[[4]], outputs=["map"], shared=[0, 0]', "%x, %x", "f32[4]", "(distinct body inputs)"),
])
def test_kernel_layout_is_checked(attrs, operands, types, message):
    e = verify_error(kernel_text(attrs, operands, types))
    assert e.rule == "types" and message in str(e)


# -- before the backend: the CLI refuses what LLVM used to be handed -----------------------------
REFUSED = [
    kernel_text('spaces=[[4.0]], outputs=["map"], shared=[]'),
    graph_text("  %0 = reshape %x {shape=[4.0]} : f32[4]"),
    graph_text('  %0 = sum %x {axes=[0], keepdims="yes"} : f32[1]'),
]


def test_graphopt_opt_refuses_before_compiling(child, tmp_path):
    args = ["opt", "--passes", "fuse", "--emit", "llvm"]
    for text, run_ in zip(REFUSED, cli_in_child(child, tmp_path, args, *REFUSED)):
        assert run_["status"] != 0, (text, run_)
        # At the file's line of the node (the fourth: the graph, its two inputs, the node).
        assert re.match(r"graphopt: error: \S+\.gir:4: \[attr-kind\]", run_["stderr"]), \
            (text, run_)
        assert "Traceback" not in run_["stderr"]
