"""Row kernels: an update rule fused into one loop over the rows of a row gradient.

    %9 = row_kernel %c, @emb, @emb.exp_avg, %g, %lr {spaces=[[4096,32]], indexed=[0, 1],
                                                     shared=[3]} : token {
      arg %x0: f32[]            @emb at row %c.indices[k]
      arg %x1: f32[]            @emb.exp_avg at row %c.indices[k]
      arg %x2: f32[]            %g (the rows' values, [4096,32]) at row k
      arg %x3: f32[]            %lr
      ...
      %5 = store %x1, %3 : token
      %6 = store %x0, %4 : token
      return after(%5, %6)
    }

Its iteration space is the values' shape of a row gradient with unique indices (`%c`, a
`rows<K, f32[N,...], unique>`): element (k, j) of an *indexed* body input reads element j of
row `%c.indices[k]` of its operand (a tensor of the dense shape: a parameter, its state), and
a store writes it back there, in place; any other operand is read as in a kernel (it streams
through [K, ...], or it is a scalar). An entry of `%c` whose index is the no-row index N is
skipped, and so, as a safety net, is any index outside [0, N) (`rows` and `coalesce` have
refused those before the kernel runs). It moves bytes in proportion to K times the row size,
whatever N is: the point of it.

Operands: one row gradient per instance first, then as in a multi-tensor kernel
(ir/kernel.py, `Layout.lead`): per instance, the operands of the body inputs that are not
shared, then the shared ones. A row kernel only stores: it yields one token.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..errors import OpTypeError
from .graph import Node, Value
from .kernel import ROW_KERNEL, _broadcasts, columns, layout, stores
from .registry import INTS_ATTR, KERNEL, SHAPES_ATTR, OpDef, register
from .types import RowsArray, RowsType, TensorType, Type, token


def _row_kernel_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    raise OpTypeError("a row kernel's result type comes from its body (use kernel.infer_types)")


register(OpDef(ROW_KERNEL, KERNEL, _row_kernel_infer, attrs=("spaces", "indexed", "shared"),
               attr_kinds=(SHAPES_ATTR, INTS_ATTR, INTS_ATTR),
               doc="an update fused into a loop over the rows of a row gradient; see "
                   "graphopt/ir/rowkernel.py"))


def row_types(node: Node) -> list[Type]:
    """A row kernel's result (its token), once its operands are checked against its body."""
    lay = layout(node)
    body, spaces = node.body, [tuple(s) for s in node.attrs["spaces"]]
    indexed = set(node.attrs["indexed"])
    if not lay.instances or body.outputs or not body.effects:
        raise OpTypeError("row_kernel: at least one instance, no outputs, and stores")
    if not indexed <= set(lay.per_instance) or \
            len(node.inputs) != lay.lead + lay.instances * len(lay.per_instance) + len(lay.shared):
        raise OpTypeError(f"row_kernel: {len(node.inputs)} operands do not fit {lay.instances} "
                          f"instance(s) of rows and a body of {lay.body_inputs} inputs, "
                          f"indexed {sorted(indexed)} (not shared)")
    if not {j for j, _ in stores(body)} <= indexed:
        raise OpTypeError("row_kernel: a store writes an operand that is not indexed")
    for i, (space, rows) in enumerate(zip(spaces, node.inputs)):
        if not isinstance(rows.type, RowsType) or not rows.type.unique or \
                rows.type.values_type.shape != space:
            raise OpTypeError(f"row_kernel: instance {i} needs unique rows whose values are "
                              f"{list(space)}, got {rows.type}")
    for j, (x, column) in enumerate(zip(body.inputs, columns(node, lay))):
        for i, (v, space, rows) in enumerate(zip(column, spaces, node.inputs)):
            t = v.type
            fits = isinstance(t, TensorType) and t.dtype == x.dtype and (
                t.shape == rows.type.shape if j in indexed else
                t.shape == () if j in lay.shared else _broadcasts(t.shape, space))
            if not fits:
                what = f"of the dense shape {list(rows.type.shape)}" if j in indexed else \
                    "a scalar" if j in lay.shared else f"of a shape that broadcasts to {list(space)}"
                raise OpTypeError(f"row_kernel: operand {j} of instance {i} is {t}; the body "
                                  f"reads it as {x.type}, {what}")
    return [token]


def run_rows(node: Node, arrays: Sequence[Any],
             body_node: Callable[[Node, list[Any]], np.ndarray]
             ) -> tuple[list[np.ndarray], list[tuple[Value, RowsArray]]]:
    """A row kernel's numpy semantics: the body on the rows of each instance that are rows
    (not the no-row index), its stores as the rows they write. An unfused row update (the
    `take_rows`, elementwise ops, `with_values` and `assign` fuse made it from) computes the
    same values: each element's ops are the same numpy functions."""
    body, lay = node.body, layout(node)
    indexed = set(node.attrs["indexed"])
    writes: list[tuple[Value, RowsArray]] = []
    for i, space in enumerate(node.attrs["spaces"]):
        r: RowsArray = arrays[i]
        keep = np.flatnonzero((r.indices >= 0) & (r.indices < r.dense_rows))
        rows = r.indices[keep]
        env: dict[Value, Any] = {}
        for j, x in enumerate(body.inputs):
            a = arrays[lay.operand_index(i, j)]
            streams = a.ndim == len(space) and a.shape[0] == space[0]
            # An operand that does not vary along the rows stays as it is (a scalar is read
            # as a scalar, as in a kernel: numpy's loops for the two may round apart).
            env[x] = a[rows] if j in indexed else a[keep] if streams else a
        for n in body.nodes:
            if n.op == "store":
                j = body.inputs.index(n.inputs[0])
                value = np.broadcast_to(env[n.inputs[1]], (len(keep),) + tuple(space[1:]))
                writes.append((node.inputs[lay.operand_index(i, j)],
                               RowsArray(rows, value, r.dense_rows)))
                continue
            env[n.outputs[0]] = body_node(n, [env[v] for v in n.inputs])
    return [], writes
