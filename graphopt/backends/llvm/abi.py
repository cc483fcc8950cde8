"""A kernel's calling convention and iteration plan, and its canonical text (the cache key).

What the runtime needs to call a compiled kernel, worked out from the kernel node alone: a
warm start (object code from the cache) needs this and nothing of LLVM's IR builder.
See codegen.py for the function these describe.
"""
from __future__ import annotations

import functools
import hashlib
import math
import operator
from dataclasses import dataclass
from typing import Mapping, NamedTuple

from ...errors import LoweringError
from ...ir.graph import Node
from ...ir.kernel import (
    ROW_KERNEL,
    columns,
    instance_rows,
    is_mapped,
    kind_for,
    layout,
    output_shape,
    reduced_shape,
    row_axis,
    row_shape,
    stages,
)
from ...ir.printer import format_graph
from ...ir.types import contiguous_strides

_SHAPE = operator.attrgetter("type.shape")

BLOCK_ELEMENTS = 8192  # elements per reduction block (a few pages of each operand)
# Units (rows) per block at least, in a kernel with a leading-axes reduction: each block keeps
# a partial result per kept element, so blocks of many rows keep the partials small (at most
# 1/32 of the elements).
BLOCK_ROWS = 32


class Instance(NamedTuple):  # a tuple: a multi-tensor kernel makes thousands
    dims: tuple[int, ...]  # the collapsed iteration space
    # Element strides per body input, then per mapped output, then per leading-axes
    # reduction (where in its result, and so in a block's partials, an element goes).
    strides: tuple[tuple[int, ...], ...]
    unit_offset: int  # where its units start among all instances' units
    block_units: int  # units per reduction block
    block_offset: int  # index of its first block among all blocks
    # Dimensions (of `dims`) that index a row, in a kernel with row reductions: the loops
    # below them are its row passes (0: no row reductions).
    rows: int = 0

    @property
    def units(self) -> int:
        return self.dims[0] if self.dims else 1

    @property
    def blocks(self) -> int:
        return -(-self.units // self.block_units)


@dataclass(frozen=True)
class KernelABI:
    """What the runtime must know to call a compiled kernel."""

    name: str
    instances: tuple[Instance, ...]
    n_maps: int  # mapped outputs per instance ("map" and "row@r": written as the loop goes)
    # The kind of each reduced output, in body-output order, then of each finish reduction
    # of the body (in body order; see ir/kernel.py), whose result stays in the finisher.
    reductions: tuple[str, ...]
    has_token: bool
    # Elements of each reduced output: 1 for a full reduction, the kept axes' size for a
    # leading-axes one ("sum@k"). A block's partials are these, reduction after reduction.
    widths: tuple[int, ...] = ()
    finishes: int = 0  # how many of the reductions are finish reductions (the last ones)

    @property
    def slots(self) -> int:
        """Partial results (8-byte slots) per block."""
        return sum(self.widths)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each reduction's partials start within a block's."""
        out, at = [], 0
        for w in self.widths:
            out.append(at)
            at += w
        return tuple(out)

    @property
    def finisher(self) -> str | None:
        """The function that combines the blocks' partial results (kernels with reductions)."""
        return f"{self.name}_finish" if self.reductions else None

    @functools.cached_property
    def total_units(self) -> int:
        return sum(i.units for i in self.instances)

    @functools.cached_property
    def total_blocks(self) -> int:
        return sum(i.blocks for i in self.instances)


# The element strides of operands a kernel reads where they lie, in another array's memory (a
# view: a slice, a transpose, ...), by operand index; the others are C-contiguous.
Strided = Mapping[int, tuple[int, ...]]


def _in_space(shape: tuple[int, ...], space: tuple[int, ...],
              strides: tuple[int, ...] | None = None) -> list[int]:
    """Element strides of an array of `shape` (C-contiguous unless `strides` are given)
    broadcast into `space`: 0 along the axes it broadcasts over."""
    strides = contiguous_strides(shape) if strides is None else strides
    lead = len(space) - len(shape)
    return [0] * lead + [st if size == full and full != 1 else 0
                         for size, full, st in zip(shape, space[lead:], strides)]


def collapse(space: tuple[int, ...], shapes: list[tuple[int, ...]],
             strided: Strided = {}) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 dimensions and merge neighbours that every array walks contiguously."""
    per = [_in_space(s, space, strided.get(j)) for j, s in enumerate(shapes)]
    dims: list[int] = []
    strides: list[list[int]] = [[] for _ in shapes]
    for k, size in enumerate(space):
        if size == 1:
            continue
        if dims and all(st[-1] == p[k] * size for st, p in zip(strides, per)):
            dims[-1] *= size  # contiguous across: one longer dimension
            for st, p in zip(strides, per):
                st[-1] = p[k]
            continue
        dims.append(size)
        for st, p in zip(strides, per):
            st.append(p[k])
    return tuple(dims), [tuple(s) for s in strides]


def _column_stride(column: list, spaces: list[tuple[int, ...]]) -> tuple[int]:
    """An operand of a multi-tensor kernel streams in every instance or is a scalar in every
    one: one code path serves them all (an instance of one element is either)."""
    shapes = list(map(_SHAPE, column))
    if shapes == spaces:  # (the common case, tested in C: a column of thousands)
        return (0,) if all(n == 1 for n in map(math.prod, spaces)) else (1,)
    kinds = {shape == space for shape, space in zip(shapes, spaces) if math.prod(space) != 1}
    if len(kinds) > 1 or any(math.prod(shape) != 1 and shape != space
                             for shape, space in zip(shapes, spaces)):
        raise LoweringError(f"a multi-tensor kernel's operand that streams in some instances "
                            f"and broadcasts in others ({[str(v.type) for v in column]} over "
                            f"{spaces}) has no one code path")
    return (1,) if kinds == {True} else (0,)


def flags(fastmath: bool) -> str:
    return f"fastmath={fastmath}"


def plan(node: Node, fastmath: bool = False, text: str | None = None,
         strided: Strided = {}) -> KernelABI:
    """The kernel's calling convention and iteration plan; `text`: its canonical_text, when
    the caller has it already; `strided`: the operands read as views (one instance only)."""
    lay = layout(node)
    if node.op == ROW_KERNEL:
        return _named(node, fastmath, text, strided, _row_instances(node, lay), 0, (), (), lay)
    kinds = list(node.attrs["outputs"])
    mapped = [k for k in kinds if is_mapped(k)]
    n_maps = len(mapped)
    finishes = _finish_kinds(node, lay, strided)
    reduced = [k for k in kinds if not is_mapped(k)] + finishes
    leading = [k for k in reduced if "@" in k]
    if leading and lay.instances != 1:
        raise LoweringError(f"a multi-tensor kernel's reduction over leading axes ({leading}) "
                            f"has no code path: each instance's result has its own shape")
    r = row_axis(node.body)
    if r is not None and lay.instances != 1:
        raise LoweringError("a multi-tensor kernel with row reductions has no code path: its "
                            "row passes are planned for one iteration space")
    widths = tuple(math.prod(reduced_shape(k, space)) if "@" in k else 1
                   for k, space in zip(reduced, node.attrs["spaces"][:1] * len(reduced)))
    instances = []
    if lay.instances > 1:  # hfuse: every operand streams or is a scalar; one flat loop each
        spaces = [tuple(space) for space in node.attrs["spaces"]]
        streams = [[_column_stride(column, spaces)] * lay.instances
                   for column in columns(node, lay)] + [[(1,)] * lay.instances] * n_maps
        unit_offset = block_offset = 0
        for space, strides in zip(spaces, zip(*streams)):
            size = math.prod(space)
            instances.append(Instance((size,), strides, unit_offset, BLOCK_ELEMENTS, block_offset))
            unit_offset += size
            block_offset += -(-size // BLOCK_ELEMENTS)
    elif lay.instances == 1:
        space = tuple(node.attrs["spaces"][0])
        row = next(instance_rows(node, lay))
        # A leading-axes reduction's result is an array broadcast along the reduced axes, so
        # the collapse keeps the reduced axes apart from the kept ones; a row's shape keeps
        # the axes that index rows apart from those along a row.
        rows = [row_shape(space, r)] if r is not None else []
        dims, strides = collapse(space, [v.type.shape for v in row] +
                                 [output_shape(k, space) for k in mapped] +
                                 [reduced_shape(k, space) for k in leading] + rows, strided)
        depth = sum(map(bool, strides.pop())) if rows else 0  # the dims that index rows
        reduced_first = leading and dims and any(st[0] for st in strides[len(strides) -
                                                                         len(leading):])
        if reduced_first or (rows and not depth):
            # The reduced axes were all of size 1 (or the row index axes were): an outer loop
            # of one unit, so that blocks (of units) never cut the kept axes, nor units a row.
            dims, strides = (1,) + dims, [(0,) + st for st in strides]
            depth += bool(rows)
        inner = math.prod(dims[1:])
        block_units = max(1, BLOCK_ELEMENTS // max(inner, 1))
        if leading:
            block_units = max(block_units, BLOCK_ROWS)
        instances.append(Instance(dims, tuple(strides), 0, block_units, 0, depth))
    return _named(node, fastmath, text, strided, instances, n_maps, tuple(reduced), widths, lay,
                  len(finishes))


def _finish_kinds(node: Node, lay, strided: Strided) -> list[str]:
    """The kinds of the body's finish reductions (as an output of the same reduction would
    be), once checked that the finisher can run the finish stage: one instance, and what it
    reads or stores either of the finish's shape, C-contiguous (element w at w), or of one
    element."""
    st = stages(node.body)
    if not st.reductions:
        return []
    if lay.instances != 1:
        raise LoweringError("a multi-tensor kernel's finish stage has no code path: the "
                            "finisher runs it over one instance's reduced shape")
    space = tuple(node.attrs["spaces"][0])
    shape = space[st.k:]
    for j in st.finish_inputs + [j for j, _ in st.finish_stores]:
        t = node.inputs[j].type
        if j in strided or (t.shape != shape and math.prod(t.shape) != 1):
            raise LoweringError(f"a finish stage reads or stores operand {j} ({t}), which is "
                                f"neither of its shape {list(shape)}, contiguous, nor one "
                                f"element: the finisher has no code path for it")
    return [kind_for(m.op, m.attrs["axes"], len(space)) for m in st.reductions]


def _named(node: Node, fastmath: bool, text: str | None, strided: Strided,
           instances: list[Instance], n_maps: int, reduced: tuple[str, ...],
           widths: tuple[int, ...], lay, finishes: int = 0) -> KernelABI:
    """The ABI, named by what the function computes: the same name is the same code."""
    text = canonical_text(node, strided) if text is None else text
    digest = hashlib.sha256((text + flags(fastmath)).encode()).hexdigest()[:16]
    return KernelABI(f"kernel_{digest}", tuple(instances), n_maps, reduced, lay.has_token,
                     widths, finishes)


def _row_instances(node: Node, lay) -> list[Instance]:
    """A row kernel's instances: K units (rows) of D elements each (the row's size). A body
    input streams (stride 1: its row k, or, indexed, its table's row indices[k]) or is a
    scalar (0); an operand that broadcasts otherwise has no code path (numpy runs it)."""
    indexed, instances, offset = set(node.attrs["indexed"]), [], 0
    for space, row in zip(node.attrs["spaces"], instance_rows(node, lay)):
        space = tuple(space)
        strides = []
        for j, v in enumerate(row):
            if j in indexed or v.type.shape == space:
                strides.append((1,))
            elif math.prod(v.type.shape) == 1:
                strides.append((0,))
            else:
                raise LoweringError(f"a row kernel's operand {v.type} broadcasts over its rows "
                                    f"{list(space)}: a row kernel streams or reads scalars")
        instances.append(Instance((space[0], math.prod(space[1:])), tuple(strides), offset,
                                  max(1, space[0]), 0))
        offset += space[0]
    return instances


def canonical_text(node: Node, strided: Strided = {}) -> str:
    """The kernel as text with no outer names: what its code depends on, for the cache key.
    An operand's dtype is its body input's, and most operands have their instance's shape:
    only the others are listed (a multi-tensor kernel has thousands of operands), and so are
    the strides of operands read as views."""
    lay = layout(node)
    spaces = [tuple(space) for space in node.attrs["spaces"]]
    cols = columns(node, lay)
    odd: list[str] = []
    for j in lay.per_instance:
        if [v.type.shape for v in cols[j]] != spaces:
            odd += [f"{i}.{j}:{v.type}" for i, (v, space) in enumerate(zip(cols[j], spaces))
                    if v.type.shape != space]
    shared = [f"{cols[j][0].type}" for j in lay.shared]
    views = f"views={dict(sorted(strided.items()))}\n" if strided else ""
    if node.op == ROW_KERNEL:  # its rows (K and N) and the operands read at their indices
        rows = [str(v.type) for v in node.inputs[:lay.lead]]
        head = f"row_kernel indexed={list(node.attrs['indexed'])} rows={rows}"
    else:
        head = f"kernel outputs={node.attrs['outputs']}"
    return (f"{head} shared={list(lay.shared)}:{shared} "
            f"instances={lay.instances}\nspaces={spaces}\nother shapes={odd}\n"
            f"{views}{format_graph(node.body)}")
