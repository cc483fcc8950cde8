"""Nested arguments (lists, tuples, dicts of leaves) flattened to a list of leaves and back.

The structure (`TreeDef`) is part of a compiled step's signature; leaf paths such as
`grads.0` or `batch.x` name the step's `arg` inputs in the IR.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import SignatureError


@dataclass(frozen=True)
class TreeDef:
    kind: str  # "leaf", "none", "list", "tuple" or "dict"
    children: tuple[TreeDef, ...] = ()
    keys: tuple[Any, ...] = ()  # dict keys, in order

    def __str__(self) -> str:
        if self.kind in ("leaf", "none"):
            return "a tensor" if self.kind == "leaf" else "None"
        if self.kind == "dict":
            return f"a dict with keys {list(self.keys)}"
        return f"a {self.kind} of {len(self.children)} items"


LEAF, NONE = TreeDef("leaf"), TreeDef("none")
_CONTAINERS = (list, tuple, dict)


def flatten(x: Any, path: str = "") -> tuple[list[Any], list[str], TreeDef]:
    """Leaves in order, their dotted paths, and the structure."""
    if x is None:
        return [], [], NONE
    if isinstance(x, (list, tuple)) and type(x) in (list, tuple):
        if not any(type(e) in _CONTAINERS or e is None for e in x):  # a list of leaves (of
            prefix = f"{path}." if path else ""                      # 1,000 gradients, say)
            return list(x), [f"{prefix}{i}" for i in range(len(x))], \
                TreeDef(type(x).__name__, (LEAF,) * len(x))
        items = list(enumerate(x))
        kind = type(x).__name__
    elif isinstance(x, dict):
        items = list(x.items())
        kind = "dict"
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
    return leaves, paths, TreeDef(kind, tuple(children), keys)


def unflatten(tree: TreeDef, leaves: list[Any]) -> Any:
    it = iter(leaves)

    def build(t: TreeDef) -> Any:
        if t.kind == "leaf":
            return next(it)
        if t.kind == "none":
            return None
        items = [build(c) for c in t.children]
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
