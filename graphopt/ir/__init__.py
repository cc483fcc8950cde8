"""The IR: types, the op registry, Graph/Node/Value, text form, verifier, exports."""
from . import kernel as _kernel  # noqa: F401  (kernel and store)
from . import rowkernel as _rowkernel  # noqa: F401  (row_kernel)
from . import opdefs as _opdefs  # noqa: F401  (fills the registry)
from . import collectives as _collectives  # noqa: F401  (and the collectives)
from .graph import Graph, Location, Node, Value
from .parser import parse
from .registry import REGISTRY, OpDef, get_op
from .types import (DTYPES, DType, TensorType, TokenType, bf16, bool_, f16, f32, f64, i32, i64,
                    to_dtype, token)

__all__ = ["Graph", "Node", "Value", "Location", "OpDef", "REGISTRY", "get_op", "DType",
           "TensorType", "TokenType", "token", "DTYPES", "to_dtype", "f16", "bf16", "f32", "f64",
           "i32", "i64", "bool_", "parse"]

