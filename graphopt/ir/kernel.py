"""Kernel nodes: fused elementwise regions, made by the `fuse` and `hfuse` passes.

A kernel node holds a *body*: a small graph that computes one element. Its inputs are
`arg %x0, %x1, ...` of element types (`f32[]`), its nodes are elementwise ops, scalar
constants and `store`s, and its return lists the element values it produces:

    %3, %4 = kernel @w, %g, %0 {spaces=[[4,3]], outputs=["map"], shared=[]} : f32[4,3], token {
      arg %x0: f32[]
      arg %x1: f32[]
      arg %x2: f32[]
      %0 = multiply %x2, %x1 : f32[]
      %1 = subtract %x0, %0 : f32[]
      %2 = store %x0, %1 : token
      return %1 after(%2)
    }

The kernel runs the body once per element of its iteration space (`spaces`); an operand whose
shape is smaller broadcasts into the space as in numpy. Each body output is either mapped
(`"map"`: a tensor of the space's shape), reduced over the whole space (`"sum"`, `"max"`,
`"mean"`: a scalar), or reduced over the space's leading k axes (`"sum@k"`, `"max@k"`,
`"mean@k"`, 0 < k < the space's rank: a tensor of the remaining axes' shape, what
`sum x {axes=[0, ..., k-1]}` gives; a bias gradient is `"sum@1"` of a [batch, features] space). `store %xi, v` writes v into the buffer of operand i, which must be a
parameter of the full space shape: the in-place update an `assign` became. A kernel that
stores yields one token after its value outputs.

A body may also reduce *rows*: `sum`/`max`/`mean %v {axes=[r, ..., n-1], keepdims=true}`
(1 <= r < n, n the rank of every space; one r per kernel) is the reduction of v over the
trailing axes r.. of the space, at this element's row, broadcast back: LayerNorm's mean and
variance, softmax's max and sum, inside the kernel that reads them. A value computed only
from such results, from constants and from operands of size 1 along axes r.. is
*row-invariant*; an output of kind `"row@r"` is one, written once per row: a tensor of shape
space[:r] + [1] * (n - r), what the unfused keepdims reduction gave (a LayerNorm forward hands
its mean and rstd to the backward so).

A body may also reduce the space's *leading* axes itself: `sum`/`max`/`mean %v {axes=[0, ...,
k-1], keepdims=false}` (1 <= k <= the rank, one k per kernel) is a *finish reduction*, whose
value exists once the kernel's blocks are combined. What is computed from such values is the
kernel's *finish stage*: it runs once per element of the reduced shape space[k:], after the
element stage, reads only finish values, constants and operands that broadcast to that shape,
and stores into parameters of that shape; no body output is a finish value. Whole-step
fusion (passes/wholestep.py) puts a bias's optimizer update there, on its gradient's sum
over the batch, so the gradient is never stored:

    %0, %1 = kernel %dy, @m, %lr, @b {spaces=[[4,3]], outputs=["map"], shared=[]} : ... {
      ...
      %0 = exp %x0 : f32[]                              # element stage, over [4,3]
      %1 = sum %0 {axes=[0], keepdims=false} : f32[]    # finish stage, over [3]
      %4 = add %3, %1 : f32[]
      %7 = store %x1, %4 : token
      ...

A multi-tensor kernel (the HyperMap idea) maps one body over several *instances*, one
iteration space each. Its operands are the per-instance operands, instance after instance
(for the body inputs not listed in `shared`), then the operands every instance shares (scalar
hyper-parameters); its outputs are the value outputs of instance 0, of instance 1, ..., then
the token.
"""
from __future__ import annotations

import itertools
import math
import operator
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import OpTypeError
from .graph import Graph, Node, Value
from . import opdefs  # noqa: F401  (the reductions a kernel output may be)
from .registry import (EFFECT, INTS_ATTR, KERNEL, REDUCTION, REGISTRY, SHAPES_ATTR,
                       STRINGS_ATTR, OpDef, get_op, register)
from .types import TensorType, Type, token

# A body output is mapped, or reduced by one of the reduction ops (a registry category).
REDUCTIONS = tuple(name for name, op in REGISTRY.items() if op.category == REDUCTION)
OUTPUT_KINDS = ("map",) + REDUCTIONS  # and "sum@k", ...: see split_kind


ROW = "row"  # "row@r": a row-invariant value, once per row


def split_kind(kind: str) -> tuple[str, int | None]:
    """An output kind's reduction op and how many leading axes it reduces (None: all of
    them; "map" gives ("map", None); "row@r" gives ("row", r)). Raises ValueError for a kind
    that is none of these."""
    op, at, k = kind.partition("@")
    if not at:
        if op in OUTPUT_KINDS:
            return op, None
    elif (op in REDUCTIONS or op == ROW) and k.isdigit() and k == str(int(k)) and int(k) > 0:
        return op, int(k)
    raise ValueError(kind)


def is_mapped(kind: str) -> bool:
    """Whether an output is written element by element ("map") or row by row ("row@r"), as
    opposed to reduced over the space's blocks."""
    return kind == "map" or kind.startswith(ROW + "@")


def row_shape(space: Sequence[int], r: int) -> tuple[int, ...]:
    """The shape of a row value of an n-space: its leading r axes, then n - r ones."""
    return tuple(space)[:r] + (1,) * (len(space) - r)


def output_shape(kind: str, space: Sequence[int]) -> tuple[int, ...]:
    if kind == "map":
        return tuple(space)
    op, k = split_kind(kind)
    return row_shape(space, k) if op == ROW else reduced_shape(kind, space)


def is_row_reduction(n: Node) -> bool:
    """A body node that reduces rows (keepdims=true; see the module's doc)."""
    return n.opdef.category == REDUCTION and n.attrs["keepdims"]


def is_finish_reduction(n: Node) -> bool:
    """A body node that reduces the space's leading axes (keepdims=false): its value exists
    once the kernel's blocks are combined, in the finish stage (see the module's doc)."""
    return n.opdef.category == REDUCTION and not n.attrs["keepdims"]


def body_reductions(body: Graph) -> list[Node]:
    """A body's row reductions (see the module's doc), in body order."""
    return [n for n in body.nodes if is_row_reduction(n)]


def finish_reductions(body: Graph) -> list[Node]:
    """A body's finish reductions, in body order."""
    return [n for n in body.nodes if is_finish_reduction(n)]


def finish_values(body: Graph) -> set[Value]:
    """The body values of the finish stage: its reductions' results and what is computed
    from them (a store of one among them, its token)."""
    stage: set[Value] = set()
    for n in body.nodes:
        if is_finish_reduction(n) or not stage.isdisjoint(n.inputs):
            stage.update(n.outputs)
    return stage


@dataclass(frozen=True)
class Stages:
    """A body split into its element stage and its finish stage: the nodes each runs (a
    node only the finish needs, computed from scalars and constants, in the finish only),
    the stores of each ((body input, store), as `stores` gives them), the finish reductions,
    the axes they reduce (k: the leading k; None: no finish stage) and the body inputs each
    stage reads (the element stage of a kernel with no finish: all of them)."""

    element: list[Node]
    finish: list[Node]
    element_stores: list[tuple[int, Node]]
    finish_stores: list[tuple[int, Node]]
    reductions: list[Node]
    k: int | None
    finish_inputs: list[int]
    element_inputs: list[int]


def stages(body: Graph) -> Stages:
    reds = finish_reductions(body)
    if not reds:
        return Stages([n for n in body.nodes if n.op != "store"], [], stores(body), [], [],
                      None, [], list(range(len(body.inputs))))
    late = finish_values(body)
    all_stores = stores(body)
    finish_stores = [(j, n) for j, n in all_stores if n.out in late]
    known = {m.out for m in reds}
    finish = [n for n in upstream(body, [n.inputs[1] for _, n in finish_stores], known)
              if n not in reds] if finish_stores else []
    element_roots = list(body.outputs) + [m.inputs[0] for m in reds] + \
        [n.inputs[1] for _, n in all_stores if n.out not in late]
    element = upstream(body, element_roots, set())
    index = {x: j for j, x in enumerate(body.inputs)}
    reads = {v for n in finish for v in n.inputs} | {n.inputs[1] for _, n in finish_stores}
    early = {v for n in element for v in n.inputs} | set(element_roots)
    return Stages(element, finish, [s for s in all_stores if s not in finish_stores],
                  finish_stores, reds, len(reds[0].attrs["axes"]),
                  sorted(index[v] for v in reads if v in index),
                  sorted(index[v] for v in early if v in index))


def row_axis(body: Graph) -> int | None:
    """The first axis a body's row reductions reduce (r), or None if it has none (or if the
    first names no axis: the type rule refuses that kernel, with its own message)."""
    reds = body_reductions(body)
    return reds[0].attrs["axes"][0] if reds and reds[0].attrs["axes"] else None


def row_passes(body: Graph) -> list[list[Node]]:
    """The body's row reductions by pass: a reduction runs in the pass after the last one
    whose results its operand depends on (LayerNorm: the mean, then the variance of x -
    mean). The compiled loop makes one pass over a row per entry, then a last one that
    computes the elements."""
    depth: dict[Value, int] = {}
    passes: list[list[Node]] = []
    for n in body.nodes:
        d = max((depth.get(v, 0) for v in n.inputs), default=0)
        if is_row_reduction(n):
            d += 1
            passes += [[] for _ in range(d - len(passes))]
            passes[d - 1].append(n)
        depth.update((v, d) for v in n.outputs)
    return passes


def upstream(body: Graph, roots: Sequence[Value], known: set[Value]) -> list[Node]:
    """The body nodes (in order, stores excluded) that compute `roots` from the body's inputs
    and the values in `known`."""
    want, producer = set(roots) - known, {v: n for n in body.nodes for v in n.outputs}
    stack, seen = list(want), set()
    while stack:
        v = stack.pop()
        n = producer.get(v)
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        stack += [x for x in n.inputs if x not in known]
    return [n for n in body.nodes if id(n) in seen]


def pass_inputs(body: Graph) -> list[set[Value]]:
    """The body inputs each row pass reads."""
    known: set[Value] = set()
    out = []
    for reds in row_passes(body):
        roots = [m.inputs[0] for m in reds]
        reads = set(roots).union(*(n.inputs for n in upstream(body, roots, known)))
        out.append(reads & set(body.inputs))
        known.update(m.out for m in reds)
    return out


def row_invariant(body: Graph, operand_shapes: Sequence[tuple[int, ...]],
                  space: Sequence[int], r: int) -> set[Value]:
    """The body values that are the same at every element of a row (axes r.. of an n-space):
    row reductions, constants, operands of size 1 along those axes (`operand_shapes`, one per
    body input, in numpy's right-aligned broadcasting), and what only these compute."""
    n = len(space)
    inv = {x for x, shape in zip(body.inputs, operand_shapes)
           if all(s == 1 for s in ((1,) * (n - len(shape)) + tuple(shape))[r:])}
    for m in body.nodes:
        if m.op == "store":
            continue
        if is_row_reduction(m) or all(v in inv for v in m.inputs):
            inv.update(m.outputs)
    return inv


def kind_for(op: str, axes: Sequence[int], ndim: int) -> str:
    """The output kind of a reduction `op` over `axes` of an ndim-space: "sum" over every
    axis, "sum@k" over the leading k."""
    return op if len(axes) == ndim else f"{op}@{len(axes)}"


def reduced_shape(kind: str, space: Sequence[int]) -> tuple[int, ...]:
    """The shape of an output of `kind` (not "map") over `space`."""
    k = split_kind(kind)[1]
    return () if k is None else tuple(space)[k:]


def reduced_axes(kind: str, space: Sequence[int]) -> tuple[int, ...]:
    k = split_kind(kind)[1]
    return tuple(range(len(space) if k is None else k))


def _valid_kind(kind: str, spaces: list[tuple[int, ...]]) -> bool:
    try:
        k = split_kind(kind)[1]
    except ValueError:
        return False
    return k is None or all(k < len(space) for space in spaces)


def _store_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    if len(types) != 2 or types[0] != types[1] or not isinstance(types[0], TensorType):
        raise OpTypeError(f"store: the value {types[-1] if types else '?'} must have the type of "
                          f"its target {types[0] if types else '?'}")
    return [token]


def _kernel_infer(types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
    raise OpTypeError("a kernel's result types come from its body (use kernel.infer_types)")


register(OpDef("store", EFFECT, _store_infer,
               doc="store %xi, v (kernel bodies only): write v into operand i's buffer"))
register(OpDef("kernel", KERNEL, _kernel_infer, attrs=("spaces", "outputs", "shared"),
               attr_kinds=(SHAPES_ATTR, STRINGS_ATTR, INTS_ATTR),
               doc="a fused elementwise region; see graphopt/ir/kernel.py"))


@dataclass(frozen=True)
class Layout:
    """How a kernel node's operands and outputs map onto its body, instance by instance.
    `lead`: operands before the body's (a row kernel's rows, one per instance)."""

    instances: int
    body_inputs: int
    shared: tuple[int, ...]
    body_outputs: int
    has_token: bool
    lead: int = 0
    per_instance: tuple[int, ...] = ()  # the body inputs that are not shared, in order
    _slot: dict[int, int] = field(default_factory=dict, repr=False)  # body input -> position

    def __post_init__(self) -> None:
        per = tuple(i for i in range(self.body_inputs) if i not in self.shared)
        object.__setattr__(self, "per_instance", per)
        slot = {j: self.lead + k for k, j in enumerate(per)}
        slot.update({j: self.lead + self.instances * len(per) + k
                     for k, j in enumerate(self.shared)})
        object.__setattr__(self, "_slot", slot)

    def operand_index(self, instance: int, body_input: int) -> int:
        """Position in the kernel's inputs of the operand bound to `body_input` in `instance`."""
        k = self._slot[body_input]
        return k if body_input in self.shared else instance * len(self.per_instance) + k

    def output_index(self, instance: int, body_output: int) -> int:
        return instance * self.body_outputs + body_output


ROW_KERNEL = "row_kernel"  # (ir/rowkernel.py): one rows operand per instance, then a kernel's


def layout(node: Node) -> Layout:
    body = node.body
    assert body is not None
    spaces = len(node.attrs["spaces"])
    return Layout(spaces, len(body.inputs), tuple(node.attrs["shared"]), len(body.outputs),
                  bool(body.effects), spaces if node.op == ROW_KERNEL else 0)


def columns(node: Node, lay: Layout | None = None) -> list[list[Value]]:
    """For each body input, the operand every instance binds to it (a shared operand
    repeated). Slices, not a walk: a multi-tensor kernel has thousands of instances."""
    lay = lay or layout(node)
    n, per, ins = lay.instances, len(lay.per_instance), node.inputs
    end = lay.lead + n * per
    return [[ins[lay._slot[j]]] * n if j in lay.shared else ins[lay._slot[j]:end:per]
            for j in range(lay.body_inputs)]


def instance_rows(node: Node, lay: Layout | None = None) -> Iterator[tuple[Value, ...]]:
    """The operands of every instance, each in body-input order."""
    lay = lay or layout(node)
    return zip(*columns(node, lay)) if lay.body_inputs else iter([()] * lay.instances)


def stores(body: Graph) -> list[tuple[int, Node]]:
    """(body input index, store node) for every store of a body."""
    index = {v: i for i, v in enumerate(body.inputs)}
    return [(index[n.inputs[0]], n) for n in body.nodes if n.op == "store"]


def written(node: Node) -> list[Value]:
    """The outer values (parameters) a node writes: an assign's target, a kernel's stores."""
    if node.op == "assign":
        return [node.inputs[0]]
    if node.body is None:
        return []
    cols = columns(node)
    return [v for row in zip(*(cols[j] for j, _ in stores(node.body))) for v in row]


def infer_types(node: Node) -> list[Type]:
    """A node's output types: from the op's type rule, or, for a kernel, from its body."""
    if node.body is None:
        return get_op(node.op).infer([v.type for v in node.inputs], node.attrs)
    if node.op == ROW_KERNEL:
        from .rowkernel import row_types
        return row_types(node)
    body, attrs = node.body, node.attrs
    lay = layout(node)
    if not lay.instances:
        raise OpTypeError("kernel: spaces=[]: a kernel has an iteration space per instance, "
                          "and at least one instance")
    kinds = list(attrs["outputs"])
    spaces = [tuple(space) for space in attrs["spaces"]]
    if len(kinds) != lay.body_outputs or not all(_valid_kind(k, spaces) for k in kinds):
        raise OpTypeError(f"kernel: outputs={kinds} must give one of {list(OUTPUT_KINDS)}, "
                          f"a reduction over the leading k axes (\"sum@k\", 0 < k < the rank "
                          f"of every space), or a row value (\"row@r\"), per body output "
                          f"({lay.body_outputs})")
    if any(not 0 <= j < lay.body_inputs for j in lay.shared) or \
            len(set(lay.shared)) != len(lay.shared) or \
            len(node.inputs) != lay.instances * len(lay.per_instance) + len(lay.shared):
        raise OpTypeError(f"kernel: {len(node.inputs)} operands do not fit {lay.instances} "
                          f"instance(s) of a body with {lay.body_inputs} inputs, shared "
                          f"{list(lay.shared)} (distinct body inputs)")
    st = stages(body)
    targets = {j for j, _ in st.element_stores}
    if not _operands_fit(node, lay, spaces, targets):
        _explain_misfit(node, lay, spaces, targets)
    _check_rows(node, kinds, spaces)
    if st.reductions:
        _check_finish(node, st, spaces)
    by_output = [[TensorType(output_shape(kind, space), r.dtype) for space in spaces]
                 for kind, r in zip(kinds, body.outputs)]
    out: list[Type] = [t for row in zip(*by_output) for t in row]
    return out + ([token] if lay.has_token else [])


_TYPE, _DTYPE, _SHAPE = (operator.attrgetter(a) for a in ("type", "dtype", "shape"))


def _check_rows(node: Node, kinds: list[str], spaces: list[tuple[int, ...]]) -> None:
    """Row reductions reduce the trailing axes r.. of every space, one r per kernel, keeping
    them; a "row@r" output has that r and is row-invariant in every instance."""
    body = node.body
    reds = body_reductions(body)
    rows = [k for k in kinds if k.startswith(ROW + "@")]
    if not reds and not rows:
        return
    r = row_axis(body)
    for n in reds:
        axes, ranks = list(n.attrs["axes"]), {len(space) for space in spaces}
        if not axes or len(ranks) != 1 or not 1 <= axes[0] < min(ranks):
            raise OpTypeError(f"kernel: {n.op} {{axes={axes}}} in the body: a row reduction "
                              f"reduces the trailing axes r.. (1 <= r < the rank) of spaces "
                              f"of one rank, not {[list(s) for s in spaces]}")
        n_dim = ranks.pop()
        if axes != list(range(axes[0], n_dim)) or axes[0] != r or not n.attrs["keepdims"]:
            raise OpTypeError(f"kernel: {n.op} {{axes={axes}, keepdims="
                              f"{str(n.attrs['keepdims']).lower()}}} in the body: a row "
                              f"reduction reduces the trailing axes {list(range(r, n_dim))} "
                              f"(the same r={r} for every one), keepdims=true")
    for kind, out in zip(kinds, body.outputs):
        if not kind.startswith(ROW + "@"):
            continue
        if split_kind(kind)[1] != r:
            has = f"reduces from axis {r}" if r is not None else "has no row reduction"
            raise OpTypeError(f"kernel: output kind {kind!r}: the body {has}")
        for space, row in zip(spaces, instance_rows(node)):
            if out not in row_invariant(body, [v.shape for v in row], space, r):
                raise OpTypeError(f"kernel: a {kind!r} output must be the same along axes "
                                  f"{r}.. of the space {list(space)} (made only from row "
                                  f"reductions, constants and operands of size 1 there)")


def _check_finish(node: Node, st: Stages, spaces: list[tuple[int, ...]]) -> None:
    """Finish reductions reduce the leading k axes of every space (one k per kernel,
    keepdims=false); no body output and no reduction is a finish value; what the finish
    stage reads broadcasts to the finish's shape, space[k:], and what it stores has it."""
    body, k = node.body, st.k
    for m in st.reductions:
        axes = list(m.attrs["axes"])
        if axes != list(range(k)) or not all(1 <= k <= len(space) for space in spaces):
            raise OpTypeError(f"kernel: {m.op} {{axes={axes}, keepdims=false}} in the body: a "
                              f"finish reduction reduces the leading axes [0, ..., k-1] (1 <= "
                              f"k <= the rank of every space, the same k for every one: here "
                              f"{list(range(k))}) of spaces {[list(s) for s in spaces]}; a "
                              f"row reduction reduces the trailing axes, keepdims=true")
    late = finish_values(body)
    for i, out in enumerate(body.outputs):
        if out in late:
            raise OpTypeError(f"kernel: body output {i} is computed in the finish stage (from "
                              f"a finish reduction): a finish value leaves the kernel only "
                              f"through a store into a parameter of the finish's shape")
    for n in body.nodes:
        if n.opdef.category == REDUCTION and n.inputs[0] in late:
            raise OpTypeError(f"kernel: {n.op} in the body reduces a finish value: a finish "
                              f"stage is elementwise over the reduced shape")
    finish_stored = {j for j, _ in st.finish_stores}
    for space, row in zip(spaces, instance_rows(node)):
        shape = tuple(space)[k:]
        for j in st.finish_inputs + sorted(finish_stored):
            t = row[j].type
            if j in finish_stored and t.shape != shape:
                raise OpTypeError(f"kernel: operand {j} ({t}) is stored in the finish stage: "
                                  f"it must have the finish's shape {list(shape)} (the space "
                                  f"{list(space)} without its leading {k} axes)")
            if not _broadcasts(t.shape, shape):
                raise OpTypeError(f"kernel: operand {j} ({t}) is read in the finish stage, "
                                  f"which runs over the reduced shape {list(shape)}: it must "
                                  f"broadcast to that shape (an element stage value or an "
                                  f"operand of the full space is gone by then)")


def _operands_fit(node: Node, lay: Layout, spaces: list[tuple[int, ...]],
                  targets: set[int]) -> bool:
    """Whether every operand has its body input's dtype and a shape that broadcasts to its
    instance's space (a stored one: that shape). Body input by body input, all instances at
    once, in C loops (map, attrgetter, set): a multi-tensor kernel has thousands of operands."""
    for j, (x, column) in enumerate(zip(node.body.inputs, columns(node, lay))):
        if j in lay.shared:
            column = column[:1]  # one value: the others are the same
        types = list(map(_TYPE, column))
        if x.type.shape != () or set(map(type, types)) != {TensorType} or \
                set(map(_DTYPE, types)) != {x.dtype}:
            return False
        shapes = list(map(_SHAPE, types))
        if j in lay.shared:
            fits = shapes[0] == () and j not in targets or all(
                shapes[0] == space if j in targets else _broadcasts(shapes[0], space)
                for space in spaces)
        else:  # the instances whose operand is not of their space's shape, found in C
            odd = itertools.compress(zip(shapes, spaces), map(operator.ne, shapes, spaces))
            fits = shapes == spaces or j not in targets and all(
                _broadcasts(s, space) for s, space in odd)
        if not fits:
            return False
    return True


def _explain_misfit(node: Node, lay: Layout, spaces: list[tuple[int, ...]],
                    targets: set[int]) -> None:
    """Raise the OpTypeError that names the first operand that does not fit."""
    elements = [x.type for x in node.body.inputs]
    for space, row in zip(spaces, instance_rows(node, lay)):
        for j, v in enumerate(row):
            t, x = v.type, elements[j]
            if type(t) is not TensorType or t.dtype != x.dtype or x.shape != ():
                raise OpTypeError(f"kernel: operand {j} is {t}, the body reads it as {x}")
            if t.shape != space and (j in targets or not _broadcasts(t.shape, space)):
                need = "have the shape" if j in targets else "broadcast to"
                raise OpTypeError(f"kernel: operand {j} ({t}) does not {need} the "
                                  f"iteration space {list(space)}")
    raise AssertionError("_operands_fit and _explain_misfit disagree")


def _broadcasts(shape: tuple[int, ...], space: tuple[int, ...]) -> bool:
    if shape == ():
        return True
    try:
        return np.broadcast_shapes(shape, space) == space
    except ValueError:
        return False


def run(node: Node, arrays: Sequence[np.ndarray],
        body_node: Callable[[Node, list[Any]], np.ndarray]
        ) -> tuple[list[np.ndarray], list[tuple[Value, np.ndarray]]]:
    """The kernel's numpy semantics: its outputs and its stores (outer value, new array).

    The body runs on whole arrays at once, each op with the same numpy function as the
    unfused node (registry.evaluate_element), so a kernel gives the unfused graph's results
    bit for bit. `body_node(n, arrays)` runs one body node so: the caller's, which reports
    numpy's errors as the node's. A row kernel's stores are the rows it writes (RowsArray)."""
    if node.op == ROW_KERNEL:
        from .rowkernel import run_rows
        return run_rows(node, arrays, body_node)
    body = node.body
    lay = layout(node)
    outputs: list[np.ndarray] = []
    writes: list[tuple[Value, np.ndarray]] = []
    for i, space in enumerate(node.attrs["spaces"]):
        space = tuple(space)
        env: dict[Value, Any] = {}
        for j, x in enumerate(body.inputs):
            env[x] = arrays[lay.operand_index(i, j)]
        for n in body.nodes:
            if n.op == "store":  # (a finish stage's: of the finish's shape)
                target = node.inputs[lay.operand_index(i, body.inputs.index(n.inputs[0]))]
                writes.append((target, np.broadcast_to(env[n.inputs[1]], target.type.shape)))
                continue
            if n.opdef.category == REDUCTION:  # a row or finish reduction: the unfused node's
                env[n.out] = body_node(n, [np.broadcast_to(env[n.inputs[0]], space)])
                continue
            env[n.outputs[0]] = body_node(n, [env[v] for v in n.inputs])
        for kind, r in zip(node.attrs["outputs"], body.outputs):
            result = _output(kind, np.broadcast_to(env[r], space), space)
            outputs.append(np.array(result, dtype=r.dtype.np_dtype))
    return outputs, writes


def _output(kind: str, full: np.ndarray, space: tuple[int, ...]) -> np.ndarray:
    """A body output's value from its value broadcast to the space."""
    if kind == "map":
        return full
    op, k = split_kind(kind)
    if op == ROW:  # the same along axes k..: the first element of each row
        return full[tuple(slice(None) if a < k else slice(0, 1) for a in range(len(space)))]
    # The unfused reduction node's own semantics: the same summation order, and 16-bit floats
    # accumulated in f32.
    return get_op(op).impl(full, axes=reduced_axes(kind, space), keepdims=False)


@dataclass(frozen=True)
class KernelCost:
    """Memory traffic of one run of a kernel. Operands of the full iteration space stream:
    their bytes are counted per element. Smaller operands (scalars, broadcast rows) and
    reduction results are counted once, in `fixed_bytes`; `fixed_written` is the part of it
    that is written (the reduction results: a leading-axes reduction's whole result; the
    parameters a finish stage stores)."""

    read_per_element: int
    write_per_element: int
    fixed_bytes: int
    elements: int
    fixed_written: int = 0

    @property
    def bytes_per_element(self) -> int:
        return self.read_per_element + self.write_per_element

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_element * self.elements + self.fixed_bytes

    def __str__(self) -> str:
        fixed = f" + {self.fixed_bytes} B once" if self.fixed_bytes else ""
        return (f"{self.elements} elements x {self.bytes_per_element} B/elem (read "
                f"{self.read_per_element}, write {self.write_per_element}){fixed}")


def cost(node: Node) -> KernelCost:
    """Each operand the body reads is read once; each stored parameter and mapped output is
    written once; nothing in between touches memory (that is what fusion buys). A row
    kernel's elements are its rows' (K·D): it reads and writes K rows of each table (its
    `indexed` operands) and its K indices once, whatever the tables' size. A row reduction's
    pass reads the operands it needs once more per pass (counted: the loads the loop issues,
    though a row of a few KB is read again from L1 or L2, not from memory); a "row@r" output
    is written once per row."""
    body = node.body
    lay = layout(node)
    indexed = set(node.attrs.get("indexed", ()))
    targets = {j for j, _ in stores(body)}
    finish_targets = {j for j, _ in stages(body).finish_stores} if node.op != ROW_KERNEL \
        else set()
    read_in_body = {v for n in body.nodes if n.op != "store" for v in n.inputs}
    read_in_body |= set(body.outputs)
    read = write = fixed = reduced = 0
    spaces = [tuple(space) for space in node.attrs["spaces"]]
    rereads = [x for p in pass_inputs(body) for x in p] if node.op != ROW_KERNEL else []
    elements = sum(map(math.prod, spaces))
    for j, (x, column) in enumerate(zip(body.inputs, columns(node, lay))):
        if j in lay.shared:
            column = column[:1]  # read once, as instance 0 reads it
        shapes = list(map(_SHAPE, map(_TYPE, column)))
        if j in indexed or shapes[0] == spaces[0]:  # per-element rates: alike in all instances
            read += x.dtype.itemsize * ((x in read_in_body) + rereads.count(x))
            write += x.dtype.itemsize if j in targets else 0
        if j not in indexed and x in read_in_body and shapes != spaces[:len(shapes)]:
            fixed += sum(v.type.nbytes for v, shape, space in zip(column, shapes, spaces)
                         if shape != space)
        if j in finish_targets:  # written once, by the finish stage
            reduced += sum(v.type.nbytes for v in column)
    for kind, r in zip(node.attrs.get("outputs", ()), body.outputs):
        if kind == "map":
            write += r.dtype.itemsize
        else:
            reduced += r.dtype.itemsize * sum(math.prod(output_shape(kind, space))
                                              for space in spaces)
    indices = sum(v.type.indices_type.nbytes for v in node.inputs[:lay.lead])
    return KernelCost(read, write, fixed + reduced + indices, elements, reduced)


def source_lines(node: Node) -> str:
    """The user's source lines a node came from (a kernel: those of the nodes fused into
    it, read off its body), as `step.py:8, 12-14`; "" when none is known. Per file, in
    order, runs of lines joined."""
    files: dict[str, set[int]] = {}
    for n in (node, *(node.body.nodes if node.body is not None else ())):
        if n.loc is not None:
            files.setdefault(os.path.basename(n.loc.file), set()).add(n.loc.line)
    parts = []
    for file, found in files.items():
        runs: list[list[int]] = []
        for line in sorted(found):
            if runs and line == runs[-1][-1] + 1:
                runs[-1].append(line)
            else:
                runs.append([line])
        spans = [f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
        parts.append(f"{file}:{', '.join(spans)}")
    return "; ".join(parts)
