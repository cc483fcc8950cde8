"""The C library's math functions, element by element over numpy arrays: the reference
semantics of the ops whose compiled form calls the C library (`power`: a call of `pow` or
`powf`).

Why not numpy's own loops: on a CPU with AVX-512, numpy computes `power` with its SIMD
library (SVML), whose last bits differ from the C library's (here 5% of random f64 pairs and
20% of f32 ones), and on other CPUs it calls the C library: the interpreter would then agree
with compiled kernels, and with Python's own `**` (what torch's optimizers compute their
bias corrections with), on some CPUs and not on others. Each element is one call through
ctypes (~0.4 us): slower than numpy's loop, the same bits on every CPU.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Callable

import numpy as np

_LIBM = ctypes.CDLL(ctypes.util.find_library("m") or None)


def _binary(name: str, ctype: type) -> Callable[[Any, Any], Any]:
    f = getattr(_LIBM, name)
    f.restype, f.argtypes = ctype, [ctype, ctype]
    return np.frompyfunc(f, 2, 1)


_POW, _POWF = _binary("pow", ctypes.c_double), _binary("powf", ctypes.c_float)


# Exponents whose power is one exact operation (numpy's power computes these so, and the C
# library's pow is not always correctly rounded: pow(x, 2) != x * x for ~0.1% of doubles).
EXACT = {2.0: lambda x: x * x, -1.0: lambda x: 1 / x, 0.5: np.sqrt}


def power(x: Any, y: Any) -> np.ndarray:
    """x ** y: numpy's for integers; for floats x * x, 1 / x or sqrt(x) where y is 2, -1 or
    0.5, else the C library's pow (f64) or powf (f32; f16 and bf16 computed in f32 and
    rounded, as numpy and the compiled code do)."""
    x, y = np.asarray(x), np.asarray(y)
    dtype = np.result_type(x, y)
    if dtype.kind in "iub":
        return np.power(x, y)
    wide = dtype == np.float64
    as_float = np.float64 if wide else np.float32
    xf, yf = x.astype(as_float), y.astype(as_float)
    if yf.ndim == 0 and float(yf) in EXACT:  # x ** 2 and the like: numpy's speed
        return np.asarray(EXACT[float(yf)](xf)).astype(dtype, copy=False)
    out = np.asarray((_POW if wide else _POWF)(xf, yf), dtype=xf.dtype)
    for c, exact in EXACT.items():
        at = yf == c
        if at.any():
            out = np.where(at, exact(xf), out)
    return out.astype(dtype, copy=False)
