"""The memory plan of a program: one arena for the step's intermediate values, made once.

Every value a node of the schedule makes into a buffer it is given (a kernel's outputs, and
a numpy node whose op writes into an array: matmul, reductions, ufuncs) gets a place in one
arena, allocated when the program is made and reused by every step. Values whose lifetimes
do not overlap share bytes. A lifetime runs from the node that makes the value to its last
reader in the schedule, inclusive at both ends (a node never writes over what it reads);
a view extends its base's lifetime to its own last reader, since it is the same memory (so
does a row gradient its values', OpDef.aliases); the
step's results, and the values assigns give parameters, live to its end (the Executable
copies results out, and commits assigned values, after the whole step has run).

Placement is greedy, largest first, each value at the lowest 64-byte aligned offset clear of
every placed value whose lifetime meets its own (the arena planners of TFLite and XLA's
heap simulator work the same way). Values numpy allocates itself (an op with no `into`)
are not planned; the memory report lists them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection, Sequence

import numpy as np

from ... import memory
from ...ir.graph import Graph, Node, Value
from ...ir.types import TensorType

ALIGN = memory.ALIGN


@dataclass
class MemoryPlan:
    """Where each planned value lives: `buffers[v]` is an array over the arena."""

    arena_bytes: int
    buffers: dict[Value, np.ndarray] = field(default_factory=dict)
    offsets: dict[Value, int] = field(default_factory=dict)
    lifetimes: dict[Value, tuple[int, int]] = field(default_factory=dict)
    unplanned: list[Value] = field(default_factory=list)  # made by numpy, which allocates

    @property
    def value_bytes(self) -> int:
        """The bytes the planned values would take with a buffer each."""
        return sum(b.nbytes for b in self.buffers.values())


def lifetimes(nodes: Sequence[Node], reads: Callable[[Node], Collection[Value]],
              graph: Graph) -> dict[Value, tuple[int, int]]:
    """(made, last read) in schedule positions for every value the nodes make; a view's
    readers count as its input's (a numpy view is its input's memory); a returned value is
    read at len(nodes)."""
    last = dict.fromkeys(graph.returned(), len(nodes))
    made: dict[Value, int] = {}
    for i in reversed(range(len(nodes))):
        n = nodes[i]
        until = i
        if n.body is None and (n.opdef.view is not None or n.opdef.aliases):
            until = max([i, *(last.get(v, i) for v in n.outputs)])
        elif n.body is None and n.opdef.has_effect:  # an assign's value is committed after
            until = len(nodes)                       # the step: it lives to the end

        for v in reads(n):
            last[v] = max(last.get(v, -1), until)
        for v in n.outputs:
            made[v] = i
    return {v: (i, max(i, last.get(v, i))) for v, i in made.items()}


def plan(nodes: Sequence[Node], reads: Callable[[Node], Collection[Value]], graph: Graph,
         planned: Collection[Value], unplanned: Sequence[Value] = ()) -> MemoryPlan:
    """Place `planned` (values of tensor type the nodes make into given buffers) in one
    arena, by their lifetimes in `nodes`; `unplanned` is only recorded, for the report."""
    life = lifetimes(nodes, reads, graph)
    values = sorted((v for v in planned if isinstance(v.type, TensorType)),
                    key=lambda v: (-v.type.nbytes, life[v][0]))
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, made, last)
    offsets: dict[Value, int] = {}
    top = 0
    for v in values:
        made, last = life[v]
        size = _aligned(max(1, v.type.nbytes))
        busy = sorted((o, e) for o, e, m, l in placed if m <= last and made <= l)
        offset = 0
        for o, e in busy:  # the first gap that fits, lowest first
            if offset + size <= o:
                break
            offset = max(offset, e)
        placed.append((offset, offset + size, made, last))
        offsets[v] = offset
        top = max(top, offset + size)
    arena = memory.empty(max(top, 1), np.uint8)
    buffers = {v: _view(arena, offsets[v], v.type) for v in values}
    return MemoryPlan(top, buffers, offsets, {v: life[v] for v in values}, list(unplanned))


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _view(arena: np.ndarray, offset: int, t: TensorType) -> np.ndarray:
    dtype = t.dtype.np_dtype
    return arena[offset:offset + t.nbytes].view(dtype).reshape(t.shape)


def overlapping(p: MemoryPlan) -> list[tuple[Value, Value]]:
    """Pairs of planned values that share bytes while both are alive: none, if the plan is
    right (the tests ask this of every plan they make)."""
    out = []
    items = list(p.offsets.items())
    for i, (a, oa) in enumerate(items):
        ea, (ma, la) = oa + a.type.nbytes, p.lifetimes[a]
        for b, ob in items[i + 1:]:
            eb, (mb, lb) = ob + b.type.nbytes, p.lifetimes[b]
            if oa < eb and ob < ea and ma <= lb and mb <= la:
                out.append((a, b))
    return out

