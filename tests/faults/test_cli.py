"""Family 18: the `graphopt` command never shows a traceback for a user's mistake.

A user file with a syntax error or not in UTF-8, `--print-after '('`, `compile x.py:w` where w
is not callable, `compile good.txt:step` and `demo --steps 0` gave raw tracebacks. Now a
mistake in the command line, in a file it names, in the code that file runs or in a switch
is one line on stderr saying what is wrong (with the user's file:line when it is in a file)
and exit status 2; a GraphoptError is such a line too; any other exception from graphopt's
own code is a bug: one line saying so and how to see the traceback, status 1. GRAPHOPT_DEBUG=1
adds the traceback. Nothing is written when a command fails.

Most cases call `graphopt.cli.main` in this process (a raw exception fails the test as it
would have shown a traceback); the issue's own cases, the bug, Ctrl-C and a closed pipe run
the real command in a child process with a timeout.
"""
import io
import sys
import textwrap
from pathlib import Path

import pytest

from graphopt.cli import main

FILES = {
    "good.py": """\
        import numpy as np
        w = 3
        def make_inputs():
            return (np.ones(3, np.float32),)
        def step(x):
            return x * 2.0
        """,
    "syntax.py": """\
        import numpy as np
        def make_inputs():
            return (np.ones(3, np.float32),
        def step(x):
            return x
        """,
    "on_import.py": """\
        import numpy as np
        raise ValueError("boom at import")
        """,
    "in_make_inputs.py": """\
        import numpy as np
        def make_inputs():
            return (np.ones(3, np.float32), 1 // 0)
        def step(x, y):
            return x
        """,
    "in_step.py": """\
        import numpy as np
        def make_inputs():
            return (np.ones(3, np.float32),)
        def step(x):
            return x * np.zeros(2)[5]
        """,
    "helper.py": """\
        def helper():
            raise RuntimeError("from the helper module")
        """,
    "uses_helper.py": """\
        import numpy as np
        from helper import helper
        def make_inputs():
            return (np.ones(3, np.float32),)
        def step(x):
            helper()
        """,
    "no_inputs.py": """\
        def step(x):
            return x
        """,
    "inputs_not_callable.py": """\
        make_inputs = (1.0,)
        def step(x):
            return x
        """,
    "wrong_arity.py": """\
        import numpy as np
        def make_inputs():
            return (np.ones(3, np.float32), np.ones(3, np.float32))
        def step(x):
            return x
        """,
    "bad_op.py": """\
        import numpy as np
        def make_inputs():
            return (np.ones(3, np.float32), np.ones(4, np.float32))
        def step(x, y):
            return x + y
        """,
    "returns_str.py": """\
        import numpy as np
        def make_inputs():
            return (np.ones(3, np.float32),)
        def step(x):
            return "a result"
        """,
    "dataclass_user.py": """\
        from dataclasses import dataclass
        import numpy as np
        @dataclass
        class Scale:
            by: float = 2.0
        def make_inputs():
            return (np.ones(3, np.float32),)
        def step(x):
            return x * Scale().by
        """,
    "interrupt.py": """\
        raise KeyboardInterrupt
        """,
    "plugin.py": """\
        from graphopt.passes import register
        @register("exp_to_sqrt")
        def exp_to_sqrt(graph, ctx):
            \"\"\"Renames every exp a sqrt (a test pass: wrong, but plain to see).\"\"\"
            for n in graph.nodes:
                if n.op == "exp":
                    n.op = "sqrt"
            return {"renamed": 1}
        """,
    "passes_module.py": """\
        def negate_exp(graph, ctx):
            \"\"\"exp(x) -> negative(x), refusing every other node (a test pass).\"\"\"
            for n in list(graph.nodes):
                if n.op != "exp":
                    ctx.refuse(n.op, "not an exp", n.loc)
                    continue
                i = graph.nodes.index(n)
                m = graph.add_node("negative", [n.inputs[0]], loc=n.loc)
                graph.nodes.pop()
                graph.nodes[i] = m
                n.out.replace_all_uses_with(m.out)
                n.detach()
            ctx.refuse("the return", "left as it is")
            return {"negated": 1}
        answer = 42
        """,
    "plugin_syntax.py": """\
        from graphopt.passes import register
        @register("broken"
        def broken(graph, ctx):
            pass
        """,
    "plugin_raises.py": """\
        from graphopt.passes import register
        raise ValueError("boom in a plugin")
        """,
    "plugin_taken.py": """\
        from graphopt.passes import register
        @register("cse")
        def my_cse(graph, ctx):
            pass
        """,
    "good.gir": """\
        graph g {
          arg %x: f32[3]
          %0 = exp %x : f32[3]
          return %0
        }
        """,
    "bad.gir": """\
        graph g {
          arg %x: f32[3]
          %0 = exp %y : f32[3]
          return %0
        }
        """,
    "ill_typed.gir": """\
        graph g {
          arg %x: f32[3]
          %0 = exp %x : f32[4]
          return %0
        }
        """,
}
BINARY = {
    "latin1.py": b"import numpy as np\nname = '\xe9t\xe9'\ndef step(x):\n    return x\n",
    "latin1.gir": b"graph g {\n  arg %\xe9: f32[3]\n  return %\xe9\n}\n",
}


@pytest.fixture
def files(tmp_path, monkeypatch):
    """The files above in a fresh folder, which is the working directory; no `dot` on PATH."""
    for name, text in FILES.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "good.txt").write_text(textwrap.dedent(FILES["good.py"]))
    for name, data in BINARY.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "folder").mkdir()
    (tmp_path / "empty_path").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty_path"))
    for name in ("GRAPHOPT_DEBUG", "GRAPHOPT_THREADS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else None
            for p in sorted(d.rglob("*"))}


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's usage errors
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


# id: (argv, the line stderr says, after "error: ")
MISTAKES = {
    # the issue's cases
    "syntax error": (["compile", "syntax.py:step"],
                     "syntax.py:3: SyntaxError: '(' was never closed (while running syntax.py)"),
    "not UTF-8 (python)": (["compile", "latin1.py:step"],
                           "latin1.py:2: not UTF-8 text (and no coding line says otherwise):"),
    "--print-after '('": (["opt", "good.gir", "--print-after", "("],
                          "--print-after '(' is neither a pass name nor a regular expression: "
                          "missing ), unterminated subpattern at position 0"),
    "not callable": (["compile", "good.py:w"], "good.py: w is not a function (it is of type int)"),
    "--steps 0": (["demo", "--steps", "0"], "argument --steps: 0 is not 1 or more"),
    # more of the same family: the command line
    "--steps -3": (["demo", "--steps", "-3"], "argument --steps: -3 is not 1 or more"),
    "--steps x": (["demo", "--steps", "x"], "argument --steps: 'x' is not a whole number"),
    "--out is a file": (["demo", "--out", "good.py"],
                        "--out good.py: not a folder (a file has that name)"),
    "no FUNC": (["compile", "good.py"], "expected FILE.py:FUNC, got 'good.py'"),
    "no FILE": (["compile", ":step"], "expected FILE.py:FUNC, got ':step'"),
    "missing file": (["compile", "missing.py:step"], "no such file: missing.py"),
    "a folder as FILE": (["compile", "folder:step"], "folder is not a file"),
    "no such function": (["compile", "good.py:nope"],
                         "good.py has no function nope (it defines make_inputs, step)"),
    "no make_inputs": (["compile", "no_inputs.py:step"], "no_inputs.py must define make_inputs()"),
    "make_inputs not callable": (["compile", "inputs_not_callable.py:step"],
                                 "inputs_not_callable.py: make_inputs is not a function (it is "
                                 "of type tuple)"),
    "unknown pass": (["opt", "good.gir", "--passes", "dce,frobnicate"],
                     "unknown pass frobnicate; known passes: "),
    "unknown pass (compile)": (["compile", "good.py:step", "--passes", "fuse,frobnicate"],
                               "unknown pass frobnicate; known passes: "),
    "svg without -o": (["opt", "good.gir", "--emit", "svg"], "--emit svg needs -o FILE.svg"),
    "svg to a .txt": (["opt", "good.gir", "--emit", "svg", "-o", "out.txt"],
                      "--emit svg writes .svg files, but -o names 'out.txt'; name it FILE.svg"),
    "svg without dot": (["opt", "good.gir", "--emit", "svg", "-o", "out.svg"],
                        "rendering .svg needs the Graphviz `dot` program, which is not on PATH"),
    "pdf without dot": (["compile", "good.py:step", "--emit", "pdf", "-o", "out.pdf"],
                        "rendering .pdf needs the Graphviz `dot` program"),
    "-o in a missing folder": (["opt", "good.gir", "-o", "nowhere/out.txt"],
                               "cannot write nowhere/out.txt: No such file or directory"),
    "-o a folder": (["opt", "good.gir", "-o", "folder"], "cannot write folder: it is a directory"),
    "-o under a file": (["opt", "good.gir", "-o", "good.py/out.txt"],
                        "cannot write good.py/out.txt: Not a directory"),
    "-o a full disk": (["opt", "good.gir", "-o", "/dev/full"],
                       "cannot write /dev/full: No space left on device"),
    "dot -o a folder": (["opt", "good.gir", "--emit", "dot", "-o", "folder/"],
                        "--emit dot writes .dot or .gv files, but -o names 'folder/'"),
    "unknown cache action": (["cache", "frobnicate"], "argument action: invalid choice"),
    "unknown command": (["frobnicate"], "argument command: invalid choice"),
    # the files it reads
    "missing IR file": (["ir", "missing.gir"], "no such file: missing.gir"),
    "IR file is a folder": (["opt", "folder"], "folder is a directory, not a file"),
    "IR not UTF-8": (["ir", "latin1.gir"], "latin1.gir:2: not UTF-8 text (byte 0xe9 at offset 17)"),
    "IR that does not parse": (["ir", "bad.gir"], "bad.gir: line 3, column 12: "),
    "IR that does not verify": (["ir", "ill_typed.gir"],
                                "ill_typed.gir:3: [types] output types f32[4] but the type rule"),
    "IR that does not verify, to opt": (["opt", "ill_typed.gir"], "ill_typed.gir:3: [types] "),
    # the code the user's file runs: their file:line
    "raises at import": (["compile", "on_import.py:step"],
                         "on_import.py:2: ValueError: boom at import (while running on_import.py)"),
    "raises in make_inputs": (["compile", "in_make_inputs.py:step"],
                              "in_make_inputs.py:3: ZeroDivisionError: integer division or modulo "
                              "by zero (while calling make_inputs() of in_make_inputs.py)"),
    "raises in the step": (["compile", "in_step.py:step"],
                           "in_step.py:5: IndexError: index 5 is out of bounds for axis 0 with "
                           "size 2 (while tracing in_step.py:step)"),
    "raises in a module it imports": (["compile", "uses_helper.py:step"],
                                      "helper.py:2: RuntimeError: from the helper module "
                                      "(while tracing uses_helper.py:step)"),
    "wrong number of inputs": (["compile", "wrong_arity.py:step"],
                               "step(): too many positional arguments"),
    "shapes that do not broadcast": (["compile", "bad_op.py:step"], "bad_op.py:5: "),
    "a step that returns a str": (["compile", "returns_str.py:step"], "a str"),
    # --load: a file of passes
    "--load a missing file": (["opt", "good.gir", "--load", "missing.py"],
                              "--load missing.py: no such file"),
    "--load a folder": (["opt", "good.gir", "--load", "folder"], "--load folder is not a file"),
    "--load a syntax error": (["opt", "good.gir", "--load", "plugin_syntax.py"],
                              "plugin_syntax.py:2: SyntaxError: '(' was never closed (while "
                              "running plugin_syntax.py)"),
    "--load raises at import": (["opt", "good.gir", "--load", "plugin_raises.py"],
                                "plugin_raises.py:2: ValueError: boom in a plugin (while running "
                                "plugin_raises.py)"),
    "--load a taken pass name": (["opt", "good.gir", "--load", "plugin_taken.py"],
                                 "plugin_taken.py:2: the pass name 'cse' is taken, by cse ("),
    "--load (compile)": (["compile", "good.py:step", "--load", "plugin_raises.py"],
                         "plugin_raises.py:2: ValueError: boom in a plugin"),
    "--load, then a pass it does not define": (
        ["opt", "good.gir", "--load", "plugin.py", "--passes", "frobnicate"],
        "unknown pass frobnicate; known passes: bucket, cse, dce, exp_to_sqrt, fold,"),
    # --load-pass: a function of a module as a pass
    "--load-pass without a function": (["opt", "good.gir", "--load-pass", "passes_module"],
                                       "--load-pass 'passes_module': expected MODULE:FUNCTION"),
    "--load-pass a missing module": (["opt", "good.gir", "--load-pass", "nowhere:f"],
                                     "--load-pass nowhere: no module named 'nowhere' on the"),
    "--load-pass a missing function": (
        ["opt", "good.gir", "--load-pass", "passes_module:frobnicate"],
        "--load-pass passes_module has no function frobnicate (it defines negate_exp)"),
    "--load-pass not a function": (["opt", "good.gir", "--load-pass", "passes_module:answer"],
                                   "--load-pass passes_module: answer is not a function (it"),
    "--load-pass a module that raises": (["opt", "good.gir", "--load-pass", "plugin_raises:f"],
                                         "plugin_raises.py:2: ValueError: boom in a plugin"),
    "--load-pass a missing file": (["opt", "good.gir", "--load-pass", "missing.py:f"],
                                   "--load-pass missing.py: no such file"),
    # switches
    "bad switch": (["cache", "path"],
                   "GRAPHOPT_THREADS='1.5' (from the environment): expected a whole number"),
}
ENV = {"bad switch": {"GRAPHOPT_THREADS": "1.5"}}


@pytest.mark.parametrize("case", MISTAKES)
def test_a_mistake_is_one_line_and_status_2(files, capsys, monkeypatch, case):
    argv, says = MISTAKES[case]
    for name, value in ENV.get(case, {}).items():
        monkeypatch.setenv(name, value)
    before = _tree(files)
    status, out, err = _run(capsys, argv)
    assert status == 2, (status, err)
    lines = err.strip().splitlines()
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1 and says in errors[0].split(": error: ", 1)[1], err
    assert "Traceback" not in err and out == "" and "graphopt/cli.py" not in err
    if "usage:" not in err and "parse" not in case:  # (argparse adds the usage; a parse
        assert len(lines) == 1, err                    # error the line and a caret under it)
    assert _tree(files) == before  # nothing written, nothing changed


def test_user_files_that_are_fine_run(files, capsys):
    """good.txt is read as Python source whatever its extension; a dataclass in the file
    works (the file is a module in sys.modules while it runs, as an import makes it)."""
    for target in ("good.txt:step", "dataclass_user.py:step"):
        status, out, err = _run(capsys, ["compile", target])
        assert status == 0 and err == "" and out.startswith("graph step {"), err


def test_load_registers_passes_for_the_command(files, capsys):
    """`--load FILE.py` runs the file before the pipeline: its passes can be named in
    --passes, for opt and compile; loaded twice, the same definition replaces itself; when the
    command is done they are unregistered."""
    from graphopt.passes import PASSES
    before = dict(PASSES)
    for argv in (["opt", "good.gir"], ["compile", "good.py:step"]):
        status, out, err = _run(capsys, [*argv, "--load", "plugin.py", "--load", "plugin.py",
                                         "--passes", "dce,exp_to_sqrt"])
        assert status == 0 and err == "", err
        if argv[0] == "opt":
            assert "%0 = sqrt %x : f32[3]" in out and "exp" not in out
    assert PASSES == before


def test_load_pass_runs_a_function_as_a_pass(files, capsys):
    """`--load-pass MODULE:FUNCTION` (a module in the working directory, or FILE.py) registers
    the function under its name for the command: its counters are in --stats, its diff and
    refusals in --explain, as a built-in's; a function the module registered itself keeps
    its name; afterwards the pass and the module are gone."""
    from graphopt.passes import PASSES
    before, modules = dict(PASSES), set(sys.modules)
    for spec in ("passes_module:negate_exp", "passes_module.py:negate_exp"):
        status, out, err = _run(capsys, ["opt", "good.gir", "--load-pass", spec, "--passes",
                                         "negate_exp", "--stats"])
        assert status == 0 and "%0 = negative %x : f32[3]" in out and "exp" not in out, err
        assert "negate_exp" in err and "negated=1" in err
    status, out, err = _run(capsys, ["opt", "good.gir", "--load-pass",
                                     "passes_module:negate_exp", "--passes", "cse,negate_exp",
                                     "--explain"])
    assert status == 0, err
    assert "=== negate_exp: 1 -> 1 nodes" in out and "-  %0 = exp %x : f32[3]" in out
    assert "+  %0 = negative %x : f32[3]" in out
    assert "--- negate_exp refused 1:\n  the return: left as it is" in out
    status, out, err = _run(capsys, ["opt", "good.gir", "--load-pass", "plugin:exp_to_sqrt",
                                     "--passes", "exp_to_sqrt"])
    assert status == 0 and "%0 = sqrt %x : f32[3]" in out, err
    assert PASSES == before and "passes_module" not in set(sys.modules) - modules


def test_ir_from_stdin_that_is_not_utf8(files, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"graph g {\n\xff\n")))
    status, _, err = _run(capsys, ["ir", "-"])
    assert status == 2 and err == "graphopt: error: <stdin>:2: not UTF-8 text (byte 0xff at " \
                                  "offset 10)\n"


def test_a_bug_in_graphopt_is_one_line_and_status_1(files, capsys, monkeypatch):
    import graphopt.passes

    def broken(*args, **kwargs):
        raise TypeError("unsupported operand\nsecond line")
    monkeypatch.setattr(graphopt.passes, "run", broken)
    status, out, err = _run(capsys, ["opt", "good.gir"])
    assert status == 1 and out == ""
    assert err == ("graphopt: error: internal error, a bug in graphopt: TypeError: unsupported "
                   "operand ... (run again with GRAPHOPT_DEBUG=1 for the traceback to report)\n")
    monkeypatch.setenv("GRAPHOPT_DEBUG", "1")  # the traceback, then the same line
    status, out, err = _run(capsys, ["opt", "good.gir"])
    assert status == 1 and err.startswith("Traceback (most recent call last):")
    assert 'raise TypeError("unsupported operand' in err and err.endswith(
        "for the traceback to report)\n")


def test_graphopt_debug_shows_the_users_traceback_too(files, capsys, monkeypatch):
    monkeypatch.setenv("GRAPHOPT_DEBUG", "1")
    status, _, err = _run(capsys, ["compile", "in_step.py:step"])
    assert status == 2 and err.startswith("Traceback (most recent call last):")
    assert 'in_step.py", line 5, in step' in err  # the user's frame, for a bug report
    assert err.splitlines()[-1] == ("graphopt: error: in_step.py:5: IndexError: index 5 is out "
                                    "of bounds for axis 0 with size 2 (while tracing "
                                    "in_step.py:step)")
    monkeypatch.setenv("GRAPHOPT_DEBUG", "sure")  # itself a mistake: said as one
    status, _, err = _run(capsys, ["cache", "path"])
    assert status == 2 and err.startswith("graphopt: error: GRAPHOPT_DEBUG='sure'")


def test_interrupted(files, capsys):
    status, _, err = _run(capsys, ["compile", "interrupt.py:step"])
    assert status == 130 and err == "graphopt: interrupted\n"


def test_help_documents_exit_status_and_graphopt_debug(capsys):
    status, out, _ = _run(capsys, ["--help"])
    assert status == 0
    assert "GRAPHOPT_DEBUG=1 prints the traceback" in out and "exit status:" in out
    for status_line in ("  0    done", "  2    a mistake", "  1    a bug in graphopt",
                        "  130  interrupted"):
        assert status_line in out


# --------------------------------------------------------------------------- the real command

COMMAND = "import sys; from graphopt.cli import main; sys.exit(main())"


@pytest.mark.parametrize("argv, says", [
    (["compile", "syntax.py:step"], "syntax.py:3: SyntaxError: "),
    (["compile", "latin1.py:step"], "latin1.py:2: not UTF-8 text"),
    (["ir", "latin1.gir"], "latin1.gir:2: not UTF-8 text"),
    (["opt", "good.gir", "--print-after", "("], "--print-after '(' is neither"),
    (["compile", "good.py:w"], "good.py: w is not a function"),
    (["demo", "--steps", "0"], "argument --steps: 0 is not 1 or more"),
], ids=["syntax error", "not UTF-8 (python)", "not UTF-8 (IR)", "--print-after", "not callable",
        "--steps 0"])
def test_the_issues_cases_through_the_command(files, child, argv, says):
    run = child.run(f"import sys; sys.argv[1:] = {argv!r}\n{COMMAND}", timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert says in run.stderr.strip().splitlines()[-1]
    good = child.run(f"import sys; sys.argv[1:] = {['compile', 'good.txt:step']!r}\n{COMMAND}",
                     timeout=60)
    assert good.returncode == 0 and good.stdout.startswith("graph step {"), good.stderr


def test_a_closed_pipe_is_quiet(files, child):
    """`graphopt ... | head -1`: the reader closes the pipe; no BrokenPipeError traceback."""
    script = f"""
        import os, subprocess, sys
        r, w = os.pipe()
        os.close(r)  # the reader is gone before anything is written
        p = subprocess.run([sys.executable, "-c", {COMMAND!r}, "ir", "good.gir"], stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        print(p.returncode, repr(p.stderr))
        """
    run = child.run(script, timeout=90)
    status, err = run.stdout.split(" ", 1)
    assert status == "1" and err.strip() == "''", run.stdout + run.stderr
