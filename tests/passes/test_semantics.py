"""Every pass test also preserves meaning: for each .gir file and each of its RUN lines (exact
math only: no --fastmath), the interpreter gives the same outputs and the same parameter
updates, bit for bit, before and after the pipeline, on inputs full of the values that break
careless rewrites (-0.0, NaN, +-inf, huge and tiny numbers). The output also parses back to
the same text (kernels included)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from girtest import parse_run_lines
from graphopt import passes
from graphopt.backends.interpreter import run as interpret
from graphopt.ir import parse
from graphopt.ir.opdefs import write_rows
from graphopt.ir.types import RowsArray

HERE = Path(__file__).parent
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, np.nan, np.inf, -np.inf, 1e30, -1e-30, 65504.0]


def pipelines(path: Path) -> list[str]:
    """The --passes of each RUN line that runs exact passes on the file."""
    out = []
    for run in parse_run_lines(path.read_text(), path):
        argv = run.argv
        if argv[0] != "opt" or run.expect_fail or "--fastmath" in argv:
            continue
        out.append(argv[argv.index("--passes") + 1] if "--passes" in argv else "default")
    return sorted(set(out))


CASES = [(p, pipe) for p in sorted(HERE.rglob("*.gir")) for pipe in pipelines(p)]


def sample(t, rng: np.random.Generator) -> np.ndarray:
    dtype = t.dtype.np_dtype
    if t.dtype.name == "bool":
        return rng.random(t.shape) < 0.5
    if t.dtype.is_float:
        values = rng.choice(np.array(SPECIAL + list(rng.standard_normal(8)), np.float64),
                            size=t.shape)
        with np.errstate(all="ignore"):
            return np.asarray(values).astype(dtype)
    return rng.integers(-5, 6, size=t.shape).astype(dtype)


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":  # NaN anywhere equals NaN; otherwise the same bits (-0.0 != 0.0)
        nan = np.isnan(a)
        return bool((nan == np.isnan(b)).all() and
                    (a[~nan].view(np.uint8) == b[~nan].view(np.uint8)).all())
    return bool((a == b).all())


def row_indices(graph) -> dict[str, int]:
    """The arguments that are indices of rows (`rows %i, %v`), with their tensors' row count,
    and the labels of a cross-entropy, with its classes less one: they are drawn in [0, rows]
    (rows: no row) and [0, classes), the other indices a step refuses."""
    return {n.inputs[i].name: high for n in graph.nodes for i, high in
            (((0, n.outputs[0].type.shape[0]),) if n.op == "rows" else
             ((1, n.inputs[0].type.shape[-1] - 1),) if n.op == "softmax_cross_entropy" else ())
            if n.inputs[i].kind == "arg"}


def committed(value: np.ndarray, update) -> np.ndarray:
    """A parameter's value after the commit of an update (rows: written into a copy)."""
    if isinstance(update, RowsArray):
        value = value.copy()
        write_rows(value, update)
        return value
    return update


@pytest.mark.parametrize("path, pipeline", CASES,
                         ids=[f"{p.parent.name}/{p.name}:{pipe}" for p, pipe in CASES])
def test_pipeline_keeps_the_results(path, pipeline):
    graph = parse(path.read_text()).verify()
    after = passes.run(graph, pipeline, out=None).graph
    text = after.format(locs=True)
    assert parse(text).format(locs=True) == text, "the output does not parse back to itself"
    indices = row_indices(graph)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        values = {x.name: sample(x.type, rng) if x.name not in indices else
                  rng.integers(0, indices[x.name] + 1, x.type.shape) for x in graph.inputs}
        before_out, before_upd = interpret(graph, {x: values[x.name] for x in graph.inputs})
        after_out, after_upd = interpret(after, {x: values[x.name] for x in after.inputs})
        for i, (a, b) in enumerate(zip(before_out, after_out)):
            assert same(a, b), f"output {i} differs (seed {seed}):\nbefore {a!r}\nafter  {b!r}"
        # The interpreter also commits assigns the return does not reach (dead by DESIGN's
        # rule, and removed by dce), so the graph after may update fewer parameters.
        assert set(after_upd) <= set(before_upd)
        for name in after_upd:
            a, b = (committed(values[name], u[name]) for u in (before_upd, after_upd))
            assert same(a, b), f"@{name} differs (seed {seed})"
