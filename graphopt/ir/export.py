"""Pictures and data of a graph: graphviz DOT, a networkx MultiDiGraph, and `dump` to a file.

Both exports name values exactly as the text form does (`printer.Namer`: `@w`, `%g`, `%0`...),
so a node in a picture or a key in networkx can be found in `print(graph)` and back.

Drawing conventions (DOT):
  - parameters are yellow cylinders `@name`, arguments plain ellipses `%name`;
  - each node is a box coloured by its op (a fixed palette indexed by crc32 of the op name,
    so colours are the same across runs and machines), or by its op's category
    (`to_dot(graph, by_category=True)`: the explorer's drawings);
  - data edges are solid; `after` edges and the return's effect edges are dashed, since they
    carry an order and no data;
  - an `assign` is a bold red box with a dashed red "writes" edge back to its parameter (a
    kernel that stores gets the same edges to the parameters it updates in place);
  - a collective (all_reduce, all_gather, ..., shard) is a bold dark-blue hexagon filled in
    light blue (COLLECTIVE_STYLE), whatever its op, so the exchanges between ranks stand out;
    the after edges that chain them in order are dashed like any;
  - a node with a `body` region (a kernel) is a cluster holding the body's nodes.
"""
from __future__ import annotations

import shutil
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import GraphoptError, RenderError
from .kernel import written
from .printer import Namer, format_attrs
from .registry import COLLECTIVE, REGISTRY

if TYPE_CHECKING:
    import graphviz
    import networkx as nx

    from .graph import Graph, Node, Value

# Pastel fills that keep black text readable; indexed by crc32(op) so colours are stable.
# No reds: red is kept for effects (assign, "writes", the return's effect edges).
PALETTE = ("#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6", "#ffff99", "#8dd3c7", "#bebada",
           "#e5d8bd", "#80b1d3", "#fccde5", "#d9d9d9", "#ccebc5")
MAX_LABEL = 40      # longer labels are cut, so one big constant cannot stretch the drawing
MAX_EDGE_LABEL = 16  # edge labels (types) longer than this are left off
NL = "\\n"  # DOT's own line break, so each graphviz node stays on one line of the source
RENDER_FORMATS = ("svg", "png", "pdf")
# Collectives: a shape no other node has, and a blue the palette does not use.
COLLECTIVE_STYLE = dict(shape="hexagon", style="filled,bold", fillcolor="#c6dbef",
                        color="#08519c", penwidth="2")
TEXT_FORMATS = ("gir", "txt", "dot", "gv")
PARAM_FILL = "#fff2a8"  # parameters' cylinders


def op_color(op: str) -> str:
    """The fill colour of an op: deterministic (crc32, not Python's salted hash())."""
    return PALETTE[zlib.crc32(op.encode()) % len(PALETTE)]


def _cut(text: str, limit: int = MAX_LABEL) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- graphviz ---------------------------------------------------------------------------------
def to_dot(graph: Graph, by_category: bool = False,
           names: dict[Value, str] | None = None) -> graphviz.Digraph:
    """A graphviz drawing of the graph (`names`: names values keep, as `format_graph` takes
    them, so a drawing matches a printing that kept them). Parameters are yellow cylinders, arguments
    ellipses, nodes boxes coloured by op (by its category with `by_category`); data edges
    are solid, ordering edges dashed; an assign (or a kernel that stores) is a bold red box
    with a dashed red edge to its parameter; a collective is a blue hexagon; a kernel is a
    cluster of its body's nodes."""
    import graphviz  # imported when drawing: `import graphopt` stays quick
    dot = graphviz.Digraph(name=graph.name)
    dot.attr(label=f"graph {graph.name}", labelloc="t", fontname="Helvetica")
    dot.attr("node", fontname="Helvetica", fontsize="11")
    dot.attr("edge", fontname="Helvetica", fontsize="9", labeldistance="1.8")
    _draw_region(dot, graph, prefix="", top=True, by_category=by_category, names=names)
    return dot


def _draw_region(dot: graphviz.Digraph, graph: Graph, prefix: str, top: bool,
                 by_category: bool, names: dict[Value, str] | None = None) -> None:
    """Draw inputs, nodes and return of `graph` into `dot`; ids start with `prefix` so that
    nested regions (kernel bodies) never clash with the graph around them."""
    region = _Region(dot, prefix, by_category, names)
    for k, v in enumerate(graph.inputs):
        region.input(k, v)
    for k, node in enumerate(graph.nodes):
        region.node(f"{prefix}n{k}", node)
    region.ret(graph, top)


class _Region:
    """One region being drawn: its names (as when printed alone) and the graphviz node that
    defines each value."""

    def __init__(self, dot: graphviz.Digraph, prefix: str, by_category: bool = False,
                 names: dict[Value, str] | None = None):
        self.dot, self.prefix, self.by_category = dot, prefix, by_category
        self.name = Namer(names)
        self.ids: dict[Value, str] = {}

    def source(self, v: Value) -> str:
        if v not in self.ids:  # used but never defined: a broken graph; show it, do not fail
            self.ids[v] = f"{self.prefix}undef{len(self.ids)}"
            self.dot.node(self.ids[v], f"{self.name(v)} (undefined)", color="red",
                          fontcolor="red")
        return self.ids[v]

    def edge(self, v: Value, dst: str, dashed: bool = False, **attrs: str) -> None:
        label = str(v.type)
        if not dashed and len(label) <= MAX_EDGE_LABEL:
            attrs.setdefault("label", label)
        if dashed:
            attrs.update(style="dashed", color=attrs.get("color", "gray40"))
        self.dot.edge(self.source(v), dst, **attrs)

    def input(self, k: int, v: Value) -> None:
        self.ids[v] = f"{self.prefix}in{k}"
        label = f"{self.name.define(v)}{NL}{v.type}"
        if v.is_param:
            self.dot.node(self.ids[v], label, shape="cylinder", style="filled",
                          fillcolor=PARAM_FILL)
        else:
            self.dot.node(self.ids[v], label, shape="ellipse")

    def node(self, nid: str, node: Node) -> None:
        """The node's box (a kernel's: a cluster holding its body), then its edges."""
        results = ", ".join(self.name.define(v) for v in node.outputs)
        tooltip = node.loc.full() if node.loc is not None else node.op
        if node.op == "assign" and node.inputs:
            label = f"{results} = assign {self.name(node.inputs[0])}"
            self.dot.node(nid, _cut(label), shape="box", style="bold", color="red",
                          fontcolor="red", penwidth="2", tooltip=tooltip)
        else:
            types = ", ".join(str(v.type) for v in node.outputs)
            label = _cut(f"{results} = {node.op}" if results else node.op)
            extra = format_attrs(node)
            label += (NL + _cut(extra) if extra else "") + NL + _cut(types)
            op = REGISTRY.get(node.op)  # (a broken graph may name an unknown op: draw it)
            fill = op_color(op.category if self.by_category and op is not None else node.op)
            style = dict(shape="box", style="filled,rounded", fillcolor=fill, tooltip=tooltip)
            if op is not None and op.category == COLLECTIVE:
                style.update(COLLECTIVE_STYLE)
            if node.body is not None:
                # The node's own box sits at the top of a cluster that holds its body.
                with self.dot.subgraph(name=f"cluster_{nid}") as sub:
                    sub.attr(label=f"{node.op} {results}", style="rounded,dashed")
                    sub.node(nid, label, **style)
                    _draw_region(sub, node.body, prefix=f"{nid}_", top=False,
                                 by_category=self.by_category)
                    for b in range(len(node.body.inputs)):  # keep the node's box on top
                        sub.edge(nid, f"{nid}_in{b}", style="invis")
            else:
                self.dot.node(nid, label, **style)
        for v in node.outputs:
            self.ids[v] = nid
        self.uses(nid, node)

    def uses(self, nid: str, node: Node) -> None:
        """Edges from its operands (numbered where order matters: subtract @w, %1), its after
        edges, and to the parameters it writes."""
        for i, v in enumerate(node.inputs):
            self.edge(v, nid, **({"headlabel": str(i)} if len(node.inputs) > 1 else {}))
        for v in node.after:
            self.edge(v, nid, dashed=True, arrowhead="onormal")
        targets = [node.inputs[0]] if node.op == "assign" and node.inputs else \
            (written(node) if node.body is not None else [])
        for target in targets:
            if target.is_param:
                # constraint=false: the update points back up without pulling the layout.
                self.dot.edge(nid, self.source(target), label="writes", style="dashed",
                              color="red", fontcolor="red", constraint="false")

    def ret(self, graph: Graph, top: bool) -> None:
        ret = f"{self.prefix}return"
        if top:  # pin the return to the bottom (rank=sink is only honoured at the top level)
            with self.dot.subgraph() as bottom:
                bottom.attr(rank="sink")
                bottom.node(ret, "return", shape="doubleoctagon")
        else:
            self.dot.node(ret, "return", shape="octagon")
        for v in graph.outputs:
            self.edge(v, ret)
        for v in graph.effects:
            self.edge(v, ret, dashed=True, color="red")


# -- networkx ---------------------------------------------------------------------------------
def to_networkx(graph: Graph) -> nx.MultiDiGraph:
    """The graph as a networkx MultiDiGraph, keyed by printer names ("@w", "%g", "%3", "return").

    Node attributes: op ("param"/"arg" for inputs, "return" for the return), label (the
    printed names of its results), type (its result types as text), loc ("file:line" or None),
    and, for a node with a region, body (that region as its own MultiDiGraph).
    Edge attributes: kind ("data", "after" or "effect"), type, value (the printed name of the
    value carried, which tells the outputs of a multi-output node apart), and index (the
    position among the user's operands: data inputs, then after edges, as Node.operands()).
    """
    import networkx as nx  # imported when used: `import graphopt` stays quick
    g = nx.MultiDiGraph(name=graph.name)
    name = Namer()
    key: dict[Value, str] = {}  # value -> key of the nx node that defines it

    for v in graph.inputs:
        key[v] = name.define(v)
        g.add_node(key[v], op=v.kind, label=key[v], type=str(v.type), loc=None)
    for k, node in enumerate(graph.nodes):
        names = [name.define(v) for v in node.outputs]
        nkey = names[0] if names else f"{node.op}#{k}"  # an output-less node still needs a key
        attrs = dict(op=node.op, label=", ".join(names) or nkey,
                     type=", ".join(str(v.type) for v in node.outputs),
                     loc=node.loc.full() if node.loc is not None else None)
        if node.body is not None:
            attrs["body"] = to_networkx(node.body)
        g.add_node(nkey, **attrs)
        key.update((v, nkey) for v in node.outputs)
        _add_edges(g, key, name, nkey, node.inputs, node.after)
    g.add_node("return", op="return", label="return", loc=None,
               type=", ".join(str(v.type) for v in graph.outputs))
    _add_edges(g, key, name, "return", graph.outputs, graph.effects)
    return g


def _add_edges(g: nx.MultiDiGraph, key: dict[Value, str], name: Namer, dst: str,
               data: list[Value], order: list[Value]) -> None:
    kind_after = "effect" if dst == "return" else "after"
    for i, v in enumerate(data + order):
        src = key.get(v) or name(v)  # an undefined value (broken graph) becomes its own node
        g.add_edge(src, dst, kind="data" if i < len(data) else kind_after,
                   type=str(v.type), value=name(v), index=i)


# -- files --------------------------------------------------------------------------------------
INSTALL_HINT = ("install Graphviz: `apt install graphviz` (Debian/Ubuntu), "
                "`brew install graphviz` (macOS) or `conda install graphviz`; "
                "dumping to .dot or .txt works without it")


def dump(graph: Graph, path: str | Path) -> Path:
    """Write the graph to `path`, in the format its extension names; return the path.

    .gir/.txt: the text form with source locations (it parses back); .dot/.gv: DOT source; .svg/.png/.pdf: a
    drawing made by the Graphviz `dot` program (exactly this one file is written).
    """
    path = Path(path)
    ext = path.suffix.lower().lstrip(".")
    if ext in ("gir", "txt"):
        path.write_text(graph.format(locs=True) + "\n", encoding="utf-8")
    elif ext in ("dot", "gv"):
        path.write_text(to_dot(graph).source, encoding="utf-8")
    elif ext in RENDER_FORMATS:
        path.write_bytes(render(graph, ext))
    else:
        supported = ", ".join("." + e for e in TEXT_FORMATS + RENDER_FORMATS)
        raise GraphoptError(f"cannot dump a graph to '{path.name}': unknown extension "
                            f"'{path.suffix}'; supported: {supported}")
    return path


def render(graph: Graph, fmt: str, by_category: bool = False,
           names: dict[Value, str] | None = None) -> bytes:
    """The drawing of the graph in one of RENDER_FORMATS, made by the Graphviz `dot` program
    (a RenderError says how to install it when it is missing); `by_category`, `names`: as
    `to_dot`."""
    return _render(to_dot(graph, by_category, names), fmt)


def _render(dot: graphviz.Digraph, fmt: str) -> bytes:
    # pipe(), not render(): render() appends its own extension and leaves a source file behind.
    if shutil.which("dot") is None:
        raise RenderError(f"rendering .{fmt} needs the Graphviz `dot` program, which is not "
                          f"on PATH; {INSTALL_HINT}")
    import graphviz
    try:
        return dot.pipe(format=fmt)
    except graphviz.backend.ExecutableNotFound:
        raise RenderError(f"the Graphviz `dot` program could not be run; {INSTALL_HINT}") \
            from None
