"""`structure="functional"`: the linearised Laplace posterior as a GP on M training points, held in weight space as
the exact SVD of their GGN; against the full GGN (M = N, an identity) and the dense posterior of a subset."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical
from linops.models import from_equinox, ravel
from linops.testing import count_compilations as compiles
from tests import _draws as draws

from ..linops._util import assert_close


def _problem(seed=0):
    fn, params = from_equinox(eqx.nn.MLP(2, 3, 5, 1, activation=jnp.tanh, key=jax.random.key(0),
                                         dtype=jnp.float64))
    params = jax.tree_util.tree_map(lambda a: a * (1 + 0.1 * seed), params)
    X = draws.normal(jax.random.key(1 + seed), (20, 2), jnp.float64)
    return fn, params, X, jnp.arange(20) % 3


def test_every_point_is_the_full_ggn_posterior():
    fn, params, X, y = _problem()
    full = pst.laplace(fn, params, (X, y), Categorical(), structure="full", prior_precision=0.7, progress=False)
    fun = pst.laplace(fn, params, (X, y), Categorical(), structure="functional", prior_precision=0.7, progress=False)
    assert fun.structure == "functional" and np.array_equal(np.asarray(fun.ggn.points), np.arange(20))
    assert_close(fun.covariance.as_matrix(), full.covariance.as_matrix(), rtol=1e-10)
    assert_close(pst.marginal_log_likelihood(fun), pst.marginal_log_likelihood(full), rtol=1e-10)
    assert_close(pst.marginal_log_likelihood(fun, 3.0), pst.marginal_log_likelihood(full, 3.0), rtol=1e-10)
    _, var = pst.predictive.linearized(fun, X[:5])
    _, var_full = pst.predictive.linearized(full, X[:5])
    assert_close(var, var_full, rtol=1e-10)
    draws = fun.sample(jax.random.key(0), 4000)  # the low-rank structure's sampler
    flat, _ = ravel(params)
    assert_close(jnp.cov(draws.T), full.covariance.as_matrix(), atol=0.15 * float(jnp.max(jnp.diag(
        full.covariance.as_matrix()))))
    assert_close(jnp.mean(draws, axis=0), flat, atol=0.1)


def test_a_subset_is_the_posterior_of_its_points_ggn_and_a_refit_compiles_nothing():
    fn, params, X, y = _problem()
    sub = pst.laplace(fn, params, (X, y), Categorical(), structure="functional", num_points=6, key=jax.random.key(3),
                      prior_precision=0.7, progress=False)
    idx = np.asarray(sub.ggn.points)
    assert idx.shape == (6,) and len(set(idx.tolist())) == 6 and np.all(np.diff(idx) > 0)
    G = lo.GGNOp(fn, params, X[idx], y[idx], Categorical()).as_matrix()
    P = G.shape[0]
    assert_close(sub.covariance.as_matrix(), jnp.linalg.inv(G + 0.7 * jnp.eye(P)), rtol=1e-10)
    # the evidence: its data term over all N, its curvature the subset's
    loss = jnp.sum(jax.vmap(lambda x, t: Categorical().nll(fn(params, x), t))(X, y))
    flat, _ = ravel(params)
    expected = (-loss - 0.35 * flat @ flat + 0.5 * P * np.log(0.7) - 0.5 * jnp.linalg.slogdet(G + 0.7 * jnp.eye(P))[1])
    assert_close(pst.marginal_log_likelihood(sub), expected, rtol=1e-10)
    fn2, params2, X2, y2 = _problem(1)
    with compiles() as events:
        again = pst.laplace(fn, params2, (X2, y2), Categorical(), structure="functional", num_points=6,
                            key=jax.random.key(4), prior_precision=0.7, progress=False)
        jax.block_until_ready(again)
    assert events == [], f"{len(events)} compilations on the second call"


def test_bad_functional_options_are_refused():
    fn, params, X, y = _problem()
    with pytest.raises(ValueError, match="num_points=6 of the 20 examples is drawn at random: pass key="):
        pst.laplace(fn, params, (X, y), Categorical(), structure="functional", num_points=6)
    with pytest.raises(ValueError, match="num_points must be in \\[1, 20\\], got 21"):
        pst.laplace(fn, params, (X, y), Categorical(), structure="functional", num_points=21)
    with pytest.raises(ValueError, match="num_points is structure='functional''s"):
        pst.laplace(fn, params, (X, y), Categorical(), structure="diag", num_points=5)
    with pytest.raises(ValueError, match="the GP view is the GGN's"):
        pst.laplace(fn, params, (X, y), Categorical(), structure="functional", curvature="hessian")


def test_a_subset_takes_its_rows_of_a_per_example_likelihood():
    """A per-example (heteroscedastic) noise is subset with its points: the posterior is the dense one of the
    subset's own noises."""
    fn = lambda w, x: (x @ w)[None]  # noqa: E731
    X = draws.normal(jax.random.key(0), (15, 3), jnp.float64)
    sigma = 0.2 + jnp.arange(15.0) / 10
    Y = X @ jnp.array([1.0, -1.0, 0.5]) + sigma * draws.normal(jax.random.key(1), (15,), jnp.float64)
    from linops.likelihoods import Gaussian

    post = pst.laplace(fn, jnp.zeros(3), (X, Y[:, None]), Gaussian(sigma, heteroscedastic=True),
                       structure="functional", num_points=5, key=jax.random.key(2), prior_precision=0.5,
                       progress=False)
    idx = np.asarray(post.ggn.points)
    Xs = X[idx] / sigma[idx][:, None]
    assert_close(post.covariance.as_matrix(), jnp.linalg.inv(Xs.T @ Xs + 0.5 * jnp.eye(3)), rtol=1e-10)
