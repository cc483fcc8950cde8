"""A job that hangs: rank 1 raises without graphopt.distributed.init() (so nothing aborts the
job) while rank 0 waits in a blocking MPI call. For the test harness's own test."""
from mpi4py import MPI

if MPI.COMM_WORLD.rank == 1:
    raise RuntimeError("rank 1 gives up, and nothing ends the job")
MPI.COMM_WORLD.barrier()
