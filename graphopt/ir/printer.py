"""The text form of a graph: one line per node, types on every value, deterministic names.

    graph step {  # bytes per run: 340 B (read 196 B, written 144 B)
      param @w: f32[4,3]
      arg %g: f32[4,3]
      %0 = constant {value=0.1} : f32[]
      %1 = multiply %0, %g : f32[4,3]
      %2 = subtract @w, %1 : f32[4,3]
      %3 = assign @w, %2 : token
      return after(%3)
    }

Parameters print as `@name`, arguments as `%name`, node results as `%0, %1, ...` in order of
definition; the header's comment is the bytes one run moves (traffic.py). `parser.py` reads this text back; docs/ir.md gives the grammar.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from .graph import Graph, Node, Value
from .registry import REGISTRY
from .types import DType, to_dtype


def format_scalar(x: Any, dtype: DType | None = None) -> str:
    """A number as the text form writes it; a float of a known dtype in the shortest digits
    that give the same value in that dtype (0.1, not 0.10000000149011612, for an f32)."""
    if isinstance(x, (bool, np.bool_)):
        return "true" if x else "false"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        f = float(x)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        if dtype is None or dtype.name == "f64" or not dtype.is_float:
            return repr(f)
        with np.errstate(over="ignore"):
            x = dtype.np_dtype.type(f)
        if not np.isfinite(x):  # out of the dtype's range: the value it rounds to
            return "inf" if x > 0 else "-inf"
        text = str(x)
        return text if any(c in text for c in ".e") else text + ".0"
    raise TypeError(f"cannot print {x!r} as a scalar")


def format_attr(x: Any, dtype: DType | None = None) -> str:
    if isinstance(x, DType):
        return x.name
    if isinstance(x, str):
        return json.dumps(x)
    if isinstance(x, (tuple, list)):
        return "[" + ", ".join(format_attr(e, dtype) for e in x) + "]"
    if isinstance(x, np.ndarray):
        if x.dtype.kind == "V" or x.dtype.name == "bfloat16":
            x = x.astype(np.float64)  # bf16 scalars print through their exact f64 value
        return format_attr(x.tolist(), dtype) if x.ndim else format_scalar(x.item(), dtype)
    return format_scalar(x, dtype)


_PLAIN_NAME = re.compile(r"[A-Za-z_][\w.]*\Z")


def quote(name: str) -> str:
    """A name as the text form writes it: JSON-quoted unless it is a plain identifier."""
    return name if _PLAIN_NAME.match(name) else json.dumps(name)


class Namer:
    """Stable names: inputs keep theirs, node results are numbered in order of definition.

    `keep`: names some values already have (an earlier printing's, by identity): they keep
    them, and new values get numbers none of those has. A pass's diff prints the graph after
    it so, and shows only what the pass changed, not the renumbering of every later value."""

    def __init__(self, keep: dict[Value, str] | None = None) -> None:
        self.names: dict[Value, str] = {}
        self.keep = keep or {}
        self.taken: set[str] = set(self.keep.values())
        self.counter = 0

    def define(self, v: Value) -> str:
        if v in self.names:  # used before its definition (a broken graph): keep that name
            return self.names[v]
        if v in self.keep:
            name = self.keep[v]
        elif v.kind == "param":
            name = f"@{quote(v.name)}"
        elif v.kind == "arg":
            name = f"%{quote(v.name)}"
            self.taken.add(f"%{v.name}")  # the parser reads %"0" as %0
        else:  # the next number no input is named (an `arg %0` keeps its name)
            while f"%{self.counter}" in self.taken:
                self.counter += 1
            name = f"%{self.counter}"
            self.counter += 1
        self.names[v] = name
        self.taken.add(name)
        return name

    def __call__(self, v: Value) -> str:
        # A value used before it is defined (in a broken graph) still gets a name.
        return self.names.get(v) or self.define(v)


def value_names(graph: Graph, keep: dict[Value, str] | None = None) -> dict[Value, str]:
    """The name each value of a graph has in its printed text (`keep`: names values keep, as
    `format_graph` takes them)."""
    name = Namer(keep)
    for v in graph.inputs:
        name.define(v)
    for n in graph.nodes:
        for v in n.outputs:
            name.define(v)
    return name.names


def kept_names(before: dict[Value, str], replaced: dict[Value, Value],
               graph: Graph) -> dict[Value, str]:
    """The names a graph's values keep from an earlier printing (`before`, by identity),
    after a rewrite that replaced values (`replaced`: old -> new, in order): a value that was
    there keeps its name; a new value that took the place of one that is gone takes its name
    (a node fused into a kernel: the kernel's result is still `%3`)."""
    keep = dict(before)
    live = set(graph.inputs) | {v for n in graph.nodes for v in n.outputs}
    for old, new in replaced.items():  # in order: a chain old -> mid -> new ends at new
        if old in keep and new not in keep and old not in live:  # the first old one's
            keep[new] = keep[old]
    owners: dict[str, list[Value]] = {}
    for v in live:
        if v in keep:
            owners.setdefault(keep[v], []).append(v)
    for name, vs in owners.items():  # a name two live values would take stays the old one's
        for v in vs:
            if len(vs) > 1 and v not in before:
                del keep[v]
    return {v: name for v, name in keep.items() if v in live}


def format_attrs(node: Node) -> str:
    """`k=v, ...` in the op's declared order, leaving out what the result type shows."""
    op = REGISTRY.get(node.op)  # a broken graph may name an unknown op; print it anyway
    hidden = op.type_attrs if op else ()
    order = list(op.attrs) if op else []
    keys = [k for k in order if k in node.attrs] + sorted(k for k in node.attrs if k not in order)
    # An op whose dtype is a type attribute (constant) holds numbers of that dtype.
    dtype = to_dtype(node.attrs["dtype"]) if "dtype" in hidden and "dtype" in node.attrs else None
    return ", ".join(f"{k}={format_attr(node.attrs[k], dtype)}" for k in keys if k not in hidden)


def format_node(node: Node, name: Namer, *, locs: bool = False) -> str:
    results = ", ".join(name.define(v) for v in node.outputs)
    parts = [f"{results} = {node.op}" if results else node.op]
    if node.inputs:
        parts.append(", ".join(name(v) for v in node.inputs))
    attrs = format_attrs(node)
    if attrs:
        parts.append("{" + attrs + "}")
    if node.after:
        parts.append("after(" + ", ".join(name(v) for v in node.after) + ")")
    line = " ".join(parts) + " :"
    if node.outputs:
        line += " " + ", ".join(str(v.type) for v in node.outputs)
    if locs and node.loc is not None:
        line += f"  {node.loc}"
    return line


def _node_lines(node: Node, name: Namer, indent: str, locs: bool) -> list[str]:
    """A node's line; a kernel's is followed by its body's."""
    line = indent + format_node(node, name, locs=locs)
    if node.body is None:
        return [line]
    from .kernel import cost, source_lines
    # (a kernel has no location of its own: with locations, its header names the lines of
    # the nodes fused into it, in its comment, so a reader of the headers alone sees them)
    lines = source_lines(node) if locs and node.loc is None else ""
    return [f"{line} {{{_comment(cost, node)}{'; from ' + lines if lines else ''}",
            *_region(node.body, Namer(), indent + "  ", locs), indent + "}"]


def format_alone(node: Node) -> str:
    """A node's line out of its graph (`str(node)`): graph inputs by their names, other
    nodes' results `%v` and their serial number (unique in the process), since the numbers
    `%0, %1, ...` exist only in a printing of the whole graph."""
    name = Namer({v: f"%v{v.serial}" for v in (*node.operands(), *node.outputs)
                  if not v.is_input})
    return "\n".join(_node_lines(node, name, "", locs=True))


def _region(graph: Graph, name: Namer, indent: str, locs: bool) -> list[str]:
    """The lines of a graph's inputs, nodes and return; a kernel's body nests inside it."""
    lines = [f"{indent}{v.kind} {name.define(v)}: {v.type}" for v in graph.inputs]
    for node in graph.nodes:
        lines += _node_lines(node, name, indent, locs)
    ret = indent + "return"
    if graph.outputs:
        ret += " " + ", ".join(name(v) for v in graph.outputs)
    if graph.effects:
        ret += " after(" + ", ".join(name(v) for v in graph.effects) + ")"
    return lines + [ret]


def format_graph(graph: Graph, *, locs: bool = False, keep: dict[Value, str] | None = None,
                 totals: bool = False) -> str:
    """The text form of a graph (what `str(graph)` and `graph.format()` give), which `parse`
    reads back; `locs=True` adds each node's source location; `keep`: names values keep
    (Namer's); `totals=True` puts in the header line's comment the bytes one run of the
    graph moves (traffic.py: numpy nodes and kernels), as `str(graph)` does."""
    lines = _region(graph, Namer(keep), "  ", locs)
    header = f"graph {quote(graph.name)} {{"
    if totals:
        from .traffic import traffic
        header += _comment(lambda g: f"bytes per run: {traffic(g)}", graph)
    return "\n".join([header] + lines + ["}"])


def _comment(what: Any, subject: Any) -> str:
    """`  # what(subject)`: a cost, in a line's comment; nothing for a broken kernel or
    graph, which still prints (for the verifier's message)."""
    try:
        return f"  # {what(subject)}"
    except Exception:
        return ""
