"""Reverse-mode automatic differentiation as a transformation of the traced IR.

`value_and_grad(fn, wrt=..., argnums=..., has_aux=...)` returns a function that, called inside
a trace (a `jit` step), does three things in that trace:

1. **Variables.** Each differentiated argument leaf gets a fresh SSA name (a `depend` node with
   no after edges), so an array passed twice, or also closed over, gets one gradient per
   position. A Parameter in `wrt` is differentiated at its current value in the step: `@p`,
   or the value of an earlier `assign`.
2. **Forward.** `fn` runs with the trace active: its nodes land in the step's graph like any
   others. They are the nodes appended from here on (the *region*).
3. **Backward.** The region is walked in reverse (a reverse topological order), from the
   output. Each node whose output has a cotangent applies its op's VJP rule (the table in
   `rules.py`, one entry per op) once per input that can carry a gradient; the rules are
   written with `graphopt.ops`, so the backward pass is made of ordinary nodes, appended to
   the same graph through the same `bind` path. A value used several times gets the sum of
   its cotangents; a gradient of a broadcast input is summed back to the input's shape
   (`sum_to_shape`, the one place that does it).

Forward, backward and the optimizer update that follows are then one graph, so dead-code
elimination, CSE and fusion work across all three. Called outside any trace (eager mode), the
same function is traced into a graph of its own, transformed the same way, and run by the
interpreter: one transformation, not two.

Which values get gradients: floats computed from a variable through inputs whose VJP rule is
not None. `stop_gradient`, integer casts, comparisons, integer labels and indices cut the
flow. A requested gradient is always a tensor of its variable's shape and dtype, *zeros* when
no differentiable path leads from the variable to the output (an integer argument included),
or a row gradient of it (`Rows`) when every use of the variable is a sparse embedding lookup
(`ops.embedding(..., sparse=True)`). Cotangents add up as they meet: two row gradients into
one holding both's rows, a row gradient and a dense one into the dense sum.

Every node the backward pass adds carries a `GradLocation`: the file:line of the forward node
it differentiates (as JAX's source info names the transpose), so a dump with locations shows
which line each gradient node comes from and the memory report (`ir/liveness.py`) can tell
forward from backward.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import GradientError, NotDifferentiableError
from ..ir.graph import GradLocation, Location, Node, Value
from ..ir.types import TensorType
from ..frontend import pytree
from ..frontend.parameter import Parameter
from ..frontend.rows import Rows
from ..frontend.tensor import EagerTensor, Tensor, TracedTensor
from ..frontend.traces import Trace, current_trace, user_location
from ..frontend.tracer import trace_function
from .rules import VJP, WHY_NOT

# Traces in which a function is being differentiated right now: a value_and_grad called in
# one of them would be a nested (higher-order) gradient, which is not supported.
_DIFFERENTIATING: set[int] = set()


# -- the shared broadcasting helper --------------------------------------------------------------
def sum_to_shape(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum a gradient of a broadcast result back to the shape of the input that was broadcast.

    numpy broadcasting prepends axes and stretches size-1 axes; the reverse of both is a sum
    over those axes (then a reshape that drops the prepended ones)."""
    from .. import ops
    if g.shape == shape:
        return g
    lead = len(g.shape) - len(shape)
    assert lead >= 0, f"a gradient {g.shape} smaller than its input {shape}"
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                      if s == 1 and g.shape[lead + i] != 1)
    if axes:
        g = ops.sum(g, axes)
    return ops.reshape(g, shape) if g.shape != shape else g


# -- the transformation --------------------------------------------------------------------------
def _active_values(region: Sequence[Node], variables: Sequence[Value]) -> set[Value]:
    """The values a gradient can reach: floats computed from a variable through an input whose
    VJP rule is not None. An op without any VJP still passes activity on, so that a gradient
    that needs to go through it is reported instead of silently dropped."""
    active = {v for v in variables if v.dtype.is_float}
    for node in region:
        rules = VJP.get(node.op)
        if any(v in active and (rules is None or rules[i] is not None)
               for i, v in enumerate(node.inputs)):
            active.update(o for o in node.outputs
                          if isinstance(o.type, TensorType) and o.type.dtype.is_float)
    return active


def _mark_backward(nodes: Sequence[Node], loc: Location | None) -> None:
    """Give nodes the backward form of a forward node's location (see GradLocation)."""
    for n in nodes:
        base = loc or n.loc
        n.loc = GradLocation(base.file, base.line, base.more) if base else \
            GradLocation("<autodiff>", 0)


def backprop(trace: Trace, start: int, loss: Value, variables: Sequence[Value]) -> list[Tensor]:
    """Append the backward pass of `loss` over the nodes `trace.graph.nodes[start:]` and return
    the gradient of each variable (zeros where none reaches it)."""
    from .. import ops
    graph = trace.graph
    region = graph.nodes[start:]
    active = _active_values(region, variables)

    def tensor(v: Value) -> TracedTensor:
        return TracedTensor(v, trace)

    loss_loc = loss.node.loc if loss.node else None
    cotangents: dict[Value, Tensor] = {}
    if loss in active:
        with _Emitting(graph.nodes, loss_loc):
            cotangents[loss] = ops.ones_like(tensor(loss))  # d loss / d loss
    for node in reversed(region):
        cts = [cotangents.pop(o, None) for o in node.outputs]
        if all(ct is None for ct in cts):
            continue  # nothing downstream asked for a gradient through this node
        rules = VJP.get(node.op)
        if rules is None or len(node.outputs) != 1:
            why = f" ({WHY_NOT[node.op]})" if node.op in WHY_NOT else ""
            raise NotDifferentiableError(
                f"op '{node.op}' has no VJP rule{why}, and a gradient has to flow through it; "
                f"wrap its input in graphopt.stop_gradient if it needs none", loc=node.loc)
        inputs = [tensor(v) for v in node.inputs]
        with _Emitting(graph.nodes, node.loc):
            for x, rule in zip(node.inputs, rules):
                if rule is None or x not in active:
                    continue
                try:
                    g = rule(cts[0], tensor(node.out), *inputs, **node.attrs)
                except NotDifferentiableError as e:  # a rule that refuses these attributes
                    if e.loc is not None:
                        raise
                    raise NotDifferentiableError(e.message, loc=node.loc) from None
                g = sum_to_shape(g, x.shape)
                assert (g.type.dense if isinstance(g, Rows) else g.type) == x.type, \
                    (node.op, g.type, x.type)
                cotangents[x] = add_cotangents(cotangents[x], g) if x in cotangents else g
    grads = []
    with _Emitting(graph.nodes, loss_loc):
        for v in variables:
            grads.append(cotangents[v] if v in cotangents else ops.zeros_like(tensor(v)))
    return grads


def add_cotangents(a: Tensor | Rows, b: Tensor | Rows) -> Tensor | Rows:
    """Two cotangents of one value added: two row gradients into one holding the rows of
    both (concatenated: repeated indices add up wherever it is used), a row gradient and a
    dense one into the dense sum."""
    from .. import ops
    if isinstance(a, Rows) and isinstance(b, Rows):
        return ops.rows(ops.concat([a.indices, b.indices]), ops.concat([a.values, b.values]),
                        a.shape)
    return (a.dense() if isinstance(a, Rows) else a) + (b.dense() if isinstance(b, Rows) else b)


class _Emitting:
    """Marks the nodes appended to a node list between enter and exit as backward nodes."""

    def __init__(self, nodes: list[Node], loc: Location | None):
        self.nodes, self.loc = nodes, loc

    def __enter__(self) -> None:
        self.mark = len(self.nodes)

    def __exit__(self, *exc: Any) -> None:
        _mark_backward(self.nodes[self.mark:], self.loc)


# -- the user-facing functions ---------------------------------------------------------------------
@dataclass(frozen=True)
class _Request:
    """What a value_and_grad call differentiates and how it shapes the result."""

    fn: Callable
    params: tuple[Parameter, ...]  # the leaves of `wrt`
    wrt_tree: pytree.TreeDef | None  # None: no `wrt`
    argnums: tuple[int, ...]
    one_argnum: bool  # argnums was an int: the argument gradient is not wrapped in a tuple
    has_aux: bool


def value_and_grad(fn: Callable, wrt: Any = None, argnums: int | Sequence[int] | None = None,
                   has_aux: bool = False) -> Callable:
    """`fn`'s value and its gradients, by reverse-mode differentiation of the traced graph.

    Works inside `jit` (the backward becomes part of the step's graph) and eagerly (the
    function is traced into its own graph and run by the interpreter, so it has jit's rules:
    no Python control flow on tensor values).

    Args:
        fn: a function that returns a float scalar, or `(scalar, aux)` with has_aux.
        wrt: Parameters to differentiate with respect to: one, or a list, tuple or dict of
            them; the gradients mirror its structure, like MindSpore's
            `value_and_grad(fn, grad_position, weights)`.
        argnums: positional arguments to differentiate with respect to, like JAX: an int
            gives that argument's gradient, in its structure; a tuple gives a tuple of
            them. None (the default) is 0 without `wrt`, no argument with it.
        has_aux: fn returns `(scalar, aux)`; aux is passed through, not differentiated.

    Returns:
        A function of fn's arguments that returns `(value, grads)`; value is
            `(scalar, aux)` with has_aux, and with both `argnums` and `wrt` grads is
            `(argument gradients, parameter gradients)`.

    Raises:
        GradientError: fn is not callable, a bad `wrt`, `argnums` or `has_aux`, and, when
            the function is called, a non-scalar or integer output, a function that assigns
            what it differentiates, or a nested value_and_grad (higher order).
    """
    if not callable(fn):
        raise GradientError(f"value_and_grad differentiates a function, got "
                            f"{type(fn).__name__} {fn!r}", loc=user_location())
    if not isinstance(has_aux, bool):
        raise GradientError(f"has_aux must be True or False, got {has_aux!r}",
                            loc=user_location())
    params, wrt_tree = _check_wrt(wrt)
    if argnums is None:
        argnums = () if wrt is not None else 0
    one = isinstance(argnums, int) and not isinstance(argnums, bool)
    nums = (argnums,) if one else tuple(argnums) if isinstance(argnums, (tuple, list)) else None
    if nums is None or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in nums):
        raise GradientError(f"argnums must be a non-negative int or a tuple of them, got "
                            f"{argnums!r}", loc=user_location())
    request = _Request(fn, params, wrt_tree, nums, one, has_aux)

    @functools.wraps(fn)
    def value_and_grad_fn(*args: Any, **kwargs: Any) -> Any:
        trace = current_trace()
        if trace is None:
            return _run_eagerly(value_and_grad_fn, args, kwargs)
        return _transform(trace, request, args, kwargs)

    return value_and_grad_fn


def grad(fn: Callable, wrt: Any = None, argnums: int | Sequence[int] | None = None,
         has_aux: bool = False) -> Callable:
    """Like value_and_grad, but returns only the gradients (`(grads, aux)` with has_aux)."""
    both = value_and_grad(fn, wrt, argnums, has_aux)

    @functools.wraps(fn)
    def grad_fn(*args: Any, **kwargs: Any) -> Any:
        value, grads = both(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads

    return grad_fn


def _check_wrt(wrt: Any) -> tuple[tuple[Parameter, ...], pytree.TreeDef | None]:
    if wrt is None:
        return (), None
    leaves, paths, tree = pytree.flatten(wrt)
    for leaf, path in zip(leaves, paths):
        if not isinstance(leaf, Parameter):
            where = f"wrt[{path}]" if path else "wrt"
            raise GradientError(f"{where} is a {type(leaf).__name__}: wrt takes Parameters (one, "
                                f"or a list, tuple or dict of them); differentiate with respect "
                                f"to an argument with argnums", loc=user_location())
    return tuple(leaves), tree


def _positional(fn: Callable, args: tuple, kwargs: dict) -> tuple[list, dict]:
    """The call's arguments with every one that can be positional made positional, so argnums
    count the same whether an argument came by position or by name (jit passes names)."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return list(args), dict(kwargs)
    return list(bound.args), dict(bound.kwargs)


def _transform(trace: Trace, req: _Request, args: tuple, kwargs: dict) -> Any:
    name = getattr(req.fn, "__name__", "fn")
    if id(trace) in _DIFFERENTIATING:
        raise GradientError("value_and_grad inside a function that is being differentiated: "
                            "higher-order gradients are not supported", loc=user_location())
    pos, kw = _positional(req.fn, args, kwargs)
    for i in req.argnums:
        if i >= len(pos):
            raise GradientError(f"argnums asks for argument {i} of {name}(), which got "
                                f"{len(pos)} positional argument(s)", loc=user_location())
    arg_vars = _variables(pos, req.argnums)
    param_values = [trace.read_param(p) for p in req.params]
    start = len(trace.graph.nodes)
    out, aux = _forward(trace, req, pos, kw, param_values, name)
    loss = _loss_value(trace, out, name)
    grads_out = _backward(trace, req, start, loss, arg_vars, param_values)
    value = TracedTensor(loss, trace)
    return ((value, aux) if req.has_aux else value), grads_out


def _variables(pos: list, argnums: Sequence[int]) -> list[tuple[list[Tensor], pytree.TreeDef]]:
    """Step 1: a fresh name (a depend) for every leaf of each differentiated argument, put in
    its place in `pos`; the leaves and structure of each."""
    from .. import ops
    arg_vars = []
    for i in argnums:
        leaves, _, tree = pytree.flatten(pos[i])
        aliases = [ops.depend(leaf) for leaf in leaves]
        pos[i] = pytree.unflatten(tree, aliases)
        arg_vars.append((aliases, tree))
    return arg_vars


def _forward(trace: Trace, req: _Request, pos: list, kw: dict, param_values: list[Value],
             name: str) -> tuple[Any, Any]:
    """Step 2: fn runs in the trace (its nodes are the ones appended from here on); it may not
    assign a Parameter it is differentiated with respect to. Its output and aux."""
    _DIFFERENTIATING.add(id(trace))
    try:
        result = req.fn(*pos, **kw)
    finally:
        _DIFFERENTIATING.discard(id(trace))
    for p, v in zip(req.params, param_values):
        if trace.read_param(p) is not v:
            raise GradientError(f"{name}() assigns Parameter '{p.name}', which it is "
                                f"differentiated with respect to; assign it after "
                                f"value_and_grad returns", loc=user_location())
    return _split_aux(result, req.has_aux, name)


def _backward(trace: Trace, req: _Request, start: int, loss: Value,
              arg_vars: list[tuple[list[Tensor], pytree.TreeDef]],
              param_values: list[Value]) -> Any:
    """Step 3: the backward pass, and the gradients in the structure value_and_grad returns:
    by argument, by Parameter (`wrt`), or both."""
    variables = [t.value for leaves, _ in arg_vars for t in leaves] + param_values
    grads = iter(backprop(trace, start, loss, variables))
    arg_grads = [pytree.unflatten(tree, [next(grads) for _ in leaves]) for leaves, tree in arg_vars]
    param_grads = [next(grads) for _ in req.params]
    if trace.parallel is not None:  # data parallelism: averaged over the ranks
        param_grads = trace.parallel.gradients(req.params, param_grads)
    by_arg = arg_grads[0] if req.one_argnum else tuple(arg_grads)
    by_param = pytree.unflatten(req.wrt_tree, param_grads) if req.wrt_tree else None
    if req.wrt_tree is None:
        return by_arg
    return (by_arg, by_param) if req.argnums else by_param


def _split_aux(result: Any, has_aux: bool, name: str) -> tuple[Any, Any]:
    if not has_aux:
        return result, None
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise GradientError(f"with has_aux=True, {name}() must return (output, aux), got "
                            f"{type(result).__name__}", loc=user_location())
    return result[0], result[1]


def _loss_value(trace: Trace, out: Any, name: str) -> Value:
    """The Value of fn's output, which must be a float scalar of this trace."""
    if isinstance(out, Parameter):
        value = trace.read_param(out)
    elif isinstance(out, TracedTensor) and out.trace is trace:
        value = out.value
    else:
        raise GradientError(f"{name}() must return a tensor computed in the step (a float "
                            f"scalar), got {type(out).__name__}", loc=user_location())
    t = value.type
    if t.shape != () or not t.dtype.is_float:
        raise GradientError(f"{name}() returned {t}: value_and_grad differentiates a float "
                            f"scalar. Reduce the output first (.sum(), .mean()); for the "
                            f"vector-Jacobian product with a cotangent c, differentiate "
                            f"(out * c).sum()", loc=user_location())
    return value


def _run_eagerly(value_and_grad_fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Eager mode: trace the call into a graph of its own (where `value_and_grad_fn` finds a
    trace and transforms it), run it with the interpreter, commit its assigns.

    Every call traces afresh, as eager code sees the current values of everything it closes
    over; a step that is called many times belongs under `jit`."""
    from ..compile.executable import Executable

    def step(args: tuple, kwargs: dict) -> Any:
        return value_and_grad_fn(*args, **kwargs)

    step.__name__ = getattr(value_and_grad_fn, "__name__", "step")
    traced = trace_function(step, (args, kwargs))
    traced.graph.verify()
    leaves, paths, _ = pytree.flatten({"args": args, "kwargs": kwargs})
    # No passes: eager mode runs what the code says, node by node.
    results = Executable(step, traced, "interpreter", passes="").run(leaves, paths)
    out_leaves, _, out_tree = pytree.flatten(results)
    return pytree.unflatten(out_tree, [EagerTensor(a) for a in out_leaves])
