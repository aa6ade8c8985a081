"""`laplace(curvature=...)`: the empirical Fisher, a Monte-Carlo Fisher and the Hessian in each structure, against
their dense definitions (float64); their evidence, noise re-tuning and refusals; a refit compiles nothing."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical, EmpiricalFisher, Gaussian, MonteCarloFisher
from linops.models import from_equinox, ravel
from linops.testing import count_compilations as compiles
from tests import _draws as draws

from ..linops._util import assert_close


def _problem(seed=0, n=12):
    fn, params = from_equinox(eqx.nn.MLP(3, 2, 4, 1, activation=jnp.tanh, key=jax.random.key(0),
                                         dtype=jnp.float64))
    params = jax.tree_util.tree_map(lambda a: a * (1.0 + 0.1 * seed), params)
    X = draws.normal(jax.random.key(10 + seed), (n, 3), jnp.float64)
    Y = draws.normal(jax.random.key(20 + seed), (n, 2), jnp.float64)
    return fn, params, X, Y


def _dense(curvature, fn, params, X, Y, lik, key=None, num_samples=1):
    """The curvature by its definition: per-example gradients (EF), drawn targets' gradients (MC Fisher, with
    the keys `laplace` derives from ``key``), the Hessian of the summed loss."""
    flat, unravel = ravel(params)
    nll = lambda th, x, y: lik.nll(fn(unravel(th), x), y)  # noqa: E731
    if curvature == "ef":
        g = jax.vmap(jax.grad(nll), in_axes=(None, 0, 0))(flat, X, Y)
        return g.T @ g
    if curvature == "hessian":
        return jax.hessian(lambda th: jnp.sum(jax.vmap(nll, in_axes=(None, 0, 0))(th, X, Y)))(flat)
    _, keys = MonteCarloFisher.with_keys(Y, jax.random.fold_in(key, 1))
    F = 0.0
    for n in range(X.shape[0]):
        draws = lik.sample(jax.random.wrap_key_data(keys[n]), fn(params, X[n]), num_samples)
        g = jax.vmap(jax.grad(nll), in_axes=(None, None, 0))(flat, X[n], draws)
        F = F + g.T @ g / num_samples
    return F


def _alpha(M):
    """A prior precision that makes M + alpha definite with room (the Hessian here is indefinite)."""
    return float(max(1.0, 1.0 - np.linalg.eigvalsh(np.asarray(M)).min()))


@pytest.mark.parametrize("curvature", ["ef", "fisher", "hessian"])
def test_full_and_diag_posteriors_of_each_curvature_match_the_dense_definition(curvature):
    fn, params, X, Y = _problem()
    lik, key = Gaussian(0.3), jax.random.key(3)
    M = _dense(curvature, fn, params, X, Y, lik, key, num_samples=2)
    alpha = _alpha(M)
    kw = {"key": key, "num_samples": 2} if curvature == "fisher" else {}
    P = M.shape[0]
    for structure, ref in (("full", M), ("diag", jnp.diag(jnp.diag(M)))):
        post = pst.laplace(fn, params, (X, Y), lik, structure=structure, curvature=curvature, prior_precision=alpha,
                           batch_size=5, progress=False, **kw)
        assert post.curvature == curvature
        assert_close(post.covariance.as_matrix(), jnp.linalg.inv(ref + alpha * jnp.eye(P)), rtol=1e-10)
        # the evidence: -loss - alpha |theta|^2 / 2 + P log(alpha) / 2 - logdet(M + alpha) / 2, by hand
        flat, _ = ravel(params)
        loss = jnp.sum(jax.vmap(lambda x, y: lik.nll(fn(params, x), y))(X, Y))
        expected = (-loss - 0.5 * alpha * flat @ flat + 0.5 * P * np.log(alpha)
                    - 0.5 * jnp.linalg.slogdet(ref + alpha * jnp.eye(P))[1])
        assert_close(pst.marginal_log_likelihood(post), expected, rtol=1e-10)


@pytest.mark.parametrize("curvature", ["ef", "fisher"])
def test_kfac_and_lowrank_posteriors_of_the_fishers(curvature):
    """KFAC from the wrapped likelihood's factors (`linops.kfac`, tested against hand-made factors there); low rank
    at full Lanczos depth is the dense curvature's top eigenpairs."""
    fn, params, X, Y = _problem()
    lik, key = Gaussian(0.3), jax.random.key(3)
    kw = {"key": key} if curvature == "fisher" else {}
    post = pst.laplace(fn, params, (X, Y), lik, structure="kfac", curvature=curvature, prior_precision=2.0,
                       progress=False, **kw)
    wrapped = EmpiricalFisher(lik) if curvature == "ef" else MonteCarloFisher(lik)
    targets = Y if curvature == "ef" else wrapped.with_keys(Y, jax.random.fold_in(key, 1))
    K = lo.kfac(fn, params, X, targets, wrapped)
    first, second = K.factors[0]
    W_block = np.kron(np.asarray(first), np.asarray(second)) + 2.0 * np.eye(first.shape[0] * second.shape[0])
    P_kfac = post.precision.as_matrix()
    assert_close(P_kfac[:W_block.shape[0], :W_block.shape[0]], W_block, rtol=1e-10)
    ggn_kfac = pst.laplace(fn, params, (X, Y), lik, structure="kfac", prior_precision=2.0, progress=False)
    assert not np.allclose(P_kfac, ggn_kfac.precision.as_matrix(), rtol=1e-3)  # a different curvature indeed
    M = _dense(curvature, fn, params, X, Y, lik, key)
    P = M.shape[0]
    low = pst.laplace(fn, params, (X, Y), lik, structure="lowrank", rank=4, num_steps=P, curvature=curvature,
                      prior_precision=2.0, progress=False, key=key)
    w = np.linalg.eigvalsh(np.asarray(M))[::-1][:4]
    assert_close(np.sort(np.asarray(low.ggn.lam))[::-1], w, rtol=1e-8)


def test_the_hessian_of_a_linear_gaussian_model_is_the_ggn():
    """Bayesian linear regression: the Hessian is the GGN (X^T X / sigma^2), so every quantity is the closed form,
    also after the noise is re-tuned (it scales as sigma^-2, as the GGN does)."""
    fn = lambda w, x: x @ w  # noqa: E731
    W = draws.normal(jax.random.key(0), (3, 2), jnp.float64)
    X = draws.normal(jax.random.key(1), (20, 3), jnp.float64)
    Y = X @ W + 0.1 * draws.normal(jax.random.key(2), (20, 2), jnp.float64)
    for structure in ("full", "diag"):
        h = pst.laplace(fn, W, (X, Y), Gaussian(0.2), structure=structure, curvature="hessian", prior_precision=0.5,
                        progress=False)
        g = pst.laplace(fn, W, (X, Y), Gaussian(0.2), structure=structure, prior_precision=0.5, progress=False)
        assert_close(h.covariance.as_matrix(), g.covariance.as_matrix(), rtol=1e-10)
        assert_close(pst.marginal_log_likelihood(h, sigma=0.35), pst.marginal_log_likelihood(g, sigma=0.35),
                     rtol=1e-10)
        tuned_h, _ = pst.optimize_prior_precision(h, num_steps=50, progress=False)
        tuned_g, _ = pst.optimize_prior_precision(g, num_steps=50, progress=False)
        assert_close(tuned_h.prior_precision, tuned_g.prior_precision, rtol=1e-8)


@pytest.mark.parametrize("curvature", ["ef", "fisher", "hessian"])
def test_a_re_tuned_noise_scales_each_curvature_as_a_fresh_fit_does(curvature):
    """with_prior(sigma=s1) of a fit at s0 equals a fit at s1: the empirical Fisher scales as sigma^-4 (its
    gradients carry 1/sigma^2 each), the Monte-Carlo Fisher (same draws of the noise) and the Hessian as
    sigma^-2. A wrong power fails this by (s1/s0)^2 = 4."""
    fn, params, X, Y = _problem()
    kw = {"key": jax.random.key(3)} if curvature == "fisher" else {}
    alpha = _alpha(_dense(curvature, fn, params, X, Y, Gaussian(0.3), jax.random.key(3)))  # definite at both
    at = lambda s: pst.laplace(fn, params, (X, Y), Gaussian(s), structure="full", curvature=curvature,  # noqa: E731
                               prior_precision=alpha, progress=False, **kw)
    moved = at(0.3).with_prior(sigma=0.6)
    fresh = at(0.6)
    assert_close(moved.covariance.as_matrix(), fresh.covariance.as_matrix(), rtol=1e-9)
    assert_close(pst.marginal_log_likelihood(moved), pst.marginal_log_likelihood(fresh), rtol=1e-9)
    # and back again
    assert_close(moved.with_prior(sigma=0.3).covariance.as_matrix(), at(0.3).covariance.as_matrix(), rtol=1e-9)


def test_an_indefinite_hessian_is_refused_or_named_never_silently_used():
    fn, params, X, Y = _problem()
    lik = Gaussian(0.3)
    H = _dense("hessian", fn, params, X, Y, lik)
    lowest = float(np.linalg.eigvalsh(np.asarray(H)).min())
    assert lowest < -1.0  # the network's curvature weighted by its residuals: indefinite at these weights
    for structure in ("full", "diag"):
        with pytest.raises(ValueError, match="Hessian .* is not positive definite: the Hessian of the data term "
                                             "is indefinite"):
            pst.laplace(fn, params, (X, Y), lik, structure=structure, curvature="hessian", prior_precision=1e-3,
                        progress=False)
    post = pst.laplace(fn, params, (X, Y), lik, structure="full", curvature="hessian", prior_precision=_alpha(H),
                       progress=False)
    with pytest.raises(ValueError, match="with_prior: .* not positive definite"):
        post.with_prior(1e-3)
    with pytest.raises(ValueError, match="evidence of this Hessian posterior has no maximum"):
        pst.optimize_prior_precision(post, num_steps=300, learning_rate=0.5, progress=False)
    # the grid search skips the priors without a posterior and picks among the others
    Xv, Yv = X + 0.1, Y
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the grid's edge
        tuned, report = pst.optimize_prior_precision(post, method="gridsearch", validation=(Xv, Yv),
                                                     grid=jnp.array([1e-3, 1e-2, -2 * lowest, -10 * lowest]),
                                                     progress=False)
    assert np.isnan(np.asarray(report["nll"][:2])).all() and np.isfinite(np.asarray(report["nll"][2:])).all()
    assert float(tuned.prior_precision) in (-2 * lowest, -10 * lowest)
    P = H.shape[0]
    with pytest.warns(UserWarning, match=r"of the 6 eigenpairs kept are negative .* clipped to 0"):
        low = pst.laplace(fn, params, (X, Y), lik, structure="lowrank", rank=6, num_steps=P, curvature="hessian",
                          key=jax.random.key(0), prior_precision=1.0, progress=False)
    w = np.linalg.eigvalsh(np.asarray(H))
    top = w[np.argsort(-np.abs(w))][:6]  # Lanczos keeps the largest in magnitude
    assert_close(np.sort(np.asarray(low.ggn.lam)), np.sort(top), rtol=1e-8)


def test_bad_curvature_options_are_refused_before_any_work():
    fn, params, X, Y = _problem()
    with pytest.raises(ValueError, match="unknown curvature 'gnn'; expected one of"):
        pst.laplace(fn, params, (X, Y), Gaussian(1.0), curvature="gnn")
    with pytest.raises(ValueError, match="structure='kfac' has no Hessian"):
        pst.laplace(fn, params, (X, Y), Gaussian(1.0), structure="kfac", curvature="hessian")
    with pytest.raises(ValueError, match="curvature='fisher'.*pass key="):
        pst.laplace(fn, params, (X, Y), Gaussian(1.0), curvature="fisher")
    with pytest.raises(ValueError, match="num_samples must be"):
        pst.laplace(fn, params, (X, Y), Gaussian(1.0), curvature="fisher", key=jax.random.key(0), num_samples=0)


@pytest.mark.parametrize("curvature", ["ef", "fisher"])
def test_a_refit_of_a_fisher_compiles_nothing(curvature):
    model = eqx.nn.MLP(6, 3, 8, 2, activation=jnp.tanh, key=jax.random.key(0))
    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(0), (40, 6))
    kw = {"key": jax.random.key(1)} if curvature == "fisher" else {}
    first = pst.laplace(fn, params, (X, jnp.arange(40) % 3), Categorical(), structure="kfac", curvature=curvature,
                        progress=False, **kw)
    params2 = jax.tree_util.tree_map(lambda a: 1.5 * a, params)
    X2 = draws.normal(jax.random.key(1), (40, 6))
    kw2 = {"key": jax.random.key(2)} if curvature == "fisher" else {}
    with compiles() as events:
        second = pst.laplace(fn, params2, (X2, jnp.arange(40) % 3), Categorical(), structure="kfac",
                             curvature=curvature, progress=False, **kw2)
        jax.block_until_ready(second)
    assert events == [], f"{len(events)} compilations on the second call"
    assert not np.allclose(np.asarray(first.ggn.eigenvalues[0]), np.asarray(second.ggn.eigenvalues[0]))
