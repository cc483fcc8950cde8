"""nn ops written as the elementwise ops and row reductions they are made of, so fuse can put
them in kernels: `log_softmax x {axis=-1}` is

    m = max x {axes=[axis], keepdims=true}; s = x - m
    log_softmax = s - log(sum(exp(s), {axes=[axis], keepdims=true}))

the registry's own numpy implementation, op by op, so the interpreter gives the same bits
before and after. Only over the last axis (a row reduction) and in f32 or f64 (numpy computes
a 16-bit log_softmax in 16 bits, where kernel ops round each result from f32); the others
stay nodes, with fuse's refusal.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ir.uses import replace_all_uses


def decomposable(n: Node) -> bool:
    """Whether n is a log_softmax over the last axis of a 2-or-more-dimensional f32 or f64
    tensor, with no after edges."""
    if n.op != "log_softmax" or n.after:
        return False
    x = n.inputs[0]
    return x.type.ndim >= 2 and n.attrs["axis"] == x.type.ndim - 1 and \
        x.dtype.name in ("f32", "f64")


def decompose(graph: Graph) -> dict[Value, dict[str, Value]]:
    """Rewrite every decomposable log_softmax in place. For each, by its old value, the
    values it became: "max", "shifted", "exp", "sum", "log", and "out" (what its readers
    now read)."""
    nodes: list[Node] = []
    mapping: dict[Value, Value] = {}
    parts: dict[Value, dict[str, Value]] = {}
    for n in graph.nodes:
        if not decomposable(n):
            nodes.append(n)
            continue
        x = n.inputs[0]
        row = TensorType(x.shape[:-1] + (1,), x.dtype)
        reduce = {"axes": [x.type.ndim - 1], "keepdims": True}

        def add(op: str, inputs: list[Value], t: TensorType, attrs: dict | None = None,
                n: Node = n) -> Value:
            m = Node(op, inputs, attrs, [t], loc=n.loc)
            nodes.append(m)
            return m.out

        p = parts[n.out] = {"max": add("max", [x], row, reduce)}
        p["shifted"] = add("subtract", [x, p["max"]], x.type)
        p["exp"] = add("exp", [p["shifted"]], x.type)
        p["sum"] = add("sum", [p["exp"]], row, reduce)
        p["log"] = add("log", [p["sum"]], row)
        p["out"] = mapping[n.out] = add("subtract", [p["shifted"], p["log"]], x.type)
        n.detach()
    if mapping:
        graph.nodes = nodes
        replace_all_uses(mapping)
    return parts
