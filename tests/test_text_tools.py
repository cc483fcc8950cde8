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


def test_the_llvm_listing_names_each_kernel_node_and_its_lines_and_the_target_once():
    """Each function's header says which `%N = kernel` of the graph it is and the source
    lines fused into it; the CPU's feature string is shown once, at the top, and not in the
    printed form of Executable.kernels; a listing with nothing compiled says so."""
    import inspect

    import numpy as np

    import graphopt as go
    from graphopt import ops
    w = go.Parameter(np.ones(8, np.float32), name="w")
    first = inspect.currentframe().f_lineno + 3

    def step(g, x):
        u = w - 0.1 * g
        go.assign(w, u * 0.5)
        return ops.matmul(x, x).sum() * 2.0

    exe = go.jit(step, cache=False).lower(np.ones(8, np.float32), np.ones((3, 3), np.float32))
    names = value_names(exe.graph)
    text = exe.llvm_ir()
    features = exe.kernels[0].target.features
    assert text.startswith("; target ") and text.count(features) == 1 and features
    headers = [line for line in text.splitlines() if re.match(r"; \S+ = kernel", line)]
    assert len(headers) == len(exe.kernels) >= 2
    for k in exe.kernels:
        value = f"{names[k.node.outputs[0]]} = kernel"
        start = f"; {value} from {k.lines}:" if k.lines else f"; {value}:"
        assert any(h.startswith(start) and k.name in h for h in headers), (start, headers)
        assert features not in repr(k)
    lines = {k.lines for k in exe.kernels}
    assert f"test_text_tools.py:{first}-{first + 1}" in lines  # the update: u, then assign
    # (a full sum's kernel has no body node to carry its line: "")
    assert lines <= {f"test_text_tools.py:{first}-{first + 1}",
                     f"test_text_tools.py:{first + 2}", ""}
    # LLVM values are named after the body values they compute: %x0 -> x0, %2 -> v2
    update = next(k for k in exe.kernels if k.lines.endswith(f"{first}-{first + 1}"))
    raw = update.ir_text
    body = value_names(update.node.body)
    computed = [f'%"v{body[n.out][1:]}" = {op}' for n, op in
                zip((n for n in update.node.body.nodes if n.op in ("multiply", "subtract")),
                    ("fmul float", "fsub float", "fmul float"))]
    assert computed and all(c in raw for c in computed), (computed, raw)
    assert '%"x0" = load float' in raw
    none = go.jit(lambda x: ops.matmul(x, x), cache=False).lower(np.ones((2, 2), np.float32))
    assert none.llvm_ir().startswith("; nothing compiled")


LOCS = """graph g {
  arg %x: f32[4]
  %0 = exp %x : f32[4]  loc("a.py":3)
  %1 = exp %x : f32[4]  loc("b.py":7)
  %2 = negative %x : f32[4]  loc("a.py":4)
  %3 = negative %x : f32[4]
  %4 = add %0, %1 : f32[4]  loc(grad "a.py":5)
  %5 = add %2, %3 : f32[4]  loc("a.py":5, "a.py":9)
  return %4, %5
}"""


def test_locations_of_several_lines_and_of_gradients_round_trip():
    """`loc("a.py":5, "a.py":9)` (a node standing for several lines) and `loc(grad "a.py":5)`
    (a backward node: the gradient of line 5) print as they are read."""
    from graphopt.ir.graph import GradLocation, Location
    g = parse(LOCS)
    assert g.format(locs=True).split("\n", 1)[1] == LOCS.split("\n", 1)[1]
    assert g.nodes[4].loc == GradLocation("a.py", 5) and g.nodes[4].loc.phase == "backward"
    assert g.nodes[5].loc == Location("a.py", 5, (("a.py", 9),))
    assert g.nodes[5].loc.full() == "a.py:5"


def test_a_cse_merge_carries_every_line_or_none():
    from graphopt import passes
    g = passes.run(parse(LOCS), "cse").graph
    exp, neg = (n for n in g.nodes if n.op in ("exp", "negative"))
    assert str(exp.loc) == 'loc("a.py":3, "b.py":7)'  # both lines it stands for
    assert neg.loc is None  # one of the two had no location: not only the other's


def test_backward_nodes_say_which_line_they_are_the_gradient_of():
    import inspect

    import numpy as np

    import graphopt as go
    w = go.Parameter(np.ones(4, np.float32), name="w")
    line = inspect.currentframe().f_lineno + 3

    def loss(x):
        return (go.ops.exp(w * x)).sum()

    text = go.trace(lambda x: go.value_and_grad(loss)(x), np.ones(4, np.float32)).format(
        locs=True)
    assert f'loc(grad "test_text_tools.py":{line})' in text
    assert f'loc("test_text_tools.py":{line})' in text  # the forward nodes
    assert parse(text).format(locs=True) == text


def test_a_kernel_header_names_the_lines_fused_into_it():
    import inspect

    import numpy as np

    import graphopt as go
    w = go.Parameter(np.ones(8, np.float32), name="w")
    first = inspect.currentframe().f_lineno + 3

    def step(g):
        u = go.ops.exp(g) * 0.5
        go.assign(w, w - u)
        return go.ops.sum(w)

    graph = go.jit(step, backend="interpreter").lower(np.ones(8, np.float32)).graph
    text = graph.format(locs=True)
    headers = [line for line in text.splitlines() if "= kernel" in line]
    assert len(headers) == 1, headers  # the update and the sum: one kernel
    assert headers[0].endswith(f"; from test_text_tools.py:{first}-{first + 1}"), headers
    assert "from " not in graph.format()  # (only a printing with locations names lines)
    assert parse(text).format(locs=True) == text  # the comment is not a location
