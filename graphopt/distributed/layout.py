"""Flat buckets: tensors packed end to end into one buffer, and that buffer's shards.

A bucket holds whole tensors in a fixed order; its length is padded with zeros up to a
multiple of the number of ranks, so it splits into equal contiguous shards (ZeRO's
partition: a tensor may straddle two ranks' shards). The same layout serves the gradient
buckets of all_reduce (no padding needed: `ranks=1`) and the shards of ZeRO's optimizer
state, so a packing pass and the optimizer agree on where each element lies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

# torch DDP's default bucket_cap_mb (Horovod's fusion buffer is 128 MB): large enough that a
# step makes few collectives, small enough that a bucket's copy is cheap next to its sending.
DEFAULT_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class Bucket:
    """The layout of one flat bucket: member tensors' shapes in order, and the ranks it is
    sharded over."""

    shapes: tuple[tuple[int, ...], ...]
    ranks: int = 1

    @property
    def sizes(self) -> list[int]:
        """Each member's number of elements."""
        return [math.prod(s) for s in self.shapes]

    @property
    def offsets(self) -> list[int]:
        """Where each member starts in the flat buffer."""
        out, at = [], 0
        for n in self.sizes:
            out.append(at)
            at += n
        return out

    @property
    def total(self) -> int:
        """The members' elements, without padding."""
        return sum(self.sizes)

    @property
    def shard(self) -> int:
        """The elements of each rank's shard."""
        return -(-self.total // self.ranks)

    @property
    def padded(self) -> int:
        """The flat buffer's length: `ranks * shard`."""
        return self.shard * self.ranks

    def owners(self) -> np.ndarray:
        """For each flat element (padding included), the member it belongs to (i32); the
        padding belongs to a member number `len(shapes)` of its own."""
        counts = self.sizes + [self.padded - self.total]
        return np.repeat(np.arange(len(counts), dtype=np.int32), counts)

    def parts(self, rank: int) -> list[tuple[int, int, int, int]]:
        """What rank's shard holds: (member, start, stop, at) for each member it overlaps, its
        flat elements [start, stop) lying at `at` in the shard (the rest is padding)."""
        lo, hi = rank * self.shard, (rank + 1) * self.shard
        out = []
        for member, (offset, n) in enumerate(zip(self.offsets, self.sizes)):
            a, b = max(lo, offset), min(hi, offset + n)
            if a < b:
                out.append((member, a - offset, b - offset, a - lo))
        return out


def pack(sizes: Sequence[int], bucket_bytes: int,
         fits: Callable[[list[int], int], bool] | None = None) -> list[list[int]]:
    """Indices of consecutive tensors, grouped into buckets: a bucket closes once it holds
    `bucket_bytes` or more (torch DDP's rule), so a tensor larger than that is a bucket of
    its own and no bucket is empty. `sizes` are bytes. `fits(current, i)`: whether tensor i
    may join the open bucket `current` (else it closes first)."""
    buckets: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i, n in enumerate(sizes):
        if current and fits is not None and not fits(current, i):
            buckets.append(current)
            current, held = [], 0
        current.append(i)
        held += n
        if held >= bucket_bytes:
            buckets.append(current)
            current, held = [], 0
    if current:
        buckets.append(current)
    return buckets
