"""Codegen: one kernel node becomes one LLVM function (see ir/kernel.py for kernels).

    void @kernel(i64 lo, i64 hi, ptr args, ptr partials)

`args` points to an array of pointers: the per-instance operands (instance after instance),
the shared operands, then the mapped outputs (instance after instance). A call runs the
*units* lo..hi of the kernel's instances laid end to end; a unit is one step of an instance's
outermost loop, so two threads can run one kernel on two halves of its units.

The loops: an instance's iteration space is collapsed first (size-1 dimensions dropped,
neighbours merged where every operand is contiguous across them), so most kernels are one flat
loop the vectorizer turns into SIMD code; an operand that broadcasts has stride 0 along the
dimensions it lacks. Scalars are loaded once, before the loop. A flat loop runs in chunks
that prefetch what a later chunk reads (stream).

Reductions use a fixed chunking: each instance's units are cut into blocks of BLOCK_ELEMENTS
elements, each block's result (a sum added in f64, an integer's in i64; a max in its type)
is written to `partials`, and the runtime combines the
partials in order. Threads only split at block edges, so a reduction gives the same result on
every run, however many threads ran it. A reduction over the leading axes ("sum@k") keeps one
partial per element of its result in each block: its elements are added, in f64 (an integer
in i64), straight into the block's slots, unit after unit (row after row, in order), and the
finisher adds each slot's partials across the blocks in order.

Row reductions (a body's `sum`/`max`/`mean` over the trailing axes r..: see ir/kernel.py)
are *row passes*: the collapse keeps the axes that index rows apart from those along a row
(a unit is one or more whole rows, so threads split between rows), and for each row the
loop makes one pass over its elements per level of row reductions (LayerNorm: the mean,
then the variance), each computing only what its reductions need, recomputed from the
operands rather than kept (a row of a few KB is read again from cache, as XLA's softmax and
normalization fusions do); sums accumulate in f64 (integers in i64), a max in its type, in a
register re-initialised per row. Then the row-invariant values are computed and the "row@r"
outputs stored, once per row, and the last pass computes every element with them as
constants: only it stores, so a parameter updated in place is read by every pass before it
is written.
"""
from __future__ import annotations

import math
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np
from llvmlite import ir

from ...errors import LoweringError
from ...ir.graph import Node, Value
from ...ir.kernel import (
    ROW_KERNEL,
    body_reductions,
    instance_rows,
    is_mapped,
    layout,
    row_axis,
    row_invariant,
    row_passes,
    split_kind,
    stages,
    stores,
    upstream,
)
from ...ir.printer import value_names
from ...ir.registry import CONSTANT, ELEMENTWISE
from ...ir.types import DType, TensorType
from .abi import BLOCK_ELEMENTS, Instance, KernelABI, Strided, plan
from .emitter import F32, I64, PTR, Emitter, compute_type, storage_type
from .lowering import LOWERING

_NONE: Mapping = MappingProxyType({})  # no values known yet
F64 = ir.DoubleType()
# Software prefetch in flat loops (see _Builder.stream): each chunk of PREFETCH_CHUNK units
# first asks for the cache lines its contiguous operands hold PREFETCH_AHEAD units further
# on. 64 units span at least one 64-byte line of every dtype; 1024 units ahead is a few
# microseconds of work at memory speed (512 to 2048 measured alike, chunks of 32 to 128 too).
PREFETCH_CHUNK, PREFETCH_AHEAD = 64, 1024
LINE = 64  # bytes per cache line (where lines are longer, some prefetches ask twice)


class _Builder:
    """Emits the function for one kernel."""

    def __init__(self, node: Node, abi: KernelABI, fastmath: bool):
        self.node, self.abi = node, abi
        self.lay = layout(node)
        # LLVM values are named after the body values they compute, as the IR prints them
        # (%x1 -> x1, %3 -> v3), so the listing reads next to the kernel's body.
        self.names = {v: ("v" if n[1:].isdigit() else "") + n[1:]
                      for v, n in value_names(node.body).items()}
        self.module = ir.Module(name=abi.name)
        fnty = ir.FunctionType(ir.VoidType(), [I64, I64, PTR, PTR])
        self.fn = ir.Function(self.module, fnty, abi.name)
        self.fn.attributes.add("nounwind")
        self.lo, self.hi, self.args, self.partials = self.fn.args
        self.entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self.entry)
        self.e = Emitter(self.b, self.module, fastmath)
        self.stored = {j for j, _ in stores(node.body)}
        self.fastmath = fastmath
        # The body split in its element stage and its finish stage (run by the finisher).
        self.stages = stages(node.body)
        # Each reduction's element value and dtype: the reduced outputs', then the finish
        # reductions' (abi.reductions' order).
        body = node.body
        self.red_values = [body.outputs[k] for k, kind in enumerate(node.attrs.get("outputs", ()))
                           if not is_mapped(kind)] + [m.inputs[0] for m in self.stages.reductions]

    def i64(self, v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def table(self, name: str, values: list[int]) -> ir.GlobalVariable:
        t = ir.ArrayType(I64, len(values))
        # Named after the kernel: every kernel's object code is linked into one JIT engine,
        # which resolves even internal symbols by name.
        g = ir.GlobalVariable(self.module, t, f"{self.abi.name}.{name}")
        g.initializer = ir.Constant(t, values)
        g.global_constant = True
        g.linkage = "internal"
        return g

    def at(self, table: ir.GlobalVariable, i: ir.Value) -> ir.Value:
        ptr = self.b.gep(table, [self.i64(0), i], inbounds=True)
        return self.b.load(ptr, typ=I64)

    def arg_ptr(self, index: ir.Value) -> ir.Value:
        return self.b.load(self.b.gep(self.args, [index], inbounds=True, source_etype=PTR),
                           typ=PTR)

    def loop(self, start: ir.Value, end: ir.Value, body, name: str) -> None:
        """for (i = start; i < end; i++) body(i)"""
        b = self.b
        pre = b.block
        head = self.fn.append_basic_block(f"{name}.head")
        inner = self.fn.append_basic_block(f"{name}.body")
        done = self.fn.append_basic_block(f"{name}.done")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, end), inner, done)
        b.position_at_end(inner)
        body(i)
        i.add_incoming(b.add(i, self.i64(1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    # -- the function ---------------------------------------------------------------------------
    def build(self) -> ir.Module:
        abi, b = self.abi, self.b
        if not abi.instances:
            b.ret_void()
            return self.module
        # A full reduction accumulates in a register (an alloca); a leading-axes one in its
        # block's partials.
        self.accs = [b.alloca(self._acc_type(r), name=f"acc{r}")
                     for r in range(len(abi.reductions))]
        self.leading = [r for r, kind in enumerate(abi.reductions) if "@" in kind]
        # A row reduction accumulates in a register too, re-initialised for every row.
        self.row_accs = {m: b.alloca(self._row_acc_type(m), name="row")
                         for m in body_reductions(self.node.body)}
        self.block_base: ir.Value | None = None
        # Multi-instance kernels are all flat loops: one code path over a table of instances.
        # A one-instance kernel may be a nest (broadcasting); its sizes are constants.
        offsets = self.table("unit_offset", [i.unit_offset for i in abi.instances])
        units = self.table("units", [i.units for i in abi.instances])
        blocks = self.table("block_offset", [i.block_offset for i in abi.instances])
        first = abi.instances[0]
        self.loop(self.i64(0), self.i64(len(abi.instances)),
                  lambda i: self.instance(i, self.at(offsets, i), self.at(units, i),
                                          self.at(blocks, i), first), "inst")
        b.ret_void()
        if abi.reductions:
            self.build_finisher(blocks)
        return self.module

    def build_finisher(self, block_offsets: ir.GlobalVariable) -> None:
        """void <name>_finish(i64, i64, ptr args, ptr partials): each instance's reductions,
        its blocks' partial results combined in order (the same sums on every run), written
        to the output slots after the mapped outputs. Same signature as a kernel, so the sink
        can run it as a step of its own (the range is ignored: one thread runs it)."""
        abi, lay = self.abi, self.lay
        fn = ir.Function(self.module, self.fn.function_type, abi.finisher)
        fn.attributes.add("nounwind")
        self.fn, self.entry = fn, fn.append_basic_block("entry")
        self.lo, self.hi, self.args, self.partials = fn.args
        self.b = b = ir.IRBuilder(self.entry)
        self.e = Emitter(b, self.module)
        slots, offsets = abi.slots, abi.offsets
        n_red = len(abi.reductions) - abi.finishes  # the reduced outputs'
        counts = self.table("blocks", [i.blocks for i in abi.instances])
        sizes = self.table("elements", [int(np.prod(s, dtype=np.int64))
                                        for s in self.node.attrs["spaces"]])
        outs = self.red_values
        accs = [b.alloca(F64 if o.dtype.is_float else I64) for o in outs]
        first_slot = len(self.node.inputs) + lay.instances * abi.n_maps

        def instance(i):
            start, count = self.at(block_offsets, i), self.at(counts, i)
            full = [r for r in range(n_red) if r not in self.leading]
            for r in full:
                b.store(self.reduction_init(abi.reductions[r], accs[r].allocated_type), accs[r])

            def combine(r, row, column):
                """accs[r] combined with the partial at slot `column` of block `row`."""
                kind, t = split_kind(abi.reductions[r])[0], accs[r].allocated_type
                index = b.add(b.mul(row, self.i64(slots)), self.i64(offsets[r]))
                index = index if column is None else b.add(index, column)
                raw = b.load(b.gep(self.partials, [index], source_etype=F64), typ=F64)
                value = raw if t == F64 else b.bitcast(raw, I64)
                now = b.load(accs[r], typ=t)
                if kind == "max":
                    new = self.e.maximum(now, value)
                else:
                    new = b.fadd(now, value) if t == F64 else b.add(now, value)
                b.store(new, accs[r])

            def block(j):
                for r in full:
                    combine(r, b.add(start, j), None)

            def result(r, v, count, ptr):
                kind, out = split_kind(abi.reductions[r])[0], outs[r]
                if kind == "mean":
                    v = b.fdiv(v, b.sitofp(count, F64)) if out.dtype.is_float else \
                        b.sdiv(v, count)
                self.store_result(v, ptr, out.dtype)

            if full:
                self.loop(self.i64(0), count, block, "part")
            for r in full:
                slot = b.add(self.i64(first_slot + r), b.mul(i, self.i64(n_red)))
                result(r, b.load(accs[r], typ=accs[r].allocated_type), self.at(sizes, i),
                       self.arg_ptr(slot))
            for r in [r for r in self.leading if r < n_red]:  # one instance: see plan
                space = self.node.attrs["spaces"][0]
                total = int(np.prod(space[:split_kind(abi.reductions[r])[1]], dtype=np.int64))
                base = self.arg_ptr(b.add(self.i64(first_slot + r), b.mul(i, self.i64(n_red))))
                t, st = accs[r].allocated_type, storage_type(outs[r].dtype)

                def column(w, r=r, base=base, t=t, st=st, total=total):
                    b.store(self.reduction_init(abi.reductions[r], t), accs[r])
                    self.loop(self.i64(0), count,
                              lambda j: combine(r, b.add(start, j), w), "part")
                    v = b.load(accs[r], typ=t)
                    result(r, v, self.i64(total), b.gep(base, [w], source_etype=st))

                self.loop(self.i64(0), self.i64(abi.widths[r]), column, "col")
            if abi.finishes:
                self.finish_stage(list(range(n_red, len(abi.reductions))), start, count,
                                  combine, accs)

        self.loop(self.i64(0), self.i64(lay.instances), instance, "inst")
        b.ret_void()

    def finish_stage(self, fin: list[int], start, count, combine, accs) -> None:
        """The finish stage (one instance: see plan), once the partials are in: for each
        element w of the reduced shape, the finish reductions' results there (the blocks'
        partials added in order, as a reduced output's are, rounded to their dtype as one
        stored and read back would be), then the stage's nodes on them and its stores."""
        b, abi, st, node = self.b, self.abi, self.stages, self.node
        space = tuple(node.attrs["spaces"][0])
        shape = space[st.k:]
        total = self.i64(math.prod(space[:st.k]))  # the elements added into each result
        # One instance: operand j is body input j; each is of the finish's shape or a scalar.
        self.ptrs = [self.arg_ptr(self.i64(j)) for j in range(len(node.inputs))]
        self.e = Emitter(b, self.module, self.fastmath)
        # A scalar operand loaded once, before the loop: loaded per element it would be read
        # again after each element's stores (which LLVM cannot tell apart from it), and what
        # it feeds (a bias correction's pow) computed again for every element.
        self.scalars = {j: self.e.load(self.ptrs[j], self.i64(0), x.dtype)
                        for j, x in enumerate(node.inputs)
                        if x.shape != shape and j not in self.stored}
        invariant = self.scalar_values(st.finish)
        nodes = [n for n in st.finish if n.outputs[0] not in invariant]

        def element(w):
            known: dict[Value, ir.Value] = {}
            for r, m in zip(fin, st.reductions):
                t = accs[r].allocated_type
                b.store(self.reduction_init(abi.reductions[r], t), accs[r])
                column = w if r in self.leading else None
                self.loop(self.i64(0), count,
                          lambda j: combine(r, b.add(start, j), column), "part")
                known[m.out] = self.reduced_value(m.op, b.load(accs[r], typ=t), total,
                                                  m.out.dtype)

            def offset(j):
                return w if node.inputs[j].shape == shape else self.i64(0)
            env = self.values(nodes, offset, {**invariant, **known})
            for j, n in st.finish_stores:
                self.e.store(env[n.inputs[1]], self.ptrs[j], offset(j), n.inputs[1].dtype)

        self.loop(self.i64(0), self.i64(abi.widths[fin[0]]), element, "finish")

    def store_result(self, v: ir.Value, ptr: ir.Value, dtype) -> None:
        """An f64 (or i64) result into an output of `dtype`, rounded once, as numpy's astype
        rounds it."""
        b, t = self.b, storage_type(dtype)
        if dtype.is_float:
            if dtype.name == "bf16":
                v = self.e.f32_to_bf16(b.fptrunc(v, F32))  # f64 -> f32 -> bf16
            elif t != F64:
                v = b.fptrunc(v, t)
        elif t != I64:
            v = b.trunc(v, t)
        b.store(v, ptr)

    def _acc_type(self, r: int) -> ir.Type:
        """A full reduction's register: a max in the element's type; a sum or mean in its
        slot's (f64 or i64), as leading-axes and row sums add (an f32 sum of a few thousand
        elements, added in f32 lane by lane, was 2e-6 off)."""
        d = self.red_values[r].dtype
        return compute_type(d) if split_kind(self.abi.reductions[r])[0] == "max" else \
            self.slot_type(r)

    def in_range(self, i, offset, units, work) -> None:
        """work(start, end) over the units of instance i that fall in [lo, hi), with its
        pointers loaded; nothing if none does."""
        b = self.b
        start = self.smax(b.sub(self.lo, offset), self.i64(0))
        end = self.smin(b.sub(self.hi, offset), units)
        body = self.fn.append_basic_block("instance")
        after = self.fn.append_basic_block("instance.next")
        b.cbranch(b.icmp_signed("<", start, end), body, after)
        b.position_at_end(body)
        self.pointers(i)
        work(start, end)
        b.branch(after)
        b.position_at_end(after)

    def instance(self, i, offset, units, block_offset, shape: Instance) -> None:
        self.in_range(i, offset, units,
                      lambda start, end: self.units(start, end, block_offset, shape))

    def units(self, start, end, block_offset, shape: Instance) -> None:
        b = self.b
        if self.abi.reductions:
            bu = self.i64(shape.block_units)
            first_block = b.sdiv(start, bu)  # the runtime splits at block edges only
            nblocks = b.sdiv(b.add(b.sub(end, start), self.i64(shape.block_units - 1)), bu)

            abi = self.abi

            def block(k):
                u0 = b.add(start, b.mul(k, bu))
                u1 = self.smin(b.add(u0, bu), end)
                index = b.add(block_offset, b.add(first_block, k))
                self.block_base = b.mul(index, self.i64(abi.slots))
                for r, kind in enumerate(abi.reductions):
                    if r in self.leading:  # every slot of the block's result
                        t = self.slot_type(r)
                        init = self.reduction_init(kind, t)
                        first = b.add(self.block_base, self.i64(abi.offsets[r]))
                        self.loop(self.i64(0), self.i64(abi.widths[r]), lambda w: b.store(
                            init, b.gep(self.partials, [b.add(first, w)], inbounds=True,
                                        source_etype=t)), "init")
                    else:
                        b.store(self.reduction_init(kind, self.accs[r].allocated_type),
                                self.accs[r])
                self.stream(u0, u1, shape)
                for r in range(len(abi.reductions)):
                    if r in self.leading:
                        continue
                    slot = b.add(self.block_base, self.i64(abi.offsets[r]))
                    acc = b.load(self.accs[r], typ=self.accs[r].allocated_type)
                    b.store(self.to_partial(acc),
                            b.gep(self.partials, [slot], inbounds=True, source_etype=F64))

            self.loop(self.i64(0), nblocks, block, "block")
        else:
            self.stream(start, end, shape)

    def stream(self, start, end, shape: Instance) -> None:
        """The units start..end. A flat loop runs in chunks, each first prefetching its
        operands' lines PREFETCH_AHEAD units on: the hardware prefetchers alone kept the bf16
        Adam kernel (per element a sqrt, two divisions and two roundings) at half the memory
        bandwidth on an Intel Xeon, its out-of-order window holding too few cache misses;
        chunked, it ran 2.4x faster, f32 Adam 1.1x (docs/llvm.md)."""
        b = self.b
        streamed = [(j, d) for j, d in enumerate(self.operand_dtypes)
                    if self.abi.instances[0].strides[j] == (1,)]
        if len(shape.dims) != 1 or shape.rows or not streamed:
            self.loop(start, end, lambda u: self.unit(u, shape), "unit")
            return
        chunk = self.i64(PREFETCH_CHUNK)
        count = b.sdiv(b.add(b.sub(end, start), self.i64(PREFETCH_CHUNK - 1)), chunk)

        def run(k):
            u0 = b.add(start, b.mul(k, chunk))
            for j, d in streamed:
                for line in range(0, PREFETCH_CHUNK * d.itemsize, LINE):
                    self.e.prefetch(self.ptrs[j], b.add(u0, self.i64(
                        PREFETCH_AHEAD + line // d.itemsize)), d)
            self.loop(u0, self.smin(b.add(u0, chunk), end), lambda u: self.unit(u, shape),
                      "unit")

        self.loop(self.i64(0), count, run, "chunk")

    @property
    def operand_dtypes(self) -> list[DType]:
        """The dtype of each pointer in self.ptrs: the body inputs', then the mapped
        outputs'."""
        body = self.node.body
        return [v.dtype for v in body.inputs] + [
            body.outputs[k].dtype for k, kind in enumerate(self.node.attrs["outputs"])
            if is_mapped(kind)]

    def smax(self, x, y):
        return self.b.select(self.b.icmp_signed(">", x, y), x, y)

    def smin(self, x, y):
        return self.b.select(self.b.icmp_signed("<", x, y), x, y)

    def pointers(self, i) -> None:
        """The base pointer of every body input and mapped output of instance i, and the value
        of each scalar operand (loaded once: it is the same for every element)."""
        lay, abi, b = self.lay, self.abi, self.b
        per = len(lay.per_instance)
        self.ptrs: list[ir.Value] = []
        for j in range(lay.body_inputs):
            if j in lay.shared:
                index = self.i64(lay.lead + lay.instances * per + lay.shared.index(j))
            else:
                index = b.add(b.mul(i, self.i64(per)),
                              self.i64(lay.lead + lay.per_instance.index(j)))
            self.ptrs.append(self.arg_ptr(index))
        base = lay.lead + lay.instances * per + len(lay.shared)
        for m in range(abi.n_maps):
            index = b.add(self.i64(base + m), b.mul(i, self.i64(abi.n_maps)))
            self.ptrs.append(self.arg_ptr(index))
        self.scalars: dict[int, ir.Value] = {}
        strides = self.abi.instances[0].strides
        for j, x in enumerate(self.node.body.inputs):
            if not any(strides[j]) and j not in self.stored:
                self.scalars[j] = self.e.load(self.ptrs[j], self.i64(0), x.dtype)
        self.invariant = self.scalar_values(self.stages.element)

    def scalar_values(self, nodes: list[Node]) -> dict[Value, ir.Value]:
        """The values of the elementwise nodes among `nodes` that only scalar operands and
        constants compute (a bias correction's pow, a learning rate cast to f32), computed
        here, once, instead of at every element: LLVM hoists such a call out of a simple loop,
        but not out of a chunked one, where it may not run in a chunk with no units."""
        scalar = {x for j, x in enumerate(self.node.body.inputs) if j in self.scalars}
        once = []
        for n in nodes:
            if n.opdef.category in (ELEMENTWISE, CONSTANT) and scalar.issuperset(n.inputs):
                once.append(n)
                scalar.update(n.outputs)
        return self.values(once, lambda j: self.i64(0), _NONE)

    def unit(self, u, shape: Instance) -> None:
        """One step of the outer loop: the inner dimensions are loops of their own; in a
        kernel with row reductions, those along a row are its passes' loops (see row)."""
        dims = shape.dims
        if len(dims) <= 1 and not shape.rows:
            self.element([u] if dims else [])
            return
        self.nest(dims, 1, [u], lambda idx: self.row(idx, shape) if shape.rows else
                  self.element(idx), stop=shape.rows or len(dims))

    def nest(self, dims: tuple[int, ...], k: int, idx: list, work, stop: int) -> None:
        """Loops over dims[k:stop], work(idx) inside them."""
        if k == stop:
            work(idx)
            return
        self.loop(self.i64(0), self.i64(dims[k]),
                  lambda j: self.nest(dims, k + 1, idx + [j], work, stop), f"d{k}")

    def row(self, idx: list, shape: Instance) -> None:
        """One row (idx: its index dims): a pass over its elements per level of row
        reductions, each computing only what its reductions need (recomputed from the
        operands, not kept: a row is small and stays in cache), then the row-invariant
        values and "row@r" outputs, once, then the last pass, the elements."""
        body, b, e = self.node.body, self.b, self.e
        dims, strides = shape.dims, shape.strides
        space = tuple(self.node.attrs["spaces"][0])
        r = row_axis(body)
        count = int(np.prod(space[r:], dtype=np.int64))
        known: dict[Value, ir.Value] = dict(self.invariant)
        inputs = set(body.inputs)
        for reds in row_passes(body):
            for m in reds:
                acc = self.row_accs[m]
                b.store(self.reduction_init(m.op, acc.allocated_type), acc)
            nodes = upstream(body, [m.inputs[0] for m in reds], set(known))

            def accumulate(jdx, reds=reds, nodes=nodes):
                env = self.values(nodes, lambda j: self.offset(strides[j], jdx), known,
                                  [m.inputs[0] for m in reds if m.inputs[0] in inputs])
                for m in reds:
                    acc, x = self.row_accs[m], env[m.inputs[0]]
                    x = x if m.op == "max" else self.widen(x)
                    now = b.load(acc, typ=acc.allocated_type)
                    b.store(self.combine(m.op, now, x), acc)

            self.nest(dims, shape.rows, list(idx), accumulate, len(dims))
            for m in reds:
                known[m.out] = self.row_result(m, count)
        operands = [v.type.shape for v in next(instance_rows(self.node, self.lay))]
        invariant = row_invariant(body, operands, space, r)
        nodes = [n for n in self.stages.element if n.out in invariant and n.out not in known]
        known = self.values(nodes, lambda j: self.offset(strides[j], idx), known)
        kinds = self.node.attrs["outputs"]
        mapped = [k for k, kind in enumerate(kinds) if is_mapped(kind)]
        for m, k in enumerate(mapped):
            if kinds[k] != "map":
                out, slot = body.outputs[k], len(body.inputs) + m
                e.store(known[out], self.ptrs[slot], self.offset(strides[slot], idx), out.dtype)
        self.nest(dims, shape.rows, list(idx), lambda jdx: self.element(jdx, known), len(dims))

    def row_result(self, m: Node, count: int) -> ir.Value:
        """A row reduction's accumulator as its body value."""
        acc = self.row_accs[m]
        return self.reduced_value(m.op, self.b.load(acc, typ=acc.allocated_type),
                                  self.i64(count), m.out.dtype)

    def reduced_value(self, op: str, v: ir.Value, count: ir.Value, d) -> ir.Value:
        """An accumulator (f64, i64, or a max in its type) as the body value of a reduction
        of dtype d over `count` elements (a mean divided by it), rounded once to d."""
        b = self.b
        if op == "mean":
            v = b.fdiv(v, b.sitofp(count, F64)) if d.is_float else b.sdiv(v, count)
        t = compute_type(d)
        if v.type == t:
            return v
        if not d.is_float:
            return b.trunc(v, t)
        return self.e.round_to(b.fptrunc(v, t), d)

    def _row_acc_type(self, m: Node) -> ir.Type:
        """max in the element's type; sum and mean in f64 (an integer in i64)."""
        d = m.out.dtype
        return compute_type(d) if m.op == "max" else F64 if d.is_float else I64

    def values(self, nodes: list[Node], offset, known: Mapping[Value, ir.Value],
               reads: Sequence[Value] = ()) -> dict[Value, ir.Value]:  # reads: body inputs
        """`known` and the values of `nodes` (no stores) at one element: a body input loaded
        at `offset(j)` of its pointer (a scalar's as loaded once): those in `reads` first, in
        order, the others when a node reads them."""
        body, e = self.node.body, self.e
        env = dict(known)
        index = {x: j for j, x in enumerate(body.inputs)}

        def get(v: Value) -> ir.Value:
            if v not in env:
                j = index[v]
                env[v] = self.scalars[j] if j in self.scalars else \
                    self.named(e.load(self.ptrs[j], offset(j), v.dtype), v)
            return env[v]

        for v in reads:
            get(v)
        for n in nodes:
            if n.op == "constant":
                env[n.out] = e.const(n.attrs["value"], n.out.dtype)
            else:
                for v in n.inputs:
                    get(v)
                env[n.out] = self.named(self.lower(n, env), n.out)
        return env

    def named(self, x: ir.Value, v: Value) -> ir.Value:
        """x, named after the body value it computes if it is an instruction with the name
        llvmlite gave it (".37"); llvmlite makes a repeated name unique."""
        if isinstance(x, ir.Instruction) and x.name.startswith("."):
            x.name = self.names.get(v, "")
        return x

    def offset(self, strides: tuple[int, ...], idx: list[ir.Value]) -> ir.Value:
        off = self.i64(0)
        for s, i in zip(strides, idx):
            if s:
                off = self.b.add(off, self.b.mul(i, self.i64(s)))
        return off

    def element(self, idx: list[ir.Value], known: Mapping[Value, ir.Value] = _NONE) -> None:
        """The body at one element; `known`: its row's values (row reductions and what only
        they compute), computed already."""
        body, e = self.node.body, self.e
        strides = self.abi.instances[0].strides
        env = self.body_values(lambda j: self.offset(strides[j], idx),
                               {**self.invariant, **known})
        kinds = self.node.attrs["outputs"]
        maps = [k for k, kind in enumerate(kinds) if is_mapped(kind)]
        for m, k in enumerate(maps):
            if kinds[k] != "map":
                continue  # a row's value: stored once per row
            out = body.outputs[k]
            slot = len(body.inputs) + m
            e.store(env[out], self.ptrs[slot], self.offset(strides[slot], idx), out.dtype)
        b, abi = self.b, self.abi
        for r, value in enumerate(self.red_values):
            kind = split_kind(abi.reductions[r])[0]
            if r in self.leading:  # into the block's slot for this element's kept index
                slot = len(body.inputs) + abi.n_maps + self.leading.index(r)
                index = b.add(b.add(self.block_base, self.i64(abi.offsets[r])),
                              self.offset(strides[slot], idx))
                t = self.slot_type(r)
                ptr = b.gep(self.partials, [index], inbounds=True, source_etype=t)
                now = b.load(ptr, typ=t)
                b.store(self.combine(kind, now, self.widen(env[value]), reassoc=False), ptr)
                continue
            acc = b.load(self.accs[r], typ=self.accs[r].allocated_type)
            x = env[value] if kind == "max" else self.widen(env[value])
            b.store(self.combine(kind, acc, x), self.accs[r])

    def body_values(self, offset, known: Mapping[Value, ir.Value] = _NONE
                    ) -> dict[Value, ir.Value]:
        """The body at one element: body input j loaded at `offset(j)` of its pointer (a
        scalar's value as loaded once), its nodes lowered (but those `known`), its stores
        written at the offsets they load from. Each body value's LLVM value."""
        body, st = self.node.body, self.stages
        nodes = [n for n in st.element if n.outputs[0] not in known]
        env = self.values(nodes, offset, known, self.element_inputs)
        for j, n in st.element_stores:
            self.e.store(env[n.inputs[1]], self.ptrs[j], offset(j), body.inputs[j].dtype)
        return env

    @property
    def element_inputs(self) -> list[Value]:
        """The body inputs the element stage reads."""
        return [self.node.body.inputs[j] for j in self.stages.element_inputs]

    def lower(self, n: Node, env: dict[Value, ir.Value]) -> ir.Value:
        rule = LOWERING.get(n.op)
        if rule is None:
            raise LoweringError(f"op {n.op} has no LLVM lowering")
        self.e.in_dtypes = [v.dtype for v in n.inputs]
        v = rule(self.e, *[env[v] for v in n.inputs], **n.attrs)
        return self.e.round_to(v, n.out.dtype) if n.out.dtype.name in ("f16", "bf16") else v

    # -- reductions -----------------------------------------------------------------------------
    def reduction_init(self, kind: str, t: ir.Type) -> ir.Constant:
        if split_kind(kind)[0] == "max":
            return ir.Constant(t, -math.inf) if not isinstance(t, ir.IntType) else \
                ir.Constant(t, -(1 << (t.width - 1)))
        return ir.Constant(t, 0.0 if not isinstance(t, ir.IntType) else 0)

    def combine(self, kind: str, acc: ir.Value, x: ir.Value, reassoc: bool = True) -> ir.Value:
        if kind == "max":
            if isinstance(acc.type, ir.IntType):
                return self.e.maximum(acc, x)
            # llvm.maximum: NaN wins, as in the registry, and the vectorizer makes SIMD code of
            # it (the select of `maximum` keeps a max reduction scalar: a softmax's max pass
            # ran at a third of its sum pass's speed). Of +0 and -0 it takes +0 wherever they
            # lie, where numpy's max takes either, depending on their places.
            return self.e.intrinsic("llvm.maximum", acc, x)
        if isinstance(acc.type, ir.IntType):
            return self.b.add(acc, x)
        add = self.b.fadd(acc, x)
        if reassoc:
            add.flags.append("reassoc")  # lets the vectorizer keep one partial sum per lane
        return add

    def slot_type(self, r: int) -> ir.Type:
        """A partial's type: f64 for floats, i64 for integers (8-byte slots either way)."""
        return F64 if self.red_values[r].dtype.is_float else I64

    def widen(self, x: ir.Value) -> ir.Value:
        """An element in its slot's type: a float in f64, an integer in i64 (exactly)."""
        if isinstance(x.type, ir.IntType):
            if x.type.width == 64:
                return x
            return self.b.zext(x, I64) if x.type.width == 1 else self.b.sext(x, I64)
        return x if x.type == F64 else self.b.fpext(x, F64)

    def to_partial(self, acc: ir.Value) -> ir.Value:
        """Partials are 8-byte slots: f64 for floats; an integer's i64 bits, exactly."""
        if isinstance(acc.type, ir.IntType):
            wide = acc if acc.type.width == 64 else self.b.sext(acc, I64)
            return self.b.bitcast(wide, F64)
        return acc if acc.type == F64 else self.b.fpext(acc, F64)


def generate(node: Node, fastmath: bool = False, strided: Strided = {}
             ) -> tuple[ir.Module, KernelABI]:
    """The LLVM module for a kernel node (a row kernel's: rowcodegen.py), and how to call it;
    `strided`: as for plan."""
    abi = plan(node, fastmath, strided=strided)
    for out in node.body.outputs:
        if not isinstance(out.type, TensorType):
            raise LoweringError("a kernel output must be a tensor")
    if node.op == ROW_KERNEL:
        from .rowcodegen import RowBuilder
        return RowBuilder(node, abi, fastmath).build(), abi
    return _Builder(node, abi, fastmath).build(), abi


__all__ = ["generate", "plan", "KernelABI", "Instance", "BLOCK_ELEMENTS"]
