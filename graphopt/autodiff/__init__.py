"""Reverse-mode autodiff: the VJP table (rules.py) and the transformation of a traced step
that applies it (transform.py)."""
from .transform import GradLocation, grad, value_and_grad

__all__ = ["GradLocation", "grad", "value_and_grad"]
