"""Codegen of a row kernel (ir/rowkernel.py): one loop over the rows of a row gradient.

    void @kernel(i64 lo, i64 hi, ptr args, ptr partials)

`args`: each instance's indices (i64[K], the rows' first part), then the body's operands as
in a multi-tensor kernel. The units are the K rows of the instances laid end to end, so
threads split a kernel by rows (its indices are unique: no two threads write one row):

    for each instance i with units in [lo, hi):
        for k in its range:
            r = indices[k]
            if r < N (unsigned: a negative index is past N too):   the no-row index skipped
                for d in 0 .. D:                                  D: the row's size
                    the body at element d of row r of each indexed operand, of row k of
                    each streamed one (the values), and at each scalar (loaded once);
                    its stores into row r of their tables

K, D and N are per instance (tables in the module), so one function serves several tables of
different sizes. The inner loop is over contiguous elements of both the table's row and the
values' row: the vectorizer makes SIMD code of it. Bytes moved: K·D per operand.
"""
from __future__ import annotations

from llvmlite import ir

from ...ir.types import RowsType, i64
from .codegen import LINE, _Builder


class RowBuilder(_Builder):
    """Emits the function of one row kernel."""

    def build(self) -> ir.Module:
        abi, b = self.abi, self.b
        sizes = [v.type.shape[0] for v in self.node.inputs[:self.lay.lead]
                 if isinstance(v.type, RowsType)]
        tables = {name: self.table(name, values) for name, values in (
            ("unit_offset", [i.unit_offset for i in abi.instances]),
            ("units", [i.units for i in abi.instances]),
            ("row", [i.dims[1] for i in abi.instances]),
            ("height", sizes))}
        self.indexed = set(self.node.attrs["indexed"])
        self.loop(self.i64(0), self.i64(len(abi.instances)),
                  lambda i: self.rows_of(i, *(self.at(t, i) for t in tables.values())), "inst")
        b.ret_void()
        return self.module

    def rows_of(self, i, offset, units, width, height) -> None:
        """The rows of instance i that fall in [lo, hi)."""
        def rows(start, end):
            indices = self.arg_ptr(i)
            self.loop(start, end, lambda k: self.row(k, end, indices, width, height), "row")
        self.in_range(i, offset, units, rows)

    def row(self, k, end, indices, width, height) -> None:
        """Row k of the gradient: the body over its elements, at table row indices[k]; the
        tables' row PREFETCH rows ahead asked for meanwhile."""
        b = self.b
        self.prefetch(b.add(k, self.i64(PREFETCH)), end, indices, width, height)
        r = self.e.load(indices, k, i64)
        inside = self.fn.append_basic_block("row.inside")
        done = self.fn.append_basic_block("row.done")
        b.cbranch(b.icmp_unsigned("<", r, height), inside, done)
        b.position_at_end(inside)
        at_table, at_values = b.mul(r, width), b.mul(k, width)
        self.loop(self.i64(0), width, lambda d: self.body_values(
            lambda j: b.add(at_table if j in self.indexed else at_values, d)), "elem")
        b.branch(done)
        b.position_at_end(done)

    def prefetch(self, k, end, indices, width, height) -> None:
        """Ask for the cache lines of row indices[k] of each indexed table (k < end), so
        that its memory latency overlaps the rows before it: the rows are scattered over
        tables far larger than the caches, where each row read otherwise waits for memory."""
        b = self.b
        inside = self.fn.append_basic_block("prefetch")
        done = self.fn.append_basic_block("prefetch.done")
        b.cbranch(b.icmp_signed("<", k, end), inside, done)
        b.position_at_end(inside)
        r = self.e.load(indices, k, i64)
        ask = self.fn.append_basic_block("prefetch.row")
        b.cbranch(b.icmp_unsigned("<", r, height), ask, done)
        b.position_at_end(ask)
        for j in sorted(self.indexed):
            d = self.node.body.inputs[j].dtype
            per_line = self.i64(LINE // d.itemsize)
            row = b.mul(r, width)
            lines = b.udiv(b.add(width, b.sub(per_line, self.i64(1))), per_line)
            self.loop(self.i64(0), lines, lambda line, j=j, d=d, row=row: self.e.prefetch(
                self.ptrs[j], b.add(row, b.mul(line, per_line)), d, write=True), "line")
        b.branch(done)
        b.position_at_end(done)


PREFETCH = 8  # rows ahead: enough to cover a memory latency at a few ns per element
