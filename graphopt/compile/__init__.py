"""Compiling a step: `jit` traces it, `Executable` runs the pass pipeline and a backend on the
graph, checks each call's arguments (signature, layout, aliasing) and commits the updates."""
from .executable import Executable
from .jit import CacheInfo, JittedFunction, jit

__all__ = ["Executable", "jit", "JittedFunction", "CacheInfo"]
