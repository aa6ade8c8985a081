"""Input checks shared by every posterior: each names the function, what it expected and what it got.

They run before any expensive work (a GGN, a projection, a Cholesky factor).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from linops.likelihoods import Likelihood


def check_likelihood(likelihood, who: str) -> None:
    """``likelihood`` is a `linops.likelihoods.Likelihood`."""
    if not isinstance(likelihood, Likelihood):
        raise TypeError(f"{who}: likelihood must be a linops.likelihoods.Likelihood, got {type(likelihood).__name__}")


def check_data(data, who: str, what: str = "data") -> tuple:
    """``data`` is an ``(inputs, targets)`` pair of finite values; returns it."""
    if not (isinstance(data, tuple) and len(data) == 2):
        raise ValueError(f"{who}: {what} must be an (inputs, targets) pair, got "
                         + (f"a tuple of {len(data)}" if isinstance(data, tuple) else type(data).__name__))
    check_finite(data[0], who, f"the {what}'s inputs")
    check_finite(data[1], who, f"the {what}'s targets")
    return data


def check_finite(tree, who: str, what: str) -> None:
    """Every floating-point array of ``tree`` is finite (traced arrays have no values to check).

    One NaN or Inf input turns a GGN, a projection or an evidence into NaN (or a projection into the
    identity): refused here, before any work, naming the first bad example.
    """
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.core.Tracer) or not hasattr(leaf, "dtype"):
            continue
        if not jnp.issubdtype(leaf.dtype, jnp.inexact):
            continue
        # NumPy on the concrete values: inside a trace (a scan or jit closing over the data) jnp would
        # return tracers even for concrete inputs
        bad = ~np.isfinite(np.asarray(leaf, dtype=np.float64 if leaf.dtype == jnp.bfloat16 else None))
        if bad.any():
            rows = bad.reshape(bad.shape[0], -1).any(axis=1) if bad.ndim else bad[None]
            raise ValueError(f"{who}: {what} contain {int(bad.sum())} non-finite values (NaN or Inf), in "
                             f"{int(rows.sum())} examples, the first at index {int(np.argmax(rows))}; remove or "
                             "impute them first")


def check_params(params, who: str) -> None:
    """The trained parameters are float32 or float64, and finite (a traced pytree has no values to check).

    Half precision is refused by name: the posteriors' factorisations (Cholesky, eigh, Lanczos' small
    eigenproblems) have no float16/bfloat16 LAPACK kernels, and their rounding (eps ~ 1e-3 and 8e-3) would
    swamp a GGN's small eigenvalues anyway.
    """
    for leaf in jax.tree_util.tree_leaves(params):
        dtype = jnp.result_type(leaf)
        if dtype in (jnp.float16, jnp.bfloat16):
            raise TypeError(f"{who}: params hold {dtype} arrays; posteriors need float32 or float64 parameters "
                            "(their factorisations have no half-precision kernels): cast them first, e.g. "
                            "jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), params)")
    # NumPy on the host: a check compiles no program of its own
    if not all(isinstance(leaf, jax.core.Tracer) or np.isfinite(np.asarray(leaf)).all()
               for leaf in jax.tree_util.tree_leaves(params)):
        raise ValueError(f"{who}: params contain non-finite values")
