"""Helpers several test files share."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

import graphopt as go
from graphopt import ops


def line_of(path: str, marker: str) -> int:
    """The line of the file at `path` ending in `# <marker>` (exactly one)."""
    with open(path) as f:
        hits = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def run_program(prog: Sequence[tuple], params: list, args: Sequence[Any],
                unary: Sequence[Callable], binary: Sequence[Callable]) -> list:
    """A random step: a pool of values (the arguments, then the parameters) grows by the ops
    the program picks; `assign` writes a parameter of the value's shape. Returns the
    reductions asked for and the last value made."""
    pool = list(args) + list(params)
    outputs = []
    for kind, a, b, c in prog:
        x, y = pool[a % len(pool)], pool[b % len(pool)]
        if kind == "unary":
            pool.append(unary[b % len(unary)](x))
        elif kind == "binary":
            pool.append(binary[b % len(binary)](x, y))
        elif kind == "where":
            pool.append(ops.where(x > y, x, y * c))
        elif kind == "const":
            pool.append(x * c + c)
        elif kind == "pow":
            pool.append(x ** c)
        elif kind in ("sum", "max", "mean"):
            outputs.append(getattr(x, kind)())
        elif kind in ("partial_sum", "partial_max", "partial_mean"):  # over the leading axis
            outputs.append(getattr(x, kind[len("partial_"):])(axis=0) if x.ndim else x)
        elif kind == "assign":
            same_shape = [p for p in params if p.shape == tuple(x.shape)]
            go.assign(same_shape[b % len(same_shape)], x)
    return outputs + [pool[-1]]


# -- CPU levels: the LLVM differential tests run for each (conftest's `cpu_level` fixture) ------
def _cpu_levels() -> tuple[str, ...]:
    """The baseline, AVX2 and this host on x86-64: so an AVX-512 machine also tests the code an
    AVX2 laptop runs, and any machine tests the baseline. Elsewhere: the baseline and host."""
    import platform
    if platform.machine().lower() in ("x86_64", "amd64"):
        return ("x86-64", "x86-64-v3", "host")
    return ("generic", "host")


CPU_LEVELS = _cpu_levels()


# -- multi-process tests: MPI jobs (tests/distributed) ------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
_RUN_MARK = "TESTS_MPI_JOB"  # in the environment of every process of one job


def mpiexec() -> str | None:
    """The mpiexec of the MPI under mpi4py: MPICH's wheel puts it beside this Python."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def mpi_missing() -> str | None:
    """Why MPI jobs cannot run here, or None."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'graphopt[dist]')"
    if mpiexec() is None:
        return "no mpiexec on PATH (pip install 'graphopt[dist]' brings MPICH's)"
    return None


needs_mpi = pytest.mark.skipif(mpi_missing() is not None, reason=mpi_missing() or "")


@dataclass
class MPIResult:
    """What an MPI job did: its exit status, output, each rank's result (the JSON the rank
    wrote, None for a rank that wrote none), its wall time and when it ended."""

    returncode: int
    stdout: str
    stderr: str
    results: list[Any]
    seconds: float
    ended_at: float  # time.time() when it ended

    @property
    def output(self) -> str:
        """stdout and stderr, for assertion messages."""
        return f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def _job_processes(mark: str) -> list[int]:
    """Every live process whose environment holds `mark`: mpiexec, its proxies and the ranks,
    which MPICH's launcher puts in sessions of their own (a process group does not hold
    them)."""
    needle = mark.encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours
                pass
    return found


def _kill_job(proc: subprocess.Popen, mark: str) -> None:
    for pid in set(_job_processes(mark)) | {proc.pid}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_mpi(n: int, script: str | Path, *args: str, timeout: float = 120,
            env: dict[str, str] | None = None, via: str = "mpiexec",
            results: bool = True) -> MPIResult:
    """Run `script` as an MPI job of n ranks and return what it did. The script is called with
    a results directory first (unless `results` is False: an example), then `args`; rank R
    may write its result to `<dir>/rank<R>.json` (tests/distributed/scripts/rankio.py does).

    via: "mpiexec" (`mpiexec -n N python SCRIPT`), "mpi4py" (`mpiexec -n N python -m mpi4py
    SCRIPT`) or "python" (`python SCRIPT`, no MPI launcher: n must be 1). The job gets this
    checkout first on PYTHONPATH, the test run's GRAPHOPT_CACHE_DIR and `env`. A job that
    has not ended after `timeout` seconds is killed, every process of it, and the test fails
    with its output so far: a hang fails the test, it never holds up the run."""
    launcher = mpiexec()
    assert via in ("mpiexec", "mpi4py", "python"), via
    assert via != "python" or n == 1, "a job without mpiexec has one rank"
    out = Path(tempfile.mkdtemp(prefix="graphopt-mpi-"))
    python = [sys.executable] + (["-m", "mpi4py"] if via == "mpi4py" else [])
    cmd = ([] if via == "python" else [launcher, "-n", str(n)]) + python + \
        [str(script), *([str(out)] if results else []), *map(str, args)]
    mark = f"{_RUN_MARK}={uuid.uuid4().hex}"
    job_env = dict(os.environ, **(env or {}))
    job_env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    job_env[_RUN_MARK] = mark.split("=", 1)[1]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=job_env, cwd=ROOT,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_job(proc, mark)
        try:
            stdout, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a pipe still held open: say so, with nothing more
            stdout, stderr = "", "(the job's output could not be read after it was killed)"
        shutil.rmtree(out, ignore_errors=True)
        pytest.fail(f"`{' '.join(cmd)}` did not end within {timeout:g} s and was killed; its "
                    f"output so far:\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
                    pytrace=False)
    seconds, ended_at = time.monotonic() - start, time.time()
    results = []
    for r in range(n):
        path = out / f"rank{r}.json"
        results.append(json.loads(path.read_text()) if path.exists() else None)
    shutil.rmtree(out, ignore_errors=True)
    return MPIResult(proc.returncode, stdout, stderr, results, seconds, ended_at)


# -- a headless browser for the explorer's page (Debian's chromium and chromium-driver) -------
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def chromium_missing() -> str | None:
    """Why the explorer's page cannot be opened in a browser here, or None."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e '.[test]')"
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        return (f"{' and '.join(missing)} not found: apt install chromium chromium-driver "
                f"(.ci/run does)")
    return None


def headless_chromium(width: int = 1600, height: int = 1000):
    """A selenium driver of the system's chromium, headless; the driver's path is given, so
    Selenium Manager downloads nothing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-extensions",
                "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def open_page(driver, path: str | os.PathLike) -> None:
    """Open a page from disk and wait for its script to have drawn it."""
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(Path(path).resolve().as_uri())
    WebDriverWait(driver, 60).until(
        lambda d: d.execute_script("return document.body.dataset.ready") == "yes")
