"""The minibatch objective SWAG's SGD and the deep ensemble's members share."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def positive_int(value, name: str, who: str, minimum: int = 1) -> int:
    """``value`` if it is an integer of at least ``minimum``, else a `ValueError` naming ``who`` and ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{who}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_step_settings(who: str, learning_rate, prior_precision) -> None:
    """A positive learning rate and a non-negative prior precision (weight decay), before any step."""
    if not float(learning_rate) > 0:
        raise ValueError(f"{who}: learning_rate must be positive, got {learning_rate!r}")
    if not bool(np.all(np.asarray(prior_precision) >= 0)):
        raise ValueError(f"{who}: prior_precision must be >= 0 (a weight decay), got {prior_precision!r}")


def minibatch_loss(fn, unravel, data, likelihood, prior_precision, dtype):
    r"""``loss(theta, idx)``: the mean negative log-likelihood of the examples ``idx`` of ``data`` plus
    $\tfrac{\alpha}{2N}\|\theta\|^2$ (weight decay $\alpha / N$), ``theta`` a flat parameter vector. A
    per-example likelihood (one noise scale per example) is indexed along with the data."""
    X, Y = data
    n = jax.tree_util.tree_leaves(X)[0].shape[0]
    lik_axis = 0 if likelihood.per_example else None
    alpha = jnp.asarray(prior_precision, dtype)

    def loss(theta, idx):
        out = jax.vmap(fn, in_axes=(None, 0))(unravel(theta), jax.tree_util.tree_map(lambda a: a[idx], X))
        lik = jax.tree_util.tree_map(lambda a: a[idx], likelihood) if lik_axis == 0 else likelihood
        nll = jnp.mean(jax.vmap(lambda lk, f, y: lk.nll(f, y), in_axes=(lik_axis, 0, 0))(lik, out, Y[idx]))
        return nll + 0.5 * jnp.sum(alpha * theta**2) / n

    return loss
