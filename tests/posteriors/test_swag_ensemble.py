"""SWAG and deep ensembles against their definitions (Maddox et al. 2019, algorithm 1; Lakshminarayanan et
al. 2017): SGD's iterates replayed in NumPy, the mixture's moments and predictive by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posteriors as pst
from linops.likelihoods import Categorical, Gaussian
from tests import _draws as draws
from tests.linops._util import assert_close

SIGMA, ALPHA = 0.7, 2.0


def _linear_problem(n=12, d=3, o=2, seed=0):
    """A linear Gaussian model with several inputs and outputs: fn(W, x) = x W, W of shape (d, o)."""
    kx, kw = jax.random.split(jax.random.key(seed))
    X = draws.normal(kx, (n, d), jnp.float64)
    W_true = draws.normal(kw, (d, o), jnp.float64)
    Y = X @ W_true + 0.3 * jnp.sin(3 * X[:, :o])
    return (lambda W, x: x @ W), W_true * 0.5, X, Y


def _replayed_sgd(W0, X, Y, *, lr, momentum, steps):
    """Full-batch SGD with heavy-ball momentum (optax.sgd's trace: t = g + mu t; theta -= lr t) on the mean
    Gaussian NLL + alpha/(2N) ||theta||^2, in NumPy float64; returns every iterate, flattened row-major."""
    X, Y = np.asarray(X), np.asarray(Y)
    n = X.shape[0]
    theta, trace, path = np.asarray(W0, dtype=np.float64).copy(), np.zeros(W0.shape), []
    for _ in range(steps):
        grad = X.T @ (X @ theta - Y) / (n * SIGMA**2) + ALPHA * theta / n
        trace = grad + momentum * trace
        theta = theta - lr * trace
        path.append(theta.reshape(-1).copy())
    return path


def test_swag_is_maddox_algorithm_1_on_a_replayed_sgd_path():
    fn, W0, X, Y = _linear_problem()
    every, snapshots, rank = 3, 7, 5
    post = pst.swag(fn, W0, (X, Y), Gaussian(SIGMA), key=jax.random.key(0), num_snapshots=snapshots,
                    collect_every=every, rank=rank, learning_rate=0.05, momentum=0.9, batch_size=X.shape[0],
                    prior_precision=ALPHA, progress=False)
    path = _replayed_sgd(W0, X, Y, lr=0.05, momentum=0.9, steps=snapshots * every)
    collected = np.stack(path[every - 1::every])  # every third iterate: 7 of them
    assert collected.shape[0] == snapshots == post.num_snapshots
    mean = collected.mean(axis=0)
    assert_close(post.mean, mean, rtol=1e-10)
    assert_close(post.variance, collected.var(axis=0), rtol=1e-8, atol=1e-14)  # mean of squares - square of mean
    # deviations from the running mean after each update; the last `rank` of them, in ring order
    running = np.cumsum(collected, axis=0) / np.arange(1, snapshots + 1)[:, None]
    deviations = collected - running
    for j in range(snapshots - rank, snapshots):
        assert_close(post.deviations[:, j % rank], deviations[j], rtol=1e-8, atol=1e-14)
    D = deviations[-rank:].T
    expected = 0.5 * np.diag(collected.var(axis=0)) + D @ D.T / (2 * (rank - 1))
    assert_close(post.covariance.as_matrix(), expected, rtol=1e-8, atol=1e-14)
    assert float(np.abs(expected - np.diag(np.diag(expected))).max()) > 1e-3 * float(np.diag(expected).max())


def test_swag_diagonal_and_its_samples_have_the_stated_moments():
    fn, W0, X, Y = _linear_problem(seed=1)
    common = dict(key=jax.random.key(1), num_snapshots=12, collect_every=2, learning_rate=0.05, batch_size=4,
                  prior_precision=ALPHA, progress=False)
    full = pst.swag(fn, W0, (X, Y), Gaussian(SIGMA), **common)
    diag = pst.swag(fn, W0, (X, Y), Gaussian(SIGMA), rank=0, **common)
    assert_close(diag.variance, full.variance, rtol=1e-12)  # the same SGD path
    assert_close(diag.covariance.as_matrix(), np.diag(np.asarray(full.variance)), rtol=1e-12)
    for post in (full, diag):
        samples = np.asarray(post.sample(jax.random.key(2), 60_000))
        cov = np.asarray(post.covariance.as_matrix())
        scale = np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
        assert np.all(np.abs(samples.mean(axis=0) - np.asarray(post.mean)) < 0.03 * np.sqrt(np.diag(cov)))
        assert np.all(np.abs(np.cov(samples.T) - cov) < 0.03 * scale)


def test_swag_never_moves_a_weight_without_gradient_and_predicts_like_its_covariance():
    X = jnp.array([[1.0, 0.0], [2.0, 0.0], [0.5, 0.0], [-1.0, 0.0]], jnp.float64)
    Y = jnp.array([[1.0], [0.0], [2.0], [0.5]], jnp.float64)
    fn = lambda w, x: (x @ w)[None]  # noqa: E731
    post = pst.swag(fn, jnp.zeros(2, jnp.float64), (X, Y), Gaussian(1.0), key=jax.random.key(3), num_snapshots=6,
                    collect_every=2, batch_size=1, progress=False)
    assert float(post.variance[1]) == 0.0 and bool(jnp.all(post.deviations[1] == 0))
    assert float(post.variance[0]) > 0
    Xt = jnp.array([[1.5, 3.0], [0.0, 1.0]], jnp.float64)
    mean, var = pst.predictive.linearized(post, Xt, progress=False)
    J = np.asarray(Xt)  # the Jacobian of a linear model: the inputs
    assert_close(var[:, 0], np.einsum("mp,pq,mq->m", J, np.asarray(post.covariance.as_matrix()), J), rtol=1e-10)
    assert_close(mean[:, 0], Xt @ post.mean, rtol=1e-12)
    net = pst.predictive.monte_carlo(post, jax.random.key(4), Xt, 5, linearized=False)
    assert_close(net, jnp.einsum("mp,sp->sm", Xt, post.sample(jax.random.key(4), 5))[..., None], rtol=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rank=1), "rank must be 0"), (dict(rank=25), "rank must be 0"), (dict(num_snapshots=0), "num_snapshots"),
    (dict(collect_every=0), "collect_every"), (dict(learning_rate=0.0), "learning_rate"),
    (dict(prior_precision=-1.0), "prior_precision"), (dict(batch_size=0), "batch_size"),
])
def test_swag_refuses_bad_settings_before_any_step(kwargs, match):
    fn, W0, X, Y = _linear_problem()
    with pytest.raises(ValueError, match=match):
        pst.swag(fn, W0, (X, Y), Gaussian(SIGMA), key=jax.random.key(0), **kwargs)
    with pytest.raises(ValueError, match="deviations must have shape"):
        pst.SWAGPosterior(fn, W0, jnp.ones(6), jnp.ones((6, 1)), num_snapshots=1)


def _members(seed=0, m=3):
    keys = jax.random.split(jax.random.key(seed), m)
    return [draws.normal(k, (3, 4), jnp.float64) for k in keys]


def test_an_ensemble_has_the_mixtures_moments_and_predictive():
    members = _members()
    fn = lambda W, x: x @ W  # noqa: E731
    ens = pst.DeepEnsemble.from_members(fn, members, Gaussian(0.5))
    flat = np.stack([np.asarray(m).reshape(-1) for m in members])
    assert_close(ens.mean, flat.mean(axis=0), rtol=1e-12)
    assert_close(ens.covariance.as_matrix(), np.cov(flat.T, bias=True), rtol=1e-10, atol=1e-14)
    X = draws.normal(jax.random.key(9), (5, 3), jnp.float64)
    logits = np.stack([np.asarray(X @ m) for m in members])  # (M, N, K)
    softmax = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    probs = pst.predictive.classification(ens, X)
    assert_close(probs, softmax.mean(axis=0), rtol=1e-12)
    assert_close(pst.predictive.classification(ens, X, link="mc"), probs, rtol=0)
    # the average of the members' probabilities, not the softmax of their average logit
    assert float(np.abs(np.asarray(probs) - np.asarray(jax.nn.softmax(logits.mean(axis=0)))).max()) > 1e-3
    mean, var = pst.predictive.regression(ens, X)
    assert_close(mean, logits.mean(axis=0), rtol=1e-12)
    assert_close(var, logits.var(axis=0) + 0.25, rtol=1e-12)
    y = jnp.array([0, 1, 2, 3, 0])
    ens_c = pst.DeepEnsemble.from_members(fn, members, Categorical())
    nll = -np.sum(np.log(softmax.mean(axis=0)[np.arange(5), np.asarray(y)]))
    assert_close(pst.predictive.nll(ens_c, X, y), nll, rtol=1e-10)


def test_an_ensemble_samples_its_members_and_has_no_linearisation():
    members = _members(m=4)
    ens = pst.DeepEnsemble.from_members(lambda W, x: x @ W, members)
    draws = np.asarray(ens.sample(jax.random.key(0), 4000))
    flat = np.stack([np.asarray(m).reshape(-1) for m in members])
    which = [int(np.flatnonzero((flat == d).all(axis=1))[0]) for d in draws]  # every draw is a member
    assert np.all(np.abs(np.bincount(which, minlength=4) / 4000 - 0.25) < 0.03)
    X = jnp.ones((2, 3), jnp.float64)
    outs = pst.predictive.monte_carlo(ens, jax.random.key(0), X, 6, linearized=False)
    assert_close(outs, jnp.einsum("nd,sdk->snk", X, ens.sample(jax.random.key(0), 6).reshape(6, 3, 4)), rtol=1e-12)
    with pytest.raises(TypeError, match="no linearisation"):
        pst.predictive.linearized(ens, X)
    with pytest.raises(TypeError, match="no linearisation"):
        pst.predictive.monte_carlo(ens, jax.random.key(0), X, 3)
    with pytest.raises(ValueError, match="bridge"):
        pst.predictive.classification(ens, X, link="bridge")
    with pytest.raises(ValueError, match="at least two members"):
        pst.DeepEnsemble.from_members(lambda W, x: x @ W, members[:1])
    with pytest.raises(ValueError, match="member 1 has"):
        pst.DeepEnsemble.from_members(lambda W, x: x @ W, [members[0], jnp.ones((2, 4))])


def test_deep_ensemble_trains_independent_members():
    fn, _, X, Y = _linear_problem(n=40)
    init = lambda k: draws.normal(k, (3, 2), jnp.float64)  # noqa: E731
    # a strictly convex problem: every member, from its own start, reaches the one minimiser (ridge regression)
    ens = pst.deep_ensemble(fn, init, (X, Y), Gaussian(SIGMA), key=jax.random.key(0), num_members=3, num_steps=3000,
                            learning_rate=0.05, batch_size=40, prior_precision=ALPHA, progress=False)
    Xn, Yn = np.asarray(X), np.asarray(Y)
    ridge = np.linalg.solve(Xn.T @ Xn / SIGMA**2 + ALPHA * np.eye(3), Xn.T @ Yn / SIGMA**2).reshape(-1)
    for m in range(3):
        assert_close(ens.members[m], ridge, rtol=1e-6, atol=1e-8)
    # independence: different starts, and different minibatches from one start
    early = pst.deep_ensemble(fn, init, (X, Y), Gaussian(SIGMA), key=jax.random.key(0), num_members=3, num_steps=1,
                              progress=False)
    assert len({tuple(np.round(np.asarray(r), 12)) for r in early.members}) == 3
    same_start = lambda k: jnp.ones((3, 2), jnp.float64)  # noqa: E731
    shuffled = pst.deep_ensemble(fn, same_start, (X, Y), Gaussian(SIGMA), key=jax.random.key(0), num_members=2,
                                 num_steps=5, batch_size=4, progress=False)
    assert float(jnp.abs(shuffled.members[0] - shuffled.members[1]).max()) > 1e-6
    for bad, match in ((dict(num_members=1), "num_members must be an integer >= 2"),
                       (dict(batch_size=0), "batch_size must be an integer >= 1"),
                       (dict(learning_rate=-1.0), "learning_rate must be finite and positive"),
                       (dict(prior_precision=-2.0), "prior_precision must be finite and >= 0"),
                       (dict(num_steps=0), "num_steps must be an integer >= 1")):
        with pytest.raises(ValueError, match=f"deep_ensemble: {match}"):
            pst.deep_ensemble(fn, init, (X, Y), Gaussian(SIGMA), key=jax.random.key(0), **bad)


def test_a_convolutional_ensemble_trains_its_members_in_turn_on_cpu_and_gets_the_same_members(monkeypatch):
    """On CPU a CNN's members train one after another (a vectorised convolution over the members' weights is a slow
    grouped convolution there); the members equal the vectorised program's."""
    import posteriors.ensemble as ensemble

    def fn(p, x):  # x (5, 5)
        h = jax.lax.conv_general_dilated(x[None, None], p["K"], (1, 1), "SAME")[0]
        return p["W"] @ jnp.tanh(h).reshape(-1)

    rng = np.random.default_rng(3)
    X = jnp.asarray(rng.standard_normal((24, 5, 5)))
    Y = jnp.asarray(rng.integers(0, 3, 24))
    init = lambda k: {"K": 0.3 * draws.normal(k, (2, 1, 3, 3), jnp.float64),  # noqa: E731
                      "W": 0.1 * draws.normal(jax.random.fold_in(k, 1), (3, 50), jnp.float64)}
    loss = lambda theta, idx: jnp.sum(theta**2)  # noqa: E731
    assert ensemble._members_in_turn(lambda t, i: jnp.sum(jax.vmap(fn, (None, 0))(
        {"K": t[:18].reshape(2, 1, 3, 3), "W": t[18:].reshape(3, 50)}, X[i])), jnp.zeros(168), 4)
    assert not ensemble._members_in_turn(loss, jnp.zeros(3), 4)
    kwargs = dict(key=jax.random.key(5), num_members=3, num_steps=40, learning_rate=0.05, batch_size=8,
                  progress=False)
    in_turn = pst.deep_ensemble(fn, init, (X, Y), Categorical(), **kwargs)
    monkeypatch.setattr(ensemble, "_members_in_turn", lambda *a: False)
    together = pst.deep_ensemble(fn, init, (X, Y), Categorical(), **kwargs)
    assert_close(in_turn.members, together.members, rtol=1e-10, atol=1e-12)
    assert float(jnp.abs(in_turn.members[0] - in_turn.members[1]).max()) > 1e-3  # and they are not all alike


def test_swag_and_ensembles_round_trip_through_save_and_load(tmp_path):
    fn, W0, X, Y = _linear_problem()
    post = pst.swag(fn, W0, (X, Y), Gaussian(SIGMA), key=jax.random.key(0), num_snapshots=4, collect_every=2,
                    batch_size=4, progress=False)
    ens = pst.DeepEnsemble.from_members(fn, [W0, 2 * W0], Gaussian(SIGMA))
    for obj in (post, ens):
        path = tmp_path / f"{type(obj).__name__}.eqx"
        pst.save(obj, path)
        back = pst.load(path, obj)
        assert bool(jnp.all(back.sample(jax.random.key(1), 3) == obj.sample(jax.random.key(1), 3)))


def test_swag_and_the_ensemble_trace_under_jit_and_eval_shape():
    """Issue 37: ``swag`` under ``jit`` or ``eqx.filter_eval_shape`` raised ``ConcretizationTypeError`` (it read its
    snapshot count back from the traced loop). Traced, both give the eager values."""
    import equinox as eqx

    fn, W0, X, Y = _linear_problem()

    def fit_swag(w):
        return pst.swag(fn, w, (X, Y), Gaussian(1.0), key=jax.random.key(1), num_snapshots=4, collect_every=2,
                        batch_size=4, progress=False)

    eager, traced = fit_swag(W0), eqx.filter_jit(fit_swag)(W0)
    assert traced.num_snapshots == eager.num_snapshots == 4
    for a, b in ((eager.mean, traced.mean), (eager.variance, traced.variance), (eager.deviations, traced.deviations)):
        assert_close(b, a, rtol=1e-6, atol=1e-12)
    assert float(jnp.max(eager.variance)) > 0  # the comparison is not of zeros
    shapes = eqx.filter_eval_shape(fit_swag, W0)
    assert shapes.variance.shape == eager.variance.shape and shapes.deviations.shape == eager.deviations.shape

    def fit_ensemble(w):
        init = lambda k: w + 0.1 * draws.normal(k, w.shape)  # noqa: E731
        return pst.deep_ensemble(fn, init, (X, Y), Gaussian(1.0), key=jax.random.key(2), num_members=2, num_steps=5,
                                 batch_size=4, progress=False)

    assert_close(eqx.filter_jit(fit_ensemble)(W0).members, fit_ensemble(W0).members, rtol=1e-6, atol=1e-12)
