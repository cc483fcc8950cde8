"""Which compiled steps may not run at once, and a step's guard against a Ctrl-C halfway.

Two calls that touch the same Parameter must not interleave (one would read what the other
half wrote, or lose its update), and neither may two calls of one compiled step (its program
keeps per-call tables). So every Executable and every Parameter belongs to a *domain*, and a
step's domain is the union of its own and its parameters' (union-find): calls in one domain
take turns on one lock, calls in different domains run in parallel. A step compiled later
that shares a Parameter with two earlier ones merges their domains; the merge waits for calls
in flight to finish, and a call that finds its domain merged while it waited takes the lock
of the merged domain instead.

A Ctrl-C that arrives on the main thread while a step runs takes effect when the step has
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
# id(owner) -> its domain, while the owner lives (by id: a tensor's == builds a tensor)
_of: dict[int, Domain] = {}


def _domain(owner: Any) -> Domain:
    d = _of.get(id(owner))
    if d is None:
        d = _of[id(owner)] = Domain()
        weakref.finalize(owner, _of.pop, id(owner), None)
    return d.root()


def domain_of(owners: Iterable[Any]) -> Domain:
    """One domain for a new step and the objects it touches (its Parameters): theirs merged,
    or a new one."""
    with _merging:
        roots = list({id(r): r for r in map(_domain, owners)}.values()) or [Domain()]
        for r in roots:  # wait for the calls in flight in each
            r.lock.acquire()
        for r in roots[1:]:
            r.parent = roots[0]
        for r in roots:
            r.lock.release()
        return roots[0]


class InterruptsDeferred:
    """Within the block, a SIGINT on the main thread is recorded and raised (by the handler
    that was there) when the block ends; elsewhere, and off the main thread, a no-op."""

    __slots__ = ("previous", "pending")

    def __enter__(self) -> InterruptsDeferred:
        self.previous = self.pending = None
        if threading.current_thread() is threading.main_thread() and \
                callable(signal.getsignal(signal.SIGINT)):  # (not SIG_IGN, SIG_DFL)
            self.previous = signal.signal(signal.SIGINT, self._record)
        return self

    def _record(self, signum: int, frame: Any) -> None:
        self.pending = (signum, frame)

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            if self.pending is not None:
                self.previous(*self.pending)  # KeyboardInterrupt, now that the step is whole
