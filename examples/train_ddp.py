"""Train the MLP of train_mlp.py data-parallel: every rank runs the same step on its slice of
the batch; gradients are averaged over the ranks (and with --zero 1 or 2 the optimizer
state is sharded over them).

    mpiexec -n 4 python -m mpi4py examples/train_ddp.py --zero 2
    mpiexec -n 2 python -m mpi4py examples/train_ddp.py --compress fp16
    python examples/train_ddp.py            # one process: the world is this process

The step function is the one of train_mlp.py; `jit(..., parallel=DataParallel(zero=...))`
adds the communication. Rank 0 prints the loss (averaged over the ranks) as it falls, the
collectives of the compiled step with the bytes each sends, and every rank's optimizer state
bytes next to what one process would hold.
"""
from __future__ import annotations

import argparse

import numpy as np

import graphopt as go
from graphopt import comm, distributed as dist, ops
from graphopt.optim import AdamW
from graphopt.explain import print_collectives
from train_mlp import BASE_LR, POINTS, init, logits, spirals

STEPS = 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zero", type=int, default=0, choices=(0, 1, 2))
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--bucket-bytes", type=int, default=4096,
                    help="small, so that this small model makes several buckets")
    ap.add_argument("--compress", choices=("fp16", "bf16"),
                    help="send the gradients in this dtype (half the bytes)")
    a = ap.parse_args()
    dist.init()
    rank, ranks = dist.rank(), dist.world_size()
    rng = np.random.default_rng(0)
    x, labels = spirals(rng)
    params = init(rng)
    whole_state = 2 * sum(p.numpy().nbytes for p in params.values())  # AdamW: two moments
    mine = slice(rank * POINTS // ranks, (rank + 1) * POINTS // ranks)  # this rank's slice
    x, labels = x[mine], labels[mine]
    opt = AdamW(params, lr=BASE_LR, weight_decay=1e-4)
    grad_fn = go.value_and_grad(lambda x, labels: ops.softmax_cross_entropy(
        logits(params, x), labels), wrt=params)

    def train_step(x, labels):
        loss, grads = grad_fn(x, labels)  # averaged over the ranks
        opt.step(grads)
        return loss

    step = go.jit(train_step, parallel=dist.DataParallel(
        zero=a.zero, bucket_bytes=a.bucket_bytes, compress=a.compress))
    compiled = step.lower(x, labels)
    world = comm.group("world")
    for i in range(a.steps):
        loss = world.all_reduce(np.asarray(step(x, labels)), "sum") / ranks
        if rank == 0 and (i % 10 == 0 or i == a.steps - 1):
            print(f"step {i:3d}  loss {float(loss):.4f}")

    state = sum(p.numpy().nbytes for p in opt.parameters() if p.numpy().ndim)
    states = world.gather_objects(state)
    if rank == 0:
        print(f"\n{ranks} rank(s), zero={a.zero}, compress={a.compress}: the collectives of "
              f"the compiled step (graph {compiled.graph.name}, {len(compiled.graph.nodes)} "
              f"nodes)")
        print_collectives(compiled.graph)
        print(f"optimizer state bytes per rank: {states} (one process: {whole_state})")

if __name__ == "__main__":
    main()
