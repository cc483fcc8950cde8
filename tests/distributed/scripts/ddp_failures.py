"""Data-parallel steps that fail on one rank (rank 1), under mpiexec -n N:

    python ddp_failures.py OUT mismatch   rank 1 traces another batch size: the ranks
                                          compiled different steps
    python ddp_failures.py OUT raise      rank 1's step fails before its first collective
                                          (an index out of range in its slice); the others
                                          wait in the gradient all_reduce until the timeout

Each rank catches what its step raises and writes (rankio) the error's type and message and
whether every Parameter is as it was; a rank that raised waits for the others' results,
then every rank ends at once (a broken communicator cannot be finalized)."""
from __future__ import annotations

import os
import time

import numpy as np
from rankio import ARGS, OUT, save

import graphopt as go
from graphopt import distributed as dist
from graphopt import ops, optim

dist.init(timeout=float(os.environ.get("GRAPHOPT_TEST_TIMEOUT", "4")))
rank, ranks = dist.rank(), dist.world_size()
mode = ARGS[0]
table = go.Parameter(np.linspace(0, 1, 40).reshape(10, 4), name="table")
w = go.Parameter(np.ones((4, 2)), name="w")
opt = optim.Adam([table, w], lr=0.1)
grad_fn = go.value_and_grad(lambda ids: ops.sum(ops.gather(table, ids) @ w), wrt=[table, w])


def step(ids):
    loss, grads = grad_fn(ids)
    opt.step(grads)
    return loss


ids = np.arange(6 if mode == "mismatch" and rank == 1 else 4) % 10
if mode == "raise" and rank == 1:
    ids[2] = 99  # out of the table's range: the gather fails on this rank only
kept = [table, w, opt.step_count]  # (the state moves into shards when the step is traced)
before = [p.numpy().copy() for p in kept]
try:
    go.jit(step, parallel=dist.DataParallel(zero=1))(ids)
    error = None
except go.GraphoptError as e:
    error = e
unchanged = all(np.array_equal(a, p.numpy()) for a, p in zip(before, kept)) and \
    all(not np.any(p.numpy()) for p in opt.sharding.parameters())  # the moments: still 0
save(rank, {"error": type(error).__name__ if error else None, "message": str(error),
       "unchanged": unchanged})
if mode == "raise":  # the others' results first: ending now would take them down too
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and \
            not all((OUT / f"rank{r}.json").exists() for r in range(ranks)):
        time.sleep(0.1)
    os._exit(0)
