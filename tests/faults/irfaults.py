"""What the IR-text fault modules share (families 14-17): graphs written as text, the error
each must end in, and the same run in a child process for inputs that could exhaust the stack
or memory."""
from __future__ import annotations

import json
import os

import pytest

from graphopt.errors import ParseError, VerifyError
from graphopt.ir import Graph, parse


def graph_text(*lines: str, inputs: str = "  arg %x: f32[4]\n  param @p: f32[4]\n") -> str:
    """A graph whose first node line is line 4 (lines 2-3 declare %x and @p: f32[4])."""
    return "graph g {\n" + inputs + "".join(f"{ln}\n" for ln in lines) + "  return\n}\n"


def kernel_text(attrs: str, operands: str = "%x", types: str = "f32[4]",
                body: tuple[str, ...] = ("    arg %x0: f32[]", "    return %x0")) -> str:
    """A graph holding one kernel node (line 4) with these attributes and body."""
    results = ", ".join(f"%{i}" for i in range(len(types.split(", ")))) if types else ""
    head = f"  {results} = kernel" if results else "  kernel"
    return graph_text(f"{head} {operands} {{{attrs}}} : {types} {{", *body, "  }")


def parse_error(text: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse(text)
    return info.value


def verify_error(graph: str | Graph) -> VerifyError:
    g = parse(graph) if isinstance(graph, str) else graph
    with pytest.raises(VerifyError) as info:
        g.verify()
    return info.value


def check_attr_kind(text: str, attr: str, kind: str) -> None:
    """The graph (its node on line 4) is refused for an attribute that is not of its kind, and
    the message names the attribute, the kind and the node."""
    e = verify_error(text)
    assert e.rule == "attr-kind" and f"attribute '{attr}' must be {kind}" in str(e), str(e)
    node = text.split("\n")[3].strip().removesuffix(" {")
    assert f"in `{node}`" in str(e), str(e)


def check_place(e: ParseError, line: int, col: int, text: str) -> None:
    """The error is at line:col, says so, and shows that source line with a caret under it."""
    assert (e.line, e.col) == (line, col), str(e)
    source = text.split("\n")[line - 1]
    assert str(e).startswith(f"line {line}, column {col}: ")
    assert str(e).endswith(f"\n  {source}\n  {' ' * (col - 1)}^")


# A child's script prints what parse and verify of each file in GIR (paths joined by
# os.pathsep) gave, as JSON: a crash, a hang or a RecursionError cannot take the test run down.
CHILD_SCRIPT = """
    import json, os, sys
    from graphopt.errors import ParseError, VerifyError
    from graphopt.ir import parse

    def verdict(path):
        try:
            with open(path) as f:
                graph = parse(f.read())
            graph.verify()
            return {"result": "ok", "nodes": len(graph.nodes)}
        except ParseError as e:
            return {"result": "ParseError", "line": e.line, "col": e.col, "message": e.message}
        except VerifyError as e:
            return {"result": "VerifyError", "rule": e.rule, "message": e.message}
    print(json.dumps([verdict(p) for p in os.environ["GIR"].split(os.pathsep)]))
"""


def in_child(child, tmp_path, *texts: str, timeout: float = 60) -> list[dict]:
    """Parse and verify each text in one child process: what each gave."""
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"case{i}.gir")
        paths[-1].write_text(text)
    proc = child.run(CHILD_SCRIPT, timeout=timeout, GIR=os.pathsep.join(map(str, paths)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The same through the CLI: `graphopt ARGS... FILE` for each file, in one child process; its
# exit status, stdout and stderr for each.
CLI_SCRIPT = """
    import contextlib, io, json, os, sys
    from graphopt.cli import main
    runs = []
    for path in os.environ["GIR"].split(os.pathsep):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(json.loads(os.environ["ARGS"]) + [path])
        runs.append({"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()})
    print(json.dumps(runs))
"""


def cli_in_child(child, tmp_path, args: list[str], *texts: str, timeout: float = 120) -> list[dict]:
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"cli{i}.gir")
        paths[-1].write_text(text)
    proc = child.run(CLI_SCRIPT, timeout=timeout, GIR=os.pathsep.join(map(str, paths)),
                     ARGS=json.dumps(args))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
