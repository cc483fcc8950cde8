"""Nested arguments (lists, tuples, dicts of leaves) flattened to a list of leaves and back.

The structure (`TreeDef`) is part of a compiled step's signature; leaf paths such as
`grads.0` or `batch.x` name the step's `arg` inputs in the IR. A row gradient (`Rows`) is a
node of two leaves, its indices and its values (`grads.0.indices`, `grads.0.values`): a
step takes and returns tensors only, and the rows are made again on the other side.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import SignatureError
from ..ir.types import RowsArray, RowsType, TensorType, to_dtype
from .rows import Rows
from .tensor import ops


@dataclass(frozen=True)
class TreeDef:
    kind: str  # "leaf", "none", "list", "tuple", "dict", "rows" or "unique rows"
    children: tuple[TreeDef, ...] = ()
    keys: tuple[Any, ...] = ()  # dict keys, in order; a row gradient's dense shape

    def __hash__(self) -> int:  # computed once: a step's signature hashes it on every call
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.kind, self.children, self.keys))
            object.__setattr__(self, "_hash", h)
        return h

    def __str__(self) -> str:
        if self.kind in ("leaf", "none"):
            return "a tensor" if self.kind == "leaf" else "None"
        if self.kind == "dict":
            return f"a dict with keys {list(self.keys)}"
        if self.kind.endswith("rows"):
            return f"a row gradient of {list(self.keys)}"
        return f"a {self.kind} of {len(self.children)} items"


LEAF, NONE = TreeDef("leaf"), TreeDef("none")
_CONTAINERS = (list, tuple, dict)
_NOT_LEAVES = frozenset(_CONTAINERS) | {type(None), Rows}


# A list of n leaves, flattened on every call of a step: its structure and paths are made once.
@functools.lru_cache(maxsize=64)
def _leaves(kind: str, n: int) -> TreeDef:
    return TreeDef(kind, (LEAF,) * n)  # one object: its hash is computed once


@functools.lru_cache(maxsize=64)
def _leaf_paths(path: str, n: int) -> tuple[str, ...]:
    prefix = f"{path}." if path else ""
    return tuple(f"{prefix}{i}" for i in range(n))  # shared: a tuple nobody can change


# A dict of leaves under names, flattened on every call of a step (the arguments by name):
# its structure and paths are made once, for names that are strings (others, such as 1 and
# True, which a cache would take for one another, go the long way).
@functools.lru_cache(maxsize=64)
def _named_leaves(path: str, keys: tuple) -> tuple[tuple[str, ...], TreeDef] | None:
    if not all(type(k) is str for k in keys):
        return None
    prefix = f"{path}." if path else ""
    return tuple(f"{prefix}{k}" for k in keys), TreeDef("dict", (LEAF,) * len(keys), keys)


def flatten(x: Any, path: str = "") -> tuple[list[Any], Sequence[str], TreeDef]:
    """Leaves in order, their dotted paths, and the structure."""
    if x is None:
        return [], [], NONE
    if isinstance(x, (list, tuple)) and type(x) in (list, tuple):
        if _NOT_LEAVES.isdisjoint(map(type, x)):  # a list of leaves (1,000 gradients, say)
            return list(x), _leaf_paths(path, len(x)), _leaves(type(x).__name__, len(x))
        items = list(enumerate(x))
        kind = type(x).__name__
    elif isinstance(x, dict):
        if type(x) is dict and _NOT_LEAVES.isdisjoint(map(type, x.values())):
            named = _named_leaves(path, tuple(x))  # a step's (x, y), say: made once
            if named is not None:
                return list(x.values()), *named
        items = list(x.items())
        kind = "dict"
    elif isinstance(x, Rows):
        prefix = f"{path}." if path else ""
        parts = [x.indices, x.values] if x.trace is not None else list(x.payload[:2])
        return parts, [f"{prefix}indices", f"{prefix}values"], \
            TreeDef("unique rows" if x.unique else "rows", (LEAF, LEAF), x.shape)
    else:
        return [x], [path], LEAF
    leaves, paths, children = [], [], []
    for key, item in items:
        sub = f"{path}.{key}" if path else str(key)
        ls, ps, t = flatten(item, sub)
        leaves += ls
        paths += ps
        children.append(t)
    keys = tuple(k for k, _ in items) if kind == "dict" else ()
    if all(type(k) is str for k in keys):  # (the structure of every call: one object)
        return leaves, paths, _node(kind, tuple(children), keys)
    return leaves, paths, TreeDef(kind, tuple(children), keys)


@functools.lru_cache(maxsize=256)
def _node(kind: str, children: tuple[TreeDef, ...], keys: tuple[str, ...]) -> TreeDef:
    """One TreeDef per structure: a step's calls flatten to the same object, which jit's
    check of a repeated call compares by identity first (keys that are strings only: 1 and
    True, which a cache would take for one another, make their own)."""
    return TreeDef(kind, children, keys)


def unflatten(tree: TreeDef, leaves: list[Any]) -> Any:
    """The structure `tree` with these leaves in it (a row gradient is made by ops.rows: in
    a trace, a node)."""
    it = iter(leaves)

    def build(t: TreeDef) -> Any:
        if t.kind == "leaf":
            return next(it)
        if t.kind == "none":
            return None
        items = [build(c) for c in t.children]
        if t.kind == "rows" or t.kind == "unique rows" and not isinstance(items[0], np.ndarray):
            return ops.rows(*items, t.keys)  # a step's argument: its indices are not trusted
        if t.kind == "unique rows":  # a step's result: made unique by the step
            return Rows(RowsArray(*items, t.keys[0]),
                        RowsType(len(items[0]), TensorType(t.keys, to_dtype(items[1].dtype)), True))
        if t.kind == "dict":
            return dict(zip(t.keys, items))
        return items if t.kind == "list" else tuple(items)

    return build(tree)


def check_same(expected: TreeDef, got: TreeDef, path: str) -> None:
    """Raise SignatureError naming the first place where two structures differ."""
    if expected == got:
        return
    if (expected.kind != got.kind or expected.keys != got.keys
            or len(expected.children) != len(got.children)):
        raise SignatureError(f"argument '{path}' was {expected} when the step was compiled, "
                             f"now it is {got}; call a new jit for another structure")
    names = expected.keys or range(len(expected.children))
    for key, e, g in zip(names, expected.children, got.children):
        check_same(e, g, f"{path}.{key}")


_NOT_NAME = re.compile(r"[^\w.]")


def ir_name(path: str) -> str:
    """A path made fit for an IR name: letters, digits, `_` and `.` only."""
    name = _NOT_NAME.sub("_", path)
    return name if name and (name[0].isalpha() or name[0] == "_") else f"a{name}"
