"""The training the experiments, benchmarks and notebooks share (`posteriors.experiments.training`)."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from linops.likelihoods import Gaussian
from posteriors.experiments import training
from posteriors.experiments.training import train, train_map
from tests import _draws as draws


def _regression(n=40, d=3, k=2, seed=0):
    kx, kw, ke = jax.random.split(jax.random.key(seed), 3)
    X = draws.normal(kx, (n, d))
    W = draws.normal(kw, (d, k))
    return X, X @ W + 0.3 * draws.normal(ke, (n, k))


def test_train_map_reaches_the_closed_form_map_of_bayesian_linear_regression():
    # negative log posterior: ||Y - X W||^2 / (2 sigma^2) + alpha / 2 ||W||^2, minimised by
    # W = (X^T X / sigma^2 + alpha I)^{-1} X^T Y / sigma^2 (every output column alike)
    X, Y = _regression()
    sigma, alpha = 0.5, 2.0
    exact = np.linalg.solve(X.T @ X / sigma**2 + alpha * np.eye(3), X.T @ Y / sigma**2)
    fn = lambda p, x: x @ p["W"]  # noqa: E731
    params, record = train_map(fn, {"W": jnp.zeros((3, 2))}, X, Y, Gaussian(sigma), alpha, steps=3000,
                               learning_rate=0.02)
    np.testing.assert_allclose(params["W"], exact, rtol=1e-4, atol=1e-4)
    assert record["steps"] == 3000 and record["objectives"].shape == (3000,)
    assert len(record["chunk_seconds"]) == 10
    # the recorded objective is the negative log posterior (up to the Gaussian's constant) at each step's start
    assert record["objectives"][-1] < record["objectives"][0]


@pytest.mark.parametrize("lr", [1e-2, optax.cosine_decay_schedule(1e-2, 250)], ids=["constant", "cosine"])
def test_full_batch_train_map_takes_the_steps_of_a_plain_adam_scan(lr):
    # the loop the notebooks carried before they used train_map: identical steps, to float rounding; a schedule's
    # step count runs on across the jitted chunks (the ResNet's MAP of `projected` decays its rate so)
    X, Y = _regression(seed=1)
    lik, alpha = Gaussian(0.5), 1.0
    fn = lambda p, x: jnp.tanh(x @ p["W"])  # noqa: E731
    W0 = 0.1 * draws.normal(jax.random.key(2), (3, 2))

    def loss(w):
        out = jax.vmap(fn, in_axes=(None, 0))({"W": w}, X)
        return jnp.sum(jax.vmap(lik.nll)(out, Y)) + 0.5 * alpha * jnp.sum(w**2)

    opt = optax.adam(lr)

    def step(carry, _):
        w, state = carry
        value, g = jax.value_and_grad(loss)(w)
        updates, state = opt.update(g, state, w)
        return (optax.apply_updates(w, updates), state), value

    (w_ref, _), values = jax.lax.scan(step, (W0, opt.init(W0)), None, length=250)
    params, record = train_map(fn, {"W": W0}, X, Y, lik, alpha, steps=250, learning_rate=lr, chunks=3)
    np.testing.assert_allclose(params["W"], w_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(record["objectives"], values, rtol=1e-5)


def test_minibatches_are_drawn_without_replacement_and_scaled_to_the_whole_data_set():
    # the objective sees batches of 8 distinct examples; the likelihood term is scaled by N / 8
    X = jnp.arange(32.0)[:, None]
    seen = []

    def objective(p, batch, key):
        jax.debug.callback(lambda x: seen.append(np.asarray(x)), batch[0][:, 0])
        return jnp.sum((batch[1][:, 0] - p) ** 2)

    train(objective, jnp.zeros(()), (X, X), steps=5, learning_rate=0.1, key=jax.random.key(0), batch_size=8,
          chunks=1)
    assert len(seen) == 5
    assert all(len(np.unique(b)) == 8 for b in seen)
    assert len({tuple(b) for b in seen}) == 5  # a fresh batch every step

    fn = lambda p, x: x @ p  # noqa: E731
    Xr, Yr = _regression(n=32, d=3, k=1)
    lik = Gaussian(1.0)
    _, full = train_map(fn, jnp.zeros((3, 1)), Xr, Yr, lik, 0.0, steps=1, learning_rate=1e-3)
    # 40 steps too small to move theta from 0: 40 minibatch objectives at (nearly) the same point
    _, quarters = train_map(fn, jnp.zeros((3, 1)), Xr, Yr, lik, 0.0, steps=40, learning_rate=1e-9,
                            key=jax.random.key(1), batch_size=8)
    quarters = quarters["objectives"]
    assert np.ptp(quarters) > 0.1 * np.mean(quarters)  # the batches differ: the check is not vacuous
    # each step's objective estimates the full one without bias (the same expectation): unscaled, its mean
    # would be a quarter of the full objective
    assert abs(np.mean(quarters) - full["objectives"][0]) < 3 * np.std(quarters) / np.sqrt(40)


def test_a_time_budget_stops_between_chunks_and_says_how_far_it_got():
    X, Y = _regression()
    fn = lambda p, x: x @ p  # noqa: E731
    _, record = train_map(fn, jnp.zeros((3, 2)), X, Y, Gaussian(1.0), 1.0, steps=100, learning_rate=1e-2,
                          chunks=4, budget_s=0.0)
    assert record["steps"] == 25 and record["objectives"].shape == (25,) and len(record["chunk_seconds"]) == 1


def test_an_optax_optimizer_replaces_adam():
    X, Y = _regression()
    fn = lambda p, x: x @ p  # noqa: E731
    objective = lambda p, batch, key: jnp.sum((batch[1] - fn(p, batch[0])) ** 2)  # noqa: E731
    sgd, _ = train(objective, jnp.zeros((3, 2)), (X, Y), steps=1, optimizer=optax.sgd(1e-3))
    grad = jax.grad(objective)(jnp.zeros((3, 2)), (X, Y), None)
    np.testing.assert_allclose(sgd, -1e-3 * grad, rtol=1e-5)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"steps": 0, "learning_rate": 0.1}, "steps must be an integer >= 1"),
    ({"steps": 2.5, "learning_rate": 0.1}, "steps must be an integer >= 1"),
    ({"steps": 5}, "give one of learning_rate"),
    ({"steps": 5, "learning_rate": 0.1, "optimizer": optax.sgd(0.1)}, "give one of learning_rate"),
    ({"steps": 5, "learning_rate": 0.1, "batch_size": 4}, "drawn with a key"),
])
def test_bad_options_are_refused_before_any_step(kwargs, match):
    X = jnp.ones((10, 1))
    with pytest.raises(ValueError, match=match):
        train(lambda p, b, k: jnp.sum(p**2), jnp.ones(()), (X, X), **kwargs)


def test_the_module_examples_run():
    result = doctest.testmod(training, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 3 and result.failed == 0
