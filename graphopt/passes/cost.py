"""The cost model the passes share: bytes each node reads and writes in one run of a step.

An unfused node reads each of its inputs and writes its output through memory; a kernel reads
each operand once and writes only what leaves it (see ir/kernel.py: `cost`). An assign is a
copy of its value into the parameter; a kernel's store is not (it writes in place).

A collective also sends bytes to the other ranks: `bytes_sent`, by a ring algorithm (the
formulas are the ops' own, OpDef.sends, in ir/collectives.py). A predicated collective
(all_reduce_when) communicates on one run in `every`: its bytes count once per `every` runs.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.kernel import cost as kernel_cost
from ..ir.registry import CONSTANT
from ..ir.types import TensorType


def _nbytes(v) -> int:
    return v.type.nbytes if isinstance(v.type, TensorType) else 0


def node_bytes(node: Node) -> tuple[int, int]:
    """(bytes read, bytes written) by one run of the node."""
    if node.body is not None:
        c = kernel_cost(node)
        return (c.read_per_element * c.elements + c.fixed_bytes - c.fixed_written,
                c.write_per_element * c.elements + c.fixed_written)
    op = node.opdef
    if op.category == CONSTANT or op.view is not None:  # a view: nothing moves
        return 0, 0
    if op.has_effect:  # an assign: its value is written into the parameter
        return _nbytes(node.inputs[1]), _nbytes(node.inputs[0])
    return sum(_nbytes(v) for v in node.inputs), sum(_nbytes(v) for v in node.outputs)


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


def graph_bytes(graph: Graph, memo: dict[int, tuple[int, int]] | None = None) -> tuple[int, int]:
    """Bytes read and written by one run of the graph. `memo` (node serial -> bytes) lets a
    caller that asks after every pass count each node once: passes replace nodes, never edit
    them in ways that change their traffic."""
    memo = {} if memo is None else memo
    read = written = 0
    for n in graph.nodes:
        if n.serial not in memo:
            memo[n.serial] = node_bytes(n)
        r, w = memo[n.serial]
        read += r
        written += w
    return read, written
