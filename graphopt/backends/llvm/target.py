"""The compilation target: what CPU kernels are compiled for, and whether this host runs it.

`GRAPHOPT_CPU` names an LLVM CPU (`x86-64`, `x86-64-v2`, `x86-64-v3`, `x86-64-v4`, `znver3`,
`neoverse-n1`, ...) or `host` (the default: this machine's CPU and features, as LLVM detects
them); `GRAPHOPT_CPU_FEATURES` adds LLVM feature flags to the CPU's (`+avx2,-fma`).

A target is checked before any of its code is compiled or loaded, and refused with a
`TargetError`: a CPU or feature name LLVM does not know (LLVM itself would only warn and
compile for a generic CPU, or abort), or code the host cannot run (which would be a SIGILL).
"Can run" is LLVM's own rule, asked of LLVM rather than re-listed here: its inliner inlines a
function compiled for one subtarget into one compiled for another only when the callee's
instruction-set features are a subset of the caller's (TargetTransformInfo's
areInlineCompatible). So a probe module holds a function for the target called by one for
the host; after the inliner has run, the call is gone exactly when the host runs the target.

Runtime code that is not a kernel (the graph sink, the conversion helpers) is compiled for
`baseline()`, the architecture's oldest level, so it runs wherever the process runs.
"""
from __future__ import annotations

import functools
import os
import sys
import tempfile
import threading
from dataclasses import dataclass, field

import llvmlite.binding as llvm

from ... import envvars
from ...errors import TargetError
from . import compileworker

llvm_lock = threading.RLock()  # LLVM's global state is not thread-safe (engine.py takes it too)
HOST = "host"


@functools.cache
def _initialize() -> None:
    compileworker.initialize()


@dataclass(frozen=True)
class Target:
    """An LLVM target: triple, CPU name and feature string, as LLVM spells them."""

    triple: str
    cpu: str
    features: str = ""
    label: str = field(default="", compare=False)  # how explain and the cache list show it

    @property
    def arch(self) -> str:
        return self.triple.split("-")[0]

    @property
    def is_x86(self) -> bool:
        return self.arch in ("x86_64", "i386", "i686")

    def machine(self) -> llvm.TargetMachine:
        """A new target machine (an MCJIT engine owns the one it is given)."""
        _initialize()
        return compileworker.machine(self.triple, self.cpu, self.features)

    def parts(self) -> dict[str, str]:
        """This target as parts of a cache key."""
        return {"triple": self.triple, "cpu": self.cpu, "features": self.features}

    def __str__(self) -> str:
        return self.label or " ".join(filter(None, (self.cpu, self.features)))


@functools.cache
def host() -> Target:
    """This process's triple, CPU and features, as LLVM detects them."""
    _initialize()
    cpu = llvm.get_host_cpu_name()
    return Target(llvm.get_process_triple(), cpu, llvm.get_host_cpu_features().flatten(),
                  f"host ({cpu})")


def baseline(triple: str | None = None) -> Target:
    """The architecture's oldest level: code for it runs on every CPU of the architecture."""
    triple = triple or host().triple
    arch = triple.split("-")[0]
    return Target(triple, "x86-64" if arch == "x86_64" else "generic")


def selected() -> Target:
    """The target GRAPHOPT_CPU and GRAPHOPT_CPU_FEATURES choose, checked: this host runs it."""
    return _selected(envvars.cpu(), envvars.cpu_features())


@functools.cache
def _selected(cpu: str, features: str) -> Target:
    h = host()
    if cpu == HOST:
        if not features:
            return h
        target = Target(h.triple, h.cpu, f"{h.features},{features}", f"{h} {features}")
        where = f"GRAPHOPT_CPU_FEATURES={features}"
    else:
        target = Target(h.triple, cpu, features)
        where = f"GRAPHOPT_CPU={cpu}" + (f" GRAPHOPT_CPU_FEATURES={features}" if features
                                         else "")
    check_names(target, where, features)
    missing = _missing_features(target)
    if missing:
        raise TargetError(f"{where}: this host ({h.cpu}) cannot run code compiled for "
                          f"{target.cpu}" + (f" {features}" if features else "") +
                          f": the CPU lacks {', '.join(missing)}; refused before any code "
                          f"was loaded (GRAPHOPT_CPU=host compiles for this machine)")
    return target


def describe() -> str:
    """The selected target in a line (what explain prints), or why it is refused."""
    try:
        t = selected()
    except TargetError as e:
        return f"refused: {e}"
    return f"{t.triple}, {t} (GRAPHOPT_CPU={envvars.cpu()})"


def cross(triple: str, cpu: str, features: str = "") -> Target:
    """A target for another machine (compiled for, never run here); its names are checked."""
    target = Target(triple, cpu, features)
    check_names(target, f"target {triple} {cpu}", features)
    return target


# -- names LLVM knows ------------------------------------------------------------------------
def check_names(target: Target, where: str, flags: str) -> None:
    """TargetError unless LLVM knows the target's triple, its CPU and every feature flag of
    `flags` (the ones a user gave). LLVM only warns of an unknown name, on stderr, and goes on
    with a generic CPU; so a target machine is made while stderr is caught."""
    for flag in filter(None, flags.split(",")):
        if flag[:1] not in "+-" or not flag[1:]:
            raise TargetError(f"{where}: '{flag}' is not a feature flag (a flag is +name or "
                              f"-name, as LLVM spells it: +avx2,-fma)")
    try:
        _initialize()
        llvm.Target.from_triple(target.triple)
    except RuntimeError as e:
        raise TargetError(f"{where}: LLVM has no target for {target.triple}: {e}") from None
    complaints = list(dict.fromkeys(_unknown_names(target)))  # LLVM says each one twice
    if complaints:
        raise TargetError(f"{where}: LLVM does not know it for {target.triple}: "
                          f"{'; '.join(complaints)} (GRAPHOPT_CPU=host compiles for this "
                          f"machine)")


@functools.cache
def _unknown_names(target: Target) -> tuple[str, ...]:
    text = _stderr_of(target.machine)
    return tuple(line.split(" (ignoring")[0].strip() for line in text.splitlines()
                 if "is not a recognized" in line)


def _stderr_of(fn) -> str:
    """What native code writes on file descriptor 2 while fn runs."""
    with llvm_lock, tempfile.TemporaryFile() as out:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        return out.read().decode(errors="replace")


# -- can this host run it? -------------------------------------------------------------------
def _missing_features(target: Target) -> list[str]:
    """The instruction-set features code for `target` may use that this host lacks."""
    h = host()
    if (target.cpu, target.features) == (h.cpu, h.features):
        return []
    if _host_runs([(h, target)]) == [True]:
        return []
    # Which features: for each one the host lacks, does the target have it? (A target
    # without f runs under the target with f removed only if the target never had f.)
    lacking = sorted(f for f, on in llvm.get_host_cpu_features().items() if not on)
    answers = _host_runs([(Target(target.triple, target.cpu, f"{target.features},-{f}"),
                           target) for f in lacking])
    return [f for f, runs in zip(lacking, answers) if not runs] or ["(features LLVM did not "
                                                                     "name)"]


def _host_runs(pairs: list[tuple[Target, Target]]) -> list[bool]:
    """For each (caller, callee): does the inliner inline code for callee into caller, that
    is, are the callee's features a subset of the caller's?"""
    lines, attrs = [], []
    for k, (caller, callee) in enumerate(pairs):
        # A volatile store: the call can go away only by being inlined.
        lines += [f"define internal void @callee{k}(ptr %p) #{2 * k} {{",
                  "  store volatile i32 1, ptr %p", "  ret void", "}",
                  f"define void @caller{k}(ptr %p) #{2 * k + 1} {{",
                  f"  call void @callee{k}(ptr %p)", "  ret void", "}"]
        attrs += [f'attributes #{2 * k} = {{ "target-cpu"="{callee.cpu}" '
                  f'"target-features"="{callee.features}" }}',
                  f'attributes #{2 * k + 1} = {{ "target-cpu"="{caller.cpu}" '
                  f'"target-features"="{caller.features}" }}']
    with llvm_lock:
        mod = llvm.parse_assembly("\n".join(lines + attrs))
        mod.triple = host().triple
        tm = host().machine()
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=2))
        pb.getModulePassManager().run(mod, pb)
        left = {f.name for f in mod.functions}  # an inlined internal callee is deleted
    return [f"callee{k}" not in left for k in range(len(pairs))]
