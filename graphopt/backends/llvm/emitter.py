"""The Emitter: element-level LLVM IR for the ops of a kernel body.

The lowering table (lowering.py) says how each op computes one element (a function of an
Emitter and the op's operand values); the Emitter gives it the primitives, chosen by the
operand's LLVM type: `e.add(x, y)` is `fadd` for floats and `add` for integers.

Values in a body are in their *compute* type: f64 as double, f32, f16 and bf16 as float (f16
and bf16 are loaded, computed in f32 and rounded when stored, as the issue asks), i32 and i64
as integers, bool as i1. `load`/`store` convert between the storage type and the compute type.

Floating-point flags: none by default, so every +, -, *, /, sqrt, comparison, select and cast
rounds exactly as numpy's does (IEEE 754, one rounding per op; f16 and bf16 results are
rounded after each op, as numpy does): an optimizer update gives the interpreter's bits.
Not even `contract`: fusing a multiply-add would round once instead of twice, and these
kernels are bound by memory, not by arithmetic. exp, log, log1p and tanh of f32 and f64 are
inline polynomials (mathfns.py), within the few ulp docs/llvm.md states, with the same bits at
every CPU level; pow, sin and cos come from the C math library (sin and cos may differ from
numpy's in the last bit; pow is what the interpreter calls too: graphopt/ir/libm.py).
`fastmath=True` puts `fast` on every float
instruction the emitter makes (not on mathfns's, whose rounding trick needs exact IEEE
arithmetic).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from llvmlite import ir

from ...errors import LoweringError
from ...ir.types import DType
from . import mathfns

F32, F64 = ir.FloatType(), ir.DoubleType()
I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
HALF = ir.HalfType()
PTR = ir.PointerType()


def compute_type(d: DType) -> ir.Type:
    return {"f64": F64, "f32": F32, "f16": F32, "bf16": F32, "i64": I64, "i32": I32,
            "bool": I1}[d.name]


def storage_type(d: DType) -> ir.Type:
    return {"f64": F64, "f32": F32, "f16": HALF, "bf16": I16, "i64": I64, "i32": I32,
            "bool": I8}[d.name]


def _is_float(v: ir.Value) -> bool:
    return isinstance(v.type, (ir.FloatType, ir.DoubleType))


class Emitter:
    """Primitives for lowering rules, on one IRBuilder."""

    def __init__(self, builder: ir.IRBuilder, module: ir.Module, fastmath: bool = False):
        self.b = builder
        self.module = module
        self.flags: tuple[str, ...] = ("fast",) if fastmath else ()
        self.in_dtypes: list[DType] = []  # the dtypes of the operands of the op being lowered
        # f32 values rounded to bf16 here -> their 16 bits: rounding one again (an op's result
        # is rounded after the op, then when stored) is the same bits, so it is not emitted
        # again (LLVM cannot see that it is; in an update storing two bf16 moments, the
        # repeats were half the loop's instructions).
        self.bf16_bits: dict[ir.Value, ir.Value] = {}

    # -- helpers ----------------------------------------------------------------------------
    def _f(self, instr: ir.Instruction) -> ir.Instruction:
        instr.flags.extend(self.flags)
        return instr

    def intrinsic(self, name: str, *args: ir.Value) -> ir.Value:
        t = args[0].type
        fn = self.module.declare_intrinsic(name, [t], ir.FunctionType(t, [t] * len(args)))
        call = self.b.call(fn, list(args))
        if _is_float(args[0]) and self.flags:
            call.fastmath = set(self.flags)  # type: ignore[attr-defined]
        return call

    def const(self, value: Any, dtype: DType) -> ir.Constant:
        t = compute_type(dtype)
        if dtype.is_float:
            # Round to the dtype first: an f16 constant holds an f16 value, computed in f32.
            return ir.Constant(t, float(np.asarray(value).astype(dtype.np_dtype)))
        if dtype.name == "bool":
            return ir.Constant(I1, int(bool(value)))
        return ir.Constant(t, int(value))

    def like(self, x: ir.Value, value: float) -> ir.Constant:
        return ir.Constant(x.type, value if _is_float(x) else int(value))

    # -- arithmetic -------------------------------------------------------------------------
    def add(self, x, y):
        return self._f(self.b.fadd(x, y)) if _is_float(x) else self.b.add(x, y)

    def sub(self, x, y):
        return self._f(self.b.fsub(x, y)) if _is_float(x) else self.b.sub(x, y)

    def mul(self, x, y):
        return self._f(self.b.fmul(x, y)) if _is_float(x) else self.b.mul(x, y)

    def div(self, x, y):
        if not _is_float(x):
            raise LoweringError("integer division is not an op of graphopt")
        return self._f(self.b.fdiv(x, y))

    def neg(self, x):
        return self._f(self.b.fneg(x)) if _is_float(x) else self.b.sub(self.like(x, 0), x)

    def abs(self, x):
        if _is_float(x):
            return self.intrinsic("llvm.fabs", x)
        return self.b.select(self.b.icmp_signed("<", x, self.like(x, 0)), self.neg(x), x)

    def sign(self, x):
        zero, one = self.like(x, 0), self.like(x, 1)
        if _is_float(x):  # +0 for 0 and -0, NaN for NaN, like numpy
            pos = self.b.fcmp_ordered(">", x, zero)
            neg = self.b.fcmp_ordered("<", x, zero)
            rest = self.b.select(self.b.fcmp_unordered("uno", x, x), x, zero)
            return self.b.select(pos, one, self.b.select(neg, self.like(x, -1), rest))
        pos = self.b.zext(self.b.icmp_signed(">", x, zero), x.type)
        neg = self.b.zext(self.b.icmp_signed("<", x, zero), x.type)
        return self.b.sub(pos, neg)

    def sqrt(self, x):
        return self.intrinsic("llvm.sqrt", x)

    def exp(self, x):
        return self.math("exp", x)

    def log(self, x):
        return self.math("log", x)

    def sin(self, x):
        return self.intrinsic("llvm.sin", x)

    def cos(self, x):
        return self.intrinsic("llvm.cos", x)

    def tanh(self, x):
        return self.math("tanh", x)

    def log1p(self, x):
        return self.math("log1p", x)

    def math(self, name: str, x):
        """exp, log, log1p or tanh of f32 or f64, inline (mathfns.py: no call, so the loop
        vectorizes)."""
        return mathfns.FUNCTIONS[name](self.b, x)

    def pow(self, x, y):
        if not _is_float(x):
            raise LoweringError("integer power is not compiled; its kernel runs through numpy")
        if self.flags:  # fast-math: LLVM may rewrite pow(x, 0.5) as sqrt, and so on
            return self.intrinsic("llvm.pow", x, y)
        # The C library's pow, called as written (LLVM would fold constants with the
        # compiling machine's pow), but where y is 2, -1 or 0.5 the one exact operation, as
        # the interpreter does (graphopt/ir/libm.py): chosen here for a constant y, by
        # selects for one known at run time.
        exact = {2.0: lambda: self.b.fmul(x, x),
                 -1.0: lambda: self.b.fdiv(ir.Constant(x.type, 1.0), x),
                 0.5: lambda: self.intrinsic("llvm.sqrt", x)}
        if isinstance(y, ir.Constant) and y.constant in exact:  # no call left behind
            return exact[y.constant]()
        name = "pow" if x.type == F64 else "powf"
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(x.type, [x.type, x.type]), name)
            for attr in ("nobuiltin", "readnone", "nounwind"):  # (errno is not read: as
                fn.attributes.add(attr)  # llvm.pow) so LICM hoists a loop-invariant call
        out = self.b.call(fn, [x, y])
        for c, value in exact.items():
            out = self.b.select(self.b.fcmp_ordered("==", y, ir.Constant(y.type, c)), value(), out)
        return out

    def maximum(self, x, y):
        return self._extremum(">", x, y)

    def minimum(self, x, y):
        return self._extremum("<", x, y)

    def _extremum(self, op: str, x, y):
        """x where it wins or is NaN, else y: the registry's maximum/minimum (of +0 and -0,
        the second; llvm.maximum would order -0 below +0)."""
        if not _is_float(x):
            return self.b.select(self.b.icmp_signed(op, x, y), x, y)
        wins = self.b.or_(self.b.fcmp_ordered(op, x, y), self.b.fcmp_unordered("uno", x, x))
        return self.b.select(wins, x, y)

    # -- comparisons and logic --------------------------------------------------------------
    def compare(self, op: str, x, y):
        if _is_float(x):  # ordered compares are false on NaN; != is the unordered one
            return self.b.fcmp_unordered(op, x, y) if op == "!=" else \
                self.b.fcmp_ordered(op, x, y)
        if x.type == I1:
            return self.b.icmp_unsigned(op, x, y)
        return self.b.icmp_signed(op, x, y)

    def isfinite(self, x):
        if not _is_float(x):
            return ir.Constant(I1, 1)
        return self.b.fcmp_ordered("<", self.abs(x), self.like(x, math.inf))

    def and_(self, x, y):
        return self.b.and_(x, y)

    def or_(self, x, y):
        return self.b.or_(x, y)

    def not_(self, x):
        return self.b.xor(x, ir.Constant(I1, 1))

    def select(self, c, x, y):
        return self.b.select(c, x, y)

    # -- conversions ------------------------------------------------------------------------
    def cast(self, x, src: DType, dst: DType):
        """numpy's astype: floats to ints truncate toward zero; NaN and values out of range
        give the most negative integer, as numpy does on x86 (cvttsd2si); anything to bool is
        `!= 0` (NaN is true)."""
        b, to = self.b, compute_type(dst)
        if dst.name == "bool":
            return self.compare("!=", x, self.like(x, 0))
        if _is_float(x) and isinstance(to, ir.IntType):
            low = ir.Constant(x.type, -float(2 ** (to.width - 1)))
            high = ir.Constant(x.type, float(2 ** (to.width - 1)))
            fits = b.and_(b.fcmp_ordered(">=", x, low), b.fcmp_ordered("<", x, high))
            # fptosi is only defined in range: select keeps its poison out of the result.
            safe = b.select(fits, x, ir.Constant(x.type, 0.0))
            return b.select(fits, b.fptosi(safe, to), ir.Constant(to, -(1 << (to.width - 1))))
        if x.type == I1:
            return b.uitofp(x, to) if to in (F32, F64) else b.zext(x, to)
        if isinstance(x.type, ir.IntType) and to in (F32, F64):
            v = b.sitofp(x, to)
        elif isinstance(x.type, ir.IntType):
            v = x if x.type == to else (b.sext(x, to) if to.width > x.type.width
                                        else b.trunc(x, to))
        elif dst.name == "f16" and x.type == F64:  # rounded once, as numpy's astype rounds
            return b.fpext(b.fptrunc(x, HALF), F32)
        elif x.type != to:
            v = b.fpext(x, to) if to == F64 else b.fptrunc(x, to)
        else:
            v = x
        return self.round_to(v, dst)

    def round_to(self, v, d: DType):
        """A float computed in f32 rounded to f16 or bf16 precision (still held as f32)."""
        if d.name == "f16":
            return self.b.fpext(self.b.fptrunc(v, HALF), F32)
        if d.name == "bf16" and v not in self.bf16_bits:
            bits = self.f32_to_bf16(v)
            v = self.bf16_to_f32(bits)
            self.bf16_bits[v] = bits
        return v

    # -- memory -----------------------------------------------------------------------------
    def load(self, ptr, offset, d: DType):
        t = storage_type(d)
        raw = self.b.load(self.b.gep(ptr, [offset], inbounds=True, source_etype=t), typ=t)
        if d.name == "f16":
            return self.b.fpext(raw, F32)
        if d.name == "bf16":
            return self.bf16_to_f32(raw)
        if d.name == "bool":
            return self.b.icmp_unsigned("!=", raw, ir.Constant(I8, 0))
        return raw

    def store(self, value, ptr, offset, d: DType) -> None:
        t = storage_type(d)
        if d.name == "f16":
            value = self.b.fptrunc(value, HALF)
        elif d.name == "bf16":
            value = self.f32_to_bf16(value)
        elif d.name == "bool":
            value = self.b.zext(value, I8)
        self.b.store(value, self.b.gep(ptr, [offset], inbounds=True, source_etype=t))

    def prefetch(self, ptr, offset, d: DType, write: bool = False) -> None:
        """Ask for the cache line holding element `offset` of a `d` array at `ptr` (the address
        may lie past the array's end: a prefetch never faults); `write`: to be written."""
        t = storage_type(d)
        fn = self.module.declare_intrinsic(
            "llvm.prefetch.p0", (), ir.FunctionType(ir.VoidType(), [PTR, I32, I32, I32]))
        rw, keep_in_all_levels, data = (ir.Constant(I32, k) for k in (int(write), 3, 1))
        self.b.call(fn, [self.b.gep(ptr, [offset], source_etype=t), rw, keep_in_all_levels,
                         data])

    def bf16_to_f32(self, raw):
        bits = self.b.shl(self.b.zext(raw, I32), ir.Constant(I32, 16))
        return self.b.bitcast(bits, F32)

    def f32_to_bf16(self, v):
        """Round to nearest even, NaN kept quiet (what ml_dtypes and numpy's bf16 do)."""
        if v in self.bf16_bits:
            return self.bf16_bits[v]
        b = self.b
        bits = b.bitcast(v, I32)
        lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
        rounded = b.lshr(b.add(bits, b.add(ir.Constant(I32, 0x7FFF), lsb)), ir.Constant(I32, 16))
        quiet_nan = b.or_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 0x40))
        is_nan = b.fcmp_unordered("uno", v, v)
        return b.trunc(b.select(is_nan, quiet_nan, rounded), I16)
