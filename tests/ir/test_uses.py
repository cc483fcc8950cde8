"""Use lists (graphopt/ir/uses.py): every value's `users` names exactly its readers, through
every edit of the operand lists, replace_all_uses_with and detach; the verifier's `uses` rule
catches a pass that breaks them."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphopt import passes
from graphopt.errors import VerifyError
from graphopt.ir import Graph, Node, TensorType, f32, parse
from graphopt.ir.uses import replace_all_uses
from graphopt.passes.manager import PassError

T = TensorType((4,), f32)

SGD = """graph sgd {
  param @w: f32[4]
  arg %g: f32[4]
  arg %lr: f32[]
  %0 = multiply %lr, %g : f32[4]
  %1 = multiply %lr, %g : f32[4]
  %2 = sum %1 {axes=[0], keepdims=false} : f32[]
  %3 = subtract @w, %0 : f32[4]
  %4 = assign @w, %3 after(%2) : token
  %5 = depend %2 after(%4) : f32[]
  return %5, %1 after(%4)
}
"""


def readers(graph: Graph) -> dict:
    """The use lists worked out from scratch: value -> Counter of its readers."""
    found: dict = {}
    for reader in [*graph.nodes, graph]:
        for ops in reader.operand_lists():
            for v in ops:
                found.setdefault(v, Counter())[reader] += 1
    return found


def assert_exact(graph: Graph) -> None:
    expected = readers(graph)
    for n in graph.nodes:
        for v in n.outputs:
            assert v.users == dict(expected.get(v, {})), v
    assert all(v.users is None for v in graph.inputs)  # inputs have no use list


def test_building_a_graph_fills_the_use_lists():
    g = Graph()
    x = g.add_node("exp", [g.add_input("arg", "x", T)]).out
    sq = g.add_node("multiply", [x, x])
    total = g.add_node("sum", [sq.out], {"axes": (0,), "keepdims": False})
    g.outputs.append(total.out)
    g.outputs += [sq.out]
    assert x.users == {sq: 2}  # x * x reads x twice
    assert sq.out.users == {total: 1, g: 1} and total.out.users == {g: 1}
    g.outputs = [total.out]  # assigning the return replaces its contents
    assert sq.out.users == {total: 1} and total.out.users == {g: 1}
    assert_exact(g)


def test_parsed_and_cloned_graphs_have_exact_use_lists():
    g = parse(SGD)
    assert_exact(g)
    copy = g.clone()
    assert_exact(copy)
    assert_exact(g)  # the copy's nodes read the copy's own node outputs
    assert copy.inputs == g.inputs  # the same Values: inputs have no use lists to share
    assert copy.format() == g.format()


def test_graph_inputs_are_not_replaced():
    g = parse(SGD)
    with pytest.raises(ValueError, match="graph input"):
        g.param("w").replace_all_uses_with(g.nodes[0].out)


def test_replace_all_uses_with_rewrites_every_reader():
    g = parse(SGD)
    first, second = g.nodes[0], g.nodes[1]
    second.out.replace_all_uses_with(first.out)
    assert second.out.users == {}
    assert set(first.out.users) == {g.nodes[2], g.nodes[3], g}  # sum, subtract, the return
    second.detach()
    g.nodes.remove(second)
    g.verify()
    assert_exact(g)
    assert g.format() == """graph sgd {  # bytes per run: 136 B (read 84 B, written 52 B)
  param @w: f32[4]
  arg %g: f32[4]
  arg %lr: f32[]
  %0 = multiply %lr, %g : f32[4]
  %1 = sum %0 {axes=[0], keepdims=false} : f32[]
  %2 = subtract @w, %0 : f32[4]
  %3 = assign @w, %2 after(%1) : token
  %4 = depend %1 after(%3) : f32[]
  return %4, %0 after(%3)
}"""


def test_ordering_edges_that_come_to_name_one_value_become_one():
    g = parse("""graph e {
  param @a: f32[4]
  param @b: f32[4]
  %0 = assign @a, @a : token
  %1 = assign @b, @b : token
  %2 = depend @a after(%0, %1) : f32[4]
  return %2 after(%0, %1)
}
""")
    a, b, d = g.nodes
    replace_all_uses({b.out: a.out})  # as if one kernel now wrote both
    assert d.after == [a.out] and g.effects == [a.out]
    assert a.out.users == {d: 1, g: 1} and b.out.users == {}
    assert_exact(g)


def test_many_replacements_at_once_rewrite_each_reader_once():
    g = parse(SGD)
    m0, m1 = g.nodes[0].out, g.nodes[1].out
    x, y = g.add_input("arg", "x", T), g.add_input("arg", "y", T)
    replace_all_uses({m0: x, m1: y})
    assert g.nodes[3].inputs[1] is x and g.nodes[2].inputs == [y] and g.outputs[1] is y
    assert m0.users == {} and m1.users == {}
    assert_exact(g)


def test_detach_takes_a_node_off_every_use_list():
    g = parse(SGD)
    assign = g.nodes[4]
    assign.detach()
    assert assign.inputs == [] and assign.after == []
    assert assign not in g.nodes[3].out.users and assign not in g.nodes[2].out.users
    assert_exact(g)


EDITS = st.sampled_from(["append", "extend", "iadd", "set", "set_slice", "del", "del_slice",
                         "insert", "remove", "pop", "clear", "imul", "sort", "reverse",
                         "assign"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(EDITS, st.integers(0, 5), st.integers(0, 5)), max_size=25))
def test_every_list_edit_keeps_the_use_lists_exact(edits):
    g = Graph()
    x = g.add_input("arg", "x", T)
    vs = [g.add_node("negative", [x]).out for _ in range(4)]
    n = g.add_node("add", [vs[0], vs[1]])
    lists = {"inputs": (n, "inputs"), "after": (n, "after"), "outputs": (g, "outputs"),
             "effects": (g, "effects")}
    for k, (op, i, j) in enumerate(edits):
        owner, attr = list(lists.values())[k % 4]
        ops = getattr(owner, attr)
        v = vs[i % 4]
        if op == "append":
            ops.append(v)
        elif op == "extend":
            ops.extend(iter([v, vs[j % 4]]))
        elif op == "iadd":
            ops += [v]
            if owner is g:
                setattr(g, attr, ops)  # `g.effects += [...]` assigns the list back
        elif op == "set" and ops:
            ops[i % len(ops)] = v
        elif op == "set_slice":
            ops[i:j] = [v, v]
        elif op == "del" and ops:
            del ops[i % len(ops)]
        elif op == "del_slice":
            del ops[i:j]
        elif op == "insert":
            ops.insert(i, v)
        elif op == "remove" and v in ops:
            ops.remove(v)
        elif op == "pop" and ops:
            ops.pop(i % len(ops))
        elif op == "clear":
            ops.clear()
        elif op == "imul":
            ops *= j % 3
        elif op == "sort":
            ops.sort(key=lambda v: v.serial)
        elif op == "reverse":
            ops.reverse()
        elif op == "assign" and owner is g:
            setattr(g, attr, [v, vs[j % 4]])
        for v in vs:
            assert v.users == dict(readers(g).get(v, {})), (op, v)


def test_the_verifier_catches_a_node_dropped_without_detach():
    g = parse(SGD)
    mul, subtract = g.nodes[0], g.nodes[3]
    subtract.out.replace_all_uses_with(mul.out)  # the assign now writes %0
    g.nodes.remove(subtract)  # no detach(): the subtract is still in the users of %0
    with pytest.raises(VerifyError) as info:
        g.verify()
    assert info.value.rule == "uses"
    assert "names a node that is not in the graph" in str(info.value)
    subtract.detach()
    g.verify()


def test_the_verifier_catches_a_node_made_and_dropped():
    g = parse(SGD)
    g.nodes[0].out.replace_all_uses_with(g.nodes[1].out)
    g.nodes[0].detach()
    del g.nodes[0]
    g.verify()
    Node("negative", [g.nodes[0].out], None, [T])  # made for a rewrite, then not used
    with pytest.raises(VerifyError, match="names a node that is not in the graph"):
        g.verify()


def test_the_verifier_catches_a_plain_list_assigned_to_a_nodes_inputs():
    g = parse(SGD)
    n = g.nodes[3]
    n.inputs = list(n.inputs)  # a plain list: no use list follows it
    with pytest.raises(VerifyError) as info:
        g.verify()
    assert info.value.rule == "uses" and "subtract" in str(info.value)


def test_the_verifier_checks_kernel_bodies_too():
    g = parse(SGD)
    fused = passes.run(g, "dce,cse,fuse").graph
    kernel = next(n for n in fused.nodes if n.body is not None)
    assert_exact(kernel.body)
    value = next(v for n in kernel.body.nodes for v in n.outputs if v.type == TensorType((), f32))
    stray = Node("negative", [value], None, [TensorType((), f32)])
    with pytest.raises(VerifyError) as info:
        fused.verify()
    assert info.value.rule == "uses" and "(in a kernel body)" in str(info.value)
    stray.detach()
    fused.verify()


def test_a_pass_that_breaks_the_use_lists_is_named():
    @passes.register("drop_without_detach")
    def drop_without_detach(graph, ctx):
        """Removes the dead negative node but leaves it in the use lists (a test pass)."""
        graph.nodes = [n for n in graph.nodes if n.op != "negative"]

    try:
        g = parse(SGD.replace("  return", "  %6 = negative %0 : f32[4]\n  return"))
        with pytest.raises(PassError, match="after pass 'drop_without_detach'.*uses"):
            passes.run(g, "drop_without_detach")
    finally:
        del passes.PASSES["drop_without_detach"]


@pytest.mark.parametrize("pipeline", ["cse", "fold", "simplify", "dce", "fuse", "hfuse",
                                      "default"])
def test_every_pass_leaves_exact_use_lists(pipeline):
    g = parse(SGD)
    result = passes.run(g, pipeline)
    assert_exact(result.graph)
    for n in result.graph.nodes:
        if n.body is not None:
            assert_exact(n.body)
    assert_exact(g)  # the input graph is left as it was
