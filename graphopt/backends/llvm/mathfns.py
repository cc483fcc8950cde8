"""exp, log, log1p and tanh of f32, as inline LLVM IR: no calls, so a kernel's loop vectorizes.

A call to the C library's expf in a loop body keeps LLVM's loop vectorizer out of the whole
loop; these are straight-line code instead (Cephes's range reductions and polynomials, the
special values chosen with `select`, never a branch), which it turns into SIMD code like the
rest of the element. Each function takes an IRBuilder and an f32 value and builds its
result with plain instructions: no fast-math flags (the rounding trick in `exp` needs exact
IEEE additions) and no fused multiply-add, so a result has the same bits at every CPU level.
Errors, measured against the correctly rounded result over every f32 of the functions'
ranges, are stated in docs/llvm.md and asserted in tests/test_mathfns.py. f64 is not here:
the emitter calls the C math library for it.
"""
from __future__ import annotations

import math

from llvmlite import ir

F32, I32 = ir.FloatType(), ir.IntType(32)

# exp: ln 2 in two parts (Cody and Waite): n * LN2_HI is exact for the |n| <= 150 used here.
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4
ROUND = 12582912.0  # 1.5 * 2^23: z + ROUND - ROUND is z rounded to an integer, for |z| < 2^22
EXP_LO, EXP_HI = -104.0, 89.0  # exp is 0 below (under half the least subnormal), inf above
EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
         1.6666665459e-1, 5.0000001201e-1)  # e^r = 1 + r + r^2 P(r), |r| <= ln2/2
LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
         1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
         3.3333331174e-1)  # log(1 + f) = f - f^2/2 + f^3 P(f), sqrt(1/2) - 1 <= f < sqrt 2 - 1
SQRT_HALF_BITS = 0x3F3504F3  # the f32 bits of sqrt(1/2)
TANH_SMALL = 0.625
TANH_P = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
          -3.33332819422e-1)  # tanh(x) = x + x^3 P(x^2), |x| < 0.625


def _f(v: float) -> ir.Constant:
    return ir.Constant(F32, v)


def _i(v: int) -> ir.Constant:
    return ir.Constant(I32, v)


def _horner(b: ir.IRBuilder, x: ir.Value, coefficients: tuple[float, ...]) -> ir.Value:
    acc = _f(coefficients[0])
    for c in coefficients[1:]:
        acc = b.fadd(b.fmul(acc, x), _f(c))
    return acc


def _nan_or(b: ir.IRBuilder, x: ir.Value, result: ir.Value) -> ir.Value:
    """x + x (a NaN, quiet) where x is NaN, else result."""
    return b.select(b.fcmp_unordered("uno", x, x), b.fadd(x, x), result)


def _intrinsic(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    fn = b.module.declare_intrinsic(name, [F32], ir.FunctionType(F32, [F32] * len(args)))
    return b.call(fn, list(args))


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e^x = 2^n e^r, n = round(x log2 e), r = x - n ln 2; 2^n is made from exponent bits, in
    two halves so that subnormal results (x down to -103.97) are rounded once and n = 128
    (x just below the overflow threshold) needs no case of its own. Above 88.72: inf; below
    -103.97: 0; exp(-inf) = 0, exp(inf) = inf, NaN stays NaN."""
    big = b.fcmp_ordered(">", x, _f(EXP_LO))  # false for NaN: a clamped NaN is chosen away
    xc = b.select(big, x, _f(EXP_LO))
    xc = b.select(b.fcmp_ordered("<", xc, _f(EXP_HI)), xc, _f(EXP_HI))
    n = b.fsub(b.fadd(b.fmul(xc, _f(1 / math.log(2))), _f(ROUND)), _f(ROUND))
    r = b.fsub(b.fsub(xc, b.fmul(n, _f(LN2_HI))), b.fmul(n, _f(LN2_LO)))
    p = b.fadd(b.fadd(b.fmul(_horner(b, r, EXP_P), b.fmul(r, r)), r), _f(1.0))
    k = b.fptosi(n, I32)  # -150 <= k <= 128
    half = b.ashr(k, _i(1))
    scale = [b.bitcast(b.shl(b.add(e, _i(127)), _i(23)), F32) for e in (half, b.sub(k, half))]
    return _nan_or(b, x, b.fmul(b.fmul(p, scale[0]), scale[1]))


def log(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log x = k ln 2 + log m, x = 2^k m with sqrt(1/2) <= m < sqrt 2 (split from the bits;
    a subnormal x is scaled by 2^23 first). log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf,
    NaN stays NaN."""
    tiny = b.fcmp_ordered("<", x, _f(2.0 ** -126))
    xs = b.select(tiny, b.fmul(x, _f(2.0 ** 23)), x)
    ix = b.sub(b.bitcast(xs, I32), _i(SQRT_HALF_BITS))
    k = b.sub(b.ashr(ix, _i(23)), b.select(tiny, _i(23), _i(0)))
    m = b.bitcast(b.add(b.and_(ix, _i(0x7FFFFF)), _i(SQRT_HALF_BITS)), F32)
    f = b.fsub(m, _f(1.0))
    z = b.fmul(f, f)
    fk = b.sitofp(k, F32)
    y = b.fmul(b.fmul(_horner(b, f, LOG_P), f), z)
    y = b.fadd(y, b.fmul(fk, _f(LN2_LO)))
    y = b.fadd(y, b.fmul(z, _f(-0.5)))
    result = b.fadd(b.fadd(f, y), b.fmul(fk, _f(LN2_HI)))
    result = b.select(b.fcmp_ordered("==", x, _f(math.inf)), x, result)
    result = b.select(b.fcmp_ordered("==", x, _f(0.0)), _f(-math.inf), result)
    result = b.select(b.fcmp_ordered("<", x, _f(0.0)), _f(math.nan), result)
    return _nan_or(b, x, result)


def log1p(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log(1 + x) = log(u) x / (u - 1), u = 1 + x rounded (the quotient corrects u's rounding);
    x itself where u - 1 is 0 (|x| < 2^-24, and +-0 keeps its sign); log1p(-1) = -inf,
    log1p(x < -1) = NaN, log1p(inf) = inf."""
    u = b.fadd(x, _f(1.0))
    d = b.fsub(u, _f(1.0))
    result = b.fmul(log(b, u), b.fdiv(x, d))
    result = b.select(b.fcmp_ordered("==", d, _f(0.0)), x, result)
    return b.select(b.fcmp_ordered("==", x, _f(math.inf)), x, result)


def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """x + x^3 P(x^2) for |x| < 0.625, else sign(x) (1 - 2 / (e^(2|x|) + 1)), which is +-1
    once e^(2|x|) overflows; tanh(-0) = -0, NaN stays NaN."""
    ax = _intrinsic(b, "llvm.fabs", x)
    z = b.fmul(x, x)
    small = b.fadd(b.fmul(b.fmul(_horner(b, z, TANH_P), z), x), x)
    e2 = exp(b, b.fadd(ax, ax))
    large = b.fsub(_f(1.0), b.fdiv(_f(2.0), b.fadd(e2, _f(1.0))))
    # x's sign on both: the large form has none, and at x = -0 the small one is -0 + +0.
    either = b.select(b.fcmp_ordered("<", ax, _f(TANH_SMALL)), small, large)
    return _intrinsic(b, "llvm.copysign", either, x)


FUNCTIONS = {"exp": exp, "log": log, "log1p": log1p, "tanh": tanh}
