"""A healthy job, checked on each rank: init and the world, every collective against numpy for
every dtype, the errors a collective refuses with, the watchdog's timeout and the broken
communicator after it, check_same on agreeing and disagreeing steps, an exception in a
thread. Usage: checks.py OUT RANKS (the world size the job is expected to have)."""
from __future__ import annotations

import hashlib
import re
import sys
import threading

import ml_dtypes
import numpy as np
from rankio import ARGS, Checks, save

import graphopt as go
import graphopt.distributed as dist
from graphopt import comm, envvars
from graphopt.errors import ArgumentError, CollectiveError, CollectiveTimeout

c = Checks()
expected_size = int(ARGS[0])

# -- before init: the world of one process; without mpi4py: the pip hint ---------------------
c.check("importing graphopt.distributed starts no MPI", "mpi4py.MPI" not in sys.modules)
c.check("before init", (dist.rank(), dist.world_size(), dist.is_initialized()) == (0, 1, False))
dist.barrier()
sys.modules["mpi4py"] = None  # what `import mpi4py` finds when it is not installed
c.raises("init without mpi4py", CollectiveError, dist.init, "pip install 'graphopt[dist]'")
del sys.modules["mpi4py"]
c.check("still not initialized", not dist.is_initialized())
for bad in (0, -1.0, float("nan"), "30", True):
    c.raises(f"init(timeout={bad!r})", ArgumentError, lambda: dist.init(timeout=bad),
             "greater than 0")

dist.init()
dist.init()  # again: nothing happens
dist.init(timeout=120.0)  # again with a timeout: that timeout from now on
world = comm.group("world")
r, n = dist.rank(), dist.world_size()
c.check("world", isinstance(world, dist.MPICommunicator) and (world.rank, world.size) == (r, n)
        and n == expected_size and 0 <= r < n and dist.is_initialized(), (r, n, world))
c.check("init's timeout", world.timeout == 120.0, world.timeout)
dist.barrier()

# -- every collective against numpy, every dtype ----------------------------------------------
HALVES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
DTYPES = [np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64, np.bool_)] + \
    list(HALVES)


def value(rank: int, dtype: np.dtype, shape: tuple, exact: bool) -> np.ndarray:
    """Rank `rank`'s input (every rank can make every rank's). exact: small whole numbers,
    whose sums are exact in every dtype and any order."""
    rng = np.random.default_rng([rank, len(shape), *shape, DTYPES.index(dtype)])
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) < 0.3)
    if dtype.kind == "i" or exact:
        return np.asarray(rng.integers(-8, 9, shape)).astype(dtype)
    return np.asarray(rng.standard_normal(shape)).astype(dtype)


def expected_sum(xs: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    wide = np.float32 if dtype in HALVES else dtype  # halves: summed in f32, rounded once
    return np.add.reduce(np.stack(xs).astype(wide), axis=0).astype(dtype)


for dtype in DTYPES:
    for shape in [(8, 3), (), (0, 3), (16,)]:
        name = f"{dtype.name}{list(shape)}"
        xs = [value(k, dtype, shape, exact=True) for k in range(n)]
        mine = xs[r].copy()
        want_sum, want_max = expected_sum(xs, dtype), np.max(np.stack(xs), axis=0)
        c.same(f"all_reduce sum {name}", world.all_reduce(xs[r], "sum"), want_sum)
        c.same(f"all_reduce max {name}", world.all_reduce(xs[r], "max"), want_max)
        c.same(f"broadcast {name}", world.broadcast(xs[r], n - 1), xs[n - 1])
        if shape:
            c.same(f"reduce_scatter sum {name}", world.reduce_scatter(xs[r], "sum"),
                   np.split(want_sum, n)[r])
            c.same(f"reduce_scatter max {name}", world.reduce_scatter(xs[r], "max"),
                   np.split(want_max, n)[r])
            c.same(f"all_gather {name}", world.all_gather(xs[r]), np.concatenate(xs))
        c.same(f"the input of {name} is unchanged", xs[r], mine)

# Random floats: close to numpy's sum, and the same bits on every rank.
for dtype in [d for d in DTYPES if d.kind == "f" or d in HALVES]:
    xs = [value(k, dtype, (64, 5), exact=False) for k in range(n)]
    got = world.all_reduce(xs[r], "sum")
    tol = 1e-2 if dtype in HALVES else 1e-5
    c.check(f"all_reduce sum of random {dtype.name}", got.dtype == dtype and np.allclose(
        got.astype(np.float64), expected_sum(xs, dtype).astype(np.float64), rtol=tol, atol=tol))
    digests = world.gather_objects(hashlib.sha256(got.tobytes()).hexdigest())
    c.check(f"all_reduce of random {dtype.name}: the same bits on every rank",
            len(set(digests)) == 1, digests)

# A strided view is sent as its elements in order.
base = np.arange(8 * 6, dtype=np.float32).reshape(8, 6) * (r + 1)
c.same("all_gather of a strided view", world.all_gather(base[:, ::2]), np.concatenate(
    [(np.arange(48, dtype=np.float32).reshape(8, 6) * (k + 1))[:, ::2] for k in range(n)]))

objs = world.gather_objects({"rank": r, "pad": "x" * (100 * r), "array": np.arange(r)})
c.check("gather_objects", [o["rank"] for o in objs] == list(range(n)) and
        all(o["pad"] == "x" * (100 * k) and o["array"].tolist() == list(range(k))
            for k, o in enumerate(objs)), objs)

# -- what a collective refuses (each rank, before anything starts: nothing breaks) ------------
x = np.ones(4, np.float32)
c.raises("reduction mean", CollectiveError, lambda: world.all_reduce(x, "mean"),
         "'mean'", "'sum' or 'max'")
c.raises("dtype int8", CollectiveError, lambda: world.all_reduce(x.astype(np.int8), "sum"),
         "dtype int8")
c.raises("all_gather of a scalar", CollectiveError, lambda: world.all_gather(np.float32(1)),
         "all_gather of f32[]")
c.raises("broadcast from no rank", CollectiveError, lambda: world.broadcast(x, n),
         f"root {n} is not a rank")
if n > 1:
    c.raises("reduce_scatter of an odd split", CollectiveError,
             lambda: world.reduce_scatter(np.ones(2 * n + 1, np.float32), "sum"),
             f"reduce_scatter of f32[{2 * n + 1}]", f"{n} equal parts")
c.raises("gather_objects of a lambda", CollectiveError,
         lambda: world.gather_objects(lambda: 0), "cannot be pickled")
c.same("still usable", world.all_reduce(x, "sum"), x * n)

# -- the watchdog: a collective rank 0 runs alone times out, and breaks its communicator -----
if n > 1:
    from mpi4py import MPI
    for probe, source in [
            (dist.MPICommunicator.duplicate(MPI.COMM_WORLD, 0.5, "probe"), r"init\(timeout=0\.5\)"),
            (dist.MPICommunicator.duplicate(MPI.COMM_WORLD, None, "probe"),
             "GRAPHOPT_COLLECTIVE_TIMEOUT=0.4")]:
        if r == 0:
            with envvars.override(GRAPHOPT_COLLECTIVE_TIMEOUT="0.4"):
                message = c.raises("timeout", CollectiveTimeout,
                                   lambda: probe.all_reduce(np.ones(1000, np.float32), "sum"))
            c.check("the timeout's message", re.fullmatch(
                rf"rank 0: all_reduce of f32\[1000\] waited 0\.[45] s for the other ranks "
                rf"\({source}\): a rank is lost, stuck, or running a different step", message),
                message)
            for what, call in [("all_reduce", lambda: probe.all_reduce(x, "sum")),
                               ("gather_objects", lambda: probe.gather_objects(1)),
                               ("barrier", probe.barrier)]:
                c.raises(f"{what} after the timeout", CollectiveError, call,
                         "broken since all_reduce of f32[1000] timed out", "cannot be cancelled")
        dist.barrier()
        if r != 0:  # the late partners, so that rank 0's abandoned collective ends
            probe.all_reduce(np.ones(1000, np.float32), "sum")
    dist.barrier()

# -- check_same: agreeing steps pass, disagreeing ones fail alike on every rank ---------------
odd = r % 2 == 1
differ = [k for k in range(n) if k % 2 == 1]
who = ("rank 1 differs" if len(differ) == 1 else
       "ranks " + ", ".join(map(str, differ[:-1])) + f" and {differ[-1]} differ" if differ else "")


def f(x):
    return (x * 2).sum()


def g(x):
    return (x * 2 * 3).sum() if odd else (x * 2).sum()


def h(x):
    return (x * (3 if odd else 2)).sum()


dist.check_same(go.trace(f, np.zeros((32, 2), np.float32)), "the step 'f'")
errors = {}
for name, graph, says in [
        ("shape", go.trace(f, np.zeros((64 if odd else 32, 2), np.float32)),
         "rank 1: input %x is f32[64,2] on rank 1, f32[32,2] on rank 0"),
        ("ops", go.trace(g, np.zeros((32, 2), np.float32)), "rank 1: rank 1 has 2 constant, "
                                                            "rank 0 has 1"),
        ("text", go.trace(h, np.zeros((32, 2), np.float32)), "rank 1: the step's text differs")]:
    if n == 1:
        c.check(f"check_same of one rank ({name})", dist.check_same(graph, "s") is None)
        continue
    errors[name] = c.raises(f"check_same: {name}", CollectiveError,
                            lambda: dist.check_same(graph, "the step 'f'"),
                            f"the step 'f' differs between the ranks of group 'world': {who} "
                            f"from rank 0", says)
c.raises("check_same of an unknown group", CollectiveError,
         lambda: dist.check_same(go.trace(f, np.zeros(2, np.float32)), "s", group="nope"),
         "no process group named 'nope'")

# -- an exception in another thread: printed with the rank, and the job goes on ---------------
worker = threading.Thread(target=lambda: 1 / 0, name="failing-worker")
worker.start()
worker.join()
dist.barrier()

save(r, {"rank": r, "size": n, "checks": c.count, "failures": c.failures, "errors": errors})
