"""Backends run a graph: `interpreter` (numpy, the reference semantics)."""
from __future__ import annotations

from types import ModuleType

from ..errors import BackendError
from . import interpreter

BACKENDS: dict[str, ModuleType] = {"interpreter": interpreter}


def get_backend(name: str) -> ModuleType:
    try:
        return BACKENDS[name]
    except KeyError:
        raise BackendError(f"unknown backend '{name}'; known backends: "
                           f"{', '.join(sorted(BACKENDS))}") from None
