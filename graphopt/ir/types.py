"""dtypes and value types of the IR.

A value is a tensor (`TensorType`: static shape and dtype; `()` is a scalar), an effect token
(`TokenType`, what `assign` yields) or a row gradient (`RowsType`: K rows of a tensor, what
the VJP of a sparse embedding lookup gives; at run time a `RowsArray`). bf16 arrays use the `ml_dtypes` numpy extension type, the
one JAX and TensorFlow use, so the interpreter can hold and compute bf16 like any other dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import ml_dtypes
import numpy as np


@dataclass(frozen=True, eq=False)
class DType:
    """One of the seven dtypes (f16, bf16, f32, f64, i32, i64, bool); each exists once, so
    dtypes compare by identity (fast: type checks compare thousands of them), also after a
    copy or a pickle."""

    name: str  # the IR spelling: f32, i64, bool, ...
    kind: str  # "float", "int" or "bool"
    np_dtype: np.dtype

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.np_dtype.itemsize

    @property
    def is_float(self) -> bool:
        """Whether it is f16, bf16, f32 or f64."""
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        """Whether it is i32 or i64."""
        return self.kind == "int"

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype, so that numpy takes a DType as a dtype."""
        # numpy accepts any object with a `.dtype` as a dtype: np.zeros(3, graphopt.f32) works.
        return self.np_dtype

    def __reduce__(self) -> tuple:
        return to_dtype, (self.name,)

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


f16 = DType("f16", "float", np.dtype(np.float16))
bf16 = DType("bf16", "float", np.dtype(ml_dtypes.bfloat16))
f32 = DType("f32", "float", np.dtype(np.float32))
f64 = DType("f64", "float", np.dtype(np.float64))
i32 = DType("i32", "int", np.dtype(np.int32))
i64 = DType("i64", "int", np.dtype(np.int64))
bool_ = DType("bool", "bool", np.dtype(np.bool_))

DTYPES: dict[str, DType] = {d.name: d for d in (f16, bf16, f32, f64, i32, i64, bool_)}
_BY_NUMPY = {d.np_dtype: d for d in DTYPES.values()}


def to_dtype(x: object) -> DType:
    """A DType from a DType, its IR name ("f32"), or anything numpy reads as a dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in DTYPES:
        return DTYPES[x]
    try:
        d = _BY_NUMPY.get(np.dtype(x))  # type: ignore[arg-type]
    except TypeError:
        d = None
    if d is None:
        raise TypeError(f"unsupported dtype {x!r}; graphopt has {', '.join(DTYPES)}")
    return d


@dataclass(frozen=True)
class TensorType:
    """The type of a tensor value: a static shape (`()` for a scalar) and a dtype. It prints
    as the IR writes it, `f32[4,3]`."""

    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(map(int, self.shape)))

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes of its elements."""
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"


# The limits of a tensor, which the verifier checks: numpy's 64 dimensions, and dimensions and
# sizes that a signed 64-bit integer holds (numpy and the LLVM backend index and offset in
# int64: past it a size wraps, and a kernel over f32[10**26] loops zero times).
MAX_NDIM = 64
MAX_SIZE = 2**63 - 1


def shape_problem(shape: tuple[int, ...], itemsize: int = 1) -> str | None:
    """What is wrong with a shape, or None: its dimensions are integers >= 0, at most
    MAX_NDIM of them, and its elements times `itemsize` (a tensor's bytes) at most MAX_SIZE."""
    if len(shape) > MAX_NDIM:
        return f"{len(shape)} dimensions (at most {MAX_NDIM})"
    if any(d < 0 for d in shape):
        return "a negative dimension"
    big = next((d for d in shape if d > MAX_SIZE), None)
    if big is not None:
        return f"a dimension of about 2**{big.bit_length() - 1} (at most 2**63-1)"
    size = math.prod(shape) * itemsize
    if size > MAX_SIZE:
        what = "bytes" if itemsize > 1 else "elements"
        return f"about 2**{size.bit_length() - 1} {what} (at most 2**63-1)"
    return None


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of `shape`."""
    out, step = [], 1
    for size in reversed(shape):
        out.append(step)
        step *= size
    return tuple(out[::-1])


def value_problem(value: object, dtype: DType) -> str | None:
    """What keeps `value` (a number, a nested list of numbers, an array) from being values of
    the dtype, element by element, or None: an int dtype takes integers in its range (not
    NaN, inf or a fraction), bool takes 0, 1, true and false, a float dtype any number
    (rounded to it, as numpy rounds)."""
    if isinstance(value, np.ndarray):
        return _array_problem(value, dtype)
    return next(filter(None, (_scalar_problem(x, dtype) for x in _leaves(value))), None)


def _leaves(x: object) -> Iterator[object]:
    if isinstance(x, (list, tuple)):
        for e in x:
            yield from _leaves(e)
    else:
        yield x


def _int_range(d: DType) -> tuple[int, int]:
    info = np.iinfo(d.np_dtype)
    return int(info.min), int(info.max)


def _scalar_problem(x: object, d: DType) -> str | None:
    if not isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating)):
        return f"{x!r} is not a number"
    if d.kind == "bool":
        return None if x in (0, 1) else f"{_show_number(x)} is not a bool (true, false, 0, 1)"
    if d.kind == "float":
        try:
            float(x)
        except OverflowError:  # an int past f64's range
            return f"{_show_number(x)} is out of the range of {d}"
        return None
    if isinstance(x, (float, np.floating)) and not (math.isfinite(x) and x == int(x)):
        return f"{_show_number(x)} is not an integer, so not an {d}"
    lo, hi = _int_range(d)
    if not lo <= int(x) <= hi:
        return f"{_show_number(x)} is out of the range of {d} [{lo}, {hi}]"
    return None


def _show_number(x: object) -> str:
    if isinstance(x, (int, np.integer)) and abs(int(x)).bit_length() > 64:
        return f"an integer of about 2**{abs(int(x)).bit_length() - 1}"
    return repr(x.item() if isinstance(x, np.generic) else x)


def _array_problem(a: np.ndarray, d: DType) -> str | None:
    if a.dtype == d.np_dtype or a.size == 0:
        return None
    floats = a.dtype.kind == "f" or a.dtype == bf16.np_dtype
    if a.dtype.kind not in "biu" and not floats:
        return f"an array of {a.dtype} is not an array of numbers"
    if d.kind == "float":
        return None
    if floats:
        a = a.astype(np.float64)
        if not np.isfinite(a).all() or (a != np.trunc(a)).any():
            return f"an array with NaN, inf or a fraction is not an array of {d}"
    lo, hi = (0, 1) if d.kind == "bool" else _int_range(d)
    if a.min() < lo or a.max() >= hi + 1:  # (hi + 1, a power of 2, is exact in f64)
        return f"an array with values outside [{lo}, {hi}] is not an array of {d}"
    return None


@dataclass(frozen=True)
class TokenType:
    """The type of an effect token: no data, only an ordering."""

    def __str__(self) -> str:
        return "token"


token = TokenType()


@dataclass(frozen=True)
class RowsType:
    """The type of a row gradient: `rows` rows of a tensor of type `dense`, each given by an
    index into the tensor's first axis (`i64[rows]`) and its values (`dense.dtype[rows,
    *dense.shape[1:]]`). It prints as `rows<7, f32[100,32]>`. The index `dense.shape[0]`
    (one past the last row) means "no row": it stands for nothing, and what reads or writes
    rows skips it (coalesce pads with it, and so does a padding_idx).

    `unique`: its indices are distinct, apart from the no-row index (`coalesce` makes such
    rows, `rows<7, f32[100,32], unique>`); only such rows may be written into a tensor."""

    rows: int
    dense: TensorType
    unique: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", int(self.rows))

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the dense tensor the rows belong to."""
        return self.dense.shape

    @property
    def dtype(self) -> DType:
        """The dtype of the values."""
        return self.dense.dtype

    @property
    def indices_type(self) -> TensorType:
        """The type of the indices: `i64[rows]`."""
        return TensorType((self.rows,), i64)

    @property
    def values_type(self) -> TensorType:
        """The type of the values: `dtype[rows, *shape[1:]]`."""
        return TensorType((self.rows,) + self.dense.shape[1:], self.dense.dtype)

    @property
    def nbytes(self) -> int:
        """The bytes of its indices and values."""
        return self.indices_type.nbytes + self.values_type.nbytes

    def __str__(self) -> str:
        return f"rows<{self.rows}, {self.dense}{', unique' if self.unique else ''}>"


class RowsArray(NamedTuple):
    """A row gradient's value at run time: its indices (int64 [K]) and values ([K, ...]) as
    numpy arrays, and the dense tensor's number of rows, `dense_rows`: the no-row index."""

    indices: np.ndarray
    values: np.ndarray
    dense_rows: int


Type = TensorType | TokenType | RowsType


def type_of_array(a: np.ndarray) -> TensorType:
    return TensorType(a.shape, to_dtype(a.dtype))
