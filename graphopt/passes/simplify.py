"""simplify: algebraic identities and strength reduction that never change a result.

Floating-point rules kept (IEEE 754, as numpy computes): a rewrite is made only when it gives
the same bits for every input, NaN, Inf and -0.0 included; rewrites that are only
algebraically true run under `fastmath=True` alone.

    always                              only with fastmath (why not always)
    x * 1, 1 * x      -> x              x * 0   -> 0       (NaN*0 and Inf*0 are NaN; -x*0 is -0)
    x + (-0.0)        -> x              x + 0.0 -> x       (-0.0 + 0.0 is +0.0)
    x - 0.0, x / 1    -> x              x ** 0.5 -> sqrt x (pow(-0, .5) = +0, sqrt(-0) = -0;
    -(-x)             -> x                                   pow(-inf, .5) = inf, sqrt = NaN)
    x / c -> x * (1/c)  when c is a power of two (1/c exact)   x / c -> x * (1/c) for any c
    x ** 2            -> x * x
    1 / sqrt(x)       -> rsqrt(x)       (rsqrt is defined as 1/sqrt: same bits)
    cast(cast(x, A), B) -> cast(x, B)   when the first cast is exact (A widens x's dtype)
    cast(x, dtype of x) -> x
    reshape(sum(x, axes), keepdims shape) -> sum(x, axes, keepdims=true)   (also max, mean;
                                        when the reshape is the reduction's only reader: what
                                        a gradient unbroadcast makes, and fuse takes as a row
                                        reduction)
Integer x * 0 -> 0 and x + 0 -> x are always exact. No rewrite replaces a value by a
parameter's `@name` (`b := a * 1` may be the copy a swap of two parameters needs), and none
makes a new reader of a parameter (it would not be ordered before the parameter's write).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import ml_dtypes
import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.opdefs import constant_value
from ..ir.registry import REDUCTION
from ..ir.types import DType, TensorType
from .fold import fill_value
from .manager import PassContext, register

# dtype -> the dtypes that hold each of its values exactly
WIDENS = {"bool": {"i32", "i64", "f16", "bf16", "f32", "f64"}, "f16": {"f32", "f64"},
          "bf16": {"f32", "f64"}, "f32": {"f64"}, "i32": {"i64", "f64"}}


def _is(x: Any, target: float) -> bool:
    """x equals target with the same sign (so -0.0 is not 0.0)."""
    return x is not None and not isinstance(x, bool) and x == target and \
        math.copysign(1.0, x) == math.copysign(1.0, target)


def _power_of_two(c: Any, dtype: DType) -> bool:
    if c is None or isinstance(c, bool) or not math.isfinite(c) or c == 0:
        return False
    mantissa, _ = math.frexp(abs(c))
    inv = np.asarray(1.0 / c, dtype=dtype.np_dtype)
    return mantissa == 0.5 and np.isfinite(inv) and float(inv) * c == 1.0 and \
        np.abs(inv) >= ml_dtypes.finfo(dtype.np_dtype).tiny  # (numpy's finfo has no bf16)


class _Rewriter:
    def __init__(self, graph: Graph, ctx: PassContext):
        self.ctx = ctx
        self.producer: dict[Value, Node] = {}
        self.new: list[Node] = []
        self.counts: dict[str, int] = {}

    def emit(self, op: str, inputs: list[Value], attrs: dict | None, like: Node) -> Value:
        n = Node(op, inputs, attrs, [like.outputs[0].type], loc=like.loc)
        self.new.append(n)
        self.producer[n.out] = n
        return n.out

    def const(self, value: Any, like: Node) -> Value:
        t: TensorType = like.outputs[0].type  # type: ignore[assignment]
        n = Node("constant", [], {"value": constant_value(value, t.dtype), "shape": (),
                                  "dtype": t.dtype}, [TensorType((), t.dtype)], loc=like.loc)
        self.new.append(n)
        return n.out

    def rewrite(self, n: Node) -> tuple[str, Value] | None:
        """(rule name, the value that replaces n's output), or None."""
        rule = RULES.get(n.op)
        if rule is None or len(n.outputs) != 1 or n.after or n.body is not None:
            return None
        return rule(_Site(self, n))


class _Site:
    """What a rule looks at: the node, its inputs, the scalar each input fills with (or
    None), and whether the result is an integer (exact) or fast-math allows more."""

    def __init__(self, rw: _Rewriter, n: Node):
        self.rw, self.n = rw, n
        self.out = n.outputs[0]
        self.ins = n.inputs
        self.fills = [fill_value(v, rw.producer) for v in n.inputs]
        self.fast = rw.ctx.fastmath
        self.exact_int = isinstance(self.out.type, TensorType) and not self.out.dtype.is_float

    def same(self, v: Value) -> bool:
        """v can stand for the output: the same type, no broadcast lost."""
        return v.type == self.out.type

    def producer(self, v: Value) -> Node | None:
        return self.rw.producer.get(v)

    def emit(self, op: str, inputs: list[Value], attrs: dict | None = None) -> Value:
        return self.rw.emit(op, inputs, attrs, self.n)


# -- the rules, one per op (a rule returns (its name, the replacement) or None) -----------------
def _multiply(m: _Site) -> tuple[str, Value] | None:
    for x, c in ((m.ins[0], m.fills[1]), (m.ins[1], m.fills[0])):
        if c is not None and c == 1 and m.same(x):
            return "x*1", x
        if c is not None and c == 0 and (m.exact_int or m.fast):
            out = m.out
            return "x*0", m.emit("constant", [], {"value": constant_value(0, out.dtype),
                                                  "shape": out.type.shape, "dtype": out.dtype})
    return None


def _add(m: _Site) -> tuple[str, Value] | None:
    for x, c in ((m.ins[0], m.fills[1]), (m.ins[1], m.fills[0])):
        if c is not None and m.same(x) and (_is(c, -0.0) or (c == 0 and (m.exact_int or m.fast))):
            return "x+0", x
    return None


def _subtract(m: _Site) -> tuple[str, Value] | None:
    c = m.fills[1]
    if m.same(m.ins[0]) and c is not None and (_is(c, 0.0) or (c == 0 and m.exact_int)):
        return "x-0", m.ins[0]
    return None


def _divide(m: _Site) -> tuple[str, Value] | None:
    c = m.fills[1]
    if c is not None and c == 1 and m.same(m.ins[0]):
        return "x/1", m.ins[0]
    exact = c is not None and _power_of_two(c, m.out.dtype)
    if c is not None and (exact or (m.fast and c != 0 and math.isfinite(c))):
        return "x/c", m.emit("multiply", [m.ins[0], m.rw.const(1.0 / c, m.n)])
    p = m.producer(m.ins[1])
    if m.fills[0] is not None and m.fills[0] == 1 and p is not None and p.op == "sqrt" \
            and m.same(m.ins[1]):
        return "1/sqrt", m.emit("rsqrt", [p.inputs[0]])
    return None


def _negative(m: _Site) -> tuple[str, Value] | None:
    p = m.producer(m.ins[0])
    if p is not None and p.op == "negative" and m.same(p.inputs[0]):
        return "--x", p.inputs[0]
    return None


def _power(m: _Site) -> tuple[str, Value] | None:
    c = m.fills[1]
    if not m.same(m.ins[0]) or c is None:
        return None
    if c == 2:
        return "x**2", m.emit("multiply", [m.ins[0], m.ins[0]])
    if c == 0.5 and m.fast:
        return "x**0.5", m.emit("sqrt", [m.ins[0]])
    return None


def _cast(m: _Site) -> tuple[str, Value] | None:
    x = m.ins[0]
    if x.dtype == m.out.dtype:
        return "cast-noop", x
    p = m.producer(x)
    if p is not None and p.op == "cast" and x.dtype.name in WIDENS.get(p.inputs[0].dtype.name, ()):
        return "cast-cast", m.emit("cast", [p.inputs[0]], {"dtype": m.out.dtype})
    return None


def _reshape(m: _Site) -> tuple[str, Value] | None:
    p = m.producer(m.ins[0])
    if p is None or p.opdef.category != REDUCTION or p.attrs["keepdims"] or \
            list(p.out.users or {}) != [m.n] or p.after:
        return None
    axes = set(p.attrs["axes"])
    kept = tuple(1 if a in axes else s for a, s in enumerate(p.inputs[0].shape))
    if kept != m.out.shape:
        return None
    return "reshape-keepdims", m.emit(p.op, list(p.inputs), {**p.attrs, "keepdims": True})


RULES: dict[str, Callable[[_Site], tuple[str, Value] | None]] = {
    "multiply": _multiply, "add": _add, "subtract": _subtract, "divide": _divide,
    "negative": _negative, "power": _power, "cast": _cast, "reshape": _reshape}


@register("simplify")
def simplify(graph: Graph, ctx: PassContext) -> dict:
    rw = _Rewriter(graph, ctx)
    nodes: list[Node] = []
    for n in graph.nodes:
        rw.new = []
        hit = rw.rewrite(n)
        if hit is not None and (hit[1].kind == "param" or any(
                v.kind == "param" and v not in n.inputs for m in rw.new for v in m.inputs)):
            # Never replace a value by @p itself (its readers would become readers of @p that
            # nothing orders before @p's write; and `b := a * 1` may be the copy a swap of two
            # parameters needs), nor make a new reader of @p.
            for m in rw.new:
                m.detach()
            hit = None
        if hit is None:
            nodes.append(n)
            rw.producer.update((v, n) for v in n.outputs)
            continue
        rule, value = hit
        rw.counts[rule] = rw.counts.get(rule, 0) + 1
        nodes += rw.new  # new nodes keep the order valid: their inputs precede n
        n.outputs[0].replace_all_uses_with(value)
        n.detach()
    graph.nodes = nodes
    return dict(sorted(rw.counts.items()))
