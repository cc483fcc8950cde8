"""The JIT engine: LLVM IR -> optimised module -> object code -> a callable function.

The target machine is the host's (CPU name and features from LLVM), at O3 with loop and SLP
vectorization. Object code is what the disk cache keeps (see cache.py); loading it needs no
compiler run, only the linker step of MCJIT.
"""
from __future__ import annotations

import ctypes
import functools
import platform
import threading
import time
from dataclasses import dataclass

import llvmlite
import llvmlite.binding as llvm
from llvmlite import ir

CODEGEN_VERSION = "1"  # bump when generated code changes for the same kernel text
KernelFn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                            ctypes.c_void_p)
_lock = threading.Lock()  # LLVM's global state is not thread-safe


@functools.cache
def target_machine() -> llvm.TargetMachine:
    """The target machine codegen uses (the JIT engine has one of its own)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return _new_target_machine()


@functools.cache
def target_parts() -> dict[str, str]:
    """The parts of a cache key that describe the machine and the compiler."""
    target_machine()
    return {"triple": llvm.get_process_triple(), "cpu": llvm.get_host_cpu_name(),
            "features": llvm.get_host_cpu_features().flatten(),
            "llvm": ".".join(map(str, llvm.llvm_version_info)),
            "llvmlite": llvmlite.__version__, "codegen": CODEGEN_VERSION,
            "python": platform.python_implementation()}  # callers copy it into their parts


@dataclass
class Compiled:
    ir_text: str  # as generated
    optimized_ir: str
    object_code: bytes
    seconds: float


def optimize(module: ir.Module) -> llvm.ModuleRef:
    tm = target_machine()
    mod = llvm.parse_assembly(str(module))
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def compile_module(module: ir.Module) -> Compiled:
    start = time.perf_counter()
    with _lock:
        mod = optimize(module)
        obj = target_machine().emit_object(mod)
        optimized = str(mod)
    return Compiled(str(module), optimized, obj, time.perf_counter() - start)


def assembly(module: ir.Module) -> str:
    with _lock:
        return target_machine().emit_assembly(optimize(module))


_engines: list[llvm.ExecutionEngine] = []  # never disposed: their code may still be called
_loaded: dict[str, int] = {}  # function name -> address, for the life of the process


def _new_target_machine() -> llvm.TargetMachine:
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, reloc="pic", jit=True)


def load(object_code: bytes, name: str) -> KernelFn:
    """Link object code into the process and return its function.

    Each kernel gets an MCJIT engine of its own, kept for the life of the process: an engine
    owns its target machine, disposing one whose code may still run crashes, and linking
    several objects into one engine mis-linked them (seen with llvmlite 0.50: a kernel
    loaded after one that calls libm computed wrong results). A kernel already loaded under
    this name (names are hashes of what the code does) is reused."""
    with _lock:
        if name not in _loaded:
            target_machine()  # initialises LLVM's native target
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _new_target_machine())
            engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
            engine.finalize_object()
            address = engine.get_function_address(name)
            if not address:
                raise RuntimeError(f"function {name} not found in its object code")
            _engines.append(engine)
            _loaded[name] = address
        return KernelFn(_loaded[name])
