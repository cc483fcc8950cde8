"""numpy's functions called on graphopt tensors: `np.exp(t)`, `np.sum(t, axis=0)`, `a * t`.

A tensor's `__array_ufunc__` and `__array_function__` send numpy's ufuncs and common
functions to the graphopt op that computes the same thing, so a traced step records a node
(instead of failing, or baking a value in as a constant) and an eager tensor stays a
graphopt tensor. What has no graphopt op is an OpTypeError naming the op to use, or saying
there is none.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import OpTypeError
from .traces import user_location


def _ops():
    from .. import ops
    return ops


def _error(message: str) -> OpTypeError:
    return OpTypeError(message, loc=user_location())


# numpy ufunc name -> graphopt.ops name
UFUNCS = {
    "add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide",
    "true_divide": "divide", "power": "power", "float_power": None, "negative": "negative",
    "absolute": "abs", "sign": "sign", "sqrt": "sqrt", "exp": "exp", "log": "log",
    "sin": "sin", "cos": "cos", "tanh": "tanh", "maximum": "maximum", "minimum": "minimum",
    "less": "less", "less_equal": "less_equal", "greater": "greater",
    "greater_equal": "greater_equal", "equal": "equal", "not_equal": "not_equal",
    "logical_and": "logical_and", "logical_or": "logical_or", "logical_not": "logical_not",
    "isfinite": "isfinite", "matmul": "matmul",
}
# ufuncs graphopt computes as a combination of ops
_COMBINED: dict[str, Callable] = {
    "positive": lambda x: x,
    "square": lambda x: x * x,
    "reciprocal": lambda x: 1.0 / x,
    "fmax": lambda x, y: _ops().maximum(x, y),
    "fmin": lambda x, y: _ops().minimum(x, y),
}
# Suggestions for what graphopt writes another way.
_HINTS = {
    "expm1": "ops.exp(x) - 1", "log1p": "ops.log(1 + x)", "exp2": "2.0 ** x",
    "log2": "ops.log(x) / math.log(2)", "log10": "ops.log(x) / math.log(10)",
    "floor_divide": "no graphopt op (ops.divide, then a cast)", "isnan": "x != x",
    "isinf": "ops.logical_not(ops.isfinite(x)) & (x == x)",
}


def ufunc(method: str, uf: np.ufunc, inputs: tuple, kwargs: dict) -> Any:
    name = uf.__name__
    if method != "__call__":
        hint = {("add", "reduce"): "ops.sum", ("maximum", "reduce"): "ops.max"}.get(
            (name, method))
        raise _error(f"numpy.{name}.{method} on a graphopt tensor: "
                     f"{f'use graphopt.{hint}' if hint else 'graphopt has no op for it'}")
    extra = {k: v for k, v in kwargs.items() if v is not None}
    if extra:
        raise _error(f"numpy.{name} on a graphopt tensor takes no {', '.join(extra)}= "
                     f"(a graphopt op makes a new tensor; use graphopt.assign to store one)")
    op = UFUNCS.get(name)
    if op is not None:
        return getattr(_ops(), op)(*inputs)
    if name in _COMBINED:
        return _COMBINED[name](*inputs)
    hint = _HINTS.get(name)
    raise _error(f"numpy.{name} on a graphopt tensor: graphopt has no op for it"
                 f"{f'; write {hint}' if hint and not hint.startswith('no ') else ''}")


def _no(name: str, **unsupported: Any) -> None:
    given = [k for k, v in unsupported.items() if v is not None and v is not False]
    if given:
        raise _error(f"numpy.{name} on a graphopt tensor: {', '.join(given)}= is not "
                     f"supported")


def _reduction(name: str, op: str):
    def fn(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
        _no(name, dtype=dtype, out=out, initial=initial, where=where)
        return getattr(_ops(), op)(a, axis, keepdims)
    return fn


def _reshape(a, shape=None, order="C", *, newshape=None, copy=None):
    if order != "C":
        raise _error("numpy.reshape on a graphopt tensor: only order='C'")
    return _ops().reshape(a, shape if shape is not None else newshape)


def _transpose(a, axes=None):
    return _ops().transpose(a, axes)


def _where(condition, x=None, y=None):
    if x is None or y is None:
        raise _error("numpy.where(condition) (the indices) has no graphopt op: graphopt's "
                     "shapes are static; use numpy.where(condition, x, y)")
    return _ops().where(condition, x, y)


def _clip(a, a_min=None, a_max=None, out=None, **kw):
    _no("clip", out=out, **kw)
    ops = _ops()
    if a_min is not None:
        a = ops.maximum(a, a_min)
    return a if a_max is None else ops.minimum(a, a_max)


def _full_like(name: str, value: Any):
    def fn(a, dtype=None, order="K", subok=True, shape=None, device=None):
        _no(name, shape=shape)
        return _ops().full_like(a, value, dtype)
    return fn


def _like(a, fill_value, dtype=None, order="K", subok=True, shape=None, device=None):
    _no("full_like", shape=shape)
    return _ops().full_like(a, fill_value, dtype)


def _shape(a):
    return tuple(a.shape)


FUNCTIONS: dict[Any, Callable] = {
    np.sum: _reduction("sum", "sum"),
    np.mean: _reduction("mean", "mean"),
    np.max: _reduction("max", "max"),
    np.amax: _reduction("amax", "max"),
    np.reshape: _reshape,
    np.transpose: _transpose,
    np.where: _where,
    np.clip: _clip,
    np.broadcast_to: lambda array, shape, subok=False: _ops().broadcast_to(array, shape),
    np.zeros_like: _full_like("zeros_like", 0),
    np.ones_like: _full_like("ones_like", 1),
    np.full_like: _like,
    np.shape: _shape,
    np.ndim: lambda a: a.ndim,
    np.size: lambda a, axis=None: a.size if axis is None else a.shape[axis],
    np.dot: lambda a, b, out=None: (_no("dot", out=out), _ops().matmul(a, b))[1],
}
_FUNCTION_HINTS = {
    "min": "-ops.max(-x)", "amin": "-ops.max(-x)", "prod": "no graphopt op",
    "concatenate": "no graphopt op", "stack": "no graphopt op",
    "take": "ops.gather (along axis 0)", "squeeze": "ops.reshape",
    "expand_dims": "ops.reshape, or x[:, None]", "astype": "ops.cast",
    "argmax": "no graphopt op", "cumsum": "no graphopt op",
}


def function(func: Any, args: tuple, kwargs: dict) -> Any:
    impl = FUNCTIONS.get(func)
    if impl is not None:
        return impl(*args, **kwargs)
    name = getattr(func, "__name__", str(func))
    hint = _FUNCTION_HINTS.get(name)
    use = f"; use graphopt.{hint}" if hint and not hint.startswith("no ") else ""
    raise _error(f"numpy.{name} on a graphopt tensor: graphopt has no op for it{use}")
