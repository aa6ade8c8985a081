"""The Laplace family against Bayesian linear regression, where every quantity is exact (the oracle of
`tests.posteriors._shared`). The diagonal structure is exact when $\\Phi^\\top\\Phi$ is diagonal, KFAC when the
inputs are centred (no weight-bias coupling), the low-rank one at full rank.
"""

import io
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import minimize

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical, Gaussian
from linops.models import ravel
from posteriors import _structures as S
from tests import _draws as draws
from tests.posteriors._shared import axes, blr, design, linear_model

from ..linops._util import assert_close

SIGMA, ALPHA = 0.3, 2.0


_dense = linear_model


def _design(n=40, d=3, orthogonal=False, seed=0):
    return design(n, d, orthogonal, seed)


def _blr(X, y, alpha=ALPHA, sigma=SIGMA):
    return blr(X, y, alpha, sigma)


def _data(orthogonal=False, seed=0):
    X = _design(orthogonal=orthogonal, seed=seed)
    rng = np.random.default_rng(seed + 1)
    y = X @ np.array([1.0, -0.5, 2.0]) + 0.7 + SIGMA * rng.standard_normal(X.shape[0])
    return X, y


@pytest.mark.parametrize("structure", ["full", "diag", "kfac", "lowrank"])
def test_bayesian_linear_regression_is_exact(structure):
    X, y = _data(orthogonal=structure == "diag")
    params, cov, evidence, Phi = _blr(X, y)
    kw = dict(rank=4, num_steps=4, key=jax.random.key(0)) if structure == "lowrank" else {}
    post = pst.laplace(_dense, params, (jnp.asarray(X), jnp.asarray(y)[:, None]), Gaussian(SIGMA),
                       structure=structure, prior_precision=ALPHA, **kw)
    assert_close(post.covariance.as_matrix(), cov, rtol=1e-9, atol=1e-12)
    assert_close(lo.diag(post.covariance), np.diag(cov), rtol=1e-9, atol=1e-12)  # marginal variances, closed form
    if structure != "lowrank":  # a LowRank precision has no dense form here; its logdet is the check
        assert_close(np.linalg.inv(np.asarray(post.precision.as_matrix())), cov, rtol=1e-9, atol=1e-12)
    assert_close(pst.marginal_log_likelihood(post), evidence, rtol=1e-10)
    T = np.random.default_rng(5).standard_normal((6, 3))
    mean, var = pst.predictive.linearized(post, jnp.asarray(T))
    PhiT = np.hstack([T, np.ones((6, 1))])
    assert_close(mean[:, 0], PhiT @ np.concatenate([params["W"][0], params["b"]]), rtol=1e-10)
    assert_close(var[:, 0], np.einsum("ij,jk,ik->i", PhiT, cov, PhiT), rtol=1e-9)
    _, full = pst.predictive.linearized(post, jnp.asarray(T), full_covariance=True)
    assert_close(full, PhiT @ cov @ PhiT.T, rtol=1e-9, atol=1e-12)
    _, noisy = pst.predictive.regression(post, jnp.asarray(T))
    assert_close(noisy, var + SIGMA**2, rtol=1e-12)


def test_last_layer_is_bayesian_linear_regression_on_the_features():
    X, y = _data()
    rng = np.random.default_rng(2)
    W1 = jnp.asarray(rng.standard_normal((4, 3)))
    features = np.tanh(X @ np.asarray(W1).T)
    last, cov, evidence, _ = _blr(features, y)
    params = {"first": {"W": W1}, "last": last}

    def fn(p, x):
        return _dense(p["last"], jnp.tanh(p["first"]["W"] @ x))

    post = pst.laplace(fn, params, (jnp.asarray(X), jnp.asarray(y)[:, None]), Gaussian(SIGMA),
                       subset_of_weights="last_layer", prior_precision=ALPHA)
    assert post.weights.leaves == (1, 2) and post.precision is None
    full = np.zeros((17, 17))
    full[12:, 12:] = cov  # leaves in order: first.W (12), last.W (4), last.b (1)
    assert_close(post.covariance.as_matrix(), full, rtol=1e-9, atol=1e-12)
    assert_close(pst.marginal_log_likelihood(post), evidence, rtol=1e-10)
    s = post.sample(jax.random.key(0), 3)
    assert bool(jnp.all(s[:, :12] == ravel(params)[0][None, :12]))  # the first layer stays at the MAP
    T = jnp.asarray(rng.standard_normal((5, 3)))
    phi = np.hstack([np.tanh(np.asarray(T) @ np.asarray(W1).T), np.ones((5, 1))])
    assert_close(pst.predictive.linearized(post, T)[1][:, 0], np.einsum("ij,jk,ik->i", phi, cov, phi), rtol=1e-9)


def test_a_multi_output_last_layer_sums_the_evidence_data_terms_in_its_own_pass(monkeypatch):
    """Two outputs on shared features, each the exact Bayesian linear regression posterior mean: the evidence is
    the sum of the two closed-form evidences. Its data terms (loss, residual sums of squares) come from the
    last layer's own pass over the data (the Kronecker blocks' forward pass): a separate forward pass over the
    data is never made (it would raise here)."""
    X, y = _data()
    y2 = np.stack([y, 0.5 * y[::-1] - 1.0], axis=1)
    rng = np.random.default_rng(2)
    W1 = jnp.asarray(rng.standard_normal((4, 3)))
    features = np.tanh(X @ np.asarray(W1).T)
    fits = [_blr(features, y2[:, o]) for o in range(2)]
    last = {"W": jnp.concatenate([f[0]["W"] for f in fits]), "b": jnp.concatenate([f[0]["b"] for f in fits])}
    params = {"first": {"W": W1}, "last": last}

    def fn(p, x):
        return _dense(p["last"], jnp.tanh(p["first"]["W"] @ x))

    def no_forward_pass(*args):
        raise AssertionError("the evidence's data terms took a forward pass of their own")

    from posteriors import laplace_family

    monkeypatch.setattr(laplace_family, "_data_terms", no_forward_pass)
    post = pst.laplace(fn, params, (jnp.asarray(X), jnp.asarray(y2)), Gaussian(SIGMA), subset_of_weights="last_layer",
                       prior_precision=ALPHA, batch_size=16)
    out = np.tanh(X @ np.asarray(W1).T) @ np.asarray(last["W"]).T + np.asarray(last["b"])
    assert_close(post.residual_ss, np.sum((y2 - out) ** 2, axis=0), rtol=1e-9)
    assert_close(pst.marginal_log_likelihood(post), fits[0][2] + fits[1][2], rtol=1e-9)


def test_low_rank_keeps_the_top_eigenpairs_and_never_forms_p_by_p():
    X, y = _data()
    params, _, _, Phi = _blr(X, y)
    data = (jnp.asarray(X), jnp.asarray(y)[:, None])
    post = pst.laplace(_dense, params, data, Gaussian(SIGMA), structure="lowrank", rank=2, num_steps=4,
                       key=jax.random.key(1), prior_precision=ALPHA)
    G = Phi.T @ Phi / SIGMA**2
    w, V = np.linalg.eigh(G)
    approx = V[:, -2:] @ np.diag(w[-2:]) @ V[:, -2:].T  # the rank-2 truncation of the GGN
    assert_close(post.covariance.as_matrix(), np.linalg.inv(approx + ALPHA * np.eye(4)), rtol=1e-8)
    # the evidence's log-determinant: sum over kept eigenpairs plus (P - k) log(alpha), against dense
    expected_logdet = np.linalg.slogdet(approx + ALPHA * np.eye(4))[1]
    assert_close(post.ggn.logdet(post.prior_precision, 1.0), expected_logdet, rtol=1e-10)
    # a per-parameter prior goes through Woodbury and the precision-square-root sampler
    alpha = jnp.array([1.0, 2.0, 3.0, 4.0])
    vec = post.with_prior(alpha)
    assert_close(vec.covariance.as_matrix(), np.linalg.inv(approx + np.diag(alpha)), rtol=1e-8)
    assert_close(pst.marginal_log_likelihood(vec), pst.marginal_log_likelihood(post, alpha), rtol=1e-12)


def test_low_rank_predictive_variance_has_no_cancellation_in_float32():
    """Rows in span U with large eigenvalues: the variance is tiny against the prior's, and the product form
    ``|J|²/α - ...`` loses it in float32; the predictive's sum-of-squares form keeps it."""
    from posteriors import _structures as S

    rng = np.random.default_rng(0)
    U, _ = np.linalg.qr(rng.standard_normal((300, 6)))
    lam = np.array([1e7, 5e6, 1e6, 3e5, 1e5, 10.0])
    J = (rng.standard_normal((5, 5)) @ U[:, :5].T) * 4.0  # rows in the span of the large eigenvalues
    alpha = 1.0
    exact = np.sum((J @ U) ** 2 / (lam + alpha), axis=1)
    struct = S.LowRankGGN(jnp.asarray(U, jnp.float32), jnp.asarray(lam, jnp.float32))
    J32 = jnp.asarray(J, jnp.float32)
    stable = struct.quadratic_rows(J32, jnp.float32(alpha), jnp.float32(1.0), None)
    assert_close(stable, exact, rtol=1e-3)
    generic = jnp.sum(J32 * struct.covariance(jnp.float32(alpha), jnp.float32(1.0), None).mm(J32.T).T, axis=1)
    assert np.max(np.abs(np.asarray(generic) - exact) / exact) > 1e-2  # the form it replaces is far off
    # and the predictive uses it: equal to J Σ Jᵀ with the dense covariance
    X, y = _data()
    params = _blr(X, y)[0]
    post = pst.laplace(_dense, params, (jnp.asarray(X), jnp.asarray(y)[:, None]), Gaussian(SIGMA),
                       structure="lowrank", rank=2, num_steps=4, key=jax.random.key(1), prior_precision=ALPHA)
    _, var = pst.predictive.linearized(post, jnp.asarray(X[:3]))
    Jx = np.hstack([X[:3], np.ones((3, 1))])  # the linear model's Jacobian rows, in ravel order (W, then b)
    assert_close(var[:, 0], np.einsum("ip,pq,iq->i", Jx, np.asarray(post.covariance.as_matrix()), Jx), rtol=1e-8)


@pytest.mark.parametrize("structure,prior", [("full", 1.5), ("kfac", 1.5), ("lowrank", 1.5),
                                             ("lowrank", "vector"), ("diag", "vector")])
def test_sample_moments_match_the_analytic_covariance(structure, prior):
    """Catches a transposed square-root factor (which laplace-torch once shipped)."""
    X, y = _data()
    params, _, _, _ = _blr(X, y)
    alpha = jnp.linspace(0.5, 3.0, 4) if prior == "vector" else prior
    kw = dict(rank=3, num_steps=4, key=jax.random.key(2)) if structure == "lowrank" else {}
    post = pst.laplace(_dense, params, (jnp.asarray(X), jnp.asarray(y)[:, None]), Gaussian(1.0),
                       structure=structure, prior_precision=alpha, **kw)
    n = 40000
    theta = np.asarray(post.sample(jax.random.key(3), n))
    Sigma = np.asarray(post.covariance.as_matrix())
    emp = np.cov(theta.T)
    se = np.sqrt((np.outer(np.diag(Sigma), np.diag(Sigma)) + Sigma**2) / n)
    assert np.all(np.abs(emp - Sigma) < 5 * se), np.max(np.abs(emp - Sigma) / se)
    assert_close(theta.mean(axis=0), ravel(params)[0], atol=5 * np.sqrt(np.max(np.diag(Sigma)) / n))


def test_prior_and_noise_tuning_find_the_exact_evidence_maximiser():
    X, y = _data(seed=3)
    Phi = np.hstack([X, np.ones((X.shape[0], 1))])

    def exact(log_a, log_s):
        a, s = np.exp(log_a), np.exp(log_s)
        K = s**2 * np.eye(X.shape[0]) + Phi @ Phi.T / a
        return 0.5 * (y @ np.linalg.solve(K, y) + np.linalg.slogdet(K)[1])

    best = minimize(lambda v: exact(*v), x0=[0.0, np.log(0.5)], method="Nelder-Mead",
                    options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 4000}).x
    a_star, s_star = np.exp(best)
    params, _, _, _ = _blr(X, y, a_star, s_star)  # the MAP at the optimum: the evidence is stationary there
    data = (jnp.asarray(X), jnp.asarray(y)[:, None])
    # start away from the optimum (the MAP stays the optimum's; at the MAP the Laplace and exact
    # evidences have the same derivatives, so the fixed point is the exact maximiser)
    post = pst.laplace(_dense, params, data, Gaussian(0.5), structure="full", prior_precision=1.0)
    tuned, report = pst.optimize_prior_precision(post, tune_sigma=True, num_steps=1500, learning_rate=0.05)
    assert_close(report["prior_precision"], a_star, rtol=2e-3)
    assert_close(report["sigma"], s_star, rtol=2e-3)
    assert_close(tuned.likelihood.sigma, s_star, rtol=2e-3)
    assert report["log_marginal_likelihood"][-1] >= report["log_marginal_likelihood"][0]
    # the structured evidence with the tuned values equals the refactorised posterior's
    assert_close(pst.marginal_log_likelihood(tuned), pst.marginal_log_likelihood(post, report["prior_precision"],
                                                                                 report["sigma"]), rtol=1e-10)


def _logistic(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    p1 = 1 / (1 + np.exp(-(1.5 * X[:, 0] - X[:, 1])))
    return jnp.asarray(X), jnp.asarray((rng.random(n) < p1).astype(np.int32))


def test_grid_search_on_validation_nll_and_its_edge_warning():
    X, y = _logistic(80, 1)
    val = _logistic(200, 2)
    # twice the true logits: overconfident, so some posterior variance helps and the optimum is inside
    params = {"W": 2.0 * jnp.array([[-0.75, 0.5], [0.75, -0.5]]), "b": jnp.zeros(2)}
    post = pst.laplace(_dense, params, (X, y), Categorical(), structure="full")
    grid = jnp.logspace(-3, 3, 13)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an interior optimum: no edge warning
        tuned, report = pst.optimize_prior_precision(post, method="gridsearch", validation=val, grid=grid)
    by_hand = [float(pst.predictive.nll(post.with_prior(a), *val)) for a in grid]
    assert int(np.argmin(by_hand)) == int(np.argmin(np.asarray(report["nll"]))) not in (0, 12)
    assert_close(report["nll"], by_hand, rtol=1e-10)
    assert_close(tuned.prior_precision, grid[int(np.argmin(by_hand))])
    with pytest.warns(UserWarning, match="upper edge of the grid"):
        pst.optimize_prior_precision(post, method="gridsearch", validation=val, grid=jnp.array([1e-3, 1e-2]))


@pytest.mark.parametrize("objective", ["ece", "brier"])
def test_grid_search_on_validation_ece_or_brier(objective):
    X, y = _logistic(80, 1)
    val = _logistic(200, 2)
    params = {"W": 2.0 * jnp.array([[-0.75, 0.5], [0.75, -0.5]]), "b": jnp.zeros(2)}
    post = pst.laplace(_dense, params, (X, y), Categorical(), structure="full")
    grid = jnp.logspace(-3, 3, 13)
    tuned, report = pst.optimize_prior_precision(post, method="gridsearch", validation=val, grid=grid,
                                                 objective=objective, progress=False)
    score = {"ece": pst.metrics.ece, "brier": pst.metrics.brier}[objective]
    by_hand = np.array([float(score(pst.predictive.classification(post.with_prior(a), val[0]), val[1])) for a in grid])
    assert_close(report[objective], by_hand, rtol=1e-6)
    assert np.ptp(by_hand) > 1e-3  # the objective depends on the prior: the choice is not vacuous
    assert_close(tuned.prior_precision, grid[int(np.argmin(by_hand))])


def test_grid_search_refuses_a_calibration_objective_without_class_probabilities_and_bad_labels():
    X, y = _logistic(80, 1)
    params = {"W": jnp.zeros((2, 2)), "b": jnp.zeros(2)}
    post = pst.laplace(_dense, params, (X, y), Categorical(), structure="full")
    with pytest.raises(ValueError, match="objective must be"):
        pst.optimize_prior_precision(post, method="gridsearch", validation=(X, y), objective="accuracy")
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        pst.optimize_prior_precision(post, method="gridsearch", validation=(X, y + 2), objective="ece")
    reg = pst.laplace(lambda w, x: (x @ w)[None], jnp.zeros(2), (X, X[:, :1]), Gaussian(1.0), structure="full")
    with pytest.raises(ValueError, match="categorical likelihood's class probabilities"):
        pst.optimize_prior_precision(reg, method="gridsearch", validation=(X, X[:, :1]), objective="brier")


def test_probit_agrees_with_monte_carlo_at_small_variance_and_the_bridge_is_a_distribution():
    rng = np.random.default_rng(6)
    X = jnp.asarray(rng.standard_normal((60, 2)))
    y = jnp.asarray((X[:, 0] + X[:, 1] > 0).astype(np.int32))
    params = {"W": jnp.asarray(rng.standard_normal((3, 2))), "b": jnp.zeros(3)}
    post = pst.laplace(_dense, params, (X, y), Categorical(), structure="full", prior_precision=50.0)
    T = jnp.asarray(rng.standard_normal((8, 2)))
    probit = pst.predictive.classification(post, T, link="probit")
    mc = pst.predictive.classification(post, T, link="mc", key=jax.random.key(0), num_samples=20000)
    assert float(jnp.max(jnp.abs(probit - mc))) < 1e-2
    bridge = pst.predictive.classification(post, T, link="bridge")
    assert_close(jnp.sum(bridge, axis=1), np.ones(8), rtol=1e-12)
    assert bool(jnp.all(jnp.argmax(bridge, axis=1) == jnp.argmax(probit, axis=1)))


@pytest.mark.parametrize("structure", ["full", "diag", "last_layer", "lowrank", "kfac"])
def test_save_and_load_reproduce_samples_bit_for_bit(structure, tmp_path):
    model = eqx.nn.MLP(2, 2, 6, 2, activation=jnp.tanh, key=jax.random.key(0), dtype=jnp.float64)
    from linops.models import from_equinox

    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(1), (25, 2), jnp.float64)
    y = jnp.arange(25) % 2
    kw = dict(rank=5, key=jax.random.key(2)) if structure == "lowrank" else {}
    args = (fn, params, (X, y), Categorical())
    post = pst.laplace(*args, **axes(structure), prior_precision=0.5, **kw)
    pst.save(post, tmp_path / "post.eqx")
    like = eqx.filter_eval_shape(pst.laplace, *args, **axes(structure), prior_precision=0.5, **kw)
    back = pst.load(tmp_path / "post.eqx", like)
    key = jax.random.key(7)
    assert bool(jnp.all(back.sample(key, 5) == post.sample(key, 5)))
    assert float(pst.marginal_log_likelihood(back)) == float(pst.marginal_log_likelihood(post))
    other = "diag" if structure != "diag" else "full"
    with pytest.raises(ValueError, match="does not match the template"):
        pst.load(tmp_path / "post.eqx", eqx.filter_eval_shape(pst.laplace, *args, structure=other))


def test_per_layer_and_per_parameter_priors():
    X, y = _data()
    params, _, _, Phi = _blr(X, y)
    data = (jnp.asarray(X), jnp.asarray(y)[:, None])
    per_leaf = {"W": 3.0, "b": 0.5}
    post = pst.laplace(_dense, params, data, Gaussian(SIGMA), structure="kfac", prior_precision=per_leaf)
    Lam = Phi.T @ Phi / SIGMA**2 + np.diag([3.0, 3.0, 3.0, 0.5])
    assert_close(post.covariance.as_matrix(), np.linalg.inv(Lam), rtol=1e-9)
    per_param = {"W": jnp.array([[1.0, 2.0, 3.0]]), "b": jnp.array([4.0])}
    full = pst.laplace(_dense, params, data, Gaussian(SIGMA), structure="full", prior_precision=per_param)
    assert_close(full.covariance.as_matrix(), np.linalg.inv(Phi.T @ Phi / SIGMA**2 + np.diag([1.0, 2, 3, 4])),
                 rtol=1e-9)
    with pytest.raises(ValueError, match="one prior precision per leaf"):
        pst.laplace(_dense, params, data, Gaussian(SIGMA), structure="kfac", prior_precision=per_param)


def test_bad_input_is_refused_with_a_clear_error():
    X, y = _data()
    params, _, _, _ = _blr(X, y)
    data = (jnp.asarray(X), jnp.asarray(y)[:, None])
    with pytest.raises(ValueError, match="unknown structure 'kron'"):
        pst.laplace(_dense, params, data, Gaussian(SIGMA), structure="kron")
    with pytest.raises(ValueError, match="Lanczos needs a start vector"):
        pst.laplace(_dense, params, data, Gaussian(SIGMA), structure="lowrank", rank=2)
    with pytest.raises(ValueError, match="prior_precision must be positive"):
        pst.laplace(_dense, params, data, Gaussian(SIGMA), prior_precision=-1.0)
    with pytest.raises(ValueError, match=r"needs shape \(4,\)"):
        pst.laplace(_dense, params, data, Gaussian(SIGMA), prior_precision=jnp.ones(3))
    with pytest.raises(ValueError, match="no parameter path starts with 'head'"):
        pst.laplace(_dense, params, data, Gaussian(SIGMA), subset_of_weights="last_layer", last_layer="head")
    with pytest.raises(ValueError, match="last layer is subset_of_weights='last_layer' now"):
        pst.laplace(_dense, params, data, Gaussian(SIGMA), structure="last_layer")
    from linops.memory import MemoryBudgetError

    wide = {"W": jnp.zeros((1, 3)), "b": jnp.zeros(1), "extra": jnp.zeros(200_000)}
    with pytest.raises(MemoryBudgetError, match="structure='full'"):
        pst.laplace(lambda p, x: _dense(p, x) + 0 * p["extra"][:1], wide, data, Gaussian(SIGMA))
    with pytest.raises(ValueError, match="outside any dense or convolutional layer.*kfac_fallback='diag'"):
        pst.laplace(lambda p, x: _dense(p, x) * p["s"], {**params, "s": jnp.ones(1)}, data, Gaussian(SIGMA),
                    structure="kfac", kfac_fallback="error")
    with pytest.raises(ValueError, match="kfac_approximation must be 'expand' or 'reduce', got 'sum'"):
        pst.laplace(_dense, params, data, Gaussian(SIGMA), structure="kfac", kfac_approximation="sum")
    two = {"W": jnp.zeros((2, 3)), "b": jnp.zeros(2)}
    post = pst.laplace(_dense, two, (jnp.asarray(X), jnp.asarray(y > 0, jnp.int32)), Categorical(), structure="diag")
    with pytest.raises(ValueError, match="sigma can be changed for a Gaussian likelihood"):
        pst.marginal_log_likelihood(post, sigma=0.5)


def test_done_when_every_structure_predicts_and_tunes_on_an_equinox_model():
    from linops.models import from_equinox

    model = eqx.nn.MLP(1, 1, 12, 2, activation=jnp.tanh, key=jax.random.key(0))
    fn, params = from_equinox(model)
    X = jnp.linspace(-2, 2, 30)[:, None]
    Y = jnp.sin(2 * X) + 0.05 * draws.normal(jax.random.key(1), (30, 1))
    T = jnp.linspace(-3, 3, 7)[:, None]
    for structure in pst.STRUCTURES:
        kw = dict(rank=10, key=jax.random.key(2)) if structure in ("lowrank", "sketched") else {}
        post = pst.laplace(fn, params, (X, Y), Gaussian(0.1), structure=structure, prior_precision=1.0,
                           batch_size=8, **kw)
        mean, var = pst.predictive.regression(post, T)
        assert mean.shape == var.shape == (7, 1) and bool(jnp.all(var > 0.1**2))
        if structure != "sketched":  # it has no samples (tests/posteriors/test_sketched.py checks its values)
            # the linearised predictive's variance is the sample variance of the linearised model
            f = pst.predictive.monte_carlo(post, jax.random.key(3), T, 4000)
            _, fvar = pst.predictive.linearized(post, T)
            assert_close(jnp.var(f, axis=0), fvar, rtol=0.15, atol=1e-6)
        tuned, report = pst.optimize_prior_precision(post, num_steps=100, tune_sigma=True)
        trace = report["log_marginal_likelihood"]
        assert float(trace[-1]) > float(trace[0]), structure
        assert_close(pst.marginal_log_likelihood(tuned), trace[-1], rtol=1e-4)


class _ConvNet(eqx.Module):
    """A grouped convolution, a LayerNorm (in no recognised layer) and a dense head."""

    conv: eqx.nn.Conv2d
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __call__(self, x):
        return self.head(jnp.tanh(self.norm(self.conv(x))).reshape(-1))


def test_kfac_of_a_convolutional_network_is_its_kronecker_blocks_and_the_exact_diagonal_of_the_rest():
    net = _ConvNet(eqx.nn.Conv2d(2, 4, 3, padding=1, groups=2, key=jax.random.key(0), dtype=jnp.float64),
                   eqx.nn.LayerNorm((4, 5, 5), dtype=jnp.float64),
                   eqx.nn.Linear(100, 3, key=jax.random.key(1), dtype=jnp.float64))
    fn, params = lo.models.from_equinox(net)
    X = draws.normal(jax.random.key(2), (6, 2, 5, 5), jnp.float64)
    y = jnp.arange(6) % 3
    post = pst.laplace(fn, params, (X, y), Categorical(), structure="kfac", prior_precision=ALPHA)
    assert post.ggn.diagonal_leaves == ("norm.weight", "norm.bias")
    K = lo.kfac(fn, params, X, y, Categorical())
    G = lo.GGNOp(fn, params, X, y, Categorical()).as_matrix()
    (B, A), (Bh, Ah) = K.factors
    assert B.shape == (2, 2, 2) and A.shape == (2, 9, 9)  # two groups
    blocks = [np.block([[np.kron(B[0], A[0]), np.zeros((18, 18))], [np.zeros((18, 18)), np.kron(B[1], A[1])]]),
              K.bias_blocks[0], np.diag(np.diag(G)[40:140]), np.diag(np.diag(G)[140:240]), np.kron(Bh, Ah),
              K.bias_blocks[1]]
    sizes = [b.shape[0] for b in blocks]
    assert sum(sizes) == G.shape[0]
    expected = np.zeros_like(G)
    start = 0
    for b in blocks:
        expected[start:start + b.shape[0], start:start + b.shape[0]] = b
        start += b.shape[0]
    Lam = np.asarray(post.precision.as_matrix())
    assert_close(Lam, expected + ALPHA * np.eye(G.shape[0]), rtol=1e-9)
    # the covariance, its samples' structure and the evidence's log-determinant follow from the same blocks
    assert_close(post.covariance.as_matrix(), np.linalg.inv(Lam), rtol=1e-8)
    assert_close(lo.logdet(post.precision), np.linalg.slogdet(Lam)[1], rtol=1e-10)
    # the predictive's per-layer Kronecker quadratic forms (grouped convolution, bias, diagonal leaves)
    Xt = draws.normal(jax.random.key(3), (3, 2, 5, 5), jnp.float64)
    Jt = np.asarray(lo.JacobianOp(fn, params, Xt).as_matrix())
    reference = np.einsum("rp,pq,rq->r", Jt, np.linalg.inv(Lam), Jt).reshape(3, 3)
    assert_close(pst.predictive.linearized(post, Xt)[1], reference, rtol=1e-9)


def test_last_layer_is_the_last_dense_layer_in_the_program_for_nnx_and_after_a_pooling_head():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(2, 4, (3, 3), rngs=rngs, param_dtype=jnp.float64)
            self.head = nnx.Linear(4, 3, rngs=rngs, param_dtype=jnp.float64)

        def __call__(self, x):  # x: (H, W, C); global average pooling before the head
            return self.head(jnp.tanh(self.conv(x[None]))[0].mean((0, 1)))

    fn, params = lo.models.from_flax_nnx(Net(nnx.Rngs(0)))
    X = draws.normal(jax.random.key(3), (7, 5, 5, 2), jnp.float64)
    y = jnp.arange(7) % 3
    names = [S.path_string(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    chosen = pst.last_layer_leaves(params, fn=fn, x=X[0])
    assert [names[i] for i in chosen] == ["head.bias.value", "head.kernel.value"]  # 15 weights, the bias kept
    assert [names[i] for i in pst.last_layer_leaves(params)] == ["head.bias.value", "head.kernel.value"]
    post = pst.laplace(fn, params, (X, y), Categorical(), subset_of_weights="last_layer", prior_precision=ALPHA)
    idx = np.asarray(post.weights.indices)
    assert idx.size == 15
    G = np.asarray(lo.GGNOp(fn, params, X, y, Categorical()).as_matrix())[np.ix_(idx, idx)]
    assert_close(post.ggn.precision(ALPHA, 1.0).as_matrix(), G + ALPHA * np.eye(15), rtol=1e-10)


@pytest.mark.parametrize("sigma", [SIGMA, (0.3, 0.5, 0.8)], ids=["scalar-sigma", "per-output-sigma"])
def test_kfac_of_a_multi_output_linear_gaussian_model_is_exact_in_row_major_order(sigma):
    """f(W, x) = W x + b with W (3, 4): with centred inputs KFAC is exact, and with three outputs and four
    inputs its two Kronecker factors cannot be swapped unnoticed (one output, as in
    `test_bayesian_linear_regression_is_exact`, makes the output factor a scalar). The GGN of the row-major
    vec(W) (index o * 4 + i) is diag(1/sigma_o^2) (x) X^T X, not X^T X (x) diag(1/sigma_o^2); that of b is
    N diag(1/sigma_o^2); the weight-bias block is zero. Everything below is built by hand from the per-example
    Jacobians J_n = [I_3 (x) x_n^T, I_3], and the evidence is that of three Bayesian linear regressions."""
    rng = np.random.default_rng(11)
    N, d_in, d_out = 30, 4, 3
    X = rng.standard_normal((N, d_in)) @ rng.standard_normal((d_in, d_in))  # correlated: X^T X far from c I
    X -= X.mean(axis=0)
    s2 = np.broadcast_to(np.asarray(sigma, np.float64) ** 2, (d_out,))
    Y = X @ rng.standard_normal((d_out, d_in)).T + 0.5 + np.sqrt(s2) * rng.standard_normal((N, d_out))
    Phi = np.hstack([X, np.ones((N, 1))])
    # per output a Bayesian linear regression: the MAP and the exact evidence
    theta, evidence = np.zeros((d_out, d_in + 1)), 0.0
    for o in range(d_out):
        theta[o] = np.linalg.solve(Phi.T @ Phi / s2[o] + ALPHA * np.eye(d_in + 1), Phi.T @ Y[:, o] / s2[o])
        K = s2[o] * np.eye(N) + Phi @ Phi.T / ALPHA
        evidence += -0.5 * (Y[:, o] @ np.linalg.solve(K, Y[:, o]) + np.linalg.slogdet(K)[1] + N * np.log(2 * np.pi))
    params = {"W": jnp.asarray(theta[:, :d_in]), "b": jnp.asarray(theta[:, d_in])}  # leaves in order W, b

    def jacobian(x):  # (3, 15): d f_o / d(vec W, b), vec row-major
        return np.hstack([np.kron(np.eye(d_out), x[None, :]), np.eye(d_out)])

    H = np.diag(1.0 / s2)
    G = sum(jacobian(x).T @ H @ jacobian(x) for x in X)
    assert_close(G[:12, :12], np.kron(H, X.T @ X), rtol=1e-12)  # the library's order, by hand
    assert np.abs(np.kron(X.T @ X, H) - G[:12, :12]).max() > 1.0  # the swapped order is far off
    assert_close(G[:12, 12:], np.zeros((12, 3)), atol=1e-10)  # centred: no weight-bias coupling
    Lam = G + ALPHA * np.eye(15)
    Sigma = np.linalg.inv(Lam)

    post = pst.laplace(_dense, params, (jnp.asarray(X), jnp.asarray(Y)), Gaussian(jnp.asarray(sigma)),
                       structure="kfac", prior_precision=ALPHA)
    assert_close(post.precision.as_matrix(), Lam, rtol=1e-10)
    assert_close(post.covariance.as_matrix(), Sigma, rtol=1e-10)
    assert_close(lo.logdet(post.precision), np.linalg.slogdet(Lam)[1], rtol=1e-10)
    assert_close(pst.marginal_log_likelihood(post), evidence, rtol=1e-10)
    T = rng.standard_normal((5, d_in))
    Jt = [jacobian(t) for t in T]
    mean, var = pst.predictive.linearized(post, jnp.asarray(T))  # per-layer Kronecker quadratic forms
    assert_close(mean, T @ theta[:, :d_in].T + theta[:, d_in], rtol=1e-12)
    assert_close(var, np.stack([np.diag(J @ Sigma @ J.T) for J in Jt]), rtol=1e-10)
    _, cov = pst.predictive.linearized(post, jnp.asarray(T), output_covariance=True)  # the covariance's products
    assert_close(cov, np.stack([J @ Sigma @ J.T for J in Jt]), rtol=1e-10)


def test_fit_shows_a_progress_bar_over_the_batches_that_can_be_silenced(capsys, monkeypatch):
    """``laplace(..., progress=True)`` (the default) draws one bar per fit over the data's batches, ending at
    their count; ``progress=False`` draws none, and a fit quicker than the bar's delay prints nothing. The 100
    examples in batches of 16 run as 10 batches of 10 (`linops.runtime.batched_sum`: no short last batch to
    compile the loop body for a second time)."""
    import linops.runtime._progress
    from linops.models import from_equinox

    X = draws.normal(jax.random.key(0), (100, 4))
    y = (X[:, 0] > 0).astype(jnp.int32)
    fn, params = from_equinox(eqx.nn.MLP(4, 3, 8, 2, key=jax.random.key(1)))
    fit = lambda s, **kw: pst.laplace(fn, params, (X, y), Categorical(), **axes(s), batch_size=16, **kw)  # noqa: E731
    fit("diag")
    jax.effects_barrier()
    assert capsys.readouterr().err == ""  # quicker than the delay
    monkeypatch.setattr(linops.runtime._progress, "DELAY", 0.0)
    for structure in ("full", "diag", "kfac", "last_layer"):
        fit(structure)
        jax.effects_barrier()
        err = capsys.readouterr().err
        label = ", ".join(f"{k}={v!r}" for k, v in axes(structure).items())  # e.g. the last layer's two axes
        assert f"laplace({label})" in err and "10/10" in err and err.count("\n") == 1, (structure, err)
    for structure in ("full", "kfac"):  # the predictive's chunks of test inputs (row or layer rules)
        pst.predictive.linearized(fit(structure, progress=False), X, batch_size=30)
        jax.effects_barrier()
        err = capsys.readouterr().err
        assert "linearized predictive" in err and "4/4" in err and err.count("\n") == 1, (structure, err)
    post = fit("diag", progress=False)
    pst.predictive.classification(post, X, progress=False)
    jax.effects_barrier()
    assert capsys.readouterr().err == ""


class _BrokenPipe(io.TextIOBase):
    """A stderr whose reader has gone: every write fails."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("stream", ["none", "closed", "broken"])
def test_a_progress_bar_never_stops_the_computation_it_reports_on(stream, monkeypatch):
    """With no stderr (``pythonw``), a closed one (``2>&-``) or a broken pipe, a fit whose bar is drawn (inside
    its compiled program's callbacks) and a grid search's bar (on the host) run to the same result as silent
    ones: a bar's failed write is dropped, never raised into the computation (issue 37)."""
    import linops.runtime._progress

    X = draws.normal(jax.random.key(0), (40, 3))
    y = (X[:, 0] > 0).astype(jnp.int32)
    fn = lambda p, x: jnp.tanh(x @ p["W"]) @ p["V"]  # noqa: E731
    params = {"V": draws.normal(jax.random.key(2), (5, 2)), "W": draws.normal(jax.random.key(1), (3, 5))}
    fit = lambda **kw: pst.laplace(fn, params, (X, y), Categorical(), structure="diag", batch_size=8, **kw)  # noqa: E731
    quiet = fit(progress=False)
    tuned_quiet = pst.optimize_prior_precision(quiet, method="gridsearch", validation=(X, y), grid=[0.5, 2.0],
                                               progress=False)[0]
    monkeypatch.setattr(linops.runtime._progress, "DELAY", 0.0)
    err = {"none": None, "closed": io.StringIO(), "broken": _BrokenPipe()}[stream]
    if stream == "closed":
        err.close()
    monkeypatch.setattr(sys, "stderr", err)
    post = fit()
    jax.effects_barrier()
    tuned = pst.optimize_prior_precision(post, method="gridsearch", validation=(X, y), grid=[0.5, 2.0])[0]
    monkeypatch.undo()
    assert_close(lo.diag(post.covariance), lo.diag(quiet.covariance), rtol=1e-12)
    assert float(tuned.prior_precision) == float(tuned_quiet.prior_precision)


@pytest.mark.slow  # 4 s
def test_low_rank_fsp_and_gp_fits_show_progress_bars(capsys, monkeypatch):
    """The low-rank fit's bar counts Lanczos steps and ends at the steps run; FSP-Laplace's its four stages;
    fit_gp's Adam's steps, SWAG's SGD steps, the subnetwork GGN's batches; progress=False silences each."""
    import linops.runtime._progress
    from linops.kernels import RBF, fit_gp
    from linops.models import from_equinox

    monkeypatch.setattr(linops.runtime._progress, "DELAY", 0.0)
    X = draws.normal(jax.random.key(0), (40, 2))
    y = (X[:, 0] > 0).astype(jnp.int32)
    fn, params = from_equinox(eqx.nn.MLP(2, 2, 6, 1, key=jax.random.key(1)))
    pst.laplace(fn, params, (X, y), Categorical(), structure="lowrank", rank=3, num_steps=8, key=jax.random.key(2))
    jax.effects_barrier()
    err = capsys.readouterr().err
    # with restarts on an invariant Krylov space, the run always takes its 8 steps
    assert "laplace(structure='lowrank')" in err and "8/8" in err and err.count("\n") == 1, err
    pst.fsp_laplace(fn, params, (X, y), RBF(1.0), X[:10], likelihood=Categorical())
    jax.effects_barrier()
    err = capsys.readouterr().err
    assert "fsp_laplace" in err and "4/4" in err and err.count("\n") == 1, err
    fit_gp(RBF(1.0), X, X[:, 0], num_steps=5)
    jax.effects_barrier()
    err = capsys.readouterr().err
    assert "fit_gp" in err and "5/5" in err and "log marginal likelihood" in err, err
    sub = pst.subnetwork.swag(fn, params, (X, y), Categorical(), 4, key=jax.random.key(3), num_steps=6, batch_size=8)
    pst.subnetwork_laplace(fn, params, (X, y), Categorical(), sub, batch_size=16)
    jax.effects_barrier()
    err = capsys.readouterr().err
    assert "subnetwork.swag" in err and "6/6" in err, err
    # 40 examples in batches of 16 run as 4 batches of 10 (one batch shape: `linops.runtime.batched_sum`)
    assert "subnetwork_laplace (4 weights)" in err and "4/4" in err and err.count("\n") == 2, err
    pst.laplace(fn, params, (X, y), Categorical(), structure="lowrank", rank=3, num_steps=8, key=jax.random.key(2),
                progress=False)
    pst.fsp_laplace(fn, params, (X, y), RBF(1.0), X[:10], likelihood=Categorical(), progress=False)
    fit_gp(RBF(1.0), X, X[:, 0], num_steps=5, progress=False)
    jax.effects_barrier()
    assert capsys.readouterr().err == ""


def test_a_structure_registered_outside_the_library_fits_predicts_and_tunes(monkeypatch):
    """A curvature structure written in a user's file alone: the GGN's diagonal mean times the identity (an isotropic
    curvature). Registered, it fits over every weight and over the last layer, and its covariance, predictive and
    evidence are the closed forms of ``(m I + alpha I)^-1``."""
    import equinox as eqx

    class Isotropic(S.StructuredGGN):
        compile_fit = True
        m: jax.Array
        n: int = eqx.field(static=True)

        @classmethod
        def fit(cls, r):
            return cls(jnp.mean(lo.diag(r.G)), r.G.shape[0])

        def precision(self, alpha, scale):
            return lo.Diagonal(jnp.broadcast_to(self.m / scale + alpha, (self.n,)), nonnegative=True)

    monkeypatch.setitem(S.REGISTRY, "isotropic", Isotropic)
    monkeypatch.setattr(Isotropic, "name", "isotropic", raising=False)
    X, y = _data()
    params, _, _, Phi = _blr(X, y)
    data = (jnp.asarray(X), jnp.asarray(y)[:, None])
    for spec, columns in (("all", slice(None)), (pst.weights.leaves(params, "W"), slice(0, 3))):
        P_s = Phi[:, columns].shape[1]
        post = pst.laplace(_dense, params, data, Gaussian(SIGMA), structure="isotropic", subset_of_weights=spec,
                           prior_precision=ALPHA)
        m = np.mean(np.sum(Phi[:, columns] ** 2, axis=0)) / SIGMA**2
        assert post.structure == "isotropic"
        assert_close(post.ggn.m, m, rtol=1e-10)
        variance = 1.0 / (m + ALPHA)
        x_new = np.array([[0.3, -1.0, 2.0]])
        phi = np.hstack([x_new, np.ones((1, 1))])[:, columns]
        assert_close(pst.predictive.linearized(post, jnp.asarray(x_new))[1][0, 0], variance * np.sum(phi**2),
                     rtol=1e-9)
        theta = np.asarray(ravel(params)[0])[columns]
        expected = (-float(post.loss) - 0.5 * ALPHA * theta @ theta + 0.5 * P_s * np.log(ALPHA)
                    - 0.5 * P_s * np.log(m + ALPHA))
        assert_close(pst.marginal_log_likelihood(post), expected, rtol=1e-10)
        tuned, report = pst.optimize_prior_precision(post, num_steps=100, progress=False)
        assert report["log_marginal_likelihood"][-1] > report["log_marginal_likelihood"][0]
        assert isinstance(eqx.filter_eval_shape(pst.laplace, _dense, params, data, Gaussian(SIGMA),
                                                structure="isotropic", subset_of_weights=spec), pst.LaplacePosterior)
