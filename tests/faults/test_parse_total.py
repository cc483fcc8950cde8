"""Family 14: the IR text is total. Whatever `parse` is given ends in a Graph, a ParseError
with the line and column of the offending token (not a str: ParseInputError, a TypeError),
or, for attributes of the wrong kind, a VerifyError naming the node; never a raw TypeError,
AttributeError, JSONDecodeError, RecursionError, OverflowError or ValueError. Deep nesting
runs in a child process; a fuzz mutates the printed graphs of the test programs."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphopt.errors import GraphoptError, ParseError, ParseInputError, VerifyError
from graphopt.ir import parse
from graphopt.ir.parser import MAX_DEPTH
from graphopt.passes import run
from irfaults import (check_attr_kind, check_place, cli_in_child, graph_text, in_child,
                      kernel_text, parse_error)

TESTS = Path(__file__).parents[1]


# -- not a str ----------------------------------------------------------------------------------
@pytest.mark.parametrize("arg", [b"graph g {\n  return\n}\n", bytearray(b"graph g {}"), None, 42,
                                 ["graph g {"], Path("g.gir")], ids=lambda a: type(a).__name__)
def test_parse_takes_a_str(arg):
    with pytest.raises(ParseInputError) as info:
        parse(arg)
    e = info.value
    assert isinstance(e, TypeError) and isinstance(e, GraphoptError)
    assert f"parse takes the text of a graph as a str, got {type(arg).__name__}" in str(e)
    if isinstance(arg, (bytes, bytearray)):
        assert "decode" in str(e)


# -- syntax: the line and column of the token -------------------------------------------------
DIGITS_5000 = "9" * 5000
PLACED = [  # (text, line, column, what the message says)
    ('graph "\\q" {\n  return\n}\n', 1, 8, "bad string: invalid \\escape"),
    (graph_text('  %0 = negative %"a\\x" : f32[4]'), 4, 20, "bad string: invalid \\escape"),
    (graph_text('  %0 = cast %x {dtype="f\t32"} : f32[4]'), 4, 25, "invalid control character"),
    (graph_text('  %0 = negative %x : f32[4]  loc("a\\u12":3)'), 4, 37,
     "bad string: invalid \\uxxxx escape"),
    (graph_text("  %0 = constant {value=99999999999999999999999999999} : i32[]"), 4, 24,
     "an integer of about 2**96 is out of the range of i32"),
    (graph_text("  %0 = constant {value=2147483648} : i32[]"), 4, 24,
     "2147483648 is out of the range of i32 [-2147483648, 2147483647]"),
    (graph_text("  %0 = constant {value=[1, -9223372036854775809]} : i64[2]"), 4, 24,
     "out of the range of i64"),
    (graph_text(f"  %0 = constant {{value=1{'0' * 400}}} : f32[]"), 4, 24,
     "out of the range of f32"),
    (graph_text(f"  %0 = constant {{value={DIGITS_5000}}} : i64[]"), 4, 24,
     "an integer of 5000 digits is too long"),
    (graph_text(f"  %0 = negative %x : f32[{DIGITS_5000}]"), 4, 26,
     "an integer of 5000 digits is too long"),
    (graph_text(f'  %0 = negative %x : f32[4]  loc("a":{DIGITS_5000})'), 4, 38,
     "an integer of 5000 digits is too long"),
    (graph_text("  %0 = negative %x \x00 : f32[4]"), 4, 20, "unexpected '\\x00'"),
]


@pytest.mark.parametrize("text, line, col, message", PLACED, ids=range(len(PLACED)))
def test_malformed_text_is_a_parse_error_at_its_token(text, line, col, message):
    e = parse_error(text)
    check_place(e, line, col, text)
    assert message in str(e)


# -- attributes of the wrong kind: the verifier names the node ----------------------------------
KINDS = [  # (a graph, the attribute, what it must be)
    (graph_text("  %0 = cast %x {dtype=3} : f32[4]"), "dtype", "a dtype (f16, bf16, f32"),
    (graph_text('  %0 = cast %x {dtype="f32"} : f32[4]'), "dtype", "a dtype"),
    (graph_text("  %0 = sum %x {axes=0, keepdims=false} : f32[]"), "axes", "a list of integers"),
    (graph_text('  %0 = reshape %x {shape="ab"} : f32[4]'), "shape",
     "a shape (a list of integers >= 0)"),
    (graph_text("  %0 = transpose %x {perm=[1.0, 0.0]} : f32[4]"), "perm", "a list of integers"),
    (graph_text("  %0 = broadcast_to %x {shape=[[4]]} : f32[4]"), "shape", "a shape"),
    (graph_text("  %0 = log_softmax %x {axis=[0]} : f32[4]"), "axis", "an integer"),
    (kernel_text('spaces=4, outputs=["map"], shared=[]'), "spaces", "a list of shapes"),
    (kernel_text('spaces=[[4]], outputs=["map"], shared="a"'), "shared", "a list of integers"),
    (kernel_text('spaces=[[4]], outputs="map", shared=[]'), "outputs", "a list of strings"),
    (kernel_text('spaces=[[4]], outputs=["map"], shared=[true]'), "shared", "a list of integers"),
]


@pytest.mark.parametrize("text, attr, kind", KINDS, ids=[k[1] for k in KINDS])
def test_an_attribute_of_the_wrong_kind_is_a_verify_error(text, attr, kind):
    check_attr_kind(text, attr, kind)


# A row reduction in a kernel body that names no axis: the type rule's own message (the fuzz
# below once found an IndexError in working out the kernel's row axis first).
@pytest.mark.parametrize("keepdims", ["true", "false"])
def test_a_body_reduction_over_no_axis_is_a_verify_error(keepdims):
    text = ('graph g {\n  arg %x: f32[4,3]\n'
            '  %0 = kernel %x {spaces=[[4, 3]], outputs=["map"], shared=[]} : f32[4,3] {\n'
            '    arg %x0: f32[]\n'
            f'    %0 = sum %x0 {{axes=[], keepdims={keepdims}}} : f32[]\n'
            '    %1 = add %x0, %0 : f32[]\n    return %1\n  }\n  return %0\n}\n')
    with pytest.raises(VerifyError, match=r"sum \{axes=\[\].* in the body: a (row|finish) "
                                          r"reduction reduces the (trailing|leading) axes"):
        parse(text).verify()


# -- nesting: a ParseError at the level past the limit, in a child process ---------------------
def nested_lists(depth: int) -> str:
    value = "[" * depth + "1.0" + "]" * depth
    return graph_text(f"  %0 = constant {{value={value}}} : f32[{','.join(['1'] * depth)}]")


def nested_kernels(depth: int) -> str:
    """Kernels inside kernel bodies, `depth` deep (unindented: the grammar does not care)."""
    open_ = '%0 = kernel %x {spaces=[[4]], outputs=["map"], shared=[]} : f32[4] {\narg %x: f32[]'
    return ("graph g {\narg %x: f32[4]\n" + f"{open_}\n" * depth + "return %x\n" +
            "}\nreturn %0\n" * depth + "}\n")


@pytest.mark.parametrize("text, line, col, what", [
    (nested_lists(5000), 4, 24 + MAX_DEPTH, "lists"),
    (graph_text("  %0 = sum %x {axes=" + "[" * 5000 + "]" * 5000 + ", keepdims=false} : f32[]"),
     4, 21 + MAX_DEPTH, "lists"),
    (nested_lists(MAX_DEPTH + 1), 4, 24 + MAX_DEPTH, "lists"),
    (nested_kernels(2000), 2 + 2 * MAX_DEPTH + 1, 68, "kernel bodies"),
    (nested_kernels(MAX_DEPTH + 1), 2 + 2 * MAX_DEPTH + 1, 68, "kernel bodies"),
], ids=["5000 lists", "5000 axes lists", "65 lists", "2000 kernels", "65 kernels"])
def test_deep_nesting_is_a_parse_error(child, tmp_path, text, line, col, what):
    (out,) = in_child(child, tmp_path, text)
    assert out["result"] == "ParseError", out
    assert (out["line"], out["col"]) == (line, col)
    assert f"{what} nest more than {MAX_DEPTH} deep" in out["message"]


def test_nesting_up_to_the_limit_parses(child, tmp_path):
    # A constant of 64 axes is as deep as a numpy array goes: it parses and verifies.
    lists, kernels = in_child(child, tmp_path, nested_lists(MAX_DEPTH), nested_kernels(MAX_DEPTH))
    assert lists["result"] == "ok", lists
    assert kernels["result"] == "VerifyError" and kernels["rule"] == "kernel-body", kernels


# -- through the CLI: one message, no traceback ---------------------------------------------------
CLI_CASES = [
    'graph "\\q" {\n  return\n}\n',
    graph_text("  %0 = constant {value=99999999999999999999999999999} : i32[]"),
    nested_lists(5000),
    nested_kernels(2000),
] + [text for text, _, _ in KINDS]


def test_graphopt_ir_says_what_is_wrong(child, tmp_path):
    for text, run_ in zip(CLI_CASES, cli_in_child(child, tmp_path, ["ir"], *CLI_CASES)):
        assert run_["status"] != 0, (text[:300], run_)
        err = run_["stderr"]
        assert err.startswith("graphopt: error: ") and "Traceback" not in err, (text[:300], err)
        assert "internal error" not in err and run_["stdout"] == "", (text[:300], run_)


# -- fuzz: mutations of the printed graphs of the test programs ---------------------------------
@lru_cache(maxsize=None)
def corpus() -> tuple[str, ...]:
    """Every hand-written test graph as printed, and after the full pipeline (with kernels)."""
    texts = []
    files = sorted(TESTS.glob("passes/**/*.gir")) + sorted(TESTS.glob("ir/verify/*.ir"))
    for path in files:
        try:
            g = parse(path.read_text())
        except ParseError:  # (a test of the parser's errors)
            continue
        texts.append(str(g))
        try:
            texts.append(str(run(g, "dce,cse,fold,simplify,fuse,hfuse").graph))
        except GraphoptError:  # a graph that is meant not to verify
            pass
    assert len(texts) > 50
    return tuple(texts)


WORDS = ["[", "]", "{", "}", "(", ")", ",", ":", "=", "%0", "%1", "@p", "%x", "0", "1", "-1",
         "2.5", "nan", "inf", "-inf", "true", "false", "f32", "i32", "bool", "token", '"a"',
         '"\\q"', '"map"', "9" * 30, "9" * 5000, "1e400", "\u0663", "\n", " ", "#", "kernel",
         "return", "after", "arg", "param", "loc", "constant", "store", "[[", "]]", "-0",
         "[]", "[[4]]", "[0, 1]", "2147483648", "9223372036854775808", "\t", '"', "\\", "@",
         "%", "\x00", "\u2028", "\r", "\ud800"]
TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|[%@][\w.]+|-?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\w+|\S|\n')


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(corpus()))
    for _ in range(draw(st.integers(1, 3))):
        spans = [m.span() for m in TOKEN.finditer(text)]
        a, b = draw(st.sampled_from(spans))
        edit = draw(st.sampled_from(["replace", "insert", "delete", "copy", "line"]))
        if edit == "replace":
            text = text[:a] + draw(st.sampled_from(WORDS)) + text[b:]
        elif edit == "insert":
            text = text[:a] + draw(st.sampled_from(WORDS)) + text[a:]
        elif edit == "delete":
            text = text[:a] + text[b:]
        elif edit == "copy":  # a token of the text in another token's place
            c, d = draw(st.sampled_from(spans))
            text = text[:c] + text[a:b] + text[d:]
        else:  # a line repeated elsewhere
            lines = text.split("\n")
            lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(lines)))
            text = "\n".join(lines)
    return text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_graphs_parse_or_fail_with_a_parse_or_verify_error(text):
    try:
        g = parse(text)
    except ParseError as e:
        lines = text.split("\n")
        assert 1 <= e.line <= len(lines) and 1 <= e.col <= len(lines[e.line - 1]) + 1, str(e)
        return
    try:
        g.verify()
    except VerifyError:
        return
    printed = str(g)  # a graph that verifies prints, and reads back as itself
    again = parse(printed)
    assert str(again) == printed
    again.verify()
