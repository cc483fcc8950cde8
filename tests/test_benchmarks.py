"""Smoke test of benchmarks/adam.py: it runs (small sizes) and prints its table.

No timing is asserted: machines are noisy. The benchmark itself is run by hand
(`python benchmarks/adam.py`); see docs/performance.md.
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_adam_benchmark_quick(tmp_path):
    env = dict(os.environ, GRAPHOPT_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "adam.py"), "--quick",
         "--impls", "graphopt,numpy", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    table = p.stdout[p.stdout.index("case   implementation"):]
    rows = [line.split() for line in table.splitlines()]
    for case in ("1M", "16M", "64M", "bert", "many"):
        impls = {r[1] for r in rows if len(r) > 2 and r[0] == case}
        assert {"graphopt", "numpy"} <= impls, (case, table)
    assert "ERROR" not in table
    md = (tmp_path / "out" / "adam.md").read_text()
    assert "| graphopt |" in md and "| numpy |" in md
    assert (tmp_path / "out" / "adam.json").exists()
