"""Checks of the arguments of the frontend's public functions and of graphopt.ops.

Each check returns the argument in its canonical form (a tuple of ints, an int, a bool, a
DType) or raises `error(message)` (an OpTypeError with the user's line for ops, a
ParameterError for Parameters, ...), the message naming the argument, what it got and what
it takes.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..ir.types import DType, to_dtype

_MAX_BYTES = 1 << 62  # a total size past this is never a real tensor (and overflows int64)


def integer(x: Any, what: str, error: Callable, low: int | None = None) -> int:
    """x as an int (a Python or numpy integer, never a bool or a float), at least `low`."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise error(f"{what} must be an int, got {x!r}")
    if low is not None and x < low:
        raise error(f"{what} must be at least {low}, got {x}")
    return int(x)


def flag(x: Any, what: str, error: Callable) -> bool:
    if not isinstance(x, (bool, np.bool_)):
        raise error(f"{what} must be True or False, got {x!r}")
    return bool(x)


def shape(x: Any, what: str, error: Callable, wildcard: bool = False) -> tuple[int, ...]:
    """An int or a sequence of ints, each non-negative (or -1 where `wildcard` allows it)."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        x = (x,)
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise error(f"{what} must be an int or a sequence of ints, got {x!r}")
    dims = tuple(integer(d, f"{what}: each dimension", error) for d in x)
    low = -1 if wildcard else 0
    for d in dims:
        if d < low:
            raise error(f"{what} {list(dims)}: a dimension must be non-negative"
                        f"{' (or one -1)' if wildcard else ''}, got {d}")
    return dims


def nbytes(dims: tuple[int, ...], d: DType, what: str, error: Callable) -> int:
    n = math.prod(dims) * np.dtype(d.np_dtype).itemsize
    if n > _MAX_BYTES:
        raise error(f"{what} {list(dims)} of {d} would take {n:.3g} bytes, more than any "
                    f"machine has")
    return n


def dtype(x: Any, what: str, error: Callable) -> DType:
    try:
        return to_dtype(x)
    except TypeError as e:
        raise error(f"{what}: {e}") from None


def fill(value: Any, d: DType, what: str, error: Callable) -> Any:
    """A scalar that is a value of dtype d: any real number for a float dtype, an integer
    in range for an int dtype (not NaN, inf or a fraction), 0/1/True/False for bool."""
    if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0:
        value = value.item()
    if not isinstance(value, (bool, int, float)):
        raise error(f"{what} must be a number, got {value!r}")
    if d.kind == "float" or (d.kind == "bool" and value in (0, 1)):
        return value
    if d.kind == "bool":
        raise error(f"{what} {value!r} is not a bool (True, False, 0 or 1)")
    if isinstance(value, float) and not value.is_integer():
        raise error(f"{what} {value!r} is not an integer, so not a value of {d}")
    info = np.iinfo(d.np_dtype)
    if not info.min <= int(value) <= info.max:
        raise error(f"{what} {value!r} is out of the range of {d} [{info.min}, {info.max}]")
    return value


def axes(x: Any, ndim: int, what: str, error: Callable) -> tuple[int, ...]:
    """None (every axis), an int or a sequence of ints in [-ndim, ndim), as sorted axes."""
    if x is None:
        return tuple(range(ndim))
    items = (x,) if not hasattr(x, "__iter__") or isinstance(x, (str, bytes)) else tuple(x)
    out = []
    for a in items:
        a = integer(a, what, error)
        if not -ndim <= a < ndim:
            raise error(f"{what} {a} is out of range for a tensor of {ndim} dimension(s)")
        out.append(a + ndim if a < 0 else a)
    if len(set(out)) != len(out):
        raise error(f"{what} {list(items)} repeats an axis")
    return tuple(sorted(out))


def choice(x: Any, choices: tuple[str, ...], what: str, error: Callable) -> str:
    """x as one of a few words (a reduction's name)."""
    if not isinstance(x, str) or x not in choices:
        raise error(f"{what} must be one of {', '.join(map(repr, choices))}, got {x!r}")
    return x


def callable_(fn: Any, what: str, error: Callable) -> Any:
    if not callable(fn):
        raise error(f"{what} must be a function, got {type(fn).__name__} {fn!r}")
    return fn


def permutation(x: Any, ndim: int, what: str, error: Callable) -> tuple[int, ...]:
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise error(f"{what} must be a sequence of ints, got {x!r}")
    perm = tuple(integer(a, what, error) for a in x)
    return tuple(a + ndim if a < 0 else a for a in perm)

