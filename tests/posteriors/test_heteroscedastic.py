"""Heteroscedastic regression: a network that predicts its mean and log-variance (`HeteroscedasticGaussian`), its
GGN, evidence and predictive against the dense computation by hand, and against the fixed-noise Gaussian where
the log-variance head is one constant parameter."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posteriors as pst
from linops.likelihoods import Gaussian, HeteroscedasticGaussian
from linops.models import from_equinox, ravel
from tests import _draws as draws

from ..linops._util import assert_close


def _problem():
    fn, params = from_equinox(eqx.nn.MLP(1, 2, 6, 1, activation=jnp.tanh, key=jax.random.key(0),
                                         dtype=jnp.float64))
    X = jnp.linspace(-2, 2, 25)[:, None]
    Y = jnp.sin(2 * X) + 0.1 * (1 + X**2) * draws.normal(jax.random.key(1), (25, 1), jnp.float64)
    return fn, params, X, Y


def test_ggn_evidence_and_predictive_match_the_dense_computation():
    fn, params, X, Y = _problem()
    lik, alpha = HeteroscedasticGaussian(), 0.8
    post = pst.laplace(fn, params, (X, Y), lik, structure="full", prior_precision=alpha, progress=False)
    flat, unravel = ravel(params)
    J = jax.vmap(jax.jacobian(lambda th, x: fn(unravel(th), x)), in_axes=(None, 0))(flat, X)  # (N, 2, P)
    out = jax.vmap(fn, in_axes=(None, 0))(params, X)
    W = jnp.stack([jnp.exp(-out[:, 1]), jnp.full(25, 0.5)], axis=1)  # the Fisher of (mu, s) per example
    G = jnp.einsum("nop,no,noq->pq", J, W, J)
    P = flat.shape[0]
    Sigma = jnp.linalg.inv(G + alpha * jnp.eye(P))
    assert_close(post.covariance.as_matrix(), Sigma, rtol=1e-10)
    loss = jnp.sum(jax.vmap(lik.nll)(out, Y))
    expected = (-loss - 0.5 * alpha * flat @ flat + 0.5 * P * np.log(alpha)
                - 0.5 * jnp.linalg.slogdet(G + alpha * jnp.eye(P))[1])
    assert_close(pst.marginal_log_likelihood(post), expected, rtol=1e-10)
    # the predictive's moments: Var[mu] + E[exp(s)], s ~ N(s*, Var[s]) under the linearisation
    T = jnp.array([[-3.0], [0.5], [2.5]])
    Jt = jax.vmap(jax.jacobian(lambda th, x: fn(unravel(th), x)), in_axes=(None, 0))(flat, T)
    ft = jax.vmap(fn, in_axes=(None, 0))(params, T)
    var_f = jnp.einsum("nop,pq,noq->no", Jt, Sigma, Jt)
    mean, var = pst.predictive.regression(post, T, progress=False)
    assert_close(mean, ft[:, :1], rtol=1e-12)
    assert_close(var, var_f[:, :1] + jnp.exp(ft[:, 1:] + var_f[:, 1:] / 2), rtol=1e-10)
    Yt = jnp.array([[0.1], [0.2], [-0.3]])
    assert_close(pst.predictive.nll(post, T, Yt, progress=False),
                 -jnp.sum(jax.scipy.stats.norm.logpdf(Yt, mean, jnp.sqrt(var))), rtol=1e-10)


def test_a_constant_log_variance_is_the_fixed_noise_gaussian():
    """A model whose log-variance output is one parameter c: its mean block is the Gaussian(sigma = e^{c/2}) GGN
    exactly, the c block N/2, no cross term (the Fisher is block-diagonal in (mu, s))."""
    X = draws.normal(jax.random.key(0), (30, 3), jnp.float64)
    Y = X @ jnp.array([1.0, -2.0, 0.5]) + 0.3 * draws.normal(jax.random.key(1), (30,), jnp.float64)
    c = jnp.log(0.3**2)
    het = lambda p, x: jnp.stack([x @ p["w"], p["c"]])  # noqa: E731
    hom = lambda w, x: (x @ w)[None]  # noqa: E731
    w = jnp.array([0.9, -1.8, 0.4])
    post = pst.laplace(het, {"c": c, "w": w}, (X, Y[:, None]), HeteroscedasticGaussian(), prior_precision=1.0,
                       progress=False)
    ref = pst.laplace(hom, w, (X, Y[:, None]), Gaussian(0.3), prior_precision=1.0, progress=False)
    G = post.ggn.G  # leaves in key order: c, then w
    assert_close(G[1:, 1:], ref.ggn.G, rtol=1e-12)
    assert_close(G[0, 0], 15.0, rtol=1e-12)
    assert_close(G[0, 1:], jnp.zeros(3), atol=1e-12)
    mean, var = pst.predictive.regression(post, X[:4], progress=False)
    mean_ref, var_ref = pst.predictive.linearized(ref, X[:4])
    var_c = 1 / (15.0 + 1.0)  # the c block's posterior variance (no cross term)
    assert_close(mean, mean_ref, rtol=1e-12)
    assert_close(var, var_ref + jnp.exp(c + var_c / 2), rtol=1e-10)


def test_bad_heteroscedastic_use_is_refused():
    fn, params, X, Y = _problem()
    with pytest.raises(ValueError, match="a HeteroscedasticGaussian likelihood needs targets of shape \\(25, 1\\)"):
        pst.laplace(fn, params, (X, jnp.concatenate([Y, Y], axis=1)), HeteroscedasticGaussian())
    post = pst.laplace(fn, params, (X, Y), HeteroscedasticGaussian(), structure="diag", progress=False)
    with pytest.raises(ValueError, match="predicts its noise; sigma must be None"):
        pst.predictive.regression(post, X, sigma=0.1)
    with pytest.raises(ValueError, match="nll: a Gaussian likelihood needs real targets of shape \\(25, 1\\)"):
        pst.predictive.nll(post, X, jnp.concatenate([Y, Y], axis=1))
    with pytest.raises(ValueError, match="sigma can be changed for a Gaussian likelihood"):
        post.with_prior(sigma=0.5)
