"""Data-parallel training on MPI (placeholder: the runtime lands separately)."""
from . import passes  # noqa: F401  (registers the bucket and zero passes)
from .parallel import DataParallel

__all__ = ["DataParallel"]
