"""The LLVM runtime: runs a graph with compiled kernels, updating parameters in place.

Each kernel node was compiled to native code at build time (or loaded from the disk cache).
The nodes run in the loop the interpreter runs them in (backends/base.py): it calls the native
kernels and the products the BLAS can compute where their operands lie (gemm.py), and runs
every other node (shape ops, a kernel whose op has no lowering) through numpy. A kernel's
stores write the parameter buffers directly: no new tensor, no copy (the point of in-place
updates). So that this stays invisible to the step:
  - a numpy result that views a parameter stored in place (a reshape, a transpose) and is
    read once the store has run is copied when made, so it keeps the value it was made from;
    which values can be read that late is decided from the schedule when the program is
    made (a transpose of a weight that only the backward's matmuls read is not copied);
  - if anything that could fail runs after a kernel has stored, the stored parameters are
    backed up first and put back on failure: a step that fails changes nothing.
Large kernels and products split their work over the machine's cores, on the graph sink's
pool (graphsink.py); ctypes calls drop the GIL.
Collectives are numpy nodes like the others: they run one at a time, on the caller's thread,
in the graph's order of them (the schedule moves a node only behind what it depends on, and
each collective depends on the one before), and a step that has one is never a graph-sink
step. What they return is their own (numpy allocates it: no planned buffer).
"""
from __future__ import annotations

import bisect
import ctypes
import functools
import math
import operator
import os
import time
from dataclasses import dataclass, field
from typing import Collection, Sequence

import numpy as np

from ... import diskcache, envvars, memory
from ...errors import ExecutionError, LoweringError
from ...ir import blas
from ...ir import kernel as kernel_ir
from ...ir.analysis import run_order, view_source
from ...ir.graph import Graph, Node, Value
from ...ir.printer import value_names
from ...ir.registry import writes_into
from ...ir.types import TensorType, contiguous_strides
from ..base import NodeLoop, gather
from . import engine, gemm, graphsink, memplan
from .abi import KernelABI, canonical_text, flags, plan
from .engine import KernelFn
from .target import Target, selected
from .vectorwidth import kernel_vector_width, widest_vector

PARALLEL_MIN_ELEMENTS = 1 << 17  # below this, a second thread costs more than it saves
CHUNK_ELEMENTS = 1 << 16  # what a graph-sink thread claims at a time (graphsink.py)


def threads() -> int:
    return envvars.threads()


# Operands a kernel reads where they lie in another value's memory: operand -> (base,
# offset, strides), in elements (see _views).
Views = dict[int, tuple[Value, int, tuple[int, ...]]]


@dataclass
class NativeKernel:
    """A kernel node compiled to a function, with what introspection shows of it."""

    node: Node
    abi: KernelABI
    fastmath: bool
    key: str
    key_parts: dict[str, str] = field(repr=False)  # (the CPU's features: once, in `target`)
    compile_seconds: float
    cache_hit: bool
    optimized_ir: str = field(repr=False)  # empty when the object code came from the cache
    target: Target = field(repr=False)
    fn: object = field(repr=False)  # the native function
    finish_fn: object = field(repr=False)  # its finisher (kernels with reductions), or None
    views: Views = field(default_factory=dict)
    calls: int = 0
    _module: object = field(default=None, repr=False)
    # graphsink's `call`: the function, called alone, with its arguments from a Record.
    call: object = field(default=None, repr=False)
    sink: graphsink.Sink | None = field(default=None, repr=False)  # runs a split call

    @property
    def lines(self) -> str:
        """The user's source lines fused into it ("step.py:8-9")."""
        return kernel_ir.source_lines(self.node)

    @property
    def module(self):
        """The LLVM module as generated (made again on demand after a cache hit)."""
        if self._module is None:
            from .codegen import generate
            self._module = generate(self.node, self.fastmath, _strided(self.node, self.views))[0]
        return self._module

    @property
    def ir_text(self) -> str:
        return str(self.module)

    @property
    def name(self) -> str:
        return self.abi.name

    def asm(self) -> str:
        return engine.assembly(self.module, self.target)

    def optimized(self) -> str:
        """The optimised LLVM IR (made again when the object code came from the cache)."""
        return self.optimized_ir or str(engine.optimize(self.module, self.target))

    @property
    def threads(self) -> int:
        return self._threads

    @threads.setter
    def threads(self, n: int) -> None:
        """The thread count (the program sets it from GRAPHOPT_THREADS once a step); a call's
        unit ranges are worked out when it changes, not at every call."""
        self._threads = n
        self._ranges = self.splits()
        self._record.word1, self._record.word2 = self._ranges[0]

    def splits(self) -> list[tuple[int, int]]:
        """Unit ranges, one per thread (of `self.threads`, which the program sets from
        GRAPHOPT_THREADS once a step); reductions split only at block edges."""
        n = min(self.threads, max(1, self._elements // PARALLEL_MIN_ELEMENTS))
        if n not in self._splits:
            self._splits[n] = self._split(n)
        return self._splits[n]

    def chunks(self) -> list[int]:
        """The edges of the chunks the graph sink's threads claim (graphsink.py): about
        CHUNK_ELEMENTS each, a kernel too small to split in one chunk; a reduction's at block
        edges (its partials are per block, so its bits do not depend on who ran which)."""
        n = len(self.splits())
        count = 1 if n == 1 else max(n, min(self.abi.total_units,
                                            self._elements // CHUNK_ELEMENTS))
        ranges = self._split(count)
        return [a for a, _ in ranges] + [b for _, b in ranges[-1:]] or [0]

    def _split(self, n: int) -> list[tuple[int, int]]:
        total = self.abi.total_units
        if n == 1:
            return [(0, total)]
        # (where each instance's units start: a cut is moved to a block edge of its instance)
        starts = [inst.unit_offset for inst in self.abi.instances] if self.abi.reductions \
            else None
        cuts = [0]
        for t in range(1, n):
            u = total * t // n
            if starts:
                u = self._block_edge(u, starts)
            cuts.append(max(cuts[-1], u))
        cuts.append(total)
        return [(a, b) for a, b in zip(cuts, cuts[1:]) if a < b]

    def _block_edge(self, u: int, starts: list[int]) -> int:
        """The block edge nearest to unit u (u < total units) in the instance it falls in."""
        inst = self.abi.instances[bisect.bisect_right(starts, u) - 1]
        local = u - inst.unit_offset
        return inst.unit_offset + min(inst.units, round(local / inst.block_units)
                                      * inst.block_units)

    def __post_init__(self) -> None:
        node = self.node
        self._has_token = kernel_ir.layout(node).has_token
        # The value each operand is read from (a view's base) and where in it, in bytes.
        self.sources = [self.views[i][0] if i in self.views else v
                        for i, v in enumerate(node.inputs)]
        self._gather = gather(self.sources)
        self._offsets = [self.views[i][1] * v.dtype.itemsize if i in self.views else 0
                         for i, v in enumerate(node.inputs)]
        # Where each mapped output goes: (instance, body output) -> a new array per call.
        kinds = node.attrs.get("outputs", ())  # (a row kernel has none)
        self._maps = [(i, k, kernel_ir.output_shape(kind, space), r.dtype.np_dtype)
                      for i, space in enumerate(node.attrs["spaces"])
                      for k, (kind, r) in enumerate(zip(kinds, node.body.outputs))
                      if kernel_ir.is_mapped(kind)]
        # Reduced outputs: (instance, body output, shape, dtype), one slot each after the maps.
        self._reduced = [(i, k, kernel_ir.reduced_shape(kind, space), r.dtype.np_dtype)
                         for i, space in enumerate(node.attrs["spaces"])
                         for k, (kind, r) in enumerate(zip(kinds, node.body.outputs))
                         if not kernel_ir.is_mapped(kind)]
        n = len(node.inputs) + len(self._maps) + len(self._reduced)
        self._args = (ctypes.c_void_p * max(1, n))()  # the pointer table, reused every call
        # An array's buffer never moves while the array lives (numpy refuses to resize an
        # array something else references, and `_seen` does), so a pointer is taken only
        # when an operand is a different array than last time: parameter buffers never are,
        # and gradients often are the same buffers step after step.
        self._seen: list[object] = [None] * len(node.inputs)
        # Operands the Executable did not check before the step (it checks the graph inputs
        # kernels read directly): made inside the step, or an argument read through a view,
        # which numpy accepts in any layout. The runtime makes them contiguous for each call.
        # A row kernel's rows come first: the call reads their indices (coalesce made them
        # contiguous int64).
        self._lead = kernel_ir.layout(node).lead
        self._unchecked = [(i, v, v.dtype.np_dtype) for i, v in enumerate(self.sources)
                           if (not v.is_input or i in self.views) and i >= self._lead]
        self._elements = sum(math.prod(space) for space in node.attrs["spaces"])
        # Reduction blocks' partial results: one buffer per kernel, reused every call, made
        # by the first (compiling a kernel too large to run, to look at it, needs none).
        self._partials: np.ndarray | None = None
        self._splits: dict[int, list[tuple[int, int]]] = {}
        self._tables: dict[int, graphsink.Table] = {}  # a split call's, by thread count
        self._planned: list[list[np.ndarray | None]] | None = None  # see use_planned
        # A call on one thread, and the finisher's, as records (function, units, pointer
        # table, partials; graphsink.Record): their units are set with the thread count,
        # their partials when made.
        table = ctypes.addressof(self._args)
        self._record = graphsink.Record(self.address, 0, 0, table, 0)
        self._finish_record = graphsink.Record(_address(self.finish_fn), 0, 1, table, 0)
        self.threads = threads()

    def use_planned(self, buffers: dict[Value, np.ndarray]) -> None:
        """Write the outputs into these buffers of the memory plan, every call: their
        pointers go into the table once, and no call allocates."""
        # Operands in the plan are contiguous and aligned by construction: no check per call.
        self._unchecked = [c for c in self._unchecked if c[1] not in buffers]
        outputs = self.node.outputs
        per = len(self.node.body.outputs)
        if not per:
            return
        rows: list[list[np.ndarray | None]] = [[None] * per for _ in self.node.attrs["spaces"]]
        base = len(self.node.inputs)
        for slot, (i, k) in enumerate([(i, k) for i, k, *_ in self._maps]
                                      + [(i, k) for i, k, *_ in self._reduced]):
            out = rows[i][k] = buffers[outputs[i * per + k]]
            self._args[base + slot] = memory.address(out)
        self._planned = rows
        self._planned_results = [a for row in rows for a in row] + \
            ([None] if self._has_token else [])  # (callers read it, never change it)

    @property
    def _partials_ptr(self) -> int:
        if self._partials is None:
            self.make_partials()
        return self._partials_address

    def make_partials(self) -> None:
        """Make the buffer of the reductions' partial results, if not yet (once)."""
        if self._partials is None:
            n = max(1, self.abi.total_blocks * self.abi.slots)
            try:
                self._partials = np.empty(n, np.float64)
            except MemoryError:
                raise ExecutionError(f"kernel {self.name}: its reductions need {8 * n} bytes "
                                     f"of partial results, more than there is memory for; "
                                     f"no parameter was changed") from None
            self._partials_address = self._partials.ctypes.data
            self._record.word4 = self._finish_record.word4 = self._partials_address

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        rows = self.prepare(arrays)
        if self._partials is None:
            self.make_partials()
        if len(self._ranges) == 1:
            self.call(self._record)  # (self.fn(*ranges[0], self._args, partials), quicker)
        else:  # its chunks, claimed by this thread and the sink pool's (graphsink.py)
            graphsink.run(self.sink, self._table())
        return self.finish(rows)

    def _table(self) -> graphsink.Table:
        """A one-kernel table for the graph sink at this thread count (made once each):
        products and kernels run on one pool, whose threads claim chunks of the work."""
        n = self._threads
        if n not in self._tables:
            self._tables[n] = graphsink.table(self.rows()[:1])
        return self._tables[n]

    def rows(self) -> list[graphsink.Row]:
        """Its steps of a kernel table at the present thread count: its chunks, then (with
        reductions) its finisher on one thread, which combines the partials in order."""
        table = ctypes.addressof(self._args)
        rows = [graphsink.Row(self.address, table, self._partials_ptr, self.chunks(),
                              len(self.splits()))]
        if self.finish_fn is not None:
            rows.append(graphsink.Row(_address(self.finish_fn), table, self._partials_ptr,
                                      [0, 1], 1))
        return rows

    def run_in(self, env: dict) -> list[np.ndarray]:
        """A call on the env's values (a step the graph sink cannot run). Graph inputs were
        checked before the step: parameters are owned, contiguous buffers; the arguments
        native code reads, by the Executable."""
        return self.run(self.operands(env))

    def operands(self, env: dict) -> Sequence[np.ndarray]:
        """The arrays to call with: each operand's, or its view's base, C-contiguous."""
        arrays = self._gather(env)
        if not (self._lead or self._unchecked):
            return arrays
        arrays = list(arrays)
        for i in range(self._lead):
            arrays[i] = arrays[i].indices
        for i, v, dtype in self._unchecked:
            a = arrays[i]
            flags = a.flags if type(a) is np.ndarray else None
            if flags is None or not (flags.c_contiguous and flags.aligned) or a.dtype != dtype:
                arrays[i] = _contiguous(a, v)
        return arrays

    def prepare(self, arrays: list[np.ndarray]) -> list[list[np.ndarray | None]]:
        """Fill the pointer table for a call: the operands, and new arrays for the mapped
        outputs (returned, instance by instance)."""
        args, seen, offsets = self._args, self._seen, self._offsets
        if not all(map(operator.is_, arrays, seen)):  # in C: thousands of operands, same as before
            for i, a in enumerate(arrays):
                if a is not seen[i]:
                    seen[i] = a
                    args[i] = memory.address(a) + offsets[i]
        if self._planned is not None:
            return self._planned
        outputs = len(self.node.body.outputs)
        if not outputs:  # a kernel that only stores: nothing to allocate
            return []
        rows: list[list[np.ndarray | None]] = [[None] * outputs
                                               for _ in self.node.attrs["spaces"]]
        base = len(self.node.inputs)
        for slot, (i, k, shape, dtype) in enumerate(self._maps):
            out = rows[i][k] = np.empty(shape, dtype)
            args[base + slot] = memory.address(out)
        base += len(self._maps)
        for slot, (i, k, shape, dtype) in enumerate(self._reduced):
            out = rows[i][k] = np.empty(shape, dtype)
            args[base + slot] = memory.address(out)
        return rows

    def finish(self, rows: list[list[np.ndarray | None]], combined: bool = False
               ) -> list[np.ndarray]:
        """The call's results, once the native code has run; `combined`: the reductions'
        partial results were combined already (the sink runs the finisher itself)."""
        self.calls += 1
        if self.finish_fn is not None and not combined:
            self.make_partials()  # (once: it puts their address in the record)
            self.call(self._finish_record)
        if rows is self._planned:  # the same buffers every call: the list made once
            return self._planned_results
        results = [a for row in rows for a in row]
        return results + ([None] if self._has_token else [])  # type: ignore[list-item]

    @property
    def address(self) -> int:
        return _address(self.fn)


@dataclass
class Fallback:
    """A kernel the backend could not compile (an op with no lowering): numpy runs it."""

    node: Node
    reason: str


def _strided(node: Node, views: Views) -> dict[int, tuple[int, ...]]:
    """The strides of the operands read as views whose layout is not their own C order (the
    others differ only in where they start, which the pointer says)."""
    def differs(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
        return any(n != 1 and s != c for n, s, c in zip(shape, strides,
                                                         contiguous_strides(shape)))
    return {i: strides for i, (_, _, strides) in views.items()
            if differs(node.inputs[i].shape, strides)}


def compile_kernel(node: Node, fastmath: bool, use_cache: bool, views: Views | None = None
                   ) -> NativeKernel:
    """Load the kernel's object code from the cache, or generate and compile it (and cache
    it). A cache hit needs only the kernel's plan: no LLVM IR is built. `views`: operands it
    reads where they lie in another value's memory (see _views)."""
    (k,) = compile_kernels([(node, views or {})], fastmath, use_cache)
    if isinstance(k, LoweringError):
        raise k
    return k


@dataclass
class _Build:
    """A kernel on its way to a NativeKernel: its plan and cache key, and its addresses once
    loaded (its module when it was generated here: a cache miss)."""

    node: Node
    views: Views
    abi: KernelABI
    parts: dict[str, str]
    key: str
    seconds: float
    addresses: list[int] | None = None
    module: object = None
    optimized: str = ""
    error: LoweringError | None = None

    def native(self, fastmath: bool, target: Target, use_cache: bool) -> NativeKernel:
        fns = [KernelFn(a) for a in self.addresses or ()]
        return NativeKernel(self.node, self.abi, fastmath, self.key, self.parts, self.seconds,
                            self.module is None, self.optimized, target, fns[0],
                            fns[1] if self.abi.finisher else None, self.views,
                            _module=self.module, call=graphsink.sink(use_cache).call,
                            sink=graphsink.sink(use_cache))


def compile_kernels(kernels: Sequence[tuple[Node, Views]], fastmath: bool, use_cache: bool
                    ) -> list[NativeKernel | LoweringError]:
    """compile_kernel of each (node, views), or the LoweringError that says why it has no
    code path. The kernels the cache does not have are compiled together, in a helper
    process too when there are several and threads to spare (engine.compile_modules); a
    kernel made twice in one program is compiled once."""
    target = selected()  # TargetError, before anything is compiled, if this host cannot run it
    made: list[_Build | LoweringError] = []
    first: dict[str, _Build] = {}  # the kernels to compile, by key
    for node, views in kernels:
        start = time.perf_counter()
        try:
            strided = _strided(node, views)
            text = canonical_text(node, strided)
            abi = plan(node, fastmath, text, strided)
            parts = {"kernel": text, "flags": flags(fastmath), **engine.target_parts(target)}
            k = _Build(node, views, abi, parts, diskcache.make_key(parts), 0.0)
            if k.key not in first:
                k.addresses = engine.cached(k.key, parts, _names(abi), target, use_cache)
                if k.addresses is None:
                    from .codegen import generate  # the IR builder: loaded on a miss only
                    k.module, k.abi = generate(node, fastmath, strided)
                    first[k.key] = k
        except LoweringError as e:
            made.append(e)
            continue
        k.seconds = time.perf_counter() - start
        made.append(k)
    compiled = engine.compile_modules([k.module for k in first.values()], target,
                                      helper=threads() > 1)
    for k, c in zip(first.values(), compiled):
        start = time.perf_counter()
        try:  # (linker.check: a symbol that does not resolve is an error, not a crash)
            k.addresses = engine.store_and_load(k.key, k.parts, _names(k.abi), target,
                                                c.object_code, use_cache)
        except LoweringError as e:
            k.error = e
        k.seconds += c.seconds + time.perf_counter() - start
        k.optimized = c.optimized_ir
    out: list[NativeKernel | LoweringError] = []
    for k in made:
        if isinstance(k, _Build) and k.addresses is None:  # compiled once, under its key
            source = first[k.key]
            k.addresses, k.error = source.addresses, source.error
        out.append(k if isinstance(k, LoweringError) else
                   k.error or k.native(fastmath, target, use_cache))
    return out


def _names(abi: KernelABI) -> tuple[str, ...]:
    return (abi.name, *filter(None, [abi.finisher]))


class Segment:
    """Consecutive nodes that run natively, kernels and products, as one call of the graph
    sink: the pointer tables of all of them first (their outputs exist before anything
    runs: planned buffers, or arrays made for the call), then one table of their steps on
    the pool's threads, each step after the one before (graphsink.SINK_IR), instead of a
    call, a publish and a wait in Python per node. The numpy nodes between segments run in
    Python, in order. A step in which numpy must run one of its products (the BLAS cannot
    read its operands where they lie: gemm.py) runs the segment node by node."""

    def __init__(self, nodes: list[Node], parts: list[NativeKernel | gemm.NativeProduct],
                 sink: graphsink.Sink):
        self.nodes, self.parts, self.sink = nodes, parts, sink
        self.outputs = [v for n in nodes for v in n.outputs]
        self._tables: dict[int, graphsink.Table] = {}  # by thread count

    def run_in(self, env: dict[Value, object]) -> list[object]:
        """The values of `outputs`, made in one native call (see the class's doc)."""
        prepared = []
        for node, part in zip(self.nodes, self.parts):
            if isinstance(part, NativeKernel):
                rows = part.prepare(part.operands(env))
                env.update(zip(node.outputs, [a for row in rows for a in row]))
                prepared.append(rows)
            elif part.ready(env):
                env[node.out] = part.out
                prepared.append(None)
            else:
                return [x for n, p in zip(self.nodes, self.parts)
                        for x in _ran(n, p.run_in(env), env)]
        graphsink.run(self.sink, self._table())
        made: list[object] = []
        for part, rows in zip(self.parts, prepared):
            if rows is None:
                part.calls += 1
                made.append(part.out)
            else:
                made += part.finish(rows, combined=True)
        return made

    def _table(self) -> graphsink.Table:
        n = self.parts[0].threads  # (the program sets every part's when it changes)
        if n not in self._tables:
            self._tables[n] = graphsink.table([r for p in self.parts for r in p.rows()])
        return self._tables[n]

    def describe(self, names: dict[Value, str]) -> str:
        return (f"one native call runs {', '.join(names[n.outputs[0]] for n in self.nodes)} "
                f"in order (graph sink)")


def _ran(node: Node, values: list, env: dict[Value, object]) -> list:
    """A node's values, put in env too (the next node of a segment run node by node reads
    them)."""
    env.update(zip(node.outputs, values))
    return values


def _segments(nodes: list[Node], native: dict[int, object], sink: graphsink.Sink
              ) -> list[Segment]:
    """The runs of two or more consecutive nodes that run natively."""
    runs: list[list[Node]] = [[]]
    for n in nodes:
        if id(n) in native:
            runs[-1].append(n)
        elif runs[-1]:
            runs.append([])
    return [Segment(r, [native[id(n)] for n in r], sink) for r in runs if len(r) > 1]


class LLVMProgram:
    """A graph ready to run: native kernels, numpy for the rest."""

    def __init__(self, graph: Graph, *, fastmath: bool = False, cache: bool = True):
        self.graph = graph
        self.kernels: list[NativeKernel] = []
        self.fallbacks: list[Fallback] = []
        self.native: dict[int, NativeKernel] = {}
        self.nodes = run_order(graph)  # what the return reaches: what dce would keep
        storers = _storers(self.nodes)
        kernels = [(node, _views(node, at, storers)) for at, node in enumerate(self.nodes)
                   if node.body is not None]
        for (node, _), k in zip(kernels, compile_kernels(kernels, fastmath, cache)):
            if isinstance(k, LoweringError):
                self.fallbacks.append(Fallback(node, k.message))
                continue
            self.kernels.append(k)
            self.native[id(node)] = k
        self.stored = {v for k in self.kernels for v in kernel_ir.written(k.node)}
        self.nodes = _unread_views_dropped(self.nodes, self.native, graph)
        # Graph inputs that native code reads as they are: the arguments that must be
        # C-contiguous and aligned (others go through numpy, which takes any layout).
        self.native_inputs = {v for k in self.kernels for v in k.node.inputs if v.is_input}
        # The graph sink: when every node is a kernel compiled here, the whole step is one
        # native call per thread (see graphsink.SINK_IR), on the threads of its pool (a
        # one-kernel step too: those threads start sooner than the executor's).
        self.sink = bool(self.kernels) and all(id(n) in self.native for n in self.nodes)
        # What can fail runs before the first in-place store where the graph allows it; a
        # failure after one must be undone, so the parameters stored before the last node
        # that could fail are backed up when the step starts (a fully native step: none).
        self.nodes = _stores_last(self.nodes, self.native)
        self._sink = graphsink.sink(cache) if self.sink else None
        self._sink_tables: dict[int, graphsink.Table] = {}  # by thread count
        self.plan = self._plan()
        self.buffers = self.plan.buffers
        self._threads = threads()
        # A numpy result that views a parameter a kernel stores in place must keep its value
        # only if something reads it once that store has run: decided here, from the schedule.
        self.read_late = _read_late(self.nodes, self.native, graph, self._reads, self.buffers)
        self.copies = _copies(self.nodes, self.native, self.read_late)
        # The products the BLAS computes where their operands lie (a weight's transpose read in
        # the weight, its view not made), cut into pieces that the sink's threads claim as
        # they claim kernels' chunks (gemm.py).
        self.products = gemm.products(self.nodes, self.buffers,
                                      {*self.buffers, *graph.params}, _storers(self.nodes),
                                      cache, self._threads)
        self.nodes = _unread_views_dropped(self.nodes, {**self.native, **self.products}, graph)
        # (after the plan: a kernel that writes into planned buffers allocates nothing)
        may_fail = [i for i, n in enumerate(self.nodes) if self._may_fail(n)]
        self.backed_up = [v for n in self.nodes[:max(may_fail, default=0)]
                          if id(n) in self.native for v in kernel_ir.written(n)]
        self.needs_backup = bool(self.backed_up)
        self._backups: dict[Value, np.ndarray] | None = None  # their copies, reused each step
        self._partials_made = False  # (kernels called one by one: made by the first step)
        # Runs of kernels and products between numpy nodes: one native call each.
        native = {**self.native, **self.products}
        self.segments = [] if self.sink else _segments(self.nodes, native, graphsink.sink(cache))
        # The numpy nodes and native calls as closures, made once (base.NodeLoop); node by
        # node too, for node_times.
        loop = functools.partial(NodeLoop, self.nodes, native=native,
                                 stored=self.stored if self.read_late else (),
                                 keep=self.read_late, into=self.buffers)
        self._loop = loop(groups={id(s.nodes[0]): s for s in self.segments})
        self._node_loop = loop()
        # Outputs that are stored parameters themselves keep their value from before the step.
        self._early = [v for v in graph.outputs if v in self.stored]
        # A graph-sink step whose kernels read every operand where it lies (no copy made for a
        # call) needs its pointer tables filled again only when a graph input is another
        # array than the last step's: _sink_inputs takes the graph inputs the kernels read out
        # of a step's inputs (base.gather), _sink_seen holds the last step's.
        self._sink_inputs = gather(list(dict.fromkeys(
            v for k in self.kernels for v in k.sources if v.is_input))) \
            if self.sink and not any(k._unchecked for k in self.kernels) else None
        self._sink_seen: tuple[np.ndarray, ...] | None = None  # (None: no step ran yet)
        self._sink_made: dict[Value, object] = {}

    def _reads(self, node: Node) -> list[Value]:
        k = self.native.get(id(node))
        return k.sources if k is not None else node.operands()

    def _plan(self) -> memplan.MemoryPlan:
        """Buffers for what the kernels and the numpy nodes that can write into an array
        make; the kernels are told theirs."""
        planned, unplanned = [], []
        for n in self.nodes:
            if id(n) in self.native:
                planned += [v for v in n.outputs if isinstance(v.type, TensorType)]
            elif n.body is None and n.opdef.view is None and not n.opdef.has_effect:
                into = len(n.outputs) == 1 and writes_into(n.opdef, [v.type for v in n.inputs])
                (planned if into else unplanned).extend(n.outputs)
        p = memplan.plan(self.nodes, self._reads, self.graph, planned, unplanned)
        for k in self.kernels:
            k.use_planned(p.buffers)
        return p

    def _may_fail(self, node: Node) -> bool:
        """Whether running this node could raise: anything numpy runs (a MemoryError, if
        nothing else), and a kernel called one by one that allocates: outputs outside the
        memory plan, or a copy of an operand numpy made in another layout (its reductions'
        partial results are made before the first step's first node); not what the registry
        says cannot (OpDef.may_raise: assign, depend)."""
        k = self.native.get(id(node))
        if k is not None:
            return not self.sink and (bool(node.body.outputs) and k._planned is None or
                                      bool(k._unchecked))
        return node.opdef.may_raise

    @property
    def copy_reasons(self) -> list[tuple[Value, str]]:
        """Each value copied when made, with why (the memory report shows them)."""
        return [(v, f"it views @{p.name}, which a kernel stores in place before the value's "
                    f"last read") for v, p in self.copies]

    @property
    def native_calls(self) -> int:
        """Native calls a step makes on each thread: 1 with the graph sink over the whole
        step; else one per segment, and one per kernel or product outside them."""
        if self.sink:
            return 1
        grouped = sum(len(s.nodes) for s in self.segments)
        return len(self.segments) + len(self.kernels) + len(self.products) - grouped

    def listing(self, kind: str = "llvm") -> str:
        """Every compiled kernel as `llvm` (optimised IR), `llvm-raw` (as generated) or `asm`;
        and the kernels that run through numpy, with the reason."""
        comment = "#" if kind == "asm" else ";"
        show = {"llvm": NativeKernel.optimized, "llvm-raw": lambda k: k.ir_text,
                "asm": NativeKernel.asm}[kind]
        if not self.kernels:
            nothing = "nothing compiled: the graph has no kernel node that compiles (the " \
                "fuse pass makes them)"
            parts = [f"{comment} {nothing}"]
        else:  # the target once: every kernel of a program is compiled for the same
            t = self.kernels[0].target
            parts = [f"{comment} target {t.triple}, cpu {t.cpu}, features {t.features}"]
        names = value_names(self.graph)
        for k in self.kernels:
            text = show(k)
            width = (f", vector width {kernel_vector_width(k.node, k.target)}, widest vector "
                     f"{widest_vector(text)}" if kind == "llvm" else "")
            made = "cached" if k.cache_hit else f"compiled in {k.compile_seconds * 1e3:.1f} ms"
            lines = f" from {k.lines}" if k.lines else ""
            results = ", ".join(names[v] for v in k.node.outputs)
            parts.append(f"{comment} {results} = kernel{lines}: function {k.name} (cache key "
                         f"{k.key[:16]}, {made}{width})\n{text}")
        parts += [f"{comment} runs through numpy: {f.reason}" for f in self.fallbacks]
        parts += [f"{comment} {names[p.out_value]} = matmul: {p.describe()}"
                  for p in self.products.values()]
        parts += [f"{comment} {s.describe(names)}" for s in self.segments]
        return "\n".join(parts)

    def run(self, inputs: dict[Value, np.ndarray]) -> tuple[list[np.ndarray],
                                                            dict[str, np.ndarray]]:
        """Run one step: the graph's outputs, and the new values of the parameters that
        numpy computed (kernels store theirs in place). If a node fails, the parameters
        stored in place so far are put back before the error propagates."""
        n = threads()  # read once a step: the environment is slow to read, kernel by kernel
        if n != self._threads:
            for k in [*self.kernels, *self.products.values()]:
                k.threads = n
            self._threads = n
        # An output that is a stored parameter itself keeps its value from before the step.
        early = {v: inputs[v].copy() for v in self._early}
        if self.sink:
            made = self._run_sink(inputs)
            return [early[v] if v in early else made[v] if v in made else inputs[v]
                    for v in self.graph.outputs], {}
        env: dict[Value, object] = dict(inputs)
        if not self._partials_made:  # (a MemoryError here is before any store)
            for k in self.kernels:
                k.make_partials()
            self._partials_made = True
        if self._backups is None:  # (made once: a step allocates nothing for them)
            self._backups = {v: np.empty_like(inputs[v]) for v in self.backed_up}
        for v, saved in self._backups.items():
            saved[...] = inputs[v]  # (numpy's copyto costs twice this on a bias's 32 floats)
        try:
            with blas.one_thread:  # (what `matmul` means, and the pieces run on one pool)
                updates = self._loop(env)
        except BaseException:
            for v, saved in self._backups.items():
                np.copyto(inputs[v], saved)
            raise
        return [early.get(v, env[v]) for v in self.graph.outputs], updates

    def node_times(self, inputs: dict[Value, np.ndarray]) -> list[float]:
        """One step run node by node, each timed: seconds per node of `self.nodes`. Kernels
        store into the parameter arrays of `inputs` (pass copies to keep the Parameters);
        nothing is committed. What a whole step takes beyond their sum is the loop's cost."""
        env: dict[Value, object] = dict(inputs)
        times = []
        with blas.one_thread:
            for i in range(len(self.nodes)):
                start = time.perf_counter()
                self._node_loop(env, slice(i, i + 1))
                times.append(time.perf_counter() - start)
        return times

    def _run_sink(self, inputs: dict[Value, np.ndarray]) -> dict[Value, object]:
        """Every kernel in one native call per thread: pointer tables first (outputs are
        allocated before anything runs), then the sink, then the reductions; the values the
        kernels made. The pointer tables are filled only when they may have changed (see
        _sink_inputs): the kernels' outputs are then their planned buffers, as last step."""
        if self._sink_inputs is not None:
            seen = self._sink_inputs(inputs)
            if self._sink_seen is not None and all(map(operator.is_, seen, self._sink_seen)):
                for k in self.kernels:
                    k.calls += 1
                self.sink_call()
                return self._sink_made
        env = dict(inputs)
        pending = []
        for node in self.nodes:
            k = self.native[id(node)]
            rows = k.prepare(k.operands(env))
            env.update(zip(node.outputs, [a for row in rows for a in row]))
            pending.append((node, k, rows))
        self.sink_call()
        made = {}
        for node, k, rows in pending:
            made.update(zip(node.outputs, k.finish(rows, combined=True)))
        if self._sink_inputs is not None:  # (what every step makes until an input changes)
            self._sink_seen, self._sink_made = seen, made
        return made

    def sink_call(self) -> None:
        """The sink over the kernel table as last prepared: on this thread, and on the
        pool's threads (graphsink.py) when the table is split."""
        graphsink.run(self._sink, self._sink_table())

    def _sink_table(self) -> graphsink.Table:
        """The table of every kernel of the step (graphsink.SINK_IR), on the threads of its
        most split kernel. Made once per thread count (the step's, as `run` read it: reading
        the environment again costs more than a small step's native call)."""
        n = self._threads
        if n not in self._sink_tables:
            self._sink_tables[n] = graphsink.table(
                [r for node in self.nodes for r in self.native[id(node)].rows()])
        return self._sink_tables[n]


def _contiguous(a: np.ndarray, v: Value) -> np.ndarray:
    """Native code reads C-contiguous buffers of exactly the compiled type, aligned."""
    a = np.asarray(a)
    if not a.flags.c_contiguous or a.dtype != v.dtype.np_dtype or \
            a.ctypes.data % a.dtype.alignment:
        a = np.ascontiguousarray(a, dtype=v.dtype.np_dtype)
    assert a.shape == v.shape, (a.shape, v.shape)
    return a


def _address(fn: object) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def _storers(nodes: list[Node]) -> dict[Value, list[int]]:
    """For each parameter a kernel may store in place, the positions of those kernels."""
    out: dict[Value, list[int]] = {}
    for at, n in enumerate(nodes):
        if n.body is not None:
            for v in kernel_ir.written(n):
                out.setdefault(v, []).append(at)
    return out


def _views(node: Node, at: int, storers: dict[Value, list[int]]) -> Views:
    """The operands of a kernel (of one iteration space) that it can read where they lie: each
    made by views of a base (ir.analysis.view_source) that no kernel up to this one stores in
    place. The order survives _stores_last, which never moves a store before a node that
    preceded it."""
    if kernel_ir.layout(node).instances != 1 or node.op == kernel_ir.ROW_KERNEL:
        return {}  # (a row kernel reads its operands whole)
    views = {}
    for i, v in enumerate(node.inputs):
        base, offset, strides = view_source(v)
        if base is not v and all(p > at for p in storers.get(base, ())):
            views[i] = (base, offset, strides)
    return views


def _unread_views_dropped(nodes: list[Node], native: dict[int, NativeKernel], graph: Graph
                          ) -> list[Node]:
    """The nodes without the views nothing reads any more (the kernels and products that used
    them read their bases in place): in a step of kernels and such views, the graph sink runs
    all. An `after` edge to a view does not keep it: a view has no effect to wait for, and
    its readers' own order is the schedule's."""
    needed = set(graph.returned())
    kept = []
    for n in reversed(nodes):
        if n.body is None and n.opdef.view is not None and not n.after and \
                needed.isdisjoint(n.outputs):
            continue
        kept.append(n)
        k = native.get(id(n))
        needed.update(k.sources if k is not None else n.inputs)
    return kept[::-1]


def _read_late(nodes: list[Node], native: dict[int, NativeKernel], graph: Graph,
               reads, planned: Collection[Value]) -> set[Value]:
    """The values numpy makes that something reads when or after a store they could see
    runs, by the lifetimes the memory plan uses (memplan.lifetimes: a view's readers count as
    its base's; returned and assigned values are read at the end, the commit). Only these
    can see a store through a view, so only these are copied when they view a stored
    parameter (base.NodeLoop checks what they view as they are made: the fewer, the cheaper
    a step). A numpy result is new memory or its operands' (a view, an input passed
    through), so the stores it could see are those of the parameters it is computed from
    through numpy nodes alone: a weight's transpose read by the backward's matmuls before
    the weight's update needs no copy, whatever bias was stored before; a value computed
    from the memory plan's buffers (a kernel's output) sees none."""
    by_numpy = [n for n in nodes if id(n) not in native and not n.opdef.has_effect]
    first = {v: min(at) for v, ats in _storers(nodes).items()  # the compiled kernels' stores
             if (at := [i for i in ats if id(nodes[i]) in native])} if by_numpy else {}
    if not first:
        return set()
    earliest, never = min(first.values()), len(nodes) + 1
    seen: dict[Value, int] = {}  # the first store a numpy result could see

    def seen_by(v: Value) -> int:
        if v in planned:
            return never
        return first.get(v, never) if v.is_input else seen.get(v, earliest)
    for n in by_numpy:
        at = min(map(seen_by, n.inputs), default=never)
        seen.update((v, at) for v in n.outputs)
    life = memplan.lifetimes(nodes, reads, graph)
    return {v for v, at in seen.items()  # a token holds no data
            if isinstance(v.type, TensorType) and v not in planned and life[v][1] >= at}


def _copies(nodes: list[Node], native: dict[int, NativeKernel], read_late: set[Value]
            ) -> list[tuple[Value, Value]]:
    """(value, parameter) for each numpy view of a parameter stored in place that is read
    after the store, so it is copied when made: the plan the memory report shows."""
    stored = {v for n in nodes if id(n) in native for v in kernel_ir.written(n)}
    out = []
    for v in read_late:
        base = view_source(v)[0]
        if base is not v and base in stored:
            out.append((v, base))
    order = {v: i for i, n in enumerate(nodes) for v in n.outputs}
    return sorted(out, key=lambda c: order[c[0]])


def _stores_last(nodes: list[Node], native: dict[int, NativeKernel]) -> list[Node]:
    """The nodes in an order that runs everything that needs no in-place store before the
    first one (each part in graph order: a node that reads a parameter's old value comes
    before the store anyway, and one that reads a store's result after it). Ordered nodes
    (collectives) keep their order: one that goes to the second part takes every later one
    with it, since each depends on the one before. A kernel's reads are its sources: the
    bases of the views it reads in place (those views' nodes are gone from `nodes`)."""
    later: set[int] = set()
    made_later: set[Value] = set()
    for n in nodes:
        k = native.get(id(n))
        reads = [*k.sources, *n.after] if k is not None else n.operands()
        if k is not None and kernel_ir.written(n) or any(v in made_later for v in reads):
            later.add(id(n))
            made_later.update(n.outputs)
    return [n for n in nodes if id(n) not in later] + [n for n in nodes if id(n) in later]


def compile(graph: Graph, *, fastmath: bool = False, cache: bool = True) -> LLVMProgram:
    """Compile every kernel node of the graph for the selected target, or load its object
    code from the disk cache, and return the program that runs the graph with them.

    Args:
        graph: the graph after the passes.
        fastmath: fast-math flags in the kernels (part of each cache key).
        cache: False neither loads from nor stores into the disk cache.

    Raises:
        TargetError: a GRAPHOPT_CPU or GRAPHOPT_CPU_FEATURES that LLVM does not know or this
            host cannot run.
    """
    return LLVMProgram(graph, fastmath=fastmath, cache=cache)
