"""Checkpoints: every Parameter of a run (weights, optimizer state, hyper-parameters, step
counters, loss scale) saved to one `.npz`, by name, and restored bit for bit.

    graphopt.save("run.npz", params, opt, scaler)      # after step 500
    graphopt.load("run.npz", params, opt, scaler)      # a fresh process continues exactly

Everything a step reads lives in Parameters, so restoring their bytes restores the run: a
resumed run takes the same steps as an uninterrupted one, bit for bit. Objects are anything
with `.parameters()` (optimizers, `Accumulate`, loss scalers); `params` may be a list of
Parameters or a dict by name. bf16 arrays are stored as their raw 16-bit patterns (npz has
no bf16) and each array's dtype is recorded, so nothing is converted on the way.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping

import numpy as np

from .errors import OptimizerError
from .frontend import Parameter, assign
from .frontend.tracer import current_trace
from .ir.types import to_dtype

FORMAT = 1
_META = "__graphopt__"


def collect(params: Any, *objects: Any) -> list[Parameter]:
    """The Parameters of `params` and of each object's `.parameters()`, each once, with
    distinct names."""
    items = list(params.values()) if isinstance(params, Mapping) else \
        [params] if isinstance(params, Parameter) else list(params)
    for obj in objects:
        if not hasattr(obj, "parameters"):
            raise OptimizerError(f"cannot checkpoint a {type(obj).__name__}: it has no "
                                 f".parameters()")
        items += obj.parameters()
    out: dict[str, Parameter] = {}
    for p in items:
        if not isinstance(p, Parameter):
            raise OptimizerError(f"checkpoint: {p!r} is not a graphopt.Parameter")
        if out.get(p.name, p) is not p:
            raise OptimizerError(f"checkpoint: two different Parameters are named '{p.name}'")
        out[p.name] = p
    return list(out.values())


def save(path: str | os.PathLike, params: Any, *objects: Any) -> None:
    """Write every Parameter of `params` and `objects` to `path` (.npz), atomically."""
    ps = collect(params, *objects)
    arrays = {p.name: _raw(p.numpy()) for p in ps}
    meta = {"format": FORMAT, "dtypes": {p.name: p.dtype.name for p in ps}}
    arrays[_META] = np.array(json.dumps(meta))
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:  # a file object: numpy adds no ".npz" to the name
        np.savez(f, **arrays)
    os.replace(tmp, path)  # a crash mid-write leaves the old checkpoint whole


def load(path: str | os.PathLike, params: Any, *objects: Any) -> None:
    """Restore every Parameter of `params` and `objects` from `path`. Checks that the file
    holds exactly these names, with their shapes and dtypes, before changing anything."""
    with np.load(os.fspath(path), allow_pickle=False) as f:
        if _META not in f.files:
            raise OptimizerError(f"{path}: not a graphopt checkpoint")
        meta = json.loads(str(f[_META]))
        if meta.get("format") != FORMAT:
            raise OptimizerError(f"{path}: checkpoint format {meta.get('format')}, this "
                                 f"graphopt reads format {FORMAT}")
        arrays = {name: _typed(f[name], dtype) for name, dtype in meta["dtypes"].items()}
    restore(collect(params, *objects), arrays, str(path))


def restore(params: Iterable[Parameter], arrays: Mapping[str, np.ndarray], source: str) -> None:
    """Copy arrays[p.name] into each Parameter, after checking all of them: same names (no
    missing, no extra), shapes and dtypes. Nothing changes if any check fails."""
    if current_trace() is not None:
        raise OptimizerError(f"restoring {source} inside a traced step is not allowed")
    params = list(params)
    names = {p.name for p in params}
    missing = [p.name for p in params if p.name not in arrays]
    extra = sorted(set(arrays) - names)
    if missing or extra:
        parts = ([f"missing {missing}"] if missing else []) + \
            ([f"unexpected {extra}"] if extra else [])
        raise OptimizerError(f"{source}: {'; '.join(parts)}")
    for p in params:
        a = np.asarray(arrays[p.name])
        if a.shape != p.shape or a.dtype != p.dtype.np_dtype:
            raise OptimizerError(f"{source}: '{p.name}' is {a.dtype}{list(a.shape)}, the "
                                 f"parameter is {p.type}")
    for p in params:
        assign(p, np.asarray(arrays[p.name]))


def _raw(a: np.ndarray) -> np.ndarray:
    """An array npz can store: bf16 as its uint16 bit patterns."""
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def _typed(a: np.ndarray, dtype: str) -> np.ndarray:
    d = to_dtype(dtype).np_dtype
    return a.view(d) if a.dtype != d and a.dtype.itemsize == d.itemsize else a


__all__ = ["save", "load", "restore", "collect"]
