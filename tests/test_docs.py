"""What the pages' own blocks cannot check: the site builds, nothing outside the project is
cited, every pass has an example. (Each block of every page is a test of its own:
tests/docblocks.py.)"""
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).parent.parent / "docs"


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


PAGES = [DOCS.parent / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS.parent)) for p in PAGES])
def test_pages_cite_nothing_outside_the_project(page):
    """The pages stand alone: no design notes, trackers or work sessions the reader cannot see."""
    text = page.read_text()
    for pattern in (r"\bDESIGN\b", r"\b[Ii]ssue \d", r"(?<![\w&])#\d+\b", r"\bsession\b"):
        found = re.search(pattern, text)
        assert found is None, f"{page.name} cites {found.group()!r}"


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: every page in the navigation, no broken link or anchor, every
    docstring of the API reference readable."""
    import os
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(tmp_path / "site")], cwd=DOCS.parent, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "index.html").exists()
