"""The text tools: what a node, a pass's printing and its diff say about the IR."""
import re

from graphopt.ir import parse
from graphopt.ir.printer import value_names

GRAPH = """\
graph g {
  param @w: f32[4]
  arg %x: f32[4]
  %0 = multiply @w, %x : f32[4]  loc("a.py":3)
  %1 = add %0, %x : f32[4]
  %2 = assign @w, %1 : token
  return after(%2)
}"""


def test_str_of_a_node_is_its_line():
    """str(node) is the printer's line for it, with its location; a value that is not a graph
    input is `%v<serial>`: with those names put back as the whole graph's printing names
    them, the lines are the graph's lines."""
    g = parse(GRAPH)
    names = {v.serial: name for v, name in value_names(g).items()}
    lines = [re.sub(r"%v(\d+)", lambda m: names[int(m.group(1))], str(n)) for n in g.nodes]
    assert lines == [line.strip() for line in g.format(locs=True).splitlines()[3:-2]]
    assert str(g.nodes[0]).startswith(f"%v{g.nodes[0].out.serial} = multiply @w, %x")


def test_printings_after_passes_pair_values_by_identity():
    """print_after_change: a cse merge of one node in a long chain differs from the input's
    printing by that node and its reader only, never by a renumbering of later values; a
    plain run names nothing (no names kept, nothing recorded)."""
    import difflib
    import io

    from graphopt import passes
    chain = "\n".join(f"  %{i + 2} = exp %{i + 1} : f32[4]" for i in range(30))
    g = parse(f"""graph g {{
  arg %x: f32[4]
  %0 = negative %x : f32[4]
  %1 = negative %x : f32[4]
{chain}
  %32 = add %31, %0 : f32[4]
  return %32
}}""")
    out = io.StringIO()
    result = passes.run(g, "cse", print_after_change=True, out=out)
    printed = out.getvalue().split("***\n", 1)[1].strip()
    before, after = g.format(locs=True).splitlines(), printed.splitlines()
    changes = [line for line in difflib.ndiff(before[1:], after[1:]) if line[:1] in "+-"]
    assert changes == ["-   %1 = negative %x : f32[4]", "-   %2 = exp %1 : f32[4]",
                       "+   %2 = exp %0 : f32[4]"]
    # the header's total: one f32[4] negative (16 B read, 16 B written) less
    assert before[0] == "graph g {  # bytes per run: 1.07 kB (read 544 B, written 528 B)"
    assert after[0] == "graph g {  # bytes per run: 1.04 kB (read 528 B, written 512 B)"
    assert result.format() == printed
    assert passes.run(g, "cse").names == {}
