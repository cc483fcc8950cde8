"""Graph, Node and Value: the functional IR that every part of graphopt reads and writes.

A Graph has inputs (Values of kind `param` or `arg`), a list of Nodes in a valid topological
order, and a return: output Values plus the effect tokens the return is ordered after (a
depend of the outputs on every effect, written `return %x after(%t0, %t1)`).

A Node applies one registered op to input Values, with attributes, and defines output Values.
Any node may carry `after` edges: pure ordering, no data. The tracer puts them on `assign`
(write-after-read) and `depend`.

Every node output knows who reads it (`value.users`, kept by the operand lists: see uses.py),
so a rewrite is `old.replace_all_uses_with(new)`, and a node leaving its graph is `detach()`ed.
"""
from __future__ import annotations

import functools
import itertools
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Iterator, Sequence

from .registry import REGISTRY, get_op
from .types import DType, TensorType, Type
from .uses import Operands, Ordering, operands_property, replace_all_uses

if TYPE_CHECKING:
    import graphviz
    import networkx

    from .registry import OpDef


@dataclass(frozen=True)
class Location:
    """Where the user's code created a node: file and line, and `more` lines when the node
    stands for several (cse merged nodes of several lines). `phase`: which part of a
    training step the node belongs to ("forward"; a GradLocation says "backward"), for the
    memory report (liveness.py). Prints `loc("step.py":8)`, `loc("step.py":8, "step.py":12)`."""

    file: str
    line: int
    more: tuple[tuple[str, int], ...] = ()
    phase: ClassVar[str] = "forward"
    prefix: ClassVar[str] = ""

    def full(self) -> str:
        """`file:line` with the whole path, as error messages start (the IR prints the base
        name only); the first line of several."""
        return f"{self.file}:{self.line}"

    def sites(self) -> tuple[tuple[str, int], ...]:
        """Every (file, line) it names, the first first."""
        return ((self.file, self.line), *self.more)

    def merged(self, other: Location) -> Location:
        """The location of a node that stands for both (a cse merge): every line of each, in
        order, once; backward only if both are (a forward node that a backward one reuses
        is forward)."""
        sites = tuple(dict.fromkeys(self.sites() + other.sites()))
        kind = GradLocation if self.phase == other.phase == "backward" else Location
        return kind(*sites[0], sites[1:])

    def __str__(self) -> str:
        sites = ", ".join(f"{json.dumps(os.path.basename(f))}:{n}" for f, n in self.sites())
        return f"loc({self.prefix}{sites})"


def merged_location(nodes: Iterable[Node]) -> Location | None:
    """The location of a node that stands for these (a cse merge, a kernel): every line of
    each, or None when one of them has none (not only some of them)."""
    locs = [n.loc for n in nodes]
    if not locs or None in locs:
        return None
    return functools.reduce(Location.merged, locs)


class GradLocation(Location):
    """The location of a backward node: the file:line of the forward node it differentiates
    (autodiff gives it). Prints `loc(grad "step.py":8)`: the gradient of line 8."""

    phase = "backward"
    prefix = "grad "


_serials = itertools.count()  # a unique number for every Value and Node ever made


class Value:
    """An SSA value: a graph input (kind `param` or `arg`, with a name) or a node's output."""

    __slots__ = ("type", "node", "index", "kind", "name", "serial", "users")

    def __init__(self, type: Type, node: Node | None = None, index: int = 0,
                 kind: str | None = None, name: str | None = None):
        self.serial = next(_serials)  # unlike id(), never reused: fingerprints rely on it
        self.type = type
        self.node = node  # the node that defines it; None for graph inputs
        self.index = index
        self.kind = kind  # "param", "arg", or None for node outputs
        self.name = name
        # Who reads a node's output, how many times: nodes (inputs, after edges), the graph
        # whose return names it; kept by the readers' operand lists (uses.py). A graph input
        # has none (None): no rewrite replaces one, a graph's copies share them, and reads of
        # the thousands of inputs of a step are most of its reads.
        self.users: dict[Node | Graph, int] | None = {} if kind is None else None

    def replace_all_uses_with(self, new: Value) -> None:
        """Make every reader of this value (nodes' inputs and after edges, the return) read
        `new` instead."""
        replace_all_uses({self: new})

    @property
    def is_param(self) -> bool:
        """Whether it is a `param` input (a Parameter, `@name`)."""
        return self.kind == "param"

    @property
    def is_input(self) -> bool:
        """Whether it is a graph input (`param` or `arg`) rather than a node's output."""
        return self.kind is not None

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of a tensor value (not of a token)."""
        assert isinstance(self.type, TensorType)
        return self.type.shape

    @property
    def dtype(self) -> DType:
        """The dtype of a tensor value (not of a token)."""
        assert isinstance(self.type, TensorType)
        return self.type.dtype

    def __repr__(self) -> str:
        if self.kind == "param":
            return f"<Value @{self.name}: {self.type}>"
        if self.kind == "arg":
            return f"<Value %{self.name}: {self.type}>"
        return f"<Value {self.node.op}#{self.index}: {self.type}>" if self.node else "<Value>"


class Node:
    """One op applied to input Values; defines `outputs`. `after` edges order it, carry no data.

    `inputs` and `after` are Operands lists: edit them in place (`n.after[:] = kept`,
    `n.after += [t]`), never assign them a plain list, which no use list would follow (the
    verifier says so). Plain attributes, not properties: passes read them a million times."""

    __slots__ = ("op", "inputs", "attrs", "after", "outputs", "loc", "body", "serial")

    def __init__(self, op: str, inputs: Iterable[Value], attrs: dict[str, Any] | None,
                 out_types: Sequence[Type], after: Iterable[Value] = (),
                 loc: Location | None = None, body: Graph | None = None):
        self.serial = next(_serials)
        self.op = op
        self.inputs = Operands.of(self, inputs)
        self.attrs = dict(attrs or {})
        self.after = Ordering.of(self, after)
        self.outputs = [Value(t, self, i) for i, t in enumerate(out_types)]
        self.loc = loc
        self.body = body  # the region of a kernel node; None for every other op

    @property
    def opdef(self) -> OpDef:
        """The op's declaration (passes ask for it on every node they look at: one lookup)."""
        op = REGISTRY.get(self.op)
        return op if op is not None else get_op(self.op)  # (an UnknownOpError)

    @property
    def out(self) -> Value:
        """The single output of a one-output node."""
        assert len(self.outputs) == 1, f"{self.op} has {len(self.outputs)} outputs"
        return self.outputs[0]

    def operands(self) -> Iterator[Value]:
        """Every value this node waits for: data inputs, then after edges."""
        yield from self.inputs
        yield from self.after

    def operand_lists(self) -> tuple[Operands, Ordering]:
        """Its lists of values read: data first (as a graph's return)."""
        return self.inputs, self.after

    def detach(self) -> None:
        """Read nothing any more, so that no use list names this node: for a node that leaves
        its graph (the caller takes it out of graph.nodes)."""
        self.inputs.clear()
        self.after.clear()

    def __str__(self) -> str:
        """Its line of the text form, with its location; results and operands that are not
        graph inputs are named `%v<serial>` (a node alone has no place in a numbering)."""
        from .printer import format_alone
        return format_alone(self)

    def __repr__(self) -> str:
        return f"<Node {self.op} {[str(v.type) for v in self.outputs]}>"


class Graph:
    """A step as a graph: inputs, nodes in topological order, a return with its effects."""

    outputs = operands_property("_outputs", "The values it returns.")
    effects = operands_property("_effects", "The tokens the return is ordered after.")

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self._outputs = Operands.of(self)
        self._effects = Ordering.of(self)

    # -- building ---------------------------------------------------------------------------
    def add_input(self, kind: str, name: str, type: Type) -> Value:
        """Append an input: kind "param" (a Parameter, read as `@name`) or "arg" (an
        argument of the step, `%name`); return its Value."""
        assert kind in ("param", "arg")
        v = Value(type, kind=kind, name=name)
        self.inputs.append(v)
        return v

    def add_node(self, op: str, inputs: Sequence[Value] = (), attrs: dict[str, Any] | None = None,
                 *, after: Sequence[Value] = (), loc: Location | None = None,
                 out_types: Sequence[Type] | None = None) -> Node:
        """Append a node; its output types come from the op's type rule unless given."""
        if out_types is None:
            from .registry import get_op
            out_types = get_op(op).infer([v.type for v in inputs], attrs or {})
        node = Node(op, inputs, attrs, out_types, after, loc)
        self.nodes.append(node)
        return node

    def clone(self) -> Graph:
        """A copy to rewrite: new Nodes (bodies too) and node outputs, the same structure. The
        inputs are the same Values: nothing changes an input, and a step's inputs can number
        thousands."""
        g = Graph(self.name)
        g.inputs = list(self.inputs)
        vmap: dict[Value, Value] = {}
        for n in self.nodes:
            m = Node(n.op, [vmap.get(v, v) for v in n.inputs], n.attrs,
                     [v.type for v in n.outputs], [vmap.get(v, v) for v in n.after], n.loc,
                     n.body.clone() if n.body is not None else None)
            vmap.update(zip(n.outputs, m.outputs))
            g.nodes.append(m)
        g.outputs = [vmap.get(v, v) for v in self.outputs]
        g.effects = [vmap.get(v, v) for v in self.effects]
        return g

    # -- reading ----------------------------------------------------------------------------
    @property
    def params(self) -> list[Value]:
        """The `param` inputs, in order."""
        return [v for v in self.inputs if v.kind == "param"]

    @property
    def args(self) -> list[Value]:
        """The `arg` inputs, in order."""
        return [v for v in self.inputs if v.kind == "arg"]

    def param(self, name: str) -> Value:
        """The `param` input `@name`; KeyError if there is none."""
        for v in self.inputs:
            if v.kind == "param" and v.name == name:
                return v
        raise KeyError(f"graph {self.name} has no parameter @{name}")

    def assigns(self) -> list[Node]:
        """The `assign` nodes, in order (a kernel's stores are not among them)."""
        return [n for n in self.nodes if n.op == "assign"]

    def returned(self) -> Iterable[Value]:
        """Every value the return reads: the outputs, then the effect tokens."""
        yield from self._outputs
        yield from self._effects

    def operand_lists(self) -> tuple[Operands, Ordering]:
        """The return's lists of values read: data first (as a node's)."""
        return self._outputs, self._effects

    # -- showing ----------------------------------------------------------------------------
    def format(self, *, locs: bool = False) -> str:
        """The text form (`str(graph)`), its header saying the bytes one run moves;
        `locs=True` adds each node's source location."""
        from .printer import format_graph
        return format_graph(self, locs=locs, totals=True)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes>"

    def verify(self) -> Graph:
        """Check every IR rule (graphopt.ir.verifier); return the graph itself.

        Raises:
            VerifyError: the first rule the graph breaks, naming the rule and the node.
        """
        from .verifier import verify
        verify(self)
        return self

    def to_dot(self) -> graphviz.Digraph:
        """A graphviz drawing of the graph (see graphopt.ir.export.to_dot)."""
        from .export import to_dot
        return to_dot(self)

    def to_networkx(self) -> networkx.MultiDiGraph:
        """The graph as a networkx MultiDiGraph (see graphopt.ir.export.to_networkx)."""
        from .export import to_networkx
        return to_networkx(self)
