"""Tracing a Python step function: its arguments become traced leaves (`arg` inputs, and
Parameters read as `@name`), it runs once in a `Trace`, and its results become the graph's
outputs. `bind_arguments` and `leaf_spec` say what a call's signature is (jit caches by it).
"""
from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import ArgumentError, SignatureError
from ..ir.graph import Graph
from ..ir.types import DTYPES, TensorType, to_dtype
from . import pytree
from .bind import WEAK_DTYPE, payload, py_kind
from .parameter import Parameter
from .tensor import EagerTensor, TracedTensor
from .traces import Trace, tracing

@dataclass
class Traced:
    """What a trace produced: the graph, and how to map user arguments and results onto it."""

    graph: Graph
    in_tree: pytree.TreeDef
    out_tree: pytree.TreeDef
    leaf_kinds: list[str]  # per input leaf: "arg", "param" or "none"
    params: dict[str, Parameter]


# Step functions' signatures, each worked out once (inspect.signature costs more than a
# step's checks). Keyed weakly: a step function closes over its Parameters and optimizer, so
# a strong key (an lru_cache's) kept every step's weights and state alive after its last use.
_SIGNATURES: weakref.WeakKeyDictionary[Callable, tuple[inspect.Signature | None,
                                                     tuple[str, ...] | None]] = \
    weakref.WeakKeyDictionary()


def _signature(fn: Callable) -> inspect.Signature | None:
    """fn's signature (None where inspect finds none), cached while fn lives."""
    return _signature_and_names(fn)[0]


def _signature_and_names(fn: Callable) -> tuple[inspect.Signature | None,
                                                tuple[str, ...] | None]:
    """fn's signature, and its parameters' names when every one is a plain positional or
    keyword parameter with no default (a call with that many positional arguments binds
    them in order: what a step called every iteration usually is)."""
    try:
        return _SIGNATURES[fn]
    except KeyError:
        cacheable = True
    except TypeError:  # unhashable, or no weak reference to it: worked out every call
        cacheable = False
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    plain = sig is not None and all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty
                                    for p in sig.parameters.values())
    entry = sig, (tuple(sig.parameters) if plain else None)
    if cacheable:
        _SIGNATURES[fn] = entry
    return entry


def bind_arguments(fn: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by parameter name, as Python would bind them."""
    sig, names = _signature_and_names(fn)
    if names is not None and not kwargs and len(args) == len(names):
        return dict(zip(names, args))  # what sig.bind gives, five times quicker
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
    kind = py_kind(x)
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
                   flat: tuple[list, list[str], pytree.TreeDef, list[tuple]] | None = None,
                   parallel: Any = None) -> Traced:
    """Trace fn on these arguments. `flat`: the arguments' leaves, paths, structure and leaf
    specs, when the caller (jit) has them already; `parallel`: the data-parallel strategy
    the step is traced for (Trace.parallel)."""
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
    trace.parallel = parallel
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
            t, weak = TensorType((), WEAK_DTYPE[py_kind(leaf)]), True
        else:
            t, weak = TensorType(spec[1], DTYPES[spec[2]]), spec[0] == "weak"
        proxies.append(TracedTensor(trace.graph.add_input("arg", arg_name, t), trace, weak))
        kinds.append("arg")
    with tracing(trace):
        call_args = pytree.unflatten(in_tree, proxies)  # (a row gradient: a node)
        pos, kw = _call_arguments(fn, call_args)
        result = fn(*pos, **kw)
        if parallel is not None:  # (what it checks once the step is traced)
            parallel.finish(trace)
        out_leaves, out_paths, out_tree = pytree.flatten(result)
        outputs = [payload(leaf, trace, None)[0] for leaf in out_leaves]
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
