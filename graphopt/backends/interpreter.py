"""The reference backend: runs any valid graph node by node with numpy.

Nodes run in graph order (the verifier guarantees it respects data and after edges), through
the one loop of backends/base.py; a kernel runs its body on whole arrays (see ir/kernel.py).
Only the nodes the return reaches run (`analysis.live_nodes`: what dce keeps), so a graph
means the same before and after dce. Assigns and kernel stores are only collected: the
caller commits them after the whole graph has run, so a step that fails part-way changes no
Parameter.
"""
from __future__ import annotations

import numpy as np

from ..ir.analysis import run_order
from ..ir.graph import Graph, Node, Value
from .base import NodeLoop, run_nodes


def run(graph: Graph, inputs: dict[Value, np.ndarray],
        nodes: list[Node] | None = None) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Run the graph; return its outputs and the new value of each assigned parameter.
    `nodes`: the live nodes, in order, when the caller has them already."""
    env: dict[Value, object] = dict(inputs)
    updates = run_nodes(run_order(graph) if nodes is None else nodes, env)
    return [env[v] for v in graph.outputs], updates


class InterpreterProgram:
    """The interpreter needs no compilation: its program is the graph's live nodes."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes = run_order(graph)
        self.kernels: list = []
        self._loop = NodeLoop(self.nodes)  # the nodes' closures, made once

    def run(self, inputs: dict[Value, np.ndarray]) -> tuple[list[np.ndarray],
                                                            dict[str, np.ndarray]]:
        """The graph's outputs, and the new value of each assigned parameter (see `run`)."""
        env: dict[Value, object] = dict(inputs)
        updates = self._loop(env)
        return [env[v] for v in self.graph.outputs], updates


def target() -> str:
    """numpy runs the same everywhere."""
    return ""


def compile(graph: Graph, *, fastmath: bool = False, cache: bool = True) -> InterpreterProgram:
    """The interpreter's program for a graph: nothing is compiled, and `fastmath` and
    `cache` change nothing."""
    return InterpreterProgram(graph)
