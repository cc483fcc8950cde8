"""Parameter: persistent state (weights, optimizer moments, step counters, loss scales).

A Parameter keeps its value between steps and is changed only by `assign`. In an expression
it reads its value: `@name` inside a trace, its current array in eager mode. Its name is how
IR dumps, checkpoints and caches refer to it, so names in one graph must be distinct.
"""
from __future__ import annotations

import itertools
import re
import weakref
from typing import Any

import numpy as np

from .. import memory
from ..errors import AliasingError, ParameterError
from ..ir.types import DType, TensorType, to_dtype
from . import checks
from .tensor import Tensor

_counter = itertools.count()
_NAME = re.compile(r"[A-Za-z_][\w.]*\Z")
# The Parameters whose buffer is an array the caller made (copy=False), by id of the array:
# a second Parameter over the same array is refused.
_TAKEN: weakref.WeakValueDictionary[int, Parameter] = weakref.WeakValueDictionary()


class Parameter(Tensor):
    """Persistent state of a step: a named array that keeps its value between calls.

    A step reads a Parameter like any tensor (the graph reads it as `@name`) and changes it
    only with `assign`; a compiled step updates its buffer in place. The name is how IR
    dumps, checkpoints and caches refer to it, so the Parameters of one graph need distinct
    names.
    """

    __slots__ = ("name", "_value", "_type", "_exposed", "__weakref__")

    def __init__(self, value: Any, name: str | None = None, dtype: Any = None,
                 copy: bool = True, offset: int | None = None):
        """Make a Parameter holding a copy of `value` (or, with copy=False, `value` itself).

        The value is copied into a buffer of the Parameter's own, placed by graphopt.memory
        (64-byte aligned).

        Args:
            value: an array, or anything numpy makes one of.
            name: letters, digits, `_` and `.`, starting with a letter or `_`; by default
                `param<n>`.
            dtype: the dtype to store (default: the value's); an int or bool dtype refuses
                a value it does not hold exactly (NaN, inf, a fraction, out of range).
            copy: False takes `value` itself as the buffer when it is a numpy array nobody
                else views (C-contiguous, owning its memory, writeable, of the dtype), as a
                freshly made one is; anything else is copied as usual.
            offset: where a large buffer starts in its page, a multiple of
                graphopt.memory.ALIGN; default the next free slot.

        Raises:
            ParameterError: a bad name, dtype, value or offset.
            AliasingError: with copy=False, the array is already another Parameter's buffer.
        """
        error = _error(name)
        a = np.asarray(value)
        try:
            dt = to_dtype(dtype if dtype is not None else a.dtype)
        except TypeError as e:
            raise error(str(e)) from None
        copy = checks.flag(copy, "copy", error)
        offset = _offset(offset, error)
        if dt.kind != "float" and a.dtype != dt.np_dtype and a.size:
            with np.errstate(invalid="ignore"):
                bad = a[a.astype(dt.np_dtype) != a]  # NaN, inf, a fraction, out of range
            if bad.size:
                checks.fill(bad.ravel()[0].item(), dt, "value", error)
        exposed = not copy and a.base is None and a.flags.c_contiguous and \
            a.flags.writeable and a.dtype == dt.np_dtype
        if exposed:
            other = _TAKEN.get(id(a))
            if other is not None and other._value is a:
                raise AliasingError(
                    f"Parameter{f' {name!r}' if name else ''}: the array given with "
                    f"copy=False is already the buffer of Parameter '{other.name}'; two "
                    f"Parameters over one buffer would overwrite each other's updates (pass "
                    f"copy=True, the default)")
            arr = a
        else:
            arr = memory.empty(a.shape, dt.np_dtype, offset)
            np.copyto(arr, a, casting="unsafe")
        self._adopt(arr, dt, name, exposed)
        if exposed:
            _TAKEN[id(a)] = self

    @classmethod
    def full(cls, shape: Any, fill: Any, dtype: Any, name: str | None = None,
             offset: int | None = None) -> Parameter:
        """A new Parameter of `shape` filled with `fill`, in a buffer placed by
        graphopt.memory, without making the array first (optimizer state is made so, with
        `offset=memory.offset_after(param, k)`).

        Raises:
            ParameterError: a bad shape, dtype, fill value, name or offset, or a size that
                cannot be allocated.
        """
        error = _error(name)
        dims = checks.shape(shape, "shape", error)
        dt = checks.dtype(dtype, "dtype", error)
        size = checks.nbytes(dims, dt, "shape", error)
        fill = checks.fill(fill, dt, "fill", error)
        offset = _offset(offset, error)
        p = cls.__new__(cls)
        try:
            arr = memory.full(dims, fill, dt.np_dtype, offset)
        except MemoryError:
            raise error(f"shape {list(dims)} of {dt} needs {size:,} bytes, which cannot be "
                        f"allocated") from None
        p._adopt(arr, dt, name)
        return p

    def _adopt(self, arr: np.ndarray, dt: DType, name: str | None,
               exposed: bool = False) -> None:
        if name is None:
            name = f"param{next(_counter)}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise ParameterError(f"Parameter name {name!r} must start with a letter or '_' and "
                                 f"hold only letters, digits, '_' and '.'")
        self.name = name
        self._value = arr  # owned, C-contiguous; updated in place by steps, never replaced
        self._type = TensorType(arr.shape, dt)
        # `arr` is the caller's own array (copy=False): a step that updates this Parameter
        # refuses an argument that shares its memory (compile/executable.py).
        self._exposed = exposed

    @property
    def type(self) -> TensorType:  # type: ignore[override]
        """Its shape and dtype, fixed when it is made."""
        return self._type

    def numpy(self) -> np.ndarray:
        """A copy of the current value."""
        return self._value.copy()

    def __array__(self, dtype=None, copy=None):
        return self._value.copy() if dtype is None else self._value.astype(dtype)

    # numpy's ufuncs are graphopt's ops on a Parameter too (Tensor), as its operators are.
    # Its other functions: outside a trace, numpy's on its current value (np.allclose(p, x));
    # inside one, graphopt's ops on @name (frontend/numpy_api.py).
    def __array_function__(self, func, types, args, kwargs):
        from .traces import current_trace
        if current_trace() is not None:
            return super().__array_function__(func, types, args, kwargs)
        return func(*_values(args), **dict(zip(kwargs, _values(kwargs.values()))))

    def __repr__(self) -> str:
        return f"Parameter({self.name}: {self.type})"


def _values(xs: Any) -> list:
    """numpy's arguments with each Parameter replaced by a copy of its value."""
    return [x.numpy() if isinstance(x, Parameter) else
            type(x)(_values(x)) if type(x) in (list, tuple) else x for x in xs]


def _error(name: Any):
    """A ParameterError naming the Parameter being made."""
    return lambda message: ParameterError(
        f"Parameter{f' {name!r}' if isinstance(name, str) else ''}: {message}")


def _offset(offset: Any, error) -> int | None:
    """None, or an int multiple of memory.ALIGN (a position in the page)."""
    if offset is None:
        return None
    offset = checks.integer(offset, "offset", error)
    if offset % memory.ALIGN:
        raise error(f"offset {offset} must be a multiple of {memory.ALIGN} (a position in "
                    f"the page, as memory.offset_after gives)")
    return offset
