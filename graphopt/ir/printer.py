"""The text form of a graph: one line per node, types on every value, deterministic names.

    graph step {
      param @w: f32[4,3]
      arg %g: f32[4,3]
      %0 = constant {value=0.1} : f32[]
      %1 = multiply %0, %g : f32[4,3]
      %2 = subtract @w, %1 : f32[4,3]
      %3 = assign @w, %2 : token
      return after(%3)
    }

Parameters print as `@name`, arguments as `%name`, node results as `%0, %1, ...` in order of
definition. `parser.py` reads this text back; docs/ir.md gives the grammar.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from .graph import Graph, Node, Value
from .registry import REGISTRY
from .types import DType


def format_scalar(x: Any) -> str:
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
        return repr(f)
    raise TypeError(f"cannot print {x!r} as a scalar")


def format_attr(x: Any) -> str:
    if isinstance(x, DType):
        return x.name
    if isinstance(x, str):
        return json.dumps(x)
    if isinstance(x, (tuple, list)):
        return "[" + ", ".join(format_attr(e) for e in x) + "]"
    if isinstance(x, np.ndarray):
        if x.dtype.kind == "V" or x.dtype.name == "bfloat16":
            x = x.astype(np.float64)  # bf16 scalars print through their exact f64 value
        return format_attr(x.tolist()) if x.ndim else format_scalar(x.item())
    return format_scalar(x)


class Namer:
    """Stable names: inputs keep theirs, node results are numbered in order of definition."""

    def __init__(self) -> None:
        self.names: dict[Value, str] = {}
        self.counter = 0

    def define(self, v: Value) -> str:
        if v.kind == "param":
            name = f"@{v.name}"
        elif v.kind == "arg":
            name = f"%{v.name}"
        else:
            name = f"%{self.counter}"
            self.counter += 1
        self.names[v] = name
        return name

    def __call__(self, v: Value) -> str:
        # A value used before it is defined (in a broken graph) still gets a name.
        return self.names.get(v) or self.define(v)


def format_node(node: Node, name: Namer, *, locs: bool = False) -> str:
    results = ", ".join(name.define(v) for v in node.outputs)
    parts = [f"{results} = {node.op}" if results else node.op]
    if node.inputs:
        parts.append(", ".join(name(v) for v in node.inputs))
    op = REGISTRY.get(node.op)  # a broken graph may name an unknown op; print it anyway
    hidden = op.type_attrs if op else ()
    order = list(op.attrs) if op else []
    keys = [k for k in order if k in node.attrs] + sorted(k for k in node.attrs if k not in order)
    shown = [f"{k}={format_attr(node.attrs[k])}" for k in keys if k not in hidden]
    if shown:
        parts.append("{" + ", ".join(shown) + "}")
    if node.after:
        parts.append("after(" + ", ".join(name(v) for v in node.after) + ")")
    line = " ".join(parts) + " : " + ", ".join(str(v.type) for v in node.outputs)
    if locs and node.loc is not None:
        line += f"  {node.loc}"
    return line


def format_graph(graph: Graph, *, locs: bool = False) -> str:
    name = Namer()
    lines = [f"graph {graph.name} {{"]
    for v in graph.inputs:
        lines.append(f"  {v.kind} {name.define(v)}: {v.type}")
    for node in graph.nodes:
        lines.append("  " + format_node(node, name, locs=locs))
    ret = "  return"
    if graph.outputs:
        ret += " " + ", ".join(name(v) for v in graph.outputs)
    if graph.effects:
        ret += " after(" + ", ".join(name(v) for v in graph.effects) + ")"
    lines.append(ret)
    lines.append("}")
    return "\n".join(lines)
