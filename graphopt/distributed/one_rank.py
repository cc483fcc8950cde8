"""The pass `one_rank`: a collective of a group of one rank is its operand, so it goes.

At world size 1 an all_reduce (sum, max, or mean: the sum divided by 1) is its operand, a
reduce_scatter's one part and an all_gather's one piece are the whole of it, a broadcast is
rank 0's own value, a shard is the whole tensor. Each such node is replaced by its operand
and removed (with its place in the collective chain, which nothing else pairs with on one
rank): no copy, no call into the communicator. DataParallel runs this pass, and not its
bucket and zero passes, when its group has one rank, so a data-parallel step of one process
compiles to the step without DataParallel (zero=0), or to the sharded optimizer's flat update
with no collective in it (zero 1, 2: the state keeps its layout, one shard of the whole).

    %1 = all_reduce %0 {group="world", ranks=1, reduce="mean"} : f32[64]   ->   (gone: %0)
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.registry import COLLECTIVE
from ..passes.manager import PassContext, register
from .passes import rechain


@register("one_rank")
def one_rank(graph: Graph, ctx: PassContext) -> dict:
    """Replace every collective of ranks=1 by its operand."""
    gone = [n for n in graph.nodes if n.body is None and n.opdef.category == COLLECTIVE and
            n.attrs["ranks"] == 1]
    dead = {id(n) for n in gone}
    for n in gone:
        n.out.replace_all_uses_with(n.inputs[0])  # (after edges too: they order as before)
        n.detach()
    graph.nodes = [n for n in graph.nodes if id(n) not in dead]
    rechain(graph)  # the collectives of other groups, if any, chained past the gaps
    return {"removed": len(gone)}
