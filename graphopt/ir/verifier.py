"""The verifier: checks the rules every graph obeys, before and after every pass.

Each violation raises a VerifyError naming the rule and the node:

  known-op           every node's op is in the registry, with the attributes it declares
  types              every node's output types are what the op's type rule gives
  unique-names       graph inputs have distinct names
  defined-before-use every value is defined (by an input or an earlier node) before it is used
  acyclic            no value depends on itself (reported apart from misordering)
  assign-target      assign writes a `param` input of this graph
  one-assign         at most one assign per parameter
  write-after-read   every node that reads @p is ordered before assign(@p, ...), by data or
                     after edges; this is what lets a backend update @p's buffer in place
"""
from __future__ import annotations

from ..errors import GraphoptError, VerifyError
from .graph import Graph, Node, Value
from .analysis import producers, unordered_readers
from .printer import Namer, format_node
from .registry import REGISTRY, check_attrs


def _describe(node: Node, graph: Graph) -> str:
    """The node's printed line, with the names it has in the printed graph."""
    name = Namer()
    for v in graph.inputs:
        name.define(v)
    for n in graph.nodes:
        if n is node:
            return f"`{format_node(n, name)}`"
        for v in n.outputs:
            name.define(v)
    return repr(node)


def verify(graph: Graph) -> None:
    """Raise VerifyError on the first rule the graph breaks."""
    def fail(rule: str, node: Node | None, msg: str) -> None:
        where = f" in {_describe(node, graph)}" if node is not None else ""
        raise VerifyError(rule, f"{msg}{where}", node)

    names = set()
    for v in graph.inputs:
        if v.name in names:
            fail("unique-names", None, f"graph input '{v.name}' is declared twice")
        names.add(v.name)

    producer = producers(graph)
    defined: set[Value] = set(graph.inputs)
    for node in graph.nodes:
        for v in node.operands():
            if v not in defined:
                if v in producer and _reaches(producer[v], node, producer):
                    fail("acyclic", node, "the node depends on its own result through a cycle")
                later = "defined only later" if v in producer else "not defined in this graph"
                fail("defined-before-use", node, f"an operand is {later}")
        op = REGISTRY.get(node.op)
        if op is None:
            fail("known-op", node, f"unknown op '{node.op}'")
        try:
            check_attrs(op, node.attrs)
        except GraphoptError as e:
            fail("known-op", node, e.message)
        try:
            expected = op.infer([v.type for v in node.inputs], node.attrs)
        except GraphoptError as e:
            fail("types", node, e.message)
        got = [v.type for v in node.outputs]
        if list(expected) != got:
            fail("types", node, f"output types {', '.join(map(str, got))} but the type rule of "
                                f"{node.op} gives {', '.join(map(str, expected))}")
        defined.update(node.outputs)
    for v in graph.returned():
        if v not in defined:
            fail("defined-before-use", None, "the return uses a value not defined in this graph")

    _check_assigns(graph, fail)


def _reaches(start: Node, target: Node, producer: dict[Value, Node]) -> bool:
    """Whether `target` is an ancestor of `start`'s operands: then start -> target -> start."""
    seen, stack = set(), [start]
    while stack:
        n = stack.pop()
        for v in n.operands():
            p = producer.get(v)
            if p is target:
                return True
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                stack.append(p)
    return False


def _check_assigns(graph: Graph, fail) -> None:
    producer = producers(graph)
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    params = set(graph.params)
    assigned: set[Value] = set()
    readers: dict[Value, list[Node]] = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v in params and not (n.op == "assign" and v is n.inputs[0]):
                readers.setdefault(v, []).append(n)
    for n in graph.assigns():
        target = n.inputs[0]
        if target not in params:
            fail("assign-target", n, "assign must write a parameter (an @name input) of this graph")
        if target in assigned:
            fail("one-assign", n, f"@{target.name} is assigned more than once")
        assigned.add(target)
    for n in graph.assigns():
        target = n.inputs[0]
        unordered = unordered_readers(n.operands(), readers.get(target, []), producer, index)
        if unordered:
            fail("write-after-read", unordered[0], f"this node reads @{target.name} but is not "
                 f"ordered before its assign (add it to the assign's after(...))")
