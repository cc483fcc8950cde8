"""The gradient path of data-parallel training, in one MPI job (checked by
test_data_parallel_gradients.py): compressed gradients, the global overflow decision, and
the deferred reduction of an accumulation. Usage: ddp_gradients.py OUT [--steps N].

Each rank writes to OUT/rank<r>.json, per part:
- "compress": examples/train_mlp.py's model (f32, AdamW) trained `--steps` steps with
  compress None, "fp16" and "bf16" (and "fp16:2": fp16 at zero=2): the losses (averaged over the ranks), the parameters,
  the bytes one rank sends per step by the compiled graph's cost and as counted at the
  communicator, the dtypes of the collectives, and explain's collectives section.
- "overflow": a DynamicLossScaler step (zero=0, zero=2, and under an Accumulate) where one
  rank's gradient is NaN at one step: the parameters before and after it, what the step
  returned, the scale and the skip count.
- "accumulate": Accumulate(opt, k) for 2 updates (zero=0 and zero=1): the parameters, the
  ordered nodes of the compiled graph, and the communicator's calls per micro-step; and the
  parameters of one process (no DataParallel) over the same micro-batches, whole.
"""
from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np
from rankio import ARGS, OUT, save

import graphopt as go
import graphopt.distributed as dist
from graphopt import amp, comm, ops, optim
from graphopt.passes.cost import bytes_sent

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import ddp_train as ddp  # noqa: E402
from train_mlp import BASE_LR, POINTS, init, logits, spirals  # noqa: E402

K = 4  # micro-steps per update (48 rows: micro-batches of 12, 4 rows a rank at 3 ranks)


class Counting:
    """The world's communicator, recording each collective a step hands it: its name, dtype
    and the bytes a ring sends for it (what OpDef.sends counts, for the array it got)."""

    def __init__(self, inner: comm.Communicator):
        self.inner, self.rank, self.size = inner, inner.rank, inner.size
        self.calls: list[tuple[str, str, int]] = []

    def _note(self, op: str, x: np.ndarray, share: int, nbytes: int) -> None:
        n = self.size
        self.calls.append((op, x.dtype.name, share * (n - 1) * nbytes // n))

    def all_reduce(self, x, reduce):
        self._note("all_reduce", x, 2, x.nbytes)
        return self.inner.all_reduce(x, reduce)

    def reduce_scatter(self, x, reduce):
        self._note("reduce_scatter", x, 1, x.nbytes)
        return self.inner.reduce_scatter(x, reduce)

    def all_gather(self, x):
        self._note("all_gather", x, 1, x.nbytes * self.size)
        return self.inner.all_gather(x)

    def broadcast(self, x, root):
        self._note("broadcast", x, 1, x.nbytes)
        return self.inner.broadcast(x, root)

    def gather_objects(self, obj):
        return self.inner.gather_objects(obj)


def graph_bytes(compiled) -> int:
    return sum(bytes_sent(n) for n in compiled.graph.nodes)


def compress_part(world: Counting, steps: int) -> dict:
    r, n = world.rank, world.size
    out = {}
    for mode, zero in ((None, 0), ("fp16", 0), ("bf16", 0), ("fp16", 2)):
        rng = np.random.default_rng(0)
        x, labels = spirals(rng)
        params = init(rng)
        mine = slice(r * POINTS // n, (r + 1) * POINTS // n)
        x, labels = x[mine], labels[mine]
        opt = optim.AdamW(params, lr=BASE_LR, weight_decay=1e-4)
        grad_fn = go.value_and_grad(lambda x, labels: ops.softmax_cross_entropy(
            logits(params, x), labels), wrt=params)

        def train_step(x, labels):
            loss, grads = grad_fn(x, labels)
            opt.step(grads)
            return loss

        parallel = dist.DataParallel(zero=zero, bucket_bytes=4096, compress=mode)
        step = go.jit(train_step, parallel=parallel)
        compiled = step.lower(x, labels)
        losses, sent = [], []
        for _ in range(steps):
            world.calls.clear()
            loss = step(x, labels)
            sent.append(sum(b for _, _, b in world.calls))
            losses.append(float(world.inner.all_reduce(np.asarray(loss), "sum")) / n)
        text = io.StringIO()
        go.explain(step, x, labels, out=text)
        text = text.getvalue()
        out[f"{mode}:{zero}" if zero else str(mode)] = {
            "losses": losses, "params": {k: p.numpy().tolist() for k, p in params.items()},
            "graph_bytes": graph_bytes(compiled), "sent": sent,
            "dtypes": sorted({n.out.type.dtype.name for n in compiled.graph.nodes
                              if n.op == "all_reduce"}),
            "collectives": sorted({(n.op, n.inputs[0].type.dtype.name)
                                   for n in compiled.graph.nodes if n.opdef.ordered}),
            "explain": text[text.index("=== collectives"):text.index("=== llvm")]}
    return out


def scaled_step(params, scaler, target, with_poison=True):
    """A loss-scaled step on ddp_train's model; `poison` (0, or NaN on one rank) makes that
    rank's gradient NaN."""
    loss_fn = ddp.loss_of(params)
    grad_fn = go.value_and_grad(
        lambda x, labels, poison: scaler.scale(loss_fn(x, labels) + poison * ops.sum(
            params["fc0.w"])), wrt=params)

    def train_step(x, labels, poison):
        loss, grads = grad_fn(x, labels, poison)
        return scaler.step(target, grads)

    return train_step


def overflow_part(r: int, n: int) -> dict:
    out = {}
    x, labels = ddp.data(np.float32)
    part = ddp.BATCH // n
    x, labels = x[r * part:(r + 1) * part], labels[r * part:(r + 1) * part]
    for case in ("zero0", "zero2", "accumulate"):
        params = ddp.init(np.float32)
        opt = optim.Adam(params, lr=0.01)
        target = optim.Accumulate(opt, K) if case == "accumulate" else opt
        scaler = amp.DynamicLossScaler(init_scale=2.0 ** 10)
        parallel = dist.DataParallel(zero=2 if case == "zero2" else 0, bucket_bytes=256)
        step = go.jit(scaled_step(params, scaler, target), parallel=parallel)
        record = {"applied": [], "scale": [], "skipped": []}
        for i in range(4):
            poison = np.float32(np.nan if (i == 2 and r == n - 1) else 0.0)
            before = {k: p.numpy().copy() for k, p in params.items()}
            state_before = [p.numpy().copy() for p in target.parameters()]
            record["applied"].append(bool(step(x, labels, poison)))
            record["scale"].append(scaler.scale_value)
            record["skipped"].append(scaler.skipped_steps)
            if i == 2:
                record["unchanged"] = all(np.array_equal(before[k], p.numpy())
                                          for k, p in params.items()) and all(
                    np.array_equal(a, p.numpy()) for a, p in zip(state_before,
                                                                 target.parameters()))
        record["params"] = {k: p.numpy().tolist() for k, p in params.items()}
        out[case] = record
    return out


def accumulate_step(params, target):
    grad_fn = go.value_and_grad(ddp.loss_of(params), wrt=params)

    def train_step(x, labels):
        loss, grads = grad_fn(x, labels)
        target.step(grads)
        return loss

    return train_step


def micro_batches(rank: int, ranks: int):
    """2 updates of K micro-batches, each a different slice of ddp_train's batch (this rank's
    part of each)."""
    x, labels = ddp.data(np.float64)
    size = ddp.BATCH // K
    assert size % ranks == 0, "every rank takes an equal part of each micro-batch"
    for j in range(2 * K):
        at = (j % K) * size
        mx, ml = x[at:at + size], labels[at:at + size]
        part = size // ranks
        yield mx[rank * part:(rank + 1) * part], ml[rank * part:(rank + 1) * part]


def accumulate_part(world: Counting) -> dict:
    r, n = world.rank, world.size
    params = ddp.init(np.float64)  # one process over the same (whole) micro-batches
    alone = go.jit(accumulate_step(params, optim.Accumulate(optim.Adam(params, lr=0.01), K)))
    for mx, ml in micro_batches(0, 1):
        alone(mx, ml)
    out = {"one process": {k: p.numpy().tolist() for k, p in params.items()}}
    for zero in (0, 1):
        params = ddp.init(np.float64)
        target = optim.Accumulate(optim.Adam(params, lr=0.01), K)
        step = go.jit(accumulate_step(params, target),
                      parallel=dist.DataParallel(zero=zero, bucket_bytes=256))
        calls = []
        for mx, ml in micro_batches(r, n):
            world.calls.clear()
            step(mx, ml)
            calls.append([op for op, _, _ in world.calls])
        compiled = step.lower(mx, ml)
        out[f"zero{zero}"] = {
            "params": {k: p.numpy().tolist() for k, p in params.items()}, "calls": calls,
            "nodes": [(nd.op, nd.attrs.get("every"), bytes_sent(nd), bytes_sent(nd, False))
                      for nd in compiled.graph.nodes if nd.opdef.ordered]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args(ARGS)
    dist.init()
    world = Counting(comm.group("world"))
    comm.set_group("world", world)
    result = {"compress": compress_part(world, a.steps),
              "overflow": overflow_part(world.rank, world.size),
              "accumulate": accumulate_part(world)}
    save(world.rank, result)


if __name__ == "__main__":
    assert OUT.is_dir()
    main()
