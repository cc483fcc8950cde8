"""The API reference is complete: every public function and class has a docstring, so do its
public methods (their own or a base class's), and each one is on a page of docs/api/."""
import functools
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest
import yaml

API_DOCS = Path(__file__).parent.parent / "docs" / "api"
MODULES = ["graphopt", "graphopt.ops", "graphopt.optim", "graphopt.optim.schedules",
           "graphopt.amp", "graphopt.passes", "graphopt.compile", "graphopt.autodiff",
           "graphopt.ir", "graphopt.errors", "graphopt.backends", "graphopt.distributed",
           "graphopt.explorer"]
DIRECTIVE = re.compile(r"^::: ([\w.]+)[ \t]*\n((?:(?:[ \t]{4}.*)?\n)*)", re.M)


def public_names():
    """(module, name, object) for each function or class a module exports."""
    out = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or \
            [n for n, v in vars(module).items() if not n.startswith("_") and
             getattr(v, "__module__", "").startswith(module_name)]
        for name in names:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                out.append((module_name, name, obj))
    return out


PUBLIC = public_names()
CLASSES = {obj for _, _, obj in PUBLIC if inspect.isclass(obj)}


def own_docstring(obj) -> str:
    """A class's own docstring (inspect.getdoc would give a base class's), else getdoc's. A
    dataclass without one gets its signature as __doc__: that is none."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__") or ""
        return "" if doc.startswith(obj.__name__ + "(") else inspect.cleandoc(doc)
    return inspect.getdoc(obj) or ""


def public_methods(cls):
    """name -> the object mkdocstrings documents, for each public method and property that
    the class or one of graphopt's base classes of it defines."""
    names = {n for k in cls.__mro__ if k.__module__.startswith("graphopt")
             for n in vars(k) if not n.startswith("_")}
    out = {}
    for name in sorted(names):
        attr = inspect.getattr_static(cls, name)
        if isinstance(attr, (staticmethod, classmethod)):
            out[name] = getattr(cls, name)
        elif inspect.isfunction(attr):
            out[name] = getattr(cls, name)
        elif isinstance(attr, (property, functools.cached_property)):
            out[name] = attr
    return out


def method_doc(cls, name, obj) -> str:
    """A method's docstring, or the one of the method it overrides in a base class."""
    doc = inspect.getdoc(obj)
    if doc:
        return doc
    for base in cls.__mro__[1:]:
        attr = base.__dict__.get(name)
        if attr is not None and getattr(attr, "__doc__", None):
            return inspect.cleandoc(attr.__doc__)
    return ""


def resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(path)


def documented() -> set[int]:
    """ids of the objects the pages of docs/api/ render: each `::: path`, and the members
    its options list (all of a module's `__all__` when they list none)."""
    seen = set()
    for page in sorted(API_DOCS.glob("*.md")):
        for path, block in DIRECTIVE.findall(page.read_text()):
            obj = resolve(path)
            seen.add(id(obj))
            options = (yaml.safe_load(textwrap.dedent(block)) or {}).get("options") or {}
            members = options.get("members")
            if members is None and inspect.ismodule(obj):
                members = getattr(obj, "__all__", [])
            for name in members or ():
                seen.add(id(getattr(obj, name)))
    return seen


def test_the_public_names_are_found():
    names = {f"{m}.{n}" for m, n, _ in PUBLIC}
    assert {"graphopt.jit", "graphopt.ops.add", "graphopt.optim.Adam",
            "graphopt.amp.DynamicLossScaler", "graphopt.passes.run",
            "graphopt.compile.Executable", "graphopt.autodiff.grad"} <= names


@pytest.mark.parametrize("module,name,obj", PUBLIC, ids=[f"{m}.{n}" for m, n, _ in PUBLIC])
def test_public_name_has_a_docstring(module, name, obj):
    assert own_docstring(obj).strip(), f"{module}.{name} has no docstring"


@pytest.mark.parametrize("cls", sorted(CLASSES, key=lambda c: c.__qualname__),
                         ids=lambda c: c.__qualname__)
def test_public_methods_have_docstrings(cls):
    missing = [name for name, obj in public_methods(cls).items()
               if not method_doc(cls, name, obj).strip()]
    assert not missing, f"{cls.__qualname__}: no docstring on {', '.join(missing)}"


def test_every_public_name_is_on_a_reference_page():
    seen = documented()
    missing = [f"{m}.{n}" for m, n, obj in PUBLIC if id(obj) not in seen]
    assert not missing, f"not on any docs/api page: {', '.join(missing)}"


def test_a_removed_docstring_is_found(monkeypatch):
    from graphopt import ops
    monkeypatch.setattr(ops.add, "__doc__", None)
    assert not own_docstring(ops.add)
    from graphopt.optim import Optimizer, SGD
    monkeypatch.setattr(Optimizer.update, "__doc__", None)
    assert not method_doc(SGD, "update", SGD.update)
