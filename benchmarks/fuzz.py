"""Differential fuzzing: random step functions, run eagerly, on the interpreter and on the
LLVM backend at several CPU levels, compared with the tolerances docs/llvm.md states.

    python benchmarks/fuzz.py --programs 10000            # the campaign; writes results/fuzz.md
    python benchmarks/fuzz.py --replay 1234               # one program: its source, each mode

A program is Python source (so a failure prints as a test case): `make()` builds fresh
Parameters (and an optimizer) with fixed initial values, `calls()` the arguments of two or
three calls of `step`. A program mixes up to three sections:

  - expr: elementwise chains with broadcasting and Python scalars, reductions (full and per
    axis), comparisons and `where`, casts across every dtype, shape ops, assigns to
    Parameters and reads after them;
  - rule: one update rule written once and applied to several Parameters of one dtype and
    different shapes (hfuse merges them into one multi-tensor kernel);
  - optim: a graphopt.optim optimizer with random hyper-parameters, parameter groups,
    schedules, gradient transforms and accumulation.

Every mode runs `make()` again (fresh Parameters, same values) and all the calls (an
optimizer's hyper-parameters may change between calls: data, so jit must not trace again);
after each call its outputs and every Parameter are compared with the interpreter's (the
reference):

  - eager: bit for bit, everywhere (both are numpy; "eager and jit give the same numbers");
  - llvm: bit for bit except where docs/llvm.md allows a difference. The generator tracks
    for each value a bound on its relative difference: a libm op (exp, log, pow, tanh, sin,
    cos, softplus) adds 2e-5 (f32) / 1e-12 (f64), a full float reduction 1e-5 (f32)
    relative to the sum of |x|, each later rounding one ulp of its dtype. Such values flow
    on only through ops that keep a relative bound (products, quotients by values bounded
    away from 0, sums of non-negative values, max/min, where, float casts); a comparison, a
    cast to an integer, a subtraction never sees them. A full sum of values of both signs
    ends its chain and is compared with its companion sum of |x| as the scale; gelu and
    sigmoid, whose formulas magnify their libm call's last bit, end theirs and are compared
    with |x|. f16/bf16 are computed in f32 and rounded after each op, so a difference there
    is one ulp of f16 (2^-10) or bf16 (2^-7) more. An optimizer whose step has pow or cos
    (Adam, AdamW, NAdam, Adamax, LAMB; decaying schedules) or a gradient norm is compared per
    element relative to |p| plus the distance the parameter travelled; SGD, RMSprop, Adagrad
    and Lion with constant or warm-up lr bit for bit. The bound is checked with a factor of
    2; NaN equals NaN (whatever its payload), -0 differs from +0.

What graphopt rejects with a GraphoptError in every mode (at the same call, with the same
error class) is not a mismatch; a rejection in one mode and not another is; any other
exception, a dead worker (a native crash) or a program that takes too long is a crash.
Programs run in worker processes (restarted when they die), one program at a time each.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

DTYPES = ("f16", "bf16", "f32", "f64", "i32", "i64", "bool")
FLOATS = ("f16", "bf16", "f32", "f64")
INTS = ("i32", "i64")
NUM = FLOATS + INTS
DEFAULT_LEVELS = ("x86-64", "x86-64-v3", "host")
ALL_LEVELS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "host")

# Relative spacing of a dtype's numbers (one ulp at 1), and the differences docs/llvm.md allows.
ULP = {"f16": 2.0 ** -10, "bf16": 2.0 ** -7, "f32": 2.0 ** -23, "f64": 2.0 ** -52}
LIBM = {"f64": 1e-12, "f32": 2e-5, "f16": 2e-5 + ULP["f16"], "bf16": 2e-5 + ULP["bf16"]}
SAFETY = 2.0  # the bound is first order: checked with this factor

# Known bugs, name -> what goes wrong: a generator branch tests `name in self.avoid` to steer
# clear of one. tests/test_fuzz.py avoids them all until they are fixed (each has a strict-xfail
# test in tests/test_fuzz_regressions.py); the campaign avoids nothing unless told (--avoid).
# None is open: the bugs found so far are fixed (benchmarks/results/fuzz.md lists them).
KNOWN_BUGS: dict[str, str] = {}


def reduce_tol(dtype: str, n: int) -> float:
    """How far a native float reduction (full, over leading axes, or of rows) of n elements
    may be from the interpreter's, relative to the sum of |x|: 1e-5 in f32 (docs/llvm.md), 1e-12 in
    f64 (as for libm: not stated); f16/bf16 are summed in f32 (or wider) by both and rounded
    once: one ulp more. (n: the bound does not grow with it while n is far below
    1e-5 / 2^-24.)"""
    if dtype in ("f16", "bf16"):
        return 1e-5 + ULP[dtype]
    return {"f32": 1e-5, "f64": 1e-12}[dtype]


# -- data -------------------------------------------------------------------------------------
def _np_dtype(dtype: str) -> Any:
    if dtype == "bf16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i32": np.int32,
            "i64": np.int64, "bool": np.bool_}[dtype]


_SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 5e-324, 65504.0, 65520.0,
            -7e4, 3e38, 1e30, -1e30, 0.5, 1.5, 2.5, -2.5, 1.0, -1.0, 1e-8, 6e-8, 2.0 ** 31,
            -2.0 ** 31 - 1, 2.0 ** 63, 16777217.0]
_INT_EDGES = [0, 1, -1, 2 ** 31 - 1, -2 ** 31, 2 ** 24 + 1, 2 ** 24 + 2 ** 16 + 1,
              -(2 ** 24 + 2 ** 16 + 1), 2049, 65519, 65521]
_I64_EDGES = [2 ** 63 - 1, -2 ** 63, 2 ** 53 + 1, 2 ** 40 + 3]


def _edges(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values next to the rounding midpoints of f16, bf16 and f32 (in f64), scaled by powers of
    two: a cast that rounds twice (through f32) rounds some of them the other way."""
    mids = np.array([1 + 2.0 ** -11, 1 + 2.0 ** -8, 1 + 2.0 ** -24, 1 + 3 * 2.0 ** -11])
    m = rng.choice(mids, n) + rng.choice([-1, 0, 1], n) * 2.0 ** -40
    return m * 2.0 ** rng.integers(-12, 12, n) * rng.choice([-1, 1], n)


def data(rng: np.random.Generator, shape: tuple, dtype: str, kind: str) -> Any:
    """Input values, the same for the same generator state. dtype "float"/"int" gives a Python
    scalar. kind: normal, pos (>= 0.5), small, wide (magnitudes 1e-8..1e8), special (normal
    with NaN, infinities, signed zeros, subnormals and huge values mixed in), edge (values by
    rounding midpoints), int (small), wideint (edges of the integer types), bool."""
    if dtype == "float":
        return float(rng.choice([0.5, -1.5, 0.1, 2.0, 0.0, 1e-3, 3.0]))
    if dtype == "int":
        return int(rng.choice([0, 1, -1, 2, 3, 7]))
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype in INTS:
        if kind == "wideint":
            edges = _INT_EDGES + (_I64_EDGES if dtype == "i64" else [])
            hi = 2 ** 31 - 1 if dtype == "i32" else 2 ** 62
            v = rng.integers(-hi, hi, n, dtype=np.int64)
            pick = rng.random(n) < 0.5
            v[pick] = rng.choice(np.array(edges, dtype=np.int64), int(pick.sum()))
        elif kind == "pos":
            v = rng.integers(1, 10, n)
        else:
            v = rng.integers(-20, 21, n)
        return v.astype(_np_dtype(dtype)).reshape(shape)
    if kind == "pos":
        v = np.abs(rng.standard_normal(n)) + 0.5
    elif kind == "small":
        v = rng.standard_normal(n) * 1e-3
    elif kind == "wide":
        v = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-8, 8, n)
    elif kind == "edge":
        v = _edges(rng, n)
    elif kind == "int":
        v = rng.integers(-20, 21, n).astype(np.float64)
    else:
        v = rng.standard_normal(n)
        if kind == "special":
            pick = rng.random(n) < 0.3
            v[pick] = rng.choice(np.array(_SPECIAL), int(pick.sum()))
    with np.errstate(all="ignore"):
        return v.astype(_np_dtype(dtype)).reshape(shape)


# -- values as the generator sees them --------------------------------------------------------
Err = Callable[[dict], float]  # a bound on a value's relative difference, from the params' bounds


def e_sum(*errs: Err | None, c: float = 0.0) -> Err | None:
    errs = tuple(e for e in errs if e is not None)
    if not errs and c == 0.0:
        return None
    return lambda env: c + sum(e(env) for e in errs)


def e_max(*errs: Err | None, c: float = 0.0) -> Err | None:
    errs = tuple(e for e in errs if e is not None)
    if not errs:
        return None if c == 0.0 else (lambda env: c)
    return lambda env: c + max(e(env) for e in errs)


RANK = {"any": 0, "nonneg": 1, "pos": 2}  # pos: >= 1e-3 (or NaN/inf): divides safely


def _sign_of(rank: int) -> str:
    return ("any", "nonneg", "pos")[rank]


@dataclass
class V:
    """A value of the program: how the source names it, its type, and what is known of it."""

    expr: str
    shape: tuple | None  # None: the shape of a rule's tensors (inside a rule body)
    dtype: str  # a DTYPE, or "float"/"int"/"pybool": a Python scalar
    err: Err | None = None  # None: exact, compared bit for bit
    sign: str = "any"
    param: str | None = None  # it is a read of this Parameter

    @property
    def approx(self) -> bool:
        return self.err is not None

    @property
    def weak(self) -> bool:
        return self.dtype in ("float", "int", "pybool")

    @property
    def rank(self) -> int:
        return RANK[self.sign]


@dataclass
class Check:
    """How one output or Parameter is compared with the reference."""

    kind: str  # "bits", "close" (err bound, optional scale output), "opt" (optimizer state)
    err: Err | None = None
    scale: int | None = None  # index of the output holding an absolute scale (a sum of |x|)
    rel: int | None = None  # index of the output m: the relative bound is err * (1 + |m|)
    roles: dict | None = None  # rule bodies: role -> parameter name, to evaluate err


@dataclass
class Program:
    seed: int
    source: str
    sections: list[str]
    outputs: list[Check]
    # (parameter, err of the value assigned, roles) in program order: the bounds after a call
    updates: list[tuple[str, Err | None, dict | None]]
    params: dict[str, Check]  # my Parameters; the optimizer's follow `opt_check`
    opt_check: Check | None = None
    opt_tol: float = 0.0  # per call, for kind "opt"
    opt_dtype: str = "f32"  # the narrowest dtype an optimizer stores
    expect_reject: bool = False
    code: Any = None  # the source, compiled once

    def bounds(self, calls: int) -> list[dict]:
        """The parameters' error bounds at the start of each call (and after the last)."""
        env = {name: 0.0 for name in self.params}
        out = [dict(env)]
        for _ in range(calls):
            new = dict(env)
            for name, err, roles in self.updates:
                new[name] = 0.0 if err is None else err(_local(env, roles))
            env = new
            out.append(dict(env))
        return out

    def param_check(self, name: str) -> Check:
        return self.params.get(name) or self.opt_check or Check("bits")


def _local(env: dict, roles: dict | None) -> dict:
    return env if roles is None else {role: env[name] for role, name in roles.items()}


def broadcast(a: tuple | None, b: tuple | None) -> tuple | None | bool:
    """numpy's broadcast of two shapes; None stands for a rule's tensor shape (which only
    broadcasts with scalars and itself); False when they do not broadcast."""
    if a is None or b is None:
        if a == () or b == () or a == b:
            return None
        return False
    out = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + a), reversed((1,) * (len(a) - len(b)) + b)):
        if x != y and 1 not in (x, y):
            return False
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return tuple(reversed(out))


FLOAT_LITERALS = [0.5, 2.0, -1.0, 1.0, 0.0, -0.0, 3.0, 1e-3, 0.1, -2.5, 1e30, 0.25]
INT_LITERALS = [0, 1, -1, 2, 3, 7, -5, 100000]
SHAPES = [(5, 7), (5, 7), (3, 4, 5), (33,), (2, 3, 1, 4), (8, 1), (), (64, 65), (1, 9)]
BIG_SHAPES = [(257, 515), (8193,), (3, 8191)]
EMPTY_SHAPES = [(0,), (3, 0)]

# unary ops: (dtypes, kind) where kind says what it does to a bound: "keep" (exact on a
# value: -x, |x|, relu), "round" (exact op, one rounding: sqrt; only on pos if approx),
# "libm" (may differ by LIBM; exact input only), "tanh" (libm that keeps a bound), "exact"
# (exact input only: sign, isfinite, not)
UNARY = {
    "negative": (NUM, "keep"), "abs": (NUM, "keep"), "relu": (NUM, "keep"),
    "stop_gradient": (DTYPES, "keep"), "sign": (NUM, "exact"), "isfinite": (DTYPES, "exact"),
    "logical_not": (("bool",), "exact"), "sqrt": (FLOATS, "round"), "rsqrt": (FLOATS, "round"),
    "exp": (FLOATS, "libm"), "log": (FLOATS, "libm"), "sin": (FLOATS, "libm"),
    "cos": (FLOATS, "libm"), "sigmoid": (FLOATS, "libm"), "softplus": (FLOATS, "libm"),
    "gelu": (FLOATS, "libm"), "tanh": (FLOATS, "tanh"),
}
UNARY_WEIGHTS = {"negative": 3, "abs": 3, "relu": 1, "stop_gradient": 1, "sign": 1,
                 "isfinite": 1, "logical_not": 1, "sqrt": 2, "rsqrt": 1, "exp": 2, "log": 1,
                 "sin": 1, "cos": 1, "sigmoid": 1, "softplus": 1, "gelu": 1, "tanh": 1}
BINARY = {"add": NUM, "subtract": NUM, "multiply": NUM, "divide": FLOATS, "maximum": NUM,
          "minimum": NUM, "power": NUM, "logical_and": ("bool",), "logical_or": ("bool",)}
BINARY_WEIGHTS = {"add": 4, "subtract": 3, "multiply": 4, "divide": 2, "maximum": 2,
                  "minimum": 2, "power": 1, "logical_and": 1, "logical_or": 1}
OPERATOR = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "power": "**",
            "logical_and": "&", "logical_or": "|"}
COMPARE = {"less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">=",
           "equal": "==", "not_equal": "!="}
EXACT_OPTIMIZERS = ("SGD", "RMSprop", "Adagrad", "Lion")
OPTIMIZERS = ("SGD", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "NAdam", "Adamax", "LAMB",
              "Lion")


class Gen:
    """Writes one random program for a seed (the same program for the same seed)."""

    def __init__(self, seed: int, avoid: frozenset[str] = frozenset(), small: bool = False):
        self.r = random.Random(seed)
        self.seed, self.avoid, self.small = seed, avoid, small
        self.make: list[str] = []
        self.after_step: list[str] = []  # in make(), after the step: its `before(call)` hook
        self.body: list[str] = []
        self.args: list[tuple[str, str]] = []  # (name, data(...) expression)
        self.pool: list[V] = []
        self.outputs: list[tuple[str, Check]] = []
        self.updates: list[tuple[str, Err | None, dict | None]] = []
        self.params: dict[str, Check] = {}
        self.param_sign: dict[str, str] = {}
        self.approx_params: set[str] = set()
        self.names = 0
        self.expect_reject = False
        self.opt_check: Check | None = None
        self.opt_tol, self.opt_dtype = 0.0, "f32"
        self.roles: dict | None = None  # inside a rule body
        self.rule_outputs: list[Check] = []  # returned as *acc, after the others
        self.opt_owned: set[str] = set()
        self.space: tuple = ()

    # -- small helpers ------------------------------------------------------------------------
    def fresh(self, prefix: str = "v") -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def weighted(self, weights: dict) -> Any:
        keys = list(weights)
        return self.r.choices(keys, [weights[k] for k in keys])[0]

    def sub_shape(self, space: tuple) -> tuple:
        """A shape that broadcasts to `space`: trailing dims, some of them 1."""
        if not space:
            return ()
        k = len(space) if self.chance(0.6) else self.r.randint(0, len(space))
        dims = space[len(space) - k:]
        return tuple(d if self.chance(0.8) else 1 for d in dims)

    def data_kind(self, dtype: str, sign: str = "any") -> str:
        if dtype == "bool":
            return "bool"
        if sign != "any":
            return "pos"
        if dtype in INTS:
            return self.weighted({"int": 6, "wideint": 2, "pos": 1})
        return self.weighted({"normal": 10, "special": 3, "pos": 2, "small": 1, "wide": 1,
                              "edge": 2, "int": 1})

    def emit(self, expr: str, shape: tuple | None, dtype: str, err: Err | None = None,
             sign: str = "any", pool: bool = True) -> V:
        name = self.fresh()
        self.body.append(f"{name} = {expr}")
        v = V(name, shape, dtype, err, sign)
        if pool:
            self.pool.append(v)
        return v

    def pick(self, pred: Callable[[V], bool], recent: bool = True) -> V | None:
        cands = [v for v in self.pool if pred(v)]
        if not cands:
            return None
        if recent and self.chance(0.6):
            return cands[-1 - min(int(self.r.expovariate(0.7)), len(cands) - 1)]
        return self.r.choice(cands)

    def literal(self, dtype: str) -> V:
        if dtype == "bool":
            value: Any = self.r.choice([True, False])
            return V(repr(value), (), "pybool", None, "nonneg")
        if dtype in INTS:
            value = self.r.choice(INT_LITERALS)
            kind = "int"
        else:
            value = self.r.choice(FLOAT_LITERALS if dtype != "f16" else FLOAT_LITERALS[:-2])
            kind = "float"
        sign = "pos" if value >= 1e-3 else "nonneg" if value == 0 and \
            math.copysign(1, value) > 0 else "any"
        return V(repr(value), (), kind, None, sign)

    # -- the expression section ---------------------------------------------------------------
    def tensor_arg(self, shape: tuple, dtype: str, sign: str = "any", prefix: str = "a") -> V:
        name = self.fresh(prefix)
        self.args.append((name, f'data(rng, {shape!r}, "{dtype}", '
                                f'"{self.data_kind(dtype, sign)}")'))
        return V(name, shape, dtype, None, "pos" if sign != "any" else "any")

    def scalar_arg(self, dtype: str) -> V:
        name = self.fresh("s")
        self.args.append((name, f'data(rng, (), "{dtype}", "")'))
        return V(name, (), dtype, None, "any")

    def parameter(self, shape: tuple, dtype: str, approx: bool, sign: str = "any",
                  prefix: str = "p") -> V:
        name = self.fresh(prefix)
        self.make.append(f'{name} = go.Parameter(data(rng, {shape!r}, "{dtype}", '
                         f'"{self.data_kind(dtype, sign)}"), name="{name}")')
        self.make.append(f"params.append({name})")
        self.params[name] = Check("bits")
        self.param_sign[name] = sign
        if approx:
            self.approx_params.add(name)
        return V(name, shape, dtype, (lambda env, n=name: env[n]) if approx else None,
                 "pos" if sign != "any" else "any", param=name)

    def expr_section(self) -> None:
        space = self.r.choice(SHAPES)
        if self.chance(0.04):
            space = self.r.choice(BIG_SHAPES)
        elif self.chance(0.02):
            space = self.r.choice(EMPTY_SHAPES)
        self.space = space
        main = self.weighted({"f32": 6, "f64": 3, "f16": 2, "bf16": 2, "i32": 2, "i64": 2,
                              "bool": 1})
        for _ in range(self.r.randint(1, 3)):
            dtype = main if self.chance(0.7) else self.r.choice(DTYPES)
            self.pool.append(self.tensor_arg(self.sub_shape(space), dtype))
        for _ in range(self.r.randint(0, 1)):
            self.pool.append(self.scalar_arg("float" if main in FLOATS else "int"))
        for _ in range(self.r.randint(0, 3)):
            dtype = main if self.chance(0.7) else self.r.choice(DTYPES)
            sign = "pos" if dtype in NUM and self.chance(0.2) else "any"
            shape = space if self.chance(0.6) else self.sub_shape(space)
            self.pool.append(self.parameter(shape, dtype, dtype in FLOATS and self.chance(0.4),
                                            sign))
        for _ in range(self.r.randint(2, 7 if self.small else 11)):
            self.step_op()
        self.pick_outputs()

    def step_op(self) -> None:
        action = self.weighted({"unary": 6, "binary": 7, "compare": 2, "where": 2, "cast": 3,
                                "reduce": 3, "shape": 1, "assign": 4, "invalid": 0.3})
        getattr(self, "op_" + action)()

    def tensors(self, pred: Callable[[V], bool] = lambda v: True) -> V | None:
        return self.pick(lambda v: not v.weak and pred(v))

    def op_unary(self) -> None:
        op = self.weighted(UNARY_WEIGHTS)
        dtypes, kind = UNARY[op]
        x = self.tensors(lambda v: v.dtype in dtypes and
                         (not v.approx or kind in ("keep", "tanh") or
                          (kind == "round" and v.sign == "pos")))
        if x is None:
            return
        d = x.dtype
        if op in ("gelu", "sigmoid"):
            return self.conditioned(op, x)
        err: Err | None = x.err
        rank = x.rank
        if kind == "libm":
            err = e_sum(x.err, c=LIBM[d])
        elif kind == "tanh":
            err = e_sum(x.err, c=LIBM[d])
        elif kind == "round" and x.approx:
            err = e_sum(x.err, c=ULP[d])
        out_dtype = "bool" if op == "isfinite" else d
        if op == "abs" or op == "relu":
            rank = max(rank, 1)
        elif op == "negative":
            rank = 0
        elif op == "exp":
            rank = 2 if rank >= 1 else 1
        elif op in ("sqrt", "rsqrt"):
            rank = 2 if x.sign == "pos" and op == "sqrt" else 1
        elif op in ("sigmoid", "softplus"):
            rank = 1
        elif op in ("log", "sin", "cos", "gelu", "tanh", "sign", "isfinite", "logical_not"):
            rank = 0
        if op == "negative":
            expr = f"-{x.expr}"
        elif op == "abs" and self.chance(0.5):
            expr = f"abs({x.expr})"
        elif op == "logical_not" and self.chance(0.5):
            expr = f"~{x.expr}"
        else:
            expr = f"ops.{op}({x.expr})"
        self.emit(expr, x.shape, out_dtype, err, _sign_of(rank))

    def conditioned(self, op: str, x: V) -> None:
        """gelu and sigmoid are formulas around a libm call that magnify its last-bit
        difference: gelu's 1 + tanh(z) cancels for x << 0 (an absolute error of about
        |x| ulp), sigmoid's exp(-softplus(-x)) multiplies it by softplus(-x) <= 1 + |x|. So
        their results end here, compared with |x| (a companion output) as the scale."""
        if self.roles is not None:
            return
        v = self.emit(f"ops.{op}({x.expr})", x.shape, x.dtype, pool=False)
        companion = self.emit(f"ops.abs({x.expr})", x.shape, x.dtype, sign="nonneg")
        err = e_sum(c=LIBM[x.dtype])
        index = len(self.outputs) + 1
        check = Check("close", err, scale=index) if op == "gelu" else \
            Check("close", err, rel=index)
        self.outputs += [(v.expr, check), (companion.expr, Check("bits"))]

    def operand(self, x: V, exact_only: bool = False) -> V | None:
        """A second operand for x: a literal, or a value of its dtype that broadcasts with it
        (cast to x's dtype now and then)."""
        if self.chance(0.3) or x.dtype == "bool" and self.chance(0.3):
            return self.literal(x.dtype)
        y = self.tensors(lambda v: broadcast(x.shape, v.shape) is not False and
                         (v.dtype == x.dtype or self.chance(0.15)) and
                         not (exact_only and v.approx))
        if y is None:
            return self.literal(x.dtype)
        if y.dtype != x.dtype:
            if y.approx and x.dtype not in FLOATS:
                return self.literal(x.dtype)
            y = self.cast(y, x.dtype)
        return y

    def cast(self, x: V, dtype: str, pool: bool = False) -> V:
        form = self.r.choice([f'{x.expr}.astype("{dtype}")', f'ops.cast({x.expr}, "{dtype}")'])
        err = None
        if x.approx:
            err = e_sum(x.err, c=ULP[dtype]) if ULP[dtype] > ULP.get(x.dtype, 0) else x.err
        sign = x.sign if dtype in FLOATS else "nonneg" if x.rank and dtype in INTS else "any"
        if dtype in FLOATS and x.dtype == "bool":
            sign = "nonneg"
        return self.emit(form, x.shape, dtype, err, sign, pool=pool)

    def op_binary(self) -> None:
        op = self.weighted(BINARY_WEIGHTS)
        x = self.tensors(lambda v: v.dtype in BINARY[op] and
                         (not v.approx or op in ("add", "multiply", "divide", "maximum",
                                                 "minimum")))
        if x is None:
            return
        exact_only = op in ("subtract", "power", "logical_and", "logical_or")
        if op == "power":
            y = self.literal(x.dtype)
            if x.dtype in INTS:
                # -1: numpy refuses an integer to a negative power (outside rule bodies,
                # where it would not be returned)
                exponents = [0, 1, 2, 3] + ([-1] if self.roles is None else [])
                y = V(repr(self.r.choice(exponents)), (), "int", None, "nonneg")
            elif self.chance(0.5):
                y = V(repr(self.r.choice([2, 2.0, 0.5, 3, -1.0, 1.5])), (), "float")
        else:
            y = self.operand(x, exact_only)
        if y is None:
            return
        if (x.approx or y.approx):
            if op == "add" and not (x.rank >= 1 and y.rank >= 1):
                return
            if op == "divide" and y.sign != "pos":
                return
        d = x.dtype
        shape = broadcast(x.shape, y.shape)
        if shape is False:
            return
        if op == "power" and d in FLOATS and y.expr not in ("2", "2.0"):
            err = e_sum(x.err, y.err, c=LIBM[d])
        elif op in ("add", "maximum", "minimum"):
            err = e_max(x.err, y.err, c=ULP[d] if op == "add" and (x.approx or y.approx)
                        else 0.0)
        elif x.approx or y.approx:
            err = e_sum(x.err, y.err, c=ULP[d])
        else:
            err = None
        ranks = (x.rank, y.rank)
        if op == "add":
            rank = max(ranks) if min(ranks) >= 1 else 0
        elif op == "multiply":
            rank = 1 if min(ranks) >= 1 or x.expr == y.expr else 0
        elif op == "divide":
            rank = 1 if min(ranks) >= 1 else 0
        elif op == "maximum":
            rank = max(ranks)
        elif op == "minimum":
            rank = min(ranks)
        elif op == "power":
            rank = 1 if y.expr in ("2", "2.0") or x.rank >= 1 else 0
        else:
            rank = 0
        a, b = (y, x) if y.weak and self.chance(0.3) and op != "power" else (x, y)
        if op in OPERATOR and self.chance(0.7):
            expr = f"{a.expr} {OPERATOR[op]} {b.expr}"
        else:
            expr = f"ops.{op}({a.expr}, {b.expr})"
        v = self.emit(expr, shape, d, err, _sign_of(rank))
        if op == "power" and d in INTS and y.expr.startswith("-"):
            # numpy refuses it when the step runs: returned, so that jit runs it too (eager
            # runs every op; jit only what the return reaches)
            self.outputs.append((v.expr, Check("bits")))

    def op_compare(self) -> None:
        op = self.r.choice(list(COMPARE))
        x = self.tensors(lambda v: not v.approx and (v.dtype in NUM or op in ("equal",
                                                                             "not_equal")))
        if x is None:
            return
        y = self.operand(x, exact_only=True)
        if y is None or y.approx or broadcast(x.shape, y.shape) is False:
            return
        shape = broadcast(x.shape, y.shape)
        if self.chance(0.6):
            expr = f"{x.expr} {COMPARE[op]} {y.expr}"
        else:
            expr = f"ops.{op}({x.expr}, {y.expr})"
        self.emit(expr, shape, "bool")

    def op_where(self) -> None:
        c = self.tensors(lambda v: v.dtype == "bool" and not v.approx)
        if c is None:
            return self.op_compare()
        x = self.tensors(lambda v: broadcast(c.shape, v.shape) is not False)
        if x is None:
            return
        y = self.operand(x)
        if y is None:
            return
        shape = broadcast(broadcast(c.shape, x.shape), y.shape)
        if shape is False:
            return
        a, b = (x, y) if self.chance(0.5) else (y, x)
        if a.weak and b.weak:
            return
        self.emit(f"ops.where({c.expr}, {a.expr}, {b.expr})", shape, x.dtype,
                  e_max(x.err, y.err), _sign_of(min(x.rank, y.rank)))

    def op_cast(self) -> None:
        x = self.tensors()
        if x is None:
            return
        targets = FLOATS if x.approx else DTYPES
        dtype = self.r.choice([t for t in targets if t != x.dtype] or list(targets))
        if x.dtype in FLOATS and dtype in INTS and not x.approx and self.chance(0.5):
            x = self.emit(f"{x.expr} * 100.0", x.shape, x.dtype)  # past the fraction
        self.cast(x, dtype, pool=True)

    def op_reduce(self) -> None:
        op = self.weighted({"sum": 4, "max": 2, "mean": 2})
        x = self.tensors(lambda v: v.dtype in (FLOATS if op == "mean" else NUM) and
                         v.shape is not None)
        if x is None:
            return
        nd = len(x.shape)
        keep = self.chance(0.3)
        form = self.r.random()
        if form < 0.4 or nd == 0:
            axes, arg = tuple(range(nd)), ""
        elif form < 0.75:
            a = self.r.randrange(nd)
            axes, arg = (a,), f"axis={a - nd if self.chance(0.3) else a}"
        else:
            axes = tuple(sorted(self.r.sample(range(nd), self.r.randint(1, nd))))
            arg = f"axis={axes!r}"
        if keep:
            arg = f"{arg}, keepdims=True" if arg else "keepdims=True"
        shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape)) if keep else \
            tuple(s for i, s in enumerate(x.shape) if i not in axes)
        full = len(axes) == nd and not keep
        # A reduction over the leading axes is a kernel output too ("sum@k"), and one over the
        # last axes with keepdims a row reduction inside a kernel: summed natively.
        trailing = bool(axes) and axes[0] >= 1 and axes == tuple(range(axes[0], nd))
        native = full or (not keep and axes == tuple(range(len(axes)))) or (keep and trailing)
        n = int(np.prod([x.shape[i] for i in axes])) if axes else 1
        d = x.dtype
        method = self.chance(0.5)

        def form(operand: str) -> str:
            return f"{operand}.{op}({arg})" if method else \
                f"ops.{op}({operand}{', ' + arg if arg else ''})"
        expr = form(x.expr)
        if d in INTS:
            self.emit(expr, shape, d)
            return
        if op == "max":
            err = e_max(x.err, c=0.0) if native or x.approx else None
            if native and err is None:
                err = lambda env: 0.0  # noqa: E731  (equal values: +0 and -0 may differ)
            self.emit(expr, shape, d, err, x.sign if n else "any")
            return
        # (a reduction over other axes runs through numpy in every mode: exact on exact values)
        tol = reduce_tol(d, n) + ULP[d]
        err = e_sum(x.err, c=tol) if native or x.approx else None
        if x.rank >= 1:
            self.emit(expr, shape, d, err, "nonneg" if op == "sum" else x.sign)
            return
        if err is None:  # a reduction over other axes of exact values: numpy in every mode
            self.emit(expr, shape, d)
            return
        # Values of both signs: the sum ends here, compared against its sum of |x|.
        v = self.emit(expr, shape, d, err, pool=False)
        scale = self.emit(form(f"ops.abs({x.expr})"), shape, d, err, "nonneg")
        self.outputs.append((v.expr, Check("close", err, scale=-1, roles=self.roles)))
        self.outputs.append((scale.expr, Check("close", err, roles=self.roles)))
        self.outputs[-2][1].scale = len(self.outputs) - 1

    def op_shape(self) -> None:
        x = self.tensors(lambda v: v.shape is not None)
        if x is None:
            return
        choice = self.r.randrange(3)
        size = int(np.prod(x.shape, dtype=np.int64))
        if choice == 0:
            target = self.space if size == int(np.prod(self.space, dtype=np.int64)) and \
                self.chance(0.5) else (size,)
            if target == (size,) and self.chance(0.5):
                expr = f"ops.reshape({x.expr}, -1)"
            else:
                expr = f"{x.expr}.reshape({target!r})"
            shape = tuple(target)
        elif choice == 1 and len(x.shape) >= 2:
            expr, shape = f"{x.expr}.T", tuple(reversed(x.shape))
        else:
            if broadcast(x.shape, self.space) != self.space:
                return
            expr, shape = f"ops.broadcast_to({x.expr}, {self.space!r})", self.space
        self.emit(expr, shape, x.dtype, x.err, x.sign)

    def op_assign(self) -> None:
        p = self.pick(lambda v: v.param is not None and v.param in self.params and
                      v.param not in self.opt_owned, recent=False)
        if p is None:
            return
        name = p.param
        approx_ok = name in self.approx_params
        need = RANK[self.param_sign[name]]
        if self.chance(0.1):
            v = self.literal(p.dtype)
            if v.rank < need or (v.dtype == "float" and p.dtype not in FLOATS):
                return
            self.body.append(f"go.assign({name}, {v.expr})")
            value = V(name, p.shape, p.dtype, None, v.sign, param=name)
        else:
            v = self.tensors(lambda u: broadcast(u.shape, p.shape) == p.shape and
                             (approx_ok or not u.approx) and u.rank >= need and
                             (not u.approx or p.dtype in FLOATS) and u.param != name)
            if v is None:
                return
            if v.dtype != p.dtype:
                v = self.cast(v, p.dtype)
            target = p.shape if p.shape is not None else f"{name}.shape"
            expr = v.expr if v.shape == p.shape else f"ops.broadcast_to({v.expr}, {target})"
            self.body.append(f"go.assign({name}, {expr})")
            value = V(name, p.shape, p.dtype, v.err, v.sign, param=name)
        if approx_ok and value.err is None:
            value.err = lambda env: 0.0  # noqa: E731  (still read as approximate)
        if v.approx:
            self.params[name] = Check("close", roles=self.roles)
        self.updates.append((name, value.err if v.approx else None, self.roles))
        self.pool = [u for u in self.pool if u.param != name] + [value]

    def op_invalid(self) -> None:
        """Something graphopt must reject: it should, in every mode alike."""
        x = self.tensors()
        if x is None:
            return
        self.expect_reject = True
        kind = self.r.randrange(5)
        if kind == 0:
            other = next((d for d in NUM if d != x.dtype), "f32")
            self.body.append(f"{self.fresh()} = {x.expr} + {x.expr}.astype(\"{other}\")")
        elif kind == 1:
            self.body.append(f"{self.fresh()} = ops.mean({x.expr}.astype(\"i32\"))")
        elif kind == 2:
            self.body.append(f"{self.fresh()} = ops.sqrt({x.expr}.astype(\"i64\"))")
        elif kind == 3:
            self.body.append(f"{self.fresh()} = ops.where({x.expr}.astype(\"f32\"), 1.0, 0.0)")
        else:
            self.body.append(f"{self.fresh()} = ops.reshape({x.expr}, (-1, 1000003))")

    def pick_outputs(self) -> None:
        made = [v for v in self.pool if not v.weak and v.param is None]
        k = min(len(made), self.r.randint(0 if self.updates else 1, 4))
        chosen = self.r.sample(made[-6:], min(k, len(made[-6:])))
        if self.chance(0.1):
            reads = [v for v in self.pool if v.param is not None]
            if reads:
                chosen.append(self.r.choice(reads))
        for v in chosen:
            self.outputs.append((v.expr, Check("close", v.err) if v.approx else Check("bits")))

    def instance_shapes(self, n: int, menu: list[tuple]) -> list[tuple]:
        """Shapes of the tensors one rule is mapped over (a 0-d one first now and then)."""
        shapes = [self.r.choice(menu) for _ in range(n)]
        if self.chance(0.15):
            shapes[0] = ()
        return shapes

    # -- the rule section: one update rule over several Parameters (hfuse) ---------------------
    def rule_section(self) -> None:
        """`for w, m, g in ((w1, m2, g3), ...):` and a body written once over the roles w (a
        Parameter), m (its state, if any) and g (its gradient): the tracer makes one copy per
        Parameter, hfuse maps them into one multi-tensor kernel."""
        d = self.weighted({"f32": 5, "f64": 2, "f16": 1, "bf16": 1, "i32": 1})
        shapes = self.instance_shapes(self.r.randint(2, 4),
                                      [(4, 3), (7,), (), (2, 3, 5), (33,), (1, 6), (16, 16)])
        approx = d in FLOATS and self.chance(0.4)
        with_state = self.chance(0.6)
        sign = "pos" if self.chance(0.2) else "any"
        rows, instances = [], []
        for s in shapes:
            w = self.parameter(s, d, approx, sign, prefix="w")
            m = self.parameter(s, d, approx, sign, prefix="m") if with_state else None
            g = self.tensor_arg(s, d, prefix="g")
            rows.append("(" + ", ".join(x.expr for x in (w, m, g) if x is not None) + ")")
            instances.append({"w": w.param, **({"m": m.param} if m else {})})
        shared = [self.scalar_arg("float" if d in FLOATS else "int")] if self.chance(0.6) else []
        if self.chance(0.4):
            shared.append(self.tensor_arg((), d, prefix="c"))
        roles = ["w", "m"] if with_state else ["w"]
        # The body is generated with the roles standing for parameters of an unknown shape.
        saved = (self.pool, self.body, self.updates, self.params, self.space)
        self.pool = [V(r, None, d, (lambda env, r=r: env[r]) if approx else None,
                       "pos" if sign != "any" else "any", param=r) for r in roles]
        self.pool += [V("g", None, d)] + shared
        self.body, self.updates, self.space = [], [], ()
        self.params = {r: Check("bits") for r in roles}
        self.param_sign.update({r: sign for r in roles})
        self.approx_params |= set(roles) if approx else set()
        self.roles = {r: r for r in roles}
        for _ in range(self.r.randint(2, 6)):
            action = self.weighted({"unary": 5, "binary": 7, "where": 1, "compare": 1,
                                    "cast": 1, "assign": 4})
            getattr(self, "op_" + action)()
        if not self.updates:
            self.op_assign()
        reduced = []
        for _ in range(self.r.randint(0, 2)):
            x = self.tensors(lambda v: v.shape is None and v.dtype in NUM and
                             (v.rank >= 1 or not v.approx))
            if x is None:
                break
            op = self.r.choice(["sum", "max"] if x.dtype in INTS else ["sum", "max", "mean"])
            if op != "max" and x.rank == 0 and x.dtype in FLOATS:  # a sum of squares
                x = self.emit(f"{x.expr} * {x.expr}", None, x.dtype,
                              e_sum(x.err, x.err, c=ULP[x.dtype]) if x.approx else None,
                              "nonneg")
            err = None
            if x.dtype in FLOATS:
                err = e_max(x.err, c=0.0) if op == "max" else \
                    e_sum(x.err, c=reduce_tol(x.dtype, 256) + ULP[x.dtype])
            self.body.append(f"acc.append({x.expr}.{op}())")
            reduced.append(Check("close", err) if err else Check("bits"))
        body, updates, checks = self.body, self.updates, self.params
        self.pool, self.body, self.updates, self.params, self.space = saved
        self.approx_params -= set(roles)
        self.roles = None
        self.body.append("acc = []")
        self.body.append(f"for {', '.join(roles)}, g in ({', '.join(rows)},):")
        self.body += ["    " + line for line in body] or ["    pass"]
        for inst in instances:
            for role, pname in inst.items():
                self.params[pname] = Check(checks[role].kind)
            self.updates += [(inst[role], err, inst) for role, err, _ in updates]
            self.rule_outputs += [Check(c.kind, c.err, roles=inst) for c in reduced]

    # -- the optimizer section ----------------------------------------------------------------
    def optim_section(self) -> None:
        kind = self.r.choice(OPTIMIZERS)
        n = self.r.randint(1, 4)
        dtypes = [self.weighted({"f32": 6, "f64": 2, "f16": 1, "bf16": 1}) for _ in range(n)]
        if self.chance(0.6):
            dtypes = [dtypes[0]] * n  # one batch: mapped by hypermap
        shapes = self.instance_shapes(n, [(4, 3), (7,), (), (2, 3, 5), (33,), (16, 16), (5, 1)])
        ws = []
        for s, d in zip(shapes, dtypes):
            name = self.fresh("o")
            self.make.append(f'{name} = go.Parameter(data(rng, {s!r}, "{d}", "normal"), '
                             f'name="{name}")')
            ws.append(name)
        self.opt_owned = set(ws)
        hp = self.hyper(kind)
        groups = self.groups(kind, ws)
        lr, lr_exact = self.schedule()
        if self.chance(0.3):  # hyper-parameters are data: changed between calls, no retrace
            g = self.r.randrange(groups.count('"params"') or 1)
            key, value = ("lr", self.r.choice([0.02, 0.3])) if lr_exact and "schedules" not in lr \
                else ("weight_decay", self.r.choice([0.0, 0.02]))
            self.after_step += ["def before(call):  # between calls",
                                f'    opt.param_groups[{g}]["{key}"] = {value} * call',
                                "step.before = before"]
        extra = ""
        if self.chance(0.2):
            extra += f', state_dtype="{self.r.choice(["bf16", "f32", "f16"])}"'
        if any(d in ("f16", "bf16") for d in dtypes) and self.chance(0.3):
            extra += ", master_weights=False"
        self.make.append(f"opt = optim.{kind}({groups}, lr={lr}{hp}{extra})")
        accumulate = self.chance(0.15)
        if accumulate:
            self.make.append(f"acc_opt = optim.Accumulate(opt, steps={self.r.randint(1, 3)})")
            self.make.append(f"params += [{', '.join(ws)}] + acc_opt.parameters()")
        else:
            self.make.append(f"params += [{', '.join(ws)}] + opt.parameters()")
        grads = []
        one_scalar = self.scalar_arg("float") if self.chance(0.5) else None
        for w, s, d in zip(ws, shapes, dtypes):
            gd = "f32" if d in ("f16", "bf16") and self.chance(0.5) else d
            g = self.tensor_arg(s, gd, prefix="og")
            form = self.r.randrange(5)
            if form == 1:
                k = one_scalar or self.scalar_arg("float")
                g = self.emit(f"{g.expr} * {k.expr}", s, gd, pool=False)
            elif form == 2:
                g = self.emit(f"ops.where(ops.isfinite({g.expr}), {g.expr}, 0.0)", s, gd,
                              pool=False)
            elif form == 3:
                g = self.emit(f"ops.minimum(ops.maximum({g.expr}, -1.0), 1.0)", s, gd,
                              pool=False)
            grads.append(g.expr)
        approx = kind not in EXACT_OPTIMIZERS or not lr_exact
        gl = self.fresh("grads")
        self.body.append(f"{gl} = [{', '.join(grads)}]")
        transform = self.weighted({"none": 6, "value": 1, "norm": 2, "center": 1})
        norm_err = LIBM["f32"] * 4 + reduce_tol("f32", 1024) * 2
        if transform == "value":
            self.body.append(f"{gl} = optim.clip_grad_value({gl}, {self.r.choice([0.1, 1.0])})")
        elif transform == "center":  # (a mean over each row: a row reduction, native)
            self.body.append(f"{gl} = optim.centralize_gradients({gl})")
            approx = True
        elif transform == "norm":
            total = self.fresh("norm")
            self.body.append(f"{gl}, {total} = optim.clip_grad_norm({gl}, "
                             f"{self.r.choice([0.5, 1.0, 10.0])})")
            approx = True
            self.outputs.append((total, Check("close", lambda env: norm_err)))
        where = ""
        if self.chance(0.2):
            c = self.tensor_arg((), "f32", prefix="cond")
            where = f", where=ops.greater({c.expr}, 0.0)"
        if accumulate:
            ready = self.fresh("ready")
            self.body.append(f"{ready} = acc_opt.step({gl}{where})")
            self.outputs.append((ready, Check("bits")))
        else:
            self.body.append(f"opt.step({gl}{where})")
        compute = ["f32" if d in ("f16", "bf16") else d for d in dtypes]
        stored = dtypes + (["bf16"] if "bf16" in extra else ["f16"] if '"f16"' in extra else [])
        self.opt_dtype = max(stored, key=lambda d: ULP[d])
        if approx:
            units = max(LIBM[c] for c in compute) + 4 * max(reduce_tol(c, 1024) for c in compute)
            self.opt_check, self.opt_tol = Check("opt"), units
        else:
            self.opt_check = Check("bits")

    def hyper(self, kind: str) -> str:
        c = self.r.choice
        if kind == "SGD":
            mom = c([0.0, 0.5, 0.9])
            damp = c([0.0, 0.0, 0.1])
            nest = mom > 0 and damp == 0 and self.chance(0.5)
            return (f", momentum={mom}, dampening={damp}, weight_decay={c([0.0, 1e-4, 0.01])}"
                    f", nesterov={nest}, maximize={self.chance(0.15)}")
        wd = c([0.0, 0.0, 1e-4, 0.01, 0.1])
        betas = f"({c([0.0, 0.5, 0.9])}, {c([0.9, 0.99, 0.999])})"
        eps = c([1e-8, 1e-6, 1e-3])
        if kind in ("Adam", "AdamW"):
            out = f", betas={betas}, eps={eps}, weight_decay={wd}, amsgrad={self.chance(0.3)}"
            if kind == "Adam" and self.chance(0.2):
                out += ", decoupled_weight_decay=True"
            return out
        if kind == "NAdam":
            return (f", betas={betas}, eps={eps}, weight_decay={wd}, momentum_decay="
                    f"{c([4e-3, 0.01])}, decoupled_weight_decay={self.chance(0.3)}")
        if kind in ("Adamax", "LAMB"):
            return f", betas={betas}, eps={eps}, weight_decay={wd}"
        if kind == "Adagrad":
            return (f", lr_decay={c([0.0, 0.01])}, weight_decay={wd}, initial_accumulator_value="
                    f"{c([0.0, 0.1])}, eps={c([1e-10, 1e-6])}")
        if kind == "RMSprop":
            return (f", alpha={c([0.9, 0.99])}, eps={eps}, weight_decay={wd}, momentum="
                    f"{c([0.0, 0.9])}, centered={self.chance(0.4)}")
        return f", betas={betas}, weight_decay={wd}"  # Lion

    def groups(self, kind: str, ws: list[str]) -> str:
        if len(ws) < 2 or self.chance(0.5):
            return f"[{', '.join(ws)}]"
        cut = self.r.randint(1, len(ws) - 1)
        override = self.r.choice([f'"lr": {self.r.choice([0.02, 0.2])}',
                                  f'"weight_decay": {self.r.choice([0.0, 0.05])}'])
        if kind == "SGD" and self.chance(0.3):
            override = '"momentum": 0.8'
        return (f'[{{"params": [{", ".join(ws[:cut])}], {override}}}, '
                f'{{"params": [{", ".join(ws[cut:])}]}}]')

    def schedule(self) -> tuple[str, bool]:
        lr = self.r.choice([1e-3, 0.01, 0.1, 0.5])
        form = self.weighted({"number": 6, "Constant": 1, "LinearWarmup": 1,
                              "ExponentialDecay": 1, "StepDecay": 1, "CosineDecay": 1,
                              "WarmupCosine": 1})
        if form == "number":
            return repr(lr), True
        args = {"Constant": f"{lr}", "LinearWarmup": f"{lr}, 2", "ExponentialDecay": f"{lr}, 0.9",
                "StepDecay": f"{lr}, 2, 0.5", "CosineDecay": f"{lr}, 4",
                "WarmupCosine": f"{lr}, 1, 4"}[form]
        return f"optim.schedules.{form}({args})", form in ("Constant", "LinearWarmup")

    # -- the whole program --------------------------------------------------------------------
    def program(self) -> Program:
        # One main section, sometimes a second one: every kernel is compiled once per CPU
        # level, and compiling is most of a program's time.
        wanted = {self.weighted({"expr": 60, "rule": 25, "optim": 15} if self.small else
                                {"expr": 57, "rule": 21, "optim": 22})}
        if self.chance(0.15) and not self.small:
            wanted.add(self.r.choice(["expr", "rule", "optim"]))
        sections = [s for s in ("optim", "expr", "rule") if s in wanted]
        for s in sections:
            getattr(self, s + "_section")()
        calls = self.r.randint(2, 3)
        mseed, cseed = self.r.randrange(2 ** 32), self.r.randrange(2 ** 32)
        ret = ", ".join([e for e, _ in self.outputs] + (["*acc"] if self.rule_outputs else []))
        lines = ["def make():", f"    rng = np.random.default_rng({mseed})", "    params = []"]
        lines += ["    " + x for x in self.make]
        lines += ["", f"    def step({', '.join(a for a, _ in self.args)}):"]
        lines += ["        " + x for x in self.body]
        lines.append(f"        return ({ret},)" if ret else "        return None")
        lines += [""] + ["    " + x for x in self.after_step] + ([""] if self.after_step else [])
        lines += ["    return step, params", "", "", "def calls():",
                  f"    rng = np.random.default_rng({cseed})",
                  f"    return [({''.join(e + ', ' for _, e in self.args)}) "
                  f"for _ in range({calls})]"]
        return Program(self.seed, "\n".join(lines) + "\n", sections,
                       [c for _, c in self.outputs] + self.rule_outputs, self.updates,
                       self.params, self.opt_check, self.opt_tol, self.opt_dtype,
                       self.expect_reject)


def generate(seed: int, avoid: frozenset[str] = frozenset(), small: bool = False) -> Program:
    """The program of a seed. `small`: one section and fewer ops (tests/test_fuzz.py)."""
    return Gen(seed, avoid, small).program()


# -- running a program in one mode ------------------------------------------------------------
HEADER = "import numpy as np\nimport graphopt as go\nfrom graphopt import ops, optim\n"


def namespace(program: Program) -> dict:
    """The program's functions, defined afresh (each mode makes its own Parameters)."""
    import graphopt as go
    from graphopt import ops, optim
    if program.code is None:
        program.code = compile(program.source, f"<fuzz program {program.seed}>", "exec")
    ns = {"np": np, "go": go, "ops": ops, "optim": optim, "data": data}
    exec(program.code, ns)
    return ns


def standalone(program: Program) -> str:
    """The program as a script of its own: imports, `data`, the program, a run of it."""
    import inspect
    helpers = "\n\n".join(inspect.getsource(f) for f in (_np_dtype, _edges, data))
    consts = (f"INTS = {INTS!r}\n_SPECIAL = {_SPECIAL!r}\n_INT_EDGES = {_INT_EDGES!r}\n"
              f"_I64_EDGES = {_I64_EDGES!r}\nnan, inf = np.nan, np.inf\n")
    run = ("\n\nif __name__ == \"__main__\":\n    step, params = make()\n"
           "    step = go.jit(step, backend=\"llvm\")  # or backend=\"interpreter\", or no jit\n"
           "    for args in calls():\n        print(step(*args))\n"
           "    print({p.name: p.numpy() for p in params})\n")
    return f"{HEADER}from typing import Any\n\n{consts}\n\n{helpers}\n\n# program {program.seed}: " \
        f"{', '.join(program.sections)}\n{program.source}{run}"


@dataclass
class Run:
    """What one mode did: per call its outputs and every Parameter's value; or how it failed."""

    mode: str
    before: dict = field(default_factory=dict)  # the Parameters before the first call
    calls: list = field(default_factory=list)  # [(outputs, {name: array})]
    failure: tuple | None = None  # ("rejected" | "crash", call index, error class, message)
    kernels: int = 0  # compiled kernels (llvm), from the disk cache or compiled now
    compiled: int = 0  # of which compiled now
    traces: int = 0  # jit: how often the step was traced (once: every call has one signature)
    cpus: set = field(default_factory=set)


def _leaves(out: Any) -> list:
    if out is None:
        return []
    if isinstance(out, (tuple, list)):
        return [x for o in out for x in _leaves(o)]
    return [out]


def _snapshot(x: Any) -> np.ndarray:
    if hasattr(x, "numpy"):
        return np.array(x.numpy())
    return np.array(x)


def run_mode(program: Program, mode: str, on_mode: Callable[[str], None] = lambda m: None) -> Run:
    """Run every call of the program in one mode: "eager", "interpreter" or "llvm:<level>"."""
    import graphopt as go
    from graphopt import envvars
    from graphopt.errors import GraphoptError
    on_mode(mode)
    run = Run(mode)
    level = mode.split(":", 1)[1] if mode.startswith("llvm:") else None
    ns = namespace(program)
    call = -1
    try:
        with envvars.override(GRAPHOPT_CPU=level) if level else _nothing():
            step, params = ns["make"]()
            run.before = {p.name: p.numpy() for p in params}
            if mode == "eager":
                fn = step
            else:
                fn = go.jit(step, backend="interpreter" if mode == "interpreter" else "llvm")
            before = getattr(step, "before", lambda call: None)
            for call, args in enumerate(ns["calls"]()):
                before(call)
                if mode == "eager":
                    args = [go.EagerTensor(a) if isinstance(a, np.ndarray) else a for a in args]
                outputs = [_snapshot(o) for o in _leaves(fn(*args))]
                run.calls.append((outputs, {p.name: p.numpy() for p in params}))
            if mode != "eager":
                run.traces = fn.cache_info().traces
            if level:
                for exe in fn._cache.values():
                    run.kernels += len(exe.kernels)
                    run.compiled += sum(not k.cache_hit for k in exe.kernels)
                    run.cpus |= {k.key_parts.get("cpu", "?") for k in exe.kernels}
    except GraphoptError as e:
        run.failure = ("rejected", call, type(e).__name__, _first_line(e))
    except Exception as e:  # noqa: BLE001  (anything else is a crash of graphopt)
        where = traceback.extract_tb(e.__traceback__)[-1]
        run.failure = ("crash", call, type(e).__name__,
                       f"{_first_line(e)} (at {os.path.basename(where.filename)}:{where.lineno})")
    return run


class _nothing:
    def __enter__(self): return None
    def __exit__(self, *exc): return False


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""


# -- comparing a mode with the reference ------------------------------------------------------
def _float64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


def _dtype_name(a: np.ndarray) -> str:
    return {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
            "int32": "i32", "int64": "i64", "bool": "bool"}.get(a.dtype.name, a.dtype.name)


def differ(got: np.ndarray, want: np.ndarray, bound: np.ndarray | float | None) -> np.ndarray:
    """Where got and want differ: bit for bit (bound None) or by more than the bound (per
    element, absolute). NaN equals NaN."""
    if not _is_float(want):
        return got != want
    g, w = _float64(got), _float64(want)
    nan = np.isnan(g) & np.isnan(w)
    if bound is None:
        bits = got.view(np.dtype(f"u{got.dtype.itemsize}")) != \
            want.view(np.dtype(f"u{want.dtype.itemsize}"))
        return bits & ~nan
    with np.errstate(all="ignore"):
        close = (g == w) | nan | (np.abs(g - w) <= bound)
        # At the overflow threshold one side may round to inf and the other stay finite.
        top = 65504.0 if want.dtype == np.float16 else 3.3895e38 if _dtype_name(want) == "bf16" \
            else float(np.finfo(want.dtype).max)
        one_inf = (np.isinf(g) != np.isinf(w)) & (np.sign(g) == np.sign(w))
        finite = np.where(np.isinf(g), np.abs(w), np.abs(g))
        edge = one_inf & (finite >= 0.99 * top)
    return ~(close | edge)


def _tiny(a: np.ndarray) -> float:
    return {"f16": 6.1e-5, "bf16": 1.2e-38, "f32": 1.2e-38, "f64": 2.3e-308}[_dtype_name(a)]


def describe(got: np.ndarray, want: np.ndarray, bad: np.ndarray, bound: Any) -> str:
    idx = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
    g, w = got[idx], want[idx]
    rule = "bits" if bound is None else \
        f"bound {float(bound[idx] if np.ndim(bound) else bound):.3g}"
    return (f"{int(bad.sum())} of {bad.size} differ, first at {list(idx)}: {g!r} vs {w!r} "
            f"(reference), {rule}")


def compare(program: Program, ref: Run, other: Run, exact: bool) -> list[str]:
    """What differs between a mode and the reference: one line per problem. `exact`: every
    value bit for bit (eager), else by the program's checks."""
    problems: list[str] = []
    if ref.failure or other.failure:
        if ref.failure and other.failure and ref.failure[:3] == other.failure[:3]:
            return []
        say = lambda f: "ran every call" if f is None else \
            f"{'raised' if f[0] == 'rejected' else 'crashed with'} {f[2]} at call {f[1]}: {f[3]}"  # noqa: E731
        problems.append(f"{other.mode} {say(other.failure)}; interpreter {say(ref.failure)}")
        return problems
    if other.traces > 1:
        problems.append(f"{other.mode}: traced {other.traces} times for calls of one signature")
    bounds = program.bounds(len(ref.calls))
    travelled: dict[str, np.ndarray] = {}
    previous = ref.before
    for k, ((r_out, r_par), (o_out, o_par)) in enumerate(zip(ref.calls, other.calls)):
        if len(r_out) != len(o_out):
            problems.append(f"call {k}: {len(o_out)} outputs, the reference {len(r_out)}")
            break
        for j, (got, want) in enumerate(zip(o_out, r_out)):
            check = program.outputs[j] if j < len(program.outputs) else Check("bits")
            bound = None
            if not exact and check.kind != "bits":
                err = check.err(_local(bounds[k], check.roles)) if check.err else 0.0
                scale = np.abs(_float64(r_out[check.scale])) if check.scale is not None else 0.0
                rel = np.abs(_float64(r_out[check.rel])) if check.rel is not None else 0.0
                if _is_float(want):
                    bound = SAFETY * err * (np.abs(_float64(want)) * (1 + rel) + scale +
                                            _tiny(want))
            p = _problem(f"output {j}", k, got, want, bound)
            if p:
                problems.append(f"{other.mode}: {p}")
        for name, want in r_par.items():
            got = o_par.get(name)
            check = program.param_check(name)
            bound = None
            if not exact and check.kind == "close" and _is_float(want):
                err = bounds[k + 1].get(name, 0.0)
                bound = SAFETY * err * (np.abs(_float64(want)) + _tiny(want))
            elif not exact and check.kind == "opt" and _is_float(want):
                with np.errstate(all="ignore"):
                    step = np.abs(_float64(want) - _float64(previous[name]))
                travelled[name] = travelled.get(name, 0.0) + np.nan_to_num(step, nan=0.0)
                tol = SAFETY * (k + 1) * (program.opt_tol + 2 * ULP[program.opt_dtype])
                bound = tol * (np.abs(_float64(want)) + travelled[name] + _tiny(want))
            p = _problem(f"parameter {name}", k, got, want, bound)
            if p:
                problems.append(f"{other.mode}: {p}")
        previous = r_par
        if len(problems) > 6:
            break
    return problems


def _problem(what: str, call: int, got: np.ndarray | None, want: np.ndarray,
             bound: Any) -> str | None:
    if got is None:
        return f"call {call}: {what} missing"
    if got.dtype != want.dtype or got.shape != want.shape:
        return (f"call {call}: {what} is {_dtype_name(got)}{list(got.shape)}, the reference "
                f"{_dtype_name(want)}{list(want.shape)}")
    bad = differ(got, want, bound)
    if bad.any():
        return f"call {call}: {what} ({_dtype_name(want)}{list(want.shape)}): " \
               f"{describe(got, want, bad, bound)}"
    return None


# -- one program, all modes -------------------------------------------------------------------
def modes_for(levels: list[str]) -> list[str]:
    return ["interpreter", "eager"] + [f"llvm:{level}" for level in levels]


def check_program(seed: int, levels: list[str], avoid: frozenset[str] = frozenset(),
                  on_mode: Callable[[str], None] = lambda m: None,
                  keep_runs: bool = False, small: bool = False) -> dict:
    """Generate, run and compare one program. The result is small and picklable."""
    start = time.perf_counter()
    program = generate(seed, avoid, small)
    runs = {m: run_mode(program, m, on_mode) for m in modes_for(levels)}
    ref = runs["interpreter"]
    statuses, problems = {}, []
    for mode, run in runs.items():
        found = compare(program, ref, run, mode == "eager") if mode != "interpreter" else \
            [f"interpreter: traced {run.traces} times for calls of one signature"] \
            if run.traces > 1 else []
        problems += found
        if run.failure and run.failure[0] == "crash":
            statuses[mode] = "crash"
            if mode == "interpreter":
                problems.append(f"interpreter crashed with {run.failure[2]} at call "
                                f"{run.failure[1]}: {run.failure[3]}")
        elif found:
            statuses[mode] = "mismatch"
        elif run.failure:
            statuses[mode] = "rejected"
        else:
            statuses[mode] = "ok"
    values = set(statuses.values())
    status = "crash" if "crash" in values else "mismatch" if "mismatch" in values else \
        "rejected" if values == {"rejected"} else "ok"
    result = {"seed": seed, "status": status, "modes": statuses, "problems": problems,
              "sections": program.sections, "seconds": time.perf_counter() - start,
              "kernels": sum(r.kernels for r in runs.values()),
              "compiled": sum(r.compiled for r in runs.values()),
              "cpus": {m: sorted(r.cpus) for m, r in runs.items() if r.cpus}}
    if keep_runs:
        result["runs"] = runs
        result["program"] = program
    return result


def probe_levels(levels: list[str]) -> dict[str, dict]:
    """For each level: None if this host runs its code, else the TargetError's message; and
    the CPU its kernels were compiled for (the same for every level until GRAPHOPT_CPU works)."""
    import graphopt as go
    from graphopt import envvars
    from graphopt.errors import TargetError
    out = {}
    for level in levels:
        try:
            with envvars.override(GRAPHOPT_CPU=level):
                fn = go.jit(lambda x: x * 2.0 + 1.0, backend="llvm", cache=False)
                fn(np.ones(4, np.float32))
                kernels = fn.lower(np.ones(4, np.float32)).kernels
            out[level] = {"skipped": None,
                          "cpu": ",".join(sorted({k.key_parts.get("cpu", "?") for k in kernels}))}
        except TargetError as e:
            out[level] = {"skipped": _first_line(e), "cpu": None}
    return out


# -- workers ----------------------------------------------------------------------------------
def worker_main(conn: Any, cache_dir: str | None) -> None:
    """A worker process: runs the programs it is sent, one at a time, and says which mode it
    is in before each (so that a native crash can be blamed on a mode). Without a cache_dir
    the disk cache is off: random kernels seldom repeat (4% here), and every store lists the
    cache directory to bound its size, which grows with the campaign (at 5,800 entries a
    program took three times the CPU time it takes without the cache)."""
    if cache_dir:
        os.environ["GRAPHOPT_CACHE_DIR"] = cache_dir
    else:
        os.environ["GRAPHOPT_CACHE"] = "0"
    import warnings
    warnings.simplefilter("ignore")
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "quit":
            return
        if message[0] == "probe":
            conn.send(("probe", probe_levels(message[1])))
            continue
        _, seed, levels, avoid, small = message
        if seed < 0:  # the harness's self-test: a native crash in the middle of a program
            import signal
            conn.send(("mode", seed, "self-test"))
            os.kill(os.getpid(), signal.SIGSEGV)
        try:
            result = check_program(seed, levels, avoid, small=small,
                                   on_mode=lambda m: conn.send(("mode", seed, m)))
        except Exception as e:  # noqa: BLE001  (the harness's own bug: say so, go on)
            result = {"seed": seed, "status": "crash", "modes": {}, "sections": [],
                      "problems": [f"harness error (fuzz.py, not graphopt): "
                                   f"{type(e).__name__}: {_first_line(e)}"],
                      "seconds": 0.0, "kernels": 0, "compiled": 0, "cpus": {}}
        conn.send(("result", result))


class Worker:
    def __init__(self, ctx: Any, cache_dir: str | None):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, cache_dir), daemon=True)
        self.proc.start()
        child.close()
        self.seed: int | None = None
        self.mode = ""
        self.started = 0.0
        self.done = 0

    def send(self, seed: int, levels: list[str], avoid: frozenset[str], small: bool) -> None:
        self.seed, self.mode, self.started = seed, "", time.monotonic()
        self.conn.send(("run", seed, levels, avoid, small))

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()  # this worker only: we started it
        else:
            try:
                self.conn.send(("quit",))
            except (BrokenPipeError, OSError):
                pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def _death(proc: Any) -> str:
    import signal
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def campaign(seeds: list[int], levels: list[str], workers: int = 2,
             avoid: frozenset[str] = frozenset(), cache_dir: str | None = None,
             timeout: float = 300.0, recycle: int = 150,
             progress: Callable[[dict, dict], None] | None = None,
             small: bool = False) -> list[dict]:
    """Run the programs on `workers` processes; a worker that dies or hangs is replaced and
    its program counted as a crash. Returns one result per seed, in seed order. A negative
    seed is the self-test: its worker kills itself with SIGSEGV."""
    import multiprocessing
    from multiprocessing.connection import wait
    ctx = multiprocessing.get_context("spawn")
    pool = [Worker(ctx, cache_dir) for _ in range(max(1, workers))]
    todo = list(reversed(seeds))
    results: dict[int, dict] = {}
    counts = {"ok": 0, "rejected": 0, "mismatch": 0, "crash": 0}

    def finish(w: Worker, result: dict) -> None:
        results[result["seed"]] = result
        counts[result["status"]] += 1
        w.seed = None
        w.done += 1
        if progress:
            progress({"done": len(results), "total": len(seeds), **counts}, result)

    def crashed(w: Worker, why: str) -> None:
        finish(w, {"seed": w.seed, "status": "crash", "modes": {w.mode or "?": "crash"},
                   "problems": [f"worker {why} in mode {w.mode or '?'}"], "sections": [],
                   "seconds": time.monotonic() - w.started, "kernels": 0, "cpus": {}})

    try:
        while todo or any(w.seed is not None for w in pool):
            for i, w in enumerate(pool):
                if w.seed is None and w.done >= recycle:
                    w.stop()
                    pool[i] = w = Worker(ctx, cache_dir)
                if w.seed is None and todo:
                    w.send(todo.pop(), levels, avoid, small)
            busy = [w for w in pool if w.seed is not None]
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=1.0)
            for i, w in enumerate(pool):
                if w.seed is None:
                    continue
                dead = False
                if w.conn in ready or w.proc.sentinel in ready:
                    try:
                        while w.conn.poll():
                            message = w.conn.recv()
                            if message[0] == "mode":
                                w.mode = message[2]
                            elif message[0] == "result":
                                finish(w, message[1])
                                break
                    except (EOFError, OSError):
                        dead = True
                    if w.seed is not None and not w.proc.is_alive():
                        dead = True
                if dead:
                    w.proc.join(1)
                    crashed(w, _death(w.proc))
                    w.stop(kill=True)
                    pool[i] = Worker(ctx, cache_dir)
                elif w.seed is not None and time.monotonic() - w.started > timeout:
                    crashed(w, f"timed out after {timeout:.0f} s")
                    w.stop(kill=True)
                    pool[i] = Worker(ctx, cache_dir)
    except KeyboardInterrupt:  # Ctrl-C: stop, and report what ran
        pass
    finally:
        for w in pool:
            w.stop(kill=w.seed is not None)
    return [results[s] for s in seeds if s in results]


def probe(levels: list[str], cache_dir: str | None) -> dict[str, dict]:
    """probe_levels in a worker process of its own (a level might crash it)."""
    import multiprocessing
    w = Worker(multiprocessing.get_context("spawn"), cache_dir)
    try:
        w.conn.send(("probe", levels))
        if w.conn.poll(120):
            return w.conn.recv()[1]
        return {level: {"skipped": "the probe timed out", "cpu": None} for level in levels}
    except EOFError:
        return {level: {"skipped": f"the probe worker {_death(w.proc)}", "cpu": None}
                for level in levels}
    finally:
        w.stop()


# -- the report -------------------------------------------------------------------------------
def cpu_summary() -> tuple[str, str]:
    """The CPU's model name, and which of the x86-64 level features /proc/cpuinfo lists."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown", "unknown"
    name = re.search(r"model name\s*:\s*(.*)", text)
    flags = set((re.search(r"flags\s*:\s*(.*)", text) or re.match("", "")).group(1).split()) \
        if re.search(r"flags\s*:", text) else set()
    wanted = ["sse2", "ssse3", "sse4_1", "sse4_2", "popcnt", "avx", "avx2", "bmi2", "fma",
              "f16c", "avx512f", "avx512bw", "avx512vl"]
    have = [f for f in wanted if f in flags]
    missing = [f for f in wanted if f not in flags]
    return (name.group(1).strip() if name else "unknown",
            f"{' '.join(have)}" + (f" (no {' '.join(missing)})" if missing else ""))


def _signature(problem: str) -> str:
    """A problem line with its numbers and names blurred: the same bug gives the same text."""
    text = re.sub(r"first at .*", "", problem)
    text = re.sub(r"\b[pwmoa]\d+\b", "P", text)
    text = re.sub(r"\b(output|parameter|call) \S+", r"\1 _", text)
    text = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", text)
    return text[:200]


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str:
    import subprocess
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO,
                              check=False).stdout.rstrip("\n")
    except OSError:
        return ""


def export_head() -> str:
    """graphopt as committed at HEAD, in a directory of its own (put first on sys.path): the
    campaign then tests one commit, whatever is being edited in the working tree."""
    import subprocess
    import tempfile
    target = tempfile.mkdtemp(prefix="graphopt-fuzz-head-")
    archive = subprocess.run(["git", "archive", "HEAD", "graphopt"], cwd=REPO, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", target], input=archive, check=True)
    return target


def code_under_test(head: str | None) -> str:
    if head:
        return "graphopt as committed at HEAD (exported with git archive)"
    dirty = [line[3:] for line in _git("status", "--porcelain", "--", "graphopt").splitlines()]
    return "the working tree" + (f", with uncommitted changes in {len(dirty)} files under "
                                 f"graphopt/ ({', '.join(dirty[:6])}{', ...' if len(dirty) > 6 else ''})"
                                 if dirty else " (clean)")


def version() -> str:
    """The sha1 of this file: the programs a seed makes depend on it."""
    import hashlib
    with open(os.path.abspath(__file__), "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()[:12]


def report(results: list[dict], *, command: str, levels: list[str], probed: dict,
           seconds: float, avoid: frozenset[str], code: str = "", planned: int = 0,
           cache: str | None = None, commit: str = "unknown", fuzz_version: str = "") -> str:
    name, flags = cpu_summary()
    counts = {k: sum(r["status"] == k for r in results) for k in ("ok", "rejected", "mismatch",
                                                                     "crash")}
    modes = sorted({m for r in results for m in r["modes"]},
                   key=lambda m: (m != "interpreter", m != "eager", m))
    lines = ["# Differential fuzzing: eager, interpreter and LLVM", "",
             f"- command: `{command}`", f"- commit: {commit}; code tested: {code}",
             f"- fuzz.py version {fuzz_version} (sha1 of the file): a seed names a program of this "
             f"version (`--replay SEED` with another one may make another program)",
             f"- CPU: {name}; flags: {flags}"]
    ran = [lv for lv in levels if not probed.get(lv, {}).get("skipped")]
    lines.append(f"- levels run: {', '.join(ran) or 'none'}")
    for lv, info in probed.items():
        if info.get("skipped"):
            asked = "" if lv in levels else " (not asked for)"
            lines.append(f"- level skipped{asked}: {lv}: {info['skipped']}")
    others = [lv for lv, info in probed.items() if lv not in levels and not info.get("skipped")]
    if others:
        lines.append(f"- levels this host runs but not asked for: {', '.join(others)}")
    cpus = {lv: probed[lv]["cpu"] for lv in ran if lv in probed}
    if cpus:
        lines.append("- kernels compiled for (LLVM CPU name per level): " +
                     ", ".join(f"{lv} -> {cpu}" for lv, cpu in cpus.items()) +
                     ("" if len(set(cpus.values())) > 1 or len(cpus) < 2 else
                      " (the same for every level: GRAPHOPT_CPU had no effect)"))
    if avoid:
        lines.append(f"- known bugs avoided: {', '.join(sorted(avoid))}")
    lines.append(f"- disk cache of compiled kernels: {cache or 'off'}")
    total = len(results)
    rate = total / seconds if seconds else 0.0
    if planned > total:
        lines.append(f"- interrupted: {total} of the {planned} programs ran")
    lines += [f"- programs: {total} ({counts['ok']} ok, {counts['rejected']} rejected alike in "
              f"every mode, {counts['mismatch']} mismatches, {counts['crash']} crashes)",
              f"- time: {seconds:.0f} s ({rate:.2f} programs/s)",
              f"- sections: " + ", ".join(f"{s} {sum(s in r['sections'] for r in results)}"
                                          for s in ("expr", "rule", "optim")),
              f"- kernels compiled or loaded: {sum(r.get('kernels', 0) for r in results)}", "",
              "## Per mode", "", "| mode | ok | rejected | mismatch | crash |",
              "|---|---|---|---|---|"]
    for m in modes:
        c = [sum(r["modes"].get(m) == k for r in results)
             for k in ("ok", "rejected", "mismatch", "crash")]
        lines.append(f"| {m} | " + " | ".join(map(str, c)) + " |")
    failures = [r for r in results if r["status"] in ("mismatch", "crash")]
    lines += ["", f"## Failures ({len(failures)})", ""]
    if failures:
        lines += ["Reproduce one: `python benchmarks/fuzz.py --replay SEED` prints the program "
                  "as a script and the values that differ.", ""]
        groups: dict[str, list[dict]] = {}
        for r in failures:
            key = r["status"] + ": " + _signature(r["problems"][0] if r["problems"] else "")
            groups.setdefault(key, []).append(r)
        lines += ["### By kind", "", "| programs | kind | first seeds |", "|---|---|---|"]
        for key, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            seeds = ", ".join(str(r["seed"]) for r in rs[:8])
            lines.append(f"| {len(rs)} | {key.replace('|', '/')} | {seeds} |")
        lines += ["", "### Each failure", ""]
        for r in failures[:500]:
            first = r["problems"][0] if r["problems"] else "?"
            more = f" (+{len(r['problems']) - 1} more)" if len(r["problems"]) > 1 else ""
            lines.append(f"- seed {r['seed']} ({r['status']}, {'/'.join(r['sections'])}): "
                         f"{first.replace('|', '/')}{more}")
        if len(failures) > 500:
            lines.append(f"- ... and {len(failures) - 500} more")
    else:
        lines.append("None.")
    slow = sorted(results, key=lambda r: -r["seconds"])[:3]
    lines += ["", "Slowest programs: " + ", ".join(f"seed {r['seed']} {r['seconds']:.1f} s"
                                                     for r in slow), ""]
    return "\n".join(lines)


# -- the command line -------------------------------------------------------------------------
def replay(seed: int, levels: list[str], avoid: frozenset[str], small: bool = False) -> int:
    program = generate(seed, avoid, small)
    print(f"# ---- program {seed} ({', '.join(program.sections)}) ----")
    print(standalone(program), flush=True)
    print(f"# ---- running it: {', '.join(modes_for(levels))} ----", flush=True)
    result = check_program(seed, levels, avoid, small=small,
                           on_mode=lambda m: print(f"# {m} ...", flush=True), keep_runs=True)
    for mode, run in result["runs"].items():
        state = "ran every call" if run.failure is None else \
            f"{run.failure[0]}: {run.failure[2]} at call {run.failure[1]}: {run.failure[3]}"
        print(f"{mode:>16}: {result['modes'][mode]:8} {state}")
    print(f"status: {result['status']}")
    for p in result["problems"]:
        print("  " + p)
    ref = result["runs"]["interpreter"]
    for mode, run in result["runs"].items():
        if mode == "interpreter" or result["modes"][mode] != "mismatch" or run.failure:
            continue
        for k, ((r_out, r_par), (o_out, o_par)) in enumerate(zip(ref.calls, run.calls)):
            for j, (a, b) in enumerate(zip(o_out, r_out)):
                if a.shape == b.shape and a.dtype == b.dtype and differ(a, b, None).any():
                    print(f"call {k} output {j}: {mode}\n{a!r}\n  interpreter\n{b!r}")
            for name, b in r_par.items():
                a = o_par.get(name)
                if a is not None and a.shape == b.shape and a.dtype == b.dtype and \
                        differ(a, b, None).any():
                    print(f"call {k} parameter {name}: {mode}\n{a!r}\n  interpreter\n{b!r}")
    return 0 if result["status"] in ("ok", "rejected") else 1


class Progress:
    """The progress line on stderr, and the report rewritten every few minutes while a long
    campaign runs (so its failures can be looked at before it ends)."""

    def __init__(self, write_report: Callable[[list[dict], bool], None], every: float = 300.0):
        self.start = self.last_line = self.last_report = time.monotonic()
        self.results: list[dict] = []
        self.write_report, self.every = write_report, every

    def __call__(self, c: dict, result: dict) -> None:
        self.results.append(result)
        now = time.monotonic()
        if now - self.last_report > self.every:
            self.last_report = now
            self.write_report(self.results, True)
        if now - self.last_line < 0.5 and c["done"] != c["total"]:
            return
        self.last_line = now
        rate = c["done"] / max(now - self.start, 1e-9)
        eta = (c["total"] - c["done"]) / rate if rate else 0
        sys.stderr.write(f"\r[fuzz] {c['done']}/{c['total']}  ok {c['ok']}  rejected "
                         f"{c['rejected']}  mismatch {c['mismatch']}  crash {c['crash']}  "
                         f"{rate:.2f}/s  eta {eta / 60:.1f} min ")
        sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="the first program's seed (default 0)")
    ap.add_argument("--programs", type=int, default=200, help="how many programs (default 200)")
    ap.add_argument("--levels", default=",".join(DEFAULT_LEVELS),
                    help=f"GRAPHOPT_CPU levels, comma-separated (default {','.join(DEFAULT_LEVELS)};"
                         f" known: {','.join(ALL_LEVELS)})")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results", "fuzz.md"),
                    help="the report (default benchmarks/results/fuzz.md)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--replay", type=int, metavar="SEED",
                    help="print one program's source and run it in every mode, in this process")
    ap.add_argument("--avoid", default="", help="known bugs to steer clear of, comma-separated: "
                    f"{', '.join(KNOWN_BUGS) or '(none known)'}; `all` for every one")
    ap.add_argument("--cache-dir", default=None,
                    help="use the disk cache of compiled kernels, in this directory (default: "
                         "off; see worker_main)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per program")
    ap.add_argument("--small", action="store_true",
                    help="smaller programs, one section each (what tests/test_fuzz.py runs)")
    ap.add_argument("--head", action="store_true",
                    help="test graphopt as committed at HEAD, not the working tree")
    args = ap.parse_args(argv)
    # Taken before anything runs: others may commit while a long campaign goes on.
    commit, fuzz_version = _git("rev-parse", "--short", "HEAD") or "unknown", version()
    head = export_head() if args.head else None
    if head:  # for this process and the workers (spawn passes sys.path on)
        sys.path.insert(0, head)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [head, os.environ.get(
            "PYTHONPATH")]))
    levels = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
    avoid = frozenset(a.strip() for a in args.avoid.split(",") if a.strip())
    if "all" in avoid:
        avoid = frozenset(KNOWN_BUGS)
    if args.cache_dir:
        os.environ["GRAPHOPT_CACHE_DIR"] = args.cache_dir
    else:
        os.environ["GRAPHOPT_CACHE"] = "0"
    if args.replay is not None:
        probed = probe_levels(levels)
        return replay(args.replay, [lv for lv in levels if not probed[lv]["skipped"]], avoid,
                      args.small)
    start = time.monotonic()
    probed = probe(list(dict.fromkeys(levels + list(ALL_LEVELS))), args.cache_dir)
    run_levels = [lv for lv in levels if not probed[lv]["skipped"]]
    for lv in levels:
        if probed[lv]["skipped"]:
            print(f"[fuzz] level {lv} skipped: {probed[lv]['skipped']}", file=sys.stderr)
    command = "python benchmarks/fuzz.py " + " ".join(argv if argv is not None else sys.argv[1:])
    code = code_under_test(head)

    def write(results: list[dict], running: bool = False) -> None:
        text = report(sorted(results, key=lambda r: r["seed"]), command=command.strip(),
                      levels=levels, probed=probed, seconds=time.monotonic() - start,
                      avoid=avoid, code=code, planned=args.programs, cache=args.cache_dir,
                      commit=commit, fuzz_version=fuzz_version)
        if running:
            text = text.replace("\n- programs:", "\n- (still running: an interim report)"
                                                  "\n- programs:", 1)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)

    def stop(signum: int, frame: Any) -> None:  # `kill` stops it as Ctrl-C does: with a report
        raise KeyboardInterrupt

    import signal
    signal.signal(signal.SIGTERM, stop)
    results: list[dict] = []
    try:
        results = campaign(list(range(args.seed, args.seed + args.programs)), run_levels,
                           args.workers, avoid, args.cache_dir, args.timeout,
                           progress=Progress(write), small=args.small)
    finally:
        sys.stderr.write("\n")
    write(results)
    bad = [r for r in results if r["status"] in ("mismatch", "crash")]
    print(f"{len(results)} programs, {sum(r['status'] == 'mismatch' for r in results)} "
          f"mismatches, {sum(r['status'] == 'crash' for r in results)} crashes; "
          f"report: {args.out}")
    for r in bad[:20]:
        print(f"  seed {r['seed']}: {r['problems'][0] if r['problems'] else r['status']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
