"""The verifier: checks the rules every graph obeys, before and after every pass.

Each violation raises a VerifyError naming the rule and the node:

  known-op           every node's op is in the registry, with the attributes it declares
  attr-kind          every attribute is of the kind its op declares (OpDef.attr_kinds): an
                     integer is an int, a flag a bool, a shape a list of ints >= 0
  size               every tensor has at most 64 dimensions, each >= 0, and at most 2**63-1
                     bytes (a kernel's spaces: elements), so no size wraps in int64
  types              every node's output types are what the op's type rule gives (a kernel's
                     come from its body; a constant's value is one of its dtype's); a token
                     is never data, also not in a return, and a row gradient is not returned
                     (a step returns its parts)
  unique-names       graph inputs have distinct names
  defined-before-use every value is defined (by an input or an earlier node) before it is used
  acyclic            no value depends on itself (reported apart from misordering)
  assign-target      assign writes a `param` input of this graph; a kernel stores only into
                     parameters
  one-assign         at most one write (assign or kernel store) per parameter
  write-after-read   every node that reads @p is ordered before the node that writes @p, by
                     data or after edges; this is what lets a backend update @p in place.
                     Only live nodes count (what the return reaches): the others never run
  collective-order   the ordered nodes (OpDef.ordered: the collectives every rank runs in one
                     order), in graph order, form one chain: each but the first depends, by
                     data or after edges, on the ordered node before it
  collective-predicate  a predicated collective's predicate (OpDef.predicated: its last
                     operand) is rank-independent: computed only from Parameters, constants
                     and results every rank receives alike (OpDef.uniform), never from a
                     step input or a rank's own part, so every rank communicates on the
                     same runs (ranks that disagree would wait for each other forever)
  kernel-body        a kernel body has element-typed `arg` inputs and only elementwise ops,
                     row reductions (their axes checked by the kernel's type rule), scalar
                     constants and stores (one per input); `store` appears only there
  kernel-aliasing    a parameter a kernel stores is bound to exactly one of its operands
  uses               each node output's use list (Value.users) names the nodes of this graph
                     that read it and the graph if its return does, as many times as they
                     read it: what replace_all_uses_with relies on. Operands lists keep it;
                     a pass breaks it by dropping a node from graph.nodes without detach()
"""
from __future__ import annotations

import functools
import itertools
import operator
from collections import Counter
from typing import Any, Callable

from ..errors import GraphoptError, VerifyError
from .analysis import live_nodes, producers, unordered_readers
from .graph import Graph, Node, Value
from .kernel import infer_types, layout, stores, written
from .printer import Namer, format_node, value_names
from .registry import (COLLECTIVE, CONSTANT, ELEMENTWISE, KERNEL, REDUCTION, REGISTRY,
                       check_attr_kinds, check_attrs)
from .types import RowsType, TensorType, TokenType, Type, shape_problem
from .uses import Operands

_NAME, _TYPE = operator.attrgetter("name"), operator.attrgetter("type")

Fail = Callable[[str, "Node | Value | Graph | None", str], None]
# Where each node, graph input and return (keyed by its graph) is written in IR text that was
# parsed (parse(text, lines=...)); empty for a graph built in code.
Lines = dict[Any, int]


def _describe(node: Node, graph: Graph, lines: Lines) -> str:
    """The node's printed line, with the names it has in the printed graph (and its line in
    the text it was read from)."""
    at = f" (line {lines[node]})" if node in lines else ""
    name = Namer()
    for v in graph.inputs:
        name.define(v)
    for n in graph.nodes:
        if n is node:
            try:
                return f"`{format_node(n, name)}`{at}"
            except TypeError:  # an attribute the text form has no spelling for
                return repr(node) + at
        for v in n.outputs:
            name.define(v)
    return repr(node) + at


@functools.lru_cache(maxsize=4096)
def _size_problem(t: Type) -> str | None:
    """What makes a tensor type too large (or negative), or None; a token has no size; a row
    gradient's dense tensor and values are tensors."""
    if isinstance(t, RowsType):
        return _size_problem(t.dense) or _size_problem(t.values_type)
    return shape_problem(t.shape, t.dtype.itemsize) if isinstance(t, TensorType) else None


def verify(graph: Graph, lines: Lines | None = None) -> None:
    """Raise VerifyError on the first rule the graph breaks.

    Args:
        graph: the graph.
        lines: where its nodes, inputs and returns are written, if it was parsed (what
            `parse(text, lines=...)` fills): each node a message names carries its line, and
            the error's `node` (the node, graph input, or graph whose return breaks the
            rule) is a key of it.
    """
    _verify(graph, region=False, lines=lines or {})


def _inputs_fine(inputs: list[Value]) -> bool:
    """Whether the inputs have distinct names and are tensors of sizes that fit (the rules
    _verify checks input by input), tested at once."""
    types = list(map(_TYPE, inputs))
    return len(set(map(_NAME, inputs))) == len(inputs) and \
        all(type(t) is TensorType for t in types) and \
        not any(shape_problem(*k) for k in {(t.shape, t.dtype.itemsize) for t in types})


def _verify(graph: Graph, region: bool, lines: Lines) -> None:
    def fail(rule: str, node: Node | Value | Graph | None, msg: str) -> None:
        inside = " (in a kernel body)" if region else ""
        where = f" in {_describe(node, graph, lines)}{inside}" if isinstance(node, Node) \
            else inside
        raise VerifyError(rule, f"{msg}{where}", node)

    def describe(node: Node) -> str:
        return _describe(node, graph, lines)

    if not _inputs_fine(graph.inputs):  # (thousands of inputs: one test, then the culprit)
        names = set()
        for v in graph.inputs:
            if v.name in names:
                fail("unique-names", v, f"graph input '{v.name}' is declared twice")
            names.add(v.name)
            if not isinstance(v.type, TensorType):
                fail("types", v, f"graph input '{v.name}' is a {v.type}; inputs are tensors")
            problem = _size_problem(v.type)
            if problem is not None:
                fail("size", v, f"graph input '{v.name}': {v.type} has {problem}")

    producer = producers(graph)
    defined: set[Value] = set(graph.inputs)
    for node in graph.nodes:
        for v in node.operands():
            if v not in defined:
                if v in producer and _reaches(producer[v], node, producer):
                    fail("acyclic", node, f"the node depends on its own result through a "
                                          f"cycle, by its operand from {describe(producer[v])}")
                later = f"defined only later, by {describe(producer[v])}," if v in producer \
                    else "not defined in this graph"
                fail("defined-before-use", node, f"an operand is {later}")
        _check_node(node, fail, region, lines)
        defined.update(node.outputs)
    for v in graph.returned():
        if v not in defined:
            fail("defined-before-use", graph, "the return uses a value not defined in this graph")
    for v in graph.outputs:
        if isinstance(v.type, TokenType):
            fail("types", graph, f"the return gives the token {value_names(graph).get(v, '?')} "
                                 f"as data; a token orders, in after(...)")
        if isinstance(v.type, RowsType):
            fail("types", graph, f"the return gives the row gradient "
                                 f"{value_names(graph).get(v, '?')}; return its parts "
                                 f"(rows_indices, rows_values) or densify it")
    if region:
        _check_body(graph, fail)
    else:
        _check_writes(graph, fail, describe)
        _check_order(graph, fail, describe)
        _check_predicates(graph, fail, describe)
    _check_uses(graph, fail)


def _check_node(node: Node, fail: Fail, region: bool, lines: Lines) -> None:
    op = REGISTRY.get(node.op)
    if op is None:
        fail("known-op", node, f"unknown op '{node.op}'")
    try:
        check_attrs(op, node.attrs)
    except GraphoptError as e:
        fail("known-op", node, e.message)
    for v in node.outputs:
        problem = _size_problem(v.type)
        if problem is not None:
            fail("size", node, f"a result of type {v.type} has {problem}")
    try:
        check_attr_kinds(op, node.attrs)
    except GraphoptError as e:
        fail("attr-kind", node, e.message)
    if (node.body is None) != (op.category != KERNEL):
        fail("kernel-body", node, "a kernel node needs a body, and only a kernel has one")
    if node.op == "store" and not region:
        fail("kernel-body", node, "store is only allowed inside a kernel body (use assign)")
    if region and node.op not in ("store",) and \
            op.category not in (ELEMENTWISE, CONSTANT, REDUCTION):
        fail("kernel-body", node, f"{node.op} cannot be inside a kernel body")
    if node.body is not None:
        _verify(node.body, region=True, lines=lines)
    try:
        # A row reduction in a body is an element of its operand's type (the kernel checks
        # its axes against the spaces: kernel.infer_types).
        expected = [v.type for v in node.inputs[:1]] if region and op.category == REDUCTION \
            else infer_types(node)
    except GraphoptError as e:
        fail("types", node, e.message)
    got = [v.type for v in node.outputs]
    if list(expected) != got:
        fail("types", node, f"output types {', '.join(map(str, got))} but the type rule of "
                            f"{node.op} gives {', '.join(map(str, expected))}")
    if node.body is not None:
        targets = written(node)
        if {v.kind for v in targets} - {"param"}:
            fail("assign-target", node, "a kernel stores only into parameters")
        # Each target once among all operands; counted only when a quick test says some
        # operand repeats (kernels have thousands of operands).
        if len(set(node.inputs)) != len(node.inputs):
            uses = Counter(node.inputs)
            for v in targets:
                if uses[v] != 1:
                    fail("kernel-aliasing", node, f"@{v.name} is stored by this kernel, so it "
                                                  f"must be exactly one of its operands")


def _check_body(body: Graph, fail: Fail) -> None:
    for v in body.inputs:
        if v.kind != "arg" or v.type.shape != ():
            fail("kernel-body", v, f"body input {v.name} must be an element (arg, shape [])")
    for n in body.nodes:
        if n.op == "constant" and n.out.type.shape != ():
            fail("kernel-body", n, "constants in a kernel body are scalars")
        if n.op == "store" and n.inputs[0] not in body.inputs:
            fail("kernel-body", n, "store writes one of the body's inputs")
    targets = [j for j, _ in stores(body)]
    if len(targets) != len(set(targets)):
        fail("kernel-body", None, "a body input is stored more than once")


def _reaches(start: Node, target: Node, producer: dict[Value, Node]) -> bool:
    """Whether `target` is an ancestor of `start`'s operands: then start -> target -> start."""
    seen, stack = set(), [start]
    while stack:
        n = stack.pop()
        for v in n.operands():
            p = producer.get(v)
            if p is target:
                return True
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                stack.append(p)
    return False


def _check_writes(graph: Graph, fail: Fail, describe: Callable[[Node], str]) -> None:
    producer = producers(graph)
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    params = set(graph.params)
    writers: dict[Value, Node] = {}
    own: dict[int, set[Value]] = {}  # what each node writes
    for n in graph.nodes:
        listed = written(n)
        targets = own[id(n)] = set(listed)
        if not targets:
            continue
        if not targets <= params:
            fail("assign-target", n, "assign must write a parameter (an @name input) of "
                                     "this graph")
        if len(targets) != len(listed) or not targets.isdisjoint(writers):
            again = next(v for v in listed if v in writers or listed.count(v) > 1)
            first = f", first by {describe(writers[again])}," if again in writers else ""
            fail("one-assign", n, f"@{again.name} is written more than once{first}")
        writers.update(dict.fromkeys(targets, n))
    # Only nodes that run count, the live ones (backends skip the rest): a pass may leave a
    # dead reader of @p behind for dce to remove (simplify's x*0 -> 0 orphans x).
    live = live_nodes(graph)
    readers: dict[Value, list[Node]] = {}
    for n in graph.nodes:  # set operations: a kernel reads thousands of values
        if id(n) in live:
            for v in (writers.keys() & n.inputs) - own[id(n)]:
                readers.setdefault(v, []).append(n)
    # One search per writer, for the readers of everything it writes (a multi-tensor kernel
    # writes thousands of parameters).
    by_writer: dict[int, tuple[Node, list[Node]]] = {}
    for target, reads in readers.items():
        w = writers[target]
        if id(w) in live:
            by_writer.setdefault(id(w), (w, []))[1].extend(reads)
    for w, reads in by_writer.values():
        unordered = unordered_readers(w.operands(), list(dict.fromkeys(reads)), producer, index)
        if unordered:
            r = unordered[0]
            target = next(v for v in r.inputs if writers.get(v) is w)
            fail("write-after-read", r, f"this node reads @{target.name}, which "
                 f"{describe(w)} writes, but is not ordered before that writer (add the "
                 f"reader's result to the writer's after(...))")


def _check_order(graph: Graph, fail: Fail, describe: Callable[[Node], str]) -> None:
    """Each ordered node depends on the one before it. One walk in graph order: `newest` is,
    for each value, the position among the ordered nodes of the newest one it depends on;
    a node depends on ordered node k-1 exactly when the newest among its operands' is k-1
    (nothing it reads can depend on a later one)."""
    ordered = [REGISTRY[n.op].ordered for n in graph.nodes]
    if True not in ordered:  # most graphs: nothing to walk
        return
    first = ordered.index(True)  # nothing before it depends on an ordered node
    newest: dict[Value, int] = {}
    chain: list[Node] = []
    for n, is_ordered in zip(graph.nodes[first:], ordered[first:]):
        last = max(map(newest.get, n.operands(), itertools.repeat(-1)), default=-1)
        if is_ordered:
            if chain and last != len(chain) - 1:
                fail("collective-order", n, f"this ordered node does not depend on the "
                     f"ordered node before it, {describe(chain[-1])}, by data or "
                     f"after edges, and every rank must run them in one order: list that "
                     f"node's result in this one's after(...)")
            last = len(chain)
            chain.append(n)
        if last >= 0:
            newest.update(zip(n.outputs, itertools.repeat(last)))


def _check_predicates(graph: Graph, fail: Fail, describe: Callable[[Node], str]) -> None:
    """Every predicated collective's predicate is rank-independent. One walk in graph order:
    `local` maps each rank-dependent value to the input it depends on (for the message)."""
    if not any(REGISTRY[n.op].predicated for n in graph.nodes):
        return
    local: dict[Value, Value] = {v: v for v in graph.inputs if not v.is_param}
    for n in graph.nodes:
        op = REGISTRY[n.op]
        if op.predicated and n.inputs[-1] in local:
            source = local[n.inputs[-1]]
            what = (f"the step input %{source.name}" if source in graph.inputs else
                    f"{describe(source.node)}, a rank's own value")
            fail("collective-predicate", n, f"its predicate is computed from {what}, which "
                 f"may differ between the ranks: they would not communicate on the same runs. "
                 f"Compute it from Parameters, constants or all_reduced values")
        if op.uniform:
            continue
        if op.category == COLLECTIVE and not op.predicated:  # shard, reduce_scatter
            local.update((v, v) for v in n.outputs)
            continue
        if n.body is not None:  # a kernel: each output by what its body computes it from
            local.update(_kernel_local(n, local))
            continue
        source = next((local[v] for v in n.inputs if v in local), None)
        if source is not None:
            local.update((v, source) for v in n.outputs)


def _kernel_local(n: Node, local: dict[Value, Value]) -> dict[Value, Value]:
    """The outputs of kernel `n` computed from a rank-dependent operand, each with the input
    it depends on: fusion may put a predicate and a rank's own values in one kernel, and only
    the outputs its body computes from the rank's values are the rank's (per instance; the
    token and a row kernel's rows: from every operand)."""
    lay, body = layout(n), n.body
    reads: dict[Value, frozenset[int]] = {v: frozenset((i,)) for i, v in enumerate(body.inputs)}
    for b in body.nodes:
        reads.update(dict.fromkeys(b.outputs, frozenset().union(
            *(reads.get(v, frozenset()) for v in b.operands()))))
    anywhere = next((local[v] for v in n.inputs if v in local), None)
    if anywhere is None:
        return {}
    lead = next((local[v] for v in n.inputs[:lay.lead] if v in local), None)
    found = {n.outputs[-1]: anywhere} if lay.has_token else {}
    for instance in range(lay.instances):
        for j, v in enumerate(body.outputs):
            operands = (n.inputs[lay.operand_index(instance, i)] for i in sorted(reads[v]))
            source = lead or next((local[o] for o in operands if o in local), None)
            if source is not None:
                found[n.outputs[lay.output_index(instance, j)]] = source
    return found


def _check_uses(graph: Graph, fail: Fail) -> None:
    """Every operand list is its reader's own, the use lists of this graph's node outputs name
    only readers in it, and they count as many reads of node outputs as the operand lists
    hold. In C loops (map, attrgetter, sets): a graph has 20,000 nodes."""
    chain = itertools.chain.from_iterable
    lists = [*chain(map(_NODE_LISTS, graph.nodes)), *graph.operand_lists()]
    owners = [*chain(zip(graph.nodes, graph.nodes)), graph, graph]
    if not all(map(isinstance, lists, itertools.repeat(Operands))) or \
            not all(map(operator.is_, map(_USER, lists), owners)):
        reader = next(r for o, r in zip(lists, owners) if getattr(o, "user", None) is not r)
        fail("uses", reader if isinstance(reader, Node) else None,
             "its inputs, after edges, outputs or effects are a list no use list follows "
             "(edit the Operands list in place)")
    values = list(chain(map(_OUTPUTS, graph.nodes)))
    uses = list(map(_USERS, values))
    members = {*graph.nodes, graph}
    if not members.issuperset(chain(uses)):
        v = next(v for v in values if not members.issuperset(v.users))
        fail("uses", v.node, f"the use list of {_name(graph, v)} names a node that is not in "
                             f"the graph (one taken out of graph.nodes without detach(), or "
                             f"made and dropped)")
    listed = sum(map(sum, map(dict.values, uses)))
    reads = operator.countOf(map(_KIND, chain(lists)), None)  # of node outputs: kind None
    if listed != reads:
        fail("uses", None, f"the use lists count {listed} reads, the operand lists {reads}")


_NODE_LISTS = operator.attrgetter("inputs", "after")
_OUTPUTS, _USER, _USERS, _KIND = (operator.attrgetter(a) for a in ("outputs", "user", "users",
                                                                   "kind"))


def _name(graph: Graph, v: Value) -> str:
    return value_names(graph).get(v, repr(v))
