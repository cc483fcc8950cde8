"""The LLVM lowering table: how each elementwise op computes one element.

`LOWERING[op](e, *operands, **attrs)` builds the result from the primitives of an Emitter
(emitter.py: e.add, e.sqrt, e.select, ...). Every elementwise op of the registry has an entry
(test_every_elementwise_op_has_a_lowering); other ops run through numpy, and a kernel holding
an op with no entry would too.
"""
from __future__ import annotations

from typing import Any, Callable

from ...ir.opdefs import gelu_inner
from ...ir.types import to_dtype

Lowering = Callable[..., Any]


def _softplus(e: Any, x: Any) -> Any:
    """max(x, 0) + log1p(exp(-|x|)): log(1 + exp(x)) without overflow."""
    return e.add(e.maximum(x, e.like(x, 0)), e.log1p(e.exp(e.neg(e.abs(x)))))


def _sigmoid(e: Any, x: Any) -> Any:
    """1 / (1 + t) for x >= 0, t / (1 + t) below, t = exp(-|x|): one exp, no overflow."""
    t = e.exp(e.neg(e.abs(x)))
    top = e.select(e.compare(">=", x, e.like(x, 0)), e.like(x, 1), t)
    return e.div(top, e.add(e.like(x, 1), t))


def _gelu(e: Any, x: Any) -> Any:
    inner = gelu_inner(x, e.add, e.mul, e.like)  # as the VJP's, so LLVM merges the two tanh
    return e.mul(e.mul(e.like(x, 0.5), x), e.add(e.like(x, 1), e.tanh(inner)))


def _compare(predicate: str) -> Lowering:
    return lambda e, x, y: e.compare(predicate, x, y)


LOWERING: dict[str, Lowering] = {
    "add": lambda e, x, y: e.add(x, y),
    "subtract": lambda e, x, y: e.sub(x, y),
    "multiply": lambda e, x, y: e.mul(x, y),
    "divide": lambda e, x, y: e.div(x, y),
    "power": lambda e, x, y: e.pow(x, y),
    "maximum": lambda e, x, y: e.maximum(x, y),
    "minimum": lambda e, x, y: e.minimum(x, y),
    "negative": lambda e, x: e.neg(x),
    "abs": lambda e, x: e.abs(x),
    "sign": lambda e, x: e.sign(x),
    "sqrt": lambda e, x: e.sqrt(x),
    "rsqrt": lambda e, x: e.div(e.like(x, 1), e.sqrt(x)),
    "exp": lambda e, x: e.exp(x),
    "log": lambda e, x: e.log(x),
    "sin": lambda e, x: e.sin(x),
    "cos": lambda e, x: e.cos(x),
    "isfinite": lambda e, x: e.isfinite(x),
    "less": _compare("<"),
    "less_equal": _compare("<="),
    "greater": _compare(">"),
    "greater_equal": _compare(">="),
    "equal": _compare("=="),
    "not_equal": _compare("!="),
    "logical_and": lambda e, x, y: e.and_(x, y),
    "logical_or": lambda e, x, y: e.or_(x, y),
    "logical_not": lambda e, x: e.not_(x),
    "where": lambda e, c, x, y: e.select(c, x, y),
    "cast": lambda e, x, dtype: e.cast(x, e.in_dtypes[0], to_dtype(dtype)),
    "relu": lambda e, x: e.maximum(x, e.like(x, 0)),
    "tanh": lambda e, x: e.tanh(x),
    "sigmoid": _sigmoid,
    "softplus": _softplus,
    "gelu": _gelu,
    "stop_gradient": lambda e, x: x,
}
