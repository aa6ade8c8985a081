"""posteriors: Laplace-family posteriors built on `linops`.

Every posterior is a `GaussianPosterior` over the flat parameters of a per-example model
``fn(params, x) -> (O,)``: ``.mean``, ``.covariance`` (a `linops` operator), ``.sample(key, n)``
and the linearised predictive.

Example:
    >>> import jax.numpy as jnp
    >>> import posteriors as pst
    >>> post = pst.projected_posterior(lambda w, x: (x @ w)[None], jnp.ones(2), jnp.array([[1.0, 0.0]]), batch_size=1)
    >>> post.covariance.shape
    (2, 2)
"""

from posteriors import context, data, metrics, predictive, subnetwork
from posteriors.fsp import FSPInfo, FSPLaplacePosterior, GPPrior, fsp_laplace, fsp_objective, rkhs_norm
from posteriors.gaussian import GaussianPosterior, LowRankPosterior
from posteriors.io import load, save
from posteriors.laplace_family import STRUCTURES, LaplacePosterior, laplace, last_layer_leaves
from posteriors.marglik import marginal_log_likelihood, optimize_prior_precision
from posteriors.projected import (
    ProjectedPosterior,
    loss_projected_posterior,
    optimal_prior_precision,
    projected_posterior,
)
from posteriors.subnetwork import Subnetwork, subnetwork_laplace

__version__ = "0.1.0"

__all__ = [
    "context", "data", "metrics", "predictive", "load", "save",
    "STRUCTURES", "LaplacePosterior", "laplace", "last_layer_leaves",
    "marginal_log_likelihood", "optimize_prior_precision", "subnetwork", "Subnetwork", "subnetwork_laplace",
    "FSPInfo", "FSPLaplacePosterior", "fsp_laplace", "fsp_objective", "GaussianPosterior", "GPPrior",
    "LowRankPosterior", "loss_projected_posterior", "optimal_prior_precision", "ProjectedPosterior",
    "projected_posterior", "rkhs_norm",
]
