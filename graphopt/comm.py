"""Process groups: what a collective op runs on, found by the group name its node carries.

The IR's collectives (`all_reduce`, `reduce_scatter`, `all_gather`, `broadcast`, and
`shard`, which only reads the rank) name a group (`group="world"`) and the number of ranks
the graph was traced for (`ranks=N`, so the IR's types are static). A backend runs them on
the `Communicator` registered under that name. Without `graphopt.distributed.init()` the
world is this one process (`SingleProcess`): every collective is the identity and a step
written for data parallelism runs unchanged. `graphopt.distributed` registers an MPI
communicator as "world" (mpi4py).

A communicator works on numpy arrays and returns new ones; reductions are "sum" or "max"
(the IR's "mean" is a sum divided by the size, in the op).
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .errors import CollectiveError


class Communicator(Protocol):
    """A group of `size` processes, this one being number `rank` (0-based)."""

    rank: int
    size: int

    def all_reduce(self, x: np.ndarray, reduce: str) -> np.ndarray:
        """The elementwise sum or max of x over the ranks, on every rank."""

    def reduce_scatter(self, x: np.ndarray, reduce: str) -> np.ndarray:
        """The reduction of x over the ranks, split along axis 0 into `size` equal parts:
        this rank's part (x.shape[0] is a multiple of size)."""

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        """Every rank's x, concatenated along axis 0 in rank order."""

    def broadcast(self, x: np.ndarray, root: int) -> np.ndarray:
        """Rank `root`'s x, on every rank."""

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, in rank order, on every rank (for checks that the
        ranks agree, never for tensors)."""


class SingleProcess:
    """The world of one process: size 1, every collective the identity (a copy)."""

    rank, size = 0, 1

    def all_reduce(self, x: np.ndarray, reduce: str) -> np.ndarray:
        return np.array(x, copy=True)

    def reduce_scatter(self, x: np.ndarray, reduce: str) -> np.ndarray:
        return np.array(x, copy=True)

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        return np.array(x, copy=True)

    def broadcast(self, x: np.ndarray, root: int) -> np.ndarray:
        return np.array(x, copy=True)

    def gather_objects(self, obj: Any) -> list[Any]:
        return [obj]

    def __repr__(self) -> str:
        return "SingleProcess()"


_GROUPS: dict[str, Communicator] = {"world": SingleProcess()}


def group(name: str, ranks: int | None = None) -> Communicator:
    """The communicator of group `name`; with `ranks`, checked to have that many processes.

    Raises:
        CollectiveError: no group has that name, or it has another size (a graph traced for
            4 ranks run on 2).
    """
    comm = _GROUPS.get(name)
    if comm is None:
        raise CollectiveError(f"no process group named {name!r}; known: "
                              f"{', '.join(map(repr, sorted(_GROUPS)))}")
    if ranks is not None and comm.size != ranks:
        raise CollectiveError(f"the step was traced for {ranks} ranks in group {name!r}, "
                              f"which has {comm.size} here")
    return comm


def set_group(name: str, comm: Communicator) -> None:
    """Register `comm` as group `name` (replacing the one there)."""
    _GROUPS[name] = comm
