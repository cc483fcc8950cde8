"""Backends run a graph: `interpreter` (numpy, the reference semantics) and `llvm` (kernels
compiled to native code, parameters updated in place).

A backend is a module with `compile(graph, *, fastmath, cache) -> program`, where
`program.run(inputs)` returns the graph's outputs and the new values of the parameters it
did not already update in place, and `target() -> str`: the switches its programs depend on
(the LLVM backend's GRAPHOPT_CPU), so that jit compiles again when they change.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import BackendError

BACKENDS = {"interpreter": "graphopt.backends.interpreter", "llvm": "graphopt.backends.llvm"}


def get_backend(name: str) -> ModuleType:
    try:
        return importlib.import_module(BACKENDS[name])  # llvmlite loads only when used
    except KeyError:
        raise BackendError(f"unknown backend '{name}'; known backends: "
                           f"{', '.join(sorted(BACKENDS))}") from None
