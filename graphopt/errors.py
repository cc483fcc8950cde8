"""The error hierarchy: every error graphopt raises on bad input is a GraphoptError.

Errors that come from user code carry the user's file:line (`loc`) when the tracer knows it,
and show it at the start of the message, so an editor or terminal can jump to it.
"""
from __future__ import annotations

from typing import Any


class GraphoptError(Exception):
    """Base class of every error graphopt raises on bad input."""

    def __init__(self, message: str, *, loc: Any = None):
        self.message = message
        self.loc = loc
        where = f"{loc.full()}: " if loc is not None else ""
        super().__init__(where + message)


class OpTypeError(GraphoptError, TypeError):
    """An op was applied to inputs of the wrong shapes, dtypes or attributes."""


class TracerBoolError(GraphoptError, TypeError):
    """Python control flow (`if`, `bool()`, `float()`) asked for the value of a traced tensor."""


class AssignError(GraphoptError, TypeError):
    """`assign` to something that is not a Parameter, or of a value of another shape or dtype."""


class SignatureError(GraphoptError, TypeError):
    """A compiled step was called with arguments of the wrong structure or kind."""


class ParameterError(GraphoptError, ValueError):
    """A Parameter is malformed, or two Parameters of one graph share a name."""


class AliasingError(ParameterError):
    """Memory shared where an in-place update would break: an argument of a step that views
    the buffer of a Parameter the step updates, or a second Parameter over one array."""


class ArgumentError(GraphoptError, TypeError):
    """A public function was given an argument of a kind it does not take: jit of something
    that is not a function, a flag that is not a bool, a pipeline that is not pass names."""


class ParseError(GraphoptError, ValueError):
    """Malformed IR text; the message gives line and column."""

    def __init__(self, message: str, line: int, col: int, source_line: str = ""):
        self.line, self.col = line, col
        caret = f"\n  {source_line}\n  {' ' * (col - 1)}^" if source_line else ""
        super().__init__(f"line {line}, column {col}: {message}{caret}")


class ParseInputError(GraphoptError, TypeError):
    """`parse` was given something that is not a str (bytes, None, a file object)."""


class VerifyError(GraphoptError, ValueError):
    """A graph breaks an IR rule; the message names the node and the rule. `node`: what
    breaks it, a Node, a graph input (a Value) or a Graph (its return), or None."""

    def __init__(self, rule: str, message: str, node: Any = None):
        self.rule, self.node = rule, node
        super().__init__(f"[{rule}] {message}", loc=getattr(node, "loc", None))


class RenderError(GraphoptError, RuntimeError):
    """Drawing a graph needs a tool that is not installed."""


class ExecutionError(GraphoptError, RuntimeError):
    """A node failed while a step ran; no Parameter was changed."""


class BackendError(GraphoptError, ValueError):
    """An unknown backend, or a graph a backend cannot run."""


class LoweringError(GraphoptError):
    """An op (or a dtype) the LLVM backend cannot compile; its kernel runs through numpy."""


class TargetError(GraphoptError, ValueError):
    """A compilation target (GRAPHOPT_CPU, GRAPHOPT_CPU_FEATURES) that LLVM does not know, or
    whose code this host cannot run: refused before any of its code is loaded."""


class SwitchError(GraphoptError, ValueError):
    """A GRAPHOPT_* switch (envvars.py) set to a value it does not take; the message names the
    switch, the value, where it was set and what is allowed (`allowed`)."""

    def __init__(self, name: str, value: str, allowed: str, problem: str = "", where: str = ""):
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name}={value!r}{f' ({where})' if where else ''}: "
                         f"{problem + '; ' if problem else ''}expected {allowed}")


class OptimizerError(GraphoptError, ValueError):
    """Bad input to an optimizer, a schedule or a loss scaler: a hyper-parameter out of
    range, a gradient of the wrong shape or dtype, a parameter in two groups. The message
    names the parameter; nothing was changed. (Bad values in a checkpoint are a
    CheckpointError.)"""


class GradientError(GraphoptError, TypeError):
    """A bad request to `value_and_grad`/`grad`: a gradient with respect to something that is
    not a Parameter, an argnum out of range, a function that assigns what it differentiates,
    a non-scalar or integer output, or a nested `value_and_grad`."""


class NotDifferentiableError(GradientError):
    """A gradient has to flow through an op that has no VJP rule."""


class CheckpointError(GraphoptError, ValueError):
    """A checkpoint that cannot be saved or loaded: a malformed, damaged or foreign file (the
    message names the file and the entry), a state dict of the wrong form, values a
    parameter or an optimizer would refuse, a save inside a traced step, a write that
    failed. Loading that fails changes nothing; a save that fails leaves the old file."""


class CollectiveError(GraphoptError, RuntimeError):
    """A collective (all_reduce, reduce_scatter, all_gather, broadcast) that cannot run: an
    unknown process group, a group of another size than the graph was traced for, ranks
    whose compiled steps differ, a rank that did not arrive within the timeout. Raised on
    every rank that sees it; no Parameter was changed."""


class CollectiveTimeout(CollectiveError):
    """A collective waited longer than its timeout (GRAPHOPT_COLLECTIVE_TIMEOUT) for the
    other ranks: one of them is lost, stuck or running another step."""
