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
