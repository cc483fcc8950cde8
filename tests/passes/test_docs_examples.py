"""The before/after examples of docs/passes.md are real.

An example in the page is an HTML comment naming a test file and the `graphopt opt` options,
followed by two fenced blocks, the input and the output:

    <!-- example: tests/passes/dce/after_edge_pure.gir --passes dce -->
    ```
    graph ... (exactly the graph of that file)
    ```
    ```
    graph ... (exactly what `graphopt opt FILE --passes dce` prints)
    ```

The options must be those of one of the file's RUN lines, so every example is also a checked
test. `<!-- excerpt: FILE OPTIONS -->` followed by one block says that the block's lines occur,
together and in order, in the output (for explain output and long graphs).
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from girtest import parse_run_lines, run_graphopt

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "passes.md"
FENCE = r"```[a-z]*\n(.*?)```\n"
EXAMPLE = re.compile(r"<!-- example: (\S+)(.*?) -->\n" + FENCE + FENCE, re.S)
EXCERPT = re.compile(r"<!-- excerpt: (\S+)(.*?) -->\n" + FENCE, re.S)


def graph_text(path: Path) -> str:
    """The graph of a .gir file: from its `graph` line to the `}` that closes it."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("graph "))
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    return "\n".join(lines[start:end + 1]) + "\n"


def run(file: str, options: str) -> tuple[Path, list[str], str]:
    path = ROOT / file
    args = shlex.split(options)
    runs = [r.argv for r in parse_run_lines(path.read_text(), path)]
    assert ["opt", str(path), *args] in runs, \
        f"{file}: no RUN line runs `graphopt opt %s {options.strip()}` (it has {runs})"
    code, out, err = run_graphopt(["opt", str(path), *args])
    assert code == 0, err
    return path, args, out


EXAMPLES = EXAMPLE.findall(PAGE.read_text())
EXCERPTS = EXCERPT.findall(PAGE.read_text())


@pytest.mark.parametrize("file, options, before, after", EXAMPLES,
                         ids=[f"{f.split('/')[-2]}/{f.split('/')[-1]}{o}" for f, o, _, _ in EXAMPLES])
def test_example(file, options, before, after):
    path, _, out = run(file, options)
    assert before == graph_text(path), f"the 'before' block is not the graph of {file}"
    assert out == after, f"graphopt opt {file}{options} prints:\n{out}"


@pytest.mark.parametrize("file, options, block", EXCERPTS,
                         ids=[f"{f.split('/')[-2]}/{f.split('/')[-1]}{o}" for f, o, _ in EXCERPTS])
def test_excerpt(file, options, block):
    _, _, out = run(file, options)
    assert block in out, f"graphopt opt {file}{options} prints:\n{out}"


def test_every_pass_has_an_example():
    shown = {Path(f).parent.name for f, *_ in EXAMPLES}
    assert {"dce", "cse", "fold", "simplify", "fuse", "hfuse"} <= shown
