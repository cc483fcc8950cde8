"""Every GRAPHOPT_* environment switch, in one table, with a function that reads each.

| Variable                      | Default     | Meaning                                            |
|-------------------------------|-------------|----------------------------------------------------|
| `GRAPHOPT_CACHE`              | `1`         | `0` (or `false`, `no`, `off`) turns the on-disk    |
|                               |             | compilation cache off                              |
| `GRAPHOPT_CACHE_DIR`          | (unset)     | the cache directory; when unset:                   |
|                               |             | `$XDG_CACHE_HOME/graphopt`, else                   |
|                               |             | `~/.cache/graphopt`                                |
| `GRAPHOPT_CACHE_MAX_BYTES`    | `512M`      | size bound of the cache, in bytes; the suffixes    |
|                               |             | `K`, `M`, `G`, `T` mean powers of 1024             |
| `GRAPHOPT_LOG`                | (unset)     | comma-separated log topics printed on stderr:      |
|                               |             | `cache` (each cache hit and miss, with its parts)  |
| `GRAPHOPT_BACKEND`            | `llvm`      | the backend `jit` uses when none is given:         |
|                               |             | `llvm` or `interpreter` (numpy, the reference)     |
| `GRAPHOPT_THREADS`            | (cores)     | threads a large kernel may split over (default     |
|                               |             | and most: the machine's cores); 1 also keeps       |
|                               |             | compiling in this process (no compile helper)      |
| `GRAPHOPT_VERIFY`             | `last`      | `each`: jit verifies the traced graph and the      |
|                               |             | graph after every pass, not only the final one     |
| `GRAPHOPT_CPU`                | `host`      | the CPU kernels are compiled for: an LLVM CPU name |
|                               |             | (`x86-64`, `x86-64-v3`, `znver3`, `neoverse-n1`,   |
|                               |             | ...) or `host`; code this host cannot run is       |
|                               |             | refused (TargetError) before it is loaded          |
| `GRAPHOPT_CPU_FEATURES`       | (unset)     | LLVM features added to the CPU's, comma-separated  |
|                               |             | (`+avx2,-fma`); with `host`: to the host's         |
| `GRAPHOPT_DEBUG`              | `0`         | `1`: the `graphopt` command shows the traceback of |
|                               |             | an error, not only its one line (for bug reports)  |
| `GRAPHOPT_COLLECTIVE_TIMEOUT` | `300`       | seconds a collective waits for the other ranks     |
|                               |             | before CollectiveTimeout (graphopt.distributed)    |

`GRAPHOPT_COLLECTIVE_TIMEOUT` takes a number of seconds greater than 0 (`300`, `0.5`).
A flag (`GRAPHOPT_CACHE`, `GRAPHOPT_DEBUG`) takes `1`, `true`, `yes`, `on` or `0`, `false`,
`no`, `off`. Flags and choices are read without regard to case, every value without regard to
surrounding spaces, and an empty value is the same as an unset one. A value a switch does not
take raises SwitchError (a GraphoptError and a ValueError) where the switch is read, or at
once from `set_var` and `override`, naming the switch, the value, where it was set and what
the switch takes; nothing is guessed. Each switch is parsed by the function in its row of
VARIABLES below, the one place that knows what it takes. `GRAPHOPT_CPU` and
`GRAPHOPT_CPU_FEATURES` are passed on as text (features stripped, empty items dropped): which
names exist is LLVM's to say, so graphopt/backends/llvm/target.py checks them when a kernel
is compiled (TargetError).

Each switch is read when its function is called, never at import time, so a test can
monkeypatch the environment and a program can change a switch while it runs. Switches are
also settable in code, and a value set in code wins over the environment:

    from graphopt import envvars
    envvars.set_var("GRAPHOPT_LOG", "cache")          # from now on
    with envvars.override(GRAPHOPT_CACHE="0"):        # for a block
        ...

Log topics print through the standard `logging` module, on the logger `graphopt.<topic>`; if
the program has configured no logging handler, a topic's messages go to stderr.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from .errors import SwitchError

TOPICS = {"cache": "each cache hit and miss, with its parts"}  # GRAPHOPT_LOG's topics
BACKENDS = ("llvm", "interpreter")   # GRAPHOPT_BACKEND's choices (graphopt.backends.BACKENDS)


class _Invalid(Exception):
    """Raised by a parser for a value its switch does not take (with what is wrong, if more
    can be said than what the switch takes)."""

    def __init__(self, problem: str = ""):
        self.problem = problem
        super().__init__(problem)


# ----------------------------------------------------------------------------- parsers
# Each takes the value stripped of surrounding spaces (the switch's default when that is
# empty) and returns what the switch's function returns, or raises _Invalid.

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise _Invalid()


def _path(text: str) -> Path | None:
    if "\0" in text:
        raise _Invalid("a path cannot hold a NUL character")
    return Path(text).expanduser() if text else None


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMGT])(?:I?B)?|B)?", re.ASCII | re.IGNORECASE)


def _size(text: str) -> int:
    m = _SIZE.fullmatch(text)
    if m is None:
        raise _Invalid()
    return int(Fraction(m[1]) * _UNITS[(m[2] or "").upper()])


def _topics(text: str) -> frozenset[str]:
    topics = frozenset(t.strip().lower() for t in text.split(",") if t.strip())
    unknown = sorted(topics - TOPICS.keys())
    if unknown:
        raise _Invalid(f"unknown topic{'s' * (len(unknown) > 1)} {', '.join(unknown)}")
    return topics


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in choices:
            raise _Invalid()
        return text.lower()
    return parse


@functools.cache
def _cores() -> int:
    return os.cpu_count() or 1  # (reads /sys on every call: asked once per process)


def _threads(text: str) -> int:
    if not text:
        return _cores()
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise _Invalid()
    return min(int(text), _cores())  # a step's threads wait for each other: no more than cores


_SECONDS = re.compile(r"\d+(?:\.\d*)?|\.\d+", re.ASCII)


def _seconds(text: str) -> float:
    if _SECONDS.fullmatch(text) is None or float(text) <= 0:
        raise _Invalid()
    return float(text)


def _text(text: str) -> str:
    return text


def _features(text: str) -> str:
    return ",".join(f.strip() for f in text.split(",") if f.strip())


# ----------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    doc: str
    parse: Callable[[str], Any]   # the stripped value (the default if empty) -> its meaning
    allowed: str                  # what the switch takes, as an error says it


_FLAG = "1, true, yes, on (or 0, false, no, off)"

VARIABLES: dict[str, Variable] = {v.name: v for v in (
    Variable("GRAPHOPT_CACHE", "1", "0 turns the on-disk compilation cache off", _flag, _FLAG),
    Variable("GRAPHOPT_CACHE_DIR", "", "the cache directory (default: $XDG_CACHE_HOME/graphopt, "
                                       "else ~/.cache/graphopt)", _path, "a directory path"),
    Variable("GRAPHOPT_CACHE_MAX_BYTES", "512M", "size bound of the cache, in bytes "
                                                 "(suffixes K, M, G, T)", _size,
             "a size in bytes, a whole or decimal number with an optional K, M, G or T "
             "(powers of 1024): 536870912, 512M, 1.5G"),
    Variable("GRAPHOPT_LOG", "", "comma-separated log topics printed on stderr: cache",
             _topics, "a comma-separated list of log topics: " + ", ".join(TOPICS)),
    Variable("GRAPHOPT_BACKEND", "llvm", "the backend jit uses when none is given",
             _choice(*BACKENDS), " or ".join(BACKENDS)),
    Variable("GRAPHOPT_THREADS", "", "threads a large kernel may split over (default and "
                                     "most: cores); 1 also keeps compiling in this process",
             _threads,
             "a whole number of threads, 1 or more (more than this machine's cores counts as "
             "its cores; unset: every core)"),
    Variable("GRAPHOPT_VERIFY", "last", "each: jit verifies the traced graph and the graph "
                                        "after every pass, not only the final one",
             _choice("last", "each"), "last or each"),
    Variable("GRAPHOPT_CPU", "host", "the CPU kernels are compiled for: an LLVM CPU name, or "
                                     "host (checked by backends/llvm/target.py)", _text,
             "an LLVM CPU name or host"),
    Variable("GRAPHOPT_CPU_FEATURES", "", "LLVM CPU features added to the CPU's (+avx2,-fma; "
                                          "checked by backends/llvm/target.py)", _features,
             "comma-separated LLVM features, each +name or -name"),
    Variable("GRAPHOPT_DEBUG", "0", "1: the graphopt command shows an error's traceback",
             _flag, _FLAG),
    # Minutes, not seconds: another rank's first step may still be compiling its kernels.
    Variable("GRAPHOPT_COLLECTIVE_TIMEOUT", "300", "seconds a collective waits for the other "
                                                   "ranks before CollectiveTimeout", _seconds,
             "a number of seconds greater than 0, whole or decimal: 300, 0.5"),
)}

# Values set in code (set_var, override); they win over os.environ.
_overrides: dict[str, str] = {}


def _variable(name: str) -> Variable:
    try:
        return VARIABLES[name]
    except KeyError:
        raise KeyError(f"{name} is not a graphopt switch; known: {', '.join(VARIABLES)}") \
            from None


def _environment(name: str) -> str | None:
    """os.environ.get(name), quicker: a step's call reads three switches (the target, the
    threads), and os.environ.get of an unset name costs ~1 us (its __getitem__ raises a
    KeyError that Mapping.get catches), a tenth of a small step's Python. os.environ keeps
    the environment, encoded, in its dict `_data` (CPython, POSIX and Windows alike), which
    every change through os.environ updates: a lookup there costs ~30 ns. Any other mapping
    in its place (a test's) is read the ordinary way."""
    environ = os.environ
    data = getattr(environ, "_data", None)
    if type(data) is not dict:
        return environ.get(name)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = environ.encodekey(name)
    raw = data.get(key)
    return None if raw is None else environ.decodevalue(raw)


_KEYS: dict[str, Any] = {}  # name -> its key in os.environ._data (encodekey: bytes on POSIX)


def get(name: str) -> str:
    """The text of a switch: set in code, else from the environment, else its default."""
    var = _variable(name)
    if name in _overrides:
        return _overrides[name]
    text = _environment(name)
    return var.default if text is None else text


_parsed: dict[tuple[str, str], Any] = {}  # (name, text) -> value: a step reads some per kernel


def _parse(var: Variable, text: str, where: str) -> Any:
    try:
        return _parsed[var.name, text]
    except KeyError:
        pass
    try:
        value = var.parse(text.strip() or var.default)
    except _Invalid as e:
        raise SwitchError(var.name, text, var.allowed, e.problem, where) from None
    _parsed[var.name, text] = value
    return value


def value(name: str) -> Any:
    """What a switch means (its row's parser applied to its text); SwitchError if the text is
    not a value the switch takes."""
    var = _variable(name)
    if name in _overrides:
        return _parse(var, _overrides[name], "set in code")
    text = _environment(name)
    return _parse(var, var.default, "") if text is None else \
        _parse(var, text, "from the environment")


def set_var(name: str, value: str | None) -> None:
    """Set a switch in code (None removes the setting, so the environment counts again);
    SwitchError, and nothing set, if the switch does not take the value."""
    var = _variable(name)
    if value is None:
        _overrides.pop(name, None)
    else:
        _parse(var, str(value), "set in code")
        _overrides[name] = str(value)


@contextmanager
def override(**values: str | None) -> Iterator[None]:
    """Set switches for the duration of a `with` block (all of them, or none: SwitchError)."""
    saved = {name: _overrides.get(name) for name in values}
    try:
        for name, value in values.items():
            set_var(name, value)
        yield
    finally:
        for name, value in saved.items():
            set_var(name, value)


def check() -> None:
    """Parse every switch now: SwitchError for the first one set to a value it does not take
    (the `graphopt` command calls it before it does anything)."""
    for name in VARIABLES:
        value(name)


# ----------------------------------------------------------------------------- each switch

def cache_enabled() -> bool:
    """GRAPHOPT_CACHE: is the on-disk compilation cache on?"""
    return value("GRAPHOPT_CACHE")


def cache_dir() -> Path:
    """GRAPHOPT_CACHE_DIR, else $XDG_CACHE_HOME/graphopt, else ~/.cache/graphopt.

    An empty or relative XDG_CACHE_HOME is ignored, as the XDG spec says. Raises RuntimeError
    when no home directory can be found."""
    explicit = value("GRAPHOPT_CACHE_DIR")
    if explicit is not None:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "graphopt"
    return Path.home() / ".cache" / "graphopt"


def cache_max_bytes() -> int:
    """GRAPHOPT_CACHE_MAX_BYTES: a byte count, optionally with K, M, G or T (powers of 1024;
    `512M`, `512MiB`, `1.5G`, `1024B`)."""
    return value("GRAPHOPT_CACHE_MAX_BYTES")


def backend() -> str:
    """GRAPHOPT_BACKEND: the backend `jit` uses when none is given."""
    return value("GRAPHOPT_BACKEND")


def threads() -> int:
    """GRAPHOPT_THREADS: how many threads a large kernel may use (default and most: every
    core; a step's threads wait for each other, so more threads than cores could never
    finish)."""
    return value("GRAPHOPT_THREADS")


def verify_each() -> bool:
    """GRAPHOPT_VERIFY=each: verify the input and after every pass, also in jit (slower
    compiles)."""
    return value("GRAPHOPT_VERIFY") == "each"


def cpu() -> str:
    """GRAPHOPT_CPU: the LLVM CPU name kernels are compiled for (`host`: this machine's)."""
    return value("GRAPHOPT_CPU")


def cpu_features() -> str:
    """GRAPHOPT_CPU_FEATURES: LLVM feature flags added to the CPU's, as LLVM spells them."""
    return value("GRAPHOPT_CPU_FEATURES")


def debug() -> bool:
    """GRAPHOPT_DEBUG: should the `graphopt` command show the traceback of an error?"""
    return value("GRAPHOPT_DEBUG")


def collective_timeout() -> float:
    """GRAPHOPT_COLLECTIVE_TIMEOUT: how many seconds a collective of graphopt.distributed waits
    for the other ranks before it raises CollectiveTimeout."""
    return value("GRAPHOPT_COLLECTIVE_TIMEOUT")


def log_topics() -> frozenset[str]:
    """GRAPHOPT_LOG: the set of enabled log topics."""
    return value("GRAPHOPT_LOG")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record is emitted (pytest and notebooks swap
    it), not to the stderr that existed when the handler was made."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def topic_logger(topic: str) -> logging.Logger | None:
    """The logger `graphopt.<topic>`, ready to print INFO records, if the topic is enabled in
    GRAPHOPT_LOG; else None (so callers build no message at all)."""
    if topic not in log_topics():
        return None
    logger = logging.getLogger(f"graphopt.{topic}")
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    if not logger.hasHandlers():  # no handler configured by the program: print on stderr
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)
    return logger
