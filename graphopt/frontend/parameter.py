"""Parameter: persistent state (weights, optimizer moments, step counters, loss scales).

A Parameter keeps its value between steps and is changed only by `assign`. In an expression
it reads its value: `@name` inside a trace, its current array in eager mode. Its name is how
IR dumps, checkpoints and caches refer to it, so names in one graph must be distinct.
"""
from __future__ import annotations

import itertools
import re
from typing import Any

import numpy as np

from .. import memory
from ..errors import ParameterError
from ..ir.types import DType, TensorType, to_dtype
from .tensor import Tensor

_counter = itertools.count()
_NAME = re.compile(r"[A-Za-z_][\w.]*\Z")


class Parameter(Tensor):
    __slots__ = ("name", "_value", "_type", "__weakref__")

    def __init__(self, value: Any, name: str | None = None, dtype: Any = None,
                 copy: bool = True, offset: int | None = None):
        """The value is copied into a buffer of the Parameter's own, placed by
        graphopt.memory (64-byte aligned; a large one at `offset` in its page, default the
        next free slot). `copy=False` takes `value` as the buffer instead when it is a numpy
        array nobody else views (C-contiguous, owning its memory, of the dtype), as a
        freshly made one is; anything else is copied as usual."""
        a = np.asarray(value)
        try:
            dt = to_dtype(dtype if dtype is not None else a.dtype)
        except TypeError as e:
            raise ParameterError(f"Parameter {name or ''}: {e}") from None
        if not copy and a.base is None and a.flags.c_contiguous and a.flags.writeable and \
                a.dtype == dt.np_dtype:
            arr = a
        else:
            arr = memory.empty(a.shape, dt.np_dtype, offset)
            np.copyto(arr, a, casting="unsafe")
        self._adopt(arr, dt, name)

    @classmethod
    def full(cls, shape: Any, fill: Any, dtype: Any, name: str | None = None,
             offset: int | None = None) -> Parameter:
        """A new Parameter of `shape` filled with `fill`, in a buffer placed by
        graphopt.memory (optimizer state: `offset=memory.offset_after(param, k)`)."""
        dt = to_dtype(dtype)
        p = cls.__new__(cls)
        p._adopt(memory.full(shape, fill, dt.np_dtype, offset), dt, name)
        return p

    def _adopt(self, arr: np.ndarray, dt: DType, name: str | None) -> None:
        if name is None:
            name = f"param{next(_counter)}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise ParameterError(f"Parameter name {name!r} must start with a letter or '_' and "
                                 f"hold only letters, digits, '_' and '.'")
        self.name = name
        self._value = arr  # owned, C-contiguous; updated in place by steps, never replaced
        self._type = TensorType(arr.shape, dt)

    @property
    def type(self) -> TensorType:  # type: ignore[override]
        return self._type

    def numpy(self) -> np.ndarray:
        """A copy of the current value."""
        return self._value.copy()

    def __array__(self, dtype=None, copy=None):
        return self._value.copy() if dtype is None else self._value.astype(dtype)

    def __repr__(self) -> str:
        return f"Parameter({self.name}: {self.type})"
