"""hfuse: horizontal (multi-tensor) fusion: kernels with one body become one kernel.

An optimizer applies the same update rule to every parameter, so after `fuse` there is one
kernel per parameter, all with the same body (and after `rowfuse`, one row kernel per
embedding table). `hfuse` maps that body over all of them in one
multi-tensor kernel (MindSpore's HyperMap): one body to compile, one call to run, however many
parameters. Kernels are combined when
  - their bodies print the same (same ops, attributes, dtypes, constants) and their outputs
    are of the same kinds;
  - every operand either streams (has exactly the kernel's iteration space: one tensor per
    instance; a row kernel's tables, read at its rows, too) or is a scalar that all of them
    share (a learning rate, a bias correction); sizes may differ from one instance to the
    next;
  - none has a reduction over leading axes ("sum@k": its result's shape would differ from
    one instance to the next);
  - no kernel depends on another of the group (that would need two passes, not one);
  - none has row reductions (a LayerNorm's, a softmax's): their row passes are compiled for
    one iteration space, so such a kernel stays as it is, with a refusal saying so when
    another has the same body.

    %5, %6 = kernel @w0, %g0, %lr {spaces=[[4,3]], ...}      %9 = kernel @w0, %g0, @w1, %g1,
    %7, %8 = kernel @w1, %g1, %lr {spaces=[[10]], ...}   ->       %lr {spaces=[[4,3], [10]],
                                                                  shared=[2], ...}
"""
from __future__ import annotations

import functools
from typing import Callable

from ..ir.graph import Graph, Node, Value
from ..ir.kernel import body_reductions, infer_types, layout
from ..ir.printer import value_names
from .cse import attrs_key
from .grouping import Group, Grouping, install
from .manager import PassContext, register


def signature(k: Node) -> tuple | None:
    """What kernels must share to be one multi-tensor kernel; None if k cannot take part."""
    outputs = tuple(k.attrs.get("outputs", ()))  # (a row kernel has none: it only stores)
    if len(k.attrs["spaces"]) != 1 or any("@" in kind for kind in outputs):
        return None  # (a leading-axes reduction's shape would differ per instance)
    space = tuple(k.attrs["spaces"][0])
    indexed = tuple(k.attrs.get("indexed", ()))  # a row kernel's tables: read at its rows
    shared = []
    for j, v in enumerate(k.inputs[layout(k).lead:]):
        if v.shape == () and space != ():
            shared.append((j, id(v)))  # the same scalar for every instance
        elif v.shape != space and j not in indexed:
            return None  # a broadcast operand: its layout would differ per instance
    return ((k.op, body_key(k.body), indexed), outputs, tuple(shared), space == ())


def body_key(body: Graph) -> tuple:
    """What a kernel body computes, without its Values: ops, exact attributes, types, and
    which earlier value each node reads (cheaper than printing it, for thousands of kernels)."""
    index = {v: i for i, v in enumerate(body.inputs)}
    nodes = []
    for n in body.nodes:
        nodes.append((n.op, attrs_key(n.attrs), tuple(index[v] for v in n.inputs),
                      tuple(v.type for v in n.outputs)))
        index.update((v, len(index)) for v in n.outputs)
    return (tuple(v.type for v in body.inputs), tuple(nodes),
            tuple(index[v] for v in body.outputs), tuple(index[v] for v in body.effects))


@register("hfuse")
def hfuse(graph: Graph, ctx: PassContext) -> dict:
    grouping = Grouping(graph)
    names = functools.cache(lambda: value_names(graph))  # for refusals, which are rare
    buckets = _bundles(graph, grouping, ctx, names)
    _refuse_other_scalars(buckets, ctx, names)
    mapping: dict[Value, Value] = {}
    replaced: dict[int, Node] = {}
    made = 0
    for groups in buckets.values():
        for group in groups:
            bundle = group.members
            if len(bundle) < 2:
                continue
            k = _combine(bundle)
            made += 1
            for old in bundle:
                replaced[id(old)] = k
            lay = layout(k)
            for i, old in enumerate(bundle):
                for j in range(lay.body_outputs):
                    mapping[old.outputs[j]] = k.outputs[lay.output_index(i, j)]
                if lay.has_token:
                    mapping[old.outputs[-1]] = k.outputs[-1]
    install(graph, replaced, mapping)
    return {"multi_tensor_kernels": made,
            "kernels_mapped": sum(1 for _ in replaced)}


def _bundles(graph: Graph, grouping: Grouping, ctx: PassContext,
             names: Callable[[], dict[Value, str]]) -> dict[tuple, list[Group]]:
    """The kernels by signature, each signature's kernels bundled greedily in graph order: a
    kernel joins the first bundle of its signature it does not depend on (nor it on it)."""
    buckets: dict[tuple, list[Group]] = {}
    rows: dict[tuple, Node] = {}  # the first kernel with row reductions of each body
    for n in graph.nodes:
        if n.body is None:
            continue
        if n.op == "kernel" and body_reductions(n.body):
            first = rows.setdefault(body_key(n.body), n)
            if first is not n:  # (a kernel with the same body: it would have been mapped)
                ctx.refuse(f"{names()[n.outputs[0]]} = kernel", f"not mapped with the kernel "
                           f"of {names()[first.outputs[0]]}: they reduce rows, and row passes "
                           f"are compiled for one iteration space", n.loc)
            continue
        sig = signature(n)
        if sig is None or sig[-1]:  # scalar kernels: nothing to gain from mapping them
            continue
        alone = grouping.add(Group((), [n]))
        for bundle in buckets.setdefault(sig, []):
            # Bundles already formed count as units: two bundles that each look fine may
            # still need each other (A,D need B's result, B,C need A's).
            inside = {id(m) for m in bundle.members}
            direct = next((grouping.producer[v] for v in n.operands() if v in grouping.producer
                           and id(grouping.producer[v]) in inside), None)
            via = direct or grouping.cycle_via(bundle, alone, b_is_newest=True)
            if via is None:
                grouping.merge(bundle, alone)
                break
            ctx.refuse(f"{names()[n.outputs[0]]} = kernel",
                       f"not mapped with the kernel of {names()[bundle.members[0].outputs[0]]}: "
                       f"they depend on each other through {names()[via.outputs[0]]}", None)
        else:
            buckets[sig].append(alone)
    return buckets


def _refuse_other_scalars(buckets: dict[tuple, list[Group]], ctx: PassContext,
                          names: Callable[[], dict[Value, str]]) -> None:
    """Kernels of one body that read other scalars stay apart (one multi-tensor kernel shares
    each scalar operand among all its instances): say so, explain() shows it."""
    first_of_body: dict[tuple, Node] = {}
    for sig, groups in buckets.items():
        k = groups[0].members[0]
        first = first_of_body.setdefault((sig[0], sig[1], sig[3]), k)  # (not the scalars)
        if first is not k:
            ctx.refuse(f"{names()[k.outputs[0]]} = kernel",
                       f"not mapped with the kernel of {names()[first.outputs[0]]}: the same "
                       f"body, but other shared scalars ({_scalars(k, names())} vs "
                       f"{_scalars(first, names())})", None)


def _scalars(k: Node, names: dict[Value, str]) -> str:
    return ", ".join(names[v] for v in k.inputs if v.shape == ())


def _combine(bundle: list[Node]) -> Node:
    first = bundle[0]
    lead = layout(first).lead  # a row kernel's rows: each instance's first
    space = tuple(first.attrs["spaces"][0])
    operands = first.inputs[lead:]
    shared = [j for j, v in enumerate(operands) if v.shape == () and space != ()]
    per = [j for j in range(len(operands)) if j not in shared]
    inputs = [k.inputs[j] for k in bundle for j in range(lead)] + \
        [k.inputs[lead + j] for k in bundle for j in per] + [operands[j] for j in shared]
    after: list[Value] = []
    for k in bundle:
        after += [v for v in k.after if v not in after]
    attrs = {**first.attrs, "spaces": [list(k.attrs["spaces"][0]) for k in bundle],
             "shared": shared}
    node = Node(first.op, inputs, attrs, [], after, body=first.body)
    node.outputs = [Value(t, node, i) for i, t in enumerate(infer_types(node))]
    return node
