"""explain: what each pass did to a step, and what fusion refused to do and why.

    graphopt.explain(step, grads, 1e-3)

prints, pass by pass, the statistics and a unified diff of the text IR (or "no change"),
then every merge `fuse` or `hfuse` refused, with its reason: the outside path that would have
made a cycle, the spaces that did not match, the reduction needed too early, the cost term;
last, the statistics table, the bytes one run of the result moves (the kernels', and each
op's of the nodes numpy runs), the collectives of the result with the bytes each sends (if it
has any), the target the LLVM backend would compile for and each kernel's vector width there.
Nothing is compiled.
(`graphopt opt --explain` prints the graph after the passes too.)
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, TextIO

from .frontend.tracer import trace_function
from .ir.graph import Graph, Value
from .ir.printer import Namer, format_node, value_names
from .ir.registry import COLLECTIVE, CONSTANT
from .ir.traffic import node_bytes, readable, traffic
from .passes import run
from .passes.cost import bytes_sent
from .passes.manager import PipelineResult, parse_pipeline


@dataclass
class Explanation(PipelineResult):
    """What `explain` returns: the PipelineResult of the passes (printed as the statistics
    table), which `to_html()` also shows as the explorer's page."""

    source: Graph = field(default=None, repr=False)  # the graph the passes ran on
    passes: Any = None
    fastmath: bool = False
    options: dict[str, Any] | None = None

    def to_html(self, path: str | Path | None = None) -> str:
        """The explorer's page of this pipeline (docs/explorer.md): the passes run again on
        the same graph, to keep a snapshot after each, and the result is compiled with the
        LLVM backend. Returns the HTML, and writes it to `path` when one is given."""
        from .explorer import explore_graph
        return explore_graph(self.source, path, self.passes, fastmath=self.fastmath,
                             options=self.options)


def explain_graph(graph: Graph, passes: str | Iterable[str] | None = None, *,
                  fastmath: bool = False, options: dict[str, Any] | None = None,
                  out: TextIO | None = None) -> Explanation:
    """Run the pipeline on a graph and print what each pass did, what fuse and hfuse refused
    and why, then the statistics table and the LLVM backend's target. Nothing is compiled.

    Args:
        graph: the graph (not changed: the passes rewrite a copy).
        passes: the pipeline, as `passes.run` takes it; None is the default pipeline.
        fastmath: allow rewrites that are only algebraically exact.
        options: settings of particular passes (PassContext.options).
        out: where to print (default sys.stdout).

    Returns:
        The Explanation (a PipelineResult, with a diff of the text IR in each pass's stats;
        `to_html()` makes the explorer's page of it).
    """
    out = out or sys.stdout
    result = Explanation(**vars(run(graph, passes, fastmath=fastmath, options=options,
                                    diffs=True)),
                         source=graph, passes=passes, fastmath=fastmath, options=options)
    for s in result.stats:
        notes = ", ".join(f"{k}={v}" for k, v in s.counters.items() if v)
        print(f"=== {s.name}: {s.nodes_before} -> {s.nodes_after} nodes, "
              f"{s.kernels_after} kernels, {s.seconds * 1e3:.2f} ms"
              f"{'; ' + notes if notes else ''}", file=out)
        print(s.diff.rstrip("\n") if s.changed else "no change", file=out)
        refused = [r for r in result.refusals if r.pass_name == s.name]
        if refused:
            print(f"--- {s.name} refused {len(refused)}:", file=out)
            for r in refused:
                where = f" [{r.loc}]" if r.loc is not None else ""
                print(f"  {r.subject}{where}: {r.reason}", file=out)
    print(f"=== result\n{result}", file=out)
    print_traffic(result.graph, out)
    print_collectives(result.graph, out, result.names)
    from .backends.llvm.target import describe  # (loads llvmlite: only when explaining)
    print(f"=== llvm target: {describe()}", file=out)
    print_vector_widths(result.graph, out, result.names)
    return result


def print_vector_widths(graph: Graph, out: TextIO | None = None,
                        names: dict[Value, str] | None = None) -> None:
    """Print the vector width of each kernel's loop at the selected target (as the text form
    names the kernel, keeping `names` as print_collectives does; backends/llvm/vectorwidth.py:
    what LLVM's vectorizer will choose, from the target and the kernel's types; nothing is
    compiled); nothing for a graph without kernels or when the target is refused (the line
    above says why)."""
    from .backends.llvm.target import selected
    from .backends.llvm.vectorwidth import kernel_vector_width
    from .errors import TargetError
    out = out or sys.stdout
    try:
        selected()
    except TargetError:
        return
    names = value_names(graph, names)
    for n in graph.nodes:
        if n.op == "kernel":
            print(f"=== vector width of {names[n.outputs[0]]} = kernel: "
                  f"{kernel_vector_width(n)}", file=out)


def print_traffic(graph: Graph, out: TextIO | None = None) -> None:
    """Print the bytes one run of the graph moves (ir/traffic.py), and how much of it the
    kernels move and how much each op of the other nodes (run by numpy: matmul, reductions,
    gathers, assigns; views move nothing)."""
    by_op: dict[str, int] = {}
    for n in graph.nodes:
        op = "kernels" if n.body is not None else n.op
        by_op[op] = by_op.get(op, 0) + sum(node_bytes(n))
    parts = [f"{op} {readable(b)}" for op, b in sorted(by_op.items(), key=lambda x: -x[1]) if b]
    print(f"=== bytes per run: {traffic(graph)}{': ' if parts else ''}{', '.join(parts)}",
          file=out)


def _bucket_part(v: Any) -> str:
    """A part of a flat bucket: the tensor it flattens, with its source line (a constant:
    the padding, or the gradient of a parameter the loss does not read)."""
    n = v.node
    if n is not None and n.op == "reshape":
        v, n = n.inputs[0], n.inputs[0].node
    if n is not None and n.opdef.category == CONSTANT:
        return f"{v.type} constant"
    loc = n.loc if n is not None else None
    where = f" ({os.path.basename(loc.file)}:{loc.line})" if loc is not None else ""
    return f"{v.type}{where}" if not v.is_input else \
        f"{v.type} {'@' if v.is_param else '%'}{v.name}"


def print_collectives(graph: Graph, out: TextIO | None = None,
                      names: dict[Value, str] | None = None) -> int:
    """Print each collective of the graph (in order, as the text form names it) with its type
    and the bytes one rank sends in it per step (passes.cost.bytes_sent: a ring algorithm;
    a predicated one's, when it communicates and per run on average), then their total;
    nothing for a graph without collectives. Returns the total.

    Args:
        graph: the graph, usually after the passes (what runs).
        out: where to print (default sys.stdout).
        names: names values keep (PipelineResult.names: those the passes' printings gave).
    """
    out = out or sys.stdout
    nodes = [n for n in graph.nodes if n.opdef.category == COLLECTIVE]
    if not nodes:
        return 0
    print("=== collectives: bytes each rank sends per step (a ring algorithm)", file=out)
    name = Namer(names)  # the names the text form gives
    for v in graph.inputs:
        name.define(v)
    for n in graph.nodes:
        if n.opdef.category == COLLECTIVE:
            sends = f"sends {bytes_sent(n):,} B"
            if n.opdef.predicated:  # it communicates on one run in `every`
                sends = (f"sends {bytes_sent(n, per_run=False):,} B once every "
                         f"{n.attrs['every']} runs, when {name(n.inputs[-1])}: {sends} "
                         f"per run")
            print(f"  {format_node(n, name)}  {sends}", file=out)
            bucket = n.inputs[0].node if n.inputs else None
            if bucket is not None and bucket.op == "concat":  # a flat bucket: what it holds
                parts = [_bucket_part(v) for v in bucket.inputs]
                print(f"    bucket of {len(parts)}: {', '.join(parts)}", file=out)
        for v in n.outputs:
            name.define(v)
    total = sum(map(bytes_sent, nodes))
    print(f"  total: {total:,} B sent per step", file=out)
    return total


def explain(fn: Callable, *args: Any, passes: str | Iterable[str] | None = None,
            fastmath: bool = False, out: TextIO | None = None, **kwargs: Any) -> Explanation:
    """Trace `fn` on these arguments and print what the pass pipeline does to its graph
    (see `explain_graph`); a jitted function is traced as jit traces it: its Python
    function, for its data-parallel strategy if it has one. Nothing is compiled, and no
    step runs.

    Args:
        fn: a step function or a JittedFunction.
        *args: example arguments, as the step would be called with.
        passes: the pipeline; None is the default pipeline.
        fastmath: allow rewrites that are only algebraically exact.
        out: where to print (default sys.stdout).
        **kwargs: example keyword arguments.

    Returns:
        The Explanation: the PipelineResult of the passes, with `to_html()`.
    """
    graph, passes, options = trace_for_passes(fn, args, kwargs, passes)
    return explain_graph(graph, passes, fastmath=fastmath, options=options, out=out)


def trace_for_passes(fn: Callable, args: tuple, kwargs: dict,
                     passes: str | Iterable[str] | None = None
                     ) -> tuple[Graph, Any, dict[str, Any] | None]:
    """Trace `fn` as jit traces it, for a pipeline: (the verified graph, the pipeline, the
    passes' options). A jitted step is traced as its Python function, for its data-parallel
    strategy if it has one, whose passes come first (with their settings)."""
    parallel = getattr(fn, "parallel", None)
    graph = trace_function(getattr(fn, "fn", fn), args, kwargs, parallel=parallel).graph.verify()
    options = None
    if parallel is not None:
        passes, options = parallel.pipeline(parse_pipeline(passes)), parallel.pass_options()
    return graph, passes, options
