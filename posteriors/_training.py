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


def check_rate(value, name: str, who: str) -> None:
    """A step size is a finite positive scalar (a traced one: its shape only), else a `ValueError` naming it."""
    if np.shape(value) != ():
        raise ValueError(f"{who}: {name} must be a scalar, got an array of shape {np.shape(value)}")
    if not isinstance(value, jax.core.Tracer) and not (np.isfinite(value) and value > 0):
        raise ValueError(f"{who}: {name} must be finite and positive, got {value!r}")


def check_step_settings(who: str, learning_rate, prior_precision, num_params: int, momentum=0.0) -> None:
    """Before any step: a finite positive scalar learning rate, a finite non-negative prior precision (weight
    decay), scalar or one per parameter (``num_params``), and a momentum in [0, 1). Traced values (under
    `jax.jit`) have their shapes checked only."""
    check_rate(learning_rate, "learning_rate", who)
    if np.shape(prior_precision) not in ((), (num_params,)):
        raise ValueError(f"{who}: prior_precision must be a scalar or one per parameter, shape ({num_params},), "
                         f"got shape {np.shape(prior_precision)}")
    if not isinstance(prior_precision, jax.core.Tracer):
        alpha = np.asarray(prior_precision)
        if not (np.all(np.isfinite(alpha)) and np.all(alpha >= 0)):
            raise ValueError(f"{who}: prior_precision must be finite and >= 0 (a weight decay), got "
                             f"{prior_precision!r}")
    if np.shape(momentum) != () or (not isinstance(momentum, jax.core.Tracer) and not 0 <= momentum < 1):
        raise ValueError(f"{who}: momentum must be a number in [0, 1) (SGD diverges at 1 and above), got "
                         f"{momentum!r}")


def check_trained(who: str, remedy: str, **states) -> None:
    """After training: every state is finite, else a `ValueError` naming the states with non-finite entries and
    ``remedy``, so that a diverged run is never returned as a posterior. Traced states are not checked."""
    bad = {name: int(np.size(v) - np.isfinite(np.asarray(v)).sum()) for name, v in states.items()
           if not isinstance(v, jax.core.Tracer)}
    bad = {name: count for name, count in bad.items() if count}
    if bad:
        listed = ", ".join(f"{name} has {count} non-finite entries" for name, count in bad.items())
        raise ValueError(f"{who}: the run diverged ({listed}); {remedy}")


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
