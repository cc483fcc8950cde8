"""Small graph analyses shared by the tracer, the verifier and the passes."""
from __future__ import annotations

import heapq
from typing import Iterable

from .graph import Graph, Node, Value
from .registry import CONTROL, REGISTRY
from .types import contiguous_strides


def producers(graph: Graph) -> dict[Value, Node]:
    """The node that defines each node output."""
    return {v: n for n in graph.nodes for v in n.outputs}


def live_nodes(graph: Graph) -> set[int]:
    """ids of the nodes a run of the graph executes: what the return reaches through data
    edges, and through `after` edges to nodes with effects, to `depend`s and to ordered nodes
    (a pure node that is only an ordering target does nothing observable; a collective is
    seen by the other ranks, and one that runs keeps the chain before it). An effect is live
    only if the return reaches it (docs/ir.md). dce removes the other nodes; the backends
    skip them."""
    producer = producers(graph)
    live: set[int] = set()
    stack = [producer[v] for v in graph.returned() if v in producer]
    while stack:
        n = stack.pop()
        if id(n) in live:
            continue
        live.add(id(n))
        stack += [producer[v] for v in n.inputs if v in producer]
        stack += [producer[v] for v in n.after
                  if v in producer and (has_effect(producer[v]) or _orders(producer[v]))]
    return live


def run_order(graph: Graph) -> list[Node]:
    """The nodes a run executes, in graph order: the live ones."""
    live = live_nodes(graph)
    return [n for n in graph.nodes if id(n) in live]


def unordered_readers(starts: Iterable[Value], readers: list[Node], producer: dict[Value, Node],
                      index: dict[int, int]) -> list[Node]:
    """The readers that are not ancestors of the `starts` values (in graph order).

    The search walks back from the starts and never below the earliest reader: in a
    topological order nothing earlier can lead to one, so the walk stays local to the update.
    """
    if not readers:
        return []
    missing = {id(r): r for r in readers}
    floor = min(index[id(r)] for r in readers)
    seen: set[int] = set()
    stack = [v for v in starts]
    while stack and missing:
        p = producer.get(stack.pop())
        if p is None or id(p) in seen or index[id(p)] < floor:
            continue
        seen.add(id(p))
        missing.pop(id(p), None)
        stack.extend(p.operands())
    return sorted(missing.values(), key=lambda r: index[id(r)])


def toposort(graph: Graph) -> None:
    """Reorder the nodes so each comes after its operands, keeping the given order wherever it
    is already valid (a stable Kahn's algorithm: the earliest ready node goes first)."""
    if in_order(graph):
        return
    producer = producers(graph)
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    waiting: dict[int, int] = {}
    users: dict[int, list[Node]] = {}
    for n in graph.nodes:
        deps = {id(producer[v]) for v in n.operands() if v in producer}
        waiting[id(n)] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(n)
    ready = [(position[id(n)], id(n), n) for n in graph.nodes if waiting[id(n)] == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        _, _, n = heapq.heappop(ready)
        order.append(n)
        for u in users.get(id(n), []):
            waiting[id(u)] -= 1
            if waiting[id(u)] == 0:
                heapq.heappush(ready, (position[id(u)], id(u), u))
    assert len(order) == len(graph.nodes), "toposort of a graph with a cycle"
    graph.nodes = order


def in_order(graph: Graph) -> bool:
    """Whether every node comes after the nodes whose outputs it reads."""
    defined: set[Value] = set(graph.inputs)
    for n in graph.nodes:
        for v in n.operands():
            if v not in defined and v.node is not None:
                return False
        defined.update(n.outputs)
    return True


def _orders(node: Node) -> bool:
    """A control node (depend) or an ordered one (a collective): an after edge to it orders
    through it, so it runs."""
    op = REGISTRY.get(node.op)
    return op is not None and (op.category == CONTROL or op.ordered)


def has_effect(node: Node) -> bool:
    """Whether a node changes state: an effect op (assign, store), or a kernel that stores."""
    if node.body is not None:
        return bool(node.body.effects)
    op = REGISTRY.get(node.op)  # (a broken graph may name an unknown op: the verifier says so)
    return op is not None and op.has_effect


def view_source(v: Value) -> tuple[Value, int, tuple[int, ...]]:
    """Where v's elements lie when it is made by views (OpDef.view) of another value: that
    value (the base, taken C-contiguous), v's first element's offset in it and v's strides
    (elements). A value made otherwise is its own base: (v, 0, its C strides)."""
    chain = []
    while v.node is not None and v.node.body is None and v.node.opdef.view is not None:
        chain.append(v.node)
        v = v.node.inputs[0]
    base, offset, strides = v, 0, contiguous_strides(v.shape)
    for node in reversed(chain):
        out = node.outputs[0]
        layout = node.opdef.view(node.inputs[0].shape, strides, out.shape, node.attrs)
        if layout is None:  # not expressible in the base: the view is made (copied) here
            base, offset, strides = out, 0, contiguous_strides(out.shape)
        else:
            offset, strides = offset + layout[0], layout[1]
    return base, offset, strides
