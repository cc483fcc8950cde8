"""Small graph analyses shared by the tracer, the verifier and the passes."""
from __future__ import annotations

from typing import Iterable

from .graph import Graph, Node, Value


def producers(graph: Graph) -> dict[Value, Node]:
    """The node that defines each node output."""
    return {v: n for n in graph.nodes for v in n.outputs}


def live_nodes(graph: Graph, roots: Iterable[Value] | None = None) -> set[int]:
    """ids of the nodes the roots reach through data and after edges (default: the return)."""
    producer = producers(graph)
    live: set[int] = set()
    stack = [producer[v] for v in (graph.returned() if roots is None else roots) if v in producer]
    while stack:
        n = stack.pop()
        if id(n) in live:
            continue
        live.add(id(n))
        stack.extend(producer[v] for v in n.operands() if v in producer)
    return live


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
