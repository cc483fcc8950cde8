"""The .gir test runner itself: it passes what should pass, and when a check fails its message
names the directive and its line, the RUN line, and the output where matching stopped."""
from __future__ import annotations

import pytest

from girtest import GirFailure, excerpt, parse_run_lines, run_file

GRAPH = """\
graph g {
  arg %x: f32[4]
  %0 = multiply %x, %x : f32[4]
  %1 = multiply %x, %x : f32[4]
  %2 = add %0, %1 : f32[4]
  return %2
}
"""


def write(tmp_path, text, name="case.gir"):
    path = tmp_path / name
    path.write_text(text)
    return path


def failure(path) -> str:
    with pytest.raises(GirFailure) as info:
        run_file(path)
    return str(info.value)


def test_passing_file_with_captures_and_regex(tmp_path):
    run_file(write(tmp_path, "# cse merges the two squares.\n# RUN: graphopt opt %s --passes cse\n"
                   + GRAPH + """\
# CHECK:      %[[SQ:[0-9]+]] = multiply %x, %x : f32[4]
# CHECK-NEXT: %{{[0-9]+}} = add %[[SQ]], %[[SQ]] : f32[4]
# CHECK-NOT:  multiply
# CHECK:      return
"""))


def test_check_next_failure_names_line_directive_and_output(tmp_path):
    path = write(tmp_path, "# A check that must fail.\n# RUN: graphopt opt %s --passes cse\n"
                 + GRAPH + """\
# CHECK:      %[[SQ:[0-9]+]] = multiply %x, %x
# CHECK-NEXT: return %[[SQ]]
""")
    message = failure(path)
    assert f"{path}:11: # CHECK-NEXT: return %[[SQ]]" in message
    assert "RUN (line 2): graphopt opt %s --passes cse" in message
    assert "variables: SQ='0'" in message
    assert ">    4 |   %1 = add %0, %0 : f32[4]" in message  # the line after the last match


def test_check_not_failure_points_at_the_excluded_text(tmp_path):
    path = write(tmp_path, "# A check that must fail.\n# RUN: graphopt opt %s --passes dce\n"
                 + GRAPH + "# CHECK-LABEL: graph g\n# CHECK-NOT: multiply\n# CHECK: return\n")
    message = failure(path)
    assert f"{path}:11: # CHECK-NOT: multiply" in message
    assert "excluded string found" in message
    assert ">    3 |   %0 = multiply %x, %x : f32[4]" in message


def test_several_runs_with_prefixes_and_expected_failure(tmp_path):
    run_file(write(tmp_path, """\
# Two RUN lines, one with its own prefix; the second expects an error on stderr.
# RUN: graphopt opt %s --passes dce | filecheck %s --check-prefix=DCE
# RUN: not graphopt opt %s --passes dce,nosuchpass 2>&1 | filecheck %s --check-prefix=ERR
""" + GRAPH + """\
# DCE: %2 = add %0, %1
# ERR: unknown pass nosuchpass; known passes: {{.*}}cse{{.*}}dce
"""))


def test_exit_code_is_checked(tmp_path):
    message = failure(write(tmp_path, "# Fails: an unknown pass.\n"
                            "# RUN: graphopt opt %s --passes nosuchpass\n" + GRAPH
                            + "# CHECK: graph\n"))
    assert "expected graphopt to succeed, exit code 2" in message
    assert "unknown pass nosuchpass" in message


@pytest.mark.parametrize("text, complaint", [
    ("# no run line\n" + GRAPH + "# CHECK: graph\n", "no `# RUN: graphopt ...` line"),
    ("# misspelt\n# RUN: graphopt opt %s\n" + GRAPH + "# CHEK: graph\n", "unknown directive"),
    ("# bad suffix\n# RUN: graphopt opt %s\n" + GRAPH + "# CHECK-NXT: graph\n",
     "unknown directive"),
    ("# RUN: graphopt opt %s\n" + GRAPH + "# CHECK: graph\n", "begin with a comment"),
    ("# unused prefix\n# RUN: graphopt opt %s | filecheck %s --check-prefix=FOO\n" + GRAPH
     + "# CHECK: graph\n", "unknown directive"),
    ("# not graphopt\n# RUN: python -c 1\n" + GRAPH, "a RUN line runs `graphopt ...`"),
])
def test_mistakes_in_test_files_are_reported(tmp_path, text, complaint):
    assert complaint in failure(write(tmp_path, text))


def test_run_line_parsing(tmp_path):
    path = tmp_path / "x.gir"
    (run,) = parse_run_lines("# RUN: graphopt opt %s --passes fuse --explain | "
                             "filecheck %s --check-prefixes=A,B\n", path)
    assert run.argv == ["opt", str(path), "--passes", "fuse", "--explain"]
    assert run.prefixes == ["A", "B"] and not run.expect_fail


def test_excerpt_marks_the_line_and_cuts_long_output():
    output = "".join(f"line {i}\n" for i in range(1, 101))
    text = excerpt(output, output.index("line 50"), "matching stopped")
    assert ">   50 | line 50" in text and "line 37" not in text and "line 38" in text
    assert text.startswith("output near where matching stopped (line 50 of 100):")


def test_check_count(tmp_path):
    run_file(write(tmp_path, "# dce keeps both squares.\n# RUN: graphopt opt %s --passes dce\n"
                   + GRAPH + "# CHECK-COUNT-2: = multiply %x, %x\n# CHECK-NOT: multiply\n"
                   "# CHECK: return\n"))


def test_a_crash_names_the_run_line(tmp_path, monkeypatch):
    import graphopt.cli

    def crash(argv):
        raise AssertionError("boom")
    monkeypatch.setattr(graphopt.cli, "main", crash)
    message = failure(write(tmp_path, "# Crashes.\n# RUN: graphopt opt %s\n" + GRAPH
                            + "# CHECK: graph\n"))
    assert "case.gir:2: RUN (line 2): graphopt opt %s\ngraphopt crashed:" in message
    assert "AssertionError: boom" in message
