"""rowfuse: an update of a row gradient's rows becomes one row kernel (ir/rowkernel.py).

After `fuse`, an optimizer's row rule (`update_rows`) is a kernel over the gradient's values,
[K, ...]: it reads `take_rows @p, %c` (the rows of the parameter and of each state: K rows
gathered into a tensor), the values and scalars, and each result goes back through
`with_values %c` into `assign @p` (K rows scattered into the parameter at commit). rowfuse
makes the kernel read and write those rows where they lie, in place, in one loop over the K
rows:

    %g = rows_values %c                             %g = rows_values %c
    %p = take_rows @w, %c                           %t = row_kernel %c, @w, %g, %lr
    %n = kernel %g, %p, %lr {spaces=[[K,D]]} {  ->           {spaces=[[K,D]], indexed=[1]} {
      ... return %new                                 ... store %x1, %new
    }                                               }
    %r = with_values %c, %n
    %a = assign @w, %r

A kernel is rewritten when it has one iteration space, the values' shape of unique rows %c,
and each of its outputs is a map read only by a `with_values %c` that only an `assign` reads.
Its operands that are `take_rows` of %c become indexed operands (the tensor itself, read at
the rows' indices); a parameter assigned but not read becomes one too. A kernel that reads
rows of %c but does not fit is left as it is, with the reason (for explain).
"""
from __future__ import annotations

import functools

from ..ir.graph import Graph, Node, Value
from ..ir.kernel import ROW_KERNEL, body_reductions, infer_types
from ..ir.printer import value_names
from ..ir.types import RowsType, TensorType
from .grouping import install
from .manager import PassContext, register


def _only_reader(v: Value) -> Node | None:
    """The one node that reads v (as data, once), if exactly one does and the return not."""
    users = v.users or {}
    if len(users) != 1:
        return None
    (user, count), = users.items()
    return user if isinstance(user, Node) and count == 1 and v in user.inputs else None


def _rows_read(k: Node) -> set[Value]:
    """The row gradients whose rows a kernel reads (through take_rows)."""
    return {v.node.inputs[1] for v in k.inputs if v.node is not None and v.node.op == "take_rows"}


def _plan(k: Node) -> tuple[Value, list[Node]] | str:
    """The unique rows a kernel updates and the assign of each of its outputs, or why not."""
    space = tuple(k.attrs["spaces"][0])
    if len(k.attrs["spaces"]) != 1 or set(k.attrs["outputs"]) != {"map"} or k.body.effects:
        return "it is not one iteration space whose results are all maps"
    if body_reductions(k.body):
        return "it reduces rows of its values (a row kernel's body is elementwise)"
    rows, assigns = None, []
    for out in k.outputs:
        w = _only_reader(out)
        a = _only_reader(w.out) if w is not None and w.op == "with_values" else None
        if a is None or a.op != "assign" or w.inputs[1] is not out:
            return "a result is not only a row update's values (with_values, then assign)"
        if rows not in (None, w.inputs[0]):
            return "its results update the rows of two row gradients"
        rows = w.inputs[0]
        assigns.append(a)
    t = rows.type
    if not (isinstance(t, RowsType) and t.unique and t.values_type.shape == space):
        return f"the rows it writes ({t}) are not unique rows of its iteration space"
    return rows, assigns


def _row_kernel(k: Node, rows: Value, assigns: list[Node]) -> tuple[Node, set[Node]]:
    """The row kernel that does k's work on rows of `rows`, and the nodes it replaces
    (the with_values and assigns; the take_rows it reads through are left to dce)."""
    body = k.body.clone()
    operands, indexed = [rows], []
    for j, v in enumerate(k.inputs):
        p = v.node
        if p is not None and p.op == "take_rows" and p.inputs[1] is rows:
            operands.append(p.inputs[0])
            indexed.append(j)
        else:
            operands.append(v)
    stores = []
    for out, a in zip(body.outputs, assigns):
        target = a.inputs[0]
        j = next((j for j in indexed if operands[1 + j] is target), None)
        if j is None:  # assigned, never read: an indexed operand of its own
            j = len(body.inputs)
            body.add_input("arg", f"x{j}", TensorType((), target.dtype))
            operands.append(target)
            indexed.append(j)
        stores.append(body.add_node("store", [body.inputs[j], out], loc=a.loc).out)
    body.outputs, body.effects = [], stores
    replaced = {k, *assigns, *(_only_reader(out) for out in k.outputs)}
    after = _after(k, assigns, replaced)
    node = Node(ROW_KERNEL, operands, {"spaces": k.attrs["spaces"], "indexed": indexed,
                                       "shared": []}, [], after, loc=k.loc, body=body)
    node.outputs = [Value(t, node, i) for i, t in enumerate(infer_types(node))]
    return node, replaced


def _after(k: Node, assigns: list[Node], replaced: set[Node]) -> list[Value]:
    """The after edges of the kernel and of the assigns, but those to take_rows nodes that
    nothing else reads (they are gone once the kernel reads the rows itself)."""
    def dropped(v: Value) -> bool:
        p = v.node
        return p is not None and (p in replaced or p.op == "take_rows" and
                                  all(u in replaced for u in (v.users or {})))
    after: list[Value] = []
    for n in (k, *assigns):
        after += [v for v in n.after if v not in after and not dropped(v)]
    return after


@register("rowfuse")
def rowfuse(graph: Graph, ctx: PassContext) -> dict:
    names = functools.cache(lambda: value_names(graph))  # for refusals
    replaced: dict[int, Node] = {}
    mapping: dict[Value, Value] = {}
    made = 0
    for k in graph.nodes:
        if k.op != "kernel" or not _rows_read(k) and not any(
                (r := _only_reader(o)) is not None and r.op == "with_values" for o in k.outputs):
            continue
        plan = _plan(k)
        if isinstance(plan, str):
            ctx.refuse(f"{names()[k.outputs[0]]} = kernel" if k.outputs else "kernel",
                       f"not a row kernel: {plan}", k.loc)
            continue
        node, gone = _row_kernel(k, *plan)
        made += 1
        for n in gone:
            replaced[id(n)] = node
        mapping.update((a.out, node.outputs[0]) for a in plan[1])
    install(graph, replaced, mapping)
    return {"row_kernels": made}
