"""The Python blocks of the tutorial run, in order, as they are."""
import re
from pathlib import Path

import numpy as np

DOCS = Path(__file__).parent.parent / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_tutorial_runs(capsys):
    blocks = python_blocks(DOCS / "tutorial.md")
    assert len(blocks) >= 6
    scope: dict = {}
    for block in blocks:
        exec(compile(block, "tutorial.md", "exec"), scope)
    out = capsys.readouterr().out
    # The values the tutorial states in its comments are what the code prints.
    assert "[ 0.84 -2.16  2.84]" in out and "[ 0.8 -2.2  2.8]" in out
    assert "traces=1, compiles=1, hits=2" in out
    np.testing.assert_allclose(scope["w"].numpy(), [0.8, -2.2, 2.8], rtol=1e-6)


def test_tutorial_shows_the_printed_graph(capsys):
    blocks = python_blocks(DOCS / "tutorial.md")
    scope: dict = {}
    for block in blocks[:2]:
        exec(compile(block, "tutorial.md", "exec"), scope)
    printed = capsys.readouterr().out
    text = (DOCS / "tutorial.md").read_text()
    shown = re.search(r"```\n(graph sgd_step \{.*?\n\})\n```", text, flags=re.S).group(1)
    assert shown in printed


def test_readme_example_prints_what_the_readme_shows():
    import subprocess
    import sys
    readme = (DOCS.parent / "README.md").read_text()
    code = python_blocks(DOCS.parent / "README.md")[0]
    shown = re.search(r"```\n(graph rmsprop_step \{.*?\n\})\n```", readme, flags=re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == shown


def test_ir_doc_kernel_example_parses_verifies_and_prints_back():
    from graphopt.ir import parse
    text = (DOCS / "ir.md").read_text()
    fragment = re.search(r"```\n(%3, %4 = kernel.*?\n\})\n```", text, flags=re.S).group(1)
    lines = fragment.splitlines()
    head = lines[0].replace("%3, %4 = kernel", "%0, %1 = kernel")
    graph = parse("graph g {\n  param @w: f32[4,3]\n  arg %g: f32[4,3]\n  arg %lr: f32[]\n"
                  + "\n".join("  " + ln for ln in [head] + lines[1:])
                  + "\n  return %0 after(%1)\n}").verify()
    printed = str(graph).splitlines()
    assert printed[4] == "  " + head  # the cost comment too: the printer computes it
    assert printed[5:5 + len(lines) - 1] == ["  " + ln for ln in lines[1:]]


def test_every_pass_has_an_example_in_the_passes_page():
    from docblocks import DIRECTIVE
    shown = {Path(m.group(2)).parent.name for m in DIRECTIVE.finditer(
        (DOCS / "passes.md").read_text()) if m.group(1) == "example"}
    assert {"dce", "cse", "fold", "simplify", "fuse", "hfuse"} <= shown
