"""What a rank does when its program fails: print the traceback, marked with its rank, and
end the whole job.

MPI knows nothing of Python exceptions. Under a plain `mpiexec -n N python script.py`, a rank
whose script raises prints its traceback and then waits in MPI's finalization, and the other
ranks wait in their next collective: measured with MPICH's mpiexec, the job never ends.
`python -m mpi4py script.py` aborts the job on an uncaught exception; `install` does the same
for any launcher once graphopt.distributed.init() ran in a job of more than one rank. (A rank
killed by a signal is mpiexec's to see: MPICH's ends the job at once.)
"""
from __future__ import annotations

import io
import sys
import threading
import time
from typing import Any, Callable


def _with_prefix(prefix: str, hook: Callable[..., Any], default: Callable[..., Any],
                 *args: Any) -> None:
    """Run an exception hook with what it writes on stderr prefixed, line by line, and written
    at once: the ranks' tracebacks interleave on mpiexec's stderr, a whole line at a time.
    The previous hook's output is kept as it was; if the hook itself fails, Python's own."""
    saved, sys.stderr = sys.stderr, io.StringIO()
    try:
        try:
            hook(*args)
        except Exception:
            default(*args)
    finally:
        text, sys.stderr = sys.stderr.getvalue(), saved
        saved.write("".join(prefix + line for line in text.splitlines(keepends=True)))
        saved.flush()


_FORWARD_SECONDS = 0.25


def install(rank: int, size: int, abort: Callable[[int], None]) -> None:
    """From now on an uncaught exception in the main thread prints its traceback (through the
    previous sys.excepthook, each line prefixed `[rank R] `), flushes stdout and stderr, and
    calls `abort` (MPI.COMM_WORLD.Abort: the whole job ends) with status 1, or 130 for a
    KeyboardInterrupt, as `python -m mpi4py` does. An uncaught exception in another thread only
    gets the prefix: as in any Python program, it ends that thread, not the process."""
    prefix = f"[rank {rank}] "
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        try:
            _with_prefix(prefix, previous, sys.__excepthook__, kind, exc, tb)
            sys.stderr.write(f"{prefix}graphopt.distributed: uncaught {kind.__name__} on rank "
                             f"{rank}: aborting all {size} ranks\n")
            for stream in (sys.stdout, sys.stderr):
                stream.flush()  # (MPI_Abort ends the process without Python's flushes)
            # The launcher forwards a rank's output from a pipe; the abort tears the job
            # down at once, and a traceback still in the pipe was seen lost (1 run in ~10 on
            # 2 loaded cores). A moment first lets it through.
            time.sleep(_FORWARD_SECONDS)
        except Exception:
            pass
        finally:
            abort(130 if issubclass(kind, KeyboardInterrupt) else 1)

    previous_thread = threading.excepthook

    def thread_excepthook(args: Any) -> None:
        _with_prefix(prefix, previous_thread, threading.__excepthook__, args)

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
