"""The verifier against hand-written IR files: each bad_*.ir breaks one rule (named in its
`# EXPECT:` line), each ok_*.ir breaks none."""
from pathlib import Path

import pytest

from graphopt.errors import VerifyError
from graphopt.ir import parse

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
