"""The LLVM backend: codegen, JIT engine, disk cache, runtime.

`compile(graph)` compiles every kernel node of a graph to native code for this CPU (or loads
it from the disk cache) and returns a program that runs the graph with them.
"""
from .runtime import LLVMProgram, compile

__all__ = ["compile", "LLVMProgram"]
