"""Which compiled steps may not run at once, and a step's guard against a Ctrl-C halfway.

Two calls that touch the same Parameter must not interleave (one would read what the other
half wrote, or lose its update), and neither may two calls of one compiled step (its program
keeps per-call tables). So every Executable and every Parameter belongs to a *domain*, and a
step's domain is the union of its own and its parameters' (union-find): calls in one domain
take turns on one lock, calls in different domains run in parallel. Steps whose collectives
use one process group are in one domain too: their exchanges must not interleave, since every
rank has to issue them in one order. A step compiled later that shares a Parameter with two
earlier ones merges their domains; the merge waits for calls in flight to finish, and a call
that finds its domain merged while it waited takes the lock of the merged domain instead.

A Ctrl-C that arrives while a step runs on the main thread takes effect when the step has
finished (or failed and been undone), never between two of its in-place writes.
"""
from __future__ import annotations

import signal
import threading
import weakref
from collections.abc import Iterable
from typing import Any


class Domain:
    __slots__ = ("parent", "lock", "__weakref__")

    def __init__(self) -> None:
        self.parent: Domain | None = None
        self.lock = threading.Lock()

    def root(self) -> Domain:
        d = self
        while d.parent is not None:
            d = d.parent
        return d

    def acquire(self) -> Domain:
        """Take the lock of this domain's root, the one held while a step of it runs; returns
        that root, whose lock the caller releases."""
        while True:
            r = self.root()
            r.lock.acquire()
            if r.parent is None:
                return r
            r.lock.release()  # merged into another while this call waited: take that one


_merging = threading.Lock()  # one merge at a time: a merge holds several domains' locks


class _Entry(weakref.KeyedRef):
    """An owner's domain, by a weak reference to the owner that drops its entry when the
    owner goes (one object per owner: a step may have thousands)."""

    __slots__ = ("domain",)

    def __new__(cls, owner: Any, domain: Domain) -> _Entry:
        self = super().__new__(cls, owner, _forget, id(owner))
        self.domain = domain
        return self

    def __init__(self, owner: Any, domain: Domain) -> None:
        super().__init__(owner, _forget, id(owner))


def _forget(entry: _Entry) -> None:
    _of.pop(entry.key, None)


_of: dict[int, _Entry] = {}  # id(owner) -> its entry (by id: a tensor's == builds a tensor)


class _Group:
    """What stands for a process group among a step's owners (by name: the communicator
    registered under it may be replaced between steps)."""

    __slots__ = ("name", "__weakref__")

    def __init__(self, name: str):
        self.name = name


_groups: dict[str, _Group] = {}  # kept for good: a group's domain outlives its steps


def group_owner(name: str) -> Any:
    """The owner that puts the steps running collectives on group `name` in one domain."""
    return _groups.setdefault(name, _Group(name))  # (one step of the GIL: atomic)


def domain_of(owners: Iterable[Any]) -> Domain:
    """One domain for a new step and the objects it touches (its Parameters): theirs merged,
    or a new one. An owner seen for the first time joins it directly (a step's thousands of
    new Parameters and state buffers are one domain from the start)."""
    with _merging:
        roots: dict[int, Domain] = {}
        fresh: dict[int, Any] = {}
        for owner in owners:
            entry = _of.get(id(owner))
            if entry is None:
                fresh[id(owner)] = owner
            else:
                r = entry.domain.root()
                roots[id(r)] = r
        merged = list(roots.values()) or [Domain()]
        for r in merged:  # wait for the calls in flight in each
            r.lock.acquire()
        for r in merged[1:]:
            r.parent = merged[0]
        for r in merged:
            r.lock.release()
        for key, owner in fresh.items():
            _of[key] = _Entry(owner, merged[0])
        return merged[0]


_MAIN = threading.main_thread().ident
_steps_on_main = 0  # steps under way on the main thread (only it changes this)
_pending: list[tuple[int, Any]] = []  # SIGINTs that arrived during them
_installed = False


def _deferring_handler(signum: int, frame: Any) -> None:
    """Python's SIGINT handler, but a Ctrl-C during a step on the main thread is kept for
    when the step ends. (Swapping handlers around every step would cost two system calls
    per step, ~30 us here; this one is installed once.)"""
    if _steps_on_main:
        _pending.append((signum, frame))
    else:
        signal.default_int_handler(signum, frame)


class InterruptsDeferred:
    """Within the block, a Ctrl-C on the main thread is raised when the block ends. Applies
    while SIGINT has Python's default handler at the first step (graphopt then puts
    `_deferring_handler` in its place, once); a program's own handler is left alone."""

    __slots__ = ("main",)

    def __enter__(self) -> InterruptsDeferred:
        global _steps_on_main, _installed
        self.main = threading.get_ident() == _MAIN
        if self.main:
            if not _installed:
                _installed = True
                if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                    signal.signal(signal.SIGINT, _deferring_handler)
            _steps_on_main += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        global _steps_on_main
        if self.main:
            _steps_on_main -= 1
            if not _steps_on_main and _pending:
                signum, frame = _pending[0]
                _pending.clear()
                signal.default_int_handler(signum, frame)  # KeyboardInterrupt, now
