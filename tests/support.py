"""Helpers several test files share."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import graphopt as go
from graphopt import ops


def line_of(path: str, marker: str) -> int:
    """The line of the file at `path` ending in `# <marker>` (exactly one)."""
    with open(path) as f:
        hits = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def run_program(prog: Sequence[tuple], params: list, args: Sequence[Any],
                unary: Sequence[Callable], binary: Sequence[Callable]) -> list:
    """A random step: a pool of values (the arguments, then the parameters) grows by the ops
    the program picks; `assign` writes a parameter of the value's shape. Returns the
    reductions asked for and the last value made."""
    pool = list(args) + list(params)
    outputs = []
    for kind, a, b, c in prog:
        x, y = pool[a % len(pool)], pool[b % len(pool)]
        if kind == "unary":
            pool.append(unary[b % len(unary)](x))
        elif kind == "binary":
            pool.append(binary[b % len(binary)](x, y))
        elif kind == "where":
            pool.append(ops.where(x > y, x, y * c))
        elif kind == "const":
            pool.append(x * c + c)
        elif kind == "pow":
            pool.append(x ** c)
        elif kind in ("sum", "max", "mean"):
            outputs.append(getattr(x, kind)())
        elif kind in ("partial_sum", "partial_max", "partial_mean"):  # over the leading axis
            outputs.append(getattr(x, kind[len("partial_"):])(axis=0) if x.ndim else x)
        elif kind == "assign":
            same_shape = [p for p in params if p.shape == tuple(x.shape)]
            go.assign(same_shape[b % len(same_shape)], x)
    return outputs + [pool[-1]]


# -- CPU levels: the LLVM differential tests run for each (conftest's `cpu_level` fixture) ------
def _cpu_levels() -> tuple[str, ...]:
    """The baseline, AVX2 and this host on x86-64: so an AVX-512 machine also tests the code an
    AVX2 laptop runs, and any machine tests the baseline. Elsewhere: the baseline and host."""
    import platform
    if platform.machine().lower() in ("x86_64", "amd64"):
        return ("x86-64", "x86-64-v3", "host")
    return ("generic", "host")


CPU_LEVELS = _cpu_levels()
