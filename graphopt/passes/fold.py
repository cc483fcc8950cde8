"""fold: evaluate nodes whose inputs are all constants, at compile time.

The value comes from the op's numpy semantics (the interpreter's), in the node's dtype, so
folding never changes a result. A result whose elements are all equal becomes a scalar fill
(`constant {value=0.5} : f32[1000]`), computed on one element when every input is a fill; a
result with distinct elements is folded only while small (FOLD_MAX_ELEMENTS), so the IR stays
readable and compile time stays short.

    %0 = constant {value=0.9} : f32[]
    %1 = constant {value=1.0} : f32[]
    %2 = subtract %1, %0 : f32[]        ->   %2 = constant {value=0.1} : f32[]

Collectives are never evaluated: their value depends on the other ranks (an all_reduce of a
constant is the constant times the ranks) or on this one's rank (shard).

A node whose evaluation fails (an integer to a negative power, the max of an empty constant,
a label out of range) is not folded: it stays, and fails when the step runs, as it would
unfolded.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.opdefs import constant_value
from ..ir.registry import (COLLECTIVE, CONSTANT, CONTROL, EFFECT, ELEMENTWISE, KERNEL,
                           evaluate)
from ..ir.types import TensorType
from .manager import PassContext, register

FOLD_MAX_ELEMENTS = 64


def fill_value(v: Value, producer: dict[Value, Node]) -> int | float | bool | None:
    """The scalar a value is filled with, if it is a constant fill; else None."""
    n = producer.get(v)
    if n is None or n.opdef.category != CONSTANT or isinstance(n.attrs["value"], np.ndarray):
        return None
    return n.attrs["value"]


@register("fold")
def fold(graph: Graph, ctx: PassContext) -> dict:
    producer: dict[Value, Node] = {}
    folded = 0
    for i, n in enumerate(graph.nodes):
        producer.update((v, n) for v in n.outputs)
        op = n.opdef
        if op.category in (CONSTANT, EFFECT, CONTROL, KERNEL, COLLECTIVE) or n.after or \
                not all(v in producer and producer[v].opdef.category == CONSTANT for v in n.inputs):
            continue
        out: TensorType = n.outputs[0].type  # type: ignore[assignment]
        result = _evaluate(n, producer, out)
        if result is None:
            continue
        c = Node("constant", [], {"value": constant_value(_fill_or_array(result), out.dtype),
                                  "shape": out.shape, "dtype": out.dtype}, [out], loc=n.loc)
        graph.nodes[i] = c
        n.outputs[0].replace_all_uses_with(c.out)
        n.detach()
        producer[c.out] = c
        folded += 1
    return {"folded": folded}


def _evaluate(n: Node, producer: dict[Value, Node], out: TensorType) -> np.ndarray | None:
    """The node's value from its constant inputs, or None: too large to fold, or its numpy
    semantics fail. Fold leaves a failing node to run rather than raise: the error is the
    program's (an `int ** -1`, the max of nothing), so it belongs where the interpreter gives
    it, as an ExecutionError at run time with the node's location, and not at compile time,
    where a node that dce would remove, or that a backend computes, would fail the compile."""
    op = n.opdef
    fills = [fill_value(v, producer) for v in n.inputs]
    try:
        with np.errstate(all="ignore"):
            if op.category == ELEMENTWISE and all(f is not None for f in fills):
                scalars = [np.asarray(f, dtype=v.type.dtype.np_dtype)
                           for f, v in zip(fills, n.inputs)]
                return evaluate(op, scalars, n.attrs, [TensorType((), out.dtype)])[0]
            if out.size <= FOLD_MAX_ELEMENTS and all(v.type.size <= 1 << 16 for v in n.inputs):
                arrays = [evaluate(producer[v].opdef, [], producer[v].attrs, [v.type])[0]
                          for v in n.inputs]
                return evaluate(op, arrays, n.attrs, [out])[0]
    except Exception:  # what the interpreter turns into an ExecutionError (interpreter.py)
        return None
    return None


def _fill_or_array(result: np.ndarray):
    """The scalar when every element has the same bits (NaN and -0.0 included), else the array."""
    flat = np.ascontiguousarray(result).reshape(-1)  # (a broadcast result has stride 0)
    if flat.size == 0:
        return result
    rows = flat.view(np.uint8).reshape(flat.size, -1)
    return flat[0] if (rows == rows[:1]).all() else result
