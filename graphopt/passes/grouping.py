"""Groups of nodes that will run as one unit (a kernel), and the one legality question both
fusion passes ask: would merging two groups make a cycle?

Two groups may merge unless a path between them leaves both: A -> X -> B with X outside
(a node, or a member of a third group). Groups are walked as units: a kernel runs whole, so a
path that reaches any member of a group reaches all of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from ..ir.analysis import producers, toposort
from ..ir.graph import Graph, Node, Value
from ..ir.uses import replace_all_uses

@dataclass(eq=False)
class Group:
    space: tuple[int, ...]
    members: list[Node] = field(default_factory=list)
    ids: set[int] = field(default_factory=set)  # id() of the members, kept by Grouping
    top: int = -1  # the latest position of a member, kept by Grouping


class Grouping:
    """Group membership over a graph's nodes, and cycle checks on the condensed graph."""

    def __init__(self, graph: Graph):
        self.producer = producers(graph)
        self.index = {id(n): i for i, n in enumerate(graph.nodes)}
        self.group: dict[int, Group] = {}  # id(node) -> its group

    def detached(self, space: tuple[int, ...], nodes: list[Node]) -> Group:
        """A group to ask about (why_not, merge) without making its nodes members yet."""
        g = Group(space, list(nodes))
        g.ids = {id(n) for n in nodes}
        g.top = max(self.index[id(n)] for n in nodes)
        return g

    def add(self, g: Group) -> Group:
        for n in g.members:
            self.group[id(n)] = g
        g.ids = {id(n) for n in g.members}
        g.top = max(self.index[id(n)] for n in g.members)
        return g

    def merge(self, a: Group, b: Group) -> Group:
        a.members = sorted(a.members + b.members, key=lambda n: self.index[id(n)])
        for n in b.members:
            self.group[id(n)] = a
        a.ids |= b.ids
        a.top = max(a.top, b.top)
        return a

    def _top(self, n: Node) -> int:
        """The latest position among the members of n's group (n's own if ungrouped): nothing
        earlier than the source's first member can lead to it, and a group counts by its
        latest member, since reaching any member reaches all."""
        g = self.group.get(id(n))
        return g.top if g is not None else self.index[id(n)]

    def path_leaving(self, src: Group, dst: Group) -> Node | None:
        """The first outside node on a path src -> ... -> dst that leaves both, if any."""
        def inside(m: Node) -> bool:
            return id(m) in src.ids or id(m) in dst.ids

        floor = self.index[id(src.members[0])]  # members are kept in graph order
        seen: set[int] = set()
        # (dst ending before src begins does not rule a path out: a third group may hold a
        # node after src and a node before dst, and a group is reached as a whole.)
        starts = [self.producer[v] for n in dst.members for v in n.operands()
                  if v in self.producer and not inside(self.producer[v])]
        for start in starts:
            stack = [start]
            while stack:
                m = stack.pop()
                if inside(m):
                    return start
                if id(m) in seen or self._top(m) < floor:
                    continue
                g = self.group.get(id(m))
                for member in (g.members if g is not None else [m]):
                    seen.add(id(member))
                    stack += [self.producer[v] for v in member.operands() if v in self.producer]
        return None

    def cycle_via(self, a: Group, b: Group, b_is_newest: bool = False) -> Node | None:
        """An outside node through which a and b depend on each other, if merging them would
        make a cycle. `b_is_newest`: b's nodes come after every node grouped so far (groups
        are being formed in graph order), so no path can lead from b back to a."""
        if b_is_newest:
            return self.path_leaving(a, b)
        return self.path_leaving(a, b) or self.path_leaving(b, a)


def install(graph: Graph, replaced: dict[int, Node], mapping: dict[Value, Value]) -> None:
    """Put each new node where the first node it replaces stood (replaced: id(old) -> new),
    make the readers left read the new values (mapping), and restore a topological order."""
    nodes, placed = [], set()
    for n in graph.nodes:
        new = replaced.get(id(n))
        if new is None:
            nodes.append(n)
            continue
        n.detach()  # first: reads among the replaced nodes are gone, not rewritten
        if id(new) not in placed:
            placed.add(id(new))
            nodes.append(new)
    graph.nodes = nodes
    replace_all_uses(mapping)
    toposort(graph)
