"""The shared posterior interface: a low-rank Gaussian's predictive against the dense J Sigma J^T."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posteriors as pst
from linops.models import ravel
from tests import _draws as draws

from ..linops._util import assert_close


def _fn(w, x):
    return jnp.tanh(x @ w["a"]) @ w["b"]


def _setup():
    key = jax.random.key(0)
    params = {"a": draws.normal(key, (2, 4), jnp.float64), "b": draws.normal(key, (4, 3), jnp.float64)}
    P = ravel(params)[0].shape[0]
    U = draws.normal(jax.random.key(1), (P, 5), jnp.float64)
    d = jnp.array([1.0, 0.5, 0.0, 2.0, 0.1])
    X = draws.normal(jax.random.key(2), (6, 2), jnp.float64)
    return params, U, d, X


def _jacobian(params, X):
    flat, unravel = ravel(params)
    return np.asarray(jax.jacfwd(lambda w: jax.vmap(_fn, in_axes=(None, 0))(unravel(w), X).reshape(-1))(flat))


def test_low_rank_predictive_is_the_dense_tangent_kernel():
    params, U, d, X = _setup()
    post = pst.LowRankPosterior(_fn, params, U, d, batch_size=4)  # 6 inputs in batches of 4 and 2
    Sigma = np.asarray(U) @ np.diag(np.asarray(d)) @ np.asarray(U).T
    assert_close(post.covariance.as_matrix(), Sigma, rtol=1e-12)
    J = _jacobian(params, X)
    mean, var = post.predictive(X)
    assert_close(mean, jax.vmap(_fn, in_axes=(None, 0))(params, X), rtol=1e-12)
    assert_close(var.reshape(-1), np.diag(J @ Sigma @ J.T), rtol=1e-10)
    assert_close(post.predictive_covariance(X).as_matrix(), J @ Sigma @ J.T, rtol=1e-10)


def test_samples_have_the_analytic_moments():
    params, U, d, X = _setup()
    post = pst.LowRankPosterior(_fn, params, U, d)
    n = 20000
    theta = np.asarray(post.sample(jax.random.key(3), n))
    Sigma = np.asarray(U) @ np.diag(np.asarray(d)) @ np.asarray(U).T
    emp = np.cov(theta.T)
    # each entry's Monte Carlo standard error is about sqrt((S_ii S_jj + S_ij^2) / n)
    se = np.sqrt((np.outer(np.diag(Sigma), np.diag(Sigma)) + Sigma**2) / n)
    assert np.all(np.abs(emp - Sigma) < 5 * se + 1e-12)
    f = np.asarray(post.predictive_samples(jax.random.key(4), X, n)).reshape(n, -1)
    var = np.asarray(post.predictive(X)[1]).reshape(-1)
    assert np.all(np.abs(f.var(axis=0) - var) < 5 * np.sqrt(2 / n) * var)  # the variance's standard error


def test_bad_factor_shapes():
    params, U, d, _ = _setup()
    with pytest.raises(ValueError, match=r"U must have shape \(20, r\) for 20 parameters"):
        pst.LowRankPosterior(_fn, params, U[:3])
    with pytest.raises(ValueError, match=r"d must have shape \(5,\)"):
        pst.LowRankPosterior(_fn, params, U, d[:2])
