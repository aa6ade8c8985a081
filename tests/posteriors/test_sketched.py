"""``laplace(structure="sketched")`` (issue 35, item 5: sketched Lanczos as a Laplace curvature): against the
closed form of Bayesian linear regression, against ``structure="lowrank"`` with the same eigenpairs (at s = P the
sketch is orthogonal, so every value must agree to rounding), within the sketch's error at s < P, compiled once,
and what it refuses."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posteriors as pst
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox
from linops.testing import count_compilations as compiles
from tests import _draws as draws

from ..linops._util import assert_close


def _mlp(seed=0, n=80):
    model = eqx.nn.MLP(6, 4, 20, 2, activation=jnp.tanh, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(model)
    params = jax.tree_util.tree_map(lambda a: a * (1.0 + 0.1 * seed), params)
    X = draws.normal(jax.random.key(1 + seed), (n, 6), jnp.float64)
    return fn, params, X, jnp.arange(n) % 4


def test_bayesian_linear_regression_is_exact_when_the_rank_covers_the_ggn():
    """y = w^T x + noise, 8 examples in 30 dimensions: the GGN X^T X / sigma^2 has rank 8, so 8 eigenpairs make the
    low-rank posterior exact: the predictive variance equals x^T (X^T X / sigma^2 + alpha I)^-1 x, and the
    log-determinant log det(X^T X / sigma^2 + alpha I)."""
    X = draws.normal(jax.random.key(0), (8, 30), jnp.float64)
    Y = draws.normal(jax.random.key(1), (8, 1), jnp.float64)
    fn = lambda w, x: (x @ w)[None]  # noqa: E731
    sigma, alpha = 0.7, 0.3
    post = pst.laplace(fn, jnp.zeros(30, jnp.float64), (X, Y), Gaussian(sigma), structure="sketched", rank=8,
                       num_steps=30, sketch_size=30, key=jax.random.key(2), prior_precision=alpha)
    assert int(post.ggn.top.rank) == 8
    Xt = draws.normal(jax.random.key(3), (5, 30), jnp.float64)
    precision = X.T @ X / sigma**2 + alpha * jnp.eye(30)
    exact = jnp.einsum("mp,pq,mq->m", Xt, jnp.linalg.inv(precision), Xt)
    assert_close(pst.predictive.linearized(post, Xt)[1][:, 0], exact, rtol=1e-9)
    assert_close(post.ggn.logdet(alpha, 1.0), jnp.linalg.slogdet(precision)[1], rtol=1e-10)


def test_at_a_full_sketch_it_is_the_lowrank_posterior():
    """A tanh MLP (644 parameters, 4 classes), rank 10, 300 steps (both runs converged), s = P: the variances, the
    log-determinant, the evidence and the evidence-tuned prior equal ``structure="lowrank"``'s with the same
    eigenpairs."""
    fn, params, X, y = _mlp()
    low = pst.laplace(fn, params, (X, y), Categorical(), structure="lowrank", rank=10, num_steps=300,
                      key=jax.random.key(2), prior_precision=0.5)
    P = low.num_params
    sk = pst.laplace(fn, params, (X, y), Categorical(), structure="sketched", rank=10, num_steps=300,
                     sketch_size=P, key=jax.random.key(3), prior_precision=0.5)
    assert int(sk.ggn.top.rank) == 10
    assert_close(sk.ggn.lam, low.ggn.lam, rtol=1e-8)
    Xt = draws.normal(jax.random.key(4), (7, 6), jnp.float64)
    assert_close(pst.predictive.linearized(sk, Xt)[1], pst.predictive.linearized(low, Xt)[1], rtol=1e-7)
    assert_close(pst.marginal_log_likelihood(sk), pst.marginal_log_likelihood(low), rtol=1e-10)
    tuned_sk, _ = pst.optimize_prior_precision(sk, num_steps=30)
    tuned_low, _ = pst.optimize_prior_precision(low, num_steps=30)
    assert_close(tuned_sk.prior_precision, tuned_low.prior_precision, rtol=1e-7)
    assert not np.allclose(tuned_sk.prior_precision, 0.5)  # the tuning moved it


def test_with_a_small_sketch_the_variances_are_within_its_error():
    """s = 300 of P = 644 rows: each variance within 3 sqrt((rank + 1)/s) (relative; statistical, fixed keys) of
    the full sketch's, and not equal to it (the sketch is not the identity)."""
    fn, params, X, y = _mlp()
    kw = dict(structure="sketched", rank=10, key=jax.random.key(3), prior_precision=0.5)
    full = pst.laplace(fn, params, (X, y), Categorical(), sketch_size=644, **kw)
    small = pst.laplace(fn, params, (X, y), Categorical(), sketch_size=300, **kw)
    Xt = draws.normal(jax.random.key(4), (7, 6), jnp.float64)
    v_full, v_small = pst.predictive.linearized(full, Xt)[1], pst.predictive.linearized(small, Xt)[1]
    error = float(jnp.max(jnp.abs(v_small / v_full - 1)))
    assert 1e-6 < error < 3 * np.sqrt(11 / 300), error


def test_a_refit_of_the_same_shapes_compiles_nothing():
    fn, params, X, y = _mlp(0, 40)
    kw = dict(structure="sketched", rank=4, sketch_size=200, key=jax.random.key(1), batch_size=16)
    first = pst.laplace(fn, params, (X, y), Categorical(), **kw)
    p_first = pst.predictive.classification(first, X[:7])
    _, params2, X2, y2 = _mlp(1, 40)
    with compiles() as events:
        second = pst.laplace(fn, params2, (X2, y2), Categorical(), **kw)
        p_second = pst.predictive.classification(second, X2[:7])
        jax.block_until_ready((second, p_second))
    assert events == [], f"{len(events)} compilations on the second call"
    assert not np.allclose(np.asarray(p_first), np.asarray(p_second))


def test_what_needs_the_eigenvectors_in_parameter_space_is_refused():
    fn, params, X, y = _mlp(0, 40)
    post = pst.laplace(fn, params, (X, y), Categorical(), structure="sketched", rank=4, sketch_size=100,
                       key=jax.random.key(1))
    with pytest.raises(ValueError, match="no parameter samples; use structure='lowrank'"):
        post.sample(jax.random.key(0), 2)
    with pytest.raises(ValueError, match="no covariance products"):
        pst.predictive.linearized(post, X[:3], output_covariance=True)
    with pytest.raises(ValueError, match="no covariance products"):
        post.covariance @ jnp.ones(post.num_params)
    with pytest.raises(ValueError, match="one scalar prior precision"):
        pst.laplace(fn, params, (X, y), Categorical(), structure="sketched", rank=4, key=jax.random.key(1),
                    prior_precision=jnp.linspace(1.0, 2.0, post.num_params))
    with pytest.raises(ValueError, match="one scalar prior precision: use prior_structure='scalar'"):
        pst.optimize_prior_precision(post, prior_structure="layerwise")
    with pytest.raises(ValueError, match="one scalar prior precision"):
        post.with_prior(prior_precision=jnp.linspace(1.0, 2.0, post.num_params))
    with pytest.raises(ValueError, match="sketch_size is structure='sketched''s"):
        pst.laplace(fn, params, (X, y), Categorical(), structure="lowrank", rank=4, key=jax.random.key(1),
                    sketch_size=10)
    with pytest.raises(ValueError, match="pass key"):
        pst.laplace(fn, params, (X, y), Categorical(), structure="sketched", rank=4)
    with pytest.raises(ValueError, match="pass rank"):
        pst.laplace(fn, params, (X, y), Categorical(), structure="sketched", key=jax.random.key(1))
    with pytest.raises(ValueError, match="a Hessian can be indefinite"):
        pst.laplace(fn, params, (X, y), Categorical(), structure="sketched", rank=4, key=jax.random.key(1),
                    curvature="hessian")
    with pytest.raises(ValueError, match=r"sketch_size must be in \[1, P"):
        pst.laplace(fn, params, (X, y), Categorical(), structure="sketched", rank=4, key=jax.random.key(1),
                    sketch_size=10**6)


def test_it_round_trips_through_save_and_load(tmp_path):
    fn, params, X, y = _mlp(0, 40)
    post = pst.laplace(fn, params, (X, y), Categorical(), structure="sketched", rank=4, sketch_size=100,
                       key=jax.random.key(1), prior_precision=0.7)
    pst.save(post, tmp_path / "post")
    back = pst.load(tmp_path / "post", post)
    assert back.structure == "sketched"
    assert_close(pst.predictive.linearized(back, X[:5])[1], pst.predictive.linearized(post, X[:5])[1], rtol=1e-12)
