"""`power` means the same bits on every CPU and in every mode: the C library's pow (powf in
f32), except where the exponent is 2, -1 or 0.5 (x * x, 1 / x, sqrt(x): one exact operation,
as numpy computes them). numpy's own power is not that on an AVX-512 CPU (its SIMD library
differs in the last bits), so the interpreter calls the C library (graphopt/ir/libm.py) and
compiled kernels call it as written, at every CPU level."""
import ctypes
import ctypes.util

import numpy as np
import pytest

import graphopt as go
from graphopt import envvars, ops
from graphopt.ir import libm

LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 4.0, -4.0, 1e-300, 1e300]


def c_pow(dtype):
    """The C function itself, one element at a time: what x ** y must give (bar the three
    exact exponents)."""
    ctype = ctypes.c_double if dtype == np.float64 else ctypes.c_float
    f = getattr(LIBM, "pow" if dtype == np.float64 else "powf")
    f.restype, f.argtypes = ctype, [ctype, ctype]
    return lambda x, y: np.array([f(float(a), float(b)) for a, b in zip(x, y)], dtype)


def same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    bad = np.flatnonzero(~nan & ((np.signbit(got) != np.signbit(want)) | (got != want)))
    assert bad.size == 0, [(got[i], want[i]) for i in bad[:5]]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_power_is_the_c_librarys_but_for_three_exact_exponents(dtype):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(0, 50, 3000), rng.uniform(-3, 3, 3000)]).astype(dtype)
    y = np.concatenate([rng.uniform(-3, 3, 3000), rng.integers(-3, 4, 3000)]).astype(dtype)
    y[::7] = 2.0
    y[1::7] = -1.0
    y[2::7] = 0.5
    want = c_pow(dtype)(x, y)
    with np.errstate(all="ignore"):
        exact = {2.0: x * x, -1.0: dtype(1) / x, 0.5: np.sqrt(x)}
        for c, v in exact.items():
            want = np.where(y == c, v, want)
        same_bits(libm.power(x, y), want)
        for c, v in exact.items():  # a scalar exponent takes numpy's own exact operation
            same_bits(libm.power(x, dtype(c)), v)


@pytest.mark.parametrize("level", ["host", "x86-64-v3", "x86-64"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_compiled_power_is_the_interpreters_at_every_level(level, dtype):
    x = np.concatenate([np.random.default_rng(1).uniform(-3, 40, 2000), SPECIAL]).astype(dtype)
    y = np.resize(np.array([2.0, -1.0, 0.5, 3.0, 1.7, -0.5, 0.0, np.nan], dtype), x.shape)
    with envvars.override(GRAPHOPT_CPU=level), np.errstate(all="ignore"):
        for fn, args in [(ops.power, (x, y)),  # the exponent at run time
                         *[((lambda c: lambda a: ops.power(a, dtype(c)))(c), (x,))  # a constant
                           for c in (2.0, -1.0, 0.5, 3.0, 1.7)]]:
            want = np.asarray(go.jit(fn, backend="interpreter")(*args))
            same_bits(np.asarray(go.jit(fn, backend="llvm")(*args)), want)
            same_bits(np.asarray(fn(*args)), want)  # eager
