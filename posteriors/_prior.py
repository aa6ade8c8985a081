r"""The prior precision and the Gaussian noise of a Laplace posterior: their forms, checks and the GGN's scale.

One place for the rules `posteriors.laplace`, `LaplacePosterior.with_prior`, the evidence and its tuning
share. A prior precision $\alpha$ is a positive scalar, one per parameter (``(P,)`` or a params-shaped
pytree of arrays) or one per leaf (a params-shaped pytree of scalars); `canonical_prior` turns any of them
into a scalar or a vector over the covered weights (`posteriors.weights`), and asks the curvature
structure whether it takes that form (KFAC: one per leaf at most). The GGN of a Gaussian likelihood scales
as $1/\sigma^2$: a posterior keeps the GGN of its fit's noise $\sigma_0$ and the scale
$s = \sigma^2/\sigma_0^2$ of the current one (`noise_scale`).

Examples:
    >>> import jax.numpy as jnp
    >>> from posteriors._prior import canonical_prior
    >>> from posteriors.weights import AllWeights
    >>> canonical_prior({"a": 2.0, "b": jnp.ones(2)}, {"a": jnp.zeros(3), "b": jnp.zeros(2)}, AllWeights(),
    ...                 who="example").tolist()
    [2.0, 2.0, 2.0, 1.0, 1.0]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from linops.likelihoods import Gaussian
from linops.models import unravel_of


def canonical_prior(prior, params, weights, structure=None, *, who: str):
    """A scalar, or one precision per covered parameter (``weights.take`` of one per parameter), as an array.

    ``structure``: the curvature's `StructuredGGN` class, whose ``check_prior`` refuses a form it cannot take.
    Concrete priors are read and checked with NumPy on the host and moved to the device once: a check compiles
    no program of its own. A traced prior (tuning under ``jax.grad``) is kept traced, unchecked.
    """
    unravel = unravel_of(params)
    P, dtype = unravel.size, unravel.dtype
    subset = weights.indices
    traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((prior, subset)))
    xp = jnp if traced else np
    subset = None if subset is None else (subset if traced else np.asarray(subset))
    if isinstance(prior, (int, float, np.number)) or (hasattr(prior, "ndim") and jnp.ndim(prior) == 0):
        alpha = xp.asarray(prior, dtype)
    elif isinstance(prior, (jax.Array, np.ndarray)) and jnp.ndim(prior) == 1:
        alpha = xp.asarray(prior, dtype)
        if alpha.shape[0] != P:
            raise ValueError(f"{who}: a prior precision per parameter needs shape ({P},), got {alpha.shape}")
        if subset is not None:
            alpha = alpha[subset]
    else:
        try:
            leaves = jax.tree_util.tree_leaves(params)
            given = jax.tree_util.tree_leaves(prior)
            if len(given) != len(leaves):
                raise ValueError
            alpha = xp.concatenate([xp.broadcast_to(xp.asarray(g, dtype), jnp.shape(leaf)).reshape(-1)
                                    for g, leaf in zip(given, leaves, strict=True)])
        except (ValueError, TypeError):
            raise ValueError(f"{who}: prior_precision must be a positive scalar, an array of shape ({P},), or a "
                             "pytree shaped like params (one scalar or array per leaf)") from None
        if subset is not None:
            alpha = alpha[subset]
    if traced:
        return alpha
    if not np.all(alpha > 0):
        raise ValueError(f"{who}: prior_precision must be positive, got min {float(np.min(alpha))}")
    if not np.all(np.isfinite(alpha)):  # an infinite precision is a point mass: no posterior, NaN downstream
        raise ValueError(f"{who}: prior_precision must be finite, got {int(np.sum(~np.isfinite(alpha)))} infinite "
                         "value(s); to fix weights, leave them out (subset_of_weights) instead")
    if structure is not None and alpha.ndim == 1:
        structure.check_prior(alpha, weights.group_sizes(params), who)
    return jax.device_put(alpha)  # a transfer (jnp.asarray of a NumPy array compiles a program)


def gaussian_loss(residual_ss, num_examples, sigma):
    r"""$\sum_n -\log \mathcal N(y_n \mid f_n, \sigma^2 I)$ from the residual sums of squares per output."""
    num_outputs = residual_ss.shape[0]
    return 0.5 * jnp.sum(residual_ss) / sigma**2 + num_examples * num_outputs * (jnp.log(sigma) +
                                                                              0.5 * jnp.log(2 * jnp.pi))


def check_sigma(post, sigma, who):
    """``sigma`` as a scalar array of the parameters' dtype, refused unless the likelihood is Gaussian with one
    scalar sigma."""
    lik = post.likelihood
    if not isinstance(lik, Gaussian) or lik.heteroscedastic or jnp.ndim(lik.sigma) != 0:
        raise ValueError(f"{who}: sigma can be changed for a Gaussian likelihood with one scalar sigma only, "
                         f"got {type(lik).__name__}" + (f" with sigma of shape {jnp.shape(lik.sigma)}"
                                                       if isinstance(lik, Gaussian) else ""))
    if jnp.ndim(sigma) != 0:
        raise ValueError(f"{who}: sigma must be a scalar, got shape {jnp.shape(sigma)}")
    if isinstance(sigma, jax.Array):
        return sigma.astype(unravel_of(post.params).dtype)
    return jax.device_put(np.asarray(sigma, unravel_of(post.params).dtype))


def noise_scale(post, sigma):
    """``(s, loss)`` at the Gaussian noise ``sigma`` (checked by `check_sigma`, or traced while tuning): the GGN's
    scale $s = \\sigma^2/\\sigma_0^2$ ($s^2$ for the empirical Fisher) and the evidence's data term. The
    stored GGN was computed at the fit's noise $\\sigma_0^2$ = ``likelihood.sigma**2 / noise_scale`` (its square
    root for the empirical Fisher)."""
    # the empirical Fisher's gradients carry 1/sigma^2 each: it scales as sigma^-4, the stored scale is s^2
    power = 2 if getattr(post, "curvature", "ggn") == "ef" else 1
    sigma0_sq = post.likelihood.sigma**2 / post.noise_scale ** (1 / power)
    return (sigma**2 / sigma0_sq) ** power, gaussian_loss(post.residual_ss, post.num_examples, sigma)


__all__ = ["canonical_prior", "check_sigma", "gaussian_loss", "noise_scale"]
