"""hypermap: trace one update rule once and map it over many tensors (MindSpore's HyperMap).

An optimizer applies the same rule to each of its parameters. Traced parameter by parameter,
a step over 1,000 parameters is 1,000 copies of the rule: a graph of tens of thousands of
nodes that the passes later fuse back into one multi-tensor kernel. `hypermap` goes there
directly: it runs the rule once, on one *element* of the first instance's tensors, and makes
the multi-tensor kernel (ir/kernel.py) that applies that body to every instance:

    hypermap(lambda: rule(slot0, grad0), [{"p": p0, "m": m0, "g": g0}, {"p": p1, ...}, ...])

Each instance is a dict from a *role* to a Parameter or a traced tensor; the rule is traced
with the first instance's objects, and wherever it touches one of them, the body reads the
role instead. Other tensors it uses must be scalars (a learning rate, a bias correction): they
become operands every instance shares. An `assign` to a role's Parameter becomes a store of
the kernel, an in-place update. A rule that uses anything but elementwise ops (a norm, a
matmul), or instances whose tensors do not line up, raise MapUnsupported, and the caller
traces tensor by tensor instead; nothing was added to the graph.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

from ..errors import GraphoptError
from ..ir.graph import Location, Node, Value
from ..ir.kernel import infer_types
from ..ir.registry import CONSTANT, ELEMENTWISE, OpDef
from ..ir.types import TensorType
from . import traces
from .parameter import Parameter
from .tensor import TracedTensor


def _scalar_ops() -> frozenset[str]:
    from ..ir.registry import REGISTRY
    return frozenset(name for name, op in REGISTRY.items() if op.category in (ELEMENTWISE,
                                                                              CONSTANT))


class MapUnsupported(GraphoptError):
    """The rule or the instances do not fit one multi-tensor kernel."""


class MapTrace(traces.Trace):
    """The trace of one element of the rule: a kernel body."""

    def __init__(self, parent: traces.Trace, roles: dict[int, Hashable]):
        super().__init__("kernel")
        self.parent = parent
        self.roles = roles  # id(first instance's object) -> role
        self.inputs: list[tuple[str, Any]] = []  # ("role", role) or ("shared", outer Value)
        self.by_key: dict[Any, Value] = {}
        self.stores: dict[Hashable, tuple[Value, Location | None]] = {}
        # path -> (op, attrs, number of inputs, the (position, value) of its shared scalars)
        self.chain: dict[tuple, tuple[str, dict, int, tuple]] = {}
        self._readers: dict[Value, int] | None = None

    def _input(self, key: tuple[str, Any], t: TensorType) -> Value:
        if key not in self.by_key:
            self.inputs.append(key)
            self.by_key[key] = self.graph.add_input("arg", f"x{len(self.inputs) - 1}",
                                                    TensorType((), t.dtype))
        return self.by_key[key]

    def read_param(self, p: Parameter) -> Value:
        role = self.roles.get(id(p))
        if role is None:  # a Parameter of no instance: a scalar every instance shares
            if p.shape != ():
                raise MapUnsupported(f"the rule reads {p.name}, which is no instance's")
            return self._input(("shared", self.parent.read_param(p)), p.type)
        if role in self.stores:
            return self.stores[role][0]  # read after assign: the new value
        return self._input(("role", (role,)), p.type)

    def param_type(self, p: Parameter) -> TensorType:
        return TensorType((), p.dtype)

    def record_assign(self, p: Parameter, v: Value, loc: Location | None) -> None:
        role = self.roles.get(id(p))
        if role is None:
            raise MapUnsupported(f"the rule assigns {p.name}, which is no instance's")
        self._input(("role", (role,)), p.type)  # the kernel's in/out operand
        self.stores[role] = (v, loc)

    def foreign(self, x: TracedTensor) -> Value:
        role = self.roles.get(id(x))
        if role is not None:
            return self._tensor(x.value, (role,))
        if x.trace is not self.parent or x.shape != ():
            raise MapUnsupported(f"the rule uses a {x.type} tensor that is no instance's")
        return self._scalar(x.value)

    def _tensor(self, v: Value, path: tuple) -> Value:
        """An instance's tensor in the body. When it is made by elementwise ops over tensors
        of its shape (a gradient scaled by clipping or unscaled by loss scaling) and nothing
        else has read it yet, that computation is copied into the body, as fusion would have
        done: the kernel then reads the tensors it was made from. `path` says where v sits
        under the role's tensor (the input positions walked), so every instance can be
        bound the same way; the op met at each step is kept in `chain`."""
        if ("copy", path) in self.by_key:
            return self.by_key[("copy", path)]
        n = v.node
        if n is None or n.after or n.op not in _SCALAR_OPS or n.opdef.category == CONSTANT or \
                len(n.outputs) != 1 or self.parent_readers(v) > 0 or \
                any(x.shape not in ((), v.shape) for x in n.inputs):
            return self._input(("role", path), v.type)
        # A scalar operand becomes one every instance shares: each instance must use the
        # same one (_walk checks), or the kernel would scale them all by the first's.
        scalars = tuple((k, x) for k, x in enumerate(n.inputs) if x.shape == () and v.shape != ())
        self.chain[path] = (n.op, n.attrs, len(n.inputs), scalars)
        args = [self._scalar(x) if (k, x) in scalars else self._tensor(x, path + (k,))
                for k, x in enumerate(n.inputs)]
        out = self.graph.add_node(n.op, args, n.attrs, loc=n.loc).out
        self.by_key[("copy", path)] = out
        return out

    def parent_readers(self, v: Value) -> int:
        """How many nodes of the enclosing trace read v so far (its use by the rule is not
        among them: the rule's nodes are in this trace)."""
        if self._readers is None:
            self._readers = {}
            for n in self.parent.graph.nodes:
                for x in n.operands():
                    self._readers[x] = self._readers.get(x, 0) + 1
        return self._readers.get(v, 0)

    def _scalar(self, v: Value) -> Value:
        """An outer scalar in the body: its computation copied in when it is elementwise over
        scalars (loop-invariant: the compiled loop does it once), else a shared operand.
        Every kernel then reads the step's few scalar inputs, not values made elsewhere."""
        if ("copy", v) in self.by_key:
            return self.by_key[("copy", v)]
        n = v.node
        if n is None or n.after or n.op not in _SCALAR_OPS or \
                any(x.shape != () for x in n.inputs):
            return self._input(("shared", v), v.type)
        if n.opdef.category == CONSTANT:
            out = self.graph.add_node("constant", [], n.attrs, loc=n.loc).out
        else:
            out = self.graph.add_node(n.op, [self._scalar(x) for x in n.inputs], n.attrs,
                                      loc=n.loc).out
        self.by_key[("copy", v)] = out
        return out

    def check_op(self, op: OpDef, loc: Location | None) -> None:
        if op.ordered:  # every rank runs it once, in order: never once per element
            raise MapUnsupported(f"{op.name} is an ordered op (a collective): it cannot be "
                                 f"part of a mapped rule", loc=loc)
        if op.category not in (ELEMENTWISE, CONSTANT):
            raise MapUnsupported(f"{op.name} is not elementwise", loc=loc)


_SCALAR_OPS = _scalar_ops()


def hypermap(rule: Callable[[], Any], instances: list[dict[Hashable, Any]]) -> Node:
    """Trace `rule` once (on the first instance) and add the multi-tensor kernel that applies
    it to every instance to the current trace; see the module docstring."""
    parent = traces.current_trace()
    assert parent is not None and not isinstance(parent, MapTrace), "hypermap needs a trace"
    first = instances[0]
    roles = {id(obj): role for role, obj in first.items()}
    mt = MapTrace(parent, roles)
    with traces.tracing(mt):
        rule()
    body = mt.graph
    body.effects = [body.add_node("store", [mt.by_key[("role", (role,))], value], loc=loc).out
                    for role, (value, loc) in mt.stores.items()]
    columns, spaces = _bind(parent, mt, instances)
    shared = [j for j, (kind, _) in enumerate(mt.inputs) if kind == "shared"]
    inputs = [v for row in zip(*columns) for v in row] + [mt.inputs[j][1] for j in shared]
    node = Node("kernel", inputs, {"spaces": spaces, "outputs": [], "shared": shared}, [],
                body=body)
    node.outputs = [Value(t, node, i) for i, t in enumerate(infer_types(node))]
    parent.graph.nodes.append(node)
    parent.maps.append(node)
    for role in mt.stores:
        j = mt.inputs.index(("role", (role,)))
        parent.map_writes.update((id(instance[role]), (node, j, k))
                                 for k, instance in enumerate(instances))
    return node


def _bind(parent: traces.Trace, mt: MapTrace, instances: list[dict[Hashable, Any]]
          ) -> tuple[list[list[Value]], list[list[int]]]:
    """For each body input that is not shared, in order, every instance's operand (a
    column); and each instance's space. Column by column: thousands of instances."""
    written = parent.assigned.keys() | parent.map_writes.keys()
    columns: list[list[Value]] = []
    stored: list[int] = []  # the columns the body stores into
    for kind, key in mt.inputs:
        if kind == "shared":
            continue
        role, steps = key[0], key[1:]
        objs = [instance.get(role) for instance in instances]
        if steps:
            objs = [_walk(obj, steps, role, mt.chain) for obj in objs]
        column = [_operand(parent, obj, key, written) for obj in objs]
        dtype = mt.by_key[(kind, key)].dtype
        if any(v.type.dtype is not dtype for v in column):
            raise MapUnsupported(f"role {key!r} does not line up with the others")
        if not steps and role in mt.stores:
            stored.append(len(columns))
        columns.append(column)
    if not columns:
        raise MapUnsupported("the rule reads no tensor of an instance")
    spaces = [v.type.shape for v in columns[0]]
    if any(v.type.shape != space for column in columns[1:] for v, space in zip(column, spaces)):
        raise MapUnsupported("the tensors of an instance do not all have one shape")
    # A parameter the kernel updates in place must be none of its other operands.
    targets = [id(v) for k in stored for v in columns[k]]
    others = {id(v) for k, column in enumerate(columns) if k not in stored for v in column}
    if len(set(targets)) != len(targets) or not others.isdisjoint(targets):
        raise MapUnsupported("a parameter the rule updates is also read another way")
    return columns, [list(space) for space in spaces]


def _operand(parent: traces.Trace, obj: Any, key: tuple, written: set[int]) -> Value:
    """The outer value an instance binds to a role."""
    if isinstance(obj, Parameter):
        if id(obj) in written:
            raise MapUnsupported(f"{obj.name} was already assigned in this step")
        return parent.read_input(obj)
    if isinstance(obj, TracedTensor) and obj.trace is parent:
        return obj.value
    if isinstance(obj, Value):
        return obj
    raise MapUnsupported(f"role {key!r} is not a Parameter or a traced tensor")


def _walk(obj: Any, steps: tuple, role: Hashable,
          chain: dict[tuple, tuple[str, dict, int, tuple]]) -> Any:
    """The tensor at `steps` under an instance's role tensor: the same ops, with the same
    shared scalars, must be met on the way as on the first instance's (the body was made
    from those)."""
    v = obj.value if isinstance(obj, TracedTensor) and steps else obj
    path: tuple = (role,)
    for k in steps:
        n = v.node if isinstance(v, Value) else None
        op, attrs, count, scalars = chain[path]
        if n is None or n.op != op or n.attrs != attrs or len(n.inputs) != count or \
                any(n.inputs[j] is not x for j, x in scalars):
            raise MapUnsupported(f"role {role!r} is not made the same way in every instance")
        v, path = n.inputs[k], path + (k,)
    return v


def new_value(node: Node, body_input: int, instance: int) -> Value:
    """The new value a mapped update gave one instance's Parameter (the one bound to
    `body_input`), for a read after it: the kernel gets a mapped output for it, for every
    instance (they share one body)."""
    body = node.body
    store = next(n for n in body.nodes
                 if n.op == "store" and n.inputs[0] is body.inputs[body_input])
    value = store.inputs[1]
    if value not in body.outputs:
        body.outputs.append(value)
        node.attrs["outputs"] = list(node.attrs["outputs"]) + ["map"]
        token = node.outputs[-1]
        per = len(body.outputs) - 1
        old = node.outputs[:-1]
        node.outputs = []
        for i, space in enumerate(node.attrs["spaces"]):
            node.outputs += old[i * per:(i + 1) * per]
            node.outputs.append(Value(TensorType(tuple(space), value.dtype), node))
        node.outputs.append(token)
        for i, v in enumerate(node.outputs):
            v.index = i
    k = body.outputs.index(value)
    return node.outputs[instance * len(body.outputs) + k]

