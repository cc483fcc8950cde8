"""graphopt: a small, inspectable graph compiler for training and optimizer steps."""
from . import ir
from .errors import GraphoptError
from .frontend import EagerTensor, Parameter, Rows, Tensor, TracedTensor, assign, depend, trace
from . import ops  # noqa: E402  (after the frontend it builds on)
from .compile import jit
from .autodiff import grad, value_and_grad
from .ops import stop_gradient
from .ir import Graph, parse
from .ir.export import dump
from . import passes
from .explain import explain
from . import explorer  # (gives compiled steps their `explore` method)
from .ir.types import bf16, bool_, f16, f32, f64, i32, i64

__version__ = "0.1.0"

__all__ = ["Parameter", "Tensor", "TracedTensor", "EagerTensor", "Rows", "trace", "jit", "assign",
           "depend", "ops", "ir", "Graph", "parse", "dump", "GraphoptError", "f16", "bf16",
           "f32", "f64", "i32", "i64", "bool_"]
__all__ += ["value_and_grad", "grad", "stop_gradient"]
__all__ += ["passes", "explain", "explorer"]
from . import amp, optim  # noqa: E402  (the optimizer library, on top of ops)
from .checkpoint import load, save  # noqa: E402
from . import distributed  # noqa: E402  (data parallelism; mpi4py is imported by its init)
__all__ += ["optim", "amp", "save", "load", "distributed"]
