"""What a backend is, and the one loop that runs a graph's nodes numpy's way.

A backend is a module with `compile(graph, *, fastmath, cache) -> Program` and `target()`.
The interpreter runs every node through `run_nodes`; the LLVM runtime runs its compiled
kernels natively and the rest through `run_nodes` too, so both mean the same by each node
and report a failing one the same way.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Collection, Mapping, Protocol, Sequence

import numpy as np

from ..errors import ExecutionError, GraphoptError
from ..ir import kernel
from ..ir.graph import Graph, Node, Value
from ..ir.registry import evaluate_element, evaluate_into, evaluator


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


class NativeGroup(Protocol):
    """Consecutive nodes a backend runs as one compiled call: the values of `outputs` (its
    nodes' outputs, in order) made from the values computed so far."""

    nodes: Sequence[Node]
    outputs: Sequence[Value]

    def run_in(self, env: dict[Value, Any]) -> list[Any]: ...


class _StoredRoots:
    """Whether an array views a stored parameter's memory; the parameters' roots are worked
    out at the first question of a step (most steps ask none: fresh results own memory)."""

    __slots__ = ("env", "ids", "stored")

    def __init__(self, stored: tuple[Value, ...], env: dict[Value, Any]):
        self.stored, self.env, self.ids = stored, env, None

    def __contains__(self, a: np.ndarray) -> bool:
        if self.ids is None:
            self.ids = {id(root(self.env[v])) for v in self.stored if v in self.env}
        return id(root(a)) in self.ids


Step = Callable[[dict, dict, _StoredRoots], None]  # (env, updates, stored parameters' roots)


class NodeLoop:
    """Nodes made ready to run, once: each becomes a closure that holds its op's function,
    attributes and operands (no registry lookup, no dict of attributes, no isinstance chain
    at every step), and a step runs the closures in order (see run_nodes for what they do).

    `native`: node id -> the compiled node that runs instead of numpy. `stored`: parameters
    written in place while the nodes run; `keep`: the values read once a store may have run.
    A numpy result in `keep` that views a stored parameter is copied when made, so it keeps
    the value it was made from. `into`: the planned buffer of each value a numpy node
    computes into (registry.evaluate_into) instead of allocating. `groups`: id of a group's
    first node -> consecutive nodes that run as one compiled call (NativeGroup), which
    stands for them all."""

    def __init__(self, nodes: Sequence[Node], *,
                 native: Mapping[int, NativeNode] | None = None,
                 stored: Collection[Value] = (), keep: Collection[Value] = (),
                 into: Mapping[Value, np.ndarray] | None = None,
                 groups: Mapping[int, NativeGroup] | None = None):
        self.stored = tuple(stored)
        keep = set(keep) if self.stored else set()
        groups = groups or {}
        self.steps: list[Step] = []
        inside: set[int] = set()  # the nodes of a group after its first
        for n in nodes:
            group = groups.get(id(n))
            if group is not None:
                inside.update(id(m) for m in group.nodes[1:])
                self.steps.append(_group_step(group))
            elif id(n) not in inside:
                self.steps.append(_step(n, (native or {}).get(id(n)), keep, into or {}))

    def __call__(self, env: dict[Value, Any], steps: slice | None = None
                 ) -> dict[str, np.ndarray]:
        """Run the steps (all, or a slice of them) on `env`; the new value of each assigned
        parameter (committed by the caller once the whole graph has run)."""
        updates: dict[str, np.ndarray] = {}
        roots = _StoredRoots(self.stored, env)
        # NaN and Inf are values a training step works with (loss scaling looks for them).
        with np.errstate(all="ignore"):
            for step in self.steps if steps is None else self.steps[steps]:
                step(env, updates, roots)
        return updates


def run_nodes(nodes: Sequence[Node], env: dict[Value, Any], *,
              native: Mapping[int, NativeNode] | None = None,
              stored: Collection[Value] = (), keep: Collection[Value] = (),
              into: Mapping[Value, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Run the nodes in order on `env`, the graph's inputs, adding the values they make;
    return the new value of each assigned parameter (assigns and numpy-run kernels' stores
    are only collected: the caller commits them after the whole graph has run, so a step
    that fails part-way changes no Parameter). The arguments are NodeLoop's; a program that
    runs its nodes every step makes the NodeLoop once instead."""
    return NodeLoop(nodes, native=native, stored=stored, keep=keep, into=into)(env)


def gather(keys: Sequence[Value]) -> Callable[[Mapping[Value, Any]], tuple]:
    """A function that takes the values at `keys` out of a mapping, as a tuple: an
    itemgetter (one C call; a list comprehension costs several times more on a node's few
    operands), and the same tuple shape for one key or none."""
    if len(keys) > 1:
        return operator.itemgetter(*keys)
    if keys:
        key = keys[0]
        return lambda env: (env[key],)
    return lambda env: ()


def _step(node: Node, compiled: NativeNode | None, keep: set[Value],
          into: Mapping[Value, np.ndarray]) -> Step:
    """The closure that runs one node: an assign's collection, a compiled node's call, or the
    op's numpy function (into its planned buffer where it has one)."""
    op, ins, outs, attrs = node.opdef, tuple(node.inputs), tuple(node.outputs), node.attrs
    operands = gather(ins)
    if op.has_effect:  # an assign (a store is only ever in a kernel body)
        name, source, token = ins[0].name, ins[1], node.out

        def assign(env, updates, roots):
            updates[name] = env[source]
            env[token] = None  # a token carries no data
        return assign
    if compiled is not None:
        run_in = compiled.run_in

        def native(env, updates, roots):
            env.update(zip(outs, run_in(env)))
        return native
    buffer = into.get(outs[0]) if outs else None
    if buffer is not None:  # a planned buffer never views a parameter: nothing to keep
        out = outs[0]

        def planned(env, updates, roots):
            args = operands(env)
            try:  # (inline, not _guarded: a call less per node, and the step calls every node)
                evaluate_into(op, args, attrs, buffer)
            except GraphoptError:
                raise
            except Exception as e:
                raise _failure(node, e) from None
            env[out] = buffer
        return planned
    kept = [v for v in outs if v in keep]
    if node.body is not None:  # a kernel numpy runs (its op has no lowering)
        def fallback(env, updates, roots):
            env.update(zip(outs, _kernel(node, list(operands(env)), updates)))
            _keep(env, kept, roots)
        return fallback
    compute = evaluator(op, attrs, [v.type for v in ins], [v.type for v in outs])

    def numpy(env, updates, roots):
        args = operands(env)
        try:
            results = compute(args)
        except GraphoptError:
            raise
        except Exception as e:
            raise _failure(node, e) from None
        env.update(zip(outs, results))
        if kept:
            _keep(env, kept, roots)
    return numpy


def _group_step(group: NativeGroup) -> Step:
    outs, run_in = tuple(group.outputs), group.run_in

    def native_group(env, updates, roots):
        env.update(zip(outs, run_in(env)))
    return native_group


def _keep(env: dict[Value, Any], kept: list[Value], roots: _StoredRoots) -> None:
    """Copy each of these values that views a stored parameter, so that it keeps the value
    it was made from once a kernel stores into the parameter."""
    for v in kept:
        r = env[v]
        if isinstance(r, np.ndarray) and r.base is not None and r in roots:
            env[v] = r.copy()


def _kernel(node: Node, args: list[Any], updates: dict[str, np.ndarray]) -> list[Any]:
    """A kernel numpy runs, body node by body node (its stores go into `updates`)."""
    def run() -> list[Any]:
        results, writes = kernel.run(node, args, _fused)
        updates.update((target.name, a) for target, a in writes)
        return results + [None] * (len(node.outputs) - len(results))  # the token
    return _guarded(node, run)


def _guarded(node: Node, compute: Callable[..., Any], *args: Any, fused: bool = False) -> Any:
    """compute(*args), with numpy's own exception (an integer to a negative power, a
    MemoryError) as the ExecutionError that says which node failed, and where (`fused`: a
    node of a kernel's body)."""
    try:
        return compute(*args)
    except GraphoptError:
        raise
    except Exception as e:
        raise _failure(node, e, fused) from None


def _failure(node: Node, e: Exception, fused: bool = False) -> ExecutionError:
    what = f"{node.op} (fused in a kernel)" if fused else node.op  # not the kernel
    return ExecutionError(f"{what} failed while the step ran: {e}; no parameter was changed",
                          loc=node.loc)


def _fused(n: Node, arrays: list[Any]) -> np.ndarray:
    """A node of a kernel's body on whole arrays: the numpy function of the unfused op."""
    return _guarded(n, evaluate_element, n.opdef, arrays, n.attrs, n.outputs[0].type,
                    fused=True)


def root(a: np.ndarray) -> np.ndarray:
    """The array whose memory `a` views (`a` itself if it owns its memory)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a
