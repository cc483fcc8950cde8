"""Run a pass test written as text (a `.gir` file), the LLVM way.

A test file holds input IR, one or more RUN lines, and check lines, all directives inside
`#` comments so the file is still valid IR:

    # What this file checks, and why.
    # RUN: graphopt opt %s --passes dce,cse
    # RUN: graphopt opt %s --passes fuse --explain | filecheck %s --check-prefix=EXPLAIN
    graph g {
      ...
    }
    # CHECK: %[[K:[0-9]+]] = kernel
    # CHECK-NEXT: arg %x0: f32[]
    # EXPLAIN: would make a cycle

Each RUN line runs `graphopt ...` in this process (`graphopt.cli.main`, stdout captured), with
`%s` replaced by the file's path, and matches its output against the check lines with the
PyPI `filecheck` package (a Python port of LLVM FileCheck: CHECK, CHECK-NEXT, CHECK-NOT,
CHECK-LABEL, CHECK-SAME, CHECK-DAG, `{{regex}}`, `[[VAR:regex]]` and `[[VAR]]`).

A RUN line without `| filecheck` checks the prefix CHECK. `not graphopt ...` expects a failing
exit code, and `2>&1` adds what graphopt wrote on stderr to the checked output.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from filecheck.error import ErrorOnMatch
from filecheck.finput import FInput
from filecheck.matcher import Matcher
from filecheck.options import Options
from filecheck.parser import Parser, pattern_for_opts

RUN_RE = re.compile(r"^\s*#\s*RUN:(.*)$")
# Anything that looks like a directive (`# WORD:` or `# WORD-SUFFIX:`) in a comment.
DIRECTIVE_RE = re.compile(r"^\s*#\s*([A-Z][A-Z0-9_]*)(-[A-Z0-9-]+)?(\{LITERAL\})?:")
SUFFIXES = re.compile(r"-(NEXT|NOT|LABEL|SAME|DAG|EMPTY|COUNT-[0-9]+)")
CONTEXT_LINES = 12  # output lines shown on each side of where matching stopped


class GirFailure(Exception):
    """A .gir test failed; the message is meant to be read as it is."""


@dataclass
class RunLine:
    lineno: int
    text: str
    argv: list[str]  # the arguments of `graphopt`
    prefixes: list[str] = field(default_factory=lambda: ["CHECK"])
    expect_fail: bool = False
    merge_stderr: bool = False


def parse_run_lines(text: str, path: Path) -> list[RunLine]:
    runs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        m = RUN_RE.match(line)
        if not m:
            continue
        where = f"{path}:{lineno}"
        command, _, check = m.group(1).partition("|")
        words = shlex.split(command)
        run = RunLine(lineno, m.group(1).strip(), [])
        if words[:1] == ["not"]:
            run.expect_fail, words = True, words[1:]
        if "2>&1" in words:
            run.merge_stderr = True
            words.remove("2>&1")
        if words[:1] != ["graphopt"]:
            raise GirFailure(f"{where}: a RUN line runs `graphopt ...`, got {m.group(1).strip()!r}")
        run.argv = [str(path) if w == "%s" else w for w in words[1:]]
        if check.strip():
            cwords = [w for part in shlex.split(check) for w in part.split("=", 1)]
            if cwords[:2] != ["filecheck", "%s"]:
                raise GirFailure(f"{where}: after `|` comes `filecheck %s [--check-prefix=P]`")
            rest = cwords[2:]
            prefixes = [rest[i + 1] for i, w in enumerate(rest[:-1])
                        if w in ("--check-prefix", "--check-prefixes")]
            if len(rest) != 2 * len(prefixes):
                raise GirFailure(f"{where}: filecheck takes only --check-prefix here: {check!r}")
            run.prefixes = [p for ps in prefixes for p in ps.split(",")]
        runs.append(run)
    if not runs:
        raise GirFailure(f"{path}: no `# RUN: graphopt ...` line")
    return runs


def lint(text: str, path: Path, runs: list[RunLine]) -> None:
    """Reject what FileCheck would silently ignore: a misspelt directive, an unused prefix,
    and a file that does not begin by saying what it checks."""
    known = {p for r in runs for p in r.prefixes} | {"RUN", "COM"}
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        m = DIRECTIVE_RE.match(line)
        if m and (m.group(1) not in known or
                  (m.group(2) is not None and not SUFFIXES.fullmatch(m.group(2)))):
            raise GirFailure(f"{path}:{lineno}: unknown directive {m.group(0).strip()!r} (prefixes "
                             f"of this file: {', '.join(sorted(known - {'RUN', 'COM'}))})")
    for prefix in {p for r in runs for p in r.prefixes}:
        if not any((m := DIRECTIVE_RE.match(line)) and m.group(1) == prefix for line in lines):
            raise GirFailure(f"{path}: no {prefix}: line for the RUN line that checks {prefix}")
    first = lines[0] if lines else ""
    if not first.startswith("#") or DIRECTIVE_RE.match(first):
        raise GirFailure(f"{path}:1: begin with a comment that says what the file checks and why")


def run_graphopt(argv: list[str]) -> tuple[int, str, str]:
    """`graphopt ARGV` in this process: (exit code, stdout, stderr)."""
    from graphopt.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


class _Matcher(Matcher):
    """filecheck's matcher, remembering where a CHECK-NOT found what it excludes."""

    excluded_at: int | None = None

    def check_not(self, op, search_range):
        try:
            super().check_not(op, search_range)
        except ErrorOnMatch as e:
            self.excluded_at = e.match.start(0)
            raise


def filecheck(check_path: Path, check_text: str, output: str, prefixes: list[str],
              run: str = "") -> str | None:
    """Match `output` against the check lines of `check_text`; None, or why it did not match
    (the directive and its line, the error, `run`, and the output where matching stopped)."""
    opts = Options(match_filename=str(check_path), input_file="<graphopt output>",
                   check_prefixes=",".join(prefixes))
    parser = Parser(opts, io.StringIO(check_text), *pattern_for_opts(opts))
    matcher = _Matcher(opts, FInput(opts.input_file, FInput.canonicalize_line_ends(output)),
                       parser)
    matcher.stderr = report = io.StringIO()
    if matcher.run() == 0:
        return None
    # filecheck's first line names the .gir line and the error; its positions in the output
    # are replaced by the excerpt below.
    first = report.getvalue().strip().splitlines()[0] if report.getvalue().strip() else "failed"
    m = re.match(re.escape(str(check_path)) + r":(\d+): (?:error: )?(.*)", first)
    if m:
        lineno = int(m.group(1))
        first = (f"{check_path}:{lineno}: {check_text.splitlines()[lineno - 1].strip()}\n"
                 f"  error: {m.group(2)}")
    if run:
        first += f"\n  {run}"
    variables = ", ".join(f"{k}={v!r}" for k, v in matcher.ctx.live_variables.items())
    if variables:
        first += f"\n  variables: {variables}"
    if matcher.excluded_at is not None:
        return first + "\n\n" + excerpt(output, matcher.excluded_at, "the excluded text is")
    return first + "\n\n" + excerpt(output, matcher.file.range.start, "matching stopped")


def excerpt(output: str, pos: int, what: str) -> str:
    """The output around character `pos`, numbered, with `>` on the line of `pos`."""
    lines = output.splitlines()
    if not lines:
        return "(the output is empty)"
    pos = max(0, min(pos, len(output) - 1))
    at = output.count("\n", 0, pos) + (output[pos] == "\n" and pos > 0)
    at = min(at, len(lines) - 1)
    lo, hi = max(0, at - CONTEXT_LINES), min(len(lines), at + CONTEXT_LINES + 1)
    shown = [f"{'>' if i == at else ' '} {i + 1:4} | {lines[i]}" for i in range(lo, hi)]
    head = f"output near where {what} (line {at + 1} of {len(lines)}):"
    return "\n".join([head] + (["  ..."] if lo else []) + shown + (["  ..."] if hi < len(lines) else []))


def run_file(path: Path) -> None:
    """Run every RUN line of a .gir file and check its output; raise GirFailure if one fails."""
    text = path.read_text()
    runs = parse_run_lines(text, path)
    lint(text, path, runs)
    for run in runs:
        where = f"RUN (line {run.lineno}): {run.text}"
        try:
            code, out, err = run_graphopt(run.argv)
        except Exception:  # a crash in graphopt, not an error it reports: show where
            raise GirFailure(f"{path}:{run.lineno}: {where}\ngraphopt crashed:\n"
                             f"{traceback.format_exc()}") from None
        if run.expect_fail != (code != 0):
            expected = "to fail" if run.expect_fail else "to succeed"
            raise GirFailure(f"{path}:{run.lineno}: {where}\nexpected graphopt {expected}, exit code {code}\n"
                             f"stderr:\n{err}\nstdout:\n{out}")
        output = out + (err if run.merge_stderr else "")
        problem = filecheck(path, text, output, run.prefixes, where)
        if problem:
            raise GirFailure(problem)
