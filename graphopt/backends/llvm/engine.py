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
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import llvmlite
import llvmlite.binding as llvm

from ... import diskcache
from ...errors import LoweringError
from . import linker
from .target import Target, baseline, llvm_lock, selected

if TYPE_CHECKING:
    from llvmlite import ir  # modules come from codegen; a warm start never imports it

CODEGEN_VERSION = "11"  # bump when generated code changes for the same kernel text
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


def _module_for(text: str, target: Target) -> llvm.ModuleRef:
    tm = target_machine(target)
    mod = llvm.parse_assembly(text)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    return mod


def optimize(module: ir.Module, target: Target | None = None) -> llvm.ModuleRef:
    target = target or selected()
    mod = _module_for(str(module), target)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(target_machine(target), pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def compile_module(module: ir.Module, target: Target | None = None) -> Compiled:
    """Object code for a target (the selected one by default; another machine's too, to be
    compiled and never loaded)."""
    target = target or selected()
    with llvm_lock:
        mod = optimize(module, target)
        return Compiled(str(mod), target_machine(target).emit_object(mod))


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


def load_cached(key: str, parts: dict[str, str], names: tuple[str, ...], target: Target,
                build: Callable[[], bytes], use_cache: bool) -> tuple[list[int], bool]:
    """The addresses of the functions `names` of the object code cached under these parts,
    or of what `build` compiles (then cached); and whether it came from the cache. A cached
    entry that fails the checks before linking (linker.check: not object code, another
    kernel's, a symbol that does not resolve) is a corrupt entry: warned of, compiled again
    and replaced."""
    use_cache = use_cache and diskcache.enabled()
    obj = diskcache.load(key, parts) if use_cache else None
    if obj is not None:
        try:
            return load(obj, names, target), True
        except LoweringError as e:
            warnings.warn(f"graphopt cache: entry {key[:16]} cannot be linked ({e.message}); "
                          f"compiling it again", diskcache.CacheWarning, stacklevel=2)
    obj = build()
    if use_cache:
        diskcache.store(key, parts, obj)
    return load(obj, names, target), False


def runtime_functions(text: str, names: tuple[str, ...], use_cache: bool = True) -> list[int]:
    """Runtime code graphopt writes as LLVM IR text (the sink, the helpers of linker.py):
    compiled for the architecture's baseline, so it runs on any CPU this process runs on,
    whatever GRAPHOPT_CPU says; its object code is cached on disk like a kernel's."""
    target = baseline()

    def build() -> bytes:
        with llvm_lock:
            return target_machine(target).emit_object(_module_for(text, target))
    parts = {"runtime": text.strip(), **target_parts(target)}
    return load_cached(diskcache.make_key(parts), parts, names, target, build, use_cache)[0]
