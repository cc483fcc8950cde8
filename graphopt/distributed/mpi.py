"""The MPI communicator: graphopt.comm's `Communicator` on mpi4py, every collective watched.

Each collective is MPI's nonblocking form (Iallreduce, Ireduce_scatter_block, Iallgather,
Ibcast) on contiguous numpy buffers (mpi4py's upper-case, buffer methods: no pickling), and
then a wait that polls the request and gives up after a timeout (`CollectiveTimeout`), so a
lost, stuck or diverging rank is an error on the others, never a hang. The results are new
arrays; the inputs are not written.

How the wait polls, measured by benchmarks/collective_wait.py (results, with the machine:
benchmarks/results/collective_wait.md; an f32 all_reduce on 2 cores, so 4 ranks oversubscribe
them; a machine shared with other work, so rough figures: blocking's 1 KiB at 4 ranks was
0.6 ms in one run, 3.6 ms in another, but the ranking holds run after run):

- A blocking MPI call is the fastest when the ranks arrive together (it spins inside MPI, in
  C): a 1 KiB all_reduce took 51 us at 2 ranks, 268 us with this wait; 16M elements 110 ms,
  135 ms with this wait (221 and 295 ms at 4 ranks). It cannot time out, though.
- Waiters that spin (blocking, or on Test() back to back) take the cores from a rank that is
  still computing: with rank 0 computing about 10 ms before each 1 KiB all_reduce, a round of
  4 ranks took 13.2 ms blocking, 16.6 ms spinning on Test(), 10.5 ms with this wait.
- Waiters that sleep early or long make small collectives slow: this machine's shortest
  sleep is about 80 us, and ranks that each sleep before they look again keep each other
  waiting. 1 KiB at 2 ranks: 1.9 to 2.0 ms with sleeps that double up to 1 ms (spinning
  300 us first or not), 0.27 ms with this wait. Large messages advance only inside Test(),
  so no sleep may be long (1 ms at the most).

So the wait spins for SPIN seconds (a small collective of ranks that arrive together is done
by then), then sleeps a tenth of the time waited so far, from MIN_SLEEP up to MAX_SLEEP: a
wake-up comes at most about a tenth late, and a rank that waits long for another (its first
compile) wakes a thousand times a second. Among the polling waits measured it was the
fastest or within the noise of the fastest in every case.
"""
from __future__ import annotations

import pickle
import time
from typing import Any, Callable

import numpy as np

from .. import envvars
from ..errors import CollectiveError, CollectiveTimeout
from ..ir.types import bf16, f16, type_of_array

REDUCTIONS = ("sum", "max")
# MPI has no bf16 (nor a standard f16): halves are reduced in f32 and rounded once at the end
# (more exact than rounding after each rank's addition), and moved as their 16-bit patterns
# (a sum: by _half_sum, in 16 bits on the wire; a max: widened to f32 for MPI's MAX).
_HALVES = (f16.np_dtype, bf16.np_dtype)
_WIRE = {  # numpy dtype name -> the MPI datatype that moves it
    "float32": "FLOAT", "float64": "DOUBLE", "int32": "INT32_T", "int64": "INT64_T",
    "bool": "C_BOOL", "float16": "UINT16_T", "bfloat16": "UINT16_T",
    "uint8": "BYTE",  # (gather_objects' pickles: not a dtype of graphopt's tensors)
}
_TENSOR_DTYPES = frozenset(_WIRE) - {"uint8"}


def load_mpi() -> Any:
    """mpi4py's MPI module (importing it starts MPI in this process).

    Raises:
        CollectiveError: mpi4py or its MPI library is missing.
    """
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as e:  # no mpi4py, or no libmpi under it
        raise CollectiveError(f"graphopt.distributed needs mpi4py and an MPI library: "
                              f"pip install 'graphopt[dist]' ({type(e).__name__}: {e})") from None
    return MPI


def _describe(op: str, x: np.ndarray) -> str:
    """What an error calls a collective: `all_reduce of f32[1000]`."""
    try:
        return f"{op} of {type_of_array(x)}"
    except (TypeError, ValueError):
        return f"{op} of {x.dtype}{list(x.shape)}"


class MPICommunicator:
    """graphopt.comm's Communicator on an MPI communicator (mpi4py), for f32, f64, i32, i64,
    bool, f16 and bf16 arrays. Every collective waits at most `timeout` seconds (None: the
    switch GRAPHOPT_COLLECTIVE_TIMEOUT, read at each collective) for the other ranks, then
    raises CollectiveTimeout; from then on the communicator is broken (a started collective
    cannot be cancelled) and every collective raises CollectiveError."""

    # The wait's polling (the module's docstring has the measurements behind them): Test()
    # back to back for SPIN seconds, then sleeps of SLEEP_FRACTION of the time waited so far
    # (so waking late adds at most about that fraction), from MIN_SLEEP up to MAX_SLEEP.
    SPIN = 300e-6
    MIN_SLEEP = 50e-6
    SLEEP_FRACTION = 0.1
    MAX_SLEEP = 1e-3

    def __init__(self, comm: Any, timeout: float | None = None, name: str = "world"):
        self._mpi = load_mpi()
        self._comm = comm
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.name = name
        self.timeout = timeout
        self._broken: str | None = None
        # A collective given up on may still complete, and MPI would then write into its
        # buffers: they are kept alive here, with their requests, for the life of the process.
        self._abandoned: list[tuple[Any, tuple]] = []

    @classmethod
    def duplicate(cls, comm: Any, timeout: float | None = None,
                  name: str = "world") -> MPICommunicator:
        """A communicator on a duplicate of the MPI communicator `comm` (MPI_Comm_idup, watched
        as a collective): graphopt's messages never match the program's own MPI calls."""
        made: list[Any] = []

        def start() -> Any:
            dup, request = comm.Idup()
            made.append(dup)
            return request

        what = f"init (duplicating {comm.Get_name() or 'a communicator'})"
        cls(comm, timeout, name)._run(what, start, ())
        return cls(made[0], timeout, name)

    # -- the protocol -----------------------------------------------------------------------
    def all_reduce(self, x: np.ndarray, reduce: str) -> np.ndarray:
        """The elementwise sum or max of x over the ranks, on every rank (bool: logical or)."""
        x = self._operand(x)
        if self._sums_halves(x, reduce):
            return self._half_sum(x, _describe("all_reduce", x), scatter=False)
        op, wide = self._op(x, reduce), self._widened(x)
        out = np.empty_like(wide)
        self._run(_describe("all_reduce", x), lambda: self._comm.Iallreduce(
            self._buffer(wide), self._buffer(out), op), (wide, out))
        return self._narrowed(out, x)

    def reduce_scatter(self, x: np.ndarray, reduce: str) -> np.ndarray:
        """The reduction of x over the ranks, split along axis 0 into `size` equal parts:
        this rank's part."""
        x = self._operand(x)
        what = _describe("reduce_scatter", x)
        if x.ndim == 0 or x.shape[0] % self.size:
            raise CollectiveError(f"rank {self.rank}: {what}: axis 0 must split into "
                                  f"{self.size} equal parts, one per rank")
        if self._sums_halves(x, reduce):
            return self._half_sum(x, what, scatter=True)
        op, wide = self._op(x, reduce), self._widened(x)
        out = np.empty((x.shape[0] // self.size,) + x.shape[1:], wide.dtype)
        self._run(what, lambda: self._comm.Ireduce_scatter_block(
            self._buffer(wide), self._buffer(out), op), (wide, out))
        return self._narrowed(out, x)

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        """Every rank's x, concatenated along axis 0 in rank order."""
        x = self._operand(x)
        what = _describe("all_gather", x)
        if x.ndim == 0:
            raise CollectiveError(f"rank {self.rank}: {what}: a scalar has no axis 0 to "
                                  f"concatenate along")
        out = np.empty((x.shape[0] * self.size,) + x.shape[1:], x.dtype)
        self._run(what, lambda: self._comm.Iallgather(self._buffer(x), self._buffer(out)),
                  (x, out))
        return out

    def broadcast(self, x: np.ndarray, root: int) -> np.ndarray:
        """Rank `root`'s x, on every rank (x gives the shape and dtype on the others)."""
        x = self._operand(x)
        what = _describe("broadcast", x)
        if not (isinstance(root, (int, np.integer)) and 0 <= root < self.size):
            raise CollectiveError(f"rank {self.rank}: {what}: root {root!r} is not a rank of "
                                  f"group {self.name!r} (0 to {self.size - 1})")
        out = x.copy() if self.rank == root else np.empty_like(x)
        self._run(what, lambda: self._comm.Ibcast(self._buffer(out), int(root)), (out,))
        return out

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, in rank order, on every rank: the pickles' sizes are
        gathered, then the pickles padded to the largest (both watched as any collective)."""
        try:
            data = np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)
        except Exception as e:
            raise CollectiveError(f"rank {self.rank}: gather_objects: a "
                                  f"{type(obj).__name__} cannot be pickled: {e}") from None
        sizes = self._gather(np.array([data.size], np.int64), f"gather_objects of {data.size} "
                                                               f"bytes (their sizes)")
        width = int(sizes.max())
        padded = np.zeros(width, np.uint8)
        padded[:data.size] = data
        gathered = self._gather(padded, f"gather_objects of {data.size} bytes")
        return [pickle.loads(gathered[i * width:i * width + int(n)].tobytes())
                for i, n in enumerate(sizes)]

    def barrier(self) -> None:
        """Wait until every rank of the group has called barrier (watched: CollectiveTimeout)."""
        self._run("barrier", self._comm.Ibarrier, ())

    def __repr__(self) -> str:
        return f"MPICommunicator(rank={self.rank}, size={self.size}, name={self.name!r})"

    # -- the parts --------------------------------------------------------------------------
    def _operand(self, x: Any) -> np.ndarray:
        x = np.asarray(x, order="C")  # (not ascontiguousarray, which makes a scalar 1-d)
        if x.dtype.name not in _TENSOR_DTYPES:
            raise CollectiveError(f"rank {self.rank}: a collective of dtype {x.dtype} "
                                  f"(graphopt's collectives take f32, f64, i32, i64, bool, "
                                  f"f16, bf16)")
        return x

    def _sums_halves(self, x: np.ndarray, reduce: str) -> bool:
        return x.dtype in _HALVES and reduce == "sum" and self.size > 1

    def _half_sum(self, x: np.ndarray, what: str, scatter: bool) -> np.ndarray:
        """The sum of f16/bf16 x, moved as 16-bit values (MPI cannot add them, and widening
        them to f32 for MPI's sum would send twice the bytes: what DataParallel(compress=)
        saves): each rank receives every rank's part i (alltoall, part i its own), adds them
        in f32 in rank order and rounds once; for an all_reduce the parts are then gathered
        (allgather). It sends what a ring of 16-bit values does, 2(N-1)/N of x's bytes (a
        reduce_scatter: (N-1)/N), and every rank gets the same bits."""
        n, flat = self.size, x.reshape(-1)
        part = -(-flat.size // n)
        sent = np.zeros(part * n, x.dtype)
        sent[:flat.size] = flat
        got = np.empty_like(sent)
        self._run(what, lambda: self._comm.Ialltoall(self._buffer(sent), self._buffer(got)),
                  (sent, got))
        mine = got.reshape(n, part).astype(np.float32).sum(axis=0).astype(x.dtype)
        if scatter:
            return mine.reshape((x.shape[0] // n,) + x.shape[1:])
        out = np.empty_like(sent)
        self._run(what, lambda: self._comm.Iallgather(self._buffer(mine), self._buffer(out)),
                  (mine, out))
        return out[:flat.size].reshape(x.shape)

    def _widened(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float32) if x.dtype in _HALVES else x

    def _narrowed(self, out: np.ndarray, x: np.ndarray) -> np.ndarray:
        return out.astype(x.dtype) if out.dtype != x.dtype else out

    def _op(self, x: np.ndarray, reduce: str) -> Any:
        if reduce not in REDUCTIONS:
            raise CollectiveError(f"rank {self.rank}: reduction {reduce!r}: a communicator "
                                  f"reduces with {' or '.join(map(repr, REDUCTIONS))}")
        if x.dtype == np.bool_:  # numpy's sum and max of bools are both `or`
            return self._mpi.LOR
        return self._mpi.SUM if reduce == "sum" else self._mpi.MAX

    def _buffer(self, a: np.ndarray) -> list:
        datatype = getattr(self._mpi, _WIRE[a.dtype.name])
        return [a.view(np.uint16) if a.dtype in _HALVES else a, datatype]  # (count: its size)

    def _gather(self, x: np.ndarray, what: str) -> np.ndarray:
        out = np.empty(x.size * self.size, x.dtype)
        self._run(what, lambda: self._comm.Iallgather(self._buffer(x), self._buffer(out)),
                  (x, out))
        return out

    def _limit(self) -> tuple[float, str]:
        """The timeout in seconds, and where it was set (for the message)."""
        if self.timeout is not None:
            return self.timeout, f"init(timeout={self.timeout:g})"
        seconds = envvars.collective_timeout()
        return seconds, f"GRAPHOPT_COLLECTIVE_TIMEOUT={seconds:g}"

    def _run(self, what: str, start: Callable[[], Any], buffers: tuple) -> None:
        """Start a nonblocking collective and wait for it; an MPI error or a timeout breaks the
        communicator."""
        if self._broken is not None:
            raise CollectiveError(f"rank {self.rank}: {what}: the communicator of group "
                                  f"{self.name!r} is broken since {self._broken}; a collective "
                                  f"that was given up on cannot be cancelled, so no other can "
                                  f"run in this job (end it and start again)")
        limit, source = self._limit()
        request = None
        try:
            request = start()
            self._wait(request, what, limit, source)
        except self._mpi.Exception as e:
            self._give_up(request, buffers, f"{what} failed")
            raise CollectiveError(f"rank {self.rank}: {what} failed in MPI: "
                                  f"{e.Get_error_string()}") from None
        except BaseException as e:  # the timeout, or an interrupt (KeyboardInterrupt)
            if request is None:
                raise  # (nothing started: nothing pending)
            self._give_up(request, buffers, f"{what} " + (
                "timed out" if isinstance(e, CollectiveTimeout) else
                f"was interrupted ({type(e).__name__})"))
            raise

    def _wait(self, request: Any, what: str, limit: float, source: str) -> None:
        if request.Test():
            return
        start = time.perf_counter()
        deadline = start + limit
        while not request.Test():
            now = time.perf_counter()
            if now >= deadline:
                raise CollectiveTimeout(
                    f"rank {self.rank}: {what} waited {now - start:.1f} s for the other ranks "
                    f"({source}): a rank is lost, stuck, or running a different step")
            if now - start >= self.SPIN:
                time.sleep(min(self._pause(now - start), deadline - now))

    def _pause(self, waited: float) -> float:
        """How long to sleep before the next Test(), `waited` seconds into a wait."""
        return min(self.MAX_SLEEP, max(self.MIN_SLEEP, waited * self.SLEEP_FRACTION))

    def _give_up(self, request: Any, buffers: tuple, reason: str) -> None:
        self._broken = reason
        if request is not None:
            self._abandoned.append((request, buffers))
