"""The `graphopt` command.

    graphopt demo                              compile an Adam step, print it, run it, draw it
    graphopt ir FILE.gir                       parse and verify IR text, print it back
    graphopt opt FILE.gir --passes dce,cse     run passes on IR text (like LLVM's opt)
    graphopt opt FILE.gir --load mypass.py --passes mypass
                                               ... with a pass defined in a file of yours
    graphopt opt FILE.gir --load-pass mypasses:double --passes double
                                               ... a function of a module of yours, as a pass
    graphopt compile FILE.py:FUNC --emit ir    trace a step function from a file and dump it
    graphopt explore FILE.py:FUNC -o step.html one HTML page of its passes, kernels, memory
    graphopt explore FILE.gir --passes fuse -o step.html
    graphopt cache info|list|clear|path        the on-disk compilation cache (docs/cache.md)

For `compile` and `explore`, FILE.py gives example arguments for FUNC with a function `make_inputs()` (or
`FUNC_inputs()`) that returns a tuple of positional arguments, or a dict of keyword arguments.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
import sysconfig
import time
import traceback
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import diskcache, envvars
from .errors import GraphoptError, ParseError, VerifyError

EPILOG = """\
exit status:
  0    done
  2    a mistake in the command line, in a file it names, in code that file runs, or in a
       GRAPHOPT_* switch: one line on stderr says what is wrong, starting with FILE:LINE
       when it is in a file; never a traceback
  1    a bug in graphopt (an error it should have explained): one line says so
  130  interrupted (Ctrl-C)

GRAPHOPT_DEBUG=1 prints the traceback as well, for a bug report. Every GRAPHOPT_* switch is
in docs/switches.md.
"""

USAGE_ERROR, BUG, INTERRUPTED = 2, 1, 130


class CLIError(GraphoptError):
    """A command-line argument that cannot be used."""


class UserCodeError(GraphoptError):
    """An exception raised by the user's code (FILE.py, what it imports, its make_inputs() and
    its step function) while `graphopt compile` runs it; the message gives the user's
    file:line, and the exception is chained as the cause (GRAPHOPT_DEBUG=1 shows it)."""


# ----------------------------------------------------------------------------- whose code

_GRAPHOPT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LIBRARY_DIRS = tuple(sorted({os.path.abspath(sysconfig.get_path(k)) + os.sep
                              for k in ("stdlib", "platstdlib", "purelib", "platlib")}))


def _is_user_file(filename: str, user_files: set[str]) -> bool:
    """Is this a file of the user's: one they named, or any that is not graphopt's, Python's or
    an installed library's (their own modules that their file imports)?"""
    if filename.startswith("<"):  # <frozen importlib...>, <string>
        return False
    path = os.path.abspath(filename)
    return path in user_files or not path.startswith((_GRAPHOPT_DIR,) + _LIBRARY_DIRS)


def _user_line(e: BaseException, user_files: set[str]) -> str | None:
    """`file:line` of the innermost frame of user code if it raised `e` (the user's frame is
    deeper than any of graphopt's: a library the user called counts as the user's call), else
    None (graphopt's own code raised it)."""
    user, ours = None, -1
    for i, frame in enumerate(traceback.extract_tb(e.__traceback__)):
        if _is_user_file(frame.filename, user_files):
            user = (i, f"{frame.filename}:{frame.lineno}")
        elif os.path.abspath(frame.filename).startswith(_GRAPHOPT_DIR):
            ours = i
    return user[1] if user is not None and user[0] > ours else None


@contextlib.contextmanager
def _running_user_code(doing: str, user_files: set[str]) -> Iterator[None]:
    """Turn an exception that the user's code raises while graphopt is `doing` something into
    one UserCodeError with the user's file:line; graphopt's own errors pass through."""
    try:
        yield
    except SyntaxError as e:  # also IndentationError, and a file that is not UTF-8
        if e.filename is None or not _is_user_file(e.filename, user_files):
            raise
        what = f"SyntaxError: {e.msg}"
        if e.msg.startswith("(unicode error)"):
            what = f"not UTF-8 text (and no coding line says otherwise): " \
                   f"{e.msg.removeprefix('(unicode error)').strip()}"
        raise UserCodeError(f"{e.filename}:{e.lineno}: {what} (while {doing})") from e
    except GraphoptError:
        raise
    except Exception as e:
        where = _user_line(e, user_files)
        if where is None:
            raise
        raise UserCodeError(f"{where}: {type(e).__name__}: {_first_line(e)} "
                            f"(while {doing})") from e


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] + (" ..." if len(lines) > 1 else "") if lines else "(no message)"


# ----------------------------------------------------------------------------- files

def _read_text(path: str) -> tuple[str, str]:
    """(the text of FILE, or of standard input for -, as UTF-8; its name for messages)."""
    if path == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        name, data = "<stdin>", stdin.read() if stdin is not None else sys.stdin.read()
        if isinstance(data, str):
            return data, name
    else:
        name = path
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise CLIError(f"no such file: {path}") from None
        except IsADirectoryError:
            raise CLIError(f"{path} is a directory, not a file") from None
        except OSError as e:
            raise CLIError(f"cannot read {path}: {e.strerror}") from None
    try:
        return data.decode("utf-8-sig"), name
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise CLIError(f"{name}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                       f"{e.start})") from None


def _read_ir(path: str):
    """The verified graph of a .gir file; an error in it names the file and line."""
    from .ir import parse
    from .ir.verifier import verify
    text, name = _read_text(path)
    lines: dict = {}
    try:
        graph = parse(text, lines=lines)
        verify(graph, lines)
        return graph
    except ParseError as e:
        raise CLIError(f"{name}: {e}") from e
    except VerifyError as e:
        if e.node not in lines:
            raise
        raise CLIError(f"{name}:{lines[e.node]}: {e}") from e


@contextlib.contextmanager
def _writing(out: str) -> Iterator[None]:
    """A context in which failing to write `out` is a CLIError saying so."""
    try:
        yield
    except IsADirectoryError:
        raise CLIError(f"cannot write {out}: it is a directory") from None
    except OSError as e:
        raise CLIError(f"cannot write {out}: {e.strerror or e}") from None


def _write(text: str, out: str | None) -> None:
    if out:
        with _writing(out):
            Path(out).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)


# --emit's formats that are drawings or DOT, by the extensions -o may have for each
_DRAWINGS = {"dot": (".dot", ".gv"), "svg": (".svg",), "png": (".png",), "pdf": (".pdf",)}


def _check_output(emit: str, out: str | None) -> None:
    """Refuse an --emit and -o that do not go together, before any work is done."""
    if emit in _DRAWINGS and emit != "dot" and not out:
        raise CLIError(f"--emit {emit} needs -o FILE{_DRAWINGS[emit][0]}")
    if emit in _DRAWINGS and out and Path(out).suffix.lower() not in _DRAWINGS[emit]:
        raise CLIError(f"--emit {emit} writes {' or '.join(_DRAWINGS[emit])} files, but -o names "
                       f"{out!r}; name it FILE{_DRAWINGS[emit][0]}")


def _emit(graph, emit: str, out: str | None, fastmath: bool = False, names=None) -> None:
    """Write the graph as --emit says (`names`: the values' names in what was printed
    before, for the IR text to name them alike)."""
    from .ir.export import dump
    from .ir.printer import format_graph
    if emit in ("llvm", "asm"):  # the kernels, compiled for this machine
        from .backends.llvm import compile as compile_llvm
        _write(compile_llvm(graph, fastmath=fastmath).listing(emit), out)
        return
    if emit in ("ir", "text"):
        _write(format_graph(graph, locs=True, keep=names, totals=True), out)
        return
    if emit == "dot" and not out:
        print(graph.to_dot().source)
        return
    with _writing(out):
        dump(graph, out)


def _patterns(patterns: list[str] | None) -> list[str]:
    for p in patterns or ():
        try:
            re.compile(p)
        except re.error as e:
            raise CLIError(f"--print-after {p!r} is neither a pass name nor a regular "
                           f"expression: {e}") from None
    return patterns or []


# ----------------------------------------------------------------------------- the commands

def _positive(text: str) -> int:
    """argparse's type for a count of 1 or more."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not 1 or more")
    return n


def _demo(args: argparse.Namespace) -> int:
    from .demo import run
    try:  # the folder for the drawings, made before the demo's work
        Path(args.out).mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CLIError(f"--out {args.out}: not a folder (a file has that name)") from None
    except OSError as e:
        raise CLIError(f"--out {args.out}: cannot make a folder there ({e.strerror})") from None
    return run(args.out, args.steps)


def _ir(args: argparse.Namespace) -> int:
    """Read IR text, verify it, print it back (with locations)."""
    graph = _read_ir(args.file)
    print(graph.format(locs=True))
    return 0


@contextlib.contextmanager
def _plugins(files: list[str] | None, passes: list[str] | None) -> Iterator[None]:
    """Run each --load file (as `compile` runs FILE.py), so the passes it registers with
    `@register` can be named in --passes, and register each --load-pass MODULE:FUNCTION; they
    are unregistered, and the modules forgotten, when the command is done (a test may call
    main() many times in one process)."""
    from .passes import PASSES
    before = dict(PASSES)
    imported: list[str] = []
    try:
        for file in files or ():
            _load_module(_user_path(file, "--load "), file, {os.path.abspath(file)})
        for spec in passes or ():
            _load_pass(spec, imported)
        yield
    finally:
        PASSES.clear()
        PASSES.update(before)
        for name in imported:
            sys.modules.pop(name, None)


def _load_pass(spec: str, imported: list[str]) -> None:
    """--load-pass MODULE:FUNCTION (as LLVM's -load-pass-plugin): import the module (a name on
    the Python path or in the working directory, or a FILE.py) and register FUNCTION as a pass
    under its own name, unless the module registered it under one itself."""
    from .passes import PASSES, register
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise CLIError(f"--load-pass {spec!r}: expected MODULE:FUNCTION (mypasses:double, or "
                       f"FILE.py:double)")
    if where.endswith(".py") or os.sep in where:
        module = _load_module(_user_path(where, "--load-pass "), where,
                              {os.path.abspath(where)})
    else:
        module = _import_module(where, imported)
    fn = _function_of(module, where, name, "--load-pass ")
    if not any(p.run is fn for p in PASSES.values()):
        register(name)(fn)


def _import_module(name: str, imported: list[str]):
    """Import a module of the user's by name, the working directory first on the path (as
    `python -m` has it); a module that is not there, or raises, is the user's mistake."""
    sys.path.insert(0, os.getcwd())
    try:
        with _running_user_code(f"importing {name}", set()):
            try:
                spec = importlib.util.find_spec(name)
            except ModuleNotFoundError:  # a package of the dotted name is missing
                spec = None
            if spec is None:
                raise CLIError(f"--load-pass {name}: no module named {name!r} on the Python "
                               f"path or in the working directory")
            if name not in sys.modules:
                imported.append(name)
            with _running_user_code(f"importing {name}", {os.path.abspath(spec.origin or "")}):
                return importlib.import_module(name)
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(os.getcwd())


def _pass_options(items: list[str]) -> dict[str, int]:
    """`--option bucket_bytes=64`: settings of particular passes (integers)."""
    options = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            options[key.strip()] = int(value)
        except ValueError:
            raise CLIError(f"--option {item!r}: expected NAME=INTEGER "
                                f"(bucket_bytes=64, zero=1)") from None
    return options


def _opt(args: argparse.Namespace) -> int:
    from .explain import explain_graph
    from .passes import run
    _check_output(args.emit, args.output)
    print_after = _patterns(args.print_after)
    graph = _read_ir(args.file)
    options = _pass_options(args.option or [])
    if args.explain:
        result = explain_graph(graph, args.passes, fastmath=args.fastmath, options=options)
    else:
        result = run(graph, args.passes, print_after_all=args.print_after_all,
                     print_after_change=args.print_after_change,
                     print_after=print_after, fastmath=args.fastmath, options=options)
        if args.stats:
            print(result, file=sys.stderr)
    _emit(result.graph, args.emit, args.output, args.fastmath, result.names)
    return 0


def _load_module(path: Path, shown: str, user_files: set[str]):
    """Run the file as a Python module (whatever its extension), registered in sys.modules
    under a name of its own while it runs, as an import would (dataclasses need that)."""
    name = f"_graphopt_user_{uuid.uuid4().hex}"
    loader = importlib.machinery.SourceFileLoader(name, shown)
    spec = importlib.util.spec_from_file_location(name, shown, loader=loader)
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent.resolve())
    sys.path.insert(0, folder)  # its own modules import as they would under `python FILE`
    sys.modules[name] = module
    try:
        with _running_user_code(f"running {shown}", user_files):
            loader.exec_module(module)
    finally:
        with contextlib.suppress(ValueError):  # (unless the file took it out itself)
            sys.path.remove(folder)
    return module


def _user_path(file: str, option: str = "") -> Path:
    """The path of a Python file the command line names (`option`: the option naming it)."""
    path = Path(file)
    if not path.exists():
        raise CLIError(f"{option}{file}: no such file" if option else f"no such file: {file}")
    if not path.is_file():
        raise CLIError(f"{option}{file} is not a file")
    return path


def _function_of(module: Any, file: str, name: str, option: str = "") -> Any:
    """The function `name` of a user's module (`file`: how the command line names it)."""
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(n for n, v in vars(module).items()
                         if inspect.isfunction(v) and v.__module__ == module.__name__)
        raise CLIError(f"{option}{file} has no function {name}"
                       + (f" (it defines {', '.join(defined)})" if defined else ""))
    if not callable(fn):
        raise CLIError(f"{option}{file}: {name} is not a function (it is of type "
                       f"{type(fn).__name__})")
    return fn


def load_function(spec: str) -> tuple[Any, tuple, dict]:
    """FILE.py:FUNC -> (the function, example args, example kwargs). Every mistake, the user
    code's own exceptions included, is a GraphoptError saying what is wrong and where."""
    file, _, name = spec.rpartition(":")
    if not file or not name:
        raise CLIError(f"expected FILE.py:FUNC, got {spec!r}")
    path = _user_path(file)
    user_files = {os.path.abspath(file)}
    module = _load_module(path, file, user_files)
    fn = _function_of(module, file, name)
    make_name = f"{name}_inputs" if hasattr(module, f"{name}_inputs") else "make_inputs"
    make = getattr(module, make_name, None)
    if make is None:
        raise CLIError(f"{file} must define make_inputs() or {name}_inputs() returning the "
                       f"example arguments of {name} (a tuple, or a dict of keyword arguments)")
    if not callable(make):
        raise CLIError(f"{file}: {make_name} is not a function (it is of type "
                       f"{type(make).__name__})")
    with _running_user_code(f"calling {make_name}() of {file}", user_files):
        inputs = make()
    if isinstance(inputs, dict):
        return fn, (), inputs
    return fn, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,), {}


def _compile(args: argparse.Namespace) -> int:
    from .explain import explain
    from .frontend.tracer import trace_function
    from .passes import run
    _check_output(args.emit, args.output)
    fn, fargs, fkwargs = load_function(args.target)
    fn = getattr(fn, "fn", fn)  # a jitted function: trace what it wraps
    user_files = {os.path.abspath(args.target.rpartition(":")[0])}
    with _running_user_code(f"tracing {args.target}", user_files):
        if args.explain:
            result = explain(fn, *fargs, passes=args.passes, fastmath=args.fastmath, **fkwargs)
        else:
            graph = trace_function(fn, fargs, fkwargs).graph.verify()
            result = run(graph, args.passes, print_after_all=args.print_after_all,
                         fastmath=args.fastmath)
    _emit(result.graph, args.emit, args.output, args.fastmath, result.names)
    return 0


def _explore(args: argparse.Namespace) -> int:
    """One HTML page of the step: its passes, graphs, kernels and memory (docs/explorer.md)."""
    from .explain import trace_for_passes
    from .explorer import explore_graph
    if Path(args.output).suffix.lower() not in (".html", ".htm"):
        raise CLIError(f"-o {args.output!r}: the explorer writes an HTML page; name it "
                       f"FILE.html")
    passes, options = args.passes, None
    if args.target == "-" or args.target.endswith(".gir"):
        graph, title = _read_ir(args.target), args.target
    else:
        fn, fargs, fkwargs = load_function(args.target)
        user_files = {os.path.abspath(args.target.rpartition(":")[0])}
        with _running_user_code(f"tracing {args.target}", user_files):
            graph, passes, options = trace_for_passes(fn, fargs, fkwargs, passes)
        title = args.target
    with _writing(args.output):
        explore_graph(graph, args.output, passes, fastmath=args.fastmath, options=options,
                      title=title)
    print(f"wrote {args.output}")
    return 0


# ----------------------------------------------------------------------------- graphopt cache

def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _cache_path() -> None:
    print(diskcache.location())


def _cache_info() -> None:
    i = diskcache.info()
    print(f"path       {i['path']}\nenabled    {'yes' if i['enabled'] else 'no'}"
          f"\ndirectory  {i['directory']}\nentries    {i['entries']}"
          f"\nbytes      {i['bytes']} ({_size(i['bytes'])})"
          f"\nmax bytes  {i['max_bytes']} ({_size(i['max_bytes'])})")


def _brief(desc: dict | None, listed: tuple[str, ...]) -> str:
    """What `list` shows of an entry: its parts named in `listed` (a kernel's text, the flags
    and the CPU; runtime code's text), or else its first two. A long part shows as the log
    shows it, its short hash first: most kernels' first lines are the same."""
    if desc is None:
        return "(no readable description)"
    shown = {n: desc[n] for n in listed if n in desc} or dict(list(desc.items())[:2])
    return "  ".join(f"{n}: {diskcache.show(v)}" for n, v in shown.items())


def _cache_list() -> None:
    from .backends.llvm.engine import LISTED_PARTS  # the backend names the parts
    for e in reversed(diskcache.entries()):  # most recently used first
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.last_used))
        print(f"{e.key[:16]}  {_size(e.size):>10}  {when}  {_brief(e.description, LISTED_PARTS)}")


def _cache_clear() -> None:
    print(f"removed {diskcache.clear()} files from {diskcache.location()}")


CACHE_ACTIONS = {"info": _cache_info, "list": _cache_list, "clear": _cache_clear,
                 "path": _cache_path}


def _cache(args: argparse.Namespace) -> int:
    CACHE_ACTIONS[args.action]()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphopt", description=__doc__, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="compile an Adam step, print its IR, run it, draw it")
    p.add_argument("--out", default="graphopt_demo_out", help="folder for the dumps")
    p.add_argument("--steps", type=_positive, default=5, help="steps to run (1 or more)")
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
        p.add_argument("--load", action="append", metavar="FILE.py",
                       help="run this Python file first, so the passes it registers can be "
                            "named in --passes (repeatable)")
        p.add_argument("--load-pass", action="append", metavar="MODULE:FUNCTION",
                       help="import MODULE (or FILE.py) and register its FUNCTION as a pass of "
                            "that name, to name in --passes (repeatable)")

    p = sub.add_parser("opt", help="run passes on an IR text file")
    p.add_argument("--option", action="append", metavar="NAME=N",
                   help="a setting of a pass: bucket_bytes=N (bucket), zero=1|2 (zero); "
                        "repeatable")
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

    p = sub.add_parser("explore", help="one HTML page of a step's passes, kernels and memory")
    p.add_argument("target", metavar="FILE.py:FUNC | FILE.gir",
                   help="a step function from a file (as for compile), or IR text (- for "
                        "standard input)")
    p.add_argument("--passes", default=None,
                   help="comma-separated pass names (default: the default pipeline)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.html",
                   help="the page to write")
    p.add_argument("--fastmath", action="store_true")
    p.add_argument("--load", action="append", metavar="FILE.py",
                   help="run this Python file first, so the passes it registers can be named "
                        "in --passes (repeatable)")
    p.set_defaults(run=_explore)

    p = sub.add_parser("cache", help="the on-disk compilation cache: info, list, clear, path")
    p.add_argument("action", choices=CACHE_ACTIONS)
    p.set_defaults(run=_cache)
    return parser


# ----------------------------------------------------------------------------- errors

def _debug() -> bool:
    try:
        return envvars.debug()
    except GraphoptError:  # GRAPHOPT_DEBUG itself is wrong: said as the error itself
        return False


def _report(e: Exception) -> int:
    """One line on stderr for an exception that ended the command (the traceback first with
    GRAPHOPT_DEBUG=1); returns the exit status."""
    if _debug():
        traceback.print_exception(e)
    if isinstance(e, GraphoptError):
        message, status = str(e), USAGE_ERROR
        if e.loc is not None and os.path.abspath(e.loc.file).startswith(_GRAPHOPT_DIR):
            message = e.message  # a line of graphopt's own is not where the user went wrong
    elif isinstance(e, OSError):  # the system refused something: the message says what
        where = f"{e.filename}: " if e.filename else ""
        message, status = f"{where}{e.strerror or e}", USAGE_ERROR
    else:
        message, status = (f"internal error, a bug in graphopt: {type(e).__name__}: "
                           f"{_first_line(e)} (run again with GRAPHOPT_DEBUG=1 for the "
                           f"traceback to report)"), BUG
    print(f"graphopt: error: {message}", file=sys.stderr)
    return status


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"graphopt: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # a usage error: argparse's message, status 2
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning  # one line each, not the warning's source
            envvars.check()  # every switch, before anything is done
            with _plugins(getattr(args, "load", None),  # (opt, compile and explore)
                          getattr(args, "load_pass", None)):
                status = args.run(args)
            sys.stdout.flush()  # a closed pipe is found here, not as Python exits
            return status
    except KeyboardInterrupt:
        print("graphopt: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # `graphopt ... | head`: the reader has all it wanted
        with contextlib.suppress(Exception):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:
        return _report(e)


if __name__ == "__main__":
    sys.exit(main())
