"""The tracer: runs a Python step function on TracedTensors and records a Graph.

Every op goes through `bind`, in trace and in eager mode alike: it resolves weakly typed
values (Python scalars, and what ops make of them only: see docs/ir.md), checks the op's type
rule (errors carry the user's file:line), then either appends a node to the trace or computes
the result with the op's numpy semantics.

Parameters are read as `@name`; `assign` records the newest value of a parameter, and at the
end of the trace one `assign` per parameter is emitted, ordered after every node that read the
parameter's old value (the write-after-read edges).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import (ArgumentError, AssignError, ExecutionError, GraphoptError, OpTypeError,
                      ParameterError, SignatureError)
from ..ir.analysis import producers, toposort, unordered_readers
from ..ir.graph import Graph, Location, Value
from ..ir.opdefs import constant_value
from ..ir.registry import OpDef, evaluate, get_op
from ..ir.types import DTYPES, DType, TensorType, bool_, f64, i64, to_dtype, type_of_array
from . import pytree
from .parameter import Parameter
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


class Trace:
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

    def read_param(self, p: Parameter) -> Value:
        if id(p) in self.assigned:
            return self.assigned[id(p)][1]  # read after assign: the new value
        if id(p) in self.map_writes:  # read after a mapped update: that kernel's new value
            from .hypermap import new_value
            return new_value(*self.map_writes[id(p)])
        return self.read_input(p)

    # -- hooks a map trace (frontend/hypermap.py) overrides --------------------------------
    def param_type(self, p: Parameter) -> TensorType:
        """The type a value assigned to p must have."""
        return p.type

    def record_assign(self, p: Parameter, v: Value, loc: Location | None) -> None:
        if id(p) in self.map_writes:
            raise AssignError(f"assign to {p.name}: a mapped update (an optimizer step) already "
                              f"wrote it in this step", loc=loc)
        self.read_input(p)  # the parameter is an input of the graph even if never read
        self.assigned[id(p)] = (p, v, loc)

    def foreign(self, x: TracedTensor) -> Value:
        """A traced tensor of another trace used here: an error, except in a map trace."""
        raise GraphoptError("a traced tensor was used outside the trace that made it (did a "
                            "value escape a jitted function?)", loc=user_location())

    def check_op(self, op: OpDef, loc: Location | None) -> None:
        """An op about to be traced here (a map trace accepts elementwise ops only)."""

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


# -- binding ops --------------------------------------------------------------------------------
# The dtype of a weakly typed value: a Python scalar, or what ops compute from such values only.
# It keeps full precision until it meets a strongly typed tensor, where a cast rounds it once:
# lr=1e-3 or sqrt(2.0) in an f64 step is exact, not the nearest f32 (JAX with x64 enabled).
_WEAK_DTYPE = {bool: bool_, int: i64, float: f64}
_KIND = {"bool": bool, "int": int, "float": float}
_KIND_ORDER = (bool, int, float)  # weak meets weak: the later kind wins (True + 1 + 0.5 is float)


def _py_kind(x: Any) -> type | None:
    if isinstance(x, (bool, np.bool_)):
        return bool
    if isinstance(x, (int, np.integer)) and not isinstance(x, np.integer):
        return int
    if isinstance(x, float) and not isinstance(x, np.floating):
        return float
    return None


def _fits(kind: type, d: DType) -> bool:
    """Whether a weak value of `kind` may take dtype d (never float into an int)."""
    return kind is bool or (kind is int and d.kind != "bool") or d.is_float


class _Operand:
    """One operand on its way into an op: a Value (trace), an array (eager) or a Python scalar
    still waiting for its dtype."""

    __slots__ = ("payload", "type", "weak")

    def __init__(self, payload: Any, type: TensorType | None, weak: bool):
        self.payload, self.type, self.weak = payload, type, weak

    def kind(self) -> type:
        """bool, int or float: what promotion sees of a weak operand."""
        return _py_kind(self.payload) if self.type is None else _KIND[self.type.dtype.kind]

    def describe(self) -> str:
        """How an error names a weak operand."""
        kind = self.kind().__name__
        return f"a Python {kind}" if self.type is None else \
            f"a weakly typed value (a Python {kind}, or computed from Python scalars only)"


def _operand(x: Any, trace: Trace | None) -> _Operand:
    if isinstance(x, TracedTensor):
        if trace is None:
            raise GraphoptError("a traced tensor was used outside the trace that made it (did a "
                                "value escape a jitted function?)", loc=user_location())
        if x.trace is not trace:
            v = trace.foreign(x)
            return _Operand(v, v.type, x.weak)
        return _Operand(x.value, x.type, x.weak)
    if isinstance(x, Parameter):
        if trace is None:
            return _Operand(x._value, x.type, False)
        v = trace.read_param(x)  # in a map trace: one element of it
        return _Operand(v, v.type, False)
    if isinstance(x, EagerTensor):
        o = _operand(x.array, trace)
        o.weak = x.weak
        return o
    if _py_kind(x) is not None:
        return _Operand(x, None, True)
    if isinstance(x, (np.ndarray, np.generic)):
        a = np.asarray(x)
        try:
            return _Operand(a, type_of_array(a), False)
        except TypeError as e:
            raise OpTypeError(str(e), loc=user_location()) from None
    raise OpTypeError(f"cannot use a {type(x).__name__} as a tensor operand", loc=user_location())


def _resolve_weak(op: OpDef, operands: list[_Operand], loc: Location | None) -> bool:
    """Give each weak operand a dtype, by JAX's rule within the op's dtype group (an operand
    outside it, like where's condition, on its own), and say whether the result is weak: when
    the whole group is and the op does not fix the result's dtype (comparisons, cast)."""
    if not any(o.weak for o in operands):  # the common case, quickly
        return False
    group = range(len(operands)) if op.dtype_group is None else op.dtype_group
    _promote(op.name, [operands[i] for i in group], loc)
    for i, o in enumerate(operands):
        if i not in group:
            _promote(op.name, [o], loc)
    return bool(group) and not op.fixed_dtype and all(operands[i].weak for i in group)


def _promote(opname: str, members: list[_Operand], loc: Location | None) -> None:
    """The weak members take the dtype of the strong ones (the type rule checks that those
    agree), or, when all are weak, the weak dtype of the highest kind among them."""
    weak = [o for o in members if o.weak]
    if not weak:
        return
    strong = [o.type.dtype for o in members if not o.weak]
    target = strong[0] if strong else \
        _WEAK_DTYPE[max((o.kind() for o in weak), key=_KIND_ORDER.index)]
    for o in weak:
        if not _fits(o.kind(), target):
            raise OpTypeError(f"{opname}: {o.describe()} cannot take the dtype {target} of the "
                              f"tensor it meets; cast explicitly with .astype(...)", loc=loc)
        _take_dtype(o, target, loc)


def _take_dtype(o: _Operand, d: DType, loc: Location | None) -> None:
    """A weak operand gets dtype d: a Python scalar as its type, a weak tensor by a cast."""
    if o.type is None:
        o.type = TensorType((), d)
    elif o.type.dtype != d:
        _convert(o, "cast", {"dtype": d}, TensorType(o.type.shape, d), loc)


def _convert(o: _Operand, opname: str, attrs: dict[str, Any], t: TensorType,
             loc: Location | None) -> None:
    """Apply a cast or broadcast_to to an operand: a node in a trace, computed now in eager."""
    if isinstance(o.payload, Value):
        o.payload = current_trace().graph.add_node(opname, [o.payload], attrs, loc=loc).out
    else:
        o.payload = evaluate(get_op(opname), [np.asarray(o.payload)], attrs, [t])[0]
    o.type = t


def bind(opname: str, operands: Sequence[Any], attrs: dict[str, Any] | None = None) -> Tensor:
    """Apply a registered op: add a node to the current trace, or compute it eagerly."""
    op = get_op(opname)
    attrs = dict(attrs or {})
    loc = user_location()
    trace = current_trace()
    if trace is not None:
        trace.check_op(op, loc)
    ops_in = [_operand(x, trace) for x in operands]
    weak_result = _resolve_weak(op, ops_in, loc)
    types = [o.type for o in ops_in]
    try:
        out_types = op.infer(types, attrs)
    except OpTypeError as e:
        raise OpTypeError(e.message, loc=loc) from None
    if trace is not None:
        values = [o.payload if isinstance(o.payload, Value) else
                  _constant(trace, o.payload, o.type, loc) for o in ops_in]
        node = trace.graph.add_node(opname, values, attrs, loc=loc, out_types=out_types)
        return TracedTensor(node.out, trace, weak_result)
    arrays = [np.asarray(o.payload, dtype=o.type.dtype.np_dtype) for o in ops_in]
    try:
        with np.errstate(all="ignore"):
            out = evaluate(op, arrays, attrs, out_types)[0]
    except GraphoptError:
        raise
    except Exception as e:  # numpy's own error, as the interpreter reports it under jit
        raise ExecutionError(f"{opname} failed: {e}", loc=loc) from None
    # A shape op returns a view; of a Parameter's buffer, a later eager assign would change it,
    # where the traced step keeps the value it read.
    return EagerTensor(out if out.flags.owndata else out.copy(), weak_result)


def _constant(trace: Trace, x: Any, t: TensorType, loc: Location | None) -> Value:
    attrs = {"value": constant_value(x, t.dtype), "shape": t.shape, "dtype": t.dtype}
    return trace.graph.add_node("constant", [], attrs, loc=loc, out_types=[t]).out


# -- assign ---------------------------------------------------------------------------------------
def assign(param: Parameter, value: Any) -> None:
    """At the end of the step, `param` holds `value`; reads after this see `value`."""
    loc = user_location()
    if not isinstance(param, Parameter):
        raise AssignError(f"assign needs a graphopt.Parameter as its target, got "
                          f"{type(param).__name__}", loc=loc)
    trace = current_trace()
    want = trace.param_type(param) if trace is not None else param.type
    o = _operand(value, trace)
    if o.weak:  # a weak value takes the parameter's dtype where its kind allows; a scalar fills it
        if not _fits(o.kind(), param.dtype):
            raise AssignError(f"assign to {param.name}: {o.describe()} cannot be stored in a "
                              f"{param.dtype} parameter", loc=loc)
        if o.type is None:
            o.type = want
        elif o.type.shape in ((), want.shape):
            _take_dtype(o, param.dtype, loc)
            if o.type != want:
                _convert(o, "broadcast_to", {"shape": want.shape}, want, loc)
    if o.type != want:
        raise AssignError(f"assign to {param.name}: the value is {o.type} but the parameter is "
                          f"{want}", loc=loc)
    if trace is None:
        np.copyto(param._value, np.asarray(o.payload, dtype=param.dtype.np_dtype))
        return
    v = o.payload if isinstance(o.payload, Value) else _constant(trace, o.payload, o.type, loc)
    trace.record_assign(param, v, loc)


def depend(x: Any, *after: Any) -> Tensor:
    """x, ordered after the given tensors: an ordering edge with no data (eager: x itself)."""
    trace = current_trace()
    if trace is None:
        if isinstance(x, Parameter):  # its value now, as a traced depend reads @p's value now
            return EagerTensor(x.numpy())
        if isinstance(x, Tensor):
            return x
        o = _operand(x, None)  # (what an op would refuse, depend refuses)
        return EagerTensor(np.asarray(o.payload), o.weak)
    loc = user_location()
    o = _operand(x, trace)
    if o.type is None:
        o.type = TensorType((), _WEAK_DTYPE[o.kind()])
    v = o.payload if isinstance(o.payload, Value) else _constant(trace, o.payload, o.type, loc)
    edges = [_operand(a, trace).payload for a in after]
    if not all(isinstance(e, Value) for e in edges):
        raise GraphoptError("depend orders after traced tensors or Parameters only", loc=loc)
    node = trace.graph.add_node("depend", [v], loc=loc, after=edges)
    return TracedTensor(node.out, trace, o.weak)


# -- tracing a function ---------------------------------------------------------------------------
@dataclass
class Traced:
    """What a trace produced: the graph, and how to map user arguments and results onto it."""

    graph: Graph
    in_tree: pytree.TreeDef
    out_tree: pytree.TreeDef
    leaf_kinds: list[str]  # per input leaf: "arg", "param" or "none"
    params: dict[str, Parameter]


@functools.lru_cache(maxsize=512)
def _signature(fn: Callable) -> inspect.Signature | None:
    """fn's signature, worked out once (inspect.signature costs more than a step's checks)."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def bind_arguments(fn: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by parameter name, as Python would bind them."""
    try:
        sig = _signature(fn)
    except TypeError:  # an unhashable callable
        sig = None
    if sig is None:
        return {f"arg{i}": a for i, a in enumerate(args)} | kwargs
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise SignatureError(f"{getattr(fn, '__name__', 'step')}(): {e}") from None
    arguments = bound.arguments
    params = sig.parameters.values()
    if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return dict(arguments)
    # `*args` is a tuple and `**kwargs` a dict even when empty (the structure does not depend
    # on whether the call had any); the dict's names sorted: their order in a call changes
    # no argument.
    out = {}
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            out[p.name] = arguments.get(p.name, ())
        elif p.kind is p.VAR_KEYWORD:
            extra = arguments.get(p.name, {})
            out[p.name] = {k: extra[k] for k in sorted(extra)}
        elif p.name in arguments:
            out[p.name] = arguments[p.name]
    return out


def leaf_spec(x: Any, path: str) -> tuple:
    """The part of a signature one argument leaf contributes (values of scalars excluded)."""
    if type(x) is np.ndarray and x.dtype in _SUPPORTED:  # the common case, first and quick
        return ("array", x.shape, _SUPPORTED[x.dtype])
    if isinstance(x, Parameter):
        return ("param", id(x))
    if isinstance(x, EagerTensor):
        if x.weak:  # made eagerly from Python scalars: weak in the trace too
            return ("weak", x.shape, x.dtype.name)
        x = x.array
    kind = _py_kind(x)
    if kind is not None:
        return ("scalar", kind.__name__)
    if isinstance(x, (np.ndarray, np.generic)):
        try:
            return ("array", x.shape, to_dtype(x.dtype).name)
        except TypeError as e:
            raise SignatureError(f"argument '{path}': {e}") from None
    raise SignatureError(f"argument '{path}' is a {type(x).__name__}; a step takes numpy arrays, "
                         f"Python scalars, Parameters, and lists/tuples/dicts of them")


_SUPPORTED = {d.np_dtype: d.name for d in DTYPES.values()}


def trace_function(fn: Callable, args: tuple, kwargs: dict | None = None,
                   flat: tuple[list, list[str], pytree.TreeDef, list[tuple]] | None = None
                   ) -> Traced:
    """Trace fn on these arguments. `flat`: the arguments' leaves, paths, structure and leaf
    specs, when the caller (jit) has them already."""
    if not callable(fn):
        raise ArgumentError(f"the function to trace must be callable, got "
                            f"{type(fn).__name__} {fn!r}")
    name = pytree.ir_name(getattr(fn, "__name__", "step").strip("<>")) or "step"
    if flat is None:
        leaves, paths, in_tree = pytree.flatten(bind_arguments(fn, args, kwargs or {}))
        specs = [leaf_spec(x, p) for x, p in zip(leaves, paths)]
    else:
        leaves, paths, in_tree, specs = flat
    trace = Trace(name)
    proxies, kinds, used = [], [], set()
    for leaf, path, spec in zip(leaves, paths, specs):
        if spec[0] == "param":
            proxies.append(leaf)
            kinds.append("param")
            continue
        arg_name = pytree.ir_name(path)
        while arg_name in used:
            arg_name += "_"
        used.add(arg_name)
        if spec[0] == "scalar":
            t, weak = TensorType((), _WEAK_DTYPE[_py_kind(leaf)]), True
        else:
            t, weak = TensorType(spec[1], DTYPES[spec[2]]), spec[0] == "weak"
        proxies.append(TracedTensor(trace.graph.add_input("arg", arg_name, t), trace, weak))
        kinds.append("arg")
    call_args = pytree.unflatten(in_tree, proxies)
    with tracing(trace):
        pos, kw = _call_arguments(fn, call_args)
        result = fn(*pos, **kw)
        out_leaves, out_paths, out_tree = pytree.flatten(result)
        outputs = []
        for leaf, path in zip(out_leaves, out_paths):
            o = _operand(leaf, trace)
            if o.type is None:
                o.type = TensorType((), _WEAK_DTYPE[o.kind()])
            outputs.append(o.payload if isinstance(o.payload, Value) else
                           _constant(trace, o.payload, o.type, None))
    graph = trace.finish(outputs)
    return Traced(graph, in_tree, out_tree, kinds, dict(trace.params))


def _call_arguments(fn: Callable, bound: dict[str, Any]) -> tuple[tuple, dict]:
    """The positional and keyword arguments that bind to `bound` again (bind_arguments'
    result, its leaves replaced by tracers): a `*args` tuple is spread, a `**kwargs` dict
    passed by name, as in the user's call."""
    sig = None
    try:
        sig = _signature(fn)
    except TypeError:  # an unhashable callable
        pass
    if sig is None:  # no signature: bind_arguments named them arg0, arg1, ..., then kwargs
        n = 0
        while f"arg{n}" in bound:
            n += 1
        pos = [f"arg{i}" for i in range(n)]
        return tuple(bound[k] for k in pos), {k: v for k, v in bound.items() if k not in pos}
    ba = inspect.BoundArguments(sig, dict(bound))  # type: ignore[arg-type]
    return ba.args, ba.kwargs


def trace(fn: Callable, *args: Any, **kwargs: Any) -> Graph:
    """Trace `fn` on example arguments and return its Graph (verified)."""
    return trace_function(fn, args, kwargs).graph.verify()
