"""Constructor arguments, checked before the constructor runs.

`Adam([w], foo=1)` would otherwise be Python's TypeError from inside the constructor chain.
The public classes of graphopt.optim (optimizers, Accumulate, schedules) and graphopt.amp's
loss scalers have `CheckedArguments` as their metaclass: a call of the class binds its
arguments to the constructor's signature first, and one it does not take (an unknown or
repeated keyword, a missing or extra positional argument) is an OptimizerError naming the
class, the argument and the arguments the class takes, at the caller's line.

The `**kwargs` of graphopt's own optimizer constructors go on to the first base constructor
without `**kwargs` (Optimizer's name=, state_dtype=, master_weights=), so such a class's
signature is its own named arguments and that base's keyword-only ones. (`inspect.signature`
and `help` show that signature too.) The constructor of a subclass defined elsewhere is
bound as it is written.
"""
from __future__ import annotations

import difflib
import functools
import inspect
import sys
from typing import Any

from ..errors import OptimizerError
from ..ir.graph import Location

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_OURS = __name__.partition(".")[0] + "."  # "graphopt.": constructors of graphopt's modules


class CheckedArguments(type):
    """Metaclass: calling the class checks the arguments against its signature first."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        sig = cls.__signature__
        if sig is not None:
            try:
                sig.bind(*args, **kwargs)
            except TypeError as e:
                caller = sys._getframe(1)
                raise OptimizerError(_refusal(cls.__name__, sig, str(e), len(args), kwargs),
                                     loc=Location(caller.f_code.co_filename, caller.f_lineno)
                                     ) from None
        return super().__call__(*args, **kwargs)

    @property
    def __signature__(cls) -> inspect.Signature | None:
        return _signature(cls)


@functools.cache
def _signature(cls: type) -> inspect.Signature | None:
    """The signature a call of cls is bound to; None for a constructor without one that
    inspect can read (a C type's), whose call is not checked."""
    try:
        params = _parameters(cls)[1:]  # without self
    except (TypeError, ValueError):
        return None
    if params and params[-1].kind is inspect.Parameter.VAR_KEYWORD and \
            (getattr(cls.__init__, "__module__", None) or "").startswith(_OURS):
        base = next((c for c in cls.__mro__ if isinstance(c, CheckedArguments) and
                     all(p.kind is not p.VAR_KEYWORD for p in _parameters(c))), None)
        if base is not None:
            named = {p.name for p in params}
            params = params[:-1] + [p for p in _parameters(base)
                                    if p.kind is p.KEYWORD_ONLY and p.name not in named]
    return inspect.Signature(params)


def _parameters(cls: type) -> list[inspect.Parameter]:
    if cls.__init__ is object.__init__:  # no constructor of its own: it takes no arguments
        return [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
    return list(inspect.signature(cls.__init__).parameters.values())


def _refusal(name: str, sig: inspect.Signature, problem: str, given: int,
             kwargs: dict[str, Any]) -> str:
    """What is wrong with a call, in words, and what the class takes."""
    if problem == "too many positional arguments":
        positional = [p.name for p in sig.parameters.values() if p.kind in _POSITIONAL]
        takes = f"at most {len(positional)} ({', '.join(positional)})" if positional else "none"
        problem = f"{given} positional argument{'s' * (given != 1)} given, but it takes {takes}"
    unknown = [k for k in kwargs if k not in sig.parameters]
    close = difflib.get_close_matches(unknown[0], list(sig.parameters), n=1, cutoff=0.8) \
        if unknown else []
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    plain = sig.replace(parameters=[p.replace(annotation=p.empty)
                                    for p in sig.parameters.values()])
    return f"{name}(): {problem}{hint}. Its arguments: {name}{plain}"
