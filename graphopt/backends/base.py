"""What a backend is, and the one loop that runs a graph's nodes numpy's way.

A backend is a module with `compile(graph, *, fastmath, cache) -> Program` and `target()`.
The interpreter runs every node through `run_nodes`; the LLVM runtime runs its compiled
kernels natively and the rest through `run_nodes` too, so both mean the same by each node
and report a failing one the same way.
"""
from __future__ import annotations

from typing import Any, Collection, Mapping, Protocol, Sequence

import numpy as np

from ..errors import ExecutionError, GraphoptError
from ..ir import kernel
from ..ir.graph import Graph, Node, Value
from ..ir.registry import evaluate, evaluate_element, evaluate_into


class Program(Protocol):
    """A graph ready to run. `nodes` are the ones that run, in order; `kernels` what was
    compiled natively (none for the interpreter). An LLVMProgram also has `native_inputs`
    (the arguments native code reads as they lie) and `listing`."""

    graph: Graph
    nodes: list[Node]
    kernels: list

    def run(self, inputs: dict[Value, np.ndarray]) -> tuple[list[np.ndarray],
                                                            dict[str, np.ndarray]]:
        """The graph's outputs, and the new value of each parameter it did not already
        update in place (the caller commits them once the whole graph has run). An output
        may be a buffer the program reuses: copy it before the next run."""
        ...


class Backend(Protocol):
    """A backend module (`graphopt/backends/__init__.py` names them)."""

    def compile(self, graph: Graph, *, fastmath: bool = False, cache: bool = True
                ) -> Program:
        """Prepare a verified graph to run.

        Args:
            graph: the graph after the passes; the program keeps it.
            fastmath: fast-math flags for compiled code (the interpreter ignores it).
            cache: whether compiled code may come from and go to the disk cache.

        Returns:
            A Program whose `run` the Executable calls once per step.
        """
        ...

    def target(self) -> str:
        """The switches its programs depend on (the LLVM backend's GRAPHOPT_CPU), so that
        jit compiles again when they change; "" when there are none."""
        ...


class NativeNode(Protocol):
    """A node a backend compiled: it runs on the values computed so far."""

    def run_in(self, env: dict[Value, Any]) -> list[Any]: ...


def run_nodes(nodes: Sequence[Node], env: dict[Value, Any], *,
              native: Mapping[int, NativeNode] | None = None,
              stored: Collection[Value] = (), keep: Collection[Value] = (),
              into: Mapping[Value, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Run the nodes in order on `env`, the graph's inputs, adding the values they make;
    return the new value of each assigned parameter (assigns and numpy-run kernels' stores
    are only collected: the caller commits them after the whole graph has run, so a step
    that fails part-way changes no Parameter).

    `native`: node id -> the compiled node that runs instead of numpy. `stored`: parameters
    written in place while the nodes run; `keep`: the values read once a store may have run.
    A numpy result in `keep` that views a stored parameter is copied when made, so it keeps
    the value it was made from. `into`: the planned buffer of each value a numpy node
    computes into (registry.evaluate_into) instead of allocating."""
    updates: dict[str, np.ndarray] = {}
    roots = {id(root(env[v])) for v in stored if v in env}
    # NaN and Inf are values a training step works with (loss scaling looks for them).
    with np.errstate(all="ignore"):
        for node in nodes:
            if node.opdef.has_effect:  # an assign (a store is only ever in a kernel body)
                updates[node.inputs[0].name] = env[node.inputs[1]]
                env[node.out] = None  # a token carries no data
                continue
            compiled = native.get(id(node)) if native else None
            if compiled is not None:
                env.update(zip(node.outputs, compiled.run_in(env)))
                continue
            buffer = into.get(node.outputs[0]) if into and node.outputs else None
            results = _numpy(node, [env[v] for v in node.inputs], updates, out=buffer)
            for v, r in zip(node.outputs, results):
                env[v] = r.copy() if roots and v in keep and isinstance(r, np.ndarray) \
                    and id(root(r)) in roots else r
    return updates


def _numpy(node: Node, args: list[Any], updates: dict[str, np.ndarray],
           fused: bool = False, out: np.ndarray | None = None) -> Any:
    """A node's numpy semantics (a kernel's stores go into `updates`; `fused`: a node of a
    kernel's body, one result; `out`: the array to compute the one result into), with
    numpy's own exception (an integer to a negative power, a MemoryError) as the
    ExecutionError that says which node failed, and where."""
    try:
        if fused:  # on whole arrays: the numpy function of the unfused op
            return evaluate_element(node.opdef, args, node.attrs, node.outputs[0].type)
        if out is not None:
            return [evaluate_into(node.opdef, args, node.attrs, out)]
        if node.body is None:
            return evaluate(node.opdef, args, node.attrs, [v.type for v in node.outputs])
        results, writes = kernel.run(node, args, _fused)
        updates.update((target.name, a) for target, a in writes)
        return results + [None] * (len(node.outputs) - len(results))  # the token
    except GraphoptError:
        raise
    except Exception as e:
        what = f"{node.op} (fused in a kernel)" if fused else node.op  # not the kernel
        raise ExecutionError(f"{what} failed while the step ran: {e}; no parameter was "
                             f"changed", loc=node.loc) from None


def _fused(n: Node, arrays: list[Any]) -> np.ndarray:
    return _numpy(n, arrays, {}, fused=True)


def root(a: np.ndarray) -> np.ndarray:
    """The array whose memory `a` views (`a` itself if it owns its memory)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a
