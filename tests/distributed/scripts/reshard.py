"""One stage of a resharding round trip: load each case's checkpoint (saved at another world
size or zero stage), train on, save. Run under mpiexec, or `stage(...)` in one process.

    mpiexec -n N python reshard.py OUT --steps K [--load FMT] [--save FMT] CASE...

CASE: name=optimizer:zero[:late]; FMT: a path with `{case}` for the case's name. A case's
shards are made before its load (`parallel.sharding(opt)`: each rank reads only its part of
the state), or with `late`, by its first step (the load reads the state whole). Each rank
writes per case its parameters, losses, the bytes its load read and the bytes of the
logical tensors its Parameters take, to OUT/rank<r>.json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import ddp_train as ddp
import numpy as np

import graphopt as go
from graphopt import distributed as dist
from graphopt.checkpoint import collect, sharded
from graphopt.checkpoint.logical import plan


@contextlib.contextmanager
def counting(read: list[int]):
    """Adds to read[0] the bytes os.pread reads meanwhile (a load, of the data files)."""
    pread = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        data = pread(fd, n, offset)
        read[0] += len(data)
        return data

    os.pread = counted
    try:
        yield
    finally:
        os.pread = pread


def odd_parameters() -> list:
    """Parameters of every kind of storage: bf16 (its bits), bool, i32, empty, 0-d."""
    rng = np.random.default_rng(4)
    return [go.Parameter(rng.standard_normal((3, 5)), dtype="bf16", name="odd.bf16"),
            go.Parameter(rng.random(7) < 0.5, name="odd.bool"),
            go.Parameter(rng.integers(-9, 9, (2, 2)).astype(np.int32), name="odd.i32"),
            go.Parameter(np.zeros((0, 4), np.float32), name="odd.empty"),
            go.Parameter(np.float64(2.5), name="odd.scalar")]


def stage(cases: list[str], steps: int, load: str | None, save: str | None, rank: int = 0,
          ranks: int = 1) -> dict:
    out = {}
    for case in cases:
        name, spec = case.split("=")
        opt_name, zero, *late = spec.split(":")
        parallel = dist.DataParallel(zero=int(zero), bucket_bytes=256)
        took: dict = {}

        def start(params, opt, name=name, zero=int(zero), late=bool(late), took=took,
                  parallel=parallel):
            if zero and not late:
                parallel.sharding(opt)
            if load:
                read = [0]
                with counting(read):
                    go.load(load.format(case=name), params, opt)
                holdings, _ = plan(collect(params, opt), "")
                took.update(read=read[0], needed=sum(
                    (p.stop - p.start) * h.param.dtype.itemsize for h in holdings
                    for p in h.parts))

        params, opt, losses, _ = ddp.train(opt_name, steps, False, np.float64, parallel, rank,
                                           ranks, start=start)
        if save:
            go.save(save.format(case=name), params, opt)
        out[name] = {"params": {k: p.numpy().tolist() for k, p in params.items()},
                     "losses": losses, **took}
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--load")
    ap.add_argument("--save")
    ap.add_argument("--block", type=int, help="the bytes a CRC-32 covers in what it saves")
    a = ap.parse_args(argv)
    if a.block:
        sharded.BLOCK = a.block
    dist.init()
    out = stage(a.cases, a.steps, a.load, a.save, dist.rank(), dist.world_size())
    (a.out / f"rank{dist.rank()}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
