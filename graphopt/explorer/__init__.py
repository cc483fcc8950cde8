"""The explorer: one self-contained HTML page per step, for studying what the passes and
fusion did to it (docs/explorer.md).

    graphopt.explorer.explore_graph(graph, "step.html")    # a graph: traced, or read from .gir
    step.lower(x, y).explore("step.html")                   # a compiled step (an Executable)
    graphopt.explain(step, x, y).to_html("step.html")       # what explain printed, as a page

`data.gather` collects what the page shows, `page.render_page` writes the HTML around it.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..compile.executable import Executable
from ..errors import GraphoptError
from ..ir.graph import Graph
from .data import gather
from .page import render_page

__all__ = ["explore_executable", "explore_graph", "gather", "render_page", "write_page"]


def write_page(data: dict[str, Any], path: str | Path | None = None) -> str:
    """The page's HTML for `gather`'s data, written to `path` too when one is given."""
    text = render_page(data)
    if path is not None:
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as e:
            raise GraphoptError(f"cannot write the explorer page {path}: {e.strerror or e}") \
                from None
    return text


def explore_graph(graph: Graph, path: str | Path | None = None,
                  passes: str | Iterable[str] | None = None, *, fastmath: bool = False,
                  options: dict[str, Any] | None = None, title: str | None = None) -> str:
    """The page of a graph (as traced, or read from a .gir file) after a pipeline: the passes
    run on a copy and the result is compiled with the LLVM backend. Returns the HTML and
    writes it to `path` when one is given."""
    return write_page(gather(graph, passes, fastmath=fastmath, options=options, title=title),
                      path)


def explore_executable(exe: Executable, path: str | Path | None = None) -> str:
    """The page of a compiled step: its traced graph, its passes run again as it ran them (to
    show each one's work), and its kernels as its backend compiled them. Returns the HTML and
    writes it to `path` when one is given."""
    title = getattr(exe.fn, "__name__", None) or exe.graph.name
    return write_page(gather(exe.traced_graph, exe.passes, fastmath=exe.fastmath,
                             options=exe.pass_options, program=exe.program, title=title), path)


# `compiled.explore("step.html")`: a method of the compiled step, defined here because the
# page needs this layer (compile/ may import nothing above itself).
Executable.explore = explore_executable
