"""What the benchmarks share: the subprocess workers, the machine's description and its
memory bandwidth, the snapshot of graphopt a run measures, number formats and the bar plot.

Imported as `common` by the scripts beside it (`python benchmarks/adam.py` puts this folder
first on sys.path).
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_probe(reps: int = 30, n: int = 1 << 16) -> float:
    """How much of a second core this process gets right now: the speedup of two threads
    over one on a compute-bound numpy loop in cache (2.0: both cores free; ~1.0: one core's
    worth, as when the machine's host is busy). numpy ufuncs run without the GIL."""
    import threading
    a = np.linspace(0.0, 1.0, n)
    bufs = [np.empty(n), np.empty(n)]

    def work(out):
        for _ in range(reps):
            np.sin(a, out=out)
    work(bufs[0])
    s = time.perf_counter()
    work(bufs[0])
    one = time.perf_counter() - s
    threads = [threading.Thread(target=work, args=(b,)) for b in bufs]
    s = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 2 * one / (time.perf_counter() - s)


def worker_bandwidth(quick: bool) -> dict:
    """Memory bandwidth: a STREAM triad a = b + s*c over f64 arrays far larger than the caches
    (numba prange, on every thread and on one), and a 1-thread numpy copy. STREAM's counting:
    24 bytes per triad element, 16 per copied element (no write-allocate traffic counted)."""
    n = (1 << 22) if quick else (1 << 25)  # 3 x 256 MiB
    b = np.full(n, 1.0)
    c = np.full(n, 2.0)
    a = np.empty(n)
    reps = 2 if quick else 10
    out: dict[str, Any] = {"array_mib": n * 8 / 2**20}

    def best(fn, nbytes):
        fn()
        ts = timings(fn, reps)
        return {"best_gbps": nbytes / min(ts) / 1e9, "median_gbps": nbytes / np.median(ts) / 1e9}

    out["numpy_copy_1thread"] = best(lambda: np.copyto(a, b), 16 * n)
    if importlib.util.find_spec("numba") is not None:
        import numba
        from numba import njit, prange

        @njit(parallel=True)
        def triad(a, b, c, s):
            for i in prange(a.size):
                a[i] = b[i] + s * c[i]

        threads = numba.get_num_threads()
        out["numba_triad_threads"] = threads
        out["numba_triad"] = best(lambda: triad(a, b, c, 3.0), 24 * n)
        numba.set_num_threads(1)
        out["numba_triad_1thread"] = best(lambda: triad(a, b, c, 3.0), 24 * n)
        numba.set_num_threads(threads)
    else:
        def np_triad():
            np.multiply(c, 3.0, out=a)
            a.__iadd__(b)
        out["numpy_triad_1thread"] = best(np_triad, 24 * n)
    return out


def run_worker(script: str | Path, argv: list[str], env: dict | None = None,
               timeout: float = 900) -> dict:
    """Run `script argv` in a subprocess: the dict its line `RESULT {json}` holds, or
    {"error": ...} (its exit status and last lines, or the timeout)."""
    cmd = [sys.executable, str(Path(script).resolve()), *argv]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (p.stderr or p.stdout).strip().splitlines()[-6:]
    return {"error": f"exit {p.returncode}: " + " | ".join(tail)}


def mpiexec_path() -> str | None:
    """The mpiexec beside this Python (MPICH's wheel puts it there), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def mpi_missing() -> str | None:
    """None if MPI jobs can run here, else why not."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'graphopt[dist]')"
    if mpiexec_path() is None:
        return "no mpiexec (pip install 'graphopt[dist]' brings MPICH's)"
    return None


def mpi_versions() -> dict[str, str]:
    """mpi4py's and MPICH's versions, where installed (for the machine's description)."""
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for package in ("mpi4py", "mpich"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            pass
    return out


def run_mpi_worker(script: str | Path, ranks: int, argv: list[str], env: dict | None = None,
                   timeout: float = 900) -> dict:
    """Run `mpiexec -n ranks python script argv`: the dict of the first line `RESULT {json}`
    any rank printed, or {"error": ...} (the exit status and the end of stderr, or the
    timeout). A job still running at the timeout is interrupted (SIGINT: mpiexec passes it
    to the ranks, which MPICH puts in sessions of their own), then killed."""
    cmd = [mpiexec_path() or "mpiexec", "-n", str(ranks), sys.executable,
           str(Path(script).resolve()), *argv]
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
        try:
            p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": f"exit {p.returncode}: {stderr.strip()[-500:]}"}


def snapshot_graphopt() -> Path:
    """A copy of the graphopt package this run measures: a run takes minutes, and a source
    tree being edited meanwhile would mix versions across workers."""
    spec = importlib.util.find_spec("graphopt")
    if spec is None or spec.origin is None:
        raise SystemExit("graphopt is not importable (pip install -e .)")
    dest = Path(tempfile.mkdtemp(prefix="graphopt-bench-src-"))
    shutil.copytree(Path(spec.origin).parent, dest / "graphopt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # Bytecode, as an installed package has it (PYTHONDONTWRITEBYTECODE would otherwise
    # make every worker compile graphopt's sources again inside the timed first call).
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(dest)], check=False)
    return dest


def installed(modules: list[str]) -> str | None:
    """None if an implementation that imports these modules can run, else why not."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"not installed ({', '.join(missing)})" if missing else None


def machine_info() -> dict:
    info = {"python": platform.python_version(), "cpus": os.cpu_count(),
            "numpy": np.__version__}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
        info["memory_gib"] = round(int(mem) / 2**20, 1)
    except OSError:
        pass
    for mod in ("llvmlite", "torch", "jax", "optax", "numba"):
        if importlib.util.find_spec(mod) is not None:
            try:
                from importlib.metadata import version
                info[mod] = version(mod)
            except Exception:
                pass
    try:
        info["graphopt_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
            text=True).stdout.strip()
        info["graphopt_dirty"] = bool(subprocess.run(
            ["git", "status", "--porcelain", "--", "graphopt"], cwd=ROOT, capture_output=True,
            text=True).stdout.strip())
    except OSError:
        pass
    return info


def fmt_ms(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3g}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def fmt_s(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.2f} s"


def plot(results: dict, cases: list[str], impls: list[str], path: Path, title: str,
         ylabel: str) -> str | None:
    """Bars of each result's `ms`, a group per case (labelled with its `_label`), log scale;
    None, or why there is no plot."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no plot"
    cols = [i for i in impls if any(i in results.get(c, {}) and "error" not in results[c][i]
                                    for c in cases)]
    fig, ax = plt.subplots(figsize=(11, 5.5))
    width = 0.8 / max(1, len(cols))
    for k, impl in enumerate(cols):
        xs, ys = [], []
        for j, c in enumerate(cases):
            r = results.get(c, {}).get(impl)
            if r and "error" not in r:
                xs.append(j + (k - (len(cols) - 1) / 2) * width)
                ys.append(r["ms"])
        ax.bar(xs, ys, width, label=impl)
        for x, y in zip(xs, ys):
            ax.text(x, y * 1.05, fmt_ms(y), ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{c}\n{results.get(c, {}).get('_label', '')}" for c in cases],
                       fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=4)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def timings(fn: Callable[[], Any], reps: int) -> list[float]:
    """Seconds of each of `reps` calls of fn."""
    ts = []
    for _ in range(reps):
        s = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - s)
    return ts


def machine_summary(machine: dict) -> str:
    """The machine and the versions, for a report's first line."""
    return (f"{machine.get('cpu', '?')}, {machine.get('cpus')} cores, "
            f"{machine.get('memory_gib', '?')} GiB; "
            + ", ".join(f"{k} {machine[k]}" for k in ("numpy", "llvmlite", "torch", "jax",
                                                        "optax", "numba") if k in machine)
            + f"; graphopt at {machine.get('graphopt_commit', '?')}"
            + (" with uncommitted changes" if machine.get("graphopt_dirty") else ""))


def run_on_snapshot(machine: dict) -> Path:
    """Snapshot graphopt (snapshot_graphopt) and put it first on the PYTHONPATH the workers
    inherit; the caller removes the directory returned when the run ends."""
    snapshot = snapshot_graphopt()  # every worker runs the same graphopt source
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(snapshot), *filter(None, [os.environ.get("PYTHONPATH")])])
    print(f"graphopt {machine.get('graphopt_commit', '?')}"
          f"{' + uncommitted changes' if machine.get('graphopt_dirty') else ''}, copied to "
          f"{snapshot} for this run", flush=True)
    return snapshot


def merge_round(merged: dict | None, r: dict, keys: tuple[str, ...]) -> dict:
    """One round's result `r` (no error) merged into the rounds so far (None before the
    first): each key's values listed in `rounds_<key>`, the key itself their median. A first
    round that failed stays the result."""
    if merged is None:
        for key in keys:
            if key in r:
                r[f"rounds_{key}"] = [r[key]]
        return r
    if "error" not in merged:
        for key in keys:
            if key in r:
                merged[f"rounds_{key}"].append(r[key])
                merged[key] = float(np.median(merged[f"rounds_{key}"]))
    return merged


def bandwidth_report(bandwidth: list[dict]) -> tuple[str, list[str]]:
    """The bandwidth measured before and after a run (worker_bandwidth): the terminal's
    lines, and the report's section."""
    bw_txt = []
    for i, b in enumerate(bandwidth):
        when = "before" if i == 0 else "after"
        if "error" in b:
            bw_txt.append(f"{when}: error {b['error']}")
            continue
        parts = []
        if "numba_triad" in b:
            parts.append(f"triad {b['numba_triad_threads']} threads "
                         f"{b['numba_triad']['best_gbps']:.1f} GB/s (median "
                         f"{b['numba_triad']['median_gbps']:.1f})")
            parts.append(f"triad 1 thread {b['numba_triad_1thread']['best_gbps']:.1f}")
        if "numpy_triad_1thread" in b:
            parts.append(f"numpy triad 1 thread {b['numpy_triad_1thread']['best_gbps']:.1f}")
        parts.append(f"numpy copy 1 thread {b['numpy_copy_1thread']['best_gbps']:.1f}")
        bw_txt.append(f"{when} the run: " + ", ".join(parts))
    mib = bandwidth[0].get("array_mib", 0)
    text = f"memory bandwidth (best of 10, STREAM counting, f64 arrays of {mib:.0f} MiB)\n" \
        + "\n".join(bw_txt)
    md = ["## Memory bandwidth", "",
          f"STREAM-like, over three f64 arrays of {mib:.0f} MiB each, best of 10: triad "
          "`a = b + s*c` (numba `prange`; 24 bytes per element) and `np.copyto` (16 bytes per "
          "element).", "", *[f"- {x}" for x in bw_txt], ""]
    return text, md


def add_run_options(ap, cases: list[str], impls: list[str], quick_help: str) -> None:
    """The options every benchmark takes: --quick, --cases, --impls, --out, --rounds."""
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--cases", default=",".join(cases), help=f"of {','.join(cases)}")
    ap.add_argument("--impls", default=",".join(impls), help=f"of {','.join(impls)}")
    ap.add_argument("--out", default=str(HERE / "results"), help="output directory")
    ap.add_argument("--rounds", type=int, default=None,
                    help="run every implementation this many times per case, interleaved, "
                         "and report the median of the rounds' medians (default 3; 1 with "
                         "--quick)")


def add_driver_options(ap, name: str) -> None:
    """The options of a benchmark with subprocess workers and a report made from its JSON:
    --no-bandwidth, --render JSON, and the workers' hidden --worker and --case."""
    ap.add_argument("--no-bandwidth", action="store_true",
                    help="skip measuring the memory bandwidth")
    ap.add_argument("--render", metavar="JSON",
                    help=f"write the report again from a run's {name}.json (into --out), "
                         "measuring nothing")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)


@dataclass
class Run:
    """A benchmark run, as `begin` sets it up from the command line."""

    cases: list[str]
    impls: list[str]  # as asked for, the skipped ones too
    skipped: dict[str, str]  # impl -> why it cannot run here
    out_dir: Path
    quick: bool
    machine: dict
    started: float  # time.perf_counter()
    wall_s: float = 0.0  # the run's length, once `stop` says it ended

    def stop(self) -> float:
        """The run's seconds so far, kept as its length."""
        self.wall_s = time.perf_counter() - self.started
        return self.wall_s

    @property
    def quick_args(self) -> list[str]:
        """What a worker's command line says of --quick."""
        return ["--quick"] if self.quick else []

    @property
    def runnable(self) -> list[str]:
        return [i for i in self.impls if i not in self.skipped]


def begin(ap, args, known_impls: list[str], check_case: Callable[[str], Any],
          missing: Callable[[str], str | None]) -> Run:
    """The cases and implementations asked for (check_case ends the program on an unknown
    case, `ap.error` on an unknown implementation), the ones that cannot run here (impl ->
    why, from `missing`, printed), the output directory (made) and the machine's
    description; args.rounds gets its default."""
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    for c in cases:
        check_case(c)  # unknown cases fail here
    unknown = [i for i in impls if i not in known_impls]
    if unknown:
        ap.error(f"unknown implementation(s) {', '.join(unknown)}; known: "
                 f"{', '.join(known_impls)}")
    skipped = {i: why for i in impls if (why := missing(i))}
    for i, why in skipped.items():
        print(f"skipping {i}: {why}", flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    return Run(cases, impls, skipped, out_dir, args.quick, machine_info(), started)


def finish(run: Run, name: str, results: dict, bandwidth: list[dict], text: str, md: str,
           title: str, ylabel: str) -> None:
    """Print the tables; write <out>/<name>.md, <name>.json (everything measured) and
    <name>.png (the plot)."""
    print()
    print(text)
    (run.out_dir / f"{name}.md").write_text(md)
    (run.out_dir / f"{name}.json").write_text(json.dumps(
        {"machine": run.machine, "quick": run.quick, "wall_s": run.wall_s,
         "bandwidth": bandwidth, "results": results, "skipped": run.skipped}, indent=1))
    note = plot(results, run.cases, run.impls, run.out_dir / f"{name}.png", title, ylabel)
    print(f"\nwrote {run.out_dir / (name + '.md')}, {run.out_dir / (name + '.json')}"
          + (f"; {note}" if note else f", {run.out_dir / (name + '.png')}"))


def run_rounds(cases: list[str], impls: list[str], rounds: int,
               run_one: Callable[[str, str, int], dict], keys: tuple[str, ...],
               label: Callable[[str], str]) -> tuple[dict, list[tuple[str, str]]]:
    """Every implementation on every case, `rounds` times: each round runs each one once,
    odd rounds in reverse order, so no implementation always runs first or last.
    run_one(impl, case, round) returns its result or {"error": ...}; the rounds merge with
    merge_round (the first round's error stays the result). Returns the results
    (case -> {"_label": label(case), impl: result}) and the (case, impl) that failed."""
    results: dict[str, dict] = {}
    failed: list[tuple[str, str]] = []
    width = max(map(len, cases), default=0)
    for case in cases:
        results[case] = {"_label": label(case)}
        for rnd in range(rounds):
            for impl in impls if rnd % 2 == 0 else impls[::-1]:
                r = run_one(impl, case, rnd)
                prev = results[case].get(impl)
                if "error" in r:
                    failed.append((case, impl))
                    print(f"{case:<{width}} {impl:<14} ERROR {r['error']}", flush=True)
                    if prev is None or rnd == 0:
                        results[case][impl] = r
                    continue
                results[case][impl] = merge_round(prev, r, keys)
                gc.collect()
    return results, failed
