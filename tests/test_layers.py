"""The layering of graphopt (docs/architecture.md): each layer imports only itself and the
layers below it. A static check of every import statement, at module level and inside
functions, so a lazy import cannot hide an upward dependency."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "graphopt"

# Bottom to top. A module belongs to the layer of its first name under graphopt/.
LAYERS = [
    {"errors", "envvars", "memory", "diskcache", "comm"},
    {"ir"},
    {"passes"},
    {"backends"},
    {"frontend", "ops"},
    {"compile"},
    {"autodiff"},
    {"optim", "distributed", "amp", "checkpoint", "explain", "explorer", "cli", "demo", "__init__",
     "__main__"},
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _part(path: Path) -> str:
    """The top-level name under graphopt/ a file belongs to (ir, passes, ops, ...)."""
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py")


def _imported(path: Path, source: str | None = None) -> set[str]:
    """The top-level graphopt names a file imports, relative or absolute."""
    package = path.relative_to(PACKAGE.parent).parts[:-1]  # graphopt/ir/x.py: graphopt.ir
    names = set()
    source = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[:len(package) - node.level + 1])
                module = base + (node.module.split(".") if node.module else [])
                targets = [module] if node.module else [base + [a.name] for a in node.names]
            else:
                targets = [node.module.split(".")] if node.module else []
        else:
            continue
        for t in targets:
            if t[0] == "graphopt" and len(t) > 1:
                names.add(t[1])
    return names


def test_every_module_is_in_a_layer():
    assert {_part(p) for p in _modules()} <= set(LEVEL), "add the new part to LAYERS"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_its_layer_and_those_below(path):
    own = LEVEL[_part(path)]
    above = sorted(name for name in _imported(path) if LEVEL.get(name, -1) > own)
    assert not above, f"{path.relative_to(PACKAGE)} imports {above} from a layer above its own"


def test_the_check_sees_relative_function_level_and_absolute_imports():
    source = ("def f():\n    from ..backends import llvm\n    import graphopt.optim\n"
              "from .. import compile as c\nfrom . import kernel\nfrom .types import f32\n")
    assert _imported(PACKAGE / "ir" / "probe.py", source) == {"backends", "optim", "compile",
                                                              "ir"}
