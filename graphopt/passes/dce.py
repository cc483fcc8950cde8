"""dce: remove every node the return does not reach.

Liveness starts at the return (its outputs and its effect tokens) and walks back through data
edges. Through an `after` edge it reaches only nodes with effects (assign, a kernel that
stores), `depend`s and ordered nodes (collectives: the other ranks run them too, so one that
a live collective is chained after stays): a pure node that is only an ordering target does
nothing observable, so it is removed and the edge with it. A collective the return does not
reach is removed on every rank alike, since every rank runs the same graph. An assign the
return does not reach is dead too: an effect is live only if the return reaches it
(docs/ir.md).

    %0 = exp %x : f32[3]                       (removed: nothing reads %0)
    %1 = sum @w {...} : f32[]                  (removed: only the assign's after edge named it)
    %2 = assign @w, %y after(%1) : token  ->   %2 = assign @w, %y : token
"""
from __future__ import annotations

from ..ir.analysis import live_nodes, producers
from ..ir.graph import Graph
from .manager import PassContext, register


@register("dce")
def dce(graph: Graph, ctx: PassContext) -> dict:
    producer = producers(graph)
    live = live_nodes(graph)
    before = len(graph.nodes)
    for n in graph.nodes:
        if id(n) not in live:
            n.detach()
    graph.nodes = [n for n in graph.nodes if id(n) in live]
    dropped = 0
    for n in graph.nodes:
        kept = [v for v in n.after if v not in producer or id(producer[v]) in live]
        if len(kept) != len(n.after):
            dropped += len(n.after) - len(kept)
            n.after[:] = kept
    return {"removed": before - len(graph.nodes), "after_edges_dropped": dropped}
