"""cse: merge identical pure nodes (common subexpression elimination).

Two nodes are identical when they apply the same op with equal attributes to the same input
values (in either order for commutative ops) and carry the same after edges. Effects (assign,
kernels that store) are never merged: two writes are two writes. Nor are ordered nodes (the
collectives, OpDef.ordered): two all_reduces of one value are two exchanges every rank makes.

    %3 = multiply %g, %g : f32[4]
    %4 = multiply %g, %g : f32[4]     ->   (removed; readers of %4 read %3)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.analysis import has_effect
from ..ir.graph import Graph, Value, merged_location
from ..ir.uses import replace_all_uses
from .manager import PassContext, register

def attrs_key(attrs: dict[str, Any]) -> tuple:
    """A hashable, exact form of a node's attributes (arrays by dtype, shape and bytes)."""
    def key(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return ("array", x.dtype.str, x.shape, x.tobytes())
        if isinstance(x, (list, tuple)):
            return tuple(key(e) for e in x)
        if isinstance(x, float):  # by bits: -0.0 == 0.0 but 1/-0.0 is not 1/0.0; NaN != NaN
            return ("float", "nan" if x != x else x.hex())
        return (type(x).__name__, x)  # 1 and 1.0 and True stay apart
    return tuple(sorted((k, key(v)) for k, v in attrs.items()))


@register("cse")
def cse(graph: Graph, ctx: PassContext) -> dict:
    seen: dict[tuple, list[Value]] = {}
    kept = []
    for n in graph.nodes:
        if has_effect(n) or n.body is not None or n.opdef.ordered:
            kept.append(n)
            continue
        inputs = [id(v) for v in n.inputs]
        if n.opdef.commutative:
            inputs.sort()
        key = (n.op, tuple(inputs), attrs_key(n.attrs), tuple(id(v) for v in n.after),
               tuple(str(v.type) for v in n.outputs))
        if key in seen:  # its readers, all later in the order, read the first one's values
            first = seen[key][0].node  # it stands for both: the lines of each, or none
            first.loc = merged_location((first, n))
            replace_all_uses(dict(zip(n.outputs, seen[key])))
            n.detach()
            continue
        seen[key] = n.outputs
        kept.append(n)
    merged = len(graph.nodes) - len(kept)
    graph.nodes = kept
    return {"merged": merged}
