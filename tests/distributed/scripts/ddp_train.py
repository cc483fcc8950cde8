"""A small MLP trained data-parallel; run under mpiexec, or imported for the one-process run.

    mpiexec -n N python ddp_train.py OUT [CASE...]      CASE: optimizer:zero[:clip][:embed]
                                                        e.g. adam:2, lazyadam:0:embed

Each rank trains each case on its slice of the same batch and writes, per case, its
parameters, losses, the bytes of optimizer state it holds and the collectives of its step
to OUT/rank<r>.json (by case, then name; floats as JSON writes them, which round-trip). `train(...)` with ranks=1 and no parallel is the one
process that sees the whole batch.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import graphopt as go
from graphopt import distributed as dist
from graphopt import ops, optim

BATCH, SIZES = 48, [(5, 16), (16, 16), (16, 3)]
OPTIMIZERS = {
    "sgd": lambda p: optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: optim.Adam(p, lr=0.01),
    "adamw": lambda p: optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "lamb": lambda p: optim.LAMB(p, lr=0.01, weight_decay=0.01),
}
ROW_OPTIMIZERS = {"lazyadam": lambda p: optim.LazyAdam(p, lr=0.01)}  # for embed
VOCAB = 20  # embed: the first layer looks up 5 features of 2 ids per example in a table


def parse(case: str) -> tuple[str, int, bool, bool]:
    """optimizer, zero stage, clip, embed."""
    opt, zero, *flags = case.split(":")
    return opt, int(zero), "clip" in flags, "embed" in flags


def data(dtype, embed=False):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0][0])).astype(dtype)
    labels = rng.integers(0, SIZES[-1][1], BATCH).astype(np.int32)
    return (rng.integers(0, VOCAB, (BATCH, 2)) if embed else x), labels


def init(dtype, embed=False):
    rng = np.random.default_rng(1)
    params = {}
    if embed:  # a row gradient: the rows of the ids looked up
        params["emb"] = go.Parameter(rng.standard_normal((VOCAB, SIZES[0][0])).astype(dtype),
                                     name="emb")
    for i, (a, b) in enumerate(SIZES):
        params[f"fc{i}.w"] = go.Parameter((rng.standard_normal((a, b)) / np.sqrt(a)).astype(dtype),
                                          name=f"fc{i}.w")
        params[f"fc{i}.b"] = go.Parameter(np.zeros(b, dtype), name=f"fc{i}.b")
    return params


def loss_of(params, embed: bool = False):
    """The MLP's loss on a batch, as a function of (x, labels); `embed`: x are ids, looked
    up in params["emb"] (a row gradient) and averaged per example."""
    def loss_fn(x, labels):
        h = ops.mean(ops.embedding(params["emb"], x, sparse=True), axis=1) if embed else x
        for i in range(len(SIZES)):
            h = h @ params[f"fc{i}.w"] + params[f"fc{i}.b"]
            if i < len(SIZES) - 1:
                h = ops.tanh(h)
        return ops.softmax_cross_entropy(h, labels)
    return loss_fn


def make_step(opt_name: str, clip: bool, dtype=np.float64, parallel=None, rank: int = 0,
              ranks: int = 1, embed: bool = False, start=None):
    """The jitted training step from the same start (or from where `start(params, opt)`
    puts them: a checkpoint), and this rank's slice of the batch:
    (step, x, labels, params, optimizer)."""
    x, labels = data(dtype, embed)
    part = BATCH // ranks
    x, labels = x[rank * part:(rank + 1) * part], labels[rank * part:(rank + 1) * part]
    params = init(dtype, embed)
    opt = {**OPTIMIZERS, **ROW_OPTIMIZERS}[opt_name](params)
    if start is not None:
        start(params, opt)
    grad_fn = go.value_and_grad(loss_of(params, embed), wrt=params)

    def train_step(x, labels):
        loss, grads = grad_fn(x, labels)
        if clip:
            grads, _ = optim.clip_grad_norm(grads, 0.5)
        opt.step(grads)
        return loss

    return go.jit(train_step, parallel=parallel), x, labels, params, opt


def train(opt_name: str, steps: int, clip: bool, dtype=np.float64, parallel=None,
          rank: int = 0, ranks: int = 1, embed: bool = False, start=None):
    """Train from the same start (or `start`'s, as make_step); returns the parameters, the
    optimizer, the losses and the compiled step."""
    step, x, labels, params, opt = make_step(opt_name, clip, dtype, parallel, rank, ranks,
                                             embed, start)
    losses = [float(step(x, labels)) for _ in range(steps)]
    return params, opt, losses, step.lower(x, labels)


def state_bytes(opt) -> int:
    """The bytes of the optimizer's state tensors this process holds (not its scalars)."""
    return sum(p.numpy().nbytes for p in opt.parameters() if p.numpy().ndim)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--bucket-bytes", type=int, default=256)
    ap.add_argument("--dtype", default="float64")
    a = ap.parse_args(argv)
    dist.init()
    out = {}
    for case in a.cases:
        opt_name, zero, clip, embed = parse(case)
        parallel = dist.DataParallel(zero=zero, bucket_bytes=a.bucket_bytes)
        params, opt, losses, compiled = train(opt_name, a.steps, clip, np.dtype(a.dtype),
                                              parallel, dist.rank(), dist.world_size(), embed)
        out[case] = {"params": {k: p.numpy().tolist() for k, p in params.items()},
                     "losses": losses, "state_bytes": state_bytes(opt),
                     "memory_report": str(compiled.memory_report()),
                     "collectives": [n.op for n in compiled.graph.nodes if n.opdef.ordered]}
    (a.out / f"rank{dist.rank()}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
