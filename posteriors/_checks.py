"""Input checks shared by every posterior: each names the function, what it expected and what it got.

They run before any expensive work (a GGN, a projection, a Cholesky factor).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from linops.likelihoods import Flattened, Likelihood, with_positions
from linops.models import example_spec


def check_likelihood(likelihood, who: str) -> None:
    """``likelihood`` is a `linops.likelihoods.Likelihood`."""
    if not isinstance(likelihood, Likelihood):
        raise TypeError(f"{who}: likelihood must be a linops.likelihoods.Likelihood, got {type(likelihood).__name__}")


def check_data(data, who: str, what: str = "data") -> tuple:
    """``data`` is an ``(inputs, targets)`` pair of finite values; returns it."""
    if not (isinstance(data, tuple) and len(data) == 2):
        raise ValueError(f"{who}: {what} must be an (inputs, targets) pair, got "
                         + (f"a tuple of {len(data)}" if isinstance(data, tuple) else type(data).__name__))
    check_examples(data[0], who, f"the {what}")
    check_finite(data[0], who, f"the {what}'s inputs")
    check_finite(data[1], who, f"the {what}'s targets")
    return data


def check_examples(inputs, who: str, what: str = "the inputs") -> None:
    """``inputs`` hold at least one example (a leading axis of length 0 is refused in ``who``'s name)."""
    first = next((leaf for leaf in jax.tree_util.tree_leaves(inputs) if np.ndim(leaf)), None)
    if first is not None and np.shape(first)[0] == 0:
        raise ValueError(f"{who}: no examples in {what} (inputs of shape {tuple(np.shape(first))}); at least one "
                         "is needed")


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


def check_targets(fn, params, data, likelihood, who: str) -> None:
    """The targets fit the model and the likelihood (as `linops.GGNOp` checks them for the Laplace family): as many
    as the inputs, and of the likelihood's shape and range for the model's number of outputs (a label past the
    classes, a negative label, an ``(N,)`` target for a two-output model are refused). Reads shapes only
    (`jax.eval_shape`): no program is compiled."""
    inputs, targets = data
    num_examples, num_outputs = model_outputs(fn, params, inputs, who)
    likelihood.check(num_outputs, targets, num_examples, who)


def model_outputs(fn, params, inputs, who: str) -> tuple[int, int]:
    """``(N, O)``: the number of examples in ``inputs`` (at least one) and of the model's outputs for one, read
    from shapes alone (`jax.eval_shape`), with a clear error for inputs or a model that do not fit."""
    num_examples, shape = output_shape(fn, params, inputs, who)
    if len(shape) != 1:
        raise ValueError(f"{who}: fn(params, x) must return a 1-D vector of outputs for one example, got shape "
                         f"{shape}" + (" (outputs with a position axis, (T, V), are posteriors.laplace's)"
                                       if len(shape) > 1 else ""))
    return num_examples, shape[0]


def with_position_axis(fn, params, inputs, likelihood, who: str):
    """``(fn, likelihood)`` for the library's one-vector-per-example form: a model whose output for one example has
    several axes (``(T, V)``: positions, then the outputs of each) is read flattened (`linops.likelihoods.Flattened`)
    with its likelihood summed over positions (`linops.likelihoods.PerPosition`); a model of 1-D outputs is
    returned as it is. Reads shapes only."""
    if isinstance(fn, Flattened):
        return fn, with_positions(likelihood, fn.shape)
    _, shape = output_shape(fn, params, inputs, who)
    if len(shape) < 2:
        return fn, likelihood
    try:
        likelihood = with_positions(likelihood, shape)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{who}: the model returns outputs of shape {shape} per example (positions, then "
                         f"outputs), read with the likelihood at every position; {e}") from None
    return Flattened(fn, shape), likelihood


def output_shape(fn, params, inputs, who: str) -> tuple[int, tuple[int, ...]]:
    """``(N, shape)``: the number of examples in ``inputs`` (at least one) and the shape of the model's output for
    one, read from shapes alone (`jax.eval_shape`)."""
    leaves = jax.tree_util.tree_leaves(inputs)
    if not leaves or any(jnp.ndim(a) == 0 for a in leaves):
        raise ValueError(f"{who}: the inputs must be a batch (N, ...) of examples, got "
                         f"{[jnp.shape(a) for a in leaves]}")
    check_examples(inputs, who)
    num_examples = jnp.shape(leaves[0])[0]
    try:
        out = jax.eval_shape(fn, params, example_spec(inputs))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{who}: the model fails on one input ({e})") from e
    if not hasattr(out, "shape") or len(out.shape) == 0:
        raise ValueError(f"{who}: fn(params, x) must return a 1-D vector of outputs for one example, got shape "
                         f"{getattr(out, 'shape', type(out).__name__)}")
    return num_examples, tuple(out.shape)
