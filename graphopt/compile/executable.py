"""Executable: a compiled step. One call runs the whole graph and updates Parameters in place.

A call is atomic: every argument is checked against the signature the step was compiled for
(and against the buffers the step updates in place: aliasing.py) before anything runs, and the
new parameter values are written only after the whole graph ran.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from ..backends import get_backend
from ..backends.base import root
from ..errors import BackendError, SignatureError
from ..frontend import pytree
from ..frontend.tensor import EagerTensor
from ..frontend.tracer import Traced, bind_arguments, leaf_spec
from ..ir.graph import Graph
from ..ir.kernel import written
from ..ir.opdefs import write_rows
from ..ir.types import RowsArray, TensorType
from . import aliasing, exclusion
from .exclusion import InterruptsDeferred


class Executable:
    """A compiled step: the graph after the passes, and the backend's program for it.

    `JittedFunction` builds one per signature (`step.lower(...)` returns it). Calling it
    runs the whole graph and updates the Parameters in place. A call is atomic: every
    argument is checked before anything runs, and the new parameter values are written
    only after the whole graph ran, so a call that fails changes no Parameter.

    Attributes:
        traced_graph: the graph as traced, before any pass.
        graph: the graph that runs, after the passes (verified).
        pass_result: the PipelineResult of the passes: statistics and refusals.
        program: the backend's program.
        last_step_seconds: the time the last call took to run, None before the first.
    """

    def __init__(self, fn: Callable, traced: Traced, backend: str,
                 passes: str | Sequence[str] | None = None, fastmath: bool = False,
                 cache: bool = True, parallel: Any = None):
        from .. import passes as pass_manager
        self.fn = fn
        self.traced_graph: Graph = traced.graph  # as traced, before any pass
        self.parallel = parallel
        options = {}
        if parallel is not None:  # its passes first (they match what the tracer made)
            passes = parallel.pipeline(pass_manager.manager.parse_pipeline(passes))
            options = parallel.pass_options()
        # The result of the passes is verified (GRAPHOPT_VERIFY=each verifies the traced graph
        # and the graph after every pass too, when debugging the tracer or a pass).
        self.pass_result = pass_manager.run(traced.graph, passes, fastmath=fastmath,
                                            options=options, verify="last")
        # How the passes ran (the explorer runs them again to show each one's work).
        self.passes, self.pass_options, self.fastmath = passes, options, fastmath
        self.graph: Graph = self.pass_result.graph  # what runs
        self.backend_name = backend
        self.program = get_backend(backend).compile(self.graph, fastmath=fastmath, cache=cache)
        # The arguments native code reads directly: checked for layout before every call.
        self._native = getattr(self.program, "native_inputs", set())
        self._in_tree, self._out_tree = traced.in_tree, traced.out_tree
        self._leaf_kinds = traced.leaf_kinds
        self._params = traced.params
        self.param_inputs = [(v, traced.params[v.name]) for v in self.graph.params]
        self._args = self.graph.args
        # Every leaf of a call is an argument, in the graph's order (no Parameter passed in):
        # what jit's fast path for a repeated call needs.
        self.takes_only_arguments = all(k == "arg" for k in self._leaf_kinds) and \
            len(self._args) == len(self._leaf_kinds)
        self._param_buffers = dict(self._param_arrays())
        updated = {v for n in self.graph.nodes for v in written(n)}
        # What an argument must not alias; usually empty (graphopt owns the buffers).
        self.exposed = aliasing.exposed(p for v, p in self.param_inputs if v in updated)
        # Steps that run collectives on one group take turns too (exclusion.py).
        groups = sorted({n.attrs["group"] for n in self.graph.nodes if n.opdef.ordered})
        self._domain = exclusion.domain_of([self, *(p for _, p in self.param_inputs),
                                            *map(exclusion.group_owner, groups)])
        self.last_step_seconds: float | None = None
        self._agreed = parallel is None  # the ranks checked they compiled the same step

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the step on arguments of the structure it was compiled for; return its
        results as numpy arrays, in the structure the function returned them.

        Raises:
            SignatureError: arguments of another structure, shape, dtype or layout.
            AliasingError: an argument views a Parameter buffer the step updates.
            ExecutionError: a node failed; no Parameter was changed.
        """
        leaves, paths, tree = pytree.flatten(bind_arguments(self.fn, args, kwargs))
        pytree.check_same(self._in_tree, tree, getattr(self.fn, "__name__", "step"))
        return self.run(leaves, paths)

    def run(self, leaves: list[Any], paths: Sequence[str], matched: bool = False,
            checked: bool = False) -> Any:
        """Check every argument leaf, run the graph, then commit the assigns. `matched`: jit
        found this step by the leaves' shapes and dtypes, so only their layout and aliasing
        are left to check (for the arguments native code reads); `checked`: jit checked
        those too, and every leaf is an argument, in order."""
        if self.exposed and not checked:  # first: the cause of a layout error it would give
            aliasing.check_arguments(self.exposed, leaves, paths)
        inputs = dict(self._param_buffers)  # (a Parameter's buffer never changes: in place)
        if checked:
            inputs.update(zip(self._args, leaves))
            leaves = []
        args = iter(self._args)
        for leaf, path, kind in zip(leaves, paths, self._leaf_kinds):
            if kind == "param":
                continue
            v = next(args)
            if matched and type(leaf) is np.ndarray:
                if v in self._native:
                    _check_layout(leaf, path)
                inputs[v] = leaf
            else:
                inputs[v] = _checked_array(leaf, v.type, path, v in self._native)
        if not self._agreed:  # before the first collective could pair with another step's
            self.parallel.prepare(self.graph, getattr(self.fn, "__name__", "step"))
            self._agreed = True
        start = time.perf_counter()
        domain = self._domain.acquire()  # calls touching the same parameters take turns
        try:
            with InterruptsDeferred():  # a Ctrl-C waits for the step to be whole (or undone)
                outputs, updates = self.program.run(inputs)
                # Results are copies, taken before the commit: an output may be a view of a
                # parameter buffer (`p.T` read before `assign(p, ...)`) or of an argument.
                results = [np.array(o) for o in outputs]
                self._commit(updates)
        finally:
            domain.lock.release()
        self.last_step_seconds = time.perf_counter() - start
        return pytree.unflatten(self._out_tree, results)

    def memory_report(self):
        """Liveness of the graph as it runs: the peak bytes alive, the forward values kept
        alive for the backward pass, and the values the backend copies, with why (see
        graphopt/ir/liveness.py); print it to read it."""
        from ..ir.liveness import memory_report
        report = memory_report(self.graph, getattr(self.program, "copy_reasons", ()),
                               getattr(self.program, "plan", None))
        if self.parallel is not None:
            report.sections.append(self.parallel.memory_report(self.graph, self._params.values()))
        return report

    # -- what the backend made --------------------------------------------------------------
    @property
    def kernels(self) -> list:
        """The compiled kernels (llvm backend): name, cache key and parts, compile time."""
        return list(self.program.kernels)

    def llvm_ir(self, optimized: bool = True) -> str:
        """The LLVM IR of every compiled kernel, optimised (as it runs) or as generated."""
        return self._listing("llvm" if optimized else "llvm-raw")

    def asm(self) -> str:
        """The assembly of every compiled kernel, for the CPU it was compiled for."""
        return self._listing("asm")

    def _listing(self, kind: str) -> str:
        if not hasattr(self.program, "listing"):
            raise BackendError(f"the {self.backend_name} backend compiles no kernels; use "
                               f"jit(backend='llvm')")
        return self.program.listing(kind)

    def _param_arrays(self):
        for v, p in self.param_inputs:
            yield v, p._value

    def _commit(self, updates: dict[str, np.ndarray]) -> None:
        if not updates:  # kernels already updated their parameters in place
            return
        roots = {id(root(p._value)) for _, p in self.param_inputs}
        # A new value that views a parameter buffer (a swap, a reshape of @p) is copied first,
        # so no commit reads a buffer that an earlier commit already overwrote. Rows are
        # written into their rows (their values never view a parameter: take_rows copies).
        staged = [(self._params[name], a.copy() if not isinstance(a, RowsArray) and
                   id(root(a)) in roots else a) for name, a in updates.items()]
        for p, a in staged:
            if isinstance(a, RowsArray):
                write_rows(p._value, a)
            else:
                np.copyto(p._value, a)


def _checked_array(leaf: Any, t: TensorType, path: str, native: bool = False) -> np.ndarray:
    if isinstance(leaf, EagerTensor):
        leaf = leaf.array
    if isinstance(leaf, (bool, int, float)):
        return np.asarray(leaf, dtype=t.dtype.np_dtype)
    a = np.asarray(leaf)
    if a is not leaf and not isinstance(leaf, np.generic):
        leaf_spec(leaf, path)  # refuses what jit refuses (a memoryview would hide an alias)
    if a.shape != t.shape or a.dtype != t.dtype.np_dtype:
        raise SignatureError(f"argument '{path}' is {a.dtype}{list(a.shape)}, but this step was "
                             f"compiled for {t}")
    if native:
        _check_layout(a, path)
    return a


def _check_layout(a: np.ndarray, path: str) -> None:
    flags = a.flags
    if a.ndim and not flags.c_contiguous:
        raise SignatureError(f"argument '{path}' is not C-contiguous (a transposed or sliced "
                             f"view?); native kernels read contiguous buffers: pass "
                             f"np.ascontiguousarray(...)")
    if not flags.aligned:  # numpy's own test: the address is a multiple of the alignment
        raise SignatureError(f"argument '{path}' is not aligned to its {a.dtype.alignment}-byte "
                             f"dtype; pass a copy (np.array(...))")
