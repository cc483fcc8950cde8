"""How many lanes a kernel's loop gets at a target: what explain and the listing show.

codegen writes one element per iteration and LLVM's loop vectorizer chooses the width: the
target's vector register width divided by the widest type in the loop, which is the widest
compute type of the kernel's values (f16 and bf16 compute in f32) or of its accumulators
(a sum over leading axes or along a row adds in f64). f16 kernels are the exception: LLVM
may take more lanes than shown on its own (twice as many, for the 16-bit loads; one of only
+ - * / it computes in f16, exactly as f32 rounded to f16 would). The register width is LLVM's own answer for the target, read from
a probe loop it vectorizes (once per target), so nothing here re-lists CPUs or features;
tests/test_vectorwidth.py checks the prediction against the optimised IR of real kernels.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from llvmlite import ir

from ...ir.graph import Node
from ...ir.kernel import body_reductions, finish_reductions, is_mapped, split_kind, stages
from ...ir.types import DType, TensorType, to_dtype
from .emitter import compute_type
from .engine import optimize
from .target import Target, selected

_VECTOR = re.compile(r"<(\d+) x (float|double|half|bfloat|i\d+)>")
_BITS = {"float": 32, "double": 64, "half": 16, "bfloat": 16}
_NAMES = {"float": "f32", "double": "f64"}


@dataclass(frozen=True)
class VectorWidth:
    """lanes x element at target: `8 x f32 at x86-64-v3`; lanes 1 is scalar code."""

    lanes: int
    element: str  # the widest compute type, as graphopt names dtypes
    target: str

    def __str__(self) -> str:
        return f"{self.lanes} x {self.element} at {self.target}"


def widest_vector(llvm_ir: str) -> str:
    """The widest vector type in (optimised) LLVM IR, by bits, floats before integers of the
    same width (`<8 x float>` with AVX2), or "none" where nothing was vectorized."""
    best, name = (0, 0), "none"
    for lanes, elem in sorted(set(_VECTOR.findall(llvm_ir))):
        bits = int(lanes) * _BITS.get(elem, int(elem[1:]) if elem[0] == "i" else 0)
        if (bits, elem in _BITS) > best:
            best, name = (bits, elem in _BITS), f"<{lanes} x {elem}>"
    return name


def kernel_vector_width(node: Node, target: Target | None = None) -> VectorWidth:
    """The vector width LLVM gives this kernel node's loop at the target (the selected one
    by default)."""
    target = target or selected()
    widest = max(_compute_bits(d) for d in _loop_dtypes(node))
    element = next(d for d in _loop_dtypes(node) if _compute_bits(d) == widest)
    name = "f32" if element.name in ("f16", "bf16") else element.name
    return VectorWidth(max(1, register_bits(target) // widest), name, str(target))


def _loop_dtypes(node: Node) -> list[DType]:
    """The dtypes of the kernel's values, then of its accumulators: a sum or mean (full, over
    leading axes or along a row) adds in f64 (i64 for integers), a max in its own type."""
    body = node.body
    # (a finish stage runs in the finisher, once per element of the reduced shape)
    st = stages(body)
    inputs = [body.inputs[j] for j in st.element_inputs]
    values = [v.dtype for v in inputs + [o for n in st.element for o in n.outputs]
              if isinstance(v.type, TensorType)]
    kinds = node.attrs.get("outputs", ())  # (a row kernel has none)
    reductions = [(split_kind(k)[0], body.outputs[i].dtype) for i, k in enumerate(kinds)
                  if not is_mapped(k)]
    reductions += [(n.op, n.out.dtype) for n in body_reductions(body) + finish_reductions(body)]
    accumulators = [to_dtype("f64" if d.is_float else "i64") for op, d in reductions
                    if op != "max"]
    return [d for d in values + accumulators if d.name != "bool"] or [to_dtype("i32")]


def _compute_bits(d: DType) -> int:
    t = compute_type(d)
    return t.width if isinstance(t, ir.IntType) else 64 if t == ir.DoubleType() else 32


@functools.cache
def register_bits(target: Target) -> int:
    """The widest vector LLVM makes of a plain f32 loop for the target, in bits."""
    module = ir.Module(name="vector_width_probe")
    f32, i64, ptr = ir.FloatType(), ir.IntType(64), ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, i64]), "probe")
    fn.args[0].add_attribute("noalias")
    entry, body, done = (fn.append_basic_block(s) for s in ("entry", "body", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", fn.args[1], ir.Constant(i64, 0)), body, done)
    b.position_at_end(body)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    p = b.gep(fn.args[0], [i], source_etype=f32)
    b.store(b.fmul(b.load(p, typ=f32), ir.Constant(f32, 3.0)), p)
    step = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(step, body)
    b.cbranch(b.icmp_signed("<", step, fn.args[1]), body, done)
    b.position_at_end(done)
    b.ret_void()
    found = re.findall(r"<(\d+) x float>", str(optimize(module, target)))
    return 32 * max(map(int, found), default=1)
