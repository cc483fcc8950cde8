#!/usr/bin/env python
"""Data-parallel training steps at 1, 2 and 4 ranks, ZeRO stages 0, 1 and 2: step time split
into compute and communication, bytes sent against the ideal, optimizer state per rank.

    python benchmarks/distributed.py                  # both cases, 1, 2 and 4 ranks, peers
    python benchmarks/distributed.py --quick          # tiny sizes, 1 and 2 ranks (smoke test)
    python benchmarks/distributed.py --cases mlp --ranks 2 --impls graphopt

Cases (`--cases`):
  mlp   benchmarks/train_step.py's mlp-large (its model code, imported): MLP 784-1024-1024-10,
        relu, mean softmax cross-entropy, AdamW (lr 1e-3, weight decay 1e-2), f32; a global
        batch of 256 split evenly over the ranks
  bert  a BERT-shaped Adam update: the parameter shapes of BERT-base (benchmarks/adam.py's
        list: embeddings 30522x768, 512x768, 2x768 and their LayerNorm, BERT_LAYERS layers of
        q, k, v, o 768x768 with biases, two LayerNorms, 768x3072 and 3072x768 with biases; the
        pooler), f32, Adam (lr 1e-3); the loss is sum_p sum(p * x_p) with the x_p arguments
        of the step (a different draw on every rank), so the gradient is x_p and DataParallel
        averages it over the ranks as in training

Implementations (`--impls`; a peer that is not installed, or fails here, is reported with a
note):
  graphopt  graphopt.jit(step, backend="llvm", parallel=DataParallel(zero=0|1|2)) with the
            default 25 MiB buckets; at 1 rank also plain jit without DataParallel (`jit`)
  torch     torch DDP on the gloo backend (zero 0; fused AdamW/Adam, 25 MB buckets), and
            torch's ZeroRedundancyOptimizer over the same optimizer inside DDP (beside
            graphopt's zero 1 and 2)

One MPI job per (case, ranks): `mpiexec -n N python benchmarks/distributed.py --worker job`
runs every configuration in turn, in one process per rank, each from the same weights and
data. Each rank uses max(1, cores // N) threads (graphopt's kernels, OpenBLAS, torch), so the
ranks of a job share the machine's cores; 4 ranks on 2 cores oversubscribe them. In each
configuration: the first call (trace and compile), warm-up steps, then timed steps, each
after a barrier; a step's time is the slowest rank's, and ms/step is the median over the
timed steps (over the rounds: the median of the rounds' medians; rounds are separate jobs,
odd rounds running the configurations in reverse order). Then:

- the parameters are checked to be the same, bit for bit, on every rank (a hash of each
  rank's parameters), and a sample of them (the first SAMPLE elements of each tensor) is
  compared with graphopt zero=0's (`max |Δp|`: ZeRO and torch compute the same steps;
  torch's within PARAM_TOLERANCE is a goal);
- the goals at 2 and 4 ranks: graphopt's step at most 1.0x torch's (zero=0 against DDP,
  zero=1 and 2 against ZeroRedundancyOptimizer; the median of each round's ratio);
- graphopt's step is split into communication, the time inside the collectives' MPI calls
  during the timed steps (the communicator registered as "world" is wrapped by one that
  times each call; a rank's wait for the others is part of it), and compute, the rest of
  the step; each the mean over the ranks, the median over the steps;
- bytes sent per step and rank: the sum of graphopt.passes.cost.bytes_sent (a ring
  algorithm's) over the compiled graph's collectives, next to the ideal all_reduce of the
  gradients, 2(N-1)/N of their bytes;
- optimizer state bytes per rank: the arrays of the Parameters the optimizer holds
  (`opt.parameters()`: moments or their shards; the 0-d step counter and hyper-parameters
  are counted apart), next to the state one process holds (zero=0's, every rank holding all
  of it) divided by N; ZeRO's allowance is the padding of its flat buckets to a multiple of
  N (from the optimizer's sharding).

The machine's memory bandwidth is measured before and after the run (benchmarks/common.py),
the load average (/proc/loadavg) is recorded before and after, and a 2-core probe before each
job. Writes <out>/distributed.md (tables) and distributed.json (everything measured).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

import common
from common import (add_run_options, bandwidth_report, begin, cpu_probe, fmt_ms,
                    machine_summary, merge_round, peak_rss_mb, run_on_snapshot,
                    worker_bandwidth)

CASES = ["mlp", "bert"]
IMPLS = ["graphopt", "torch"]
REQUIRES = {"graphopt": ["graphopt", "mpi4py"], "torch": ["torch"]}
RANKS = (1, 2, 4)
QUICK_RANKS = (1, 2)
BATCH = 256  # the mlp's global batch, split evenly over the ranks
SEED = 0
# BERT-base has 12 layers (109.5M parameters); the case runs 4 (52.8M). All 12 do not fit
# at 4 ranks on this machine (23.5 GiB): a rank's peak resident memory was 2.5 GB at 4
# layers, and it grows with the parameters (weights, gradients and their flat buckets, the
# all_reduce's result, Adam's two moments: about 5.3 GB a rank, 21 GB a job at 12 layers).
BERT_LAYERS = 4
SAMPLE = 1024  # elements of each parameter compared across configurations
# Steps after the first call: (warm-up, timed); the same for every configuration of a case.
STEPS = {"mlp": (3, 10), "bert": (2, 5)}
QUICK_STEPS = (1, 3)
JOB_TIMEOUT = 1800  # seconds for one MPI job (every configuration of one case and size)
REFERENCE = "graphopt zero=0"  # max |Δp| is against this configuration's parameters
# torch's parameters after the steps equal graphopt's within this (f32, a hundredth of one
# step of Adam at lr 1e-3: the rounding of the reduction order, not a different step)
PARAM_TOLERANCE = 1e-5
PEER_NAMES = {0: "torch DDP", 1: "torch ZeRO-1"}


# -- configurations ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """One way to run the step: an implementation at a ZeRO stage (None: no DataParallel)."""

    impl: str
    zero: int | None

    @property
    def name(self) -> str:
        if self.impl == "torch":
            return "torch DDP" if self.zero == 0 else "torch ZeRO-1"
        return "graphopt jit" if self.zero is None else f"graphopt zero={self.zero}"

    @classmethod
    def parse(cls, text: str) -> Config:
        impl, zero = text.split(":")
        return cls(impl, None if zero == "none" else int(zero))

    def __str__(self) -> str:
        return f"{self.impl}:{'none' if self.zero is None else self.zero}"


def configs_for(impls: list[str], ranks: int) -> list[Config]:
    """The configurations a job of `ranks` runs, in order."""
    out = []
    if "graphopt" in impls:
        out += [Config("graphopt", None)] if ranks == 1 else []
        out += [Config("graphopt", z) for z in (0, 1, 2)]
    if "torch" in impls:
        out += [Config("torch", 0), Config("torch", 1)]
    return out


# -- cases: weights, each rank's data, the loss in each framework --------------------------------

@dataclass
class Case:
    """A case's model: parameters (the same on every rank), this rank's step arguments, the
    loss over each framework's parameters, and the optimizer's settings."""

    name: str
    label: str
    arrays: dict[str, np.ndarray]
    args: tuple  # this rank's arguments of the step
    loss: Callable[[str, dict, tuple], Any]  # (framework, parameters by name, args) -> loss
    optimizer: str  # "adamw" or "adam"
    hyper: dict  # lr, betas, eps (and weight_decay)
    steps: tuple[int, int]  # (warm-up, timed) after the first call

    @property
    def parameters(self) -> int:
        return sum(a.size for a in self.arrays.values())

    @property
    def gradient_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def mlp_case(rank: int, ranks: int, quick: bool) -> Case:
    """train_step.py's mlp-large (mlp-small with --quick), its batch split over the ranks."""
    import train_step as ts
    name = "mlp-small" if quick else "mlp-large"
    arrays, x, y = ts.make_case(name)
    part = BATCH // ranks
    mine = slice(rank * part, (rank + 1) * part)
    prims: dict[str, Callable[[], Any]] = {"graphopt": ts.graphopt_prims,
                                           "torch": ts.torch_prims}

    def loss(framework: str, params: dict, args: tuple) -> Any:
        return ts.mlp_loss(prims[framework](), params, *args)

    hyper = {"lr": ts.LR, "betas": ts.BETAS, "eps": ts.EPS, "weight_decay": ts.WEIGHT_DECAY}
    return Case("mlp", f"{ts.case_def(name).label.split(',')[0]}, global batch {BATCH}",
                arrays, (x[mine], y[mine]), loss, "adamw", hyper,
                QUICK_STEPS if quick else STEPS["mlp"])


def _uniform(shape: tuple[int, ...], *seed: int) -> np.ndarray:
    """f32 uniform in [-1, 1) from the seeded stream."""
    a = np.empty(math.prod(shape), np.float32)
    np.random.default_rng([SEED, *seed]).random(out=a, dtype=np.float32)
    a *= 2
    a -= 1
    return a.reshape(shape)


def bert_case(rank: int, ranks: int, quick: bool) -> Case:
    """The Adam update of BERT-base's parameters (small ones with --quick) under a loss whose
    gradient is this rank's x_p: sum over the parameters of sum(p * x_p)."""
    import adam
    shapes = (adam.bert_base_shapes(64, 2, 256, 1000, 64) if quick else
              adam.bert_base_shapes(layers=BERT_LAYERS))
    arrays = {f"p{i:03d}": _uniform(s, i) for i, s in enumerate(shapes)}
    xs = [_uniform(s, i, 1 + rank) for i, s in enumerate(shapes)]

    def loss(framework: str, params: dict, args: tuple) -> Any:
        if framework == "graphopt":
            from graphopt import ops
            whole = ops.sum
        else:
            def whole(t):
                return t.sum()
        terms = [whole(p * x) for p, x in zip(params.values(), args[0])]
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return total

    layers = 2 if quick else BERT_LAYERS
    n = sum(a.size for a in arrays.values())
    hyper = {"lr": adam.LR, "betas": (adam.BETA1, adam.BETA2), "eps": adam.EPS}
    return Case("bert", f"BERT-base's {len(shapes)} parameter shapes ({layers} layers), "
                        f"{n / 1e6:.1f}M parameters, Adam" + (" (--quick: small)" * quick),
                arrays, (xs,), loss, "adam", hyper, QUICK_STEPS if quick else STEPS["bert"])


CASE_MAKERS: dict[str, Callable[[int, int, bool], Case]] = {"mlp": mlp_case, "bert": bert_case}


def check_case(case: str) -> None:
    if case not in CASE_MAKERS:
        raise SystemExit(f"unknown case {case!r}; known: {', '.join(CASES)}")


# -- what every configuration measures on its rank -----------------------------------------------

def digest(arrays: list[np.ndarray]) -> str:
    """A hash of the arrays' bytes, in order: equal on two ranks whose parameters are."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def sample(arrays: list[np.ndarray]) -> np.ndarray:
    """The first SAMPLE elements of each array, end to end (f64)."""
    return np.concatenate([a.reshape(-1)[:SAMPLE].astype(np.float64) for a in arrays])


def state_split(arrays: list[Any]) -> dict[str, int]:
    """Bytes of state tensors (at least one axis) and of scalars (0-d: step counters,
    hyper-parameters)."""
    tensors = sum(a.nbytes for a in arrays if a.ndim)
    return {"state_bytes": tensors, "scalar_bytes": sum(a.nbytes for a in arrays) - tensors}


class TimedCommunicator:
    """A communicator that times the collectives of the one it wraps: their seconds since
    the last `reset`, by method. Registered as the group "world", it sees every collective
    graphopt's compiled step runs (each node's op calls the group's communicator), so a step's
    communication is measured inside the timed step itself, with nothing else changed."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.rank, self.size = inner, inner.rank, inner.size
        self.seconds: dict[str, float] = {}

    def reset(self) -> None:
        self.seconds = {}

    def _timed(self, method: str, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return getattr(self.inner, method)(*args)
        finally:
            self.seconds[method] = self.seconds.get(method, 0.0) + time.perf_counter() - start

    def all_reduce(self, x: np.ndarray, reduce: str) -> np.ndarray:
        return self._timed("all_reduce", x, reduce)

    def reduce_scatter(self, x: np.ndarray, reduce: str) -> np.ndarray:
        return self._timed("reduce_scatter", x, reduce)

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        return self._timed("all_gather", x)

    def broadcast(self, x: np.ndarray, root: int) -> np.ndarray:
        return self._timed("broadcast", x, root)

    def gather_objects(self, obj: Any) -> list[Any]:
        return self.inner.gather_objects(obj)  # (the ranks' checks, not a step's traffic)

    def barrier(self) -> None:
        self.inner.barrier()


def timed_steps(step: Callable[[], float], world: TimedCommunicator, steps: tuple[int, int]
                ) -> dict[str, list]:
    """Warm-up steps, then timed ones, each after a barrier so that every rank starts it
    together: the losses, each timed step's seconds, and the seconds of its collectives
    (by collective)."""
    warmup, reps = steps
    losses = [step() for _ in range(warmup)]
    times, comm = [], []
    for _ in range(reps):
        world.barrier()
        world.reset()
        start = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - start)
        comm.append(world.seconds)
    return {"losses": losses, "times": times, "comm": comm}


def collective_nodes(graph) -> list:
    """The nodes that send bytes to other ranks."""
    return [n for n in graph.nodes if n.opdef.sends is not None]


def compute_bytes(graph) -> int:
    """The bytes the graph's other nodes read and write per step (the cost model's)."""
    from graphopt.passes.cost import node_bytes
    return sum(sum(node_bytes(n)) for n in graph.nodes if n.opdef.sends is None)


def rss_mb() -> float:
    """This process's resident memory now (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measured(step: Callable[[], float], world: TimedCommunicator, case: Case,
             values: Callable[[], list[np.ndarray]]) -> dict:
    """The first call, the warm-up and timed steps, then the parameters' hash and sample."""
    start = time.perf_counter()
    first = step()
    out = {"first_call_s": time.perf_counter() - start,
           **timed_steps(step, world, case.steps)}
    out["losses"].insert(0, first)
    arrays = values()
    out.update(digest=digest(arrays), _sample=sample(arrays))
    return out


def padding(sharding) -> dict[str, float]:
    """What ZeRO's padding costs: each flat bucket is padded with zeros to a multiple of N
    elements, so the largest shard holds up to (padded - total) / N elements more than 1/N
    of the bucket, in every state array (`padding_bytes`, per rank), and the reduce_scatter
    and all_gather of the padded bucket send 2(N-1)/N of its padding's bytes more than an
    all_reduce of the unpadded gradients (`padding_sent_bytes`)."""
    state = sent = 0.0
    for b in (b for bs in sharding.buckets.values() for b in bs):
        extra, ranks = b.layout.padded - b.layout.total, b.layout.ranks
        state += extra / ranks * sum(p.numpy().itemsize for p in b.state.values())
        sent += 2 * (ranks - 1) * extra * b.slots[0].param.numpy().itemsize / ranks
    return {"padding_bytes": state, "padding_sent_bytes": sent}


def run_graphopt(case: Case, config: Config, world: TimedCommunicator) -> dict:
    """One graphopt configuration on this rank."""
    import graphopt as go
    from graphopt import distributed as dist
    from graphopt import optim
    from graphopt.passes.cost import bytes_sent
    params = {n: go.Parameter(a, name=n) for n, a in case.arrays.items()}
    opt = (optim.AdamW if case.optimizer == "adamw" else optim.Adam)(params, **case.hyper)
    loss_and_grads = go.value_and_grad(lambda *args: case.loss("graphopt", params, args),
                                       wrt=params)

    def train_step(*args):
        loss, grads = loss_and_grads(*args)
        opt.step(grads)
        return loss

    parallel = None if config.zero is None else dist.DataParallel(zero=config.zero)
    start = time.perf_counter()
    jitted = go.jit(train_step, backend="llvm", parallel=parallel)
    exe = jitted.lower(*case.args)
    out = {"compile_s": time.perf_counter() - start}
    out.update(measured(lambda: float(jitted(*case.args)), world, case,
                        lambda: [p.numpy() for p in params.values()]))
    out.update(state_split([p.numpy() for p in opt.parameters()]))
    if opt.sharding is not None:
        out.update(padding(opt.sharding))
    talks = collective_nodes(exe.graph)
    out["collectives"] = [[n.op, str(n.inputs[0].type), bytes_sent(n)] for n in talks]
    out["bytes_sent"] = sum(bytes_sent(n) for n in talks)
    out["compute_bytes"] = compute_bytes(exe.graph)
    out["peak_rss_mb"], out["rss_mb"] = peak_rss_mb(), rss_mb()
    return out


_TORCH_GROUP: list[bool] = []  # whether torch.distributed is set up in this process


def torch_group(world: TimedCommunicator) -> None:
    """torch.distributed on gloo over this job's ranks (once per process): rank 0 picks a free
    port and every rank learns it through graphopt's communicator."""
    import datetime

    import torch.distributed as tdist
    if _TORCH_GROUP:
        return
    port = None
    if world.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = world.gather_objects(port)[0]
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                             rank=world.rank, world_size=world.size,
                             timeout=datetime.timedelta(seconds=300))
    _TORCH_GROUP.append(True)


def run_torch(case: Case, config: Config, world: TimedCommunicator, threads: int) -> dict:
    """One torch configuration on this rank: DDP (zero 0) or ZeroRedundancyOptimizer (1)."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(threads)
    torch_group(world)
    names = list(case.arrays)

    class Model(torch.nn.Module):
        """The case's parameters (ParameterDict keys cannot hold '.'), its loss as forward."""

        def __init__(self) -> None:
            super().__init__()
            self.p = torch.nn.ParameterDict({n.replace(".", "_"): torch.nn.Parameter(
                torch.tensor(case.arrays[n])) for n in names})

        def forward(self, *args):
            return case.loss("torch", {n: self.p[n.replace(".", "_")] for n in names}, args)

    module = Model()
    model = DistributedDataParallel(module)  # (bucket_cap_mb=25, the default)
    kind = torch.optim.AdamW if case.optimizer == "adamw" else torch.optim.Adam
    hyper = dict(case.hyper, fused=True)
    opt = (kind(model.parameters(), **hyper) if config.zero == 0 else
           ZeroRedundancyOptimizer(model.parameters(), optimizer_class=kind, **hyper))
    targs = tuple([torch.from_numpy(x) for x in a] if isinstance(a, list) else
                  torch.from_numpy(a) for a in case.args)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = model(*targs)
        loss.backward()
        opt.step()
        return float(loss.detach())

    out = measured(step, world, case,
                   lambda: [module.p[n.replace(".", "_")].detach().numpy() for n in names])
    out.pop("comm")  # (DDP's all_reduces run on gloo, overlapping the backward: not split)
    local = opt.optim if config.zero == 1 else opt  # ZeRO's optimizer over this rank's part
    out.update(state_split([t.detach().numpy() for st in local.state.values()
                            for t in st.values() if torch.is_tensor(t)]))
    out["peak_rss_mb"], out["rss_mb"] = peak_rss_mb(), rss_mb()
    return out


def gathered(per_rank: list[dict]) -> dict:
    """One configuration's result from every rank's. A step's time is the slowest rank's;
    its communication and compute (the rest of the step) are the mean over the ranks; each
    is the median over the timed steps. Per-rank figures are kept as lists."""
    errors = [f"rank {r}: {x['error']}" for r, x in enumerate(per_rank) if "error" in x]
    if errors:
        return {"error": "; ".join(errors[:2])}
    first = per_rank[0]
    times = np.array([x["times"] for x in per_rank])  # [rank, step]
    slowest = times.max(axis=0)
    out = {"ms": float(np.median(slowest) * 1e3), "min_ms": float(slowest.min() * 1e3),
           "step_ms": [float(t * 1e3) for t in slowest], "steps": len(first["losses"]),
           "losses": first["losses"],
           "same_on_ranks": len({x["digest"] for x in per_rank}) == 1,
           "state_bytes_per_rank": [x["state_bytes"] for x in per_rank],
           "scalar_bytes": first["scalar_bytes"],
           "first_call_s": max(x["first_call_s"] for x in per_rank),
           "peak_rss_mb_per_rank": [x["peak_rss_mb"] for x in per_rank],
           "rss_mb_per_rank": [x["rss_mb"] for x in per_rank]}
    if "compile_s" in first:
        out["compile_s"] = max(x["compile_s"] for x in per_rank)
    if "comm" in first:
        kinds = sorted({k for x in per_rank for c in x["comm"] for k in c})
        by = {k: np.array([[c.get(k, 0.0) for c in x["comm"]] for x in per_rank])
              for k in kinds}
        comm = sum(by.values()) if by else np.zeros_like(times)
        out["comm_ms"] = float(np.median(comm.mean(axis=0)) * 1e3)
        out["compute_ms"] = float(np.median((times - comm).mean(axis=0)) * 1e3)
        out["comm_ms_by_collective"] = {k: float(np.median(v.mean(axis=0)) * 1e3)
                                        for k, v in by.items()}
    for key in ("compute_bytes", "bytes_sent", "collectives"):
        if key in first:
            out[key] = first[key]
    for key in ("padding_bytes", "padding_sent_bytes"):
        if key in first:
            out[key] = first[key]
    return out


def job_main(case_name: str, configs: list[Config], quick: bool) -> None:
    """One MPI job: every configuration in turn on this rank; rank 0 prints the results."""
    from graphopt import comm
    from graphopt import distributed as dist
    dist.init()
    world = TimedCommunicator(comm.group("world"))
    comm.set_group("world", world)
    rank, ranks = world.rank, world.size
    threads = int(os.environ.get("GRAPHOPT_THREADS", "1"))
    case = CASE_MAKERS[case_name](rank, ranks, quick)
    results: dict[str, dict] = {}
    samples: dict[str, np.ndarray] = {}
    for config in configs:
        try:
            mine = (run_graphopt(case, config, world) if config.impl == "graphopt" else
                    run_torch(case, config, world, threads))
        except Exception as e:  # reported in the results (a peer that fails here)
            tail = traceback.format_exc().strip().splitlines()[-3:]
            mine = {"error": f"{type(e).__name__}: {str(e).strip()[:300]}", "traceback": tail}
        if "_sample" in mine:
            samples[config.name] = mine.pop("_sample")
        results[config.name] = gathered(world.gather_objects(mine))
        del mine
        gc.collect()
    if REFERENCE in samples:
        for name, s in samples.items():
            if "error" not in results[name]:
                results[name]["max_dp_vs_reference"] = float(np.max(np.abs(
                    s - samples[REFERENCE])))
    if rank == 0:
        print("RESULT " + json.dumps({
            "case": case_name, "ranks": ranks, "threads": threads, "label": case.label,
            "parameters": case.parameters, "gradient_bytes": case.gradient_bytes,
            "steps": case.steps, "results": results}), flush=True)


def worker_main(args) -> None:
    if args.worker == "bandwidth":
        print("RESULT " + json.dumps(worker_bandwidth(args.quick)), flush=True)
        return
    job_main(args.case, [Config.parse(c) for c in args.configs.split(",")], args.quick)


# -- the driver ------------------------------------------------------------------------------------

def job_env(ranks: int, cache: Path) -> dict[str, str]:
    """The environment of a job of `ranks`: the cores shared between the ranks."""
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    env = dict(os.environ, GRAPHOPT_THREADS=threads, GRAPHOPT_CACHE_DIR=str(cache))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = threads
    return env


def load_average() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


# The figures merged over rounds (the median; each round's kept as rounds_<key>).
ROUND_KEYS = ("ms", "comm_ms", "compute_ms", "first_call_s")


def run_job(case: str, n: int, configs: list[Config], quick: bool, cache: Path) -> dict:
    """One MPI job: its result (or {"error": ...}), with the 2-core probe taken before it,
    its wall time and the load average after it."""
    probe = cpu_probe()
    start = time.perf_counter()
    job = common.run_mpi_worker(
        __file__, n, ["--worker", "job", "--case", case, "--configs",
                      ",".join(map(str, configs)), *(["--quick"] if quick else [])],
        job_env(n, cache), JOB_TIMEOUT)
    job.update(cpu_probe=probe, wall_s=time.perf_counter() - start, load=load_average())
    return job


def run_jobs(cases: list[str], ranks: list[int], impls: list[str], rounds: int, quick: bool,
             cache: Path) -> tuple[dict, bool]:
    """Every (case, ranks) job, `rounds` times (odd rounds run the configurations in reverse
    order). Returns the results (case -> ranks -> the job's description, each round's probe,
    wall time and load, and its configurations' results merged over the rounds) and whether
    any graphopt configuration or job failed."""
    results: dict[str, dict] = {}
    failed = False
    for rnd in range(rounds):
        for case in cases:
            for n in ranks:
                configs = configs_for(impls, n)
                job = run_job(case, n, configs[::-1] if rnd % 2 else configs, quick, cache)
                by_n = results.setdefault(case, {})
                if "error" in job:
                    failed = True
                    print(f"{case} {n} ranks: ERROR {job['error']}", flush=True)
                    by_n.setdefault(str(n), {"error": job["error"]})
                    continue
                kept = by_n.get(str(n))
                if kept is None or "error" in kept:
                    kept = by_n[str(n)] = {k: v for k, v in job.items() if k not in (
                        "results", "cpu_probe", "wall_s", "load")}
                    kept.update(results={}, rounds=[])
                kept["rounds"].append({k: job[k] for k in ("cpu_probe", "wall_s", "load")})
                for name, r in job["results"].items():
                    failed |= "error" in r and not name.startswith("torch")
                    kept["results"][name] = merge_round(kept["results"].get(name), r,
                                                        ROUND_KEYS)
                    status = r.get("error") or (
                        f"{fmt_ms(r['ms'])} ms" + (f" (communication {fmt_ms(r['comm_ms'])})"
                                                   if "comm_ms" in r else ""))
                    print(f"{case} {n} ranks {name:<16} {status}", flush=True)
                print(f"  (round {rnd + 1}: {job['wall_s']:.0f} s, 2-core probe "
                      f"{job['cpu_probe']:.2f}, load average after {job['load']})", flush=True)
    return results, failed


# -- the report --------------------------------------------------------------------------------------

def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "—"


def _jobs(results: dict, failed: bool = False):
    """(case, ranks, job) of every job that ran, in order; with `failed`, also those that
    failed (their job is {"error": ...})."""
    for case, by_n in results.items():
        for n, job in sorted(by_n.items(), key=lambda kv: int(kv[0])):
            if failed or "error" not in job:
                yield case, int(n), job


def _zero(name: str) -> int | None:
    """The ZeRO stage of a configuration's name (torch DDP: 0, ZeRO-1: 1)."""
    if name.startswith("torch"):
        return 0 if name == "torch DDP" else 1
    return int(name.split("=")[1]) if "=" in name else None


def _whole_state(job: dict) -> int | None:
    """One process's optimizer state: zero=0's, which every rank holds whole."""
    r = job["results"].get(REFERENCE, {})
    return r["state_bytes_per_rank"][0] if "state_bytes_per_rank" in r else None


def ratio_to(r: dict, peer: dict) -> float:
    """r's step time over the peer's: the median over the rounds of each round's ratio (the
    two ran in the same job, seconds apart, so a machine that slows down for a while slows
    both), else the ratio of the medians."""
    mine, theirs = r.get("rounds_ms", [r["ms"]]), peer.get("rounds_ms", [peer["ms"]])
    if len(mine) != len(theirs):
        return r["ms"] / peer["ms"]
    return float(np.median([a / b for a, b in zip(mine, theirs)]))


def _peer(name: str, peers: dict[int, dict]) -> dict | None:
    """The torch configuration a graphopt one is compared with: DDP for zero=0,
    ZeroRedundancyOptimizer (stage 1, sharded state) for zero=1 and 2; None for plain jit."""
    stage = _zero(name) if name.startswith("graphopt") else None
    return None if stage is None else peers.get(min(stage, 1))


def time_table(results: dict) -> list[str]:
    rows = ["| case | ranks | threads per rank | implementation | ms/step | rounds | compute | "
            "communication | communication share | by collective (ms) | sent ÷ communication "
            "time | compute traffic | graphopt ÷ torch |", "|---" * 13 + "|"]
    for case, n, job in _jobs(results, failed=True):
        if "error" in job:
            rows.append(f"| {case} | {n} | | error: {job['error'][:300]} |" + " |" * 9)
            continue
        rs = job["results"]
        peers = {_zero(k): r for k, r in rs.items() if k.startswith("torch") and "ms" in r}
        for name, r in rs.items():
            head = f"| {case} | {n} | {job['threads']} | {name} | "
            if "error" in r:
                rows.append(head + f"error: {r['error'][:200].replace('|', '/')} |" + " |" * 8)
                continue
            rounds = ", ".join(fmt_ms(x) for x in r.get("rounds_ms", [r["ms"]]))
            split = ["—"] * 6
            if "comm_ms" in r:
                comm, compute = r["comm_ms"], r["compute_ms"]
                split = [f"{fmt_ms(compute)} ms", f"{fmt_ms(comm)} ms",
                         f"{comm / (comm + compute):.0%}",
                         ", ".join(f"{k} {fmt_ms(v)}" for k, v in
                                   r["comm_ms_by_collective"].items()) or "—",
                         f"{r['bytes_sent'] / comm / 1e6:.2f} GB/s" if comm and
                         r["bytes_sent"] else "—",
                         f"{r['compute_bytes'] / compute / 1e6:.1f} GB/s"]
            peer = _peer(name, peers)
            rows.append(head + f"**{fmt_ms(r['ms'])}** | {rounds} | " + " | ".join(split) +
                        f" | {'—' if peer is None else f'{ratio_to(r, peer):.2f}'} |")
    return rows


def bytes_table(results: dict) -> list[str]:
    rows = ["| case | ranks | implementation | collectives per step | bytes sent per rank | "
            "ideal: 2(N−1)/N × gradient bytes | sent ÷ ideal | state bytes per rank (most) | "
            "one process's state ÷ N | state ÷ that | ZeRO's padding per rank | parameters "
            "equal on every rank | max \\|Δp\\| vs graphopt zero=0 |", "|---" * 13 + "|"]
    for case, n, job in _jobs(results):
        ideal = 2 * (n - 1) * job["gradient_bytes"] // n
        whole = _whole_state(job)
        for name, r in job["results"].items():
            if "error" in r:
                continue
            sent = r.get("bytes_sent")
            state = max(r["state_bytes_per_rank"])
            talks = ", ".join(f"{op} {t}" for op, t, _ in r.get("collectives", [])) or \
                ("none" if "collectives" in r else "(gloo: not counted)")
            share = whole / n if whole else None
            cells = [case, n, name, talks, "—" if sent is None else sent, ideal,
                     _ratio(sent, ideal), f"{state} ({state / 2**20:.2f} MiB)",
                     "—" if share is None else f"{share:.0f}", _ratio(state, share),
                     f"{r['padding_bytes']:g}" if "padding_bytes" in r else "—",
                     "yes" if r["same_on_ranks"] else "**no**",
                     f"{r['max_dp_vs_reference']:.1e}" if "max_dp_vs_reference" in r else "—"]
            rows.append("| " + " | ".join(map(str, cells)) + " |")
    return rows


def goals_table(results: dict) -> list[str]:
    """The goals, checked at every size above 1: graphopt's step no slower than torch's
    (speed_goals), zero=2 sends no more than zero=0's all_reduce (where it sends more,
    whether the excess is its padding's), holds 1/N of the state plus its padding, and every
    rank ends alike."""
    rows = ["| case | ranks | goal | measured | |", "|---|---|---|---|---|"]
    for case, n, job in _jobs(results):
        rs = job["results"]
        if n > 1:
            rows += speed_goals(case, n, rs)
        z0, z2 = rs.get("graphopt zero=0", {}), rs.get("graphopt zero=2", {})
        if n == 1 or "ms" not in z0 or "ms" not in z2:
            continue
        whole = _whole_state(job)
        state, pad = max(z2["state_bytes_per_rank"]), z2["padding_bytes"]
        sent, all_reduce = z2["bytes_sent"], z0["bytes_sent"]
        same = all(r["same_on_ranks"] for r in rs.values() if "error" not in r)
        if sent <= all_reduce:
            sent_verdict = "**met**"
        elif sent <= all_reduce + z2["padding_sent_bytes"]:
            sent_verdict = f"**not met by {sent - all_reduce} bytes**, its padding's"
        else:
            sent_verdict = "**not met**"
        rows += [
            f"| {case} | {n} | zero=2 sends no more bytes than zero=0's all_reduce | {sent} vs "
            f"{all_reduce} ({sent / all_reduce:.7f}) | {sent_verdict} |",
            f"| {case} | {n} | zero=2 holds 1/N of the state (+ padding) | {state} bytes vs "
            f"{whole / n:.0f} + {pad:g} of padding ({state / (whole / n):.7f} of 1/N) | "
            f"{'**met**' if state <= whole / n + pad else '**not met**'} |",
            f"| {case} | {n} | the parameters are the same on every rank | "
            f"{'bit for bit, in every configuration' if same else 'they differ'} | "
            f"{'**met**' if same else '**not met**'} |"]
    return rows if len(rows) > 2 else []


def speed_goals(case: str, n: int, rs: dict) -> list[str]:
    """The step-time goals at n ranks, graphopt ÷ torch ≤ 1 (zero=0 vs DDP, zero=1 and 2 vs
    ZeroRedundancyOptimizer), and torch's parameters after the steps against graphopt's."""
    peers = {_zero(k): r for k, r in rs.items() if k.startswith("torch") and "ms" in r}
    rows = []
    for name, r in rs.items():
        peer = _peer(name, peers)
        if peer is None or "ms" not in r:
            continue
        ratio = ratio_to(r, peer)
        rows.append(f"| {case} | {n} | {name}'s step ≤ 1.0× {PEER_NAMES[min(_zero(name), 1)]}'s "
                    f"| {fmt_ms(r['ms'])} vs {fmt_ms(peer['ms'])} ms ({ratio:.2f}×) | "
                    f"{'**met**' if ratio <= 1 else '**not met**'} |")
    for name, r in rs.items():
        if name.startswith("torch") and "max_dp_vs_reference" in r:
            dp = r["max_dp_vs_reference"]
            rows.append(f"| {case} | {n} | {name}'s parameters after {r['steps']} steps equal "
                        f"graphopt zero=0's within {PARAM_TOLERANCE:g} | max \\|Δp\\| {dp:.1e} | "
                        f"{'**met**' if dp <= PARAM_TOLERANCE else '**not met**'} |")
    return rows


def jobs_table(results: dict) -> list[str]:
    rows = ["| case | ranks | parameters | steps (warm-up, timed) | job wall time (rounds) | "
            "2-core probe before (rounds) | load average after (rounds) | peak resident memory "
            "per rank |", "|---" * 8 + "|"]
    for case, n, job in _jobs(results):
        peak = max(max(r["peak_rss_mb_per_rank"]) for r in job["results"].values()
                   if "error" not in r)
        rows.append(f"| {case} | {n} | {job['parameters']:,} | {tuple(job['steps'])} | "
                    + ", ".join(f"{x['wall_s']:.0f} s" for x in job["rounds"]) + " | "
                    + ", ".join(f"{x['cpu_probe']:.2f}" for x in job["rounds"]) + " | "
                    + "; ".join(" ".join(x["load"].split()[:3]) for x in job["rounds"])
                    + f" | {peak:.0f} MB |")
    return rows


def summary_lines(results: dict) -> list[str]:
    """The terminal's table."""
    lines = [f"{'case':<5} {'N':>2} {'implementation':<16} {'ms/step':>9} {'compute':>9} "
             f"{'comm':>9} {'sent/ideal':>10} {'state/(1/N)':>11} same"]
    for case, n, job in _jobs(results, failed=True):
        if "error" in job:
            lines.append(f"{case:<5} {n:>2} ERROR {job['error'][:300]}")
            continue
        ideal = 2 * (n - 1) * job["gradient_bytes"] // n
        whole = _whole_state(job)
        for name, r in job["results"].items():
            if "error" in r:
                lines.append(f"{case:<5} {n:>2} {name:<16} ERROR {r['error'][:200]}")
                continue
            lines.append(f"{case:<5} {n:>2} {name:<16} {fmt_ms(r['ms']):>9} "
                         f"{fmt_ms(r.get('compute_ms')):>9} {fmt_ms(r.get('comm_ms')):>9} "
                         f"{_ratio(r.get('bytes_sent'), ideal):>10} "
                         f"{_ratio(max(r['state_bytes_per_rank']), whole and whole / n):>11} "
                         f"{'yes' if r['same_on_ranks'] else 'NO'}")
    return lines


def render(saved: dict) -> tuple[str, str]:
    """(the terminal's table, the markdown report) of a run's JSON."""
    machine, quick, results = saved["machine"], saved["quick"], saved["results"]
    labels = {case: next((j["label"] for j in by_n.values() if "label" in j), "")
              for case, by_n in results.items()}
    bw_text, bw_md = bandwidth_report(saved["bandwidth"]) if saved["bandwidth"] else ("", [])
    load = saved.get("load", {})
    md = ["# Data-parallel training steps" + (" (--quick: tiny sizes, not a measurement)"
                                              if quick else ""), "",
          f"`python benchmarks/distributed.py{' --quick' if quick else ''}` on "
          f"{machine_summary(machine)}; mpi4py {machine.get('mpi4py', '?')}, MPICH "
          f"{machine.get('mpich', '?')}'s mpiexec. {machine.get('cpus')} cores: 4 ranks "
          f"oversubscribe them. Load average (/proc/loadavg) before the run: "
          f"{load.get('before', '?')}; after: {load.get('after', '?')}. The run took "
          f"{saved['wall_s']:.0f} s, {saved.get('rounds', 1)} round(s). A shared VM: rough "
          f"figures; compare within the run.", "",
          "Cases: " + "; ".join(f"**{c}**: {labels[c]}" for c in results) + ".", "",
          "One MPI job per (case, ranks) and round, every configuration in turn; each rank "
          "uses max(1, cores ÷ N) threads. **ms/step**: the median over the timed steps "
          "(after the first call and the warm-up steps; each after a barrier) of the slowest "
          "rank's step time, and over the rounds the median of the rounds' (`rounds`). "
          "**communication**: the time a step spends in the collectives' MPI calls (the "
          "communicator registered as \"world\" times each call: every rank's wait for the "
          "others included), **compute** the rest of the step, each the mean over the ranks, "
          "the median over the steps. **sent ÷ communication time**: the bytes a rank sends "
          "(below) over that time. **compute traffic**: the bytes the other nodes read and "
          "write by graphopt's cost model, over the compute time (memory-bound work only: "
          "the mlp's is matmuls). **graphopt ÷ torch**: against torch DDP at zero=0 and "
          "ZeroRedundancyOptimizer at zero=1 and 2, the median over the rounds of each round's ratio "
          "(below 1: graphopt is faster); torch's all_reduce "
          "runs on gloo during the backward, so its step is not split.", "",
          "## Step time", "", *time_table(results), "",
          "## Bytes sent and state per rank", "",
          "**Bytes sent**: the sum of `graphopt.passes.cost.bytes_sent` (a ring algorithm's "
          "bytes per rank) over the compiled step's collectives; the ideal is an all_reduce "
          "of every gradient, 2(N−1)/N of the gradients' bytes. **State**: the arrays of the "
          "Parameters the optimizer holds (`opt.parameters()`: the moments or their shards; "
          "the 0-d step counter and hyper-parameters are left out), the most any rank holds, "
          "against one process's (zero=0's, which every rank holds whole) ÷ N. **ZeRO's "
          "padding**: this rank's share of the zeros that pad each flat bucket to a multiple "
          "of N, times the state kept per element (from the optimizer's sharding). torch: the "
          "state tensors of its optimizer (ZeRO-1: of the local optimizer over the parameters "
          "this rank owns; it partitions whole tensors). **Parameters equal**: a hash of each "
          "rank's parameters after the timed steps; **max |Δp|**: over the first "
          f"{SAMPLE} elements of every parameter, against graphopt zero=0's after as many "
          "steps.", "", *bytes_table(results), ""]
    goals = goals_table(results)
    if goals:
        md += ["## Goals", "", *goals, ""]
    md += ["## Jobs", "", *jobs_table(results), "", *bw_md]
    if saved.get("skipped"):
        md += ["Skipped: " + "; ".join(f"{k}: {v}" for k, v in saved["skipped"].items()), ""]
    text = "\n".join(summary_lines(results)) + ("\n\n" + bw_text if bw_text else "")
    return text, "\n".join(md)


def write_report(saved: dict, out_dir: Path) -> None:
    text, md = render(saved)
    print()
    print(text)
    (out_dir / "distributed.md").write_text(md)
    print(f"\nwrote {out_dir / 'distributed.md'}, {out_dir / 'distributed.json'}")


def installed(impl: str) -> str | None:
    return common.installed(REQUIRES[impl])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(ap, CASES, IMPLS, "tiny sizes, 1 and 2 ranks, "
                                      f"{sum(QUICK_STEPS) + 1} steps per configuration, 1 round")
    ap.add_argument("--ranks", default=None,
                    help=f"the jobs' sizes, comma-separated (default "
                         f"{','.join(map(str, RANKS))}; with --quick "
                         f"{','.join(map(str, QUICK_RANKS))})")
    common.add_driver_options(ap, "distributed")
    ap.add_argument("--configs", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    if args.render:
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_report(json.loads(Path(args.render).read_text()), out_dir)
        return 0
    missing = common.mpi_missing()
    if missing:
        raise SystemExit(f"benchmarks/distributed.py needs MPI: {missing}")
    run = begin(ap, args, IMPLS, check_case, installed)
    run.machine.update(common.mpi_versions())
    ranks = [int(n) for n in (args.ranks or ",".join(
        map(str, QUICK_RANKS if run.quick else RANKS))).split(",")]
    load = {"before": load_average()}
    print(f"load average: {load['before']}", flush=True)
    snapshot = run_on_snapshot(run.machine)
    bandwidth = []
    if not args.no_bandwidth:
        print("measuring memory bandwidth ...", flush=True)
        bandwidth.append(common.run_worker(__file__, ["--worker", "bandwidth", *run.quick_args]))
    cache = Path(tempfile.mkdtemp(prefix="graphopt-dist-bench-"))
    try:
        results, failed = run_jobs(run.cases, ranks, run.runnable, args.rounds, run.quick,
                                   cache)
    finally:
        import shutil
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(snapshot, ignore_errors=True)
    if not args.no_bandwidth:
        bandwidth.append(common.run_worker(__file__, ["--worker", "bandwidth", *run.quick_args]))
    load["after"] = load_average()
    run.stop()
    saved = {"machine": run.machine, "quick": run.quick, "wall_s": run.wall_s,
             "rounds": args.rounds, "load": load, "bandwidth": bandwidth,
             "results": results, "skipped": run.skipped}
    # The measurements first, as they are: a report that fails can be made again (--render).
    (run.out_dir / "distributed.json").write_text(json.dumps(saved, indent=1))
    write_report(saved, run.out_dir)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
