"""numpy's BLAS, and what `matmul` means: the product of each matrix as one single-threaded
BLAS call (numpy's, with the BLAS's own threads off while it runs).

Why single-threaded: OpenBLAS blocks the contraction axis differently on one thread and on
several (its threaded driver halves a block where the one-thread driver rounds it to its
kernel's unroll), so numpy's product of the same arrays differs in the last bits with the
BLAS's thread count (f32 products of a few hundred rows and columns and 400 to 800 terms).
The reference would then mean one thing under OPENBLAS_NUM_THREADS=1 and another under 2.
On one thread a product's bits do not depend on how its rows or columns are cut, as long
as each piece stays on the BLAS's general path (not its small-matrix kernels nor a gemv):
so compiled code may run the pieces of one product on its own threads and compute what the
reference computes (backends/llvm/gemm.py, which checks this of the library it finds).

Found: numpy's bundled OpenBLAS (the scipy-openblas wheels) or a system OpenBLAS numpy
loaded, through its cblas_?gemm and its thread switch. With another BLAS (Accelerate, MKL)
or none, `matmul` is numpy's product as it is, and compiled code runs it through numpy.
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # the CBLAS enumerations' values


@dataclass(frozen=True)
class Blas:
    """A loaded BLAS: gemm's address per dtype (cblas_sgemm, cblas_dgemm), whether its
    integers are 64-bit, and its thread switch."""

    path: str
    gemm: dict[np.dtype, int]
    int64: bool
    _set: Any = field(repr=False)
    _get: Any = field(repr=False)

    def threads(self) -> int:
        return int(self._get())

    def set_threads(self, n: int) -> None:
        self._set(n)


# (prefix, suffix, 64-bit integers): the scipy-openblas wheels' names, then a plain OpenBLAS
_NAMINGS = (("scipy_", "64_", True), ("", "64_", True), ("", "", False))


def _loaded_paths() -> list[str]:
    """Paths of the OpenBLAS libraries this process has loaded (numpy loads its BLAS when it
    is imported); where the process's map cannot be read, numpy's bundled copies."""
    try:
        with open("/proc/self/maps") as f:
            found = [line.split(None, 5)[-1].strip() for line in f if "openblas" in line]
    except OSError:
        here = os.path.dirname(np.__file__)
        found = glob.glob(os.path.join(here, "..", "numpy.libs", "*openblas*")) + \
            glob.glob(os.path.join(here, ".dylibs", "*openblas*"))
    return list(dict.fromkeys(p for p in found if os.path.isfile(p)))


def _open(path: str) -> Blas | None:
    try:  # only a library already loaded: a second copy would have its own threads
        lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LOCAL)
    except OSError:
        return None
    for prefix, suffix, int64 in _NAMINGS:
        try:
            s, d = (getattr(lib, f"{prefix}cblas_{t}gemm{suffix}") for t in "sd")
            set_, get = (getattr(lib, f"{prefix}openblas_{w}_num_threads{suffix}")
                         for w in ("set", "get"))
        except AttributeError:
            continue
        set_.argtypes, set_.restype, get.restype = [ctypes.c_int], None, ctypes.c_int
        return Blas(path, {np.dtype(np.float32): _address(s), np.dtype(np.float64): _address(d)},
                    int64, set_, get)
    return None


def _address(fn: Any) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


_library: Blas | None = None
_looked = False


def library() -> Blas | None:
    """numpy's OpenBLAS, if it has one this module can drive (see the module's doc)."""
    global _library, _looked
    if not _looked:
        _library = next(filter(None, map(_open, _loaded_paths())), None)
        _looked = True
    return _library


class _OneThread:
    """The BLAS on one thread while any holder is inside: the first in saves its thread
    count and sets one, the last out puts it back (threads of a program and of the
    interpreter can overlap; none of them sees the BLAS threaded while one holds it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._saved = 1

    def __enter__(self) -> None:
        lib = library()
        if lib is None:
            return
        with self._lock:
            if self._holders == 0:
                self._saved = lib.threads()
                if self._saved != 1:
                    lib.set_threads(1)
            self._holders += 1

    def __exit__(self, *exc: object) -> None:
        lib = library()
        if lib is None:
            return
        with self._lock:
            self._holders -= 1
            if self._holders == 0 and self._saved != 1:
                lib.set_threads(self._saved)


one_thread = _OneThread()


def matmul(a: Any, b: Any, out: np.ndarray | None = None) -> np.ndarray:
    """numpy.matmul, each matrix's product on one BLAS thread (see the module's doc)."""
    with one_thread:
        return np.matmul(a, b) if out is None else np.matmul(a, b, out=out)
