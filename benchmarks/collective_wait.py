"""How a rank should wait for a collective: latency and CPU of graphopt.distributed's watched
wait (nonblocking MPI, Test() polled: spin, then sleeps that double up to a cap) beside a
blocking MPI call and other ways to poll.

    python benchmarks/collective_wait.py [--quick] [--ranks 2,4] [--out DIR]

runs `mpiexec -n 2` and `mpiexec -n 4` jobs of this script and writes collective_wait.md and
.json to DIR (default benchmarks/results/). Each case is an f32 all_reduce, repeated:

- `1 KiB`: 256 elements, every rank calling at once (latency);
- `64 MiB`: 16M elements (bandwidth);
- `1 KiB, skewed`: rank 0 first computes about 10 ms (a fixed amount of numpy work, timed
  alone beforehand), the others wait for it: how much their waiting slows the rank they
  wait for, which is what a spinning wait costs on a machine with fewer cores than ranks.

`us/op` is the wall time per all_reduce (the slowest rank's), `CPU us/op` the CPU time each
rank spent per all_reduce (the mean over ranks). Each is the median over the rounds, which
interleave the ways to wait.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402

RANKS = (2, 4)
CASES = {"1 KiB": 256, "64 MiB": 1 << 24, "1 KiB, skewed": 256}
# name -> the watched wait's polling (SPIN, MIN_SLEEP, SLEEP_FRACTION, MAX_SLEEP), or None:
# a blocking MPI call. A fraction of 1 sleeps as long as waited so far: sleeps that double.
GRAPHOPT = "spin 300 us, then sleep waited/10 (50 us to 1 ms): graphopt"
WAYS = {
    "blocking MPI call": None,
    "spin on Test()": (float("inf"), 5e-5, 0.1, 1e-3),
    "sleep at once, doubling up to 1 ms": (0.0, 5e-5, 1.0, 1e-3),
    "spin 300 us, then doubling up to 100 us": (3e-4, 5e-5, 1.0, 1e-4),
    "spin 300 us, then doubling up to 1 ms": (3e-4, 5e-5, 1.0, 1e-3),
    GRAPHOPT: (),  # MPICommunicator's own: filled in by the worker
}


def worker(quick: bool) -> None:
    import graphopt.distributed as dist
    from graphopt.distributed import MPICommunicator
    from mpi4py import MPI
    dist.init()
    comm = MPI.COMM_WORLD.Dup()
    watched = MPICommunicator.duplicate(MPI.COMM_WORLD)
    ways = dict(WAYS)
    ways[GRAPHOPT] = (watched.SPIN, watched.MIN_SLEEP, watched.SLEEP_FRACTION,
                      watched.MAX_SLEEP)
    rank, size = comm.rank, comm.size
    # The skewed case's work: numpy on one thread, timed on rank 0 while the others sleep.
    a, b = np.random.rand(1 << 14), np.empty(1 << 14)
    iterations = 0
    if rank == 0:
        start = time.perf_counter()
        while time.perf_counter() - start < 0.01:
            np.sin(a, out=b)
            iterations += 1
    else:
        time.sleep(0.5)
    comm.Barrier()
    reps = {"1 KiB": 200 if quick else 2000 // size, "64 MiB": 1 if quick else 4,
            "1 KiB, skewed": 10 if quick else 100}
    rounds = 1 if quick else 3
    measured: dict[str, dict[str, list]] = {c: {w: [] for w in ways} for c in CASES}
    for _ in range(rounds):
        for case, n in CASES.items():
            x = np.ones(n, np.float32)
            y = np.empty_like(x)
            for way, polling in ways.items():
                if polling is not None:
                    (watched.SPIN, watched.MIN_SLEEP, watched.SLEEP_FRACTION,
                     watched.MAX_SLEEP) = polling

                def once() -> None:
                    if case.endswith("skewed") and rank == 0:
                        for _ in range(iterations):
                            np.sin(a, out=b)
                    if polling is None:
                        comm.Allreduce(x, y)
                    else:
                        watched.all_reduce(x, "sum")
                once()
                comm.Barrier()
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(reps[case]):
                    once()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                walls, cpus = comm.allgather(wall), comm.allgather(cpu)
                measured[case][way].append((max(walls) / reps[case] * 1e6,
                                            sum(cpus) / size / reps[case] * 1e6))
    if rank == 0:
        result = {case: {way: [float(np.median([m[0] for m in ms])),
                               float(np.median([m[1] for m in ms]))]
                         for way, ms in ways_ms.items()} for case, ways_ms in measured.items()}
        print("RESULT " + json.dumps({"ranks": size, "results": result,
                                      "skew_iterations": iterations}), flush=True)


def report(runs: list[dict], machine: dict, quick: bool) -> str:
    lines = ["# Waiting for a collective", "",
             f"`python benchmarks/collective_wait.py{' --quick' if quick else ''}` on "
             f"{common.machine_summary(machine)}; mpi4py {machine.get('mpi4py', '?')}, "
             f"MPICH {machine.get('mpich', '?')}'s mpiexec, "
             f"{' and '.join(str(run['ranks']) for run in runs)} ranks on "
             f"{machine.get('cpus')} cores (more ranks than cores oversubscribe them). A "
             f"shared machine: rough figures.", "",
             "`us/op`: wall time per f32 all_reduce (the slowest rank); `CPU us/op`: CPU time "
             "per all_reduce of each rank (mean over the ranks); medians over the rounds. "
             "`skewed`: rank 0 computes about 10 ms of numpy work before each all_reduce "
             "while the others wait in it.", "",
             "| case | ranks | way to wait | us/op | CPU us/op |", "|---|---|---|---|---|"]
    for case in CASES:
        for run in runs:
            if "error" in run:
                continue
            for way, (wall, cpu) in run["results"][case].items():
                lines.append(f"| {case} | {run['ranks']} | {way} | {wall:.0f} | {cpu:.0f} |")
    for run in runs:
        if "error" in run:
            lines.append(f"\n{run['ranks']} ranks: {run['error']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions: a smoke test")
    ap.add_argument("--ranks", default=",".join(map(str, RANKS)),
                    help="the jobs' sizes, comma-separated (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.quick)
    machine = common.machine_info()
    machine.update(common.mpi_versions())
    runs = []
    for n in map(int, args.ranks.split(",")):
        run = common.run_mpi_worker(__file__, n, ["--worker"] + (["--quick"] if args.quick
                                                                  else []), os.environ, 900)
        runs.append(run if "error" not in run else {"ranks": n, "error": run["error"]})
    md = report(runs, machine, args.quick)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "collective_wait.md").write_text(md)
    (args.out / "collective_wait.json").write_text(
        json.dumps({"machine": machine, "quick": args.quick, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
