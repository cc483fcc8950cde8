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

CODEGEN_VERSION = "4"  # bump when generated code changes for the same kernel text
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
    x86 = baseline().is_x86
    return SINK_IR.replace("{pause}", 'call void asm sideeffect "pause", ""()' if x86 else "")


@functools.cache
def sink(use_cache: bool = True) -> Sink:
    """The sink's functions, loaded once per process; its object code is cached on disk like a
    kernel's (compiling it costs ~10 ms, a tenth of a warm start)."""
    run, worker, publish, wait = runtime_functions(
        _sink_ir(), (SINK_NAME, WORKER_NAME, PUBLISH_NAME, WAIT_NAME), use_cache)
    return Sink(SinkFn(run), WorkerFn(worker), PublishFn(publish), WaitFn(wait))
