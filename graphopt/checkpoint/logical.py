"""What a run's Parameters hold of its logical tensors: the tensors one process holds whole.

A checkpoint stores logical (unsharded) tensors, whatever the world size and ZeRO stage that
wrote it. A weight, a hyper-parameter, a step counter or zero=0 optimizer state is a logical
tensor of its own, held whole (and the same on every rank). A ZeRO shard-state Parameter
(`{opt}.zero{g}.{b}.{key}`, distributed/sharding.py) holds contiguous parts of its bucket's
member tensors, named as one process names them (`fc0.w.exp_avg`), then padding. So what
4 ranks saved under zero=2 loads into one process under zero=0, and back: each Parameter
takes the parts it holds.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..distributed.sharding import shards_of
from ..errors import CheckpointError
from ..frontend import Parameter
from ..ir.types import TensorType


@dataclass(frozen=True)
class Part:
    """Elements [start, stop) of the flat logical tensor `name`, at `at` in a Parameter's flat
    value."""

    name: str
    start: int
    stop: int
    at: int


@dataclass(frozen=True)
class Holding:
    """What one Parameter holds: its parts of logical tensors, the fill of its other elements
    (ZeRO's padding), and whether it is a whole tensor, the same on every rank."""

    param: Parameter
    parts: tuple[Part, ...]
    fill: float
    replicated: bool

    def piece(self, part: Part) -> np.ndarray:
        """The Parameter's elements that are `part`, flat."""
        return self.param.numpy().reshape(-1)[part.at:part.at + part.stop - part.start]


def plan(params: list[Parameter], source: str) -> tuple[list[Holding], dict[str, TensorType]]:
    """Each Parameter's holding, and the logical tensors they hold parts of (name -> type):
    for a shard, every member of its bucket, not only those this rank holds a part of."""
    shards = shards_of(params)
    holdings: list[Holding] = []
    types: dict[str, TensorType] = {}

    def add(name: str, t: TensorType) -> None:
        if name in types:
            raise CheckpointError(f"{source}: two tensors would be saved as '{name}' (a "
                                  f"Parameter named as another's optimizer state?); rename it")
        types[name] = t

    for p in params:
        s = shards.get(id(p))
        if s is None:
            whole = (Part(p.name, 0, p.size, 0),) if p.size else ()  # (no part of nothing)
            holdings.append(Holding(p, whole, 0.0, True))
            add(p.name, p.type)
            continue
        holdings.append(Holding(p, tuple(Part(s.names[m], a, b, at) for m, a, b, at in s.parts),
                                s.fill, False))
        for name, shape in zip(s.names, s.shapes):
            add(name, TensorType(shape, p.dtype))
    return holdings, types


def whole(holdings: list[Holding], types: dict[str, TensorType],
          source: str) -> dict[str, np.ndarray]:
    """The logical tensors, put together from holdings that cover them (one process's: its
    shards are whole buckets)."""
    out = {n: np.empty(t.size, t.dtype.np_dtype) for n, t in types.items()}
    held = dict.fromkeys(types, 0)
    for h in holdings:
        for part in h.parts:
            out[part.name][part.start:part.stop] = h.piece(part)
            held[part.name] += part.stop - part.start
    partial = [n for n, t in types.items() if held[n] != t.size]
    if partial:
        raise CheckpointError(f"{source}: this process holds only part of {partial} (state "
                              f"sharded over more ranks than this world has); save it from "
                              f"the job whose ranks hold the rest")
    return {n: a.reshape(types[n].shape) for n, a in out.items()}


def assemble(h: Holding, read: Callable[[str, int, int], np.ndarray]) -> np.ndarray:
    """The value of h's Parameter from logical tensors: read(name, start, stop) gives flat
    elements of one."""
    p = h.param
    if h.replicated:
        return read(p.name, 0, p.size).reshape(p.shape)
    out = np.full(p.size, h.fill, p.dtype.np_dtype)
    for part in h.parts:
        out[part.at:part.at + part.stop - part.start] = read(part.name, part.start, part.stop)
    return out.reshape(p.shape)
