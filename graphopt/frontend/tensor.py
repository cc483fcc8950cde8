"""Tensors as the user's step function sees them.

`Tensor` gives the Python operators and methods; every one of them is a call into
`graphopt.ops`, so a traced and an eager tensor take the same path through the op registry.
`TracedTensor` stands for an IR value during tracing; `EagerTensor` holds a numpy array
(eager mode, the same function run op by op).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TracerBoolError
from ..ir.types import DType, TensorType, to_dtype

if TYPE_CHECKING:
    from ..ir.graph import Value
    from .traces import Trace


class Typed:
    """What a step sees of a value's IR type: a tensor's, or a row gradient's (whose shape is
    its dense tensor's)."""

    __slots__ = ()
    type: TensorType

    @property
    def shape(self) -> tuple[int, ...]:
        """The static shape; `()` for a scalar."""
        return self.type.shape

    @property
    def dtype(self) -> DType:
        """The graphopt dtype (f32, i64, bool, ...)."""
        return self.type.dtype


class Tensor(Typed):
    """Operators and methods shared by TracedTensor, EagerTensor and Parameter."""

    __slots__ = ()
    __hash__ = object.__hash__  # == builds a tensor, so identity is the hash

    # numpy's ufuncs and common functions run graphopt's op (frontend/numpy_api.py):
    # np.exp(t) is ops.exp(t), ndarray * t is ops.multiply(ndarray, t).
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from . import numpy_api
        return numpy_api.ufunc(method, ufunc, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from . import numpy_api
        return numpy_api.function(func, args, kwargs)

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.type.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return self.type.size

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a scalar tensor")
        return self.shape[0]

    def __add__(self, o): return ops.add(self, o)
    def __radd__(self, o): return ops.add(o, self)
    def __sub__(self, o): return ops.subtract(self, o)
    def __rsub__(self, o): return ops.subtract(o, self)
    def __mul__(self, o): return ops.multiply(self, o)
    def __rmul__(self, o): return ops.multiply(o, self)
    def __truediv__(self, o): return ops.divide(self, o)
    def __rtruediv__(self, o): return ops.divide(o, self)
    def __pow__(self, o): return ops.power(self, o)
    def __rpow__(self, o): return ops.power(o, self)
    def __matmul__(self, o): return ops.matmul(self, o)
    def __rmatmul__(self, o): return ops.matmul(o, self)
    def __neg__(self): return ops.negative(self)
    def __pos__(self): return self
    def __abs__(self): return ops.abs(self)
    def __lt__(self, o): return ops.less(self, o)
    def __le__(self, o): return ops.less_equal(self, o)
    def __gt__(self, o): return ops.greater(self, o)
    def __ge__(self, o): return ops.greater_equal(self, o)
    def __eq__(self, o): return ops.equal(self, o)  # type: ignore[override]
    def __ne__(self, o): return ops.not_equal(self, o)  # type: ignore[override]
    def __and__(self, o): return ops.logical_and(self, o)
    def __rand__(self, o): return ops.logical_and(o, self)
    def __or__(self, o): return ops.logical_or(self, o)
    def __ror__(self, o): return ops.logical_or(o, self)
    def __invert__(self): return ops.logical_not(self)

    def __getitem__(self, key): return ops.index(self, key)

    def __setitem__(self, key, value):
        from ..errors import OpTypeError
        from .traces import user_location
        raise OpTypeError("a graphopt tensor is a value and cannot change: use "
                          "graphopt.ops.index_update(x, key, value) for a new tensor with "
                          "x[key] = value, and assign(p, ...) to change a Parameter",
                          loc=user_location())

    def sum(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """`graphopt.ops.sum(self, axis, keepdims)`."""
        return ops.sum(self, axis, keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """`graphopt.ops.mean(self, axis, keepdims)`."""
        return ops.mean(self, axis, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """`graphopt.ops.max(self, axis, keepdims)`."""
        return ops.max(self, axis, keepdims)

    def astype(self, dtype: Any) -> Tensor:
        """`graphopt.ops.cast(self, dtype)`."""
        return ops.cast(self, dtype)

    # x.reshape(2, 3) and x.reshape((2, 3)) alike; a numpy integer counts as one int.
    def reshape(self, *shape: Any) -> Tensor:
        """`graphopt.ops.reshape`, with the shape as one sequence or as separate ints
        (`x.reshape(2, 3)` is `x.reshape((2, 3))`)."""
        return ops.reshape(self, shape[0] if len(shape) == 1 and
                           not isinstance(shape[0], (int, np.integer)) else shape)

    def transpose(self, *axes: Any) -> Tensor:
        """`graphopt.ops.transpose`, with the axes as one sequence or as separate ints; no
        axes reverses them."""
        return ops.transpose(self, axes[0] if len(axes) == 1 and
                             not isinstance(axes[0], (int, np.integer)) else (axes or None))

    @property
    def T(self) -> Tensor:
        """The tensor with its axes reversed (`graphopt.ops.transpose(self)`)."""
        return ops.transpose(self)


class TracedTensor(Tensor):
    """An IR value while a function is being traced. Its data does not exist yet, so Python
    control flow on it is an error that points to `graphopt.ops.where`."""

    __slots__ = ("value", "trace", "weak")

    def __init__(self, value: Value, trace: Trace, weak: bool = False):
        self.value = value
        self.trace = trace
        self.weak = weak  # made from Python scalars only: takes the dtype of what it meets

    @property
    def type(self) -> TensorType:  # type: ignore[override]
        """The type of the IR value it stands for."""
        return self.value.type  # type: ignore[return-value]

    def _no_value(self, what: str) -> TracerBoolError:
        from .traces import user_location
        return TracerBoolError(
            f"{what} needs the value of a traced tensor ({self.type}), which exists only when "
            f"the compiled step runs; use graphopt.ops.where(cond, x, y) to choose between "
            f"values inside the graph", loc=user_location())

    def __bool__(self): raise self._no_value("Python control flow (if/while/and/or/bool())")
    def __float__(self): raise self._no_value("float()")
    def __int__(self): raise self._no_value("int()")
    def __index__(self): raise self._no_value("use as an index")
    def __array__(self, *a, **k): raise self._no_value("conversion to a numpy array")

    def __repr__(self) -> str:
        return f"TracedTensor({self.type})"


class EagerTensor(Tensor):
    """The result of an op in eager mode: a numpy array with graphopt's operators. `weak`: the
    op's inputs were Python scalars or weak tensors only (see docs/ir.md, "Python scalars")."""

    __slots__ = ("array", "weak")

    def __init__(self, array: np.ndarray, weak: bool = False):
        self.array = array
        self.weak = weak

    @property
    def type(self) -> TensorType:  # type: ignore[override]
        """The shape and dtype of its array."""
        return TensorType(self.array.shape, to_dtype(self.array.dtype))

    def numpy(self) -> np.ndarray:
        """A copy of its array."""
        return self.array.copy()

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)

    def __bool__(self): return bool(self.array)
    def __float__(self): return float(self.array)
    def __int__(self): return int(self.array)

    def __repr__(self) -> str:
        return f"EagerTensor({self.array!r})"


class _Ops:
    """graphopt.ops, looked up on first use: ops imports the tracer, which imports this file."""

    def __getattr__(self, name: str) -> Any:
        from .. import ops as module
        return getattr(module, name)


ops = _Ops()
