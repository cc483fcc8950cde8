"""What the explorer's page shows of a step, gathered as plain data (lists, dicts, strings and
numbers: it is embedded in the page as JSON).

    data = gather(graph, "default")         # the passes run here; the kernels are compiled

holds the pass timeline (each pass's statistics, its diff that pairs values by identity, its
refusals), a snapshot of the graph as traced and after every pass that changed it (IR text,
nodes with their edges and source lines, a drawing), every kernel of the result (body,
iteration spaces, cost, what fused into it, the refusals about its lines, the native code and
its cache key) and the memory report's live bytes along the schedule.

Nodes are named as graphviz names them (`in3`: the graph's fourth input, `n5`: its sixth
node, `return`), so a click on the drawing finds the node's data.
"""
from __future__ import annotations

import linecache
import os
import shutil
from collections.abc import Iterable
from typing import Any

from ..errors import GraphoptError
from ..ir.export import PARAM_FILL, op_color
from ..ir.graph import Graph, Node, Value
from ..ir.kernel import cost, written
from ..ir.liveness import memory_report
from ..ir.printer import Namer, format_attrs, format_graph, format_node, value_names
from ..passes import run
from ..passes.manager import PassStats, PipelineResult, Refusal

# Above this many inputs and nodes (kernel bodies included) a graph is not drawn: `dot` would take
# minutes, and a drawing that size cannot be read (the page says so and shows the rest).
MAX_DRAWN = 500


def gather(graph: Graph, passes: str | Iterable[str] | None = None, *, fastmath: bool = False,
           options: dict[str, Any] | None = None, program: Any = None,
           title: str | None = None, draw: bool = True) -> dict[str, Any]:
    """Run the pipeline on the graph (a copy) and gather what the page shows.

    Args:
        graph: the graph as traced or read (not changed).
        passes: the pipeline, as `passes.run` takes it; None is the default pipeline.
        fastmath: allow rewrites that are only algebraically exact.
        options: settings of particular passes (PassContext.options).
        program: the backend's program for the pipeline's result, when it was compiled already
            (an Executable's): its kernels are shown as compiled then. None compiles the
            result with the LLVM backend now.
        title: the page's title (default: the graph's name).
        draw: draw the graphs with graphviz's `dot` (when it is installed).
    """
    drawing = _Drawing(draw)
    locs = _Locations()
    snapshots = [_snapshot("as traced", graph, locs, drawing)]
    timeline: list[dict[str, Any]] = []
    made_by: dict[int, str] = {}  # a kernel node's serial -> the pass that made it

    def after_pass(g: Graph, s: PassStats, names: dict[Value, str] | None) -> None:
        # (after the first pass, a kernel of the input is a copy: it cannot be told apart)
        made = s.name if timeline or not s.kernels_before else f"the input or {s.name}"
        for n in g.nodes:
            if n.body is not None:
                made_by.setdefault(n.serial, made)
        if s.changed:
            snapshots.append(_snapshot(f"after {s.name}", g, locs, drawing, names))
        timeline.append(_pass(s, len(snapshots) - 1))

    # (verified once, at the end, as jit does: verifying a graph of thousands of nodes after
    # every pass would cost more than the passes)
    result = run(graph, passes, fastmath=fastmath, options=options, diffs=True,
                 after_pass=after_pass, verify="last")
    program_graph, uncompiled = result.graph, "not compiled by this backend"
    if program is None:
        from ..backends.llvm import compile as compile_llvm
        try:
            program = compile_llvm(result.graph, fastmath=fastmath)
        except GraphoptError as e:  # (a CPU this host refuses: the rest is still worth seeing)
            uncompiled = f"not compiled: {e}"
    else:
        program_graph = program.graph
    # the names the pipeline's printings gave (the program's graph: the same values in the
    # same order as the result's, so they carry over by position)
    carried = {b: result.names[a] for a, b in zip(_values(result.graph),
                                                   _values(program_graph)) if a in result.names}
    shown = value_names(program_graph, carried)
    for entry in timeline:
        entry["refusals"] = [_refusal(r, locs) for r in result.refusals
                             if r.pass_name == entry["name"]]
    from ..backends.llvm.target import describe  # (loads llvmlite)
    return {
        "title": title or graph.name,
        "passes": timeline,
        "snapshots": snapshots,
        "locations": locs.table,
        # (the program's graph is the result's, or the same nodes in the same order: an
        # Executable's, from the same passes)
        "kernels": _kernels(result, program, program_graph, shown,
                            [made_by.get(n.serial, "the input") for n in result.graph.nodes], locs,
                            uncompiled),
        "memory": _memory(program_graph, program, shown),
        "target": describe(),
        "drawing": drawing.status,
    }


def _values(graph: Graph) -> list[Value]:
    """A graph's values in the order its text defines them."""
    return [*graph.inputs, *(v for n in graph.nodes for v in n.outputs)]


def _pass(s: PassStats, snapshot: int) -> dict[str, Any]:
    return {"name": s.name, "ms": s.seconds * 1e3, "nodes_before": s.nodes_before,
            "nodes_after": s.nodes_after, "kernels": s.kernels_after,
            "bytes_read": s.bytes_read, "bytes_written": s.bytes_written,
            "changed": s.changed, "counters": {k: v for k, v in s.counters.items() if v},
            "diff": s.diff, "snapshot": snapshot}


def _refusal(r: Refusal, locs: _Locations) -> dict[str, Any]:
    return {"pass": r.pass_name, "subject": r.subject, "reason": r.reason,
            "locs": locs.indices(r.loc)}


class _Locations:
    """The source lines the page cites, each once: file, line and the line's code."""

    def __init__(self) -> None:
        self.table: list[dict[str, Any]] = []
        self._index: dict[tuple[str, int], int] = {}

    def indices(self, loc: Any) -> list[int]:
        """The table entries of a node's location: one line, or several (a location that
        lists more than one, such as a node merged from several lines), or none."""
        if loc is None:
            return []
        parts = loc if isinstance(loc, (list, tuple)) else getattr(loc, "locations", [loc])
        return [self._add(p.file, p.line) for p in parts
                if getattr(p, "file", None) is not None and getattr(p, "line", None)]

    def _add(self, file: str, line: int) -> int:
        key = (file, line)
        if key not in self._index:
            self._index[key] = len(self.table)
            self.table.append({"file": file, "where": f"{os.path.basename(file)}:{line}",
                               "line": line, "code": linecache.getline(file, line).strip()})
        return self._index[key]


class _Drawing:
    """SVG drawings by graphviz's `dot`, when it is installed; `status` says what was drawn."""

    def __init__(self, draw: bool) -> None:
        self.on = draw and shutil.which("dot") is not None
        self.status = "drawn with graphviz's dot" if self.on else (
            "not drawn: graphviz's `dot` program is not installed (apt install graphviz)"
            if draw else "not drawn (drawing was turned off)")

    def svg(self, graph: Graph, size: int,
            names: dict[Value, str] | None = None) -> tuple[str | None, str]:
        """(the SVG or None, why not); `names`: as the snapshot's text names its values."""
        if not self.on:
            return None, self.status
        if size > MAX_DRAWN:
            return None, (f"not drawn: {size} inputs and nodes (with kernel bodies) is more than "
                          f"{MAX_DRAWN}, too many to lay out and read")
        from ..ir.export import render
        try:
            text = render(graph, "svg", by_category=True, names=names).decode("utf-8")
        except GraphoptError as e:
            return None, f"not drawn: {e}"
        return text[text.find("<svg"):], ""  # (without the XML prologue and doctype)


def _size(graph: Graph) -> int:
    """What a drawing of the graph holds: its inputs and nodes, and those of kernel bodies."""
    return len(graph.inputs) + sum(1 + (_size(n.body) if n.body is not None else 0)
                                   for n in graph.nodes)


def _snapshot(label: str, graph: Graph, locs: _Locations, drawing: _Drawing,
              names: dict[Value, str] | None = None) -> dict[str, Any]:
    """The graph at one point of the pipeline: its text, its nodes, its drawing (`names`: the
    names the pipeline's printings give its values, as its diffs show them)."""
    svg, why = drawing.svg(graph, _size(graph), names)
    return {"label": label, "ir": format_graph(graph, locs=True, keep=names),
            "nodes": _nodes(graph, locs, names),
            "svg": svg, "svg_note": why}


def _nodes(graph: Graph, locs: _Locations,
           names: dict[Value, str] | None = None) -> list[dict[str, Any]]:
    """Every input and node of the graph, and its return, with its edges by node id."""
    name = Namer(names)
    ids: dict[Value, str] = {}
    entries: list[dict[str, Any]] = []
    for k, v in enumerate(graph.inputs):
        ids[v] = f"in{k}"
        entries.append(_compact({"id": ids[v], "name": name.define(v), "op": v.kind, "cat": v.kind,
                        "color": PARAM_FILL if v.is_param else "#ffffff",
                        "type": str(v.type), "attrs": "", "line": f"{v.kind} {name(v)}: {v.type}",
                        "locs": [], "ins": [], "after": [], "writes": []}))
    for k, node in enumerate(graph.nodes):
        line = format_node(node, name)  # (defines its results' names)
        for v in node.outputs:
            ids[v] = f"n{k}"
        entries.append(_compact({"id": f"n{k}", "name": ", ".join(name(v) for v in node.outputs),
                        "op": node.op, "cat": node.opdef.category,
                        "color": op_color(node.opdef.category),
                        "type": ", ".join(str(v.type) for v in node.outputs),
                        "attrs": format_attrs(node), "line": line,
                        "locs": _node_locs(node, locs), "ins": _ids(node.inputs, ids),
                        "after": _ids(node.after, ids), "writes": _ids(_writes(node), ids)}))
    entries.append(_compact({"id": "return", "name": "return", "op": "return", "cat": "return",
                    "color": "#ffffff",
                    "type": ", ".join(str(v.type) for v in graph.outputs), "attrs": "",
                    "line": "return", "locs": [], "ins": _ids(graph.outputs, ids),
                    "after": _ids(graph.effects, ids), "writes": []}))
    return entries


def _compact(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry without its empty fields (most nodes have no attributes, after edges or
    writes): the page of a step of thousands of nodes is smaller, and reads a missing field
    as empty."""
    return {k: v for k, v in entry.items() if v != "" and v != []}


def _node_locs(node: Node, locs: _Locations) -> list[int]:
    """A node's source lines; a kernel without a location of its own: its body's, in order."""
    if node.body is None or node.loc is not None:
        return locs.indices(node.loc)
    return sorted(set().union(*(locs.indices(n.loc) for n in node.body.nodes)))


def _ids(values: Iterable[Value], ids: dict[Value, str]) -> list[str]:
    return [ids[v] for v in values if v in ids]


def _writes(node: Node) -> list[Value]:
    """The parameters a node writes: an assign's target, the buffers a kernel stores into."""
    if node.op == "assign" and node.inputs:
        return [node.inputs[0]]
    return written(node) if node.body is not None else []


def _kernels(result: PipelineResult, program: Any, graph: Graph, names: dict[Value, str],
             made_by: list[str], locs: _Locations, uncompiled: str) -> list[dict[str, Any]]:
    """Every kernel node of the result, with its native code when the program compiled it;
    `made_by`: the pass that made each node of the result; `uncompiled`: why a kernel the
    program did not compile (nor fall back on) has no native code."""
    native = {id(k.node): k for k in getattr(program, "kernels", ())}
    fallbacks = {id(f.node): f.reason for f in getattr(program, "fallbacks", ())}
    refusals = [(set(locs.indices(r.loc)), r) for r in result.refusals]
    entries = []
    for k, node in enumerate(graph.nodes):
        if node.body is None:
            continue
        c = cost(node)
        lines = set(_node_locs(node, locs))
        entry = {
            "id": f"n{k}", "text": _kernel_text(node, names),
            "spaces": node.attrs.get("spaces", []), "outputs": node.attrs.get("outputs", []),
            "cost": {"read_per_element": c.read_per_element,
                     "write_per_element": c.write_per_element,
                     "bytes_per_element": c.bytes_per_element, "elements": c.elements,
                     "fixed_bytes": c.fixed_bytes, "total_bytes": c.total_bytes,
                     "summary": str(c)},
            "made_by": made_by[k],
            "fused": [{"op": n.op, "locs": locs.indices(n.loc)} for n in node.body.nodes
                      if n.op != "store"],
            "refusals": [_refusal(r, locs) for at, r in refusals if at & lines],
            "native": _native(native[id(node)]) if id(node) in native else None,
            "fallback": fallbacks.get(id(node), "" if id(node) in native else uncompiled),
        }
        entries.append(entry)
    return entries


def _kernel_text(node: Node, names: dict[Value, str]) -> str:
    """The kernel as the printed graph shows it, header and body (`names`: the graph's)."""
    header = format_node(node, Namer(keep=names), locs=True)
    body = format_graph(node.body, locs=True).splitlines()[1:-1]
    return "\n".join([header + " {", *body, "}"])


def _native(k: Any) -> dict[str, Any]:
    """A compiled kernel: its function, cache key and parts, compile time, LLVM IR and asm."""
    return {"name": k.name, "key": k.key, "hit": k.cache_hit,
            "compile_ms": k.compile_seconds * 1e3,
            "key_parts": dict(k.key_parts),
            "llvm": k.optimized(), "asm": k.asm()}


def _memory(graph: Graph, program: Any, names: dict[Value, str]) -> dict[str, Any]:
    """The liveness report of the graph that runs: bytes live at each node of the schedule."""
    report = memory_report(graph, getattr(program, "copy_reasons", ()),
                           getattr(program, "plan", None))
    labels = [", ".join(names[v] for v in n.outputs) or n.op for n in graph.nodes]
    return {"live": report.live_bytes, "labels": labels, "input_bytes": report.input_bytes,
            "peak_node": report.peak_node, "peak_bytes": report.peak_bytes,
            "backward_start": report.backward_start,
            "kept": [{"name": r.name, "defined": r.defined, "last_use": r.last_use,
                      "bytes": r.nbytes} for r in report.kept],
            "kept_bytes": report.kept_bytes, "text": str(report)}
