"""What the pages' own blocks cannot check: the site builds, nothing outside the project is
cited, every pass has an example. (Each block of every page is a test of its own:
tests/docblocks.py.)"""
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).parent.parent / "docs"


def test_every_pass_has_an_example_in_the_passes_page():
    from docblocks import DIRECTIVE
    shown = {Path(m.group(2)).parent.name for m in DIRECTIVE.finditer(
        (DOCS / "passes.md").read_text()) if m.group(1) == "example"}
    from graphopt.passes.manager import PASSES
    ours = {n for n, p in PASSES.items() if p.run.__module__.startswith("graphopt.")}
    assert len(ours) >= 8 and ours <= shown, ours - shown


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
