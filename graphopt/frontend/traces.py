"""Trace state: the traces under way on this thread, and what one trace holds.

A `Trace` builds a Graph: each op `bind` applies becomes a node, Parameters are read as `@name`,
`assign` records the newest value of a parameter, and at the end one `assign` per parameter is
emitted, ordered after every node that read the parameter's old value (the write-after-read
edges). Ordered ops (the collectives) are chained in program order: each gets an after edge
to the one before, so every rank issues them in the order the step function calls them.
`EagerTrace` is eager mode as just another trace (JAX's EvalTrace): the same calls compute
with numpy at once and write Parameters directly. `active_trace()` is the innermost trace, or
the eager one outside any.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import AssignError, ExecutionError, GraphoptError, ParameterError
from ..ir.analysis import producers, toposort, unordered_readers
from ..ir.graph import Graph, Location, Value
from ..ir.opdefs import constant_value, write_rows
from ..ir.registry import OpDef, evaluate
from ..ir.types import RowsArray, RowsType, TensorType
from .parameter import Parameter
from .rows import Rows
from .tensor import EagerTensor, Tensor, TracedTensor

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Frames in these places are graphopt's machinery; the first frame outside them is the
# user's line (graphopt.optim counts as user code: its lines are the update rules).
_INTERNAL = tuple(os.path.join(_PKG, d) for d in ("frontend", "ir", "backends", "compile",
                                                  "autodiff", "ops.py"))

class _Traces(threading.local):
    """The traces under way, innermost last: one stack per thread, so a step traced on one
    thread never sees another thread's trace (which would inline a compiled step into it)."""

    def __init__(self) -> None:
        self.stack: list[Trace] = []


_TRACES = _Traces()


def current_trace() -> Trace | None:
    stack = _TRACES.stack
    return stack[-1] if stack else None


@contextlib.contextmanager
def tracing(trace: Trace) -> Iterator[None]:
    """`trace` is the current trace within the block (on this thread)."""
    _TRACES.stack.append(trace)
    try:
        yield
    finally:
        _TRACES.stack.pop()


def user_location() -> Location | None:
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_INTERNAL) and not name.startswith("<frozen"):
            return Location(name, f.f_lineno)
        f = f.f_back
    return None


class BaseTrace:
    """What bind, assign and depend ask of a trace, and the hooks a map trace
    (frontend/hypermap.py) overrides. A payload is what a trace computes with: a Value in a
    graph, an array in eager mode."""

    eager = False  # whether ops compute at once (EagerTrace)

    def param_type(self, p: Parameter) -> TensorType:
        """The type a value assigned to p must have."""
        return p.type

    def foreign(self, x: TracedTensor) -> Value:
        """A traced tensor of another trace used here: an error, except in a map trace."""
        raise GraphoptError("a traced tensor was used outside the trace that made it (did a "
                            "value escape a jitted function?)", loc=user_location())

    def check_op(self, op: OpDef, loc: Location | None) -> None:
        """An op about to be applied here (a map trace accepts elementwise ops only)."""

    def read_param(self, p: Parameter) -> Any:
        raise NotImplementedError

    def value(self, payload: Any, t: TensorType, loc: Location | None) -> Any:
        """A payload of this trace for an operand of type t (a Python scalar or an array
        becomes a constant node in a graph)."""
        raise NotImplementedError

    def apply(self, op: OpDef, inputs: Sequence[Any], attrs: dict[str, Any],
              out_types: list[TensorType], loc: Location | None) -> list[Any]:
        """The op on payloads of this trace: its results' payloads."""
        raise NotImplementedError

    def tensor(self, payload: Any, weak: bool) -> Tensor:
        raise NotImplementedError

    def rows(self, payload: Any, t: RowsType) -> Rows:
        """The Rows of a payload of type t (an op's result)."""
        raise NotImplementedError

    def record_assign(self, p: Parameter, v: Any, loc: Location | None) -> None:
        raise NotImplementedError

    def depend(self, v: Any, after: list[Any], weak: bool, loc: Location | None) -> Tensor:
        raise NotImplementedError


class EagerTrace(BaseTrace):
    """Eager mode: every op computes now, with the numpy semantics the interpreter runs."""

    eager = True

    def read_param(self, p: Parameter) -> np.ndarray:
        return p._value

    def value(self, payload: Any, t: TensorType, loc: Location | None) -> np.ndarray:
        if isinstance(t, RowsType):
            return payload
        return np.asarray(payload, dtype=t.dtype.np_dtype)

    def apply(self, op: OpDef, inputs: Sequence[Any], attrs: dict[str, Any],
              out_types: list[TensorType], loc: Location | None) -> list[np.ndarray]:
        try:
            with np.errstate(all="ignore"):
                return evaluate(op, inputs, attrs, out_types)
        except GraphoptError:
            raise
        except Exception as e:  # numpy's own error, as the interpreter reports it under jit
            raise ExecutionError(f"{op.name} failed: {e}", loc=loc) from None

    def tensor(self, payload: np.ndarray, weak: bool) -> EagerTensor:
        # A shape op returns a view; of a Parameter's buffer, a later eager assign would
        # change it, where the traced step keeps the value it read.
        return EagerTensor(payload if payload.flags.owndata else payload.copy(), weak)

    def rows(self, payload: RowsArray, t: RowsType) -> Rows:
        values = payload.values  # (as tensor's: a view of a Parameter's buffer is copied)
        if not values.flags.owndata:
            payload = payload._replace(values=values.copy())
        return Rows(payload, t)

    def record_assign(self, p: Parameter, v: np.ndarray, loc: Location | None) -> None:
        if isinstance(v, RowsArray):
            write_rows(p._value, v)
        else:
            np.copyto(p._value, v)

    def depend(self, v: np.ndarray, after: list[Any], weak: bool,
               loc: Location | None) -> EagerTensor:
        return EagerTensor(np.array(v), weak)  # its value now, as a traced depend reads it


EAGER = EagerTrace()


def active_trace() -> BaseTrace:
    """The trace ops go to: the innermost one under way, or eager mode."""
    stack = _TRACES.stack
    return stack[-1] if stack else EAGER


class Trace(BaseTrace):
    """The state of one trace: the graph being built and what each Parameter holds now."""

    def __init__(self, name: str):
        self.graph = Graph(name)
        self.param_inputs: dict[int, Value] = {}  # id(Parameter) -> its @name input
        self.params: dict[str, Parameter] = {}  # name -> Parameter
        self.assigned: dict[int, tuple[Parameter, Value, Location | None]] = {}
        # Kernels made by hypermap (frontend/hypermap.py), and the parameters they update:
        # id(Parameter) -> (kernel node, role, instance).
        self.maps: list = []
        self.map_writes: dict[int, tuple] = {}
        # The data-parallel strategy the step is traced for (graphopt.distributed's
        # DataParallel), or None: value_and_grad and the optimizers ask it what to add.
        self.parallel: Any = None
        # The result of the last ordered node (a collective), which the next one waits for.
        self.last_ordered: Value | None = None

    def read_param(self, p: Parameter) -> Value:
        if id(p) in self.assigned:
            v = self.assigned[id(p)][1]  # read after assign: the new value
            if isinstance(v.type, RowsType):  # rows of p replaced: the whole tensor now
                return self.graph.add_node("put_rows", [self.read_input(p), v],
                                           loc=user_location()).out
            return v
        if id(p) in self.map_writes:  # read after a mapped update: that kernel's new value
            from .hypermap import new_value
            return new_value(*self.map_writes[id(p)])
        return self.read_input(p)

    def record_assign(self, p: Parameter, v: Value, loc: Location | None) -> None:
        if id(p) in self.map_writes:
            raise AssignError(f"assign to {p.name}: a mapped update (an optimizer step) already "
                              f"wrote it in this step", loc=loc)
        self.read_input(p)  # the parameter is an input of the graph even if never read
        self.assigned[id(p)] = (p, v, loc)

    def value(self, payload: Any, t: TensorType, loc: Location | None) -> Value:
        if isinstance(payload, Value):
            return payload
        attrs = {"value": constant_value(payload, t.dtype), "shape": t.shape, "dtype": t.dtype}
        return self.graph.add_node("constant", [], attrs, loc=loc, out_types=[t]).out

    def apply(self, op: OpDef, inputs: Sequence[Value], attrs: dict[str, Any],
              out_types: list[TensorType], loc: Location | None) -> list[Value]:
        if not op.ordered:
            return self.graph.add_node(op.name, list(inputs), attrs, loc=loc,
                                       out_types=out_types).outputs
        after = [] if self.last_ordered is None else [self.last_ordered]
        node = self.graph.add_node(op.name, list(inputs), attrs, loc=loc, out_types=out_types,
                                   after=after)
        self.last_ordered = node.outputs[0]
        return node.outputs

    def tensor(self, payload: Value, weak: bool) -> TracedTensor:
        return TracedTensor(payload, self, weak)

    def rows(self, payload: Value, t: RowsType) -> Rows:
        return Rows(payload, t, self)

    def depend(self, v: Value, after: list[Any], weak: bool,
               loc: Location | None) -> TracedTensor:
        if not all(isinstance(e, Value) for e in after):
            raise GraphoptError("depend orders after traced tensors or Parameters only", loc=loc)
        return TracedTensor(self.graph.add_node("depend", [v], loc=loc, after=after).out, self,
                            weak)

    def finish(self, outputs: list[Value]) -> Graph:
        """Emit one assign per assigned parameter, ordered after the readers of @p."""
        g = self.graph
        g.outputs = outputs
        written = {self.param_inputs[k] for k in self.assigned}
        reads: dict[Value, Value] = {}
        for k, (p, value, loc) in self.assigned.items():
            if value in written and value is not self.param_inputs[k]:
                # `assign(a, b)` with the old value of a b that is assigned too: read @b in a
                # node of its own, which assign(@b) can be ordered after. Two assigns reading
                # each other's @p directly (a swap through a temporary) could not be ordered.
                if value not in reads:
                    reads[value] = g.add_node("depend", [value], loc=loc).out
                self.assigned[k] = (p, reads[value], loc)
        producer = producers(g)
        index = {id(n): i for i, n in enumerate(g.nodes)}
        # Every reader, dead ones too: only live ones must be ordered (the verifier's rule), and
        # dce drops the edges to the others.
        readers: dict[Value, list] = {}
        for n in g.nodes:
            for v in n.inputs:
                if v.kind == "param":
                    readers.setdefault(v, []).append(n)
        for p, value, loc in self.assigned.values():
            target = self.read_input(p)
            late = unordered_readers([value], readers.get(target, []), producer, index)
            node = g.add_node("assign", [target, value], loc=loc,
                              after=[r.outputs[0] for r in late])
            g.effects.append(node.out)
        for node in self.maps:  # a mapped update waits for every other reader of what it writes
            others = dict.fromkeys(x for k, (n, *_) in self.map_writes.items() if n is node
                                   for x in readers.get(self.param_inputs[k], ()) if x is not node)
            late = unordered_readers(node.operands(), list(others), producer, index)
            node.after += [r.outputs[0] for r in late]
            g.effects.append(node.outputs[-1])
        if self.maps:  # a mapped update's new after edges may point past it
            toposort(g)
        return g

    def read_input(self, p: Parameter) -> Value:
        """The @name input of p (made on first use, by a read or by an assign)."""
        v = self.param_inputs.get(id(p))
        if v is None:
            other = self.params.get(p.name)
            if other is not None and other is not p:
                raise ParameterError(f"two different Parameters are named '{p.name}' in one "
                                     f"graph; give each a distinct name", loc=user_location())
            self.params[p.name] = p
            v = self.param_inputs[id(p)] = self.graph.add_input("param", p.name, p.type)
        return v


