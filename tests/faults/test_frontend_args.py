"""Family 19: every bad argument of a public constructor or function of the frontend, of
graphopt.ops and of the optimizer library (graphopt.optim, graphopt.amp) is a GraphoptError
subclass saying what is wrong (never a raw TypeError, ValueError, MemoryError or
AssertionError, and never a silently wrong result)."""
import inspect

import numpy as np
import pytest

import graphopt as go
from graphopt import amp, ops, optim
from graphopt.errors import (ArgumentError, GradientError, GraphoptError, OpTypeError,
                             OptimizerError, ParameterError)
from graphopt.optim import schedules

x = np.ones((2, 3), np.float32)


def w():
    return go.Parameter(np.ones((2, 3), np.float32), name="w")


# (id, call, error class, a regex the message must match)
PARAMETER = [
    ("full-huge", lambda: go.Parameter.full((10**6, 10**6), 0.0, "f32"), "cannot be allocated"),
    ("full-too-big-for-int64", lambda: go.Parameter.full((2**40, 2**40), 0.0, "f32"),
     "more than any machine"),
    ("full-negative", lambda: go.Parameter.full((-100,), 0.0, "f32"), "non-negative, got -100"),
    ("full-minus-one", lambda: go.Parameter.full((-1,), 0.0, "f32"), "non-negative, got -1"),
    ("full-nan-into-i32", lambda: go.Parameter.full((3,), float("nan"), "i32"), "nan is not an"),
    ("full-fraction-into-i32", lambda: go.Parameter.full((3,), 2.5, "i32"), "2.5 is not an"),
    ("full-overflow-i32", lambda: go.Parameter.full((3,), 1e20, "i32"), "out of the range"),
    ("full-2-into-bool", lambda: go.Parameter.full((3,), 2, "bool"), "not a bool"),
    ("full-offset-str", lambda: go.Parameter.full((3,), 0.0, "f32", offset="x"),
     "offset must be an int"),
    ("full-offset-unaligned", lambda: go.Parameter.full((10**5,), 0.0, "f32", offset=3),
     "multiple of 64"),
    ("full-shape-str", lambda: go.Parameter.full("ab", 0.0, "f32"), "sequence of ints"),
    ("full-shape-float", lambda: go.Parameter.full((2.5,), 0.0, "f32"), "must be an int"),
    ("full-dtype", lambda: go.Parameter.full((2,), 0.0, "complex"), "unsupported dtype"),
    ("full-fill-str", lambda: go.Parameter.full((2,), "a", "f32"), "must be a number"),
    ("full-bad-name", lambda: go.Parameter.full((2,), 0.0, "f32", name="a b"),
     "must start with a letter"),
    ("init-offset-str", lambda: go.Parameter(x, offset="x"), "offset must be an int"),
    ("init-object", lambda: go.Parameter(object()), "unsupported dtype"),
    ("init-str", lambda: go.Parameter("abc"), "unsupported dtype"),
    ("init-dtype", lambda: go.Parameter(x, dtype="complex"), "unsupported dtype"),
    ("init-nan-into-i32", lambda: go.Parameter(np.array([1.0, np.nan]), dtype="i32"),
     "nan is not an integer"),
    ("init-overflow-i32", lambda: go.Parameter(np.array([1e12]), dtype="i32"),
     "out of the range"),
    ("init-i64-overflow-i32", lambda: go.Parameter(np.array([2**40]), dtype="i32"),
     "out of the range"),
    ("init-copy-str", lambda: go.Parameter(x, copy="no"), "copy must be True or False"),
]

OPS = [
    ("cast-complex", lambda: ops.cast(w(), "complex"), "cast: dtype: unsupported dtype"),
    ("cast-int", lambda: ops.cast(w(), 5), "unsupported dtype 5"),
    ("astype-complex", lambda: w().astype("complex"), "unsupported dtype"),
    ("sum-axis-str", lambda: ops.sum(w(), "x"), "sum: axis must be an int"),
    ("sum-axis-float", lambda: ops.sum(w(), 1.5), "sum: axis must be an int"),
    ("sum-axis-out-of-range", lambda: ops.sum(w(), 5), "out of range"),
    ("sum-axis-negative-out-of-range", lambda: ops.sum(w(), -5), "out of range"),
    ("sum-axis-repeated", lambda: ops.sum(w(), (0, -2)), "repeats an axis"),
    ("sum-keepdims-str", lambda: ops.sum(w(), 0, keepdims="yes"), "keepdims must be True"),
    ("mean-axis-str", lambda: ops.mean(w(), "x"), "mean: axis"),
    ("max-keepdims-int", lambda: w().max(0, 1), "keepdims must be True"),
    ("reshape-str", lambda: ops.reshape(w(), "ab"), "sequence of ints"),
    ("reshape-float", lambda: ops.reshape(w(), (2.5, 2)), "must be an int"),
    ("reshape-negative", lambda: ops.reshape(w(), (-2, -3)), "non-negative"),
    ("transpose-str", lambda: ops.transpose(w(), "x"), "sequence of ints"),
    ("transpose-floats", lambda: ops.transpose(w(), (1.0, 0.0)), "must be an int"),
    ("broadcast_to-str", lambda: ops.broadcast_to(w(), "x"), "sequence of ints"),
    ("full-negative", lambda: ops.full((-1,), 0.0), "non-negative"),
    ("full-str-shape", lambda: ops.full("ab", 0.0), "sequence of ints"),
    ("full-nan-into-i32", lambda: ops.full((2,), float("nan"), "i32"), "nan is not an"),
    ("full-value-str", lambda: ops.full((2,), "a"), "must be a number"),
    ("zeros-complex", lambda: ops.zeros((2,), "complex"), "unsupported dtype"),
    ("arange-negative", lambda: ops.arange(-1), "at least 0"),
    ("arange-str", lambda: ops.arange("x"), "must be an int"),
    ("arange-float", lambda: ops.arange(2.5), "must be an int"),
    ("one_hot-classes-str", lambda: ops.one_hot(np.array([0, 1]), "x"), "must be an int"),
    ("one_hot-negative", lambda: ops.one_hot(np.array([0, 1]), -1), "at least 0"),
    ("log_softmax-axis-str", lambda: ops.log_softmax(w(), "x"), "must be an int"),
    ("log_softmax-axis-out-of-range", lambda: ops.log_softmax(w(), 5), "out of range"),
    ("asarray-complex", lambda: ops.asarray(np.ones(2, np.complex64)), "unsupported dtype"),
    ("asarray-str", lambda: ops.asarray("x"), "unsupported dtype"),
    ("depend-str", lambda: ops.depend("a"), "str"),
    ("add-list", lambda: ops.add(w(), [1, 2, 3]), "list"),
    ("index-array", lambda: w()[np.array([0])], r"only basic indexing.*ops\.gather"),
    ("index-out-of-bounds", lambda: (w() * 1.0)[9], "out of bounds for axis 0"),
    ("index-float", lambda: w()[1.5], "only basic indexing"),
    ("slice-float", lambda: ops.slice(w(), (0.5,), (1,)), "slice: starts must be an int"),
    ("slice-out-of-range", lambda: ops.slice(w(), (0, 0), (9, 1)), "is not a slice of"),
    ("slice_scatter-shape", lambda: ops.slice_scatter(w(), np.ones(3, np.float32), (0, 0),
                                                      (1, 1)), "not the slice's shape"),
]

FUNCTIONS = [
    ("jit-int", lambda: go.jit(5), ArgumentError, "must be a function"),
    ("jit-passes-int", lambda: go.jit(lambda x: x, passes=5), ArgumentError, "passes must be"),
    ("jit-passes-list-of-int", lambda: go.jit(lambda x: x, passes=[1]), ArgumentError,
     "passes must be"),
    ("jit-passes-unknown", lambda: go.jit(lambda x: x, passes="nope"), GraphoptError,
     "unknown pass"),
    ("jit-backend-int", lambda: go.jit(lambda x: x, backend=5), ArgumentError,
     "backend must be a name"),
    ("jit-fastmath-str", lambda: go.jit(lambda x: x, fastmath="yes"), ArgumentError,
     "fastmath must be True"),
    ("jit-cache-str", lambda: go.jit(lambda x: x, cache="no"), ArgumentError,
     "cache must be True"),
    ("jit-decorator-passes-int", lambda: go.jit(passes=5)(lambda x: x), ArgumentError,
     "passes must be"),
    ("trace-int", lambda: go.trace(5, x), ArgumentError, "must be callable"),
    ("value_and_grad-int", lambda: go.value_and_grad(5), GradientError, "a function"),
    ("value_and_grad-has_aux-str", lambda: go.value_and_grad(lambda x: x, has_aux="y"),
     GradientError, "has_aux must be"),
]


@pytest.mark.parametrize("call, match", [c[1:] for c in PARAMETER], ids=[c[0] for c in PARAMETER])
def test_bad_parameter_arguments_are_parameter_errors(call, match):
    with pytest.raises(ParameterError, match=match):
        call()


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("call, match", [c[1:] for c in OPS], ids=[c[0] for c in OPS])
def test_bad_op_arguments_are_op_type_errors(mode, call, match):
    if mode == "eager":
        with pytest.raises(OpTypeError, match=match):
            call()
    else:
        with pytest.raises(OpTypeError, match=match):
            go.jit(lambda a: call(), backend="interpreter")(x)


@pytest.mark.parametrize("call, error, match", [c[1:] for c in FUNCTIONS],
                         ids=[c[0] for c in FUNCTIONS])
def test_bad_function_arguments_are_graphopt_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_an_op_argument_error_names_the_users_line():
    with pytest.raises(OpTypeError) as e:
        ops.sum(w(), "x")
    assert "test_frontend_args.py" in str(e.value)


@pytest.mark.parametrize("call, shape, fill", [
    (lambda: go.Parameter.full((0,), 1.0, "f32"), (0,), 1.0),
    (lambda: go.Parameter.full(3, 7, "i32"), (3,), 7),
    (lambda: go.Parameter.full((2,), 3.0, "i32"), (2,), 3),
    (lambda: go.Parameter.full((2,), True, "bool"), (2,), True),
    (lambda: go.Parameter(np.array([1.0, 2.0]), dtype="i32"), (2,), None),
    (lambda: go.Parameter(np.arange(3), dtype="bool"), None, None),
])
def test_good_arguments_still_work(call, shape, fill):
    if shape is None:
        with pytest.raises(ParameterError, match="not a bool"):  # 2 is not a bool
            call()
        return
    p = call()
    assert p.shape == shape
    if fill is not None:
        assert (p.numpy() == fill).all()


# -- the optimizer library's constructors --------------------------------------------------------
# Every public class of graphopt.optim, graphopt.optim.schedules and graphopt.amp, with the
# arguments of a good call: every optimizer graphopt.optim exports is found by its class.
OPTIMIZERS = sorted((c for c in map(optim.__dict__.get, optim.__all__)
                     if isinstance(c, type) and issubclass(c, optim.Optimizer)),
                    key=lambda c: c.__name__)
GOOD_ARGUMENTS = {
    **{c: lambda: ([w()],) for c in OPTIMIZERS if c is not optim.Optimizer},
    optim.Optimizer: lambda: ([w()], {}),
    optim.Accumulate: lambda: (optim.SGD([w()]), 2),
    schedules.Constant: lambda: (1e-3,),
    schedules.ExponentialDecay: lambda: (1e-3, 0.9),
    schedules.StepDecay: lambda: (1e-3, 10),
    schedules.LinearWarmup: lambda: (1e-3, 10),
    schedules.CosineDecay: lambda: (1e-3, 100),
    schedules.WarmupCosine: lambda: (1e-3, 10, 100),
    schedules.Schedule: lambda: (),
    amp.LossScaler: lambda: (128.0, "scale"),
    amp.StaticLossScaler: lambda: (),
    amp.DynamicLossScaler: lambda: (),
}
CLASSES = list(GOOD_ARGUMENTS)
IDS = [f"{c.__module__.rpartition('.')[2]}.{c.__name__}" for c in CLASSES]


def test_every_public_class_of_the_optimizer_library_is_covered():
    public = {c for module in (optim, schedules, amp) for c in map(module.__dict__.get,
                                                                   module.__all__)
              if isinstance(c, type) and c is not optim.ParamGroup}  # (built by optimizers)
    assert public == set(CLASSES)
    assert len(OPTIMIZERS) >= 10  # SGD, Adagrad, RMSprop, Adam, AdamW, NAdam, Adamax, LAMB, ...


def positional(cls):
    return [p.name for p in inspect.signature(cls).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def bad_calls():
    """(id, the class's name, the call, what the message must say), four faults a class."""
    for cls, ident in zip(CLASSES, IDS):
        name, good, names = cls.__name__, GOOD_ARGUMENTS[cls], positional(cls)
        k, n = len(good()), len(names)
        takes = f"at most {n} \\({', '.join(names)}\\)" if n else "none"
        yield (f"{ident}-unknown-keyword", name, lambda c=cls, g=good: c(*g(), foo=1),
               rf"{name}\(\): got an unexpected keyword argument 'foo'")
        yield (f"{ident}-extra-positional", name,
               lambda c=cls, g=good, extra=n - k + 1: c(*g(), *[None] * extra),
               rf"{name}\(\): {n + 1} positional arguments? given, but it takes {takes}\.")
        if k:
            yield (f"{ident}-missing-positional", name, lambda c=cls, g=good: c(*g()[:-1]),
                   rf"{name}\(\): missing a required argument: '{names[k - 1]}'")
            yield (f"{ident}-repeated", name,
                   lambda c=cls, g=good, first=names[0]: c(*g(), **{first: g()[0]}),
                   rf"{name}\(\): multiple values for argument '{names[0]}'")


BAD_CALLS = list(bad_calls())


@pytest.mark.parametrize("name, call, match", [c[1:] for c in BAD_CALLS],
                         ids=[c[0] for c in BAD_CALLS])
def test_a_bad_constructor_call_is_an_optimizer_error(name, call, match):
    with pytest.raises(OptimizerError, match=match) as e:
        call()
    assert str(e.value).startswith(f"{__file__}:")  # the caller's line, where the call is
    assert f". Its arguments: {name}(" in str(e.value)


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_every_argument_the_message_names_is_taken(cls):
    """The signature a call is checked against is the constructor's own: each argument with a
    default, passed by its name, is accepted (so no check refuses what the class takes)."""
    good = GOOD_ARGUMENTS[cls]
    for p in list(inspect.signature(cls).parameters.values())[len(good()):]:
        assert p.default is not p.empty, p
        cls(*good(), **{p.name: p.default})


@pytest.mark.parametrize("cls", [c for c in OPTIMIZERS if c is not optim.Optimizer],
                         ids=lambda c: c.__name__)
def test_an_optimizers_signature_includes_the_base_keywords(cls):
    sig = inspect.signature(cls)
    assert {"params", "lr", "maximize", "name", "state_dtype", "master_weights"} <= \
        set(sig.parameters)
    assert not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    # (SparseAdam and FTRL have no weight decay, as torch's and Keras's have none)
    typo, meant = ("weight_decy", "weight_decay") if "weight_decay" in sig.parameters else \
        ("maximze", "maximize")
    with pytest.raises(OptimizerError, match=rf"'{typo}' \(did you mean '{meant}'\?\)"):
        cls([w()], **{typo: 0.1})


def test_adamw_refuses_the_decoupling_flag_it_fixes():
    with pytest.raises(OptimizerError, match="AdamW.*unexpected keyword argument "
                                             "'decoupled_weight_decay'"):
        optim.AdamW([w()], decoupled_weight_decay=False)


def test_a_subclass_defined_elsewhere_is_bound_as_written():
    class Scaled(optim.SGD):  # its **hyper are its own: not the base's keywords
        def __init__(self, params, factor=1.0, **hyper):
            super().__init__(params, lr=hyper.get("lr", 0.1) * factor)

    assert Scaled([w()], factor=2.0, lr=0.5).param_groups[0]["lr"] == 1.0
    with pytest.raises(OptimizerError, match=r"Scaled\(\): 3 positional arguments given"):
        Scaled([w()], 2.0, 3.0)
