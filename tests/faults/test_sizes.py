"""Family 16: sizes. Every tensor has at most 64 dimensions, each >= 0, and at most 2**63-1
bytes; a kernel's iteration spaces at most 2**63-1 elements. The verifier refuses the rest
(rule `size`, or `attr-kind` for a shape attribute), before any backend sees a size that
wraps in int64 (`f32[10**26]` once compiled to a loop that ran zero times). Huge sizes are
parsed and verified in a child process, where an allocation could not take the run down."""
from __future__ import annotations

import re

import pytest

from graphopt.ir import Graph, TensorType, f32, parse
from graphopt.ir.types import MAX_NDIM
from irfaults import cli_in_child, graph_text, in_child, kernel_text, verify_error

E26 = 10**26
SIZE = [  # (text, rule, what the message says)
    (graph_text(inputs=f"  arg %x: f32[{E26}]\n"), "size",
     f"graph input 'x': f32[{E26}] has a dimension of about 2**86 (at most 2**63-1)"),
    (graph_text(inputs=f"  arg %x: f32[{2**63}]\n"), "size", "a dimension of about 2**63"),
    (graph_text(inputs=f"  arg %x: f32[{2**63 - 1}]\n"), "size", "about 2**64 bytes"),
    (graph_text(inputs=f"  arg %x: f32[{2**61}]\n"), "size", "about 2**63 bytes"),
    (graph_text(inputs=f"  arg %x: f64[{2**60}]\n"), "size", "about 2**63 bytes"),
    (graph_text(inputs=f"  arg %x: f32[{2**32},{2**32}]\n"), "size", "about 2**66 bytes"),
    (graph_text(inputs=f"  arg %x: f32[0,{2**63}]\n"), "size", "a dimension of about 2**63"),
    (graph_text(inputs=f"  param @p: f32[{','.join(['1'] * (MAX_NDIM + 1))}]\n"), "size",
     "65 dimensions (at most 64)"),
    (graph_text(f"  %0 = negative %x : f32[{E26}]"), "size",
     f"a result of type f32[{E26}] has a dimension of about 2**86"),
    (graph_text(f"  %0 = constant {{value=1.0}} : f32[{E26}]"), "size", "a dimension of about"),
    (graph_text(f"  %0 = constant {{value=1.0}} : f32[{E26}]",
                f"  %1 = sum %0 {{axes=[0], keepdims=false}} : f32[]"), "size",
     "a dimension of about 2**86"),
    (graph_text(f"  %0 = reshape %x {{shape=[{2**62}]}} : f32[{2**62}]"), "size",
     "about 2**64 bytes"),
    (graph_text(f"  %0 = broadcast_to %x {{shape=[{2**40}, {2**40}]}} : f32[{2**40},{2**40}]"),
     "size", "about 2**82 bytes"),
    (graph_text(f"  %0 = reshape %x {{shape=[{E26}]}} : f32[4]"), "attr-kind",
     "attribute 'shape' is a shape with a dimension of about 2**86"),
    (kernel_text(f'spaces=[[{E26}]], outputs=["sum"], shared=[0]', "%s", "f32[]"), "attr-kind",
     "attribute 'spaces' holds a shape with a dimension of about 2**86"),
    (kernel_text(f'spaces=[[4], [{2**62}, 4]], outputs=["sum"], shared=[0]', "%s",
                 "f32[], f32[]"), "attr-kind",
     "attribute 'spaces' holds a shape with about 2**64 elements"),
]


def with_scalar(text: str) -> str:
    return text.replace("  arg %x: f32[4]\n", "  arg %x: f32[4]\n  arg %s: f32[]\n")


def test_a_size_past_int64_is_a_verify_error(child, tmp_path):
    verdicts = in_child(child, tmp_path, *(with_scalar(text) for text, _, _ in SIZE))
    for (text, rule, message), out in zip(SIZE, verdicts):
        assert out["result"] == "VerifyError" and out["rule"] == rule, (text, out)
        assert message in out["message"], (text, out)


FITS = [  # the largest sizes that fit: they verify (nothing is allocated)
    graph_text(inputs=f"  arg %x: f32[{2**61 - 1}]\n"),          # 2**63 - 4 bytes
    graph_text(inputs=f"  arg %x: f64[{2**60 - 1}]\n"),
    graph_text(inputs=f"  arg %x: bool[{2**63 - 1}]\n"),         # 2**63 - 1 bytes
    graph_text(inputs=f"  arg %x: f32[0,{2**63 - 1}]\n"),
    graph_text(inputs=f"  param @p: f32[{','.join(['1'] * MAX_NDIM)}]\n"),
    kernel_text(f'spaces=[[{2**63 - 1}]], outputs=["sum"], shared=[0]', "%s", "f32[]"),
]


def test_the_largest_sizes_verify(child, tmp_path):
    verdicts = in_child(child, tmp_path, *map(with_scalar, FITS))
    assert [out["result"] for out in verdicts] == ["ok"] * len(FITS), verdicts


def test_a_negative_dimension_is_a_verify_error():
    g = Graph()
    g.add_input("arg", "x", TensorType((4, -1), f32))
    e = verify_error(g)
    assert e.rule == "size" and "graph input 'x': f32[4,-1] has a negative dimension" in str(e)
    g = parse(graph_text("  %0 = reshape %x {shape=[4]} : f32[4]"))
    g.nodes[0].attrs["shape"] = (-1,)  # as code could build it
    e = verify_error(g)
    assert e.rule == "attr-kind" and "'shape' is a shape with a negative dimension" in str(e)


HUGE = [graph_text(inputs=f"  arg %x: f32[{E26}]\n"),
        graph_text("  %0 = sum %x {axes=[0], keepdims=false} : f32[]",
                   inputs=f"  arg %x: f32[{E26}]\n")]


def test_emit_llvm_of_a_huge_graph_says_what_is_wrong(child, tmp_path):
    """`f32[10**26]` once compiled to an empty function, and a huge sum raised MemoryError."""
    args = ["opt", "--passes", "fuse", "--emit", "llvm"]
    for text, run_ in zip(HUGE, cli_in_child(child, tmp_path, args, *HUGE)):
        assert run_["status"] != 0, (text, run_)
        # (at the line of the input, in the file it read)
        assert re.match(r"graphopt: error: \S+\.gir:2: \[size\] graph input 'x'",
                        run_["stderr"]), run_
        assert "Traceback" not in run_["stderr"] and "MemoryError" not in run_["stderr"]
