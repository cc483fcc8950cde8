"""Benchmark: an optimizer step on an embedding table with a row gradient, graphopt vs torch.

A table of N rows x 64 f32 (N = 100k, 1M, 4M: 25 MB to 1 GB, plus two moments as large), and
the gradient of 4,096 lookups of it, some of them repeated. Side by side, one step each:

    graphopt-sparse   SparseAdam on the row gradient (jit, llvm: coalesce, one row kernel)
    graphopt-lazy     LazyAdam, the same
    graphopt-dense    Adam on the dense gradient (every row read and written)
    torch-sparse      torch.optim.SparseAdam on the sparse COO gradient
    torch-dense       torch.optim.Adam on the dense gradient (foreach=False, CPU)

Each measurement runs in a subprocess of its own. Reported: ms per step (median of the
steps timed, then the median over the rounds), the bytes the update moves per step by the
cost model (what the kernel reads and writes: a row update K rows, a dense one N; torch is
given the same model's count, for the same work), and the ratios the goals name: graphopt's
SparseAdam against torch's, and against a dense Adam step, and how the time grows with N at
a fixed K. Timings on a shared machine are noisy: the report gives the load average before
and after the run.

    python benchmarks/sparse.py [--quick] [--cases 100k,1M,4M] [--impls ...] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import add_run_options, begin, finish, run_on_snapshot, run_rounds  # noqa: E402

CASES = ["100k", "1M", "4M"]
ROWS = {"100k": 100_000, "1M": 1_000_000, "4M": 4_000_000}
IMPLS = ["graphopt-sparse", "graphopt-lazy", "graphopt-dense", "torch-sparse", "torch-dense"]
DIM, LOOKUPS = 64, 4096
STEPS = {False: (5, 30), True: (2, 5)}  # (warm-up, timed) steps, by --quick
ROUND_KEYS = ("ms",)


def lookups(rng: np.random.Generator, n: int) -> np.ndarray:
    """LOOKUPS ids in [0, n): distinct ones, and an eighth of them looked up again."""
    first = rng.choice(n, LOOKUPS - LOOKUPS // 8, replace=False)
    return rng.permutation(np.concatenate([first, rng.choice(first, LOOKUPS // 8)]))


def batches(n: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(lookups(rng, n), rng.standard_normal((LOOKUPS, DIM)).astype(np.float32))
            for _ in range(count)]


def dense(n: int, idx: np.ndarray, values: np.ndarray) -> np.ndarray:
    g = np.zeros((n, DIM), np.float32)
    np.add.at(g, idx, values)
    return g


def model_bytes(impl: str, n: int) -> int:
    """What the update must move, by the cost model: p, m, v read and written and the
    gradient read (28 B per element of f32), over the K rows given or all N; the indices."""
    return 28 * DIM * (n if impl.endswith("dense") else LOOKUPS) + \
        (0 if impl.endswith("dense") else 8 * LOOKUPS)


def setup_graphopt(impl: str, n: int, grads: list) -> tuple:
    import graphopt as go
    from graphopt import ops, optim
    from graphopt.ir.kernel import cost
    table = go.Parameter(np.random.default_rng(1).standard_normal((n, DIM)).astype(np.float32),
                         name="table")
    if impl == "graphopt-dense":
        opt = optim.Adam([table], lr=1e-3)
        step = go.jit(lambda g: opt.step([g]), backend="llvm")
        args = [(dense(n, i, v),) for i, v in grads]
    else:
        opt = (optim.SparseAdam if impl == "graphopt-sparse" else optim.LazyAdam)([table])
        step = go.jit(lambda i, v: opt.step([ops.rows(i, v, (n, DIM))]), backend="llvm")
        args = grads
    exe = step.lower(*args[0])
    moved = sum(cost(k).total_bytes for k in exe.graph.nodes if k.body is not None
                and any(v is not None and v.kind == "param" and v.name == "table"
                        for v in k.inputs))
    return (lambda a: step(*a)), args, moved


def setup_torch(impl: str, n: int, grads: list) -> tuple:
    import torch
    p = torch.nn.Parameter(torch.from_numpy(
        np.random.default_rng(1).standard_normal((n, DIM)).astype(np.float32)))
    if impl == "torch-dense":
        opt = torch.optim.Adam([p], lr=1e-3, foreach=False)
        args = [torch.from_numpy(dense(n, i, v)) for i, v in grads]
    else:
        opt = torch.optim.SparseAdam([p], lr=1e-3)
        args = [torch.sparse_coo_tensor(torch.from_numpy(i[None]), torch.from_numpy(v),
                                        (n, DIM)) for i, v in grads]

    def step(g):
        p.grad = g
        opt.step()
    return step, args, model_bytes(impl, n)


def worker_run(impl: str, case: str, quick: bool) -> dict:
    n = ROWS[case]
    warm, timed = STEPS[quick]
    grads = batches(n, 4)
    start = time.perf_counter()
    step, args, moved = (setup_graphopt if impl.startswith("graphopt") else setup_torch)(
        impl, n, grads)
    setup_s = time.perf_counter() - start
    for k in range(warm):
        step(args[k % len(args)])
    ts = []
    for k in range(timed):
        s = time.perf_counter()
        step(args[k % len(args)])
        ts.append(time.perf_counter() - s)
    return {"ms": float(np.median(ts)) * 1e3, "best_ms": min(ts) * 1e3, "bytes": int(moved),
            "model_bytes": model_bytes(impl, n), "setup_s": setup_s, "steps": timed,
            "peak_rss_mb": common.peak_rss_mb()}


def installed(impl: str) -> str | None:
    return common.installed(["torch"]) if impl.startswith("torch") else None


def load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists(
        "/proc/loadavg") else "?"


def render(results: dict, cases: list[str], impls: list[str], run: common.Run,
           loads: list[str]) -> tuple[str, str]:
    """The terminal's table and the report (markdown)."""
    head = f"{'case':<6} {'implementation':<16} {'ms/step':>9} {'MB moved':>9} " \
           f"{'vs torch-sparse':>16} {'vs dense':>9}"
    rows = [head]
    md = ["# An optimizer step on an embedding table: row gradient vs dense", "",
          f"Generated by `benchmarks/sparse.py`{' --quick' if run.quick else ''} on "
          f"{common.machine_summary(run.machine)}. A table of N rows x {DIM} f32 and the "
          f"gradient of {LOOKUPS} lookups ({LOOKUPS // 8} of them repeats); one Adam-family "
          f"step, ms per step: the median of the timed steps, then the median of the rounds. "
          f"MB moved: the update's bytes by the cost model (graphopt: its kernels' cost "
          f"comments; torch: the same model for the same work). Load average (1, 5, 15 min) "
          f"before the run {loads[0]}, after {loads[1]}: the machine is shared, so the times "
          f"are rough.", "",
          "| case | implementation | ms/step | MB moved | vs torch-sparse | vs its dense step |",
          "|---|---|---:|---:|---:|---:|"]
    for case in cases:
        by = results.get(case, {})
        for impl in impls:
            r = by.get(impl)
            if r is None or "error" in r:
                rows.append(f"{case:<6} {impl:<16} {'ERROR' if r else 'skipped':>9}")
                md.append(f"| {case} | {impl} | {r['error'] if r else 'skipped'} | | | |")
                continue
            torch_sparse = by.get("torch-sparse", {}).get("ms")
            own_dense = by.get(("torch" if impl.startswith("torch") else "graphopt")
                               + "-dense", {}).get("ms")
            vs_t = f"{r['ms'] / torch_sparse:.2f}x" if torch_sparse else "-"
            vs_d = f"{own_dense / r['ms']:.0f}x faster" if own_dense and \
                not impl.endswith("dense") else "-"
            mb = r["bytes"] / 1e6
            rows.append(f"{case:<6} {impl:<16} {r['ms']:>9.3f} {mb:>9.2f} {vs_t:>16} {vs_d:>9}")
            md.append(f"| {case} | {impl} | {r['ms']:.3f} | {mb:.2f} | {vs_t} | {vs_d} |")
    growth = [results.get(c, {}).get("graphopt-sparse", {}).get("ms") for c in cases]
    if all(growth) and len(growth) > 1:
        line = ", ".join(f"{c}: {m:.3f} ms" for c, m in zip(cases, growth))
        rows.append(f"\ngraphopt-sparse by table size at K = {LOOKUPS}: {line}")
        md += ["", f"graphopt-sparse by table size, K fixed at {LOOKUPS}: {line} "
               f"({growth[-1] / growth[0]:.2f}x from {cases[0]} to {cases[-1]} rows, "
               f"{ROWS[cases[-1]] // ROWS[cases[0]]}x the table)."]
    md.append("")
    return "\n".join(rows), "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(ap, CASES, IMPLS, "a few steps per worker, 1 round")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker_run(args.worker, args.case, args.quick)))
        return 0
    run = begin(ap, args, IMPLS, lambda c: ROWS.get(c) or ap.error(f"unknown case {c}"),
                installed)
    loads = [load()]
    snapshot = run_on_snapshot(run.machine)
    try:
        results, failed = run_rounds(
            run.cases, run.runnable, args.rounds,
            lambda impl, case, rnd: common.run_worker(
                __file__, ["--worker", impl, "--case", case, *run.quick_args]),
            ROUND_KEYS, lambda case: f"{ROWS[case]:,} x {DIM}")
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)
    run.stop()
    loads.append(load())
    text, md = render(results, run.cases, run.impls, run, loads)
    finish(run, "sparse", results, [], text, md, "Adam-family step on an embedding table",
           "ms per step")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
