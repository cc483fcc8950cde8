"""nn ops written as the elementwise ops and reductions they are made of, so fuse can put them
in kernels. Each op declares its decomposition in the registry (OpDef.decompose: when it
applies, and the parts it emits; see ir/opdefs.py): `log_softmax x {axis=-1}` is

    m = max x {axes=[axis], keepdims=true}; s = x - m
    log_softmax = s - log(sum(exp(s), {axes=[axis], keepdims=true}))

and `softmax_cross_entropy` a log_softmax (decomposed in turn), a one-hot comparison of the
labels with the classes, a where, a full sum and a division. The parts are the op's numpy
implementation op by op, so the interpreter gives the same bits before and after. A node the
decomposition does not apply to stays whole, and `why_kept` says why (fuse's refusal).
"""
from __future__ import annotations

from typing import Any

from ..ir.graph import Graph, Node, Value
from ..ir.types import Type
from ..ir.uses import replace_all_uses


def why_kept(n: Node) -> str | None:
    """Why a node with a declared decomposition is kept whole (None: it is decomposed; or
    its op has none)."""
    d = n.opdef.decompose
    if d is None:
        return None
    if n.after:
        return "it carries an after edge (a depend): such nodes stay whole"
    return d.why_not([v.type for v in n.inputs], n.attrs)


def decomposable(n: Node) -> bool:
    return n.opdef.decompose is not None and why_kept(n) is None


def decompose(graph: Graph) -> dict[Value, dict[str, Value]]:
    """Rewrite every decomposable node in place, and the decomposable parts it emits (a
    cross-entropy's log_softmax). For each, by its old value, the values it became, by role
    ("max", "sum", "logp.max", ...; "out": what its readers now read)."""
    nodes: list[Node] = []
    mapping: dict[Value, Value] = {}
    parts: dict[Value, dict[str, Value]] = {}

    def write(n: Node, inputs: list[Value], role: str = "") -> Value:
        """n's decomposition on `inputs`, its parts under `role`."""
        mine = parts.setdefault(n.out, {}) if not role else parts[top]

        def emit(part: str, op: str, args: list[Value], attrs: dict[str, Any], t: Type
                 ) -> Value:
            m = Node(op, args, attrs, [t], loc=n.loc)
            if m.opdef.decompose is not None and why_kept(m) is None:
                v = write(m, args, f"{role}{part}.")
                m.detach()
            else:
                nodes.append(m)
                v = m.out
            mine[f"{role}{part}"] = v
            return v

        return n.opdef.decompose.write(emit, inputs, n.attrs)

    for n in graph.nodes:
        if not decomposable(n):
            nodes.append(n)
            continue
        top = n.out
        mapping[n.out] = write(n, list(n.inputs))
        n.detach()
    if mapping:
        graph.nodes = nodes
        replace_all_uses(mapping)
    return parts
