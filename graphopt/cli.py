"""The `graphopt` command.

    graphopt demo                              compile an Adam step, print it, run it, draw it
    graphopt ir FILE.gir                       parse and verify IR text, print it back
    graphopt opt FILE.gir --passes dce,cse     run passes on IR text (like LLVM's opt)
    graphopt compile FILE.py:FUNC --emit ir    trace a step function from a file and dump it
    graphopt cache info|list|clear|path        the on-disk compilation cache (docs/cache.md)

For `compile`, FILE.py gives example arguments for FUNC with a function `make_inputs()` (or
`FUNC_inputs()`) that returns a tuple of positional arguments, or a dict of keyword arguments.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

from .errors import GraphoptError


class CLIError(GraphoptError):
    """A command-line argument that cannot be used."""


def _demo(args: argparse.Namespace) -> int:
    from .demo import run
    return run(args.out, args.steps)


def _read_ir(path: str):
    from .ir import parse
    if path == "-":
        return parse(sys.stdin.read())
    return parse(Path(path).read_text())


def _ir(args: argparse.Namespace) -> int:
    """Read IR text, verify it, print it back (with locations)."""
    graph = _read_ir(args.file)
    graph.verify()
    print(graph.format(locs=True))
    return 0


def _write(text: str, out: str | None) -> None:
    if out:
        Path(out).write_text(text + "\n")
    else:
        print(text)


def _emit(graph, emit: str, out: str | None, fastmath: bool = False) -> None:
    from .ir.export import dump
    if emit in ("llvm", "asm"):  # the kernels, compiled for this machine
        from .backends.llvm import compile as compile_llvm
        _write(compile_llvm(graph, fastmath=fastmath).listing(emit), out)
        return
    if emit in ("ir", "text"):
        _write(graph.format(locs=True), out)
        return
    if emit == "dot" and not out:
        print(graph.to_dot().source)
        return
    if not out:
        raise CLIError(f"--emit {emit} needs -o FILE")
    dump(graph, out)


def _opt(args: argparse.Namespace) -> int:
    from .explain import explain_graph
    from .passes import run
    graph = _read_ir(args.file)
    graph.verify()
    if args.explain:
        result = explain_graph(graph, args.passes, fastmath=args.fastmath)
    else:
        result = run(graph, args.passes, print_after_all=args.print_after_all,
                     print_after_change=args.print_after_change,
                     print_after=args.print_after or (), fastmath=args.fastmath)
        if args.stats:
            print(result, file=sys.stderr)
    _emit(result.graph, args.emit, args.output, args.fastmath)
    return 0


def load_function(spec: str) -> tuple[Any, tuple, dict]:
    """FILE.py:FUNC -> (the function, example args, example kwargs)."""
    file, _, name = spec.rpartition(":")
    if not file or not name:
        raise CLIError(f"expected FILE.py:FUNC, got {spec!r}")
    path = Path(file)
    if not path.exists():
        raise CLIError(f"no such file: {file}")
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    fn = getattr(module, name, None)
    if fn is None:
        raise CLIError(f"{file} has no function {name}")
    make = getattr(module, f"{name}_inputs", None) or getattr(module, "make_inputs", None)
    if make is None:
        raise CLIError(f"{file} must define make_inputs() or {name}_inputs() returning the "
                       f"example arguments of {name} (a tuple, or a dict of keyword arguments)")
    inputs = make()
    if isinstance(inputs, dict):
        return fn, (), inputs
    return fn, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,), {}


def _compile(args: argparse.Namespace) -> int:
    from .explain import explain
    from .frontend.tracer import trace_function
    from .passes import run
    fn, fargs, fkwargs = load_function(args.target)
    fn = getattr(fn, "fn", fn)  # a jitted function: trace what it wraps
    if args.explain:
        result = explain(fn, *fargs, passes=args.passes, fastmath=args.fastmath, **fkwargs)
    else:
        graph = trace_function(fn, fargs, fkwargs).graph.verify()
        result = run(graph, args.passes, print_after_all=args.print_after_all,
                     fastmath=args.fastmath)
    _emit(result.graph, args.emit, args.output, args.fastmath)
    return 0


def _cache(args: argparse.Namespace) -> int:
    from .backends.llvm import cache
    return cache.command(args.action)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="graphopt", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="compile an Adam step, print its IR, run it, draw it")
    p.add_argument("--out", default="graphopt_demo_out", help="folder for the dumps")
    p.add_argument("--steps", type=int, default=5)
    p.set_defaults(run=_demo)

    p = sub.add_parser("ir", help="parse and verify an IR text file, print it back")
    p.add_argument("file", help="a .gir file, or - for standard input")
    p.set_defaults(run=_ir)

    def pipeline_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--passes", default=None,
                       help="comma-separated pass names (default: the default pipeline)")
        p.add_argument("--emit", choices=("ir", "text", "dot", "svg", "png", "pdf", "llvm",
                                          "asm"), default="ir",
                       help="the IR (text), a drawing, or the kernels' LLVM IR or assembly")
        p.add_argument("-o", "--output", help="write the result here")
        p.add_argument("--print-after-all", action="store_true")
        p.add_argument("--explain", action="store_true",
                       help="show each pass's diff and every refused fusion with its reason")
        p.add_argument("--fastmath", action="store_true")

    p = sub.add_parser("opt", help="run passes on an IR text file")
    p.add_argument("file", help="a .gir file, or - for standard input")
    pipeline_options(p)
    p.add_argument("--print-after", action="append", help="a pass name or regular expression")
    p.add_argument("--print-after-change", action="store_true")
    p.add_argument("--stats", action="store_true", help="print the pass table on stderr")
    p.set_defaults(run=_opt)

    p = sub.add_parser("compile", help="trace FILE.py:FUNC and dump it")
    p.add_argument("target", metavar="FILE.py:FUNC")
    pipeline_options(p)
    p.set_defaults(run=_compile)

    p = sub.add_parser("cache", help="the on-disk compilation cache: info, list, clear, path")
    p.add_argument("action", choices=("info", "list", "clear", "path"))
    p.set_defaults(run=_cache)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except GraphoptError as e:
        print(f"graphopt: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"graphopt: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
