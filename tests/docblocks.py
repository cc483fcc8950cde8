"""Every fenced block of README.md and docs/ is a test; `docs/writing-docs.md` is the contract.

A block's info string is a language and an optional title, as MkDocs renders it:
```` ```python ````, ```` ```text title="output" ````. What the block is follows from them:

- `python`, no title: run, in page order, in one namespace per page, in the page's directory.
- `console`, no title: each `$ COMMAND` line runs in bash in the page's directory; the lines
  after it are what it prints (stdout and stderr). A command must exit 0, or exit 2 (graphopt's
  status for a user's mistake) and show the error it prints.
- `title="output"`: what the run block before it printed. Compared line by line after trailing
  spaces are dropped; `...` matches any text, across lines too (doctest's ELLIPSIS).
- `title="PATH"` (a file name with a dot): written to PATH in the page's directory, for the
  blocks after it to read.
- `title="not run"` (or `title="not run: why"`): shown, never run.
- An `<!-- example: FILE OPTIONS -->` comment followed by two blocks: FILE's graph and what
  `graphopt opt FILE OPTIONS` prints, and the options are one of FILE's RUN lines, so the example
  is a checked test too; `<!-- excerpt: FILE OPTIONS -->` and one block: lines that occur, in
  order, in what it prints.

Any other block fails as unmarked. The page's directory is a fresh temporary one holding links
to the checkout's `examples/`, `tests/` and `benchmarks/`, so a block runs as written from the
repository's root and leaves nothing behind.
"""
from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable

from sybil import Document, Example, Region, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "passes"))
from girtest import parse_run_lines, run_graphopt  # noqa: E402

INFO = re.compile(r'(?P<language>[\w-]*)(?:[ \t]+title="(?P<title>[^"]*)")?[ \t]*$\n', re.M)
FENCES = RawFencedCodeBlockLexer(info_pattern=INFO,
                                 mapping={"language": "language", "title": "title",
                                          "source": "source"})
FENCE = r"[ \t]*```[a-z]*\n(.*?)[ \t]*```\n"
DIRECTIVE = re.compile(r"<!-- (example|excerpt): (\S+)(.*?) -->\n" + FENCE + r"(?:\n?" + FENCE
                       + ")?", re.S)
LINKED = ("examples", "tests", "benchmarks")
OUT = "__docs_output__"  # the namespace key of what the last run block printed
DIR = "__docs_dir__"


class DocBlockError(AssertionError):
    """A block of a page that does not do what the page says."""


def matches(want: str, got: str) -> bool:
    """Whether `got` is `want`, trailing spaces aside, `...` matching any text."""
    def norm(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"
    return doctest.OutputChecker().check_output(norm(want), norm(got), doctest.ELLIPSIS)


def _difference(want: str, got: str) -> str:
    return doctest.OutputChecker().output_difference(
        doctest.Example("", want.strip("\n") + "\n"), got.strip("\n") + "\n",
        doctest.ELLIPSIS | doctest.REPORT_UDIFF)


@contextlib.contextmanager
def _in_dir(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def run_python(example: Example) -> None:
    out = io.StringIO()
    with _in_dir(example.namespace[DIR]), contextlib.redirect_stdout(out):
        PythonEvaluator()(example)
    example.namespace[OUT] = out.getvalue()


def _commands(source: str) -> list[tuple[str, str]]:
    """(command, the output shown for it) of a console block; `\\` continues a command."""
    runs: list[tuple[str, list[str]]] = []
    lines = iter(source.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1] + next(lines).strip()
            runs.append((command, []))
        elif runs:
            runs[-1][1].append(line)
        elif line.strip():
            raise DocBlockError(f"a console block starts with a `$ ` command, not {line!r}")
    return [(command, "\n".join(shown)) for command, shown in runs]


def run_console(example: Example) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    for command, shown in _commands(example.parsed):
        done = subprocess.run(["bash", "-c", command], cwd=example.namespace[DIR], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=300)
        if done.returncode not in (0, 2) or (done.returncode == 2 and not shown.strip()):
            raise DocBlockError(f"`{command}` exits with status {done.returncode}:\n"
                                f"{done.stdout}")
        if not matches(shown, done.stdout):
            raise DocBlockError(f"`{command}` prints something else:\n"
                                + _difference(shown, done.stdout))
        example.namespace[OUT] = done.stdout


def check_output(example: Example) -> None:
    got = example.namespace.get(OUT)
    if got is None:
        raise DocBlockError("an output block must follow a python or console block")
    if not matches(example.parsed, got):
        raise DocBlockError("the block before prints something else:\n"
                            + _difference(example.parsed, got))


def write_file(example: Example) -> None:
    path = example.namespace[DIR] / example.region.lexemes["title"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(example.parsed)


def unmarked(example: Example) -> None:
    lexemes = example.region.lexemes
    fence = "```" + (lexemes["language"] or "") + (f' title="{lexemes["title"]}"'
                                                   if lexemes["title"] is not None else "")
    raise DocBlockError(
        f"an unmarked block ({fence}): a block runs "
        "(python, console), is the output of the one before (title=\"output\"), is a file "
        "(title=\"NAME.ext\") or is marked title=\"not run\" (docs/writing-docs.md)")


def graph_text(path: Path) -> str:
    """The graph of a .gir file: from its `graph` line to the `}` that closes it."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("graph "))
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    return "\n".join(lines[start:end + 1]) + "\n"


def run_pass_example(example: Example) -> None:
    kind, file, options, first, second = example.parsed
    path = ROOT / file
    args = shlex.split(options)
    runs = [r.argv for r in parse_run_lines(path.read_text(), path)]
    if ["opt", str(path), *args] not in runs:
        raise DocBlockError(f"{file}: no RUN line runs `graphopt opt %s {options.strip()}` "
                            f"(it has {runs})")
    code, out, err = run_graphopt(["opt", str(path), *args])
    if code != 0:
        raise DocBlockError(err)
    if kind == "excerpt":
        if first not in out:
            raise DocBlockError(f"graphopt opt {file}{options} prints:\n{out}")
        return
    if first != graph_text(path):
        raise DocBlockError(f"the first block is not the graph of {file}")
    if out != second:
        raise DocBlockError(f"graphopt opt {file}{options} prints:\n"
                            + _difference(second, out))


def _evaluator(language: str, title: str | None):
    if title is None:
        return {"python": run_python, "console": run_console}.get(language, unmarked)
    if title == "output":
        return check_output
    if title == "not run" or title.startswith("not run:"):
        return None
    if re.fullmatch(r"[\w./-]+\.\w+", title):
        return write_file
    return unmarked


def _body(block: str) -> str:
    """The text of a fenced block as written: sybil dedents it, which output must not be."""
    fence, *lines, _ = block.split("\n")
    indent = len(fence) - len(fence.lstrip())
    return "".join(line[indent:] + "\n" for line in lines)


def parse_blocks(document: Document) -> Iterable[Region]:
    """The regions of a page: pass examples first, then each fenced block outside them."""
    taken = []
    for m in DIRECTIVE.finditer(document.text):
        if m.group(1) == "example" and m.group(5) is None:
            raise DocBlockError(f"{document.path}: the example at offset {m.start()} needs "
                                "two blocks")
        taken.append((m.start(), m.end()))
        yield Region(m.start(), m.end(), m.groups(), run_pass_example)
    for region in FENCES(document):
        if any(start <= region.start < end for start, end in taken):
            continue
        lexemes = region.lexemes
        evaluator = _evaluator(lexemes["language"] or "", lexemes["title"])
        if evaluator is not None:
            region.parsed = lexemes["source"] if evaluator is run_python else _body(
                document.text[region.start:region.end])
            region.evaluator = evaluator
            yield region


def setup(namespace: dict) -> None:
    where = Path(tempfile.mkdtemp(prefix="graphopt-docs-"))
    for name in LINKED:
        (where / name).symlink_to(ROOT / name)
    namespace[DIR] = where


def teardown(namespace: dict) -> None:
    shutil.rmtree(namespace[DIR], ignore_errors=True)


DOCS = Sybil(parsers=[parse_blocks], patterns=["README.md", "docs/*.md", "docs/**/*.md"],
             path=str(ROOT), setup=setup, teardown=teardown)
