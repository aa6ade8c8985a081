"""Input checks shared by every posterior: each names the function, what it expected and what it got.

They run before any expensive work (a GGN, a projection, a Cholesky factor).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from linops.likelihoods import Likelihood
from linops.models import ravel


def check_likelihood(likelihood, who: str) -> None:
    """``likelihood`` is a `linops.likelihoods.Likelihood`."""
    if not isinstance(likelihood, Likelihood):
        raise TypeError(f"{who}: likelihood must be a linops.likelihoods.Likelihood, got {type(likelihood).__name__}")


def check_data(data, who: str, what: str = "data") -> tuple:
    """``data`` is an ``(inputs, targets)`` pair; returns it."""
    if not (isinstance(data, tuple) and len(data) == 2):
        raise ValueError(f"{who}: {what} must be an (inputs, targets) pair, got "
                         + (f"a tuple of {len(data)}" if isinstance(data, tuple) else type(data).__name__))
    return data


def check_params(params, who: str) -> None:
    """The trained parameters are finite (a traced pytree has no values to check)."""
    flat, _ = ravel(params)
    if not isinstance(flat, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(flat))):
        raise ValueError(f"{who}: params contain non-finite values")
