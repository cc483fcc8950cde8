"""Do the ranks agree on the step? A small summary of a graph (`fingerprint`) that every rank
sends to every other (`check_same`), before the step's first collective.

Ranks that trace different steps (another batch shape on one rank, a branch taken on one
rank only) would pair unlike collectives: MPI then moves bytes of one array into another, or
waits forever for a collective that never comes. Comparing fingerprints first turns that into
a CollectiveError on every rank that says what differs.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

from .. import comm
from ..errors import CollectiveError, CollectiveTimeout
from ..ir import Graph, Node
from ..ir.printer import format_attrs
from ..ir.registry import COLLECTIVE, REGISTRY

_SHOWN = 8  # ranks listed in a CollectiveError; the others are counted


def _is_collective(node: Node) -> bool:
    """An op of the registry's collective category (what the registry does not know, in a
    graph parsed from text, counts if it names a process group)."""
    op = REGISTRY.get(node.op)
    return op.category == COLLECTIVE if op is not None else "group" in node.attrs


def _collective(node: Node) -> str:
    """A collective as its IR line without value names: `all_reduce f32[8] {...} : f32[8]`."""
    attrs = format_attrs(node)
    return " ".join(filter(None, [node.op, ", ".join(str(v.type) for v in node.inputs),
                                  "{" + attrs + "}" if attrs else ""])) + \
        " : " + ", ".join(str(v.type) for v in node.outputs)


def fingerprint(graph: Graph) -> dict[str, Any]:
    """A small, picklable summary of a step, equal on two ranks that run the same step: its
    name; each input's kind ("param" or "arg"), name and type; the count of each op; the
    collectives in order, with their types and attributes; the output types; and a hash of
    its printed text (`str(graph)`), which catches whatever else differs."""
    return {
        "name": graph.name,
        "inputs": [(v.kind, v.name, str(v.type)) for v in graph.inputs],
        "ops": dict(sorted(Counter(n.op for n in graph.nodes).items())),
        "collectives": [_collective(n) for n in graph.nodes if _is_collective(n)],
        "outputs": [str(v.type) for v in graph.outputs],
        "text": hashlib.sha256(str(graph).encode()).hexdigest(),
    }


def _input(kind: str, name: str) -> str:
    return ("@" if kind == "param" else "%") + name


def _first_difference(fp: dict[str, Any], base: dict[str, Any], r: int) -> str:
    """The first field in which rank r's fingerprint differs from rank 0's, in words."""
    here, there = f"on rank {r}", "on rank 0"
    if fp["name"] != base["name"]:
        return f"the step is {fp['name']!r} {here}, {base['name']!r} {there}"
    for i, (a, b) in enumerate(zip(fp["inputs"], base["inputs"])):
        if a[:2] == b[:2] and a != b:
            return f"input {_input(*a[:2])} is {a[2]} {here}, {b[2]} {there}"
        if a != b:
            return (f"input {i} is {_input(*a[:2])}: {a[2]} {here}, "
                    f"{_input(*b[:2])}: {b[2]} {there}")
    if len(fp["inputs"]) != len(base["inputs"]):
        return f"rank {r} has {len(fp['inputs'])} inputs, rank 0 has {len(base['inputs'])}"
    for op in sorted(fp["ops"].keys() | base["ops"].keys()):
        a, b = fp["ops"].get(op, 0), base["ops"].get(op, 0)
        if a != b:
            return f"rank {r} has {a} {op}, rank 0 has {b}"
    for i, (a, b) in enumerate(zip(fp["collectives"], base["collectives"])):
        if a != b:
            return f"collective {i} is `{a}` {here}, `{b}` {there}"
    for i, (a, b) in enumerate(zip(fp["outputs"], base["outputs"])):
        if a != b:
            return f"output {i} is {a} {here}, {b} {there}"
    if len(fp["outputs"]) != len(base["outputs"]):
        return (f"rank {r} returns {len(fp['outputs'])} values, rank 0 returns "
                f"{len(base['outputs'])}")
    return "the step's text differs"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else \
        "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def check_same(graph: Graph, what: str, group: str = "world") -> None:
    """Check that every rank of `group` is about to run the same step: every rank sends its
    `fingerprint` of `graph` to every other (a watched collective), and if any differs from
    rank 0's, every rank raises the same CollectiveError, naming the ranks that differ and,
    for each, the first difference in words. In a group of one process it returns at once.

    Args:
        graph: the step about to run.
        what: what the error calls it ("the step 'train'").
        group: the process group (graphopt.comm) whose ranks must agree.

    Raises:
        CollectiveError: the ranks' steps differ, or no group has that name.
        CollectiveTimeout: a rank did not join the check within the timeout.
    """
    group_comm = comm.group(group)
    if group_comm.size == 1:
        return
    try:
        every = group_comm.gather_objects(fingerprint(graph))
    except CollectiveTimeout as e:  # (say which step the missing rank did not come to)
        raise CollectiveTimeout(f"{e} (checking that the ranks agree on {what})") from None
    differ = [r for r, fp in enumerate(every) if fp != every[0]]
    if not differ:
        return
    lines = [f"rank {r}: {_first_difference(every[r], every[0], r)}" for r in differ[:_SHOWN]]
    if len(differ) > _SHOWN:
        lines.append(f"and {len(differ) - _SHOWN} more ranks")
    raise CollectiveError(f"{what} differs between the ranks of group {group!r}: "
                          f"{_ranks(differ)} {'differs' if len(differ) == 1 else 'differ'} "
                          f"from rank 0, so their collectives would not match:\n  " +
                          "\n  ".join(lines))
