"""Every example and the demo run as they are."""
import subprocess
import sys
from pathlib import Path

import pytest

from graphopt.cli import main

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, tmp_path):
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "graph " in done.stdout  # each example shows a graph


def test_examples_exist():
    assert len(EXAMPLES) >= 2


def test_demo(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "graph adam_step {" in out and "= assign @fc1.w," in out  # the traced IR
    assert "store %x" in out and "28 B/elem" in out  # the fused update kernel
    errors = [float(line.split("= ")[-1].split()[0]) for line in out.splitlines()
              if "max |graphopt - numpy|" in line]
    assert len(errors) == 3 and max(errors) < 1e-6
    assert (tmp_path / "adam_step.txt").read_text().startswith("graph adam_step {")
    assert (tmp_path / "adam_step.traced.txt").read_text().startswith("graph adam_step {")
    assert (tmp_path / "adam_step.dot").read_text().startswith("digraph")


def test_cli_ir_roundtrip(tmp_path, capsys):
    src = tmp_path / "g.ir"
    src.write_text("graph g {\n  arg %x: f32[3]\n  %0 = exp %x : f32[3]\n  return %0\n}\n")
    assert main(["ir", str(src)]) == 0
    assert "%0 = exp %x : f32[3]" in capsys.readouterr().out


def test_cli_reports_bad_ir(tmp_path, capsys):
    src = tmp_path / "bad.ir"
    src.write_text("graph g {\n  arg %x: f32[3]\n  %0 = exp %y : f32[3]\n  return %0\n}\n")
    assert main(["ir", str(src)]) == 2  # a mistake in the file: status 2
    err = capsys.readouterr().err
    assert "line 3" in err and "%y" in err
