"""`pst.marglik_training` (Immer et al. 2021, algorithm 1): the network and its prior and noise learnt together.

On Bayesian linear regression the Laplace evidence is the exact evidence and the alternation's fixed point is its
maximum: the learnt prior precision and noise must reach the closed-form optimum."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.optimize import minimize

import posteriors as pst
from linops.likelihoods import Bernoulli, Categorical, Gaussian
from linops.models import from_equinox, ravel
from linops.testing import count_compilations as compiles
from tests import _draws as draws


def _linear_problem(n=60, d=3, k=2):
    kx, kw, ke = jax.random.split(jax.random.key(0), 3)
    X = draws.normal(kx, (n, d), jnp.float64)
    W = 0.7 * draws.normal(kw, (d, k), jnp.float64)
    return X, X @ W + 0.4 + 0.25 * draws.normal(ke, (n, k), jnp.float64)


def _exact_evidence(X, Y, alpha, sigma):
    """log N(y_k | 0, sigma^2 I + Phi Phi^T / alpha) summed over the outputs, Phi = [X, 1]."""
    Phi = np.concatenate([np.asarray(X), np.ones((X.shape[0], 1))], axis=1)
    C = sigma**2 * np.eye(X.shape[0]) + Phi @ Phi.T / alpha
    _, logdet = np.linalg.slogdet(C)
    Yn = np.asarray(Y)
    quad = np.sum(Yn * np.linalg.solve(C, Yn))
    return -0.5 * quad - 0.5 * Yn.shape[1] * (logdet + X.shape[0] * np.log(2 * np.pi))


def test_bayesian_linear_regression_reaches_the_closed_form_evidence_optimum():
    with jax.enable_x64(True):
        X, Y = _linear_problem()
        best = minimize(lambda t: -_exact_evidence(X, Y, np.exp(t[0]), np.exp(t[1])), np.zeros(2), method="BFGS",
                        options={"gtol": 1e-10})
        alpha_star, sigma_star = np.exp(best.x)
        fn = lambda p, x: x @ p["W"] + p["b"]  # noqa: E731
        params = {"W": jnp.zeros((3, 2), jnp.float64), "b": jnp.zeros(2, jnp.float64)}
        fit = pst.marglik_training(fn, params, (X, Y), Gaussian(1.0), key=jax.random.key(1), num_epochs=1500,
                                   batch_size=60, structure="full", prior_structure="scalar",
                                   optimizer=optax.adam(2e-2), every=100, hyper_steps=300, progress=False)
        alpha, sigma = float(fit.posterior.prior_precision), float(fit.posterior.likelihood.sigma)
        np.testing.assert_allclose([alpha, sigma], [alpha_star, sigma_star], rtol=2e-3)
        # the trained weights are the MAP under the learnt prior and noise: (Phi^T Phi + alpha sigma^2 I)^{-1} Phi^T Y
        Phi = np.concatenate([np.asarray(X), np.ones((60, 1))], axis=1)
        exact_map = np.linalg.solve(Phi.T @ Phi + alpha * sigma**2 * np.eye(4), Phi.T @ np.asarray(Y))
        np.testing.assert_allclose(np.concatenate([fit.params["W"], fit.params["b"][None]]), exact_map, atol=1e-4)
        # the reported evidence is the exact one at the learnt values
        np.testing.assert_allclose(fit.history["log_marginal_likelihood"][-1],
                                   _exact_evidence(X, Y, alpha, sigma), rtol=1e-5)
        assert fit.history["marglik_epochs"].tolist() == list(range(100, 1501, 100))
        assert fit.history["loss"].shape == fit.history["epoch_seconds"].shape == (1500,)
        assert fit.history["update_seconds"].shape == fit.history["sigma"].shape == (15,)
        np.testing.assert_allclose(fit.history["sigma"][-1], sigma)


def _mlp(outputs, seed=0):
    return from_equinox(eqx.nn.MLP(4, outputs, 12, 2, activation=jnp.tanh, key=jax.random.key(seed)))


@pytest.mark.parametrize(("structure", "prior_structure"), [("kfac", "layerwise"),
                                                            pytest.param("diag", "diag", marks=pytest.mark.slow),
                                                            ("full", "scalar")])
def test_the_posterior_is_tuned_at_the_returned_weights_under_the_learnt_prior(structure, prior_structure):
    X = draws.normal(jax.random.key(3), (48, 4))
    y = (jnp.sum(X[:, :2], axis=1) > 0).astype(jnp.int32) + (X[:, 2] > 1).astype(jnp.int32)
    fn, params = _mlp(3)
    fit = pst.marglik_training(fn, params, (X, y), Categorical(), key=jax.random.key(4), num_epochs=6,
                               batch_size=16, structure=structure, prior_structure=prior_structure, every=2,
                               optimizer=optax.adam(1e-2), progress=False)
    post = fit.posterior
    assert post.structure == structure
    np.testing.assert_allclose(ravel(post.params)[0], ravel(fit.params)[0])
    alpha = np.broadcast_to(np.asarray(post.prior_precision), (ravel(params)[0].shape[0],))
    best = list(fit.history["marglik_epochs"]).index(fit.history["best_epoch"])
    assert fit.history["log_marginal_likelihood"][best] == np.max(fit.history["log_marginal_likelihood"])
    np.testing.assert_allclose(alpha, np.broadcast_to(fit.history["prior_precision"][best], alpha.shape), rtol=1e-6)
    if prior_structure == "layerwise":  # one value per leaf, and they differ
        sizes = [leaf.size for leaf in jax.tree_util.tree_leaves(params)]
        per_leaf = np.split(alpha, np.cumsum(sizes)[:-1])
        assert all(np.ptp(a) == 0 for a in per_leaf) and len({float(a[0]) for a in per_leaf}) > 1
    # the history's best log evidence is the returned posterior's
    np.testing.assert_allclose(float(pst.marginal_log_likelihood(post)), fit.history["log_marginal_likelihood"][best],
                               rtol=1e-5)
    # the returned weights are the epochs' steps: a direct refit at them under the learnt prior is the same
    refit = pst.laplace(fn, fit.params, (X, y), Categorical(), structure=structure, prior_precision=alpha,
                        progress=False)
    np.testing.assert_allclose(float(pst.marginal_log_likelihood(refit)),
                               fit.history["log_marginal_likelihood"][best], rtol=1e-5)
    assert fit.history["sigma"] is None


def test_restore_best_returns_the_update_of_the_highest_evidence_and_false_the_last():
    X = draws.normal(jax.random.key(3), (48, 4))
    y = jnp.arange(48) % 3
    fn, params = _mlp(3)
    # a learning rate that grows 100-fold: the training diverges and the evidence falls after its third update
    opt = optax.adam(optax.linear_schedule(1e-2, 1.0, 36))
    kw = dict(key=jax.random.key(4), num_epochs=12, batch_size=16, structure="kfac", optimizer=opt, hyper_steps=2,
              hyper_learning_rate=0.01, progress=False)
    best = pst.marglik_training(fn, params, (X, y), Categorical(), **kw)
    last = pst.marglik_training(fn, params, (X, y), Categorical(), restore_best=False, **kw)
    trace = best.history["log_marginal_likelihood"]
    np.testing.assert_allclose(trace, last.history["log_marginal_likelihood"], rtol=1e-5)  # the same run
    assert np.argmax(trace) != len(trace) - 1, "the check needs a run whose evidence peaks before the end"
    assert best.history["best_epoch"] == best.history["marglik_epochs"][np.argmax(trace)]
    assert last.history["best_epoch"] == 12
    np.testing.assert_allclose(float(pst.marginal_log_likelihood(best.posterior)), np.max(trace), rtol=1e-5)
    np.testing.assert_allclose(float(pst.marginal_log_likelihood(last.posterior)), trace[-1], rtol=1e-5)
    assert not np.allclose(ravel(best.params)[0], ravel(last.params)[0])


@pytest.mark.filterwarnings("ignore:marglik_training. on the first")  # the frozen prior's flat predictive
def test_training_follows_the_prior_the_evidence_learns():
    # a strong learnt prior shrinks the weights: the same run with the prior frozen at its start ends larger
    X = draws.normal(jax.random.key(5), (64, 4))
    y = (X[:, :1] > 0).astype(jnp.float32)
    fn, params = _mlp(1, seed=1)
    kw = dict(key=jax.random.key(6), num_epochs=30, batch_size=32, structure="diag", prior_structure="scalar",
              optimizer=optax.adam(3e-2), progress=False, prior_precision=1e-3)
    tuned = pst.marglik_training(fn, params, (X, y), Bernoulli(), every=1, hyper_steps=50, **kw)
    assert float(tuned.posterior.prior_precision) > 1e-2  # the evidence moved the prior away from 1e-3
    frozen = pst.marglik_training(fn, params, (X, y), Bernoulli(), burn_in=29, **kw)  # updated after the end only
    assert np.linalg.norm(ravel(tuned.params)[0]) < np.linalg.norm(ravel(frozen.params)[0])


def test_a_second_run_of_the_same_shapes_compiles_nothing():
    X = draws.normal(jax.random.key(7), (32, 4))
    y = jnp.arange(32) % 3
    fn, params = _mlp(3)
    opt = optax.adam(1e-2)
    kw = dict(num_epochs=3, batch_size=16, structure="kfac", optimizer=opt, progress=False)
    pst.marglik_training(fn, params, (X, y), Categorical(), key=jax.random.key(8), **kw)
    params2 = jax.tree_util.tree_map(lambda a: 1.5 * a, params)
    X2, key2 = X + 1.0, jax.random.key(9)
    with compiles() as events:
        fit = pst.marglik_training(fn, params2, (X2, y), Categorical(), key=key2, **kw)
        jax.block_until_ready(fit.params)
    assert events == [], f"{len(events)} compilations on the second run"


def test_later_updates_and_the_closing_check_of_a_first_run_compile_almost_nothing(monkeypatch):
    """The first update compiles the fit and the tuning for the prior's form that every update returns (one
    precision per parameter under a layerwise prior; the initial scalar compiled a second set of programs at the
    second update), and the closing check is one program (it was about 50 small eager ones on a CNN)."""
    import posteriors.marglik as marglik_module

    X = draws.normal(jax.random.key(7), (40, 5))  # shapes of this test only: a first run
    y = jnp.arange(40) % 4
    fn, params = from_equinox(eqx.nn.MLP(5, 4, 6, 1, activation=jnp.tanh, key=jax.random.key(3)))
    marks, real = [], marglik_module.laplace
    with compiles() as events:
        monkeypatch.setattr(marglik_module, "laplace", lambda *a, **k: marks.append(len(events)) or real(*a, **k))
        fit = pst.marglik_training(fn, params, (X, y), Categorical(), key=jax.random.key(8), num_epochs=3,
                                   batch_size=20, optimizer=optax.adam(1e-2), progress=False)
        jax.block_until_ready(fit.params)
    assert len(marks) == 3 and marks[0] > 0
    assert marks[2] == marks[1], f"{marks[2] - marks[1]} compilations in the second update and the third epoch"
    assert len(events) - marks[2] <= 1, f"{len(events) - marks[2]} compilations in the last update and the check"


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"burn_in": 5}, "burn_in"),
    ({"num_epochs": 0}, "num_epochs"),
    ({"structure": "kfac", "prior_structure": "diag"}, "one prior precision per leaf"),
    ({"prior_structure": "full"}, "prior_structure must be"),
    ({"structure": "dense"}, "structure must be one of"),
    ({"tune_sigma": True}, "tune_sigma needs a Gaussian"),
    ({"laplace_options": {"subset_of_weights": "last_layer"}}, "laplace_options may not set"),
    ({"hyper_learning_rate": 0.0}, "hyper_learning_rate must be positive"),
])
def test_bad_options_are_refused_before_training(kwargs, match):
    X = draws.normal(jax.random.key(7), (32, 4))
    fn, params = _mlp(3)
    kw = {"num_epochs": 5, "key": jax.random.key(0), "progress": False, **kwargs}
    with pytest.raises(ValueError, match=match):
        pst.marglik_training(fn, params, (X, jnp.arange(32) % 3), Categorical(), **kw)


def test_targets_that_do_not_fit_the_model_are_refused():
    X = draws.normal(jax.random.key(7), (32, 4))
    fn, params = _mlp(3)
    with pytest.raises(ValueError, match="marglik_training"):
        pst.marglik_training(fn, params, (X, jnp.full(32, 3)), Categorical(), key=jax.random.key(0), num_epochs=2,
                             progress=False)


def test_a_predictive_far_flatter_than_the_network_on_the_training_data_is_said():
    # a network that fits its labels almost exactly under a prior held near its start (one update, at the end):
    # the diagonal posterior's linearised predictive is far flatter than the network on the training examples
    X = draws.normal(jax.random.key(5), (64, 4))
    y = (X[:, :1] > 0).astype(jnp.float32)
    fn, params = _mlp(1, seed=1)
    kw = dict(key=jax.random.key(6), num_epochs=30, batch_size=32, structure="diag", prior_structure="scalar",
              optimizer=optax.adam(3e-2), progress=False, prior_precision=1e-3, burn_in=29)
    with pytest.warns(UserWarning, match="far less confident than the network"):
        fit = pst.marglik_training(fn, params, (X, y), Bernoulli(), **kw)
    probs = pst.predictive.classification(fit.posterior, X)[:, 0]
    network = jax.nn.sigmoid(jax.vmap(fn, in_axes=(None, 0))(fit.params, X)[:, 0])
    sharp = lambda p: float(jnp.mean(jnp.abs(p - 0.5)))  # noqa: E731
    assert sharp(probs) < sharp(network) - 0.1  # what the warning says is true
    import warnings

    with warnings.catch_warnings(), jax.enable_x64(True):
        warnings.simplefilter("error")  # linear regression: the predictive explains the data as the network does
        Xr, Yr = _linear_problem()
        pst.marglik_training(lambda p, x: x @ p, jnp.zeros((3, 2), jnp.float64), (Xr, Yr), Gaussian(1.0),
                             key=jax.random.key(1), num_epochs=200, batch_size=60, structure="full",
                             optimizer=optax.adam(2e-2), every=50, progress=False)


@pytest.mark.slow  # 6 s
def test_evidence_tuning_says_when_its_predictive_is_far_flatter_than_the_network_on_the_data_checked():
    """Issue 39 item 2: `optimize_prior_precision(post, check=(X, y))` compares the evidence-tuned predictive with
    the network on the training data and warns when it explains them far worse (it was silent: a trained CNN's
    tuned low-rank predictive was near-uniform). Without ``check`` nothing is compared; linear regression, where
    the predictive explains the data as the network does, passes silently; with a grid search check is refused."""
    import warnings

    X = draws.normal(jax.random.key(5), (64, 4))
    y = (X[:, :1] > 0).astype(jnp.float32)
    fn, params = _mlp(1, seed=1)
    loss = lambda p: jnp.mean(jax.vmap(Bernoulli().nll)(jax.vmap(fn, in_axes=(None, 0))(p, X), y))  # noqa: E731
    opt = optax.adam(3e-2)
    state = opt.init(params)
    for _ in range(300):  # the network fits its labels almost exactly
        updates, state = opt.update(jax.grad(loss)(params), state)
        params = optax.apply_updates(params, updates)
    post = pst.laplace(fn, params, (X, y), Bernoulli(), structure="diag", prior_precision=1e-3, progress=False)
    with pytest.warns(UserWarning, match=r"optimize_prior_precision: on the first 64 training examples the "
                                         r"evidence-tuned predictive.*far less confident than the network"):
        tuned, _ = pst.optimize_prior_precision(post, check=(X, y), progress=False)
    probs = pst.predictive.classification(tuned, X)[:, 0]
    network = jax.nn.sigmoid(jax.vmap(fn, in_axes=(None, 0))(params, X)[:, 0])
    sharp = lambda p: float(jnp.mean(jnp.abs(p - 0.5)))  # noqa: E731
    assert sharp(probs) < sharp(network) - 0.1  # what the warning says is true
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again, _ = pst.optimize_prior_precision(post, progress=False)  # no check: silent, and the same tuning
        np.testing.assert_allclose(np.asarray(again.prior_precision), np.asarray(tuned.prior_precision), rtol=1e-6)
        with jax.enable_x64(True):
            Xr, Yr = _linear_problem()
            lin = pst.laplace(lambda p, x: x @ p, jnp.zeros((3, 2), jnp.float64), (Xr, Yr), Gaussian(1.0),
                              structure="full", progress=False)
            pst.optimize_prior_precision(lin, check=(Xr, Yr), progress=False)
    with pytest.raises(ValueError, match=r"optimize_prior_precision: check= compares an evidence-tuned predictive"):
        pst.optimize_prior_precision(post, method="gridsearch", validation=(X, y), check=(X, y), progress=False)
    for bad, match in ((jnp.full((64, 1), 2.0), r"needs targets in \[0, 1\]"), (y[:, 0], r"targets of shape")):
        with pytest.raises(ValueError, match=rf"^optimize_prior_precision: .*{match}"):
            pst.optimize_prior_precision(post, check=(X, bad), progress=False)  # refused before any tuning
