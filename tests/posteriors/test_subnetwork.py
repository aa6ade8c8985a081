"""Subnetwork Laplace against the dense restricted computation, and the selection strategies on constructed cases."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox, ravel, restrict
from tests import _draws as draws
from tests.posteriors._shared import dense_ggn

from ..linops._util import assert_close


def _mlp(activation=jnp.tanh, seed=0):
    model = eqx.nn.MLP(2, 2, 6, 2, activation=activation, key=jax.random.key(seed), dtype=jnp.float64)
    return from_equinox(model)


def _data(n=30, seed=1):
    X = draws.normal(jax.random.key(seed), (n, 2), jnp.float64)
    return X, (X[:, 0] > 0).astype(jnp.int32)


def _dense_ggn(fn, params, X, y):
    return dense_ggn(fn, params, X, y, Categorical())


def test_restricted_model_gives_the_jacobian_columns_of_the_subset():
    fn, params = _mlp()
    X, _ = _data()
    idx = np.array([0, 5, 17, 40, 41, 63])
    fn_S, v = restrict(fn, params, idx)
    flat, unravel = ravel(params)
    assert_close(v, flat[idx])
    full = jax.jacfwd(lambda w: jax.vmap(fn, in_axes=(None, 0))(unravel(w), X))(flat)
    sub = jax.jacfwd(lambda u: jax.vmap(fn_S, in_axes=(None, 0))(u, X))(v)
    assert_close(sub, full[..., idx], rtol=1e-12)


def test_all_parameters_reproduce_full_laplace_and_a_subset_the_dense_restriction():
    fn, params = _mlp()
    X, y = _data()
    P = ravel(params)[0].shape[0]
    everything = pst.subnetwork.from_indices(params, np.arange(P))
    sub_post = pst.subnetwork_laplace(fn, params, (X, y), Categorical(), everything, prior_precision=2.0)
    full_post = pst.laplace(fn, params, (X, y), Categorical(), structure="full", prior_precision=2.0)
    assert_close(sub_post.covariance.as_matrix(), full_post.covariance.as_matrix(), rtol=1e-10)
    assert_close(pst.marginal_log_likelihood(sub_post), pst.marginal_log_likelihood(full_post), rtol=1e-12)
    T = draws.normal(jax.random.key(5), (4, 2), jnp.float64)
    assert_close(pst.predictive.linearized(sub_post, T)[1], pst.predictive.linearized(full_post, T)[1], rtol=1e-10)

    idx = np.array([1, 7, 8, 30, 44, 60, 62])
    sub = pst.subnetwork.from_indices(params, idx)
    G = _dense_ggn(fn, params, X, y)
    lam_S = 2.0 * len(idx) / P  # appendix C's rescaling
    cov = np.linalg.inv(G[np.ix_(idx, idx)] + lam_S * np.eye(len(idx)))
    embedded = np.zeros((P, P))
    embedded[np.ix_(idx, idx)] = cov
    post = pst.subnetwork_laplace(fn, params, (X, y), Categorical(), sub, prior_precision=2.0, batch_size=7)
    assert_close(post.covariance.as_matrix(), embedded, rtol=1e-9, atol=1e-12)
    plain = pst.subnetwork_laplace(fn, params, (X, y), Categorical(), sub, prior_precision=2.0, rescale_prior=False)
    assert_close(plain.prior_precision, 2.0)
    # the memory estimate is the peak (GGN, precision, Cholesky factor); the posterior keeps two of the three
    kept = post.ggn.G.nbytes + post.factor.nbytes
    assert sub.memory_bytes == kept * 3 // 2
    assert post.factor.shape == post.ggn.G.shape == (len(idx), len(idx))
    samples = post.sample(jax.random.key(0), 4)
    others = np.setdiff1d(np.arange(P), idx)
    assert bool(jnp.all(samples[:, others] == ravel(params)[0][None, others]))


def test_dead_relu_weights_are_chosen_by_diagonal_laplace_but_not_by_swag():
    """The paper's observation (section 6.2): a dead ReLU unit's incoming weights have no data
    gradient, so diagonal Laplace gives them the prior variance (the largest), SWAG none."""
    fn, params = _mlp(activation=jax.nn.relu, seed=3)
    dead = 2  # hidden unit 2 of the first layer never fires: a large negative bias
    params = eqx.tree_at(lambda p: p.layers[0].bias, params, params.layers[0].bias.at[dead].set(-100.0))
    X = draws.normal(jax.random.key(4), (64, 2), jnp.float64)
    Y = jnp.sin(X[:, :1]) + 0.1 * X[:, 1:]
    Y = jnp.concatenate([Y, -Y], axis=1)
    dead_in = [dead * 2, dead * 2 + 1]  # its incoming weights: layers[0].weight[dead, :] in row-major order
    g = np.asarray(lo.diag(lo.GGNOp(fn, params, X, Y, Gaussian(0.1))))
    unseen = set(np.nonzero(g == 0)[0].tolist())  # no data gradient: the dead unit's weights in and out, its bias
    assert set(dead_in) <= unseen
    diag = pst.subnetwork.diagonal_laplace(fn, params, (X, Y), Gaussian(0.1), len(unseen), prior_precision=1.0)
    assert set(np.asarray(diag.indices).tolist()) == unseen  # all at the prior variance, the largest
    assert_close(diag.scores[np.array(dead_in)], [1.0, 1.0], rtol=1e-12)
    swag = pst.subnetwork.swag(fn, params, (X, Y), Gaussian(0.1), 10, key=jax.random.key(5), num_steps=300,
                               learning_rate=1e-3, batch_size=16)
    # the forced-dead unit stays dead along SGD: its weights never move (other units that are
    # inactive at the MAP may wake up along the way)
    assert not set(np.asarray(swag.indices).tolist()) & set(dead_in)
    scores = np.asarray(swag.scores)
    assert np.all(scores[dead_in] < 1e-12 * scores.max())  # zero up to the moments' rounding


def test_the_baselines_return_the_documented_indices():
    fn, params = _mlp()
    flat, _ = ravel(params)
    mag = pst.subnetwork.largest_magnitude(params, 5)
    assert set(np.asarray(mag.indices).tolist()) == set(np.argsort(-np.abs(np.asarray(flat)))[:5].tolist())
    r1, r2 = (pst.subnetwork.random(jax.random.key(k), params, 9) for k in (0, 0))
    assert np.array_equal(r1.indices, r2.indices) and len(set(np.asarray(r1.indices).tolist())) == 9
    assert not np.array_equal(pst.subnetwork.random(jax.random.key(1), params, 9).indices, r1.indices)
    last = pst.subnetwork.last_layer(params)  # layers[-1]: a 6 x 2 weight and 2 biases, the last 14 parameters
    assert np.array_equal(last.indices, np.arange(flat.shape[0] - 14, flat.shape[0]))
    assert np.array_equal(pst.subnetwork.by_name(params, "layers.0.weight").indices, np.arange(12))
    var = pst.subnetwork.largest_variance(params, jnp.arange(flat.shape[0], dtype=jnp.float64), 3)
    assert np.array_equal(var.indices, np.arange(flat.shape[0] - 3, flat.shape[0]))
    assert pst.subnetwork.size_for_memory(var.memory_bytes, dtype=jnp.float64) == 3


def test_bad_input_is_refused_with_a_clear_error():
    fn, params = _mlp()
    X, y = _data()
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 74\)"):
        pst.subnetwork.from_indices(params, [0, 74])
    with pytest.raises(ValueError, match="1 duplicates"):
        pst.subnetwork.from_indices(params, [3, 3, 4])
    with pytest.raises(ValueError, match=r"size must be an integer in \[1, 74\]"):
        pst.subnetwork.largest_magnitude(params, 100)
    from linops.memory import MemoryBudgetError

    huge = jnp.zeros(200_000)
    sub = pst.subnetwork.from_indices(huge, np.arange(200_000))
    with pytest.raises(MemoryBudgetError, match="choose fewer weights: posteriors.subnetwork.size_for_memory"):
        pst.subnetwork_laplace(lambda w, x: w[:2] * x, huge, (X, jnp.zeros((30, 2))), Gaussian(1.0), sub)
    other = pst.subnetwork.from_indices(jnp.zeros(10), [1])
    with pytest.raises(ValueError, match="indexes 10 parameters but params have 74"):
        pst.subnetwork_laplace(fn, params, (X, y), Categorical(), other)


def test_the_predictive_plans_its_row_chunks_with_the_whole_model(monkeypatch):
    """Each of a subnetwork's Jacobian rows is a full-length gradient before its subset is taken; chunks planned
    with the subset's size held (model P / subset size) times the row budget (3.9 GB for LeNet-5 and 1,000 test
    images). The chunked values must still equal the dense diag(J_S Σ J_Sᵀ)."""
    from posteriors import predictive

    fn, params = _mlp()
    X, y = _data()
    P = ravel(params)[0].shape[0]
    sub = pst.subnetwork.largest_magnitude(params, 5)
    post = pst.subnetwork_laplace(fn, params, (X, y), Categorical(), sub, prior_precision=2.0)
    seen = []
    plan = predictive._plan
    monkeypatch.setattr(predictive, "_plan", lambda M, K, P_, *a: seen.append(P_) or plan(M, K, P_, *a))
    monkeypatch.setattr(predictive, "ROW_BUDGET", 2 * 2 * P)  # room for 2 inputs' rows of the whole model
    T = X[:9] + 0.3
    _, var = pst.predictive.linearized(post, T)
    assert seen == [P]
    idx = np.asarray(post.weights.indices)
    flat, unravel = ravel(params)
    J = jax.jacfwd(lambda w: jax.vmap(fn, in_axes=(None, 0))(unravel(w), T))(flat)[..., idx]  # (M, O, S)
    cov = np.asarray(post.ggn.covariance(post.prior_precision, post.noise_scale, post.factor).as_matrix())
    assert_close(var, np.einsum("mos,st,mot->mo", J, cov, J), rtol=1e-9)
