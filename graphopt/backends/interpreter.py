"""The reference backend: runs any valid graph node by node with numpy.

Nodes run in graph order (the verifier guarantees it respects data and after edges); a kernel
runs its body on whole arrays (see ir/kernel.py). Only the nodes the return reaches run
(`analysis.live_nodes`: what dce keeps), so a graph means the same before and after dce.
Assigns and kernel stores are only collected: the caller commits them after the whole graph
has run, so a step that fails part-way changes no Parameter.
"""
from __future__ import annotations

import numpy as np

from ..errors import ExecutionError, GraphoptError
from ..ir import kernel
from ..ir.analysis import run_order
from ..ir.graph import Graph, Node, Value
from ..ir.registry import evaluate


def run(graph: Graph, inputs: dict[Value, np.ndarray],
        nodes: list[Node] | None = None) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Run the graph; return its outputs and the new value of each assigned parameter.
    `nodes`: the live nodes, in order, when the caller has them already."""
    if nodes is None:
        nodes = run_order(graph)
    env: dict[Value, object] = dict(inputs)
    updates: dict[str, np.ndarray] = {}
    # NaN and Inf are values a training step works with (loss scaling looks for them).
    with np.errstate(all="ignore"):
        for node in nodes:
            if node.op == "assign":
                updates[node.inputs[0].name] = env[node.inputs[1]]  # type: ignore[assignment]
                env[node.out] = None  # a token carries no data
                continue
            args = [env[v] for v in node.inputs]
            try:
                if node.body is not None:
                    results, writes = kernel.run(node, args)
                    updates.update((target.name, a) for target, a in writes)
                    results += [None] * (len(node.outputs) - len(results))  # the token
                else:
                    results = evaluate(node.opdef, args, node.attrs,
                                       [v.type for v in node.outputs])
            except GraphoptError:
                raise
            except Exception as e:  # numpy's own error, e.g. an integer to a negative power
                raise ExecutionError(f"{node.op} failed while the step ran: {e}; "
                                     f"no parameter was changed", loc=node.loc) from None
            env.update(zip(node.outputs, results))
    return [env[v] for v in graph.outputs], updates  # type: ignore[misc]


class InterpreterProgram:
    """The interpreter needs no compilation: its program is the graph's live nodes."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes = run_order(graph)
        self.kernels: list = []

    def run(self, inputs: dict[Value, np.ndarray]) -> tuple[list[np.ndarray],
                                                            dict[str, np.ndarray]]:
        return run(self.graph, inputs, self.nodes)


def target() -> str:
    """numpy runs the same everywhere."""
    return ""


def compile(graph: Graph, *, fastmath: bool = False, cache: bool = True) -> InterpreterProgram:
    return InterpreterProgram(graph)
