"""Family 2: a multi-tensor kernel whose first instance is a scalar parameter read the shared
operands (the learning rate) as streams in every instance: wrong numbers for the others. One
stride per operand now serves every instance, and a kernel that cannot have one is refused."""
import numpy as np
import pytest

import graphopt as go

SHAPES = [[(), (5,)], [(), (3, 4)], [(1,), (7,)], [(5,), ()], [(), (), (6,)], [(), (1,), (2,)],
          [(1, 1), (9,)], [(), (300_000,)]]
RULES = {"SGD": dict(lr=0.5), "SGD-momentum": dict(lr=0.5, momentum=0.9, nesterov=True),
         "Adam": dict(lr=0.1), "AdamW": dict(lr=0.1, weight_decay=0.1),
         "RMSprop": dict(lr=0.01), "Adagrad": dict(lr=0.1)}


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_over_scalar_and_tensor_parameters_matches_the_interpreter(rule, shapes):
    rng = np.random.default_rng(0)
    start = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    finals = []
    for backend in ("interpreter", "llvm"):
        ps = [go.Parameter(a, name=f"p{i}") for i, a in enumerate(start)]
        opt = getattr(go.optim, rule.split("-")[0])(ps, **RULES[rule])
        step = go.jit(lambda gs: opt.step(gs), backend=backend, cache=False)
        for g in grads:
            step(g)
        finals.append([p.numpy() for p in ps])
    for a, b in zip(*finals):
        np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-7)


def test_an_operand_that_streams_in_one_instance_and_broadcasts_in_another_is_not_compiled():
    """IR written by hand may say so; the kernel runs through numpy, with the reason."""
    from graphopt.backends.llvm.runtime import compile as compile_llvm
    graph = go.ir.parse("""graph g {
      arg %a: f32[4]
      arg %b: f32[4]
      arg %c: f32[3]
      arg %d: f32[]
      %0, %1 = kernel %a, %b, %c, %d {spaces=[[4], [3]], outputs=["map"], shared=[]} : f32[4], f32[3] {
        arg %x0: f32[]
        arg %x1: f32[]
        %0 = add %x0, %x1 : f32[]
        return %0
      }
      return %0, %1
    }""")
    program = compile_llvm(graph, cache=False)
    (fallback,) = program.fallbacks
    assert "streams in some instances and broadcasts in others" in fallback.reason
    a, b, c, d = np.ones(4, np.float32), np.arange(4, dtype=np.float32), \
        np.full(3, 2, np.float32), np.float32(5)
    outs, _ = program.run(dict(zip(graph.args, [a, b, c, np.asarray(d)])))
    np.testing.assert_array_equal(outs[0], a + b)
    np.testing.assert_array_equal(outs[1], c + d)
