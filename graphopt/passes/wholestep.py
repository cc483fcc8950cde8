"""Whole-step fusion: an update that only a kernel's reduced result feeds runs in that kernel's
finish stage (see ir/kernel.py), and the gradient is never stored.

A bias gradient is a "sum@1" output of the kernel that makes its operand (the masked
cotangent, [batch, features] -> [features]); the optimizer's update of that bias (Adam, SGD,
...: an elementwise body with stores, usually one instance of a multi-tensor kernel) read it
back from memory. After `fuse` has made its kernels, each instance of an update kernel whose
gradient is a reduced output of one kernel K, read by nothing else, moves into K: K's body
reduces the element value itself (a finish reduction) and the update's body runs on the
result, over the reduced shape, once K's blocks are combined; the instance leaves the update
kernel (the kernel goes when its last instance does). The weights' updates, whose gradients
a matmul makes, stay where they are.

An instance moves when
  - its gradient is read by the update alone (a gradient norm that also reads it needs it
    stored), and the update's iteration space is the gradient's shape;
  - K is a kernel of one instance, and its finish stage, if it has one, reduces the same
    leading axes;
  - no operand of the update is computed from K's results, no other reader of a parameter it
    stores (its old value) runs after K, and no writer of a parameter it reads runs before
    K: those orders are kept by after edges (K waits for the readers; the writers, which
    waited for the update kernel's token, wait for K's too).
Otherwise a refusal says why, for explain.
"""
from __future__ import annotations

import functools
from typing import Callable

from ..ir import kernel as kernel_ir
from ..ir.analysis import toposort
from ..ir.graph import Graph, Node, Value
from ..ir.kernel import infer_types, is_mapped, layout, split_kind, stages
from ..ir.types import TensorType
from .grouping import install
from ..ir.printer import value_names
from .manager import PassContext, register


@register("wholestep")
def wholestep(graph: Graph, ctx: PassContext) -> dict:
    """Move every update instance that can run in the finish stage of the kernel making its
    gradient (see the module's doc)."""
    table = functools.cache(lambda: value_names(graph))  # for refusals (the graph before)
    names = lambda v: table()[v]  # noqa: E731
    moved = 0
    refused: set[tuple[int, int]] = set()
    for update in [n for n in graph.nodes if _is_update(n)]:
        while update is not None:
            found = _movable(graph, update, ctx, names, refused)
            if found is None:
                break
            i, grad = found
            named = table()  # values as named before the first move, and what stands for them
            update, mapping = _move(graph, update, i, grad)
            named.update((new, named[old]) for old, new in mapping.items() if old in named)
            moved += 1
    return {"updates_moved": moved}


def _is_update(n: Node) -> bool:
    return n.op == "kernel" and bool(n.body.effects) and not n.body.outputs and \
        not kernel_ir.finish_reductions(n.body)


def _reduced_output(v: Value) -> int | None:
    """Which body output of the kernel that makes v it is, if v is a reduced output of a
    one-instance kernel (not a row kernel) that reduces at least one axis (a "sum" over a
    scalar space reduces none: a finish stage needs one); None otherwise."""
    k = v.node
    if k is None or k.op != "kernel" or len(k.attrs["spaces"]) != 1:
        return None
    kind = k.attrs["outputs"][v.index] if v.index < len(k.attrs["outputs"]) else "map"
    return None if is_mapped(kind) or not k.attrs["spaces"][0] else v.index


def _movable(graph: Graph, update: Node, ctx: PassContext, names: Callable[[Value], str],
             refused: set[tuple[int, int]]) -> tuple[int, Value] | None:
    """The first instance of the update that can move, with its gradient; refusals recorded
    (once each) for those that cannot."""
    lay = layout(update)
    per = lay.per_instance
    for i, (space, row) in enumerate(zip(update.attrs["spaces"], kernel_ir.instance_rows(update,
                                                                                          lay))):
        for j in per:
            v = row[j]
            if v.is_input or _reduced_output(v) is None:
                continue
            reason = _why_not(graph, update, i, tuple(space), row, v, names)
            if reason is None:
                return i, v
            if (v.serial, update.serial) not in refused:
                refused.add((v.serial, update.serial))
                params = ", ".join(names(row[t]) for t, _ in kernel_ir.stores(update.body))
                ctx.refuse(f"the update of {params}", f"its gradient {names(v)} ({v.type}, "
                           f"{v.type.nbytes} B stored and read back) is a \""
                           f"{v.node.attrs['outputs'][v.index]}\" output of the kernel that "
                           f"makes its operand, but {reason}", update.loc)
    return None


def _why_not(graph: Graph, update: Node, i: int, space: tuple[int, ...], row: tuple[Value, ...],
             v: Value, names: Callable[[Value], str]) -> str | None:
    """Why instance i of the update cannot run in the finish stage of the kernel making v."""
    k = v.node
    others = [u for u in v.users if u is not update]
    if others:
        return f"it is also read by {_name(others[0], names)}, so it must be stored"
    if sum(w is v for w in update.inputs) != 1:
        return "it is read by more than one instance of the update kernel"
    if space != v.shape:
        return (f"the update runs over {list(space)}, not over the gradient's shape "
                f"{list(v.shape)}")
    kind = k.attrs["outputs"][v.index]
    st = stages(k.body)
    reduced = split_kind(kind)[1] or len(k.attrs["spaces"][0])
    if st.k is not None and st.k != reduced:
        return (f"that kernel's finish stage reduces its leading {st.k} axes, and this "
                f"gradient {reduced}")
    after = _descendants(k)
    for w in row:
        if w is not v and w.node is not None and id(w.node) in after:
            return (f"the update reads {names(w)}, which is computed from that kernel's "
                    f"results: it cannot run inside it (a cycle)")
    before = _ancestors(k)
    stored = [row[t] for t, _ in kernel_ir.stores(update.body)]
    for p in stored:
        for r in _readers(graph, p):
            if r is not update and r is not k and id(r) in after:
                return (f"{_name(r, names)} reads {names(p)} after that kernel has run, and "
                        f"the update must write {names(p)} after every read of it")
    for w in _writers(graph, set(row) - set(stored)):
        if id(w) in before:
            return (f"{_name(w, names)} writes an operand of the update before that kernel "
                    f"runs")
    return None


def _name(n: Node | Graph, names: Callable[[Value], str]) -> str:
    if isinstance(n, Graph):
        return "the return"
    return f"{names(n.outputs[0])} = {n.op}" if n.outputs else n.op


def _walk(start: list[Node], step: Callable[[Node], list[Node]]) -> set[int]:
    seen: set[int] = set()
    stack = list(start)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack += step(n)
    return seen


def _descendants(k: Node) -> set[int]:
    """ids of the nodes that read k's results, directly or not (after edges too)."""
    return _walk([u for v in k.outputs for u in v.users if isinstance(u, Node)],
                 lambda n: [u for v in n.outputs for u in v.users if isinstance(u, Node)])


def _ancestors(k: Node) -> set[int]:
    """ids of the nodes k waits for, directly or not (after edges too)."""
    return _walk([v.node for v in k.operands() if v.node is not None],
                 lambda n: [v.node for v in n.operands() if v.node is not None])


def _readers(graph: Graph, p: Value) -> list[Node]:
    """The nodes that read parameter p as data (a graph input has no use list)."""
    return [n for n in graph.nodes if p in n.inputs]


def _writers(graph: Graph, params: set[Value]) -> list[Node]:
    return [n for n in graph.nodes if not params.isdisjoint(kernel_ir.written(n))]


def _move(graph: Graph, update: Node, i: int, grad: Value
          ) -> tuple[Node | None, dict[Value, Value]]:
    """Move instance i of the update into the finish stage of the kernel making grad; the
    update kernel left (None when i was its last instance), and the values replaced."""
    k = grad.node
    lay = layout(update)
    row = list(kernel_ir.instance_rows(update, lay))[i]
    stored = [row[t] for t, _ in kernel_ir.stores(update.body)]
    readers = [r for p in stored for r in _readers(graph, p) if r is not update and r is not k]
    before = _ancestors(k)
    waits = [r.outputs[0] for r in readers if id(r) not in before and r.outputs]
    new_k = _merged(k, grad, update.body, row, waits)
    rest = _without_instance(update, i)
    mapping: dict[Value, Value] = {}
    kept = [o for o in range(len(k.outputs)) if k.outputs[o] is not grad]
    mapping.update(zip([k.outputs[o] for o in kept if isinstance(k.outputs[o].type, TensorType)],
                       new_k.outputs))
    if layout(k).has_token:
        mapping[k.outputs[-1]] = new_k.outputs[-1]
    token = new_k.outputs[-1]
    old_token = update.outputs[-1]
    waiting = [u for u in old_token.users]  # who waits for the update: they wait for k too
    if rest is None:
        mapping[old_token] = token
    else:
        mapping[old_token] = rest.outputs[-1]
    install(graph, {id(k): new_k, id(update): rest if rest is not None else new_k}, mapping)
    if rest is not None:
        for u in waiting:
            after = u.operand_lists()[1]
            if token not in after:
                after.append(token)
    toposort(graph)
    return rest, mapping


def _merged(k: Node, grad: Value, update_body: Graph, row: list[Value],
            waits: list[Value]) -> Node:
    """Kernel k with the update body's instance `row` in its finish stage, on the finish
    reduction of the body output that was `grad`."""
    body = k.body.clone()
    o = grad.index
    element = body.outputs[o]
    kind = k.attrs["outputs"][o]
    op, lead = split_kind(kind)
    ndim = len(k.attrs["spaces"][0])
    axes = list(range(ndim if lead is None else lead))
    red = body.add_node(op, [element], {"axes": axes, "keepdims": False},
                        out_types=[TensorType((), element.dtype)]).out
    body.outputs = [v for n, v in enumerate(body.outputs) if n != o]
    operands = list(k.inputs)
    env: dict[Value, Value] = {}
    for x, w in zip(update_body.inputs, row):
        if w is grad:
            env[x] = red
        elif w in operands:
            env[x] = body.inputs[operands.index(w)]
        else:
            operands.append(w)
            env[x] = body.add_input("arg", f"x{len(operands) - 1}", x.type)
    for n in update_body.nodes:
        m = body.add_node(n.op, [env[v] for v in n.inputs], n.attrs, loc=n.loc,
                          out_types=[v.type for v in n.outputs])
        env.update(zip(n.outputs, m.outputs))
    body.effects = list(body.effects) + [env[t] for t in update_body.effects]
    kinds = [kd for n, kd in enumerate(k.attrs["outputs"]) if n != o]
    after = list(k.after) + [w for w in waits if w not in k.after and w not in operands]
    node = Node("kernel", operands, {**k.attrs, "outputs": kinds}, [], after, loc=k.loc,
                body=body)
    node.outputs = [Value(t, node, n) for n, t in enumerate(infer_types(node))]
    return node


def _without_instance(update: Node, i: int) -> Node | None:
    """The update kernel without instance i; None if it had no other."""
    lay = layout(update)
    if lay.instances == 1:
        return None
    per = len(lay.per_instance)
    n = lay.instances * per
    inputs = update.inputs[:i * per] + update.inputs[(i + 1) * per:n] + update.inputs[n:]
    spaces = [s for m, s in enumerate(update.attrs["spaces"]) if m != i]
    node = Node(update.op, inputs, {**update.attrs, "spaces": spaces}, [], list(update.after),
                loc=update.loc, body=update.body)
    node.outputs = [Value(t, node, m) for m, t in enumerate(infer_types(node))]
    return node
