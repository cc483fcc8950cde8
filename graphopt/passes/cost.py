"""The cost model the passes share: bytes each node reads and writes in one run of a step.

The bytes a node moves through memory are a fact of the IR (ir/traffic.py: an unfused node
reads its inputs and writes its outputs, a kernel reads each operand once and writes only
what leaves it, a view moves nothing); the passes read them from here.

A collective also sends bytes to the other ranks: `bytes_sent`, by a ring algorithm (the
formulas are the ops' own, OpDef.sends, in ir/collectives.py). A predicated collective
(all_reduce_when) communicates on one run in `every`: its bytes count once per `every` runs.
"""
from __future__ import annotations

from ..ir.graph import Node
from ..ir.traffic import graph_bytes, node_bytes

__all__ = ["bytes_sent", "graph_bytes", "node_bytes"]


def bytes_sent(node: Node, per_run: bool = True) -> int:
    """The bytes one rank sends to the others in one run of the node: a collective's, by a
    ring algorithm over its `ranks` (an all_reduce of x sends 2(N-1)/N of x's bytes); 0 for a
    node that communicates nothing (shard, and every other op). A predicated collective
    sends on one run in `every`: per_run counts its bytes once per `every` runs (rounded
    down), per_run=False gives those of a run that communicates."""
    sends = node.opdef.sends
    if sends is None:
        return 0
    sent = sends([v.type for v in node.inputs], [v.type for v in node.outputs], node.attrs)
    return sent // node.attrs["every"] if node.opdef.predicated and per_run else sent
