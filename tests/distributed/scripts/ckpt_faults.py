"""Sharded checkpoints that must fail alike on every rank, then a save killed midway.

    mpiexec -n 2 python ckpt_faults.py OUT DIR KILL [checks]

Trains adam under zero=1 for 2 steps and saves DIR/good.ckpt. With `checks`: loads of
damaged copies of it (made by rank 0) and saves that must fail are each a CheckpointError on
every rank, with nothing changed. Then every rank writes its result (the weights and step
count the checkpoint holds, the checks' failures), doubles its weights and saves again over
good.ckpt, and is SIGKILLed in that save: KILL "write": rank 1, once its data file is
written; "commit": rank 0, as it renames the manifest into place.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import ddp_train as ddp
import numpy as np
from rankio import ARGS, Checks, save
from reshard import odd_parameters

import graphopt as go
from graphopt import comm
from graphopt import distributed as dist
from graphopt.checkpoint import collect, sharded
from graphopt.errors import CheckpointError

DIR, KILL = Path(ARGS[0]), ARGS[1]
sharded.BLOCK = 8  # a CRC-32 per element: a rank reads no byte of another's shard
dist.init()
r, n = dist.rank(), dist.world_size()
c = Checks()
parallel = dist.DataParallel(zero=1, bucket_bytes=256)
params, opt, _, _ = ddp.train("adam", 2, False, np.float64, parallel, r, n)
good = DIR / "good.ckpt"
go.save(good, params, opt)


def snapshot() -> dict[str, np.ndarray]:
    return {p.name: p.numpy() for p in collect(params, opt)}


def unchanged(name: str, before: dict[str, np.ndarray]) -> None:
    after = snapshot()
    c.check(f"{name}: nothing changed", all(np.array_equal(before[k], after[k]) for k in before),
            name)


def refused(name: str, path: Path, *parts: str, objects: tuple = (params, opt)) -> str:
    before = snapshot()
    message = c.raises(name, CheckpointError, lambda: go.load(path, *objects), *parts)
    unchanged(name, before)
    return message


def variant(name: str, change) -> Path:
    """A copy of good.ckpt changed by rank 0; every rank waits for it."""
    path = DIR / f"{name}.ckpt"
    if r == 0:
        shutil.copytree(good, path)
        manifest = json.loads((path / sharded.MANIFEST).read_text())
        change(path, path / manifest["data"], manifest)
    dist.barrier()
    return path


def flip(path: Path, data: Path, manifest: dict) -> None:
    """A flipped byte in a part of rank 1's shard, which only rank 1 reads."""
    file, offset, _, _ = next(p for p in manifest["tensors"]["fc1.w.exp_avg"]["parts"]
                              if p[0] == "rank1.bin")
    raw = bytearray((data / file).read_bytes())
    raw[offset + 3] ^= 0x10
    (data / file).write_bytes(bytes(raw))




if "checks" in ARGS:
    odd = odd_parameters()
    go.save(DIR / "odd.ckpt", odd)
    for p in odd:
        go.assign(p, np.zeros(p.shape, p.numpy().dtype))
    go.load(DIR / "odd.ckpt", odd)
    c.check("every dtype round-trips", all(
        np.array_equal(p.numpy(), q.numpy()) and p.numpy().dtype == q.numpy().dtype
        for p, q in zip(odd, odd_parameters())))
    message = refused("a flipped byte only rank 1 reads", variant("flip", flip),
                      "rank1.bin is damaged", "CRC-32", f"(on rank 1 of {n})",
                      "nothing was loaded on any rank")
    messages = comm.group("world").gather_objects(message)
    c.check("the message is the same on every rank", len(set(messages)) == 1, messages)
    refused("a missing data file", variant(
        "missing", lambda p, d, m: (d / "rank0.bin").unlink()), "rank0.bin is missing")
    refused("a truncated data file", variant(
        "truncated", lambda p, d, m: os.truncate(d / "rank1.bin", m["files"]["rank1.bin"]["bytes"] - 8)),
        "rank1.bin holds", "where the manifest says")
    refused("a damaged manifest", variant(
        "manifest", lambda p, d, m: (p / sharded.MANIFEST).write_text(json.dumps(m)[:200])),
        "manifest.json is not JSON")
    refused("no manifest", variant(
        "no-manifest", lambda p, d, m: (p / sharded.MANIFEST).unlink()),
        "it has no manifest.json")
    other = ddp.OPTIMIZERS["sgd"](params)
    refused("another optimizer's state", good, "missing", "unexpected",
            objects=(params, other))

    # A save that fails on one rank fails on all, and leaves the old checkpoint as it was.
    files = sorted(os.listdir(good))
    bias = params["fc0.b"].numpy()
    if r == 1:
        go.assign(params["fc0.b"], bias + 1)
    c.raises("weights that differ between ranks", CheckpointError,
             lambda: go.save(good, params, opt), "'fc0.b' differs between rank 0 and rank 1",
             "must be the same on every rank",
             "the previous checkpoint is unchanged")
    go.assign(params["fc0.b"], bias)
    c.check("a failed save leaves the directory as it was", sorted(os.listdir(good)) == files,
            (files, sorted(os.listdir(good))))
    if r == 0:
        (DIR / "file.ckpt").write_text("x")
    dist.barrier()
    c.raises("a save onto a file", CheckpointError,
             lambda: go.save(DIR / "file.ckpt", params, opt), "is a file", f"(on rank 0 of {n})")
    before = snapshot()
    go.load(good, params, opt)
    unchanged("the checkpoint loads after all that", before)

save(r, {"failures": c.failures, "checks": c.count,
         "weights": {k: p.numpy().tolist() for k, p in params.items()},
         "step": int(opt.step_count.numpy())})
dist.barrier()

# -- killed mid-save ----------------------------------------------------------------------------
if KILL == "write" and r == 1:
    write = sharded._write

    def _write(*args):
        out = write(*args)
        os.kill(os.getpid(), signal.SIGKILL)
        return out

    sharded._write = _write
elif KILL == "commit" and r == 0:
    replace = os.replace

    def _replace(src, dst):
        if str(dst).endswith(sharded.MANIFEST):
            os.kill(os.getpid(), signal.SIGKILL)
        replace(src, dst)

    os.replace = _replace
for p in params.values():
    go.assign(p, p.numpy() * 2)
go.save(good, params, opt)
print("the save was not killed")
