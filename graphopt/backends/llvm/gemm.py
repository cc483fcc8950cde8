"""Products on graphopt's threads: a matmul runs as pieces of its matrices (rows or columns)
that the graph sink's threads claim (graphsink.py), each piece one single-threaded call of
numpy's BLAS gemm.

Why not numpy's own call: OpenBLAS runs a product on its own pool of threads, which spin
for a while after each product; graphopt's kernels run on the sink's threads right after
the products that feed them, so two pools shared two cores, and on a shared machine the
BLAS's threads, which wait for each other at barriers, collapsed (a product 4x slower on
two threads than on one under load). Its threaded driver is also slow on some shapes of a
training step (a 1024x256 @ 256x1024 product: 10.4 ms on two threads, 6.9 on one). Here
one pool runs products and kernels, and a thread that comes late finds the pieces taken.

What it computes is what `matmul` means (ir/blas.py): each matrix's product on one BLAS
thread. A piece gives the same bits as the whole product when it stays on the BLAS's
general path: at least SPLIT_MIN_WORK multiply-adds and a multiple of PIECE_ALIGN rows or
columns (its small-matrix kernels, below 100^3 multiply-adds in OpenBLAS, and gemv compute
in another order). Whether cutting keeps the bits is checked once per process on the
library found (`split_is_exact`, with pieces of SPLIT_MIN_WORK among its probes); where it
does not (OpenBLAS's f64 kernels do not), each matrix's product is one piece.

A product runs here when numpy would call gemm for it: f32 or f64, at least 2 rows, 2
columns and 2 terms, operands of at most one batch axis that the BLAS reads where they lie
(one unit stride, the other at least the row's length: numpy's test), into its planned
buffer, and the operands are not the same memory (numpy's A @ A.T is a syrk). Otherwise
the node runs through numpy (blas.matmul): the same product, without the split.
"""
from __future__ import annotations

import ctypes
import functools
import math
from typing import Collection, Mapping, NamedTuple, Sequence

import numpy as np

from ... import memory
from ...ir import blas
from ...ir.analysis import view_source
from ...ir.graph import Node, Value
from ..base import gather
from . import graphsink
from .engine import runtime_functions

SPLIT_MIN_WORK = 1 << 20  # multiply-adds a piece must have (the BLAS's small-matrix bound: 10^6)
PIECE_ALIGN = 16  # pieces start at multiples of this many rows or columns
GEMM_NAMES = {np.dtype(np.float32): "graphopt_gemm_f32_v1",
              np.dtype(np.float64): "graphopt_gemm_f64_v1"}

# The words of a product's argument table (i64 each), which the native function reads.
WORDS = ("fn", "a", "b", "c", "m", "n", "k", "lda", "ldb", "ldc", "ta", "tb", "rows",
         "piece", "per_matrix", "extent", "da", "db", "dc", "sa", "sb", "sc")

# void gemm(i64 lo, i64 hi, ptr words, ptr unused): units [lo, hi) of a product, a unit being
# one piece of one matrix: matrix u / per_matrix, piece u % per_matrix, `piece` rows (if
# `rows`) or columns long (the last one up to `extent`). Each is a gemm call on pointers
# moved by the piece's start times da, db, dc bytes and by the matrix times sa, sb, sc.
# The signature of a kernel's, so the sink calls it like one.
GEMM_IR = """
define void @{name}(i64 %lo, i64 %hi, ptr %w, ptr %unused) {{
entry:
{loads}
  br label %head
head:
  %u = phi i64 [ %lo, %entry ], [ %u1, %body ]
  %more = icmp slt i64 %u, %hi
  br i1 %more, label %body, label %done
body:
  %mat = udiv i64 %u, %per_matrix
  %p = urem i64 %u, %per_matrix
  %start = mul i64 %p, %piece
  %end0 = add i64 %start, %piece
  %short = icmp slt i64 %extent, %end0
  %end = select i1 %short, i64 %extent, i64 %end0
  %len = sub i64 %end, %start
  %by.rows = icmp ne i64 %rows, 0
  %mm = select i1 %by.rows, i64 %len, i64 %m
  %nn = select i1 %by.rows, i64 %n, i64 %len
{pointers}
{ints}
  call void %fn.f(i32 {order}, i32 %ta.i, i32 %tb.i, {int} %mm.i, {int} %nn.i, {int} %k.i,
                  {float} 1.0, ptr %pa, {int} %lda.i, ptr %pb, {int} %ldb.i, {float} 0.0,
                  ptr %pc, {int} %ldc.i)
  %u1 = add i64 %u, 1
  br label %head
done:
  ret void
}}
"""


def _gemm_ir(dtype: np.dtype, int64: bool) -> str:
    loads = []
    for i, w in enumerate(WORDS):
        loads.append(f"  %{w}.p = getelementptr i64, ptr %w, i64 {i}")
        loads.append(f"  %{w} = load i64, ptr %{w}.p")
    loads.append("  %fn.f = inttoptr i64 %fn to ptr")
    pointers = []
    for x in "abc":
        pointers += [f"  %{x}.m = mul i64 %mat, %s{x}", f"  %{x}.s = mul i64 %start, %d{x}",
                     f"  %{x}.o = add i64 %{x}.m, %{x}.s",
                     f"  %{x}.base = inttoptr i64 %{x} to ptr",
                     f"  %p{x} = getelementptr i8, ptr %{x}.base, i64 %{x}.o"]
    int_t = "i64" if int64 else "i32"
    ints = [f"  %{v}.i = trunc i64 %{v} to i32" for v in ("ta", "tb")]
    for v in ("mm", "nn", "k", "lda", "ldb", "ldc"):
        ints.append(f"  %{v}.i = {'add i64 0, ' if int64 else 'trunc i64 '}%{v}"
                    + ("" if int64 else " to i32"))
    return GEMM_IR.format(name=GEMM_NAMES[dtype], loads="\n".join(loads),
                          pointers="\n".join(pointers), ints="\n".join(ints), int=int_t,
                          float="float" if dtype == np.float32 else "double",
                          order=blas.ROW_MAJOR)


@functools.cache
def functions(int64: bool, use_cache: bool = True) -> dict[np.dtype, int]:
    """The native gemm drivers' addresses, per dtype (compiled once per process, cached on
    disk like the sink)."""
    text = "\n".join(_gemm_ir(d, int64) for d in GEMM_NAMES)
    return dict(zip(GEMM_NAMES, runtime_functions(text, tuple(GEMM_NAMES.values()),
                                                   use_cache)))


def matrix_layout(shape: tuple[int, ...], strides: tuple[int, ...], size: int, batch: int
                  ) -> tuple[int, int, int] | None:
    """(transposed, leading dimension, bytes from one matrix to the next) of an operand of
    this shape and strides (bytes) in a product of `batch` matrices, or None if the BLAS
    cannot read it where it lies."""
    if len(shape) == 2:
        step = 0
    elif len(shape) == 3 and shape[0] in (1, batch):
        step = strides[0] if shape[0] > 1 else 0
    else:
        return None
    found = layout(shape[-2:], strides[-2:], size)
    return None if found is None else (*found, step)


def layout(shape: tuple[int, ...], strides: tuple[int, ...], size: int
           ) -> tuple[int, int] | None:
    """(transposed, leading dimension) of a matrix as the BLAS reads it, numpy's way
    (is_blasable2d: row-major first), or None if it cannot read it where it lies."""
    rows, cols = shape
    s0, s1 = strides
    if s1 == size and s0 % size == 0 and s0 // size >= cols:
        return blas.NO_TRANS, s0 // size
    if s0 == size and s1 % size == 0 and s1 // size >= rows:
        return blas.TRANS, s1 // size
    return None


class Read(NamedTuple):
    """How a product reads an operand: the value whose array it takes (`source`), and when
    that is a contiguous buffer the operand views (a weight, for its transpose), where in it
    the operand lies, known when the program is made: its offset (bytes), shape and strides
    (elements). Without a view (`strides` None) the array is the operand itself, its layout
    looked at whenever it is another array than the last call's."""

    source: object
    offset: int = 0
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] | None = None


class NativeProduct:
    """A matmul run as BLAS pieces on the sink's threads (see the module's doc): its operands
    are read as `reads` say from a step's values, its result goes into `out`."""

    def __init__(self, reads: Sequence[Read], k: int, out: np.ndarray, lib: blas.Blas,
                 exact: bool, use_cache: bool, threads: int, by_rows: bool | None = None,
                 out_value: Value | None = None):
        self.reads = list(reads)
        self.sources = [r.source for r in reads]  # what it reads of a step's values
        self._gather = gather(self.sources)
        self.out_value = out_value  # (the node's result, which listings name)
        self.out, self.dtype, self.k = out, out.dtype, k
        self.m, self.n = out.shape[-2:]
        self.batch = _batch(out.shape)
        self._words = (ctypes.c_int64 * len(WORDS))()
        self._word = {w: i for i, w in enumerate(WORDS)}
        # The axis a product is cut along: the one whose other operand is the larger, which
        # each piece packs whole (rows: all of B; columns: all of A).
        self.by_rows = self.m >= self.n if by_rows is None else by_rows
        self.extent = self.m if self.by_rows else self.n
        self.exact = exact
        self._driver = functions(lib.int64, use_cache)[self.dtype]
        self._set(fn=lib.gemm[self.dtype], c=out.ctypes.data,
                  m=self.m, n=self.n, k=k, ldc=self.n, sc=self.m * self.n * out.itemsize,
                  rows=int(self.by_rows), extent=self.extent)
        self._seen: tuple[object, object] = (None, None)
        self._numpy = False  # this call's operands are not the BLAS's: numpy runs it
        self._sink = graphsink.sink(use_cache)
        self._tables: dict[int, graphsink.Table] = {}
        self.calls = 0
        self.threads = threads

    def describe(self) -> str:
        """What a listing says of it: the BLAS call, and how a call is cut."""
        fn = {4: "sgemm", 8: "dgemm"}[self.out.itemsize]
        per = -(-self.extent // self._words[self._word["piece"]])
        cut = (f"{per} pieces of {self._words[self._word['piece']]} "
               f"{'rows' if self.by_rows else 'columns'}" if per > 1 else "uncut")
        why = "" if self.exact else " (cutting it would change its bits with this BLAS)"
        return (f"{self.batch} x [{self.m}, {self.k}] @ [{self.k}, {self.n}], numpy's BLAS "
                f"{fn} on graphopt's threads, each matrix {cut}{why}, "
                f"{self._threads} thread{'s' * (self._threads > 1)}")

    def _set(self, **words: int) -> None:
        for w, v in words.items():
            self._words[self._word[w]] = v

    def piece(self, threads: int) -> int:
        """The rows (or columns) of a piece on this many threads: pieces enough to give each
        thread one when the matrices are fewer than the threads, each one exact (see the
        module's doc); the whole extent if the product is not cut."""
        want = -(-threads // self.batch)
        if not self.exact or want < 2:
            return self.extent
        other = self.n if self.by_rows else self.m
        shortest = max(PIECE_ALIGN, -(-SPLIT_MIN_WORK // (other * self.k)))
        for pieces in range(want, 1, -1):
            piece = -(-(-(-self.extent // pieces)) // PIECE_ALIGN) * PIECE_ALIGN
            last = self.extent - (-(-self.extent // piece) - 1) * piece
            if min(piece, last) >= shortest:
                return piece
        return self.extent

    @property
    def threads(self) -> int:
        return self._threads

    @threads.setter
    def threads(self, n: int) -> None:
        """The thread count (set by the program once a step when it changes): how the
        product is cut, and its table for the sink."""
        self._threads = n
        piece = self.piece(n)
        per_matrix = -(-self.extent // piece)
        self._set(piece=piece, per_matrix=per_matrix)
        units = self.units = self.batch * per_matrix
        if n not in self._tables:
            self._tables[n] = graphsink.table(self.rows())

    def rows(self) -> list[graphsink.Row]:
        """Its step of a kernel table at the present thread count: one unit (a piece of a
        matrix) a claim."""
        return [graphsink.Row(self._driver, ctypes.addressof(self._words), 0,
                              range(self.units + 1), min(self._threads, self.units))]

    def ready(self, env: dict[Value, object]) -> bool:
        """Whether the BLAS reads this step's operands where they lie: its argument table then
        holds them (numpy runs the product otherwise)."""
        a, b = self._gather(env)
        if a is not self._seen[0] or b is not self._seen[1]:
            self._prepare(a, b)
        return not self._numpy

    def run_in(self, env: dict[Value, object]) -> list[np.ndarray]:
        if not self.ready(env):
            return [blas.matmul(*self._operands(*self._gather(env)), self.out)]
        self.calls += 1
        graphsink.run(self._sink, self._tables[self._threads])
        return [self.out]

    def _operands(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """The operands as arrays: a view read where it lies made again from its buffer."""
        return [x if r.strides is None else
                np.ndarray(r.shape, self.dtype, x, r.offset,
                           tuple(s * self.out.itemsize for s in r.strides))
                for r, x in zip(self.reads, arrays)]

    def _prepare(self, a: np.ndarray, b: np.ndarray) -> None:
        """The argument table for these arrays, or numpy's product if the BLAS cannot read
        them where they lie (see the module's doc)."""
        self._seen = (a, b)
        size = self.out.itemsize
        (la, pa), (lb, pb) = (self._matrix(r, x) for r, x in zip(self.reads, (a, b)))
        self._numpy = la is None or lb is None or pa == pb
        if self._numpy:
            return
        (ta, lda, sa), (tb, ldb, sb) = la, lb
        # Bytes from one row (or column) of C to the next, and what A and B move by for it.
        if self.by_rows:
            da, db, dc = (size if ta == blas.TRANS else lda * size), 0, self.n * size
        else:
            da, db, dc = 0, (ldb * size if tb == blas.TRANS else size), size
        self._set(a=pa, b=pb, lda=lda, ldb=ldb, ta=ta, tb=tb, sa=sa, sb=sb, da=da, db=db,
                  dc=dc)

    def _matrix(self, r: Read, x: object) -> tuple[tuple[int, int, int] | None, int]:
        """(transposed, leading dimension, bytes from one matrix to the next) of an operand,
        or None if the BLAS cannot read it as it lies; and its first element's address."""
        if type(x) is not np.ndarray or x.dtype != self.dtype:
            return None, 0
        if r.strides is not None:  # (its buffer: a parameter's or the memory plan's)
            address = memory.address(x) + r.offset
            return matrix_layout(r.shape, tuple(s * x.itemsize for s in r.strides),
                                 x.itemsize, self.batch), address
        address = x.ctypes.data
        if address % x.dtype.alignment:
            return None, address
        return matrix_layout(x.shape, x.strides, x.itemsize, self.batch), address


def _batch(shape: tuple[int, ...]) -> int:
    return shape[0] if len(shape) == 3 else 1


def eligible(node: Node, planned: dict[Value, np.ndarray]) -> bool:
    """Whether a node is a matmul this module can run (by its types; each call checks its
    arrays): see the module's doc."""
    if len(node.inputs) != 2 or len(node.outputs) != 1 or node.out not in planned:
        return False
    a, b = node.inputs
    out = node.out.type
    dtype = out.dtype.np_dtype
    if dtype not in GEMM_NAMES or a.dtype.np_dtype != dtype or b.dtype.np_dtype != dtype:
        return False
    if not (2 <= len(a.shape) <= 3 and 2 <= len(b.shape) <= 3 and
            len(out.shape) == max(len(a.shape), len(b.shape))):
        return False
    m, n, k = out.shape[-2], out.shape[-1], a.shape[-1]
    return min(m, n, k) >= 2 and max(m, n, k) < 1 << 31


@functools.cache
def split_is_exact(path: str, dtype: np.dtype, use_cache: bool = True) -> bool:
    """Whether cutting a product into pieces (as NativeProduct cuts it) gives the bits of the
    whole product on one thread, for the BLAS at `path`: products of random operands cut in
    two, by rows and by columns, each operand as it lies and transposed, against numpy's
    product on one thread; one product large, one whose pieces have just SPLIT_MIN_WORK
    multiply-adds (the smallest a cut makes). Once per process and dtype (a few ms)."""
    lib = blas.library()
    assert lib is not None and lib.path == path
    rng = np.random.default_rng(0)
    # (409: a multiple of no unroll, cut in pieces of 208 and 201; 160 in two of 80, each of
    # 80 x 160 x 82 multiply-adds: SPLIT_MIN_WORK and a little more)
    for m, n, k in ((409, 409, 203), (160, 160, -(-SPLIT_MIN_WORK // (80 * 160)))):
        for ta, tb in ((False, False), (True, True), (False, True), (True, False)):
            a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
            b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
            a, b = (a.T if ta else a), (b.T if tb else b)
            whole = blas.matmul(a, b)
            for by_rows in (True, False):
                out = np.full_like(whole, np.nan)
                p = NativeProduct((Read("a"), Read("b")), k, out, lib, True, use_cache, 2,
                                  by_rows)
                if p.units < 2:
                    return False
                with blas.one_thread:
                    p.run_in({"a": a, "b": b})
                if not np.array_equal(out, whole):
                    return False
    return True


def products(nodes: Sequence[Node], planned: Mapping[Value, np.ndarray],
             buffers: Collection[Value], stored_at: Mapping[Value, list[int]],
             use_cache: bool, threads: int) -> dict[int, NativeProduct]:
    """NativeProducts for the matmul nodes among `nodes` that can run here (none without a
    BLAS this module drives): node id -> product. An operand that views a contiguous buffer
    (`buffers`: the parameters and the memory plan's) is read where it lies in it, as a
    kernel reads one, if no kernel stores into that buffer up to the product (`stored_at`:
    the positions of the kernels that store each parameter); its view is then not made."""
    lib = blas.library()
    if lib is None:
        return {}
    out = {}
    for at, n in enumerate(nodes):
        if n.op == "matmul" and eligible(n, planned):
            dtype = n.out.type.dtype.np_dtype
            reads = []
            for v in n.inputs:
                base, offset, strides = view_source(v)
                in_place = base in buffers and all(p > at for p in stored_at.get(base, ())) \
                    and matrix_layout(v.shape, tuple(s * dtype.itemsize for s in strides),
                                      dtype.itemsize, _batch(n.out.shape)) is not None
                reads.append(Read(base, offset * dtype.itemsize, v.shape, strides)
                             if in_place and base is not v else Read(v))
            exact = split_is_exact(lib.path, dtype, use_cache)
            out[id(n)] = NativeProduct(reads, n.inputs[0].shape[-1], planned[n.out], lib,
                                       exact, use_cache, threads, out_value=n.out)
    return out
