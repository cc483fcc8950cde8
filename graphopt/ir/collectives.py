"""The collectives: ops that exchange values between the processes of a group (category
collective), declared once here as the other ops are in opdefs.py.

    %1 = all_reduce %0 {group="world", ranks=4, reduce="sum"} : f32[1000]
    %2 = all_gather %g {group="world", ranks=4} after(%1) : f32[8,3]

A node names its process group (`group`, looked up with `graphopt.comm.group` when it runs)
and the number of ranks the step was traced for (`ranks`), so every type is static and the
text form says everything. All but `shard` are *ordered* (OpDef.ordered): every rank must
issue them in one order, or the ranks wait for each other forever. The tracer chains them by
after edges, each after the one before; the verifier checks the chain (rule
collective-order); no pass merges, folds, fuses or reorders them. `shard` sends nothing, but
its value is the rank's own part, so it is a collective too: fold never evaluates it.

The bytes each one sends (OpDef.sends) are those of a ring algorithm, per rank and run:
an all_reduce sends 2(N-1)/N of its operand, a reduce_scatter (N-1)/N of its input, an
all_gather (N-1)/N of its output, a broadcast (N-1)/N of its operand (pipelined in pieces).

`all_reduce_when` is a *predicated* collective (OpDef.predicated): an all_reduce that
communicates only on the runs where its last operand, a bool scalar, is true, and is x
unchanged on the others. It is how one compiled step reduces the gradients a k-step
accumulation sums only on its k-th call (optim/accumulate.py): every call runs the same
graph, and the ranks agree on the predicate by construction (it is computed from Parameters,
constants and values every rank received alike; the verifier checks this, rule
collective-predicate). Its `every` is how many runs it takes per communicating run, so the
cost model counts its bytes once per `every` runs:

    %9 = all_reduce_when %8, %ready {group="world", ranks=2, reduce="mean", every=4} : f32[352]
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import comm
from ..errors import OpTypeError
from .opdefs import ANY, FLOAT, _one_dtype, _tensors
from .registry import (COLLECTIVE, INT_ATTR, STRING_ATTR, OpDef, at_least, one_of, register)
from .types import TensorType, Type, bf16, bool_, f16

REDUCES = ("sum", "max", "mean")
_GROUP = ("group", "ranks")
_GROUP_KINDS = (STRING_ATTR, at_least(1))
_HALVES = (f16.np_dtype, bf16.np_dtype)


# -- type rules ---------------------------------------------------------------------------------
def _operand(op: str, types: Sequence[Type], attrs: dict[str, Any], min_ndim: int = 0
             ) -> TensorType:
    """The one tensor operand, of a dtype the op's reduction takes, with the axes it needs."""
    (x,) = _tensors(op, types, 1)
    mean = attrs.get("reduce") == "mean"
    _one_dtype(f'{op} {{reduce="mean"}}' if mean else op, [x], FLOAT if mean else ANY)
    if x.ndim < min_ndim:
        raise OpTypeError(f"{op}: {x} has no axis 0 (the axis split between the ranks)")
    return x


def _split(op: str, x: TensorType, ranks: int) -> TensorType:
    """x's axis 0 split into `ranks` equal parts: the type of one part."""
    if x.shape[0] % ranks:
        raise OpTypeError(f"{op}: axis 0 of {x} ({x.shape[0]}) is not a multiple of "
                          f"ranks={ranks}, so it cannot be split equally between the ranks")
    return TensorType((x.shape[0] // ranks,) + x.shape[1:], x.dtype)


def _same_infer(op: str) -> Callable[[Sequence[Type], dict[str, Any]], list[Type]]:
    def infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
        x = _operand(op, types, attrs)
        if "root" in attrs and not 0 <= attrs["root"] < attrs["ranks"]:
            raise OpTypeError(f"{op}: root={attrs['root']} is not one of the {attrs['ranks']} "
                              f"ranks (0 <= root < ranks)")
        return [x]
    return infer


def _when_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    (x, now) = _tensors("all_reduce_when", types, 2)
    if now != TensorType((), bool_):
        raise OpTypeError(f"all_reduce_when: the predicate (operand 2) must be a bool scalar, "
                          f"got {now}")
    return _same_infer("all_reduce_when")([x], attrs)


def _reduce_scatter_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    return [_split("reduce_scatter", _operand("reduce_scatter", types, attrs, 1),
                   attrs["ranks"])]


def _all_gather_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    x = _operand("all_gather", types, attrs, 1)
    return [TensorType((attrs["ranks"] * x.shape[0],) + x.shape[1:], x.dtype)]


def _shard_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    return [_split("shard", _operand("shard", types, attrs, 1), attrs["ranks"])]


# -- numpy semantics: through the group's communicator ------------------------------------------
def _fresh(result: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The result as an array of its own: a communicator may hand back its input (a group of
    one), which may lie in memory a backend reuses for other values."""
    result = np.asarray(result)
    return result.copy() if np.may_share_memory(result, x) else result


def _mean(total: np.ndarray, ranks: int) -> np.ndarray:
    """The sum divided by the number of ranks, in the sum's dtype (f16 and bf16 divide in f32
    and round once, as their elementwise ops do). The sum is the op's own array (_fresh), so
    it is divided in place: a bucket of gradients is not allocated (and faulted in) twice."""
    if total.dtype in _HALVES:
        return (total.astype(np.float32) / np.float32(ranks)).astype(total.dtype)
    if not total.flags.writeable:
        return total / total.dtype.type(ranks)
    np.divide(total, total.dtype.type(ranks), out=total)
    return total


def _reduced(run: Callable[[comm.Communicator, np.ndarray, str], np.ndarray]
             ) -> Callable[..., np.ndarray]:
    """The impl of a reduction over the ranks: a sum or a max by the communicator, a mean as
    the sum divided by the ranks."""
    def impl(x: np.ndarray, group: str, ranks: int, reduce: str) -> np.ndarray:
        x = np.asarray(x, order="C")  # what a communicator sends is one buffer
        out = run(comm.group(group, ranks), x, "sum" if reduce == "mean" else reduce)
        out = _fresh(out, x)
        return _mean(out, ranks) if reduce == "mean" else out
    return impl


def _all_reduce_when(x: np.ndarray, now: np.ndarray, group: str, ranks: int, reduce: str,
                     every: int) -> np.ndarray:
    """x's all_reduce on a run where `now` is true; x itself (a copy) on the others, without
    communicating."""
    if not bool(now):
        return np.array(x, copy=True)
    return _all_reduce(x, group, ranks, reduce)


def _all_gather(x: np.ndarray, group: str, ranks: int) -> np.ndarray:
    x = np.asarray(x, order="C")
    return _fresh(comm.group(group, ranks).all_gather(x), x)


def _broadcast(x: np.ndarray, group: str, ranks: int, root: int) -> np.ndarray:
    x = np.asarray(x, order="C")
    return _fresh(comm.group(group, ranks).broadcast(x, root), x)


def _shard(x: np.ndarray, group: str, ranks: int) -> np.ndarray:
    rank, part = comm.group(group, ranks).rank, x.shape[0] // ranks
    return np.array(x[rank * part:(rank + 1) * part], copy=True)


# -- bytes sent, by a ring algorithm --------------------------------------------------------------
def _ring(share: int, of: str) -> Callable[[Sequence[Type], Sequence[Type], dict[str, Any]],
                                           int]:
    """`share` (N-1)/N of the input's or the output's bytes (rounded down); for a predicated
    collective, on the runs it communicates (OpDef.sends counts those once per `every`)."""
    def sends(inputs: Sequence[Type], outputs: Sequence[Type], attrs: dict[str, Any]) -> int:
        n = attrs["ranks"]
        t = (inputs if of == "input" else outputs)[0]
        return share * (n - 1) * t.nbytes // n
    return sends


_REDUCE_KIND = one_of(*REDUCES)

_all_reduce = _reduced(lambda c, x, r: c.all_reduce(x, r))
register(OpDef("all_reduce", COLLECTIVE, _same_infer("all_reduce"),
               _all_reduce, attrs=_GROUP + ("reduce",),
               attr_kinds=_GROUP_KINDS + (_REDUCE_KIND,), ordered=True, uniform=True,
               sends=_ring(2, "input"),
               doc="the elementwise sum, max or mean of x over the ranks of the group, on "
                   "every rank (mean: the sum divided by ranks, float dtypes only)"))
register(OpDef("all_reduce_when", COLLECTIVE, _when_infer, _all_reduce_when,
               attrs=_GROUP + ("reduce", "every"),
               attr_kinds=_GROUP_KINDS + (_REDUCE_KIND, at_least(1)), ordered=True,
               predicated=True, sends=_ring(2, "input"), dtype_group=(0,),
               doc="all_reduce of x on the runs where the bool scalar `now` is true (the same "
                   "on every rank), else x unchanged, without communicating; it communicates "
                   "once every `every` runs (what the cost model counts)"))
register(OpDef("reduce_scatter", COLLECTIVE, _reduce_scatter_infer,
               _reduced(lambda c, x, r: c.reduce_scatter(x, r)), attrs=_GROUP + ("reduce",),
               attr_kinds=_GROUP_KINDS + (_REDUCE_KIND,), ordered=True, sends=_ring(1, "input"),
               doc="the sum, max or mean of x over the ranks, split along axis 0 into ranks "
                   "equal parts: this rank's part"))
register(OpDef("all_gather", COLLECTIVE, _all_gather_infer, _all_gather, attrs=_GROUP,
               attr_kinds=_GROUP_KINDS, ordered=True, uniform=True, sends=_ring(1, "output"),
               doc="every rank's x, concatenated along axis 0 in rank order, on every rank"))
register(OpDef("broadcast", COLLECTIVE, _same_infer("broadcast"), _broadcast,
               attrs=_GROUP + ("root",), attr_kinds=_GROUP_KINDS + (INT_ATTR,), ordered=True,
               uniform=True, sends=_ring(1, "input"), doc="rank root's x, on every rank"))
register(OpDef("shard", COLLECTIVE, _shard_infer, _shard, attrs=_GROUP,
               attr_kinds=_GROUP_KINDS,
               doc="this rank's part of x: axis 0 split into ranks equal parts, part number "
                   "rank (no communication; the value depends on the rank)"))
