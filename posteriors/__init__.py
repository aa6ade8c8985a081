"""posteriors: Laplace-family posteriors built on `linops`.

Example:
    >>> import jax.numpy as jnp
    >>> import posteriors as pst
    >>> post = pst.projected_posterior(lambda w, x: (x @ w)[None], jnp.ones(2), jnp.array([[1.0, 0.0]]), batch_size=1)
    >>> post.covariance.shape
    (2, 2)
"""

from posteriors import context
from posteriors.projected import (
    ProjectedPosterior,
    loss_projected_posterior,
    optimal_prior_precision,
    projected_posterior,
)

__version__ = "0.1.0"

__all__ = [
    "context", "ProjectedPosterior", "loss_projected_posterior", "optimal_prior_precision", "projected_posterior",
]
