"""posteriors: Laplace-family posteriors built on `linops`.

Every posterior is a `GaussianPosterior` over the flat parameters of a per-example model
``fn(params, x) -> (O,)``: ``.mean``, ``.covariance`` (a `linops` operator), ``.sample(key, n)``
and the linearised predictive.

Examples:
    >>> import jax.numpy as jnp
    >>> import posteriors as pst
    >>> post = pst.projected_posterior(lambda w, x: (x @ w)[None], jnp.ones(2), jnp.array([[1.0, 0.0]]), batch_size=1)
    >>> post.covariance.shape
    (2, 2)
"""

# ruff: noqa: F401  (the imports under TYPE_CHECKING are read by type checkers and the API pages, never run)
from typing import TYPE_CHECKING

# Names are imported when first used (PEP 562), so that ``python -m posteriors --help`` and the modules a
# command does not need never load JAX: the same names as these imports, which type checkers and the
# documentation read.
if TYPE_CHECKING:
    from posteriors import context, data, metrics, predictive, subnetwork, weights
    from posteriors.compilation import use_compilation_cache
    from posteriors.ensemble import DeepEnsemble, deep_ensemble
    from posteriors.fsp import FSPInfo, FSPLaplacePosterior, GPPrior, fsp_laplace, fsp_objective, rkhs_norm
    from posteriors.gaussian import AbstractLowRankPosterior, GaussianPosterior, LowRankPosterior
    from posteriors.io import load, save
    from posteriors.laplace_family import CURVATURES, STRUCTURES, LaplacePosterior, laplace
    from posteriors.marglik import MarglikTraining, marginal_log_likelihood, marglik_training, optimize_prior_precision
    from posteriors.projected import (
        ProjectedPosterior,
        loss_projected_posterior,
        optimal_prior_precision,
        projected_posterior,
    )
    from posteriors.subnetwork import Subnetwork, subnetwork_laplace
    from posteriors.swag_posterior import SWAGPosterior, swag
    from posteriors.weights import last_layer_leaves

_SUBMODULES = ("context", "data", "metrics", "predictive", "subnetwork", "weights")
_HOMES = {
    "posteriors.fsp": ("FSPInfo", "FSPLaplacePosterior", "GPPrior", "fsp_laplace", "fsp_objective", "rkhs_norm"),
    "posteriors.gaussian": ("AbstractLowRankPosterior", "GaussianPosterior", "LowRankPosterior"),
    "posteriors.io": ("load", "save"),
    "posteriors.laplace_family": ("CURVATURES", "STRUCTURES", "LaplacePosterior", "laplace"),
    "posteriors.weights": ("last_layer_leaves",),
    "posteriors.marglik": ("MarglikTraining", "marginal_log_likelihood", "marglik_training",
                           "optimize_prior_precision"),
    "posteriors.projected": ("ProjectedPosterior", "loss_projected_posterior", "optimal_prior_precision",
                             "projected_posterior"),
    "posteriors.subnetwork": ("Subnetwork", "subnetwork_laplace"),
    "posteriors.swag_posterior": ("SWAGPosterior", "swag"),
    "posteriors.ensemble": ("DeepEnsemble", "deep_ensemble"),
    "posteriors.compilation": ("use_compilation_cache",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name):
    import importlib

    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"posteriors.{name}")
    else:
        raise AttributeError(f"module 'posteriors' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"

# The public names: the submodules and every name of _HOMES (listed once, there).
__all__ = [*_SUBMODULES, *_HOME]
