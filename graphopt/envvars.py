"""Every GRAPHOPT_* environment switch, in one table, with a function that reads each.

| Variable                   | Default     | Meaning                                            |
|----------------------------|-------------|----------------------------------------------------|
| `GRAPHOPT_CACHE`           | `1`         | `0` (or `false`, `no`, `off`) turns the on-disk    |
|                            |             | compilation cache off                              |
| `GRAPHOPT_CACHE_DIR`       | (unset)     | the cache directory; when unset:                   |
|                            |             | `$XDG_CACHE_HOME/graphopt`, else                   |
|                            |             | `~/.cache/graphopt`                                |
| `GRAPHOPT_CACHE_MAX_BYTES` | `512M`      | size bound of the cache, in bytes; the suffixes    |
|                            |             | `K`, `M`, `G`, `T` mean powers of 1024             |
| `GRAPHOPT_LOG`             | (unset)     | comma-separated log topics printed on stderr:      |
|                            |             | `cache` (each cache hit and miss, with its parts)  |
| `GRAPHOPT_BACKEND`         | `llvm`      | the backend `jit` uses when none is given:         |
|                            |             | `llvm` or `interpreter` (numpy, the reference)     |
| `GRAPHOPT_THREADS`         | (cores)     | threads a large kernel may split over (default     |
|                            |             | and most: the machine's cores)                     |
| `GRAPHOPT_VERIFY`          | `last`      | `each`: jit verifies the traced graph and the      |
|                            |             | graph after every pass, not only the final one     |
| `GRAPHOPT_CPU`             | `host`      | the CPU kernels are compiled for: an LLVM CPU name |
|                            |             | (`x86-64`, `x86-64-v3`, `znver3`, `neoverse-n1`,   |
|                            |             | ...) or `host`; code this host cannot run is       |
|                            |             | refused (TargetError) before it is loaded          |
| `GRAPHOPT_CPU_FEATURES`    | (unset)     | LLVM features added to the CPU's, comma-separated  |
|                            |             | (`+avx2,-fma`); with `host`: to the host's         |

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
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    doc: str


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    Variable("GRAPHOPT_CACHE", "1", "0 turns the on-disk compilation cache off"),
    Variable("GRAPHOPT_CACHE_DIR", "", "the cache directory (default: $XDG_CACHE_HOME/graphopt, "
                                       "else ~/.cache/graphopt)"),
    Variable("GRAPHOPT_CACHE_MAX_BYTES", "512M", "size bound of the cache, in bytes "
                                                         "(suffixes K, M, G)"),
    Variable("GRAPHOPT_LOG", "", "comma-separated log topics printed on stderr: cache"),
    Variable("GRAPHOPT_BACKEND", "llvm", "the backend jit uses when none is given"),
    Variable("GRAPHOPT_THREADS", "", "threads a large kernel may split over (default and "
                                     "most: cores)"),
    Variable("GRAPHOPT_VERIFY", "last", "each: jit verifies the traced graph and the graph "
                                        "after every pass, not only the final one"),
    Variable("GRAPHOPT_CPU", "host", "the CPU kernels are compiled for: an LLVM CPU name, or "
                                     "host"),
    Variable("GRAPHOPT_CPU_FEATURES", "", "LLVM CPU features added to the CPU's (+avx2,-fma)"),
)}

# Values set in code (set_var, override); they win over os.environ.
_overrides: dict[str, str] = {}


def get(name: str) -> str:
    """The value of a switch: set in code, else from the environment, else its default."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a graphopt switch; known: {', '.join(VARIABLES)}")
    if name in _overrides:
        return _overrides[name]
    return os.environ.get(name, VARIABLES[name].default)


def set_var(name: str, value: str | None) -> None:
    """Set a switch in code (None removes the setting, so the environment counts again)."""
    get(name)  # checks the name
    if value is None:
        _overrides.pop(name, None)
    else:
        _overrides[name] = str(value)


@contextmanager
def override(**values: str | None) -> Iterator[None]:
    """Set switches for the duration of a `with` block."""
    saved = {name: _overrides.get(name) for name in values}
    try:
        for name, value in values.items():
            set_var(name, value)
        yield
    finally:
        for name, value in saved.items():
            set_var(name, value)


def _flag(value: str) -> bool:
    return value.strip().lower() not in ("0", "false", "no", "off")


def cache_enabled() -> bool:
    """GRAPHOPT_CACHE: is the on-disk compilation cache on?"""
    return _flag(get("GRAPHOPT_CACHE"))


def cache_dir() -> Path:
    """GRAPHOPT_CACHE_DIR, else $XDG_CACHE_HOME/graphopt, else ~/.cache/graphopt.

    An empty or relative XDG_CACHE_HOME is ignored, as the XDG spec says. Raises RuntimeError
    when no home directory can be found."""
    explicit = get("GRAPHOPT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "graphopt"
    return Path.home() / ".cache" / "graphopt"


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def cache_max_bytes() -> int:
    """GRAPHOPT_CACHE_MAX_BYTES: a byte count, optionally with K, M, G or T (powers of 1024).
    Raises ValueError naming the variable when the value is not one."""
    text = get("GRAPHOPT_CACHE_MAX_BYTES").strip().upper().removesuffix("IB").removesuffix("B")
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "")
    try:
        value = int(float(number) * _UNITS[unit])
    except (ValueError, OverflowError):  # not a number, or inf
        value = -1
    if value < 0:
        raise ValueError(f"GRAPHOPT_CACHE_MAX_BYTES={get('GRAPHOPT_CACHE_MAX_BYTES')!r} is not "
                         f"a size in bytes (examples: 536870912, 512M, 2G)")
    return value


def backend() -> str:
    """GRAPHOPT_BACKEND: the backend `jit` uses when none is given."""
    return get("GRAPHOPT_BACKEND").strip() or "llvm"


@functools.cache
def _cores() -> int:
    return os.cpu_count() or 1  # (reads /sys on every call: asked once per process)


def threads() -> int:
    """GRAPHOPT_THREADS: how many threads a large kernel may use (default and most: every
    core; a step's threads wait for each other, so more threads than cores could never
    finish)."""
    cores = _cores()
    text = get("GRAPHOPT_THREADS").strip()
    try:
        return min(max(1, int(text)), cores) if text else cores
    except ValueError:
        raise ValueError(f"GRAPHOPT_THREADS={text!r} is not a number of threads") from None


def verify_each() -> bool:
    """GRAPHOPT_VERIFY=each: verify the input and after every pass, also in jit (slower
    compiles)."""
    return get("GRAPHOPT_VERIFY").strip().lower() == "each"


def cpu() -> str:
    """GRAPHOPT_CPU: the LLVM CPU name kernels are compiled for (`host`: this machine's)."""
    return get("GRAPHOPT_CPU").strip() or "host"


def cpu_features() -> str:
    """GRAPHOPT_CPU_FEATURES: LLVM feature flags added to the CPU's, as LLVM spells them."""
    return ",".join(f.strip() for f in get("GRAPHOPT_CPU_FEATURES").split(",") if f.strip())


def log_topics() -> frozenset[str]:
    """GRAPHOPT_LOG: the set of enabled log topics."""
    return frozenset(t.strip().lower() for t in get("GRAPHOPT_LOG").split(",") if t.strip())


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
