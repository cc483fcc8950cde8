"""Passes rewrite a Graph; the manager runs them as a pipeline (see manager.py).

    dce       remove what the return does not reach
    cse       merge identical pure nodes
    fold      evaluate nodes whose inputs are constants
    simplify  exact algebraic identities and strength reduction
    fuse      elementwise nodes of one iteration space -> kernel nodes (vertical fusion)
    wholestep an update that only a kernel's reduced result feeds -> that kernel's finish stage
    rowfuse   a kernel that updates the rows of a row gradient -> one row kernel, in place
    hfuse     kernels with the same body -> one multi-tensor kernel (horizontal fusion)
"""
from . import cse, dce, fold, fuse, hfuse, rowfuse, simplify, wholestep  # noqa: F401  (each registers it)
from .manager import (DEFAULT_PIPELINE, PASSES, Pass, PassContext, PassError, PassStats,
                      PipelineResult, Refusal, register, run)

__all__ = ["run", "register", "PASSES", "DEFAULT_PIPELINE", "Pass", "PassContext", "PassError",
           "PassStats", "PipelineResult", "Refusal"]
