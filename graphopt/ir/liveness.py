"""Liveness over a scheduled graph: what is alive at each node, the peak, and what the forward
pass keeps alive for the backward pass.

The model is a backend that gives every node output a buffer of its own (the interpreter,
near enough): a buffer is allocated when its node runs and freed after its last reader; the
values the graph returns live to the end. Inputs (params and args) exist for the whole step
and are counted apart. Tokens take no bytes. Views that a real backend might share (reshape,
depend) are counted as copies: the report is an upper bound, in the executable's node order.

A node is *backward* when autodiff made it: its location's `phase` is "backward" (autodiff's
`GradLocation`), or it is a kernel whose body holds only such nodes. The backward pass starts
at the first backward node of the schedule (constants aside). A value made before that point
and read by a backward node after it is *kept for the backward pass*: it stays alive across the
turn, which is where reverse mode spends its memory (activations, and any derivative that
fusion computed early in a forward kernel). `stop_gradient` and `dce` shrink that list; the
report shows by how much.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from .graph import Graph, Node, Value
from .printer import Namer, format_node
from .registry import CONSTANT
from .types import TensorType


def is_backward(node: Node) -> bool:
    """Whether autodiff made this node. A kernel is backward when every node of its body is
    (constants aside); one that fuses forward and backward work runs in the forward."""
    if node.body is None:
        return node.loc is not None and node.loc.phase == "backward"
    work = [n for n in node.body.nodes if n.opdef.category != CONSTANT]
    return bool(work) and all(is_backward(n) for n in work)


def nbytes(v: Value) -> int:
    return v.type.nbytes if isinstance(v.type, TensorType) else 0


@dataclass(frozen=True)
class LiveRange:
    """One node output: where it is made and last read (node indices in schedule order)."""

    value: Value
    name: str  # as the printed graph names it
    defined: int
    last_use: int  # == defined for a value nobody reads; len(nodes) for a returned value
    last_reader: str  # the printed name of the last reader's first result ("return": none)

    @property
    def nbytes(self) -> int:
        return nbytes(self.value)


@dataclass
class MemoryReport:
    """What `Executable.memory_report()` returns; `str(report)` is the readable form."""

    graph: str
    nodes: int
    input_bytes: int  # params and args: alive the whole step
    live_bytes: list[int]  # per node: bytes of node outputs alive while it runs
    peak_node: int  # the index of the first node where live_bytes is largest
    peak_line: str  # that node, as printed
    backward_start: int | None  # index of the first backward node (None: no backward)
    backward_line: str  # that node, as printed
    kept: list[LiveRange] = field(default_factory=list)  # forward values read by backward
    # Values the backend copies when they are made, each with why: (name, reason).
    copies: list[tuple[str, str]] = field(default_factory=list)
    # The backend's memory plan, if it has one: the arena it allocated once, the values in
    # it and their bytes one buffer each, and the values numpy allocates itself (names).
    planned: tuple[int, int, int] | None = None
    unplanned: list[str] = field(default_factory=list)
    # Sections the caller adds at the end (the bytes each rank holds, under DataParallel).
    sections: list[str] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        """The largest number of bytes alive at once, inputs included."""
        return self.input_bytes + (self.live_bytes[self.peak_node] if self.live_bytes else 0)

    @property
    def kept_bytes(self) -> int:
        return sum(r.nbytes for r in self.kept)

    def __str__(self) -> str:
        return "\n".join([self._body(), *self.sections])

    def _body(self) -> str:
        lines = [f"memory report for graph {self.graph} ({self.nodes} nodes, run in order)",
                 f"  inputs (params and args), alive the whole step: {_size(self.input_bytes)}",
                 f"  peak: {_size(self.peak_bytes)} = inputs + "
                 f"{_size(self.peak_bytes - self.input_bytes)} of node outputs, at node "
                 f"{self.peak_node}: {self.peak_line}"]
        if self.planned is not None:
            arena, count, total = self.planned
            lines.append(f"  planned: {count} intermediate value{'s' * (count != 1)} "
                         f"({_size(total)} one buffer each) in one arena of {_size(arena)}, "
                         f"allocated once")
            if self.unplanned:
                lines.append(f"  allocated by numpy each step: {', '.join(self.unplanned)}")
        for name, why in self.copies:
            lines.append(f"  {name} is copied when made: {why}")
        if self.backward_start is None:
            lines.append("  no backward pass (no node made by autodiff)")
            return "\n".join(lines)
        lines.append(f"  backward pass starts at node {self.backward_start}: "
                     f"{self.backward_line}")
        lines.append(f"  kept alive for the backward pass (made before it, read by it): "
                     f"{len(self.kept)} value{'s' * (len(self.kept) != 1)}, "
                     f"{_size(self.kept_bytes)}")
        width = max((len(r.name) for r in self.kept), default=0)
        for r in self.kept:
            lines.append(f"    {r.name:<{width}}  {str(r.value.type):<12} {_size(r.nbytes):>9}  "
                         f"made by {r.value.node.op} (node {r.defined}), last read by "
                         f"{r.last_reader} (node {r.last_use})")
        return "\n".join(lines)


def _size(n: int) -> str:
    return f"{n} B" if n < 10_000 else f"{n / 1024:.1f} KiB" if n < 10_000_000 else \
        f"{n / 2**20:.1f} MiB"


def live_ranges(graph: Graph) -> list[LiveRange]:
    """The live range of every node output, in schedule (node list) order. Data reads count;
    after edges order without reading, so they do not keep a buffer alive."""
    name = Namer()
    for v in graph.inputs:
        name.define(v)
    defined: dict[Value, int] = {}
    last: dict[Value, int] = {}
    labels: list[str] = []  # per node: the printed name of its first result
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v in defined:
                last[v] = i
        for v in node.outputs:
            name.define(v)
            defined[v] = last[v] = i
        labels.append(name(node.outputs[0]) if node.outputs else node.op)
    labels.append("return")
    for v in graph.outputs:
        if v in defined:
            last[v] = len(graph.nodes)
    return [LiveRange(v, name(v), d, last[v], labels[last[v]]) for v, d in defined.items()]


def memory_report(graph: Graph, copies: Iterable[tuple[Value, str]] = (),
                  plan: Any = None) -> MemoryReport:
    """The liveness report of a graph in its node order (the order the backend runs it);
    `copies`: the values the backend copies when they are made, each with the reason;
    `plan`: the backend's memory plan (`arena_bytes`, `buffers`, `value_bytes`,
    `unplanned`), if it has one."""
    ranges = live_ranges(graph)
    n = len(graph.nodes)
    # A value is alive at every node from the one that makes it to its last reader.
    delta = [0] * (n + 2)
    for r in ranges:
        delta[r.defined] += r.nbytes
        delta[min(r.last_use, n) + 1] -= r.nbytes
    live, running = [], 0
    for i in range(n):
        running += delta[i]
        live.append(running)
    peak = max(range(n), key=lambda i: (live[i], -i)) if n else 0
    backward = {i for i, node in enumerate(graph.nodes) if is_backward(node)}
    # A constant computes nothing, and folding may leave the seed (ones) anywhere.
    work = [i for i in backward if graph.nodes[i].opdef.category != CONSTANT]
    start = min(work) if work else None
    kept = _kept_for_backward(graph, ranges, backward, start) if backward else []
    names = {r.value: r.name for r in ranges}
    return MemoryReport(graph.name, n, sum(nbytes(v) for v in graph.inputs), live, peak,
                        _node_line(graph, peak) if n else "", start,
                        _node_line(graph, start) if start is not None else "", kept,
                        [(names[v], why) for v, why in copies],
                        None if plan is None else (plan.arena_bytes, len(plan.buffers),
                                                   plan.value_bytes),
                        [] if plan is None else [names[v] for v in plan.unplanned])


def _kept_for_backward(graph: Graph, ranges: Iterable[LiveRange], backward: set[int],
                       start: int) -> list[LiveRange]:
    """The values forward nodes made before the backward starts that backward nodes read."""
    readers: dict[Value, set[int]] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            readers.setdefault(v, set()).add(i)
    return [r for r in ranges if r.defined < start and r.defined not in backward and r.nbytes
            and readers.get(r.value, set()) & backward]


def _node_line(graph: Graph, index: int) -> str:
    """Node `index` as the printed graph shows it (same value names)."""
    name = Namer()
    for v in graph.inputs:
        name.define(v)
    for i, node in enumerate(graph.nodes):
        if i == index:
            return format_node(node, name)
        for v in node.outputs:
            name.define(v)
    raise IndexError(index)
