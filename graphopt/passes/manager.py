"""The pass manager: runs a pipeline of named passes, verifies and measures each one.

    result = graphopt.passes.run(graph, "dce,cse,fold,simplify,fuse,hfuse",
                                 print_after_change=True)
    result.graph      # the rewritten graph (the input graph is left as it was)
    print(result)     # a table: time, nodes before/after, kernels, bytes moved, per pass

A pass is a function `(graph, ctx) -> dict | None` that rewrites the graph in place and may
return counters for the table ("merged": 3). It is registered under a name with `@register`.
After each pass the graph is verified; a pass that breaks a rule is named in the error.
"""
from __future__ import annotations

import contextlib
import difflib
import operator
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TextIO

from ..errors import GraphoptError, VerifyError
from ..ir.graph import Graph, Location, Value
from ..ir.printer import format_graph, kept_names, value_names
from ..ir.uses import recording_replacements
from ..ir.verifier import verify
from .cost import graph_bytes

DEFAULT_PIPELINE = ("dce", "cse", "fold", "simplify", "cse", "dce", "fuse", "wholestep",
                    "rowfuse", "hfuse", "dce")


class PassError(GraphoptError):
    """A pipeline names an unknown pass, or a pass produced a graph that does not verify."""


@dataclass
class Refusal:
    """A rewrite a pass considered and did not make, with the reason (for explain)."""

    pass_name: str
    subject: str  # what was not rewritten, as printed before the pass ("%5 = multiply")
    reason: str
    loc: object = None

    def __str__(self) -> str:
        where = f" ({self.loc.full()})" if self.loc is not None else ""
        return f"{self.pass_name}: {self.subject}{where}: {self.reason}"


@dataclass
class PassContext:
    """What every pass may read and write besides the graph: `fastmath` (rewrites that are
    only algebraically exact are allowed), `options` (settings of particular passes, by
    name: the bucket pass's "bucket_bytes"), the refusals recorded so far, and `current`,
    the name of the pass that runs."""

    fastmath: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)
    current: str = ""

    def refuse(self, subject: str, reason: str, loc: object = None) -> None:
        """Record a rewrite the running pass considered and did not make, for `explain`.

        Args:
            subject: what was not rewritten, as the IR printed it before the pass
                ("%5 = multiply").
            reason: why, in words.
            loc: the user's source location of the subject, if known.
        """
        self.refusals.append(Refusal(self.current, subject, reason, loc))


@dataclass(frozen=True)
class Pass:
    """A registered pass: its name, its function and its description (the docstring)."""

    name: str
    run: Callable[[Graph, PassContext], dict | None]
    doc: str


PASSES: dict[str, Pass] = {}


def _defined_at(fn: Callable) -> tuple[str, int, str]:
    code = getattr(fn, "__code__", None)
    return (code.co_filename, code.co_firstlineno, fn.__qualname__) if code is not None \
        else ("?", 0, repr(fn))


def register(name: str):
    """Register a pass function under `name`; its docstring is its description. A name names
    one pass: registering another function under a taken name is a PassError (at the new
    function's file:line). The same definition run again (its file loaded twice) replaces
    the first."""
    def wrap(fn: Callable[[Graph, PassContext], dict | None]):
        old = PASSES.get(name)
        if old is not None and _defined_at(old.run) != _defined_at(fn):
            file, line, _ = _defined_at(fn)
            taken, at, qualname = _defined_at(old.run)
            raise PassError(f"the pass name '{name}' is taken, by {qualname} "
                            f"({taken}:{at}); register this one under another name",
                            loc=Location(file, line))
        PASSES[name] = Pass(name, fn, (fn.__doc__ or "").strip())
        return fn
    return wrap


@dataclass
class PassStats:
    """What one pass of a pipeline did: time, nodes and kernels before and after, the bytes
    one run of the graph after it is estimated to move, its own counters, and whether it
    changed the graph (with a unified diff of the text IR when `run(diffs=True)`)."""

    name: str
    seconds: float
    nodes_before: int
    nodes_after: int
    kernels_before: int
    kernels_after: int
    bytes_read: int  # estimated for one run of the graph after the pass
    bytes_written: int
    changed: bool
    counters: dict
    diff: str  # unified diff of the text IR (empty when unchanged, or without run(diffs=True))
    fingerprint: int = 0  # of the graph after the pass (see `fingerprint`)

    @property
    def nodes_removed(self) -> int:
        """nodes_before - nodes_after (negative when the pass added nodes)."""
        return self.nodes_before - self.nodes_after

    @property
    def kernels_formed(self) -> int:
        """kernels_after - kernels_before."""
        return self.kernels_after - self.kernels_before


@dataclass
class PipelineResult:
    """What `run` returns: the rewritten graph, one PassStats per pass in order, and every
    refusal the passes recorded. `str()` of it is the statistics table. `names`: when the
    run printed or diffed the IR, the name each value of the result had in those printings
    (`format_graph(result.graph, keep=result.names)` prints it so); else empty."""

    graph: Graph
    stats: list[PassStats]
    refusals: list[Refusal]
    names: dict[Value, str] = field(default_factory=dict)

    def format(self) -> str:
        """The result's text form with locations, in the names of the run's printings."""
        return format_graph(self.graph, locs=True, keep=self.names, totals=True)

    def __str__(self) -> str:
        rows = [f"{'pass':<10} {'ms':>8} {'nodes':>13} {'kernels':>8} {'MB read':>8} "
                f"{'MB written':>10}  notes"]
        for s in self.stats:
            notes = ", ".join(f"{k}={v}" for k, v in s.counters.items() if v)
            rows.append(f"{s.name:<10} {s.seconds * 1e3:8.2f} {s.nodes_before:>6}->"
                        f"{s.nodes_after:<6} {s.kernels_after:>8} {s.bytes_read / 1e6:8.3f} "
                        f"{s.bytes_written / 1e6:10.3f}  {notes or ('' if s.changed else '-')}")
        return "\n".join(rows)


def parse_pipeline(pipeline: str | Iterable[str] | None) -> list[str]:
    if pipeline is None:
        return list(DEFAULT_PIPELINE)
    if isinstance(pipeline, str) and pipeline.strip().lower() == "default":
        return list(DEFAULT_PIPELINE)
    names = [p.strip() for p in (pipeline.split(",") if isinstance(pipeline, str) else pipeline)]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise PassError(f"unknown pass{'es' * (len(unknown) > 1)} {', '.join(unknown)}; known "
                        f"passes: {', '.join(sorted(PASSES))}")
    return names


def _matches(patterns: str | Iterable[str], name: str) -> bool:
    pats = [patterns] if isinstance(patterns, str) else list(patterns)
    return any(re.fullmatch(p, name) for p in pats)


_SERIAL = operator.attrgetter("serial")


def fingerprint(graph: Graph) -> int:
    """A fingerprint of the graph's structure: which nodes, reading which values, in which
    order. Passes replace nodes rather than edit them, so a pass that changed anything changes
    this (serial numbers, unlike id(), are never reused); it costs one walk, not a printing."""
    def serials(values):
        return tuple(map(_SERIAL, values))
    return hash((tuple((n.serial, serials(n.inputs), serials(n.after)) for n in graph.nodes),
                 serials(graph.outputs), serials(graph.effects)))


def run(graph: Graph, pipeline: str | Iterable[str] | None = None, *,
        print_before: str | Iterable[str] = (), print_after: str | Iterable[str] = (),
        print_after_all: bool = False, print_after_change: bool = False,
        verify: bool | str = True,
        fastmath: bool = False, options: dict[str, Any] | None = None, diffs: bool = False,
        after_pass: Callable[[Graph, PassStats, dict[Value, str] | None], None] | None = None,
        out: TextIO | None = None) -> PipelineResult:
    """Run passes on a copy of `graph` (the graph itself is left as it was).

    Args:
        graph: the graph to rewrite.
        pipeline: pass names, as a list or a string "dce,cse,..."; None (or "default")
            means DEFAULT_PIPELINE, "" no pass.
        print_before: pass names or regular expressions; the IR is printed before each
            pass that matches.
        print_after: likewise, after each pass that matches.
        print_after_all: print the IR after every pass.
        print_after_change: print it only after the passes that changed it.
            Every printing names a value as the first did (by identity: see
            PipelineResult.names), so two printings differ where a pass changed the graph.
        verify: True verifies the input and the graph after every pass, "last" only the
            result (what jit does: compile time), False never; GRAPHOPT_VERIFY=each makes
            every pipeline verify the input and every pass.
        fastmath: allow rewrites that are only algebraically exact.
        options: settings of particular passes, by name (PassContext.options).
        diffs: keep a unified diff of the text IR in each pass's stats (explain uses it).
        after_pass: called with the graph, the pass's stats and the names its values print
            with (None when nothing is printed) after each pass, before the next one rewrites
            it (the explorer takes its snapshots so).
        out: where to print (default sys.stdout).

    Returns:
        The rewritten graph, the statistics of each pass and the refusals.

    Raises:
        PassError: an unknown pass name, or a graph that does not verify (the message names
            the pass after which it broke).
    """
    from .. import envvars
    each = verify is True or envvars.verify_each()
    names = parse_pipeline(pipeline)
    out = out or sys.stdout
    g = graph.clone()
    if each:
        _verify(g, "the input graph does not verify (before any pass)")
    ctx = PassContext(fastmath=fastmath, options=dict(options or {}))
    stats: list[PassStats] = []
    memo: dict[int, tuple[int, int]] = {}
    # A run that prints or diffs the IR names each value once, by identity, from the input's
    # printing on: a value keeps its name through every pass, one that takes the place of
    # another takes its name, so a printing after a pass differs from the one before only
    # where the pass changed something (not every later %N renumbered).
    printing = diffs or print_after_all or print_after_change or bool(print_before) or \
        bool(print_after)
    shown = value_names(g) if printing else None
    for name in names:
        if _matches(print_before, name):
            text = format_graph(g, locs=True, keep=shown, totals=True)
            print(f"# *** IR before {name} ***\n{text}", file=out)
        s, shown = _run_pass(g, name, ctx, memo, verify=each, diffs=diffs, pipeline=names,
                             before=stats[-1].fingerprint if stats else None, names=shown)
        stats.append(s)
        if after_pass is not None:
            after_pass(g, s, shown)
        if print_after_all or _matches(print_after, name) or (print_after_change and s.changed):
            print(f"# *** IR after {name}{'' if s.changed else ' (no change)'} ***\n"
                  f"{format_graph(g, locs=True, keep=shown, totals=True)}", file=out)
    if verify == "last" and not each:
        _verify(g, f"the graph does not verify after the pipeline {','.join(names) or '(none)'} "
                   f"(GRAPHOPT_VERIFY=each verifies its input and every pass, to find which "
                   f"broke it)")
    return PipelineResult(g, stats, ctx.refusals, shown or {})


def _run_pass(g: Graph, name: str, ctx: PassContext, memo: dict[int, tuple[int, int]], *,
              verify: bool, diffs: bool, pipeline: list[str], before: int | None,
              names: dict[Value, str] | None) -> tuple[PassStats, dict[Value, str] | None]:
    """One pass on g: run it, verify the result, and measure what it did (`before`: the
    graph's fingerprint as the previous pass left it, when there was one). `names`: the
    values' names in the printing before the pass, or None when nothing is printed; returned
    as they are after it."""
    before = fingerprint(g) if before is None else before
    before_text = format_graph(g, locs=True, keep=names, totals=True) if diffs else ""
    # Passes name values in refusals as a fresh printing of the graph before them does.
    fresh = value_names(g) if names is not None else {}
    refused = len(ctx.refusals)
    nodes_before, kernels_before = _sizes(g)
    ctx.current = name
    start = time.perf_counter()
    # (recorded only when printing: a compile does not pay for the log)
    with recording_replacements() if names is not None else contextlib.nullcontext({}) \
            as replaced:
        counters = PASSES[name].run(g, ctx) or {}
    seconds = time.perf_counter() - start
    if verify:
        _verify(g, f"the graph does not verify after pass '{name}' (pipeline "
                   f"{','.join(pipeline)})")
    after = fingerprint(g)
    changed = after != before
    diff = ""
    if names is not None:
        kept = value_names(g, keep=kept_names(names, replaced, g)) if changed else names
        _rename(ctx.refusals[refused:], fresh, names, kept)
        if diffs and changed:
            diff = "".join(difflib.unified_diff(
                before_text.splitlines(True),
                format_graph(g, locs=True, keep=kept, totals=True).splitlines(True),
                f"before {name}", f"after {name}", n=1))
        names = kept
    read, written = graph_bytes(g, memo)
    return PassStats(name, seconds, nodes_before, len(g.nodes), kernels_before, _sizes(g)[1],
                     read, written, changed, counters, diff, after), names


_NUMBERED = re.compile(r"%[0-9]+(?![0-9])")


def _rename(refusals: list[Refusal], fresh: dict[Value, str], before: dict[Value, str],
            after: dict[Value, str]) -> None:
    """Name the values in refusals (subject and reason) as the printings do: a pass wrote them as a
    fresh printing of the graph before it numbers them; a value still there is named as
    the printing after the pass names it, one that is gone as the one before did."""
    value = {n: v for v, n in fresh.items()}

    def name(m: re.Match) -> str:
        v = value.get(m.group())
        return m.group() if v is None else after.get(v) or before.get(v, m.group())
    for r in refusals:
        r.subject, r.reason = _NUMBERED.sub(name, r.subject), _NUMBERED.sub(name, r.reason)


def _verify(g: Graph, what: str) -> None:
    try:
        verify(g)
    except VerifyError as e:
        raise PassError(f"{what}: {e}") from e


def _sizes(g: Graph) -> tuple[int, int]:
    return len(g.nodes), sum(n.body is not None for n in g.nodes)
