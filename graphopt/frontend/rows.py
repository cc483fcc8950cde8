"""Rows: a row gradient as a step function sees it, traced or eager.

The VJP of a sparse embedding lookup (`ops.embedding(table, ids, sparse=True)`) is not a
dense tensor of the table's shape but K rows of it: indices and values (ir/types.py's
`RowsType`; torch's sparse COO gradient, MindSpore's RowTensor). A `Rows` stands for one:
an IR value of that type in a trace, a `RowsArray` in eager mode. It has no arithmetic; its
parts, `coalesce` and `dense` are ops (graphopt.ops), and optimizers that take row gradients
update only the rows it names.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..ir.types import RowsType
from .tensor import Typed, ops

if TYPE_CHECKING:
    from .tensor import Tensor
    from .traces import Trace


class Rows(Typed):
    """A row gradient: `num_rows` rows of a dense tensor of `shape`, each an index into its
    first axis and the values of that row. The index `shape[0]` means no row (a padding
    index's, or coalesce's padding); indices may repeat unless `unique`, and repeated rows
    add up (`dense()`).

    In a trace it stands for an IR value (`payload`, of type `rows<K, dtype[shape]>`, in
    `trace`); in eager mode it holds the arrays (`payload`, a RowsArray; `trace` is None)."""

    __slots__ = ("payload", "type", "trace")
    type: RowsType  # the IR type: its rows, the dense tensor's type, unique or not

    def __init__(self, payload: Any, type: RowsType, trace: Trace | None = None):
        self.payload = payload
        self.type = type
        self.trace = trace

    @property
    def unique(self) -> bool:
        """Whether its indices are distinct, apart from the no-row index (coalesce's)."""
        return self.type.unique

    @property
    def num_rows(self) -> int:
        """K, the number of rows it holds (no-row entries included)."""
        return self.type.rows

    @property
    def indices(self) -> Tensor:
        """The row indices, i64[K]."""
        return ops.rows_indices(self)

    @property
    def values(self) -> Tensor:
        """The values, [K, *shape[1:]]."""
        return ops.rows_values(self)

    def coalesce(self) -> Rows:
        """The same gradient with unique indices (`graphopt.ops.coalesce`)."""
        return ops.coalesce(self)

    def dense(self) -> Tensor:
        """The dense tensor (`graphopt.ops.densify`): duplicates added up."""
        return ops.densify(self)

    def __repr__(self) -> str:
        return f"Rows({self.type})"
