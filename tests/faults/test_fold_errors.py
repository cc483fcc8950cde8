"""Family 17: fold on constants whose numpy semantics fail (an integer to a negative power,
the max of an empty constant, labels or indices out of range) once raised raw ValueError or
IndexError at compile time. Fold now leaves such a node unfolded: it runs, and fails as it
would have unfolded, with an ExecutionError at the node's location (passes/fold.py says why)."""
from __future__ import annotations

import numpy as np
import pytest

import graphopt as go
from graphopt import ops
from graphopt.backends import interpreter
from graphopt.errors import ExecutionError
from graphopt.ir import Location, parse
from graphopt.passes import run

LOC = '  loc("prog.py":7)'
FAILING = {  # name: (constant lines, the failing node's line, what numpy says)
    "int ** -1": (["%0 = constant {value=2} : i32[]", "%1 = constant {value=-1} : i32[]"],
                  "%2 = power %0, %1 : i32[]", "negative integer powers"),
    "i64 ** -1, arrays": (["%0 = constant {value=[2, 3]} : i64[2]",
                           "%1 = constant {value=[1, -1]} : i64[2]"],
                          "%2 = power %0, %1 : i64[2]", "negative integer powers"),
    "array ** a -1 fill": (["%0 = constant {value=[2, 3]} : i32[2]",
                            "%1 = constant {value=-1} : i32[2]"],
                           "%2 = power %0, %1 : i32[2]", "negative integer powers"),
    "label >= classes": (["%0 = constant {value=[[1.0, 2.0]]} : f32[1,2]",
                          "%1 = constant {value=[5]} : i32[1]"],
                         "%2 = softmax_cross_entropy %0, %1 : f32[]", "outside [0, 2)"),
    "label < 0": (["%0 = constant {value=[[1.0, 2.0], [0.5, 0.0]]} : f32[2,2]",
                   "%1 = constant {value=[0, -1]} : i64[2]"],
                  "%2 = softmax_cross_entropy %0, %1 : f32[]", "outside [0, 2)"),
    "gather out of range": (["%0 = constant {value=[[1.0, 2.0]]} : f32[1,2]",
                             "%1 = constant {value=[3]} : i32[1]"],
                            "%2 = gather %0, %1 : f32[1,2]", "out of bounds"),
    "scatter_add out of range": (["%0 = constant {value=[1.0, 2.0]} : f32[2]",
                                  "%1 = constant {value=[2]} : i32[1]",
                                  "%3 = constant {value=[1.0]} : f32[1]"],
                                 "%2 = scatter_add %0, %1, %3 : f32[2]", "out of bounds"),
}


def program(name: str) -> str:
    constants, failing, _ = FAILING[name]
    lines = [f"  {c}" for c in constants] + [f"  {failing}{LOC}"]
    return "graph prog {\n" + "\n".join(lines) + "\n  return %2\n}\n"


def run_error(graph) -> ExecutionError:
    with pytest.raises(ExecutionError) as info:
        interpreter.compile(graph).run({})
    return info.value


@pytest.mark.parametrize("name", FAILING)
def test_fold_leaves_a_failing_node_to_fail_when_it_runs(name):
    g = parse(program(name))
    g.verify()
    folded = run(g, "fold,dce").graph  # (verifies after each pass)
    op = FAILING[name][1].split()[2]
    assert [n.op for n in folded.nodes][-1] == op  # not folded
    e = run_error(folded)
    assert e.loc == Location("prog.py", 7) and str(e).startswith("prog.py:7: ")
    assert f"{op} failed while the step ran" in str(e) and FAILING[name][2] in str(e)
    assert str(e) == str(run_error(g))  # the unfolded graph fails alike


def test_fold_leaves_the_max_of_an_empty_constant():
    # (The type rule refuses a max of no elements; fold on an unverified graph still does not
    # raise numpy's "zero-size array" ValueError.)
    g = parse("graph g {\n  %0 = constant {value=[]} : f32[0]\n"
              "  %1 = max %0 {axes=[0], keepdims=false} : f32[]\n  return %1\n}\n")
    folded = run(g, "fold", verify=False).graph
    assert [n.op for n in folded.nodes] == ["constant", "max"]


def test_fold_still_folds_what_evaluates():
    g = parse("graph g {\n  %0 = constant {value=2} : i32[]\n  %1 = constant {value=3} : i32[]\n"
              "  %2 = power %0, %1 : i32[]\n  return %2\n}\n")
    folded = run(g, "fold,dce").graph
    assert [(n.op, n.attrs.get("value")) for n in folded.nodes] == [("constant", 8)]


@pytest.mark.parametrize("mode", ["interpreter", "llvm"])
def test_int_to_a_negative_power_in_a_step_fails_where_it_runs(mode):
    def step(x):
        return x + ops.full((3,), 2, "i32") ** ops.full((3,), -1, "i32")  # the line

    with pytest.raises(ExecutionError) as info:
        go.jit(step, backend=mode, cache=False)(np.ones(3, np.int32))
    assert "power" in str(info.value) and "negative integer powers" in str(info.value)
    assert info.value.loc.file == __file__
    assert info.value.loc.line == step.__code__.co_firstlineno + 1
