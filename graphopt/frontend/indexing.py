"""numpy's basic indexing (x[0], x[1:3], x[:, None], x[..., -1], x[::-1]) as a `slice` op.

A key is resolved against the tensor's shape, as numpy resolves it: integers pick one
element of an axis and drop it, slices keep a range of it, None adds an axis of size 1,
Ellipsis stands for the axes not named. The result is the slice's attributes: per axis of
the input the elements range(start, stop, step), and the result's shape. Advanced indexing
(arrays, lists, bools, tensors as indices) is an error naming the op that does it.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np


class BasicIndex(NamedTuple):
    starts: tuple[int, ...]
    stops: tuple[int, ...]
    steps: tuple[int, ...]
    shape: tuple[int, ...]  # the result's

    def selects_all(self, shape: tuple[int, ...]) -> bool:
        """Whether every element is kept in order (only axes of size 1 may change)."""
        return all(range(a, b, c) == range(n)
                   for n, a, b, c in zip(shape, self.starts, self.stops, self.steps))


def _show(k: Any) -> str:
    """An index entry as it was written: 1:3:-1, ..., None, 0."""
    if isinstance(k, slice):
        parts = ["" if p is None else repr(p) for p in (k.start, k.stop, k.step)]
        return ":".join(parts[:2] if k.step is None else parts)
    return "..." if k is Ellipsis else repr(k)


def _is_int(k: Any) -> bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))


def _advanced(k: Any) -> str:
    """What to use instead of an index numpy would treat as advanced indexing."""
    from .tensor import Tensor
    if isinstance(k, (bool, np.bool_)) or str(getattr(k, "dtype", "")) == "bool":
        return "select with graphopt.ops.where(mask, x, 0) instead of a boolean mask"
    if isinstance(k, (Tensor, np.ndarray, list)):
        return "gather rows with graphopt.ops.gather(x, indices) (axis 0)"
    return "index with ints, slices, None and ..."


def _bound(x: Any, axis: int, what: str, where: str, error: Callable) -> int | None:
    """A slice's start, stop or step as an int (None stays None), clear about what it is not."""
    if x is None or _is_int(x):
        return None if x is None else int(x)
    raise error(f"{where}: axis {axis}: a slice's {what} must be an int or None, got {x!r}")


def resolve(shape: tuple[int, ...], key: Any, error: Callable, what: str) -> BasicIndex:
    """The slice that x[key] is, for a tensor x of `shape`; `what` names x in errors."""
    items = key if isinstance(key, tuple) else (key,)
    where = f"indexing {what} with [{', '.join(map(_show, items))}]"
    for k in items:
        if not (k is None or k is Ellipsis or isinstance(k, slice) or _is_int(k)):
            raise error(f"{where}: only basic indexing is supported; {_advanced(k)}")
    if sum(k is Ellipsis for k in items) > 1:
        raise error(f"{where}: an index can only have a single ellipsis ('...')")
    named = sum(k is not None and k is not Ellipsis for k in items)
    if named > len(shape):
        raise error(f"{where}: too many indices: {named} for a tensor of "
                    f"{len(shape)} axes")
    if Ellipsis in items:
        at = next(i for i, k in enumerate(items) if k is Ellipsis)
        items = items[:at] + (slice(None),) * (len(shape) - named) + items[at + 1:]
    else:
        items = items + (slice(None),) * (len(shape) - named)
    starts, stops, steps, out = [], [], [], []
    axis = 0
    for k in items:
        if k is None:
            out.append(1)
            continue
        n = shape[axis]
        if isinstance(k, slice):
            step = _bound(k.step, axis, "step", where, error)
            if step == 0:
                raise error(f"{where}: axis {axis}: a slice's step cannot be zero")
            start, stop, step = slice(_bound(k.start, axis, "start", where, error),
                                      _bound(k.stop, axis, "stop", where, error),
                                      step).indices(n)
            count = len(range(start, stop, step))
            # An empty range of a negative step may stop past the start: keep it in bounds.
            starts.append(start if count else 0)
            stops.append(stop if count else 0)
            steps.append(step if count else 1)
            out.append(count)
        else:
            i = int(k)
            if not -n <= i < n:
                raise error(f"{where}: index {i} is out of bounds for axis {axis} "
                            f"with {n} elements")
            i += n if i < 0 else 0
            starts.append(i)
            stops.append(i + 1)
            steps.append(1)
        axis += 1
    return BasicIndex(tuple(starts), tuple(stops), tuple(steps), tuple(out))
