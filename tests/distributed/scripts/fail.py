"""A job in which rank 1 fails after init while the others all_reduce, which would wait for
it forever. Usage: fail.py OUT MODE, MODE one of raise (an uncaught exception), kill (SIGKILL)
or stuck (rank 1 sleeps: the others' timeout ends the job). Rank 1 writes the time it
failed; no rank gets to the end."""
import os
import signal
import time

import numpy as np
from rankio import ARGS, save

import graphopt.distributed as dist
from graphopt import comm

mode = ARGS[0]
dist.init()
world = comm.group("world")
world.all_reduce(np.ones(4, np.float32), "sum")  # every rank got this far
if dist.rank() == 1:
    save(1, {"failed_at": time.time()})
    if mode == "raise":
        raise RuntimeError("rank 1 gives up")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "stuck":
        time.sleep(600)
world.all_reduce(np.ones(1000, np.float32), "sum")
print(f"rank {dist.rank()} reached the end", flush=True)
