"""fuse: vertical fusion of elementwise nodes into kernel nodes.

Nodes that compute one element per element of the same iteration space (their output
shape; operands may be smaller and broadcast, as in numpy) are grouped, producer into
consumer, in graph order. Each group becomes one `kernel` node whose body computes one
element (see ir/kernel.py), so its intermediate values never touch memory:

  - an `assign` whose value the group computes joins it as a `store`: the kernel updates the
    parameter's buffer in place instead of writing a new tensor and copying it;
  - a full reduction (sum, max or mean over every axis: a gradient norm's sum of squares, the
    all-finite check of loss scaling) may end a kernel: it is an output of the group, and
    nothing in the same group may use it, because it exists only once the kernel is done;
  - so may a reduction over the leading axes (axes=[0, ..., k-1], no keepdims: a bias
    gradient, the sum over the batch of a [batch, features] cotangent), an output of kind
    "sum@k": the kernel that makes the cotangent also reduces it, so it is read once (and not
    written at all if nothing else reads it);
  - a row reduction (sum, max or mean over the last axes r.., keepdims=true: LayerNorm's mean
    and variance, softmax's max and sum) joins the kernel of its operand as a value inside
    it (ir/kernel.py): the kernel makes a pass over each row per level of such reductions,
    then computes the elements, so what reads the row values joins the kernel too. An
    elementwise node of the row's shape that reads only the group's row values (a variance
    plus epsilon, its rsqrt) joins as a row value, computed once per row; a row value read
    outside leaves the kernel as a "row@r" output, of the unfused node's shape. All the row
    reductions of a kernel start at the same axis r;
  - a broadcast_to that only fusable nodes of its shape read (not the return) joins their
    kernel as the value it broadcasts (a kernel's operands broadcast into its space
    anyway): the gradient of a mean over a row is such a broadcast, and its readers then
    fuse with the row values it comes from;
  - scalar constants are copied into every body that uses them (the only work fusion ever
    duplicates: they cost nothing to recompute and nothing to read);
  - a scalar computed only from scalar inputs (a learning rate cast to f32, a hyper-parameter
    combined with another) is recomputed inside every kernel that uses it: it is
    loop-invariant, so the compiled loop computes it once before it starts;
  - groups of one iteration space that read the same tensor become one kernel when no path
    connects them (sibling fusion): the tensor is read once;
  - other scalar computations (iteration space []) that no path connects are merged into one
    kernel, whatever they compute: each is a few flops, and a call costs more.

A merge is refused, and the reason recorded for `explain`, when
  - the iteration spaces differ (a scalar computation stays a kernel of its own: redoing it
    for each element would cost more than passing its one result);
  - a path between the two groups leaves them (through a node or a kernel outside): merging
    would make a cycle. After edges count as paths, so a write-after-read order is kept;
  - the consumer needs a full or leading-axes reduction the producer group computes;
  - both groups have row reductions, from different axes.
The nn ops are first written as the ops they are made of (passes/decompose.py: a log_softmax
over the last axis as max, exp, sum and log, which fuse as row reductions; the losses as
elementwise ops and a full sum), and identical parts merged (cse): a cross-entropy's
log_softmax and its gradient's are computed once.
Nodes that carry after edges (a `depend`), and every non-elementwise node, stay outside;
for a reduction that is neither a kernel output nor a row reduction (over the last axes with
keepdims=false, over middle axes, keepdims over the leading ones), for an nn op kept whole
(a log_softmax over another axis, a 16-bit loss) and for a collective, a refusal says why.
"""
from __future__ import annotations

import functools

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir import kernel as kernel_ir
from ..ir.kernel import infer_types
from ..ir.printer import value_names
from ..ir.registry import COLLECTIVE, CONSTANT, ELEMENTWISE, LINALG, NN, REDUCTION
from ..ir.types import TensorType
from .cse import cse
from .decompose import decomposable, decompose, why_kept
from .grouping import Group, Grouping, install
from .manager import PassContext, register


def read_outside(v: Value, inside: set[int]) -> bool:
    """Whether a node outside `inside` (ids), or the return, reads v as data (an after edge
    to v is not a read: it comes to wait for the whole kernel)."""
    return any(id(u) not in inside and v in u.operand_lists()[0] for u in v.users)


def _is_constant(n: Node | None) -> bool:
    return n is not None and n.opdef.category == CONSTANT


def reductions(g: Group) -> list[Node]:
    """The group's reductions that are kernel outputs (not row reductions: those are values
    inside the kernel)."""
    return [n for n in g.members if n.opdef.category == REDUCTION and trailing_axes(n) is None]


def row_axis(g: Group) -> int | None:
    """The first axis the group's row reductions reduce (one per kernel), or None."""
    return next((r for r in map(trailing_axes, g.members) if r is not None), None)


def space_of(n: Node) -> tuple[int, ...] | None:
    """The iteration space a node can be fused in, or None if it cannot be fused."""
    if n.after and not n.opdef.has_effect:
        return None
    if n.opdef.has_effect:
        return n.inputs[0].shape
    if n.opdef.category == REDUCTION:
        fusable = leading_axes(n) is not None or trailing_axes(n) is not None
        return n.inputs[0].shape if fusable else None
    if n.opdef.category == ELEMENTWISE and len(n.outputs) == 1:
        return n.outputs[0].shape
    if n.op == "broadcast_to" and all(isinstance(u, Node) and space_of(u) == n.out.shape
                                      for u in n.out.users):
        return n.out.shape  # what a kernel's operands do anyway: see _Body.add
    return None


def leading_axes(n: Node) -> int | None:
    """How many leading axes a reduction node reduces, if those are all it reduces and it
    keeps no size-1 axes (what a kernel output can be: "sum", or "sum@k"); None otherwise."""
    axes, ndim = tuple(n.attrs["axes"]), n.inputs[0].type.ndim
    if n.attrs["keepdims"] or axes != tuple(range(len(axes))) or (ndim and not axes):
        return None
    return len(axes)


def trailing_axes(n: Node) -> int | None:
    """The first axis r of a row reduction (axes=[r, ..., n-1], 1 <= r < n, keepdims=true):
    a value inside a kernel, at every element of its row (see ir/kernel.py); None for any
    other node."""
    if n.opdef.category != REDUCTION or not n.attrs["keepdims"] or not n.attrs["axes"]:
        return None
    axes, ndim = tuple(n.attrs["axes"]), n.inputs[0].type.ndim
    r = axes[0]
    return r if 1 <= r and axes == tuple(range(r, ndim)) else None


class _Fuser(Grouping):
    def __init__(self, graph: Graph, ctx: PassContext):
        super().__init__(graph)
        self.graph, self.ctx = graph, ctx
        self.inline = self._loop_invariant_scalars()
        # Outer values a group computes once per row (row reductions, and elementwise nodes
        # of a row's shape that only they feed): the r of their rows.
        self.row_values: dict[Value, int] = {}

    @functools.cached_property
    def names(self) -> dict[Value, str]:
        """Printed names, for refusal messages (made only when one is needed)."""
        return value_names(self.graph)

    def _loop_invariant_scalars(self) -> set[int]:
        """Scalar nodes computed only from scalar inputs (arguments, parameters no node
        writes, constants): kernels recompute them instead of reading them, because they are
        loop-invariant (the compiled loop computes them once, before it starts) and a kernel
        call of their own costs more than the few flops. One that reads a parameter the step
        writes is left alone: a kernel reading it would need a new write-after-read order."""
        written = {v for n in self.graph.nodes for v in kernel_ir.written(n)}
        inline: set[int] = set()
        for n in self.graph.nodes:
            op = n.opdef
            if op.category in (CONSTANT, REDUCTION) or op.has_effect or space_of(n) != () or \
                    n.op == "broadcast_to":  # (not a body op: see _Body.add)
                continue
            if all((v.is_input and v.shape == () and v not in written) or
                   id(self.producer.get(v)) in inline or
                   (v.shape == () and _is_constant(self.producer.get(v)))
                   for v in n.inputs):
                inline.add(id(n))
        return inline

    def name(self, n: Node) -> str:
        return f"{self.names[n.outputs[0]]} = {n.op}" if n.outputs else n.op

    def why_not(self, a: Group, b: Group, b_is_newest: bool = False) -> str | None:
        """Why groups a and b cannot become one kernel, or None if they can."""
        for x, y in ((a, b), (b, a)):
            done = {id(v) for r in reductions(x) for v in r.outputs}
            for n in y.members:
                for v in n.inputs:
                    if id(v) in done:
                        full = "full " if v.shape == () else ""
                        return (f"{self.names[v]} is a {full}reduction: it exists only once its "
                                f"kernel has finished, so it cannot be used inside it")
        ra, rb = row_axis(a), row_axis(b)
        if ra is not None and rb is not None and ra != rb:
            return (f"row reductions over different axes: from axis {ra} and from axis {rb} "
                    f"(a kernel's rows are one shape)")
        if a.space != b.space:
            if a.space == () or b.space == ():
                big = list(b.space or a.space)
                return (f"cost: a scalar computation stays out of a kernel over {big}: redoing "
                        f"it for each element costs more than passing its one result")
            return f"iteration spaces differ: {list(a.space)} vs {list(b.space)}"
        via = self.cycle_via(a, b, b_is_newest)
        if via is not None:
            g = self.group.get(id(via))
            what = "the kernel holding " if g is not None and len(g.members) > 1 else ""
            return f"would make a cycle: a path between them leaves through {what}{self.name(via)}"
        return None

    # -- grouping ------------------------------------------------------------------------------
    def outside(self, n: Node) -> str | None:
        """Why a reduction, an nn op or a collective stays a node of its own (for explain),
        or None."""
        op = n.opdef
        if op.category == REDUCTION:
            if n.after:
                return "it carries an after edge (a depend): such nodes stay outside kernels"
            axes, shape = list(n.attrs["axes"]), list(n.inputs[0].shape)
            ndim = len(shape)
            trailing = bool(axes) and axes == list(range(axes[0], ndim)) and axes[0] >= 1
            if n.attrs["keepdims"]:
                return (f"keepdims=true over axes {axes} of {shape}: a reduction keeps its "
                        f"axes inside a kernel only as a row reduction, over the last axes "
                        f"and not all of them (axes=[r, ..., {ndim - 1}], 1 <= r)")
            if trailing:
                return (f"it reduces the last axes {axes} of {shape} with keepdims=false: a "
                        f"row reduction inside a kernel keeps them (keepdims=true), and a "
                        f"kernel output reduces every axis or the leading ones")
            return (f"it reduces axes {axes} of {shape}: a kernel output reduces every axis, "
                    f"or the leading ones (\"sum@k\"), and a row reduction the last ones "
                    f"(keepdims=true); it runs as a numpy node")
        if op.category == NN:  # one decompose kept whole (see passes/decompose.py)
            why = why_kept(n) or f"{n.op} is an nn op with no decomposition"
            return f"{why}: it runs as a numpy node"
        if op.category == COLLECTIVE:
            if op.ordered:
                return (f"{n.op} is a collective: it runs as a node of its own, through its "
                        f"group's communicator, in the order of the other collectives")
            return (f"{n.op} is a collective: its value depends on the rank, which its "
                    f"group's communicator gives when it runs, so it runs as a node of its own")
        return None

    def group_nodes(self) -> None:
        for n in self.graph.nodes:
            space = space_of(n)
            if space is None:
                reason = self.outside(n)
                if reason:
                    self.ctx.refuse(self.name(n), f"stays outside kernels: {reason}", n.loc)
                continue
            if _is_constant(n) or id(n) in self.inline:
                continue
            if n.opdef.has_effect:
                source = self.group.get(id(self.producer.get(n.inputs[1])))
                if source is None:
                    continue  # nothing fused computes the value: the assign stays as it is
                single = self.detached(space, [n])
                reason = self.why_not(source, single, b_is_newest=True)
                if reason:
                    self.ctx.refuse(f"{self.name(n)} {self.names[n.inputs[0]]}", f"stays a "
                                    f"separate assign: {reason}", n.loc)
                else:
                    self.merge(source, single)
                continue
            g = self.add(Group(space, [n]))
            if trailing_axes(n) is not None:
                self.row_values[n.out] = trailing_axes(n)
            g = self.join_row(n, g)
            for v in n.inputs:
                pg = self.group.get(id(self.producer.get(v)))
                if pg is None or pg is g or _is_constant(self.producer[v]):
                    continue
                # g is {n} alone until its first merge: then nothing grouped can follow it.
                reason = self.why_not(pg, g, b_is_newest=len(g.members) == 1)
                if reason:
                    self.ctx.refuse(f"{self.name(n)} into the kernel of "
                                    f"{self.name(self.producer[v])}", reason, n.loc)
                else:
                    g = self.merge(pg, g)

    def join_row(self, n: Node, g: Group) -> Group:
        """An elementwise node of a row's shape that reads row values of one group (a
        variance plus epsilon, its rsqrt) and nothing else that group makes joins it, in its
        space, as a row value: the kernel computes it once per row. Its group, as it is
        now."""
        for v in n.inputs:
            pg = self.group.get(id(self.producer.get(v)))
            r = self.row_values.get(v)
            if pg is None or r is None or n.out.shape != kernel_ir.row_shape(pg.space, r) or \
                    n.out.shape == pg.space:
                continue
            if any(self.group.get(id(self.producer.get(w))) is pg and w not in self.row_values
                   for w in n.inputs):
                return g  # (it reads an element value of pg: it is not of a row's shape)
            row = self.add(Group(pg.space, [n]))
            reason = self.why_not(pg, row, b_is_newest=True)
            if reason:
                self.ctx.refuse(f"{self.name(n)} into the kernel of {self.name(pg.members[0])}",
                                f"not a row value of it: {reason}", n.loc)
                return self.add(Group(g.space, [n]))
            self.row_values[n.out] = r
            return self.merge(pg, row)
        return g

    def merge_siblings(self) -> None:
        """Groups of one iteration space that read the same tensor, with no value passing
        between them, become one kernel: the tensor is read once, not once per kernel (a
        gradient-norm reduction and the update that both read the gradient)."""
        readers: dict[Value, list[Group]] = {}
        for n in self.graph.nodes:
            g = self.group.get(id(n))
            if g is None or g.space == ():
                continue
            for v in n.inputs:
                p = self.producer.get(v)
                if v.shape == g.space and (p is None or self.group.get(id(p)) is not g):
                    readers.setdefault(v, [])
                    if g not in readers[v]:
                        readers[v].append(g)
        for v, groups in readers.items():
            groups = list(dict.fromkeys(self.group[id(g.members[0])] for g in groups))
            acc = groups[0]
            for g in groups[1:]:
                if g is acc:
                    continue
                reason = self.why_not(acc, g)
                if reason:
                    self.ctx.refuse(f"{self.name(g.members[0])}", f"not fused with "
                                    f"{self.name(acc.members[0])}, which also reads "
                                    f"{self.names[v]}: {reason}", g.members[0].loc)
                else:
                    acc = self.merge(acc, g)

    def merge_scalar_siblings(self) -> None:
        """Scalar groups with no path between them become one kernel: one call, not several
        (each is a few flops; the call is what costs)."""
        merged: list[Group] = []
        for n in self.graph.nodes:
            g = self.group.get(id(n))
            if g is None or g.space != () or g.members[0] is not n:
                continue
            for acc in merged:
                if self.why_not(acc, g) is None:
                    self.merge(acc, g)
                    break
            else:
                merged.append(g)

    def note_stored_gradients(self) -> None:
        """Whole-step fusion's refusals, for explain: a gradient that only an update kernel
        (an optimizer's, multi-tensor) reads, made by another node, is stored and read back;
        one refusal per parameter says why it is not consumed where it is made."""
        for n in self.graph.nodes:
            if n.body is None or not kernel_ir.written(n):
                continue
            stores = [j for j, _ in kernel_ir.stores(n.body)]
            for row in kernel_ir.instance_rows(n):
                for v in dict.fromkeys(row):
                    p = self.producer.get(v)
                    if p is not None and v.shape != () and all(u is n for u in v.users) and \
                            not self.finishes(p):
                        params = ", ".join(self.names[row[j]] for j in stores)
                        self.ctx.refuse(f"the update of {params}", self.why_stored(v, p), n.loc)

    def finishes(self, p: Node) -> bool:
        """Whether p is a reduction that becomes a kernel's reduced output: an update that
        reads only it may run in that kernel's finish stage (passes/wholestep.py)."""
        return p.opdef.category == REDUCTION and leading_axes(p) is not None and \
            id(p) in self.group

    def why_stored(self, v: Value, p: Node) -> str:
        """Why the gradient v, which p makes, is not consumed inside the kernel that makes it."""
        what = f"its gradient {self.names[v]} ({v.type}, {v.type.nbytes} B stored and read back)"
        if p.opdef.category == LINALG:
            return (f"{what} is made by {self.name(p)}, a numpy node: only a gradient that an "
                    f"elementwise or reduction kernel makes can be consumed where it is made")
        return f"{what} is made by {self.name(p)}, outside the update kernel"

    # -- building kernels ----------------------------------------------------------------------
    def build(self, g: Group) -> tuple[Node, dict[Value, Value], set[Value]]:
        """The kernel node for a group; outer value -> kernel output; values it absorbed."""
        inside = {id(n) for n in g.members}
        body = _Body(self.producer, self.inline)
        kinds, results = body.add(g.members, inside, g.space, row_axis(g))
        k = Node("kernel", body.operands,
                 {"spaces": [list(g.space)], "outputs": kinds, "shared": []}, [],
                 self._outer_after(g, inside, body.operands), body=body.graph)
        k.outputs = [Value(t, k, i) for i, t in enumerate(infer_types(k))]
        mapping = dict(zip(results, k.outputs))
        for n in g.members:
            if n.opdef.has_effect:
                mapping[n.out] = k.outputs[-1]
        absorbed = {v for n in g.members for v in n.outputs if v not in mapping}
        return k, mapping, absorbed

    def _outer_after(self, g: Group, inside: set[int], operands: list[Value]) -> list[Value]:
        """The members' after edges to nodes outside the group (once each; an operand is
        ordered already)."""
        after: list[Value] = []
        for n in g.members:
            for v in n.after:
                p = self.producer.get(v)
                if (p is None or id(p) not in inside) and v not in after and v not in operands:
                    after.append(v)
        return after

    def _needed(self, g: Group) -> bool:
        """Whether anything outside reads the group or it stores: a group nothing reads
        (dead code dce has not removed yet) is left as it is."""
        inside = {id(n) for n in g.members}
        return any(n.op != "broadcast_to" for n in g.members) and \
            any(n.opdef.has_effect or read_outside(n.out, inside) for n in g.members)

    def rewrite(self) -> int:
        groups: list[Group] = []
        for n in self.graph.nodes:
            g = self.group.get(id(n))
            if g is not None and g.members[0] is n and self._needed(g):
                groups.append(g)
        mapping: dict[Value, Value] = {}
        kernel_of: dict[int, Node] = {}
        for g in groups:
            k, outs, absorbed = self.build(g)
            mapping.update(outs)
            for n in g.members:
                kernel_of[id(n)] = k
            # An after edge to a value that no longer exists waits for the whole kernel.
            mapping.update((v, k.outputs[0]) for v in absorbed)
        install(self.graph, kernel_of, mapping)
        return len(groups)


class _Body:
    """A kernel body being built from a group's nodes: each outer value it reads becomes an
    operand (`arg %xi`), a fill (a scalar constant, copied in) or an inlined scalar
    computation (recomputed per element rather than read; see _Fuser's inlining)."""

    def __init__(self, producer: dict[Value, Node], inline: set[int]):
        self.producer, self.inline = producer, inline
        self.graph = Graph("kernel")
        self.operands: list[Value] = []
        self.env: dict[Value, Value] = {}  # outer value -> its element in the body

    def element(self, v: Value) -> Value:
        env, body = self.env, self.graph
        if v in env:
            return env[v]
        p = self.producer.get(v)
        if _is_constant(p) and not isinstance(p.attrs["value"], np.ndarray):
            t = TensorType((), v.dtype)  # a fill: one scalar, copied into the body
            env[v] = body.add_node("constant", [], {**p.attrs, "shape": ()}, out_types=[t],
                                   loc=p.loc).out
        elif p is not None and id(p) in self.inline:
            env[v] = body.add_node(p.op, [self.element(x) for x in p.inputs], p.attrs,
                                   loc=p.loc).out
        else:
            self.operands.append(v)
            env[v] = body.add_input("arg", f"x{len(self.operands) - 1}",
                                    TensorType((), v.dtype))
        return env[v]

    def add(self, members: list[Node], inside: set[int], space: tuple[int, ...], r: int | None
            ) -> tuple[list[str], list[Value]]:
        """The members as body nodes: an assign becomes a store, a reduction a reduced output
        (a row reduction: a body node), an element value read outside the kernel a mapped
        output, a row value so read a "row@r" one. The output kinds and the outer values
        they stand for."""
        body = self.graph
        kinds: list[str] = []
        results: list[Value] = []
        stores: list[Value] = []
        for n in members:
            if n.opdef.has_effect:
                target, value = self.element(n.inputs[0]), self.element(n.inputs[1])
                stores.append(body.add_node("store", [target, value], loc=n.loc).out)
            elif n.op == "broadcast_to":  # an operand broadcasts into the space as it is
                self.env[n.out] = self.element(n.inputs[0])
            elif trailing_axes(n) is not None:
                t = TensorType((), n.out.dtype)
                self.env[n.out] = body.add_node(n.op, [self.element(n.inputs[0])], n.attrs,
                                                out_types=[t], loc=n.loc).out
            elif n.opdef.category == REDUCTION:
                kinds.append(kernel_ir.kind_for(n.op, n.attrs["axes"], n.inputs[0].type.ndim))
                results.append(n.out)
                body.outputs.append(self.element(n.inputs[0]))
            else:
                self.env[n.out] = body.add_node(n.op, [self.element(v) for v in n.inputs],
                                                n.attrs, loc=n.loc).out
        for n in members:  # element results read outside the kernel leave it as "map"
            if n.opdef.has_effect or n.out not in self.env:
                continue
            if read_outside(n.out, inside):
                kinds.append("map" if n.out.shape == space else f"{kernel_ir.ROW}@{r}")
                results.append(n.out)
                body.outputs.append(self.env[n.out])
        body.effects = stores
        return kinds, results


@register("fuse")
def fuse(graph: Graph, ctx: PassContext) -> dict:
    names = value_names(graph) if any(map(decomposable, graph.nodes)) else None
    decomposed = decompose(graph)
    if decomposed:  # a loss's parts and its gradient's (a log_softmax of the same logits)
        cse(graph, ctx)
    f = _Fuser(graph, ctx)
    if names is not None:  # refusals name values as the graph before fuse does
        for old, parts in decomposed.items():
            names.update((v, f"{names[old]}.{role}") for role, v in parts.items())
            names[parts["out"]] = names[old]
        f.names = names
    f.group_nodes()
    f.merge_siblings()
    f.merge_scalar_siblings()
    f.note_stored_gradients()
    groups = {id(g): g for g in f.group.values()}.values()
    absorbed = sum(len(g.members) for g in groups)
    rows = sum(trailing_axes(n) is not None for g in groups for n in g.members)
    kernels = f.rewrite()
    stats = {"kernels": kernels, "nodes_fused": absorbed}
    if decomposed:
        stats["decomposed"] = len(decomposed)
    return {**stats, "row_reductions": rows} if rows else stats
