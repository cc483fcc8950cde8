"""The passes of data parallelism: gradient buckets, and ZeRO's reduce_scatter.

`bucket` packs all_reduces into flat buckets, so a step makes a few large collectives
instead of one per gradient (a collective's fixed cost is paid per call):

    %a = all_reduce %g0 {reduce="mean"} : f32[64,2]      %f = concat (reshape %g0), (reshape %g1)
    %b = all_reduce %g1 {reduce="mean"} : f32[64]   ->   %r = all_reduce %f {reduce="mean"}
                                                         %a = reshape (slice %r [0:128])

`zero` finds what ZeRO's optimizer step (sharding.py) traces, a shard of a bucket of
all_reduced gradients, `shard(concat(reshape(all_reduce(g_i))..., zeros))`, and makes it one
collective over the whole bucket: a reduce_scatter (this rank receives only its shard's
sums, and holds no whole gradient). Where a gradient is also read whole (its norm logged),
zero=2 gathers the reduced shards back for those readers (all_gather), so the bytes sent
are still those of an all_reduce, and the refusal list says which readers did that; zero=1
all_reduces such a bucket whole (every rank holds it) and the optimizer takes its shard.
Where nothing reads them whole, zero=1's gradients are reduce_scattered as zero=2's: the
same sums, a third fewer bytes than an all_reduce then an all_gather of the parameters.
A compressed bucket (DataParallel(compress=...): `cast(all_reduce(half))` parts) is reduced
in its half dtype, and only what the optimizer reads is cast back: the shard, or the bucket
an all_reduce kept whole.

Both passes run before the others (DataParallel puts them first) and keep the collectives
a chain in node order (`rechain`), the same on every rank: passes are deterministic.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..ir.analysis import toposort
from ..ir.graph import Graph, Location, Node, Value
from ..ir.registry import CONSTANT
from ..ir.types import TensorType
from ..passes.manager import PassContext, register
from .layout import DEFAULT_BUCKET_BYTES, Bucket, pack


def _is_ordered(n: Node | None) -> bool:
    return n is not None and n.body is None and n.opdef.ordered


def unchain(graph: Graph) -> None:
    """Drop the after edges between ordered nodes (rechain makes them again)."""
    for n in graph.nodes:
        if _is_ordered(n) and n.after:
            n.after[:] = [v for v in n.after if not _is_ordered(v.node)]


def rechain(graph: Graph) -> None:
    """Order every ordered node (the collectives) after the one before it in node order:
    the chain every rank follows."""
    prev: Value | None = None
    for n in graph.nodes:
        if _is_ordered(n):
            if prev is not None and prev not in n.after:
                n.after += [prev]
            prev = n.outputs[0]


def _flat(graph: Graph, values: list[Value], loc: Location | None,
          tail: list[Value] = ()) -> Value:
    """The values' elements end to end (then `tail`, already flat): a concat of reshapes."""
    parts = [v if len(v.type.shape) == 1 else
             graph.add_node("reshape", [v], {"shape": (int(np.prod(v.type.shape)),)}, loc=loc).out
             for v in values] + list(tail)
    return parts[0] if len(parts) == 1 else graph.add_node("concat", parts, {"axis": 0}, loc=loc).out


def _read_back(graph: Graph, whole: Value, olds: list[Node], layout: Bucket) -> None:
    """Each old collective's readers read its part of the flat `whole` instead."""
    for old, at, n, shape in zip(olds, layout.offsets, layout.sizes, layout.shapes):
        part = graph.add_node("slice", [whole], {"starts": (at,), "stops": (at + n,),
                                                  "steps": (1,), "shape": (n,)}, loc=old.loc).out
        if shape != (n,):
            part = graph.add_node("reshape", [part], {"shape": shape}, loc=old.loc).out
        old.out.replace_all_uses_with(part)


def _finish(graph: Graph, dead: list[Node], placed: dict[int, list[Node]]) -> None:
    """Drop the dead nodes; put the new ones (appended by add_node) where the node they
    replace was (`placed`: id of that node -> the new nodes), so the collectives keep their
    order in the chain; then a topological order and the chain again."""
    gone = {id(n) for n in dead}
    for n in dead:
        n.detach()
    new = {id(n) for made in placed.values() for n in made}
    order: list[Node] = []
    for n in graph.nodes:
        if id(n) not in new:
            order += placed.get(id(n), [])
            if id(n) not in gone:
                order.append(n)
    graph.nodes = order
    toposort(graph)
    rechain(graph)


def _depends_on(v: Value, members: list[Node], position: dict[int, int]) -> bool:
    """Whether v is computed from any of the members (nodes in topological order)."""
    first = min(position[id(m)] for m in members)
    targets = {id(m) for m in members}
    stack, seen = [v.node], set()
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen or position[id(n)] < first:
            continue  # an input, or a node before every member: not computed from them
        if id(n) in targets:
            return True
        seen.add(id(n))
        stack += [u.node for u in n.operands()]
    return False


@register("bucket")
def bucket(graph: Graph, ctx: PassContext) -> dict:
    """Pack all_reduces (or all_reduce_whens of one predicate) of the same group, reduction
    and dtype into flat buckets that close
    once they hold `bucket_bytes` (option, default 25 MiB, torch DDP's): one all_reduce
    per bucket, in chain order; each reader reads its part back (slice, reshape)."""
    cap = ctx.options.get("bucket_bytes", DEFAULT_BUCKET_BYTES)
    runs: dict[tuple, list[Node]] = {}
    for n in graph.nodes:
        if n.op in ("all_reduce", "all_reduce_when"):
            # (all_reduce_when: those of one predicate, which every member keeps)
            key = (n.op, *sorted(n.attrs.items()), n.out.type.dtype,
                   *map(id, n.inputs[1:]))
            runs.setdefault(key, []).append(n)
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    unchain(graph)
    dead: list[Node] = []
    placed: dict[int, list[Node]] = {}
    for members in runs.values():
        sizes = [m.out.type.nbytes for m in members]
        fits: Callable[[list[int], int], bool] = lambda current, i: not _depends_on(
            members[i].inputs[0], [members[j] for j in current], position)
        for indices in pack(sizes, cap, fits):
            if len(indices) < 2:
                continue
            olds = [members[i] for i in indices]
            layout = Bucket(tuple(m.out.type.shape for m in olds))
            loc, start = olds[0].loc, len(graph.nodes)
            flat = _flat(graph, [m.inputs[0] for m in olds], loc)
            whole = graph.add_node(olds[0].op, [flat, *olds[0].inputs[1:]],
                                   dict(olds[0].attrs), loc=loc).out
            _read_back(graph, whole, olds, layout)
            placed[id(olds[-1])] = graph.nodes[start:]  # where the last member was
            dead += olds
    _finish(graph, dead, placed)
    return {"buckets": len(placed), "packed": len(dead)}


def _widened(n: Node | None) -> Node | None:
    """The all_reduce sum that a cast back from a compressed (f16/bf16) sum reads, if n is
    that cast (DataParallel(compress=...))."""
    if n is None or n.op != "cast":
        return None
    src = n.inputs[0].node
    if src is None or src.op != "all_reduce" or src.attrs["reduce"] != "sum" or \
            src.out.type.dtype.itemsize != 2:
        return None
    return src


def _gradient_parts(values: list[Value], shard: Node
                    ) -> tuple[list[Node], list[Value], list[Node]] | str:
    """The all_reduces a sharded bucket is made of (the values it joins), its padding, and
    the casts back to the gradients' dtype of a compressed bucket's sums; or why not."""
    olds, tail, casts = [], [], []
    for v in values:
        n = v.node
        if n is not None and n.opdef.category == CONSTANT and not tail and olds and \
                not np.any(n.attrs["value"]):
            tail.append(v)  # the zeros that pad the bucket to a multiple of the ranks
            continue
        if n is not None and n.op == "reshape":
            if len(n.out.users or ()) != 1:
                return "a gradient's flat view is read elsewhere too"
            n = n.inputs[0].node
        if _widened(n) is not None:  # a compressed sum, cast back
            casts.append(n)
            n = _widened(n)
        if n is not None and n.op != "all_reduce" and any(
                u.node is not None and u.node.op == "all_reduce" for u in n.inputs):
            return (f"a gradient is changed after its all_reduce ({n.op} at {n.loc}: a clip, a "
                    f"scale) and before the optimizer reads it: reduced whole, as at zero=1")
        if tail or n is None or n.op != "all_reduce" or n.attrs["reduce"] == "max" or \
                n.attrs["group"] != shard.attrs["group"] or n.attrs["ranks"] != shard.attrs["ranks"]:
            return "its parts are not all_reduced gradients (a sum or mean over its group)"
        olds.append(n)
    if len({n.attrs["reduce"] for n in olds}) != 1 or casts and (
            len(casts) != len(olds) or len({n.out.type.dtype for n in olds}) != 1):
        return "its gradients are reduced differently"
    return olds, tail, casts


@register("zero")
def zero(graph: Graph, ctx: PassContext) -> dict:
    """ZeRO: a shard of a bucket of all_reduced gradients becomes one reduce_scatter of the
    bucket; gradients also read whole are gathered back for those readers (all_gather:
    option zero=2, the default) or the bucket is all_reduced whole (zero=1)."""
    stage = ctx.options.get("zero", 2)
    unchain(graph)
    dead: list[Node] = []
    placed: dict[int, list[Node]] = {}
    scattered = gathered = 0
    for shard in [n for n in graph.nodes if n.op == "shard"]:
        src = shard.inputs[0]
        # The node that joins the bucket's parts (none for a bucket of one tensor, unpadded).
        concat = src.node if src.node is not None and src.node.op == "concat" else None
        if concat is not None and len(concat.out.users or ()) != 1:
            continue
        values = list(concat.inputs) if concat is not None else [src]
        parts = _gradient_parts(values, shard)
        if isinstance(parts, str):
            ctx.refuse(f"shard at {shard.loc}" if shard.loc else "shard", parts, shard.loc)
            continue
        olds, tail, casts = parts
        attrs = dict(olds[0].attrs)
        loc, start = shard.loc, len(graph.nodes)
        layout = Bucket(tuple(m.out.type.shape for m in olds))
        if casts:  # compressed: the padding in the sums' dtype, and the shard cast back
            half = {"dtype": olds[0].out.type.dtype}
            tail = [graph.add_node("cast", [t], half, loc=loc).out for t in tail]
        flat = _flat(graph, [m.inputs[0] for m in olds], loc, tail)
        # (a compressed sum is read through its cast)
        whole_readers = [m for m, c in zip(olds, casts or olds) if _readers(
            c.out, concat or shard) or c is not m and set(m.out.users or ()) != {c}]
        if stage >= 2 or not whole_readers:
            mine = graph.add_node("reduce_scatter", [flat], attrs, loc=loc).out
            if casts:
                mine_read = graph.add_node("cast", [mine], dict(casts[0].attrs), loc=loc).out
            shard.out.replace_all_uses_with(mine_read if casts else mine)
            dead.append(shard)
            scattered += 1
            if whole_readers:
                whole = graph.add_node("all_gather", [mine], {"group": attrs["group"],
                                                              "ranks": attrs["ranks"]},
                                       loc=loc).out
                gathered += 1
                for m in whole_readers:
                    ctx.refuse(f"the gradient {m.inputs[0].type} at {m.loc}",
                               "read whole besides its shard (a global-norm clip?): "
                               "gathered back after the reduce_scatter", m.loc)
        else:
            whole = graph.add_node("all_reduce", [flat], attrs, loc=loc).out
            shard.inputs[0] = whole if not casts else graph.add_node(
                "cast", [whole], dict(casts[0].attrs), loc=loc).out
        read_back = bool(whole_readers)
        if read_back:  # (the casts of a compressed bucket then read their parts)
            _read_back(graph, whole, olds, layout)
        placed[id(shard)] = graph.nodes[start:]  # where the shard was
        gone = olds + (casts if not read_back else [])
        dead += [concat] * (concat is not None) + [
            v.node for v in values if v.node is not None and v.node.op == "reshape" and
            v.node.inputs[0].node in olds + casts] + gone
    _finish(graph, dead, placed)
    return {"reduce_scatters": scattered, "all_gathers": gathered}


def _readers(v: Value, concat: Node) -> list[Node]:
    """v's readers other than the bucket's concat (or shard, for a bucket of one tensor),
    directly or through its one flat reshape."""
    return [u for u in (v.users or ()) if isinstance(u, Node) and u is not concat and
            not (u.op == "reshape" and set(u.out.users or ()) <= {concat})] + \
        [u for u in (v.users or ()) if not isinstance(u, Node)]
