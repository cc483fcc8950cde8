"""Buffers for Parameters and optimizer state: 64-byte aligned, large ones staggered in the page.

A kernel that updates a parameter streams through several buffers at once (Adam: the
parameter, its gradient and two moments). numpy puts every large array at the same offset
within a 4 KiB page (16 bytes past the boundary, after malloc's header of an mmap), and a CPU
that sees a load whose address bits 0-11 match those of a store still in flight waits for it
("4K aliasing"): streams that all sit at one offset mod 4096 ran 9-11% slower here on 2
threads (16M and 64M elements; docs/performance.md). graphopt owns the buffers of
Parameters and optimizer state, so it places them:

- every buffer starts on a 64-byte boundary (a cache line, the widest vector load);
- a buffer of STAGGER_BYTES or more starts at a chosen offset mod 4096: the next of SLOTS for
  a new Parameter, and for optimizer state, `offset_after(parameter, k)`, k slots after its
  parameter's, so a parameter and its state never share an offset. The slots keep clear of
  numpy's 16, where large gradients sit.

The cost is at most a page per large buffer (and 64 bytes per small one).
"""
from __future__ import annotations

import ctypes
import itertools
import math
from typing import Any

import numpy as np

ALIGN = 64
PAGE = 4096
SLOTS = (576, 1216, 1856, 2496, 3136, 3776)  # 640 bytes apart, all >= 512 from numpy's 16
STAGGER_BYTES = 1 << 16  # below this a page of padding costs more than aliasing does
_next_slot = itertools.count()


_from_buffer = ctypes.c_char.from_buffer


def address(a: np.ndarray) -> int:
    """The address of an array's first element. Through the buffer protocol: four times
    quicker than `a.ctypes.data`, and a step of a thousand tensors takes thousands."""
    try:
        return ctypes.addressof(_from_buffer(a))
    except (TypeError, ValueError, BufferError):  # read-only, empty, or bf16 (no buffer format)
        return a.ctypes.data


def offset_after(a: np.ndarray, k: int) -> int:
    """The offset in the page k slots after array a's (the k-th state of a parameter)."""
    gap = SLOTS[1] - SLOTS[0]
    return (address(a) + k * gap + ALIGN - 1) // ALIGN * ALIGN % PAGE


def empty(shape: Any, dtype: Any, offset: int | None = None) -> np.ndarray:
    """A new C-contiguous array, 64-byte aligned; one of STAGGER_BYTES or more starts at
    `offset` mod 4096 (a multiple of 64; default: the next of SLOTS)."""
    dtype = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(map(int, shape))
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= STAGGER_BYTES:
        pad = PAGE
        want = SLOTS[next(_next_slot) % len(SLOTS)] if offset is None else offset % PAGE
        assert want % ALIGN == 0, f"offset {want} is not a multiple of {ALIGN}"
    else:
        pad, want = ALIGN, 0
    raw = np.empty(nbytes + pad, np.uint8)
    start = (want - address(raw)) % pad
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def full(shape: Any, fill: Any, dtype: Any, offset: int | None = None) -> np.ndarray:
    """`empty`, filled (written now: memory a step faults in first costs more, see
    optim/optimizer.py)."""
    a = empty(shape, dtype, offset)
    a.fill(fill)
    return a


__all__ = ["empty", "full", "offset_after", "address", "ALIGN", "PAGE", "SLOTS",
           "STAGGER_BYTES"]
