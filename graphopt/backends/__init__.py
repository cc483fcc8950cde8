"""Backends run a graph: `interpreter` (numpy, the reference semantics) and `llvm` (kernels
compiled to native code, parameters updated in place).

A backend is a module with `compile(graph, *, fastmath, cache) -> program`, where
`program.run(inputs)` returns the graph's outputs and the new values of the parameters it
did not already update in place, and `target() -> str`: the switches its programs depend on
(the LLVM backend's GRAPHOPT_CPU), so that jit compiles again when they change. base.py
declares both (`Backend`, `Program`) and holds the loop both backends run nodes with.
"""
from __future__ import annotations

import importlib
from typing import cast

from ..errors import BackendError
from .base import Backend

BACKENDS = {"interpreter": "graphopt.backends.interpreter", "llvm": "graphopt.backends.llvm"}


def get_backend(name: str) -> Backend:
    """The backend module of a name in BACKENDS, imported on first use (llvmlite loads only
    when the LLVM backend is asked for).

    Raises:
        BackendError: an unknown name; the message lists the known ones.
    """
    try:
        module = importlib.import_module(BACKENDS[name])  # llvmlite loads only when used
    except KeyError:
        raise BackendError(f"unknown backend '{name}'; known backends: "
                           f"{', '.join(sorted(BACKENDS))}") from None
    return cast(Backend, module)
