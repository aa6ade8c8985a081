"""Curvatures other than the GGN: the empirical Fisher and a Monte-Carlo Fisher (as likelihoods, through every
GGN rule) and the Hessian (`lo.HessianOp`), against their dense definitions from per-example autodiff."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
from linops.likelihoods import (
    Bernoulli,
    Categorical,
    EmpiricalFisher,
    Gaussian,
    HeteroscedasticGaussian,
    MonteCarloFisher,
)
from linops.models import from_equinox, ravel
from tests import _draws as draws

from ._util import assert_close


def _mlp(outputs=3):
    model = eqx.nn.MLP(3, outputs, 5, 1, activation=jnp.tanh, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(1), (11, 3), jnp.float64)
    return fn, params, X


def _cnn():
    model = eqx.nn.Sequential([eqx.nn.Conv2d(1, 2, 3, key=jax.random.key(0), dtype=jnp.float64),
                               eqx.nn.Lambda(jnp.tanh), eqx.nn.Lambda(jnp.ravel),
                               eqx.nn.Linear(2 * 3 * 3, 3, key=jax.random.key(1), dtype=jnp.float64)])
    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(2), (7, 1, 5, 5), jnp.float64)
    return fn, params, X


_TARGETS = {
    "categorical": (Categorical(), lambda n, o: jnp.arange(n) % o),
    "gaussian": (Gaussian(0.7), lambda n, o: draws.normal(jax.random.key(5), (n, o), jnp.float64)),
    "bernoulli": (Bernoulli(), lambda n, o: (jnp.arange(n * o).reshape(n, o) % 2).astype(jnp.float64)),
}


def _per_example_grads(fn, params, X, Y, lik):
    flat, unravel = ravel(params)
    return jax.vmap(jax.grad(lambda th, x, y: lik.nll(fn(unravel(th), x), y)), in_axes=(None, 0, 0))(flat, X, Y)


def _dense_mc_fisher(fn, params, X, targets, mc):
    """$\\sum_n \\frac1S \\sum_s \\nabla\\ell(\\hat y_{ns}) \\nabla\\ell(\\hat y_{ns})^\\top$, the draws from each
    example's key."""
    Y, keys = targets
    flat, unravel = ravel(params)
    M = 0.0
    for n in range(X.shape[0]):
        f = fn(params, X[n])
        draws = mc.base.sample(jax.random.wrap_key_data(keys[n]), f, mc.num_samples)
        g = jax.vmap(jax.grad(lambda th, y, x=X[n]: mc.base.nll(fn(unravel(th), x), y)), in_axes=(None, 0))(flat, draws)
        M = M + g.T @ g / mc.num_samples
    return M


@pytest.mark.parametrize(("model", "name"), [("mlp", "gaussian"), ("cnn", "categorical"),
                                             pytest.param("cnn", "bernoulli", marks=pytest.mark.slow)])
def test_empirical_fisher_is_the_outer_product_of_the_per_example_gradients(name, model):
    fn, params, X = _mlp() if model == "mlp" else _cnn()
    lik, targets = _TARGETS[name]
    Y = targets(X.shape[0], 3)
    g = _per_example_grads(fn, params, X, Y, lik)
    EF = g.T @ g
    G = lo.GGNOp(fn, params, X, Y, EmpiricalFisher(lik), batch_size=4)  # batches 4 + 4 + 3 (+ 0)
    assert_close(G.as_matrix(), EF, rtol=1e-10)
    assert_close(lo.diag(G), jnp.diag(EF), rtol=1e-10)  # the per-layer rules (dense, convolution)
    v = draws.normal(jax.random.key(3), (EF.shape[0],), jnp.float64)
    assert_close(G @ v, EF @ v, rtol=1e-10)


@pytest.mark.parametrize("name", ["categorical", pytest.param("gaussian", marks=pytest.mark.slow)])
def test_monte_carlo_fisher_is_the_average_outer_product_at_the_drawn_targets(name):
    fn, params, X = _cnn()
    lik, targets = _TARGETS[name]
    mc = MonteCarloFisher(lik, num_samples=3)
    T = mc.with_keys(targets(X.shape[0], 3), jax.random.key(4))
    F = _dense_mc_fisher(fn, params, X, T, mc)
    G = lo.GGNOp(fn, params, X, T, mc, batch_size=3)
    assert_close(G.as_matrix(), F, rtol=1e-10)
    assert_close(lo.diag(G), jnp.diag(F), rtol=1e-10)
    v = draws.normal(jax.random.key(3), (F.shape[0],), jnp.float64)
    assert_close(G @ v, F @ v, rtol=1e-10)
    # the draws belong to the examples, not to the batches: another batch size gives the same matrix
    assert_close(lo.GGNOp(fn, params, X, T, mc, batch_size=5).as_matrix(), F, rtol=1e-10)


@pytest.mark.parametrize("name", sorted(_TARGETS))
def test_monte_carlo_fisher_averages_to_the_ggn(name):
    """E[g g^T] over targets drawn from the model is the output Hessian for these likelihoods: the MC Fisher of
    many draws is the GGN (Monte-Carlo error ~ 1/sqrt(S); 20,000 draws, 3% of the largest entry)."""
    fn, params, X = _mlp()
    lik, targets = _TARGETS[name]
    Y = targets(X.shape[0], 3)
    mc = MonteCarloFisher(lik, num_samples=20_000)
    F = lo.GGNOp(fn, params, X, mc.with_keys(Y, jax.random.key(7)), mc).as_matrix()
    G = lo.GGNOp(fn, params, X, Y, lik).as_matrix()
    assert float(jnp.max(jnp.abs(F - G))) < 0.03 * float(jnp.max(jnp.abs(G)))
    # ... and the empirical Fisher is not (the check can fail)
    EF = lo.GGNOp(fn, params, X, Y, EmpiricalFisher(lik)).as_matrix()
    assert float(jnp.max(jnp.abs(EF - G))) > 0.1 * float(jnp.max(jnp.abs(G)))


def test_kfac_of_the_fishers_has_the_factors_of_their_output_gradients():
    """One dense layer: KFAC's factors are A = sum x x^T / N and B = sum_n of the rows' outer products, the rows
    being the empirical gradient or the drawn ones (by hand)."""
    model = eqx.nn.Linear(4, 3, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(1), (9, 4), jnp.float64)
    Y = jnp.arange(9) % 3
    out = jax.vmap(fn, in_axes=(None, 0))(params, X)
    r = jax.vmap(Categorical().grad)(out, Y)
    K = lo.kfac(fn, params, X, Y, EmpiricalFisher(Categorical()), batch_size=4)
    assert_close(K.factors[0][0], r.T @ r, rtol=1e-12)
    assert_close(K.factors[0][1], X.T @ X / 9, rtol=1e-12)
    mc = MonteCarloFisher(Categorical(), num_samples=2)
    T = mc.with_keys(Y, jax.random.key(2))
    rows = jax.vmap(mc.hessian_factor)(out, T).reshape(-1, 3)
    K = lo.kfac(fn, params, X, T, mc, batch_size=4)
    assert_close(K.factors[0][0], rows.T @ rows, rtol=1e-12)
    assert_close(K.bias_blocks[0], rows.T @ rows, rtol=1e-12)


@pytest.mark.parametrize("name", sorted(_TARGETS))
def test_samples_follow_the_likelihood(name):
    lik, _ = _TARGETS[name]
    f = jnp.array([0.3, -1.0, 0.5], jnp.float64)
    draws = lik.sample(jax.random.key(0), f, 40_000)
    if name == "categorical":
        freq = jnp.bincount(draws, length=3) / draws.shape[0]
        assert_close(freq, jax.nn.softmax(f), atol=0.01)
    elif name == "bernoulli":
        assert_close(jnp.mean(draws, axis=0), jax.nn.sigmoid(f), atol=0.01)
    else:
        assert_close(jnp.mean(draws, axis=0), f, atol=0.02)
        assert_close(jnp.std(draws, axis=0), jnp.full(3, 0.7), atol=0.01)


def test_hessian_op_is_the_hessian_of_the_summed_loss():
    fn, params, X = _mlp()
    sigma = 0.5 + jnp.arange(11.0) / 10  # a per-example likelihood travels with its batches
    lik = Gaussian(sigma, heteroscedastic=True)
    Y = draws.normal(jax.random.key(5), (11, 3), jnp.float64)
    flat, unravel = ravel(params)
    total = lambda th: jnp.sum(jax.vmap(lambda x, y, s: Gaussian(s).nll(fn(unravel(th), x), y))(X, Y, sigma))  # noqa: E731
    H = jax.hessian(total)(flat)
    op = lo.HessianOp(fn, params, X, Y, lik, batch_size=4)
    assert_close(op.as_matrix(), H, rtol=1e-10)
    V = draws.normal(jax.random.key(3), (H.shape[0], 2), jnp.float64)
    assert_close(op @ V, H @ V, rtol=1e-10)
    assert_close(lo.diag(op, method="exact"), jnp.diag(H), rtol=1e-10)
    assert "psd" not in op.tags and "symmetric" in op.tags
    assert float(jnp.linalg.eigvalsh(H).min()) < 0  # the network's own curvature: indefinite here
    with pytest.raises(ValueError, match="method='exact'"):  # no closed diagonal, and it says what to use
        lo.diag(op)


def test_hessian_of_a_linear_model_with_a_canonical_link_is_the_ggn():
    """Logistic regression: the network is linear, so H = GGN exactly (an identity, not a tolerance)."""
    model = eqx.nn.Linear(4, 3, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(1), (9, 4), jnp.float64)
    Y = jnp.arange(9) % 3
    assert_close(lo.HessianOp(fn, params, X, Y, Categorical()).as_matrix(),
                 lo.GGNOp(fn, params, X, Y, Categorical()).as_matrix(), rtol=1e-12)


def test_curvature_likelihoods_refuse_what_they_cannot_use():
    with pytest.raises(TypeError, match="EmpiricalFisher: base must be a likelihood"):
        EmpiricalFisher(EmpiricalFisher(Categorical()))
    with pytest.raises(ValueError, match="num_samples must be a positive integer"):
        MonteCarloFisher(Categorical(), 0)
    fn, params, X = _mlp()
    mc = MonteCarloFisher(Categorical())
    with pytest.raises(ValueError, match="needs targets \\(Y, keys\\)"):
        lo.GGNOp(fn, params, X, jnp.arange(11) % 3, mc)
    with pytest.raises(ValueError, match="keys must be raw key data of shape \\(11, k\\)"):
        lo.GGNOp(fn, params, X, (jnp.arange(11) % 3, jnp.zeros((11, 2))), mc)
    with pytest.raises(ValueError, match="disagree on the number of examples: \\[10, 11\\]"):
        lo.GGNOp(fn, params, X, (jnp.arange(11) % 3, jnp.zeros((10, 2), jnp.uint32)), mc)
    with pytest.raises(ValueError, match="labels must lie in"):  # the base likelihood's checks
        lo.GGNOp(fn, params, X, mc.with_keys(jnp.arange(11), jax.random.key(0)), mc)


def test_factor_rows_size_the_blocks():
    """A 1,000-output head: the empirical Fisher's factor has one row, not 1,000 (the diagonal takes its rows in
    blocks sized by them)."""
    model = eqx.nn.Linear(3, 1000, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(1), (5, 3), jnp.float64)
    Y = jnp.arange(5)
    assert EmpiricalFisher(Categorical()).factor_rows(1000) == 1
    assert MonteCarloFisher(Categorical(), 4).factor_rows(1000) == 4
    g = _per_example_grads(fn, params, X, Y, Categorical())
    G = lo.GGNOp(fn, params, X, Y, EmpiricalFisher(Categorical()))
    assert_close(G._diag_by_gradients(), jnp.sum(g**2, axis=0), rtol=1e-10)
    assert np.asarray(lo.diag(G)).shape == (4000,)


def test_heteroscedastic_gaussian_gradient_fisher_and_samples():
    """Its gradient is the autodiff gradient of its nll; its output curvature diag(e^-s, 1/2) is the Fisher,
    E[g g^T] over targets drawn from it (200,000 draws, within 2%), where the Hessian of the nll is not PSD."""
    lik = HeteroscedasticGaussian()
    f = jnp.array([0.3, -1.0, jnp.log(0.5), jnp.log(2.0)], jnp.float64)
    y = jnp.array([1.0, 0.0], jnp.float64)
    assert_close(lik.grad(f, y), jax.grad(lik.nll)(f, y), rtol=1e-12)
    assert_close(lik.nll(f, y), -jnp.sum(jax.scipy.stats.norm.logpdf(y, f[:2], jnp.exp(f[2:] / 2))), rtol=1e-12)
    A = lik.hessian_factor(f, y)
    assert_close(A.T @ A, lik.hessian(f, y).as_matrix(), rtol=1e-12)
    assert_close(lik.hvp(f, y, jnp.ones(4)), jnp.diag(A.T @ A), rtol=1e-12)
    draws = lik.sample(jax.random.key(0), f, 200_000)
    g = jax.vmap(lik.grad, in_axes=(None, 0))(f, draws)
    assert_close(g.T @ g / draws.shape[0], jnp.diag(jnp.array([2.0, 0.5, 0.5, 0.5])), atol=0.02)
    assert float(jnp.linalg.eigvalsh(jax.hessian(lik.nll)(f, jnp.array([3.0, 3.0]))).min()) < 0
    with pytest.raises(ValueError, match="needs a model with 2 O outputs"):
        lik.check(3, jnp.zeros((4, 1)), 4, "GGNOp")
    with pytest.raises(ValueError, match="needs targets of shape \\(4, 2\\)"):
        lik.check(4, jnp.zeros((4, 4)), 4, "GGNOp")


def test_ggn_rows_stack_the_factor_rows_and_give_the_ggn():
    """`GGNOp.rows()`: R with R^T R = G, K rows per example in order (a per-example likelihood and a short last
    batch; the empirical Fisher's single row per example is its loss gradient)."""
    fn, params, X = _mlp()
    lik = Gaussian(0.5 + jnp.arange(11.0) / 10, heteroscedastic=True)
    Y = draws.normal(jax.random.key(5), (11, 3), jnp.float64)
    G = lo.GGNOp(fn, params, X, Y, lik, batch_size=4)
    R = G.rows()
    assert R.shape == (33, G.shape[0])
    assert_close(R.T @ R, G.as_matrix(), rtol=1e-10)
    J = lo.JacobianOp(fn, params, X).as_matrix()  # rows n * O + o
    assert_close(R, J / jnp.repeat(lik.sigma, 3)[:, None], rtol=1e-10)
    Yc = jnp.arange(11) % 3
    g = _per_example_grads(fn, params, X, Yc, Categorical())
    assert_close(lo.GGNOp(fn, params, X, Yc, EmpiricalFisher(Categorical()), batch_size=4).rows(), g, rtol=1e-10)
