"""The explorer's data and page, without a browser (tests/test_explorer_browser.py opens the
page in one): the identity-paired diffs, the nodes with their source lines, the kernels with
their cost and native code, the memory report, the self-contained HTML, and its entry points
(`graphopt explore`, `Executable.explore`, `explain(...).to_html()`)."""
from __future__ import annotations

import io
import json
import linecache
import re

import numpy as np
import pytest

import graphopt as go
from graphopt import ops
from graphopt.cli import main
from graphopt.explorer import data as explorer_data
from graphopt.explorer import gather, render_page
from graphopt.frontend.tracer import trace_function
from graphopt.ir import parse
from graphopt.ir.kernel import cost

# Two identical exp nodes (cse merges them) and one node nobody reads (dce removes it).
MERGE = """graph merge {
  arg %x: f32[8]
  %0 = exp %x : f32[8]
  %1 = exp %x : f32[8]
  %2 = add %0, %1 : f32[8]
  return %2
}"""
DEAD_FIRST = """graph dead_first {
  arg %x: f32[8]
  %0 = exp %x : f32[8]
  %1 = log %x : f32[8]
  %2 = negative %1 : f32[8]
  return %2
}"""
UPDATE = """graph update {
  param @w: f32[64]
  arg %g: f32[64]
  %0 = constant {value=0.1} : f32[]
  %1 = multiply %g, %0 : f32[64]
  %2 = subtract @w, %1 : f32[64]
  %3 = assign @w, %2 : token
  %4 = sum %2 {axes=[0], keepdims=false} : f32[]
  return %4 after(%3)
}"""
# fuse refuses to put the add into the exp's kernel: the matmul between them would be a cycle.
CYCLE = """graph cycle {
  arg %x: f32[4,4]
  %0 = exp %x : f32[4,4]  loc("model.py":3)
  %1 = matmul %0, %0 : f32[4,4]  loc("model.py":4)
  %2 = add %0, %1 : f32[4,4]  loc("model.py":5)
  %3 = multiply %2, %2 : f32[4,4]  loc("model.py":6)
  return %3
}"""


def _removed_and_added(diff: str) -> tuple[set[str], set[str]]:
    """The value names a diff's lines define, on its removed and on its added side."""
    def defined(sign: str) -> set[str]:
        return {m.group(1) for line in diff.splitlines()
                if line.startswith(sign) and not line.startswith(sign * 3)
                for m in [re.match(r"[-+]\s+(%\w+)(?:, %\w+)* = ", line)] if m}
    return defined("-"), defined("+")


def _pass(data: dict, name: str) -> dict:
    return next(p for p in data["passes"] if p["name"] == name)


def test_a_cse_merge_shows_exactly_the_one_node_that_went_away():
    data = gather(parse(MERGE), "cse", draw=False)
    removed, added = _removed_and_added(_pass(data, "cse")["diff"])
    # The add reads the merged value now: its line changes, but it defines no new value.
    assert removed - added == {"%1"}
    assert added <= removed


def test_a_renumbering_shows_no_change():
    data = gather(parse(DEAD_FIRST), "dce", draw=False)
    diff = _pass(data, "dce")["diff"]
    removed, added = _removed_and_added(diff)
    assert removed == {"%0"}  # the dead exp; log and negative keep their names
    assert added == set()
    # (the IR the page shows after the pass keeps those names too: its text and its diff agree)
    assert "%1 = log %x" in data["snapshots"][-1]["ir"]


def test_passes_that_change_nothing_point_at_the_snapshot_before_them():
    data = gather(parse(MERGE), "dce,cse,dce", draw=False)
    dce1, cse, dce2 = data["passes"]
    assert not dce1["changed"] and dce1["snapshot"] == 0 and dce1["diff"] == ""
    assert cse["changed"] and cse["snapshot"] == 1
    assert not dce2["changed"] and dce2["snapshot"] == 1
    assert [s["label"] for s in data["snapshots"]] == ["as traced", "after cse"]


def _step(w, g):
    u = ops.exp(g) * 0.5
    go.assign(w, w - u)
    return ops.sum(w - u)


def _traced():
    w = go.Parameter(np.ones(32, np.float32), name="w")
    return go.jit(_step), w, np.full(32, 0.25, np.float32)


def test_nodes_carry_their_source_line_with_its_code_and_their_neighbours():
    _, w, g = _traced()
    data = gather(trace_function(_step, (w, g), {}).graph, "dce", draw=False)
    traced = data["snapshots"][0]["nodes"]
    exp = next(n for n in traced if n["op"] == "exp")
    (loc,) = [data["locations"][i] for i in exp.get("locs", [])]
    assert loc["file"] == __file__
    assert loc["code"] == linecache.getline(__file__, loc["line"]).strip()
    assert "ops.exp(g)" in loc["code"]
    ids = {n["id"]: n for n in traced}
    assert [ids[i]["name"] for i in exp.get("ins", [])] == ["%g"]
    readers = [n for n in traced if exp["id"] in n.get("ins", [])]
    assert [n["op"] for n in readers] == ["multiply"]
    assign = next(n for n in traced if n["op"] == "assign")
    assert [ids[i]["name"] for i in assign.get("writes", [])] == ["@w"]
    assert ids["return"].get("after") == [assign["id"]]


def test_kernels_show_their_cost_native_code_and_cache_key():
    graph = parse(UPDATE)
    data = gather(graph, "fuse,dce", draw=False)
    result = go.passes.run(graph, "fuse,dce")
    nodes = [n for n in result.graph.nodes if n.body is not None]
    assert len(data["kernels"]) == len(nodes) >= 1
    for k, node in zip(data["kernels"], nodes):
        c = cost(node)
        assert (k["cost"]["bytes_per_element"], k["cost"]["elements"]) == \
            (c.bytes_per_element, c.elements)
        assert k["spaces"] == node.attrs["spaces"]
        assert k["made_by"] == "fuse"
        native = k["native"]
        assert native is not None and k["fallback"] == ""
        assert "define" in native["llvm"] and native["name"] in native["llvm"]
        assert native["asm"].strip()
        assert {"kernel", "flags"} <= set(native["key_parts"])
        assert isinstance(native["hit"], bool) and native["compile_ms"] >= 0
        assert {f["op"] for f in k["fused"]} >= {"multiply", "subtract"}


def test_the_memory_report_follows_the_schedule():
    step, w, g = _traced()
    exe = step.lower(w, g)
    data = gather(exe.traced_graph, exe.passes, program=exe.program, draw=False)
    report = exe.memory_report()
    assert data["memory"]["live"] == report.live_bytes
    assert data["memory"]["peak_bytes"] == report.peak_bytes
    assert len(data["memory"]["labels"]) == len(exe.graph.nodes)


def test_the_value_and_grad_step_marks_what_the_backward_keeps():
    x = go.Parameter(np.linspace(0.5, 2, 16).astype(np.float32), name="x")
    fn = go.value_and_grad(lambda: ops.sum(ops.log(x) * ops.exp(x)), wrt=[x])

    def step():
        loss, (gx,) = fn()
        go.assign(x, x - 0.1 * gx)
        return loss
    data = gather(trace_function(step, (), {}).graph, "dce", draw=False)
    memory = data["memory"]
    assert memory["backward_start"] is not None
    assert memory["kept"] and all(r["defined"] < memory["backward_start"] for r in memory["kept"])


def test_refusals_are_listed_with_their_pass_and_the_kernel_of_their_line():
    data = gather(parse(CYCLE), "fuse", draw=False)
    refusals = _pass(data, "fuse")["refusals"]
    result = go.passes.run(parse(CYCLE), "fuse")
    assert [(r["subject"], r["reason"]) for r in refusals] == \
        [(r.subject, r.reason) for r in result.refusals] != []
    (refusal,) = refusals
    assert [data["locations"][i]["where"] for i in refusal["locs"]] == ["model.py:5"]
    # The kernel that holds line 5 (the add) lists it; the exp's kernel does not.
    by_lines = {tuple(data["locations"][i]["where"] for f in k["fused"] for i in f["locs"]):
                k["refusals"] for k in data["kernels"]}
    assert by_lines == {("model.py:3",): [], ("model.py:5", "model.py:6"): [refusal]}


def test_without_dot_the_page_says_so(monkeypatch):
    monkeypatch.setattr(explorer_data.shutil, "which", lambda name: None)
    data = gather(parse(MERGE), "cse")
    assert "not installed" in data["drawing"]
    assert all(s["svg"] is None and "not installed" in s["svg_note"] for s in data["snapshots"])
    assert data["kernels"] == [] and data["snapshots"][-1]["ir"]


def test_a_graph_too_large_is_not_drawn(monkeypatch):
    monkeypatch.setattr(explorer_data, "MAX_DRAWN", 2)
    monkeypatch.setattr(explorer_data.shutil, "which", lambda name: "/usr/bin/dot")
    data = gather(parse(MERGE), "cse")
    assert data["snapshots"][0]["svg"] is None
    assert "4 inputs and nodes" in data["snapshots"][0]["svg_note"]


def test_drawings_are_svg_whose_node_titles_are_the_node_ids():
    pytest.importorskip("graphviz")
    import shutil
    if shutil.which("dot") is None:
        pytest.skip("graphviz's dot is not installed")
    data = gather(parse(MERGE), "cse")
    snap = data["snapshots"][-1]
    assert snap["svg"].startswith("<svg")
    titles = set(re.findall(r'class="node">\s*<title>([^<]+)</title>', snap["svg"]))
    assert titles == {n["id"] for n in snap["nodes"]}


def _embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.DOTALL)
    return json.loads(m.group(1))


def test_the_page_is_self_contained_and_its_data_reads_back():
    data = gather(parse(MERGE), "cse", draw=False)
    data["title"] = "</script><script>alert(1)</script> {{js}}"
    page = render_page(data)
    assert _embedded(page) == data  # the title's </script> did not end the data early
    assert page.count("</script>") == 2  # the data's and the code's
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "fetch(" not in page and "XMLHttpRequest" not in page
    assert "<title>graphopt explorer: &lt;/script&gt;" in page


def test_explore_gir_on_the_command_line(tmp_path, capsys):
    src = tmp_path / "merge.gir"
    src.write_text(MERGE)
    out = tmp_path / "merge.html"
    assert main(["explore", str(src), "--passes", "cse,dce", "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    data = _embedded(out.read_text())
    assert [p["name"] for p in data["passes"]] == ["cse", "dce"]
    assert data["title"] == str(src)


def test_explore_a_step_file_on_the_command_line(tmp_path):
    src = tmp_path / "step.py"
    src.write_text("import numpy as np\nimport graphopt as go\nfrom graphopt import ops\n\n"
                   "def step(x):\n    return ops.sum(ops.exp(x) * 2.0)\n\n"
                   "def make_inputs():\n    return (np.ones(16, np.float32),)\n")
    out = tmp_path / "step.html"
    assert main(["explore", f"{src}:step", "-o", str(out)]) == 0
    data = _embedded(out.read_text())
    exp = next(n for n in data["snapshots"][0]["nodes"] if n["op"] == "exp")
    assert [data["locations"][i]["code"] for i in exp.get("locs", [])] == \
        ["return ops.sum(ops.exp(x) * 2.0)"]


@pytest.mark.parametrize("text, expected", [
    ("import numpy as np\nraise ValueError('no data here')\n", r"step\.py:2: ValueError: no data here"),
    ("def step(:\n", r"step\.py:1: SyntaxError"),
])
def test_a_step_file_that_fails_to_import_is_an_error_message(tmp_path, capsys, text, expected):
    src = tmp_path / "step.py"
    src.write_text(text)
    assert main(["explore", f"{src}:step", "-o", str(tmp_path / "s.html")]) == 2
    err = capsys.readouterr().err
    assert re.search(expected, err) and "Traceback" not in err
    assert not (tmp_path / "s.html").exists()


def test_explore_refuses_an_output_that_is_not_html(tmp_path, capsys):
    src = tmp_path / "merge.gir"
    src.write_text(MERGE)
    assert main(["explore", str(src), "-o", str(tmp_path / "merge.svg")]) == 2
    assert "name it FILE.html" in capsys.readouterr().err


def test_explain_prints_as_before_and_makes_the_page(tmp_path):
    step, w, g = _traced()
    out = io.StringIO()
    explained = go.explain(step, w, g, out=out)
    assert "=== fuse:" in out.getvalue() and "=== llvm target:" in out.getvalue()
    assert str(explained).startswith("pass ")  # the statistics table, as before
    page = explained.to_html(tmp_path / "explain.html")
    data = _embedded((tmp_path / "explain.html").read_text())
    assert page == (tmp_path / "explain.html").read_text()
    assert [p["name"] for p in data["passes"]] == [s.name for s in explained.stats]
    assert [p["nodes_after"] for p in data["passes"]] == [s.nodes_after for s in explained.stats]


def test_a_compiled_step_explores_itself_with_its_own_kernels(tmp_path):
    step, w, g = _traced()
    exe = step.lower(w, g)
    exe.explore(tmp_path / "step.html")
    data = _embedded((tmp_path / "step.html").read_text())
    assert [k["native"]["key"] for k in data["kernels"]] == [k.key for k in exe.kernels]
    final = {n["id"]: n for n in data["snapshots"][-1]["nodes"]}
    assert [final[k["id"]]["op"] for k in data["kernels"]] == ["kernel"] * len(exe.kernels)


def test_an_interpreted_step_shows_its_kernels_without_native_code():
    w = go.Parameter(np.ones(32, np.float32), name="w")
    exe = go.jit(_step, backend="interpreter").lower(w, np.ones(32, np.float32))
    data = gather(exe.traced_graph, exe.passes, program=exe.program, draw=False)
    assert data["kernels"] and all(k["native"] is None and k["fallback"] for k in data["kernels"])


def test_a_target_this_host_refuses_still_makes_the_page(monkeypatch):
    monkeypatch.setenv("GRAPHOPT_CPU", "no-such-cpu")
    data = gather(parse(UPDATE), "fuse", draw=False)
    assert data["target"].startswith("refused")
    assert data["kernels"] and all(k["native"] is None and "not compiled" in k["fallback"]
                                   for k in data["kernels"])


def test_a_drawing_names_values_as_its_snapshots_text_does():
    import shutil
    if shutil.which("dot") is None:
        pytest.skip("graphviz's dot is not installed: nothing is drawn")
    after = gather(parse(DEAD_FIRST), "dce")["snapshots"][-1]
    assert "%1 = log %x" in after["ir"]
    assert "%1 = log" in after["svg"] and "%0 = log" not in after["svg"]
