"""The LLVM backend: codegen, JIT engine, disk cache, runtime.

`compile(graph)` compiles every kernel node of a graph to native code for the selected target
(target.py: this CPU, or GRAPHOPT_CPU's) or loads it from the disk cache, and returns a
program that runs the graph with them.
"""
from ... import envvars
from .runtime import LLVMProgram, compile


def target() -> str:
    """The switches that choose what kernels are compiled for, as set (jit asks on every
    call, so this is only read here; target.py checks them when compiling)."""
    return envvars.get("GRAPHOPT_CPU") + "\0" + envvars.get("GRAPHOPT_CPU_FEATURES")


__all__ = ["compile", "target", "LLVMProgram"]
