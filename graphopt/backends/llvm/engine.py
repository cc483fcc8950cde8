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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import llvmlite
import llvmlite.binding as llvm

from . import cache

if TYPE_CHECKING:
    from llvmlite import ir  # modules come from codegen; a warm start never imports it

CODEGEN_VERSION = "2"  # bump when generated code changes for the same kernel text
KernelFn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                            ctypes.c_void_p)
_lock = threading.Lock()  # LLVM's global state is not thread-safe


@functools.cache
def _initialize() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()  # the sink's inline `pause`


@functools.cache
def target_machine() -> llvm.TargetMachine:
    """The target machine codegen uses (each JIT engine has one of its own)."""
    _initialize()
    return _new_target_machine()


@functools.cache
def target_parts() -> dict[str, str]:
    """The parts of a cache key that describe the machine and the compiler."""
    _initialize()
    triple, cpu, features = _host()
    return {"triple": triple, "cpu": cpu, "features": features,
            "llvm": ".".join(map(str, llvm.llvm_version_info)),
            "llvmlite": llvmlite.__version__, "codegen": CODEGEN_VERSION,
            "python": platform.python_implementation()}  # callers copy it into their parts


@dataclass
class Compiled:
    optimized_ir: str
    object_code: bytes


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
    with _lock:
        mod = optimize(module)
        return Compiled(str(mod), target_machine().emit_object(mod))


def assembly(module: ir.Module) -> str:
    with _lock:
        return target_machine().emit_assembly(optimize(module))


_engines: list[llvm.ExecutionEngine] = []  # never disposed: their code may still be called
_loaded: dict[str, int] = {}  # function name -> address, for the life of the process


@functools.cache
def _host() -> tuple[str, str, str]:
    """The process's target triple, CPU name and CPU features (asked of LLVM once)."""
    return (llvm.get_process_triple(), llvm.get_host_cpu_name(),
            llvm.get_host_cpu_features().flatten())


def _new_target_machine() -> llvm.TargetMachine:
    triple, cpu, features = _host()
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=3, reloc="pic", jit=True)


def load(object_code: bytes, name: str, *also: str) -> KernelFn:
    """Link object code into the process and return its function.

    Each kernel gets an MCJIT engine of its own, kept for the life of the process: an engine
    owns its target machine, disposing one whose code may still run crashes, and linking
    several objects into one engine mis-linked them (seen with llvmlite 0.50: a kernel
    loaded after one that calls libm computed wrong results). A kernel already loaded under
    this name (names are hashes of what the code does) is reused. `also`: other functions of
    the same object, found later with `function(name)`."""
    with _lock:
        if name not in _loaded:
            _initialize()
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _new_target_machine())
            engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
            engine.finalize_object()
            for symbol in (name, *also):
                address = engine.get_function_address(symbol)
                if not address:
                    raise RuntimeError(f"function {symbol} not found in its object code")
                _loaded[symbol] = address
            _engines.append(engine)
        return KernelFn(_loaded[name])


def function(name: str) -> KernelFn:
    """A function loaded before (by `load`, as one of `also`)."""
    return KernelFn(_loaded[name])


# -- the step sink: a whole step of kernels in one native call per thread ----------------------
SinkFn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_int64, ctypes.c_void_p)
SINK_NAME, WORKER_NAME, PUBLISH_NAME, WAIT_NAME = (
    "graphopt_sink_v1", "graphopt_worker_v1", "graphopt_publish_v1", "graphopt_wait_v1")

# void sink(i64 count, i64* entries, i64 thread, i64 threads, i64 stride, i64* barrier)
#
# Runs `count` kernels in order. Entry k (a row of `stride` i64) holds the kernel's function
# address, its pointer table, its partials, then a (lo, hi) range of units per thread. Each
# thread runs its range of kernel k, then waits at the barrier (a counter every thread
# increments) until all threads are done with k: MindSpore's "graph sink", one native call per
# thread for the step instead of one per kernel. Written as text: an indirect call through an
# opaque pointer is one line here, and llvmlite's builder has no way to say it.
SINK_IR = """
define void @graphopt_sink_v1(i64 %count, ptr %entries, i64 %thread, i64 %threads,
                              i64 %stride, ptr %barrier) {
entry:
  %lo.at = mul i64 %thread, 2
  %lo.off = add i64 %lo.at, 3
  %hi.off = add i64 %lo.at, 4
  br label %head
head:
  %k = phi i64 [ 0, %entry ], [ %k1, %next ]
  %more = icmp slt i64 %k, %count
  br i1 %more, label %body, label %done
body:
  %row = mul i64 %k, %stride
  %lo.i = add i64 %row, %lo.off
  %lo.p = getelementptr i64, ptr %entries, i64 %lo.i
  %lo = load i64, ptr %lo.p
  %hi.i = add i64 %row, %hi.off
  %hi.p = getelementptr i64, ptr %entries, i64 %hi.i
  %hi = load i64, ptr %hi.p
  %work = icmp slt i64 %lo, %hi
  br i1 %work, label %call, label %wait
call:
  %fn.p = getelementptr i64, ptr %entries, i64 %row
  %fn.a = load i64, ptr %fn.p
  %fn = inttoptr i64 %fn.a to ptr
  %args.i = add i64 %row, 1
  %args.p = getelementptr i64, ptr %entries, i64 %args.i
  %args.a = load i64, ptr %args.p
  %args = inttoptr i64 %args.a to ptr
  %part.i = add i64 %row, 2
  %part.p = getelementptr i64, ptr %entries, i64 %part.i
  %part.a = load i64, ptr %part.p
  %part = inttoptr i64 %part.a to ptr
  call void %fn(i64 %lo, i64 %hi, ptr %args, ptr %part)
  br label %wait
wait:
  %k1 = add i64 %k, 1
  %last = icmp sge i64 %k1, %count
  %alone = icmp sle i64 %threads, 1
  %skip = or i1 %last, %alone
  br i1 %skip, label %next, label %arrive
arrive:
  %old = atomicrmw add ptr %barrier, i64 1 seq_cst
  %goal = mul i64 %k1, %threads
  call void @graphopt_wait_v1(ptr %barrier, i64 %goal)
  br label %next
next:
  br label %head
done:
  ret void
}

; i64 worker(ptr mailbox, i64 thread, i64 seen, i64 spins): a pool thread's loop. It runs
; each step published in the mailbox (i64s: generation, count, entries, threads, stride,
; barrier, done) as `thread`, counting it done, until `spins` polls in a row find no new
; generation; it returns the last generation it saw, and the thread sleeps in Python.
define i64 @graphopt_worker_v1(ptr %mb, i64 %thread, i64 %seen0, i64 %spins) {
entry:
  %count.p = getelementptr i64, ptr %mb, i64 1
  %entries.p = getelementptr i64, ptr %mb, i64 2
  %threads.p = getelementptr i64, ptr %mb, i64 3
  %stride.p = getelementptr i64, ptr %mb, i64 4
  %barrier.p = getelementptr i64, ptr %mb, i64 5
  %done.p = getelementptr i64, ptr %mb, i64 6
  br label %idle
idle:
  %seen = phi i64 [ %seen0, %entry ], [ %gen, %work ], [ %gen, %run ]
  br label %poll
poll:
  %i = phi i64 [ 0, %idle ], [ %i1, %again ]
  %gen = load atomic i64, ptr %mb acquire, align 8
  %new = icmp ne i64 %gen, %seen
  br i1 %new, label %work, label %again
again:
  {pause}
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %spins
  br i1 %more, label %poll, label %out
out:
  ret i64 %seen
work:
  %threads = load i64, ptr %threads.p
  %mine = icmp slt i64 %thread, %threads
  br i1 %mine, label %run, label %idle
run:
  %count = load i64, ptr %count.p
  %entries.a = load i64, ptr %entries.p
  %entries = inttoptr i64 %entries.a to ptr
  %stride = load i64, ptr %stride.p
  %barrier.a = load i64, ptr %barrier.p
  %barrier = inttoptr i64 %barrier.a to ptr
  call void @graphopt_sink_v1(i64 %count, ptr %entries, i64 %thread, i64 %threads,
                              i64 %stride, ptr %barrier)
  %old = atomicrmw add ptr %done.p, i64 1 release
  br label %idle
}

; void publish(ptr mailbox): the next generation, after every store this thread made before
; (release): a pool thread that sees it sees the step's table and counters too.
define void @graphopt_publish_v1(ptr %mb) {
  %old = atomicrmw add ptr %mb, i64 1 release
  ret void
}

; void wait(ptr counter, i64 goal): returns once *counter >= goal.
define void @graphopt_wait_v1(ptr %c, i64 %goal) {
entry:
  br label %poll
poll:
  %v = load atomic i64, ptr %c acquire, align 8
  %ok = icmp sge i64 %v, %goal
  br i1 %ok, label %done, label %again
again:
  {pause}
  br label %poll
done:
  ret void
}
"""


WorkerFn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                            ctypes.c_int64)
WaitFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
PublishFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@dataclass(frozen=True)
class Sink:
    """The sink's functions: `run` a step's share as one thread, a pool thread's `worker`
    loop, `publish` a step to the pool, `wait` for a counter (see SINK_IR)."""

    run: SinkFn
    worker: WorkerFn
    publish: PublishFn
    wait: WaitFn


def _sink_ir() -> str:
    # A spinning thread tells an x86 core so (`pause`: less power, and the core's other
    # hardware thread runs on); other targets spin without it.
    x86 = _host()[0].split("-")[0] in ("x86_64", "i386", "i686")
    return SINK_IR.replace("{pause}", 'call void asm sideeffect "pause", ""()' if x86 else "")


@functools.cache
def sink(use_cache: bool = True) -> Sink:
    """The sink's functions, loaded once per process; its object code is cached on disk like a
    kernel's (compiling it costs ~10 ms, a tenth of a warm start)."""
    text = _sink_ir()
    parts = {"sink": text.strip(), **target_parts()}
    key = cache.make_key(parts)
    obj = cache.load(key, parts) if use_cache else None
    if obj is None:
        with _lock:
            mod = llvm.parse_assembly(text)
            mod.triple = target_machine().triple
            mod.data_layout = str(target_machine().target_data)
            mod.verify()
            obj = target_machine().emit_object(mod)
        if use_cache:
            cache.store(key, parts, obj)
    load(obj, SINK_NAME, WORKER_NAME, PUBLISH_NAME, WAIT_NAME)
    return Sink(SinkFn(_loaded[SINK_NAME]), WorkerFn(_loaded[WORKER_NAME]),
                PublishFn(_loaded[PUBLISH_NAME]), WaitFn(_loaded[WAIT_NAME]))
