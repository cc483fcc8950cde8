"""ZeRO's optimizer side: each rank keeps and updates one shard of every flat bucket.

When a step is traced under `DataParallel(zero=1|2)`, the optimizer's parameters are laid
out, group by group and batch by batch (the parameters one update rule is mapped over), in
flat buckets (layout.py), each padded to a multiple of the ranks. The optimizer's state
(moments, master weights) is moved into one Parameter per bucket and key, holding only this
rank's shard: 1/N of the state, plus padding. A step then, per bucket:

    g = shard(concat(reshape(grad_i, -1)..., zeros(pad)))      this rank's gradient part
    p = shard(concat(reshape(param_i, -1)..., zeros(pad)))     ... and parameter part
    update(shard slot, g, c)                                   the optimizer's own rule
    new = all_gather(p')                                       every rank's new part
    assign(param_i, reshape(slice(new, off_i, off_i + n_i)))   the parameters, whole again

The gradients reaching the optimizer are all_reduce means (value_and_grad's, under
DataParallel), so `shard(concat(all_reduce(g_i)...))` is what the zero pass rewrites into
one reduce_scatter of the bucket (zero=2) or one all_reduce of it (zero=1).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from .. import ops
from ..frontend import Parameter
from ..frontend.tensor import Tensor
from ..optim.optimizer import Scalars, Slot, as_dtype
from .layout import Bucket, pack

if TYPE_CHECKING:
    from ..optim.groups import ParamGroup
    from ..optim.optimizer import Optimizer


def flat(tensors: list[Any], bucket: Bucket, dtype: Any) -> Tensor:
    """The bucket's flat buffer: each tensor's elements in order, then zeros to `padded`."""
    parts = [ops.reshape(t, (n,)) for t, n in zip(tensors, bucket.sizes)]
    if bucket.padded > bucket.total:
        parts.append(ops.zeros((bucket.padded - bucket.total,), dtype))
    return ops.concat(parts) if len(parts) > 1 else parts[0]


def unflat(full: Tensor, bucket: Bucket) -> list[Tensor]:
    """The members of a whole flat bucket, each in its shape."""
    return [ops.reshape(ops.slice(full, [at], [at + n]), shape)
            for at, n, shape in zip(bucket.offsets, bucket.sizes, bucket.shapes)]


@dataclass
class ShardSlot(Slot):
    """A bucket's shard as an update rule sees it: the state is the bucket's shard state, the
    parameter value read is this rank's part of the flat parameters, and a write is kept
    (`written`) for the all_gather that makes the parameters whole again."""

    members: list[Slot] = field(default_factory=list)
    bucket: Bucket | None = None
    group_name: str = "world"
    value: Tensor | None = None
    written: Tensor | None = None

    def current(self) -> Tensor:
        return self.value

    def commit(self, opt: Optimizer, value: Tensor) -> None:
        self.written = as_dtype(value, self.param.dtype)

    def norm(self, x: Tensor) -> Tensor:
        """Each element's parameter's L2 norm: the shards are gathered (every rank then
        holds every element, and computes the same norms), each member's norm is taken
        over its own elements, and spread back over this rank's part."""
        if x is self.value:  # the parameters themselves: whole on every rank already
            wholes = [as_dtype(s.param, x.dtype) for s in self.members]
        else:
            wholes = unflat(ops.all_gather(x, group=self.group_name), self.bucket)
        norms = [ops.broadcast_to(ops.sqrt(ops.sum(w * w)), (w.size,)) for w in wholes]
        return ops.shard(flat(norms, self.bucket, x.dtype), group=self.group_name)


@dataclass
class ShardedBucket:
    """One bucket of an optimizer under ZeRO: its members, layout and shard state, with the
    names each member's state had before it was sharded (`logical[key]`, member by member:
    what a checkpoint calls it) and the value the padding starts from (`fills[key]`)."""

    slots: list[Slot]
    layout: Bucket
    state: dict[str, Parameter]
    logical: dict[str, list[str]]
    fills: dict[str, float]


@dataclass(frozen=True)
class ShardOf:
    """Where a shard-state Parameter lies in the state one process would hold: the bucket's
    member tensors (their names and shapes, every member's, not only this rank's), the parts
    of them this shard holds (`Bucket.parts`: member, start, stop, at) and the fill of the
    rest (the padding)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    parts: tuple[tuple[int, int, int, int], ...]
    fill: float


# Every Sharding made, while its optimizer lives: a checkpoint finds shard state by it.
_LIVE: weakref.WeakSet[Sharding] = weakref.WeakSet()


def shards_of(params: Iterable[Parameter]) -> dict[int, ShardOf]:
    """Which of `params` are ZeRO shard state (of any optimizer's Sharding), by id."""
    wanted = {id(p) for p in params}
    return {id(p): ShardOf(tuple(b.logical[key]), b.layout.shapes,
                           tuple(b.layout.parts(s.rank)), b.fills[key])
            for s in list(_LIVE) for bs in s.buckets.values() for b in bs
            for key, p in b.state.items() if id(p) in wanted}


class Sharding:
    """An optimizer's ZeRO layout on this rank: its buckets, each with its shard state.

    Made once per optimizer (the first trace under DataParallel with zero >= 1); from then
    on the optimizer's per-parameter state is gone and `buckets[i].state` holds this rank's
    shards (initialised from the state the optimizer had, so a state loaded before works).
    """

    def __init__(self, opt: Optimizer, rank: int, ranks: int, bucket_bytes: int, group: str):
        self.opt, self.rank, self.ranks, self.group = opt, rank, ranks, group
        self.bucket_bytes = bucket_bytes
        self.buckets: dict[int, list[ShardedBucket]] = {}  # by group index
        for pg in opt.param_groups:
            fills = opt.init_state(pg)
            out = self.buckets[pg.index] = []
            for batch in opt._batches(pg):
                sizes = [s.param.size * s.compute.itemsize for s in batch]
                for indices in pack(sizes, bucket_bytes):
                    slots = [batch[i] for i in indices]
                    layout = Bucket(tuple(s.param.shape for s in slots), ranks)
                    keys = list(slots[0].state)
                    out.append(ShardedBucket(slots, layout, self._shard_state(
                        opt, slots, layout, fills, f"{pg.index}.{len(out)}"),
                        {k: [s.state[k].name for s in slots] for k in keys},
                        {k: float(fills.get(k, 0)) for k in keys}))
        for bucket in (b for bs in self.buckets.values() for b in bs):
            for s in bucket.slots:
                s.state = {}  # the whole state is this rank's shards now
        _LIVE.add(self)

    def _shard_state(self, opt: Optimizer, slots: list[Slot], layout: Bucket,
                     fills: Mapping[str, float], tag: str) -> dict[str, Parameter]:
        state = {}
        for key, p0 in slots[0].state.items():
            whole = np.concatenate([s.state[key].numpy().reshape(-1) for s in slots] + [
                np.full(layout.padded - layout.total, fills.get(key, 0), p0.numpy().dtype)])
            part = whole[self.rank * layout.shard:(self.rank + 1) * layout.shard]
            state[key] = Parameter(part, dtype=p0.dtype, name=f"{opt.name}.zero{tag}.{key}")
        return state

    def parameters(self) -> list[Parameter]:
        """Every shard-state Parameter, bucket by bucket."""
        return [p for bs in self.buckets.values() for b in bs for p in b.state.values()]

    def whole_bytes(self) -> int:
        """The bytes of state one process would hold (every bucket whole, no padding)."""
        return sum(b.layout.total * p.numpy().itemsize for bs in self.buckets.values()
                   for b in bs for p in b.state.values())

    def update(self, group: ParamGroup, values: Mapping[str, Any],
               by_param: Mapping[str, Any]) -> None:
        """One step of every bucket of `group`: the shard's update, then the all_gather."""
        opt = self.opt
        for b in self.buckets[group.index]:
            first = b.slots[0]
            grads = [opt._gradient(s, by_param[s.param.name]) for s in b.slots]
            g = ops.shard(flat(grads, b.layout, first.compute), group=self.group)
            value = ops.shard(flat([s.param for s in b.slots], b.layout, first.param.dtype),
                              group=self.group)
            slot = ShardSlot(first.param, group, first.compute, first.state_dtype, b.state,
                             members=b.slots, bucket=b.layout, group_name=self.group,
                             value=value)
            opt.update(slot, g, Scalars(values, first.compute))
            if slot.written is None:
                continue  # (a rule that leaves the parameters as they are)
            whole = ops.all_gather(slot.written, group=self.group)
            for s, new in zip(b.slots, unflat(whole, b.layout)):
                opt._write(s.param, new)
