"""Training across processes: data parallelism on MPI.

`init()` joins the ranks of an MPI job (`mpiexec -n N python script.py`) as the process
group "world" (graphopt.comm), on an `MPICommunicator` whose every collective gives up after
a timeout instead of hanging; an uncaught exception on one rank then aborts the whole job.
`DataParallel` is the strategy `jit(step, parallel=...)` compiles a step with: gradients
averaged over the ranks, packed into buckets, and with zero=1|2 the optimizer state (and
the gradients) sharded. `check_same` checks that every rank is about to run the same step.
mpi4py is imported by `init`, not by this package: `pip install 'graphopt[dist]'`.
"""
from . import one_rank, passes  # noqa: F401  (register the one_rank, bucket and zero passes)
from .fingerprint import check_same, fingerprint
from .mpi import MPICommunicator
from .parallel import DataParallel
from .world import barrier, init, is_initialized, rank, world_size

__all__ = ["init", "is_initialized", "rank", "world_size", "barrier", "check_same",
           "fingerprint", "MPICommunicator", "DataParallel"]
