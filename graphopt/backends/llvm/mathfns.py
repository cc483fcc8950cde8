"""exp, log, log1p and tanh of f32 and f64, as inline LLVM IR: no calls, so a kernel's loop
vectorizes.

A call to the C library's expf in a loop body keeps LLVM's loop vectorizer out of the whole
loop; these are straight-line code instead (Cephes's range reductions and polynomials, the
special values chosen with `select`, never a branch), which it turns into SIMD code like the
rest of the element. Each function takes an IRBuilder and an f32 or f64 value and builds its
result with plain instructions: no fast-math flags (the rounding trick in `exp` needs exact
IEEE additions) and no fused multiply-add, so a result has the same bits at every CPU level.
One generator serves both types: a `Format` holds what differs (the bit layout, the
thresholds, the polynomials). Errors, measured against the correctly rounded result, are
stated in docs/llvm.md and asserted in tests/test_mathfns.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

F32, I32 = ir.FloatType(), ir.IntType(32)
F64, I64 = ir.DoubleType(), ir.IntType(64)
TANH_SMALL = 0.625  # below it tanh is x + x^3 P(x^2); above, it is made from exp


@dataclass(frozen=True)
class Format:
    """What the functions need to know of a float type."""

    float: ir.Type
    int: ir.IntType  # as wide as the float: its bits
    mantissa: int  # bits of the fraction field
    ln2: tuple[float, float]  # ln 2 in two parts (Cody and Waite): k * ln2[0] is exact
    exp_range: tuple[float, float]  # exp is 0 below (under half the least subnormal), inf above
    exp_p: tuple[float, ...]  # e^r = 1 + r + r^2 P(r), |r| <= ln2/2
    log_p: tuple[float, ...]  # log(1 + f) = f - f^2/2 + f^3 P(f), sqrt(1/2) - 1 <= f < sqrt 2 - 1
    sqrt_half_bits: int  # the bits of sqrt(1/2)
    tanh_p: tuple[float, ...]  # tanh(x) = x + x^3 P(x^2), |x| < TANH_SMALL

    @property
    def bias(self) -> int:
        return (1 << (self.int.width - self.mantissa - 2)) - 1

    @property
    def round(self) -> float:
        """1.5 * 2^mantissa: z + round - round is z rounded to an integer, |z| < 2^(mantissa-1)."""
        return 1.5 * 2.0 ** self.mantissa


FORMATS = {
    # Cephes's single-precision coefficients.
    "float": Format(
        F32, I32, 23, (0.693359375, -2.12194440e-4), (-104.0, 89.0),
        (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
         1.6666665459e-1, 5.0000001201e-1),
        (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
         1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
         3.3333331174e-1),
        0x3F3504F3,
        (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
         -3.33332819422e-1)),
    # fdlibm's split of ln 2; the polynomials are Chebyshev fits (mpmath.chebyfit at 60
    # digits) of degree 10, 20 and 11, whose own error is under 2e-18 of the result.
    "double": Format(
        F64, I64, 52, (6.93147180369123816490e-01, 1.90821492927058770002e-10),
        (-746.0, 710.0),
        (2.0914679376583935e-09, 2.510520637395701e-08, 2.7557273661348637e-07,
         2.7557255425746435e-06, 2.4801587325533363e-05, 0.00019841269874800493,
         0.0013888888888883752, 0.008333333333326141, 0.04166666666666667,
         0.1666666666666667, 0.5),
        (0.023264220927877086, -0.053961619312197895, 0.05918790722857223,
         -0.051385304688066284, 0.0506540966648457, -0.05500704572405743,
         0.05898528368226226, -0.06256781945741766, 0.0666601535643227,
         -0.07142415039547202, 0.07692315890028749, -0.08333350032953588,
         0.09090909371649986, -0.09999999634780717, 0.11111111099840468,
         -0.12500000004323591, 0.14285714285850773, -0.16666666666643223,
         0.1999999999999946, -0.2500000000000004, 0.3333333333333333),
        0x3FE6A09E667F3BCD,
        (6.485163482793113e-06, -3.12011014257974e-05, 9.257116129556769e-05,
         -0.0002375906496055562, 0.0005896606577757043, -0.0014557754120478055,
         0.0035921217511549622, -0.008863235103240878, 0.021869488519008305,
         -0.05396825396789699, 0.13333333333333042, -0.3333333333333333)),
}


class _Ops:
    """Constants of x's format, and the few compound instructions the functions share."""

    def __init__(self, b: ir.IRBuilder, x: ir.Value):
        self.b, self.fmt = b, FORMATS[str(x.type)]

    def f(self, v: float) -> ir.Constant:
        return ir.Constant(self.fmt.float, v)

    def i(self, v: int) -> ir.Constant:
        return ir.Constant(self.fmt.int, v)

    def horner(self, x: ir.Value, coefficients: tuple[float, ...]) -> ir.Value:
        acc = self.f(coefficients[0])
        for c in coefficients[1:]:
            acc = self.b.fadd(self.b.fmul(acc, x), self.f(c))
        return acc

    def nan_or(self, x: ir.Value, result: ir.Value) -> ir.Value:
        """x + x (a NaN, quiet) where x is NaN, else result."""
        return self.b.select(self.b.fcmp_unordered("uno", x, x), self.b.fadd(x, x), result)

    def intrinsic(self, name: str, *args: ir.Value) -> ir.Value:
        t = self.fmt.float
        fn = self.b.module.declare_intrinsic(name, [t], ir.FunctionType(t, [t] * len(args)))
        return self.b.call(fn, list(args))


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e^x = 2^n e^r, n = round(x log2 e), r = x - n ln 2; 2^n is made from exponent bits, in
    two halves so that subnormal results are rounded once and the largest n (x just below the
    overflow threshold) needs no case of its own. Above log(max): inf; below log(least
    subnormal / 2): 0; exp(-inf) = 0, exp(inf) = inf, NaN stays NaN."""
    o = _Ops(b, x)
    fmt, f = o.fmt, o.f
    lo, hi = fmt.exp_range
    big = b.fcmp_ordered(">", x, f(lo))  # false for NaN: a clamped NaN is chosen away
    xc = b.select(big, x, f(lo))
    xc = b.select(b.fcmp_ordered("<", xc, f(hi)), xc, f(hi))
    n = b.fsub(b.fadd(b.fmul(xc, f(1 / math.log(2))), f(fmt.round)), f(fmt.round))
    r = b.fsub(b.fsub(xc, b.fmul(n, f(fmt.ln2[0]))), b.fmul(n, f(fmt.ln2[1])))
    p = b.fadd(b.fadd(b.fmul(o.horner(r, fmt.exp_p), b.fmul(r, r)), r), f(1.0))
    k = b.fptosi(n, fmt.int)  # each half of k is a normal number's exponent
    half = b.ashr(k, o.i(1))
    scale = [b.bitcast(b.shl(b.add(e, o.i(fmt.bias)), o.i(fmt.mantissa)), fmt.float)
             for e in (half, b.sub(k, half))]
    return o.nan_or(x, b.fmul(b.fmul(p, scale[0]), scale[1]))


def log(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log x = k ln 2 + log m, x = 2^k m with sqrt(1/2) <= m < sqrt 2 (split from the bits;
    a subnormal x is scaled by 2^mantissa first). log(+-0) = -inf, log(x < 0) = NaN,
    log(inf) = inf, NaN stays NaN."""
    o = _Ops(b, x)
    fmt, f = o.fmt, o.f
    tiny = b.fcmp_ordered("<", x, f(2.0 ** (1 - fmt.bias)))
    xs = b.select(tiny, b.fmul(x, f(2.0 ** fmt.mantissa)), x)
    ix = b.sub(b.bitcast(xs, fmt.int), o.i(fmt.sqrt_half_bits))
    k = b.sub(b.ashr(ix, o.i(fmt.mantissa)), b.select(tiny, o.i(fmt.mantissa), o.i(0)))
    fraction = o.i((1 << fmt.mantissa) - 1)
    m = b.bitcast(b.add(b.and_(ix, fraction), o.i(fmt.sqrt_half_bits)), fmt.float)
    u = b.fsub(m, f(1.0))
    z = b.fmul(u, u)
    fk = b.sitofp(k, fmt.float)
    y = b.fmul(b.fmul(o.horner(u, fmt.log_p), u), z)
    y = b.fadd(y, b.fmul(fk, f(fmt.ln2[1])))
    y = b.fadd(y, b.fmul(z, f(-0.5)))
    result = b.fadd(b.fadd(u, y), b.fmul(fk, f(fmt.ln2[0])))
    result = b.select(b.fcmp_ordered("==", x, f(math.inf)), x, result)
    result = b.select(b.fcmp_ordered("==", x, f(0.0)), f(-math.inf), result)
    result = b.select(b.fcmp_ordered("<", x, f(0.0)), f(math.nan), result)
    return o.nan_or(x, result)


def log1p(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log(1 + x) = log(u) x / (u - 1), u = 1 + x rounded (the quotient corrects u's rounding);
    x itself where u - 1 is 0 (|x| under half an ulp of 1, and +-0 keeps its sign);
    log1p(-1) = -inf, log1p(x < -1) = NaN, log1p(inf) = inf."""
    f = _Ops(b, x).f
    u = b.fadd(x, f(1.0))
    d = b.fsub(u, f(1.0))
    result = b.fmul(log(b, u), b.fdiv(x, d))
    result = b.select(b.fcmp_ordered("==", d, f(0.0)), x, result)
    return b.select(b.fcmp_ordered("==", x, f(math.inf)), x, result)


def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """x + x^3 P(x^2) for |x| < 0.625, else sign(x) (1 - 2 / (e^(2|x|) + 1)), which is +-1
    once e^(2|x|) overflows; tanh(-0) = -0, NaN stays NaN."""
    o = _Ops(b, x)
    f = o.f
    ax = o.intrinsic("llvm.fabs", x)
    z = b.fmul(x, x)
    small = b.fadd(b.fmul(b.fmul(o.horner(z, o.fmt.tanh_p), z), x), x)
    e2 = exp(b, b.fadd(ax, ax))
    large = b.fsub(f(1.0), b.fdiv(f(2.0), b.fadd(e2, f(1.0))))
    # x's sign on both: the large form has none, and at x = -0 the small one is -0 + +0.
    either = b.select(b.fcmp_ordered("<", ax, f(TANH_SMALL)), small, large)
    return o.intrinsic("llvm.copysign", either, x)


FUNCTIONS = {"exp": exp, "log": log, "log1p": log1p, "tanh": tanh}
