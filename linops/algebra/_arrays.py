"""Array helpers shared by the leaves: dtype defaults, relative cut-offs, declared signs."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def describe(op: Any) -> str:
    """`Dense(3, 4)`-style name used in every error message (an operator, an array, or anything)."""
    if hasattr(op, "mv") and hasattr(op, "signature"):  # a LinearOperator (duck-typed: no import of the base)
        return f"{type(op).__name__}{tuple(op.shape)}"
    shape = getattr(op, "shape", None)
    return f"array of shape {tuple(shape)}" if shape is not None else repr(op)


def is_scalar_like(x: Any) -> bool:
    if isinstance(x, (int, float, np.number)) and not isinstance(x, bool):
        return True
    return isinstance(x, (jax.Array, np.ndarray)) and x.ndim == 0


def default_float():
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def default_rtol(shape, dtype) -> float:
    """Relative cut-off for "numerically zero" eigen/singular values."""
    return max(shape) * float(jnp.finfo(dtype).eps)


def is_known_nonnegative(x, declared: bool | None) -> bool:
    """`declared` wins; otherwise inspect concrete values (a tracer has no sign)."""
    if declared is not None:
        return bool(declared)
    if isinstance(x, jax.core.Tracer):
        return False
    return bool(np.all(np.asarray(x) >= 0))


def as_matrix_array(x, name: str, ndim: int) -> jax.Array:
    x = jnp.asarray(x)
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(default_float())
    return x


def cutoff_inverse(w: jax.Array, rtol: float | None, shape) -> jax.Array:
    """``1/w`` where ``|w| > rtol * max|w|``, else 0 (a RELATIVE cut-off)."""
    rtol = default_rtol(shape, w.dtype) if rtol is None else rtol
    keep = jnp.abs(w) > rtol * jnp.max(jnp.abs(w))
    return jnp.where(keep, 1.0 / jnp.where(keep, w, 1.0), 0.0)
