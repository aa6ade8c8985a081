r"""Context points: where a function-space prior is imposed (FSP-Laplace, seed 004).

Each function returns an ``(m, d)`` array of inputs (`uniform` and `from_data` also inputs of any shape
``(m, ...)``, such as images). Random ones take an explicit key.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from posteriors import context
    >>> X = jnp.array([[0.0, 0.0], [1.0, 2.0]])
    >>> context.grid(X, 3, padding=0.0)[:3]
    Array([[0., 0.],
           [0., 1.],
           [0., 2.]], dtype=float32)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from linops.runtime import flat_draw


def _box(X, padding, who, *, rows_only=True):
    X = jnp.asarray(X)
    if (X.ndim != 2 if rows_only else X.ndim < 2) or X.shape[0] == 0:
        shape = "2-D (n, d)" if rows_only else "(n, d) or (n, ...)"
        raise ValueError(f"{who}: data must be {shape} with n >= 1, got shape {X.shape}")
    if not padding >= 0:
        raise ValueError(f"{who}: padding must be >= 0, got {padding}")
    lo, hi = jnp.min(X, axis=0), jnp.max(X, axis=0)
    pad = padding * (hi - lo)
    return X, lo - pad, hi + pad


def _count(num, who):
    if not isinstance(num, (int, np.integer)) or num < 1:
        raise ValueError(f"{who}: the number of points must be a positive integer, got {num!r}")
    return int(num)


def uniform(key, X, num: int, *, padding: float = 0.5):
    """``num`` points uniform over the data's bounding box, widened by ``padding`` times its range
    on each side (the paper's default: half the range). Inputs of any shape ``(n, ...)`` (images) give
    points of that shape, each entry (pixel) uniform over its own range: FSP-Laplace's "RND" context.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.context import uniform
        >>> C = uniform(jax.random.key(0), jnp.array([[0.0], [1.0]]), 100)
        >>> bool(C.min() >= -0.5) and bool(C.max() <= 1.5), C.shape
        (True, (100, 1))
        >>> uniform(jax.random.key(0), jnp.zeros((5, 1, 28, 28)), 3, padding=0.0).shape
        (3, 1, 28, 28)
    """
    num = _count(num, "context.uniform")
    X, lo, hi = _box(X, padding, "context.uniform", rows_only=False)
    return lo[None] + (hi - lo)[None] * flat_draw(jax.random.uniform, key, (num, *X.shape[1:]), X.dtype)


def from_data(key, X, num: int):
    """``num`` distinct rows of ``X`` (the training inputs, or another data set), drawn at random.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.context import from_data
        >>> from_data(jax.random.key(0), jnp.arange(10.0)[:, None], 3).shape
        (3, 1)
    """
    num = _count(num, "context.from_data")
    X = jnp.asarray(X)
    if X.ndim < 1 or num > X.shape[0]:
        raise ValueError(f"context.from_data: asked for {num} points from a data set of {X.shape[:1]} rows")
    return X[jax.random.choice(key, X.shape[0], (num,), replace=False)]


def grid(X, num_per_dim: int, *, padding: float = 0.5):
    """A regular grid of ``num_per_dim`` points per input dimension over the padded data box.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.context import grid
        >>> grid(jnp.array([[-1.0], [1.0]]), 5, padding=0.0)[:, 0]
        Array([-1. , -0.5,  0. ,  0.5,  1. ], dtype=float32)
    """
    num_per_dim = _count(num_per_dim, "context.grid")
    X, lo, hi = _box(X, padding, "context.grid")
    axes = [jnp.linspace(lo[i], hi[i], num_per_dim, dtype=X.dtype) for i in range(X.shape[1])]
    return jnp.stack([a.reshape(-1) for a in jnp.meshgrid(*axes, indexing="ij")], axis=1)


def low_discrepancy(key, X, num: int, *, kind: str = "halton", padding: float = 0.5):
    """``num`` points of a scrambled Halton or Sobol sequence (scipy's ``qmc``) over the padded box.

    The scrambling seed is drawn from ``key``, so the points are reproducible.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.context import low_discrepancy
        >>> low_discrepancy(jax.random.key(0), jnp.array([[0.0, 0.0], [1.0, 1.0]]), 16, kind="sobol").shape
        (16, 2)
    """
    from scipy.stats import qmc

    num = _count(num, "context.low_discrepancy")
    X, lo, hi = _box(X, padding, "context.low_discrepancy")
    seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
    if kind == "halton":
        sampler = qmc.Halton(d=X.shape[1], scramble=True, seed=seed)
    elif kind == "sobol":
        sampler = qmc.Sobol(d=X.shape[1], scramble=True, seed=seed)
    else:
        raise ValueError(f"context.low_discrepancy: kind must be 'halton' or 'sobol', got {kind!r}")
    unit = jnp.asarray(sampler.random(num), X.dtype)
    return lo[None, :] + (hi - lo)[None, :] * unit


__all__ = ["from_data", "grid", "low_discrepancy", "uniform"]
