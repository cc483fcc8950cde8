"""The job's processes: `init` joins them through MPI and registers them as the group "world";
`rank`, `world_size`, `is_initialized`, `barrier`.

Before `init` (and in a program that never calls it) the world is this one process
(graphopt.comm's SingleProcess): rank 0 of 1, every collective the identity.
"""
from __future__ import annotations

import math

from .. import comm
from ..errors import ArgumentError, CollectiveError
from . import failure
from .mpi import MPICommunicator, load_mpi

_world: MPICommunicator | None = None


def _check_timeout(timeout: object) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
            not math.isfinite(timeout) or timeout <= 0:
        raise ArgumentError(f"init(timeout=...) takes a number of seconds greater than 0 (or "
                            f"None: GRAPHOPT_COLLECTIVE_TIMEOUT), got {timeout!r}")


def init(timeout: float | None = None) -> None:
    """Join the other processes of this job through MPI, as the process group "world".

    Run it on every rank, before the first step: under `mpiexec -n N python script.py` (or
    `python -m mpi4py script.py`) the world is the N ranks; in a plain `python script.py` it
    is this one process. Calling it again does nothing (but set a new `timeout`). In a job of
    more than one rank, an uncaught exception on any rank from now on prints that rank's
    traceback, each line prefixed with `[rank R]`, and aborts the whole job.

    Args:
        timeout: seconds each collective waits for the other ranks before it raises
            CollectiveTimeout; None: the switch GRAPHOPT_COLLECTIVE_TIMEOUT (default 300).

    Raises:
        CollectiveError: mpi4py or MPI is missing (`pip install 'graphopt[dist]'`), MPI was
            finalized already, or the other ranks did not join within the timeout.
        ArgumentError: a timeout that is not a number of seconds greater than 0.
    """
    global _world
    _check_timeout(timeout)
    if _world is not None:
        if timeout is not None:
            _world.timeout = float(timeout)
        return
    MPI = load_mpi()
    if MPI.Is_finalized():
        raise CollectiveError("graphopt.distributed.init(): MPI was finalized already in this "
                              "process; call init() before MPI ends")
    if not MPI.Is_initialized():  # (mpi4py.rc.initialize = False: the program chose when)
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    world = MPICommunicator.duplicate(MPI.COMM_WORLD, None if timeout is None else
                                      float(timeout))
    comm.set_group("world", world)
    if world.size > 1:
        failure.install(world.rank, world.size, MPI.COMM_WORLD.Abort)
    _world = world


def is_initialized() -> bool:
    """Whether `init` ran in this process."""
    return _world is not None


def rank() -> int:
    """This process's number in the group "world", 0 to world_size() - 1 (0 before init)."""
    return comm.group("world").rank


def world_size() -> int:
    """How many processes the group "world" has (1 before init)."""
    return comm.group("world").size


def barrier() -> None:
    """Wait until every rank has called barrier (nothing to wait for before init). Watched as
    a collective: CollectiveTimeout if a rank does not come within the timeout."""
    if _world is not None:
        _world.barrier()
