"""Arguments that share memory with a Parameter a step updates in place.

A Parameter made with `copy=False` over an array is that array (frontend/parameter.py). A
step that updates it in place and also takes an argument that views the array would read the
argument after overwriting it, so every entry point that runs a step on the caller's arrays
refuses such an argument with an AliasingError before anything runs: a jitted step (and its
repeated-call fast path), a compiled Executable called directly, `value_and_grad` called
eagerly, and an optimizer's step in eager mode. Other Parameters' buffers are graphopt's
alone, so the usual step has nothing to check.
"""
from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numpy.lib.array_utils import byte_bounds

from .. import memory
from ..errors import AliasingError
from ..frontend.parameter import Parameter
from ..frontend.tensor import EagerTensor

_BASE = operator.attrgetter("base")


def exposed(updated: Iterable[Parameter]) -> dict[int, Parameter]:
    """Of the Parameters a step updates, those whose buffer is the caller's own array (made
    with copy=False), by id of the array: what an argument must not alias."""
    return {id(p._value): p for p in updated if p._exposed}


def check_arguments(exposed: dict[int, Parameter], leaves: Sequence[Any],
                    paths: Sequence[str], what: str = "argument '{}'") -> None:
    """An AliasingError naming the first leaf (`what` with its path) that views one of the
    `exposed` buffers; leaves that are not arrays (scalars, Parameters) view none. A buffer
    owns its memory, and numpy makes a view's `base` the array that owns the memory, so a few
    C loops over ids decide the common case; a view of other memory (a memoryview, a buffer
    of numpy's that does not own its data) is compared by its address range."""
    arrays = leaves
    if set(map(type, leaves)) != {np.ndarray}:
        arrays = [x.array if isinstance(x, EagerTensor) else x for x in leaves]
        arrays = [a for a in arrays if isinstance(a, np.ndarray)]
    bases = list(map(_BASE, arrays))
    others = {id(b): b for b in bases if b is not None} \
        if any(map(operator.is_not, bases, itertools.repeat(None))) else {}
    if not any(any(map(operator.is_, arrays, itertools.repeat(buf)))
               or any(map(operator.is_, bases, itertools.repeat(buf)))
               for buf in (p._value for p in exposed.values())) \
            and all(type(b) is np.ndarray and b.flags.owndata for b in others.values()):
        return
    ranges = [(memory.address(p._value), p._value.nbytes, p) for p in exposed.values()]
    for a, path in zip(arrays, (p for x, p in zip(leaves, paths)
                                if isinstance(getattr(x, "array", x), np.ndarray))):
        if a.size == 0:
            continue
        low, high = byte_bounds(a)
        for start, size, p in ranges:
            if low < start + size and start < high:
                raise AliasingError(
                    f"{what.format(path)} shares memory with Parameter '{p.name}', which "
                    f"this step updates in place (the Parameter was made with copy=False over "
                    f"this array): the step would read it after overwriting it. Pass a copy "
                    f"(np.array(...)), or make the Parameter with copy=True")
