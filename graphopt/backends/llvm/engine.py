"""The JIT engine: LLVM IR -> optimised module -> object code -> a callable function.

Kernels are compiled for the selected target (target.py: this host, or GRAPHOPT_CPU's), at O3
with loop and SLP vectorization; the runtime's own code for the architecture's baseline.
Object code is what the disk cache (graphopt/diskcache.py) keeps, under a key made of the
parts here (target_parts, runtime_functions) and in runtime.py (a kernel's text and flags);
loading it needs no compiler run, only the linker step of MCJIT, after linker.py has checked
that every symbol resolves.
"""
from __future__ import annotations

import ctypes
import functools
import platform
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import llvmlite
import llvmlite.binding as llvm

from ... import diskcache
from ...errors import LoweringError
from . import compileworker, linker
from .target import Target, baseline, llvm_lock, selected

if TYPE_CHECKING:
    from llvmlite import ir  # modules come from codegen; a warm start never imports it

CODEGEN_VERSION = "14"  # bump when generated code changes for the same kernel text
# The parts that tell one entry from another in `graphopt cache list` (when it has none of
# them, its first two are shown).
LISTED_PARTS = ("kernel", "runtime", "flags", "cpu")
KernelFn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                            ctypes.c_void_p)


@functools.cache
def target_machine(target: Target) -> llvm.TargetMachine:
    """The target machine codegen uses for a target (each JIT engine has one of its own)."""
    return target.machine()


def target_parts(target: Target | None = None) -> dict[str, str]:
    """The parts of a cache key that describe the machine and the compiler (the selected
    target's, by default)."""
    return {**(target or selected()).parts(), **_compiler_parts()}


@functools.cache
def _compiler_parts() -> dict[str, str]:
    return {"llvm": ".".join(map(str, llvm.llvm_version_info)),
            "llvmlite": llvmlite.__version__, "codegen": CODEGEN_VERSION,
            "python": platform.python_implementation()}


@dataclass
class Compiled:
    optimized_ir: str
    object_code: bytes
    seconds: float = 0.0  # LLVM's time on it (in this process or the helper)


def optimize(module: ir.Module, target: Target | None = None) -> llvm.ModuleRef:
    target = target or selected()
    tm = target_machine(target)
    return compileworker.optimize(compileworker.parse(str(module), tm), tm)


def compile_module(module: ir.Module, target: Target | None = None) -> Compiled:
    """Object code for a target (the selected one by default; another machine's too, to be
    compiled and never loaded)."""
    return compile_modules([module], target)[0]


def compile_modules(modules: list[ir.Module], target: Target | None = None,
                    helper: bool = False) -> list[Compiled]:
    """compile_module of each; with `helper`, a helper process compiles some of them at
    the same time (compileworker.py: llvmlite lets one thread into LLVM at a time)."""
    target = target or selected()
    jobs = [compileworker.Job(str(m), target.triple, target.cpu, target.features)
            for m in modules]

    def here(job: compileworker.Job) -> None:
        start = time.perf_counter()
        with llvm_lock:
            job.optimized, job.object_code = compileworker.compile_ir(
                job.ir, target_machine(target))
        job.seconds = time.perf_counter() - start
    if helper:
        compileworker.compile_jobs(jobs, here)
    else:
        for job in jobs:
            here(job)
    return [Compiled(j.optimized, j.object_code, j.seconds) for j in jobs]


def assembly(module: ir.Module, target: Target | None = None) -> str:
    target = target or selected()
    with llvm_lock:
        return target_machine(target).emit_assembly(optimize(module, target))


_engines: list[llvm.ExecutionEngine] = []  # never disposed: their code may still be called
_loaded: dict[tuple[Target, str], int] = {}  # (target, function name) -> address, for life


def load(object_code: bytes, names: tuple[str, ...], target: Target) -> list[int]:
    """Link object code compiled for `target` into the process; the addresses of its
    functions `names`.

    The code is linked only if every symbol it calls resolves (linker.check), so a missing
    runtime function is an error here, not a jump to address 0 at the first call. Each
    object gets an MCJIT engine of its own, kept for the life of the process: an engine
    owns its target machine, disposing one whose code may still run crashes, and linking
    several objects into one engine mis-linked them (seen with llvmlite 0.50: a kernel
    loaded after one that calls libm computed wrong results). Code already loaded under
    this name for this target (names are hashes of what the code does) is reused."""
    with llvm_lock:
        if (target, names[0]) not in _loaded:
            linker.check(object_code, names)
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target.machine())
            engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
            engine.finalize_object()
            for symbol in names:  # (linker.check found each one defined)
                _loaded[target, symbol] = engine.get_function_address(symbol)
            _engines.append(engine)
        return [_loaded[target, symbol] for symbol in names]


def cached(key: str, parts: dict[str, str], names: tuple[str, ...], target: Target,
           use_cache: bool) -> list[int] | None:
    """The addresses of the functions `names` of the object code cached under these parts,
    or None. A cached entry that fails the checks before linking (linker.check: not object
    code, another kernel's, a symbol that does not resolve) is a corrupt entry: warned of,
    and None (the caller compiles it again, and store_and_load replaces it)."""
    obj = diskcache.load(key, parts) if use_cache and diskcache.enabled() else None
    if obj is not None:
        try:
            return load(obj, names, target)
        except LoweringError as e:
            warnings.warn(f"graphopt cache: entry {key[:16]} cannot be linked ({e.message}); "
                          f"compiling it again", diskcache.CacheWarning, stacklevel=3)
    return None


def store_and_load(key: str, parts: dict[str, str], names: tuple[str, ...], target: Target,
                   obj: bytes, use_cache: bool) -> list[int]:
    """Cache compiled object code under these parts (when caching), then load it."""
    if use_cache and diskcache.enabled():
        diskcache.store(key, parts, obj)
    return load(obj, names, target)


def load_cached(key: str, parts: dict[str, str], names: tuple[str, ...], target: Target,
                build: Callable[[], bytes], use_cache: bool) -> list[int]:
    """cached(...), or store_and_load of what `build` compiles."""
    addresses = cached(key, parts, names, target, use_cache)
    if addresses is not None:
        return addresses
    return store_and_load(key, parts, names, target, build(), use_cache)


def runtime_functions(text: str, names: tuple[str, ...], use_cache: bool = True) -> list[int]:
    """Runtime code graphopt writes as LLVM IR text (the sink, the helpers of linker.py):
    compiled for the architecture's baseline, so it runs on any CPU this process runs on,
    whatever GRAPHOPT_CPU says; its object code is cached on disk like a kernel's."""
    target = baseline()

    def build() -> bytes:
        with llvm_lock:
            return compileworker.compile_ir(text, target_machine(target), optimized=False)[1]
    parts = {"runtime": text.strip(), **target_parts(target)}
    return load_cached(diskcache.make_key(parts), parts, names, target, build, use_cache)
