"""Smoke test of benchmarks/adam.py: it runs (small sizes) and prints its table.

No timing is asserted: machines are noisy. The benchmark itself is run by hand
(`python benchmarks/adam.py`); see docs/performance.md.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_adam_benchmark_quick(tmp_path):
    env = dict(os.environ, GRAPHOPT_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "adam.py"), "--quick",
         "--impls", "graphopt,graphopt-bf16,graphopt-v3,numpy", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    table = p.stdout[p.stdout.index("case   implementation"):]
    rows = [line.split() for line in table.splitlines()]
    for case in ("1M", "16M", "64M", "bert", "many"):
        impls = {r[1] for r in rows if len(r) > 2 and r[0] == case}
        assert {"graphopt", "graphopt-bf16", "graphopt-v3", "numpy"} <= impls, (case, table)
    assert "ERROR" not in table
    md = (tmp_path / "out" / "adam.md").read_text()
    assert "| graphopt |" in md and "| numpy |" in md and "| graphopt-bf16 |" in md
    r = json.loads((tmp_path / "out" / "adam.json").read_text())["results"]["16M"]
    # bf16 moments move 20 bytes per element, f32 ones 28: GB/s counts each its own way
    for impl, nbytes in (("graphopt", 28), ("graphopt-bf16", 20), ("graphopt-v3", 28)):
        assert r[impl]["gbps"] == pytest.approx(nbytes * r[impl]["elements"] / r[impl]["ms"] / 1e6)
    assert (tmp_path / "out" / "adam.json").exists()


def test_train_step_benchmark_quick(tmp_path):
    """benchmarks/train_step.py, graphopt on the small MLP: it writes its results, and the
    loss it records is finite and goes down over the steps."""
    import json
    import math

    env = dict(os.environ, GRAPHOPT_CACHE_DIR=str(tmp_path / "cache"))
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "train_step.py"), "--quick",
         "--impls", "graphopt", "--cases", "mlp-small", "--no-bandwidth", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    md = (out / "train_step.md").read_text()
    matmul = "matmul (numpy's BLAS)"  # the breakdown's row for products (train_step.MATMUL)
    assert "| mlp-small | graphopt |" in md and matmul in md
    import importlib.util
    plotted = importlib.util.find_spec("matplotlib") is not None  # a bench extra, not a test one
    assert (out / "train_step.png").exists() == plotted, p.stdout[-2000:]
    assert plotted or "matplotlib is not installed" in p.stdout + p.stderr
    r = json.loads((out / "train_step.json").read_text())["results"]["mlp-small"]["graphopt"]
    losses = r["losses"]
    assert len(losses) == r["steps"] > 2 and all(map(math.isfinite, losses))
    assert losses[-1] < losses[0]
    assert r["breakdown"][matmul]["nodes"] > 0
    o = r["overhead"]  # the tiny twin's step, per node
    assert o["nodes"] > 0 and o["us_per_node"] == pytest.approx(o["step_us"] / o["nodes"])
    assert "Python overhead per node" in md


def test_collective_wait_benchmark_quick(tmp_path):
    """benchmarks/collective_wait.py, 2 ranks, few repetitions: every way to wait is measured
    in every case (the benchmark itself: `python benchmarks/collective_wait.py`)."""
    from support import mpi_missing
    if mpi_missing():
        pytest.skip(mpi_missing())
    env = dict(os.environ, GRAPHOPT_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "collective_wait.py"), "--quick",
         "--ranks", "2", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    md = (tmp_path / "out" / "collective_wait.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| 1 KiB") or
            line.startswith("| 64 MiB")]
    assert len(rows) == 3 * 6, md
    assert "graphopt |" in md and "error" not in md


def test_distributed_benchmark_quick(tmp_path):
    """benchmarks/distributed.py --quick, graphopt only, 1 and 2 ranks: every configuration of
    both cases is measured; at 2 ranks zero=2 sends what zero=0's all_reduce does and holds
    half the state; every rank ends with the same parameters (the benchmark itself:
    `python benchmarks/distributed.py`)."""
    import json

    from support import mpi_missing
    if mpi_missing():
        pytest.skip(mpi_missing())
    env = dict(os.environ, GRAPHOPT_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "distributed.py"), "--quick",
         "--impls", "graphopt", "--no-bandwidth", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    results = json.loads((out / "distributed.json").read_text())["results"]
    for case in ("mlp", "bert"):
        assert set(results[case]) == {"1", "2"}, results[case]
        one, two = results[case]["1"]["results"], results[case]["2"]["results"]
        assert set(one) == {"graphopt jit", "graphopt zero=0", "graphopt zero=1",
                            "graphopt zero=2"}, one
        assert set(two) == set(one) - {"graphopt jit"}, two
        for r in [*one.values(), *two.values()]:
            assert "error" not in r and r["same_on_ranks"] and r["ms"] > 0, r
            assert r["comm_ms"] >= 0 and r["compute_ms"] > 0, r
        z0, z2 = two["graphopt zero=0"], two["graphopt zero=2"]
        assert z2["bytes_sent"] == z0["bytes_sent"] == results[case]["2"]["gradient_bytes"]
        assert max(z2["state_bytes_per_rank"]) * 2 == z0["state_bytes_per_rank"][0]
    md = (out / "distributed.md").read_text()
    assert "| mlp | 2 | 1 | graphopt zero=2 |" in md and "**not met**" not in md


def test_sparse_benchmark_quick(tmp_path):
    """benchmarks/sparse.py on the smallest table: every implementation asked for has a row,
    and the row update moves the K rows' bytes, the dense one the table's."""
    import json

    env = dict(os.environ, GRAPHOPT_CACHE_DIR=str(tmp_path / "cache"))
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sparse.py"), "--quick", "--cases", "100k",
         "--impls", "graphopt-sparse,graphopt-dense", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    md = (out / "sparse.md").read_text()
    assert "| 100k | graphopt-sparse |" in md and "| 100k | graphopt-dense |" in md
    r = json.loads((out / "sparse.json").read_text())["results"]["100k"]
    sparse, dense = r["graphopt-sparse"], r["graphopt-dense"]
    assert sparse["bytes"] < 10e6 < 100e6 < dense["bytes"]  # K = 4096 rows vs 100,000
    assert 0 <= sparse["bytes"] - sparse["model_bytes"] < 64  # the model, and a few scalars
