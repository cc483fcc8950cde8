"""jit: trace a step on its first call for each signature, cache the compiled Executable.

The signature of a call is its argument structure plus, per leaf, the shape and dtype of an
array, the Python type of a scalar (not its value: a new learning rate does not retrace), or
the identity of a Parameter. A call whose structure differs from the first call's is an error.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ArgumentError
from ..frontend import checks, pytree
from ..frontend.traces import current_trace
from ..frontend.tracer import bind_arguments, leaf_spec, trace_function
from . import aliasing
from .executable import Executable


@dataclass(frozen=True)
class CacheInfo:
    """The counters of one jitted function (`JittedFunction.cache_info()`)."""

    traces: int  # how many times the function was traced
    compiles: int  # how many Executables were built
    hits: int  # calls that reused a compiled step
    size: int  # compiled steps in the cache


@contextlib.contextmanager
def _gc_paused():
    """Compiling makes many objects that all stay alive: a cyclic collection in between
    finds nothing to free, and on a 1,000-parameter step it cost a tenth of the compile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_SHAPE, _DTYPE, _STRIDES = (operator.attrgetter(a) for a in ("shape", "dtype", "strides"))
_CONTIGUOUS = operator.attrgetter("flags.c_contiguous")
_ALIGNED = operator.attrgetter("flags.aligned")


class _LastCall:
    """The last call, when its leaves were all C-contiguous, aligned numpy arrays, each an
    argument of the step: a call with the same structure and arrays of the same shapes, dtypes
    and strides runs that step again, checked in a few C loops over the leaves instead of a
    spec and a layout check per leaf (a step over 1,000 gradients is called with 1,000 arrays
    every time). Alignment is checked again only for arrays that are not the last call's (a
    buffer never moves)."""

    def __init__(self, tree: pytree.TreeDef, leaves: list, exe: Any, target: str,
                 exposed: dict):
        self.tree, self.exe, self.leaves = tree, exe, leaves  # (the runtime keeps them too)
        self.target = target
        self.exposed = exposed  # what an argument must not alias (Executable.exposed)
        self.shapes, self.dtypes = list(map(_SHAPE, leaves)), list(map(_DTYPE, leaves))
        self.strides = list(map(_STRIDES, leaves))

    @classmethod
    def of(cls, tree: pytree.TreeDef, leaves: list, exe: Any, target: str,
           exposed: dict) -> _LastCall | None:
        if leaves and set(map(type, leaves)) == {np.ndarray} and exe.takes_only_arguments \
                and all(map(_CONTIGUOUS, leaves)) and all(map(_ALIGNED, leaves)):
            return cls(tree, leaves, exe, target, exposed)
        return None

    def matches(self, tree: pytree.TreeDef, leaves: list, target: str) -> bool:
        return ((tree is self.tree or tree == self.tree) and target == self.target
                and set(map(type, leaves)) == {np.ndarray}
                and list(map(_SHAPE, leaves)) == self.shapes
                and list(map(_DTYPE, leaves)) == self.dtypes
                and list(map(_STRIDES, leaves)) == self.strides
                and (all(map(operator.is_, leaves, self.leaves))
                     or all(map(_ALIGNED, leaves))))


class JittedFunction:
    """A step function compiled by `jit`: call it as the function itself.

    The first call with a given signature (the argument structure, each array's shape and
    dtype, each scalar's Python type, each Parameter's identity) traces the function and
    builds an Executable; later calls with that signature run it. A call whose argument
    structure differs from the first call's is a SignatureError (make another jit for it). A
    call from inside another traced function runs the Python function inline instead.

    Attributes:
        fn: the Python function.
        backend: the backend's name.
        passes: the pass pipeline, as a list of names.
        fastmath: whether fast-math rewrites and flags are on.
        cache: whether compiled kernels use the disk cache.
        parallel: the data-parallel strategy (graphopt.distributed.DataParallel), or None.
    """

    def __init__(self, fn: Callable, backend: str | None = None,
                 passes: str | Sequence[str] | None = None, fastmath: bool = False,
                 cache: bool = True, parallel: Any = None):
        from .. import envvars
        from ..backends import get_backend
        from ..passes.manager import parse_pipeline
        checks.callable_(fn, "jit: the step", ArgumentError)
        if backend is not None and not isinstance(backend, str):
            raise ArgumentError(f"jit: backend must be a name ('llvm', 'interpreter'), got "
                                f"{backend!r}")
        if passes is not None and (not isinstance(passes, str) and (
                not isinstance(passes, (list, tuple)) or
                not all(isinstance(p, str) for p in passes))):
            raise ArgumentError(f"jit: passes must be None (the default pipeline), a string "
                                f"'dce,cse,...' or a list of pass names, got {passes!r}")
        fastmath = checks.flag(fastmath, "jit: fastmath", ArgumentError)
        cache = checks.flag(cache, "jit: cache", ArgumentError)
        backend = backend or envvars.backend()
        self._target = get_backend(backend).target  # (unknown backends and passes fail here)
        self.passes = parse_pipeline(passes)
        self.fastmath = fastmath
        self.cache = cache
        self.fn = fn
        self.backend = backend
        if parallel is not None and not callable(getattr(parallel, "gradients", None)):
            raise ArgumentError(f"jit: parallel must be a strategy such as "
                                f"graphopt.distributed.DataParallel(...), got {parallel!r}")
        self.parallel = parallel
        self._cache: dict[tuple, Any] = {}
        self._tree: pytree.TreeDef | None = None
        self._last: _LastCall | None = None
        self._traces = self._compiles = self._hits = 0
        functools.update_wrapper(self, fn)

    def _lookup(self, args: tuple, kwargs: dict):
        leaves, paths, tree = pytree.flatten(bind_arguments(self.fn, args, kwargs))
        target = self._target()  # a step compiled for another GRAPHOPT_CPU is not reused
        last = self._last
        if last is not None and last.matches(tree, leaves, target):
            self._hits += 1
            if last.exposed and not all(map(operator.is_, leaves, last.leaves)):
                aliasing.check_arguments(last.exposed, leaves, paths)  # (new arrays only)
            return last.exe, leaves, paths, True
        if self._tree is not None:
            pytree.check_same(self._tree, tree, self.__name__)
        specs = [leaf_spec(x, p) for x, p in zip(leaves, paths)]
        key = (tree, tuple(specs), target,
               self.parallel.key() if self.parallel is not None else None)
        exe = self._cache.get(key)
        if exe is None:
            with _gc_paused():
                traced = trace_function(self.fn, args, kwargs, (leaves, paths, tree, specs),
                                        self.parallel)
                self._traces += 1
                exe = Executable(self.fn, traced, self.backend, self.passes, self.fastmath,
                                 self.cache, self.parallel)
            self._compiles += 1
            self._cache[key] = exe
            self._tree = tree
        else:
            self._hits += 1
        # (exe.run checks this call's arguments for aliasing; the fast path above, new ones)
        self._last = _LastCall.of(tree, leaves, exe, target, exe.exposed)
        return exe, leaves, paths, False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_trace() is not None:  # called from another traced function: inline it
            return self.fn(*args, **kwargs)
        exe, leaves, paths, checked = self._lookup(args, kwargs)
        return exe.run(leaves, paths, matched=True, checked=checked)

    def lower(self, *args: Any, **kwargs: Any) -> Executable:
        """The compiled step for these arguments (compiling it if needed); `.graph` shows it."""
        return self._lookup(args, kwargs)[0]

    def cache_info(self) -> CacheInfo:
        """How often the function was traced and compiled, how many calls reused a compiled
        step, and how many compiled steps it keeps."""
        return CacheInfo(self._traces, self._compiles, self._hits, len(self._cache))


def jit(fn: Callable | None = None, *, backend: str | None = None,
        passes: str | Sequence[str] | None = None, fastmath: bool = False, cache: bool = True,
        parallel: Any = None) -> JittedFunction | Callable[[Callable], JittedFunction]:
    """Compile a step function: `@jit`, `@jit(backend=..., passes=...)` or `jit(fn, ...)`.

    Nothing is traced until the first call (see JittedFunction).

    Args:
        fn: the step function; without it, jit returns a decorator.
        backend: "llvm" (native kernels; the default, see GRAPHOPT_BACKEND) or
            "interpreter" (numpy, the reference semantics).
        passes: the pipeline (a list of names, or "dce,cse,..."); None means
            graphopt.passes.DEFAULT_PIPELINE and "" no pass.
        fastmath: allow rewrites that are only algebraically exact (see
            passes/simplify.py) and fast-math flags in compiled kernels.
        cache: False keeps compiled kernels out of the disk cache.
        parallel: a data-parallel strategy, `graphopt.distributed.DataParallel(zero=...)`:
            every rank runs the step on its slice of the batch; gradients are averaged
            over the ranks, and with zero >= 1 the optimizer state is sharded.

    Returns:
        A JittedFunction (or, without `fn`, a decorator that makes one).

    Raises:
        ArgumentError: fn is not callable, or an argument of the wrong kind.
        BackendError: an unknown backend.
        PassError: an unknown pass name.
    """
    if fn is None:
        return lambda f: JittedFunction(f, backend, passes, fastmath, cache, parallel)
    return JittedFunction(fn, backend, passes, fastmath, cache, parallel)
