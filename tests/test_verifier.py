"""The verifier against hand-written IR files: each bad_*.ir breaks one rule (named in its
`# EXPECT:` line), each ok_*.ir breaks none."""
import re
from pathlib import Path

import pytest

from graphopt.errors import VerifyError
from graphopt.ir import parse
from graphopt.ir.verifier import verify

FILES = sorted((Path(__file__).parent / "ir" / "verify").glob("*.ir"))
RULES = {"types", "known-op", "attr-kind", "size", "acyclic", "defined-before-use",
         "assign-target", "one-assign", "write-after-read", "unique-names"}


def expectation(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# EXPECT: "), path
    return first.removeprefix("# EXPECT: ").strip()


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_verifier_file(path):
    graph = parse(path.read_text())
    expected = expectation(path)
    if expected == "ok":
        graph.verify()
        return
    with pytest.raises(VerifyError) as info:
        graph.verify()
    assert info.value.rule == expected, str(info.value)
    assert f"[{expected}]" in str(info.value)


def test_every_rule_has_a_breaking_file():
    covered = {expectation(p) for p in FILES}
    assert RULES <= covered, RULES - covered


def test_error_names_the_node():
    graph = parse((Path(__file__).parent / "ir" / "verify" / "bad_write_after_read.ir")
                  .read_text())
    with pytest.raises(VerifyError) as info:
        graph.verify()
    assert "%1 = sum @w" in str(info.value) and "@w" in str(info.value)
    assert info.value.node is graph.nodes[1]


@pytest.mark.parametrize("path", [p for p in FILES if p.name.startswith("bad_")],
                         ids=lambda p: p.name)
def test_every_error_in_a_file_gives_the_line_of_what_breaks_the_rule(path, capsys):
    """`graphopt ir FILE` reports every rule's violation at a line of FILE: the offending
    node's, a graph input's, or the return's; the line is the one that names it."""
    from graphopt.cli import main
    assert main(["ir", str(path)]) == 2
    err = capsys.readouterr().err
    m = re.match(rf"graphopt: error: {re.escape(str(path))}:(\d+): \[", err)
    assert m, err
    line = path.read_text().splitlines()[int(m.group(1)) - 1]
    assert re.match(r"\s*(%|param|arg|return)", line), (line, err)


@pytest.mark.parametrize("name, says", [
    ("bad_write_after_read.ir", ("this node reads @w, which `%2 = assign @w, %0 : token` "
                                 "(line 9) writes, but is not ordered before that writer (add "
                                 "the reader's result to the writer's after(...)) in `%1 = sum")),
    ("bad_one_assign.ir", ("@w is written more than once, first by `%1 = assign @w, %0 : "
                           "token` (line 5), in `%3 = assign @w, %2 after(%1) : token` (line 7)")),
    ("bad_use_before_def.ir", ("an operand is defined only later, by `%1 = exp %x : f32[3]` "
                               "(line 6), in `%0 = add %x, %1 : f32[3]` (line 5)")),
    ("bad_cycle.ir", "by its operand from `%1 = exp %0 : f32[3]` (line 5)"),
])
def test_an_error_names_the_writer_and_the_reader_with_their_lines(name, says):
    """With the lines parse recorded, the message names both nodes involved, each with its
    line; without them (a graph built in code) it names them alike, with no lines."""
    lines: dict = {}
    graph = parse((Path(__file__).parent / "ir" / "verify" / name).read_text(), lines=lines)
    with pytest.raises(VerifyError) as info:
        verify(graph, lines)
    assert says in str(info.value) and info.value.node in lines
    with pytest.raises(VerifyError) as info:
        graph.verify()
    assert re.sub(r" \(line \d+\)", "", says) in str(info.value)
