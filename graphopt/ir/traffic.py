"""Bytes each node reads and writes in one run of a step: the cost model's memory traffic.

An unfused node reads each of its inputs and writes its output through memory (a numpy node:
matmul, a reduction, a gather); a kernel reads each operand once and writes only what leaves
it (see kernel.py: `cost`). An assign is a copy of its value into the parameter; a kernel's
store is not (it writes in place). A view (transpose, slice, reshape) moves nothing: its
reader reads the bytes where they lie. These are facts of the IR (the op's declaration and a
kernel's body), so the printer can total them in a graph's header; the passes' cost model
(passes/cost.py) is built on them.
"""
from __future__ import annotations

from .graph import Graph, Node, Value
from .kernel import cost as kernel_cost
from .registry import CONSTANT
from .types import TensorType


def _nbytes(v: Value) -> int:
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


def readable(n: float) -> str:
    """A byte count in decimal units, three significant digits: 48 B, 12.3 kB, 4.19 MB."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 999.5 or unit == "GB":
            return f"{int(n)} B" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return ""


def traffic(graph: Graph) -> str:
    """The bytes one run of the graph moves, and of them read and written, as its printed
    header says them: `308 B (read 176 B, written 132 B)`."""
    read, written = graph_bytes(graph)
    return f"{readable(read + written)} (read {readable(read)}, written {readable(written)})"
