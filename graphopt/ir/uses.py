"""Use lists: every node output knows who reads it, and one call rewrites all its readers.

`value.users` maps each reader to how many times it reads the value: the nodes whose inputs or
after edges name it, and the graph whose return does (torch.fx's Node.users, with the return
as a user). A reader holds what it reads in lists of this module, `Operands` (a node's inputs,
a graph's outputs) and `Ordering` (after edges, effects), whose every change updates the use
lists of the values it adds and removes. So the use lists are right whatever code edits the
lists, and a rewrite is

    old.replace_all_uses_with(new)     # every reader of old reads new
    replace_all_uses({a: x, b: y})     # many at once, each reader rewritten once
    node.detach()                      # a node that leaves its graph reads nothing

Graph inputs have no use list (`users` is None): no rewrite replaces a parameter or an
argument, `Graph.clone` shares them between a graph and its copy, and reads of the thousands
of inputs of a step are most of its reads. The verifier checks that the use lists match the
graph (rule `uses`).
"""
from __future__ import annotations

import contextlib
import operator
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from .graph import Graph, Node, Value


def _take(user: Node | Graph, values: Iterable[Value]) -> None:
    """`user` reads each of `values` once more."""
    for v in values:
        users = v.users
        if users is not None:
            users[user] = users.get(user, 0) + 1


def _drop(user: Node | Graph, values: Iterable[Value]) -> None:
    """`user` reads each of `values` once less."""
    for v in values:
        users = v.users
        if users is not None:
            left = users[user] - 1
            if left:
                users[user] = left
            else:
                del users[user]


def _edit(method):
    """A list method that may change which values the list holds, done between giving up
    every use and taking them again: simple, and exact, for edits that are rare."""
    def edit(self: Operands, *args):
        _drop(self.user, self)
        try:
            return method(self, *args)
        finally:
            _take(self.user, self)
    edit.__name__ = method.__name__
    return edit


class Operands(list):
    """The values one reader reads as data, in order: a node's inputs, a graph's outputs."""

    __slots__ = ("user",)

    @classmethod
    def of(cls, user: Node | Graph, values: Iterable[Value] = ()) -> Self:
        """A list of what `user` reads, holding `values`."""
        ops = cls(values)
        ops.user = user
        if ops:
            _take(user, ops)
        return ops

    def append(self, v: Value) -> None:
        super().append(v)
        _take(self.user, (v,))

    def extend(self, values: Iterable[Value]) -> None:
        values = list(values)
        super().extend(values)
        _take(self.user, values)

    def __iadd__(self, values: Iterable[Value]) -> Self:  # type: ignore[override]
        self.extend(values)
        return self

    def clear(self) -> None:
        if self:  # (detach clears thousands of after lists, most of them empty)
            _drop(self.user, self)
            super().clear()

    _set_slice = _edit(list.__setitem__)

    def __setitem__(self, i, value) -> None:
        if isinstance(i, slice):
            self._set_slice(i, value)
            return
        old = self[i]
        super().__setitem__(i, value)
        _drop(self.user, (old,))
        _take(self.user, (value,))

    __delitem__ = _edit(list.__delitem__)
    insert = _edit(list.insert)
    remove = _edit(list.remove)
    pop = _edit(list.pop)
    __imul__ = _edit(list.__imul__)

    def remap(self, mapping: dict[Value, Value]) -> None:
        """Read mapping[v] instead of each v that `mapping` holds."""
        for i, v in enumerate(self):
            if v in mapping:
                self[i] = mapping[v]


class Ordering(Operands):
    """Ordering edges, no data: a node's after edges, a graph's effects. A set kept in order,
    so two edges that a replacement makes name one value become one."""

    __slots__ = ()

    def remap(self, mapping: dict[Value, Value]) -> None:
        if any(map(mapping.__contains__, self)):
            self[:] = dict.fromkeys(mapping.get(v, v) for v in self)


def operands_property(slot: str, doc: str) -> property:
    """An attribute whose value is the Operands list in `slot`: assigning a list to it
    replaces the list's contents (a graph's return, which code builds by assigning it)."""
    get = operator.attrgetter(slot)

    def assign(owner: Node | Graph, values: Iterable[Value]) -> None:
        ops = get(owner)
        if values is not ops:  # (`x += [...]` extends the list, then assigns it back)
            ops[:] = values
    return property(get, assign, doc=doc)


_recording = threading.local()


@contextlib.contextmanager
def recording_replacements() -> Iterator[dict[Value, Value]]:
    """The replacements made in this thread while it lasts (old -> new, in order): how a
    pass's diff knows which new value took an old one's place."""
    outer = getattr(_recording, "log", None)
    _recording.log = log = {}
    try:
        yield log
    finally:
        _recording.log = outer


def replace_all_uses(mapping: dict[Value, Value]) -> None:
    """Value.replace_all_uses_with for many values at once, each reader rewritten once (a
    return with thousands of effect tokens once, not once per token). Node outputs only."""
    inputs = [old for old in mapping if old.users is None]
    if inputs:
        raise ValueError(f"{inputs[0]!r} is a graph input, which no rewrite replaces")
    log = getattr(_recording, "log", None)
    if log is not None:
        log.update(mapping)
    for reader in dict.fromkeys(u for old in mapping for u in old.users):
        for ops in reader.operand_lists():
            ops.remap(mapping)
