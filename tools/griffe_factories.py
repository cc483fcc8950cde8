"""A griffe extension for the API reference (mkdocs.yml): functions made by a factory.

graphopt.ops makes most of its elementwise ops with a factory (`add = _binary("add")`), so
static analysis sees an attribute whose value is a call, with no signature and no
docstring. At run time each is a function that names itself as a module-level one
(`__module__` and `__qualname__` set). For each such attribute this extension imports the
module and puts the function griffe finds by inspecting it in the attribute's place, so the
reference shows its signature and its docstring.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe


class FactoryFunctions(griffe.Extension):
    def on_module_members(self, *, mod: griffe.Module, agent: Any, **kwargs: Any) -> None:
        if not isinstance(agent, griffe.Visitor):
            return
        made = [name for name, member in mod.members.items()
                if not member.is_alias and member.is_attribute
                and isinstance(member.value, griffe.ExprCall)]
        if not made:
            return
        module = importlib.import_module(mod.path)
        names = [name for name in made if _poses_as_function(getattr(module, name, None),
                                                             mod.path, name)]
        if not names:
            return
        inspected = griffe.inspect(mod.path, docstring_parser=agent.docstring_parser,
                                   docstring_options=agent.docstring_options)
        for name in names:
            function = inspected.members[name]
            function.lineno = mod.members[name].lineno
            function.endlineno = mod.members[name].endlineno
            mod.set_member(name, function)


def _poses_as_function(obj: Any, module: str, name: str) -> bool:
    return inspect.isfunction(obj) and obj.__module__ == module and obj.__qualname__ == name
