"""Kernels against their textbook formulas, and KernelGramOp's tiles against the dense Gram."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import linops as lo
from linops import kernels as K
from linops.testing import assert_symmetric
from tests import _draws as draws

from ._util import assert_close


def _dist(X, Y, ell):
    D = (X[:, None, :] - Y[None, :, :]) / ell
    return np.sqrt(np.sum(D**2, axis=-1))


def _reference(name, X, Y, ell, var):
    """The formulas written out in numpy, one pair at a time where it is clearer."""
    r = _dist(X, Y, ell)
    if name == "RBF":
        return var * np.exp(-0.5 * r**2)
    if name == "Matern12":
        return var * np.exp(-r)
    if name == "Matern32":
        return var * (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r)
    if name == "Matern52":
        return var * (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r)
    if name == "RationalQuadratic":  # alpha = 0.7 below
        return var * (1 + r**2 / (2 * 0.7)) ** -0.7
    raise AssertionError(name)


def _make(name, ell, var):
    if name == "RationalQuadratic":
        return K.RationalQuadratic(ell, var, alpha=0.7)
    return getattr(K, name)(ell, var)


STATIONARY = ["RBF", "Matern12", "Matern32", "Matern52", "RationalQuadratic"]


@pytest.mark.parametrize("name", STATIONARY)
@given(seed=st.integers(0, 2**16), ell=st.floats(0.1, 5.0), var=st.floats(0.1, 5.0), ard=st.booleans())
def test_stationary_kernels_match_their_formulas_and_are_psd(name, seed, ell, var, ard):
    rng = np.random.default_rng(seed)
    X, Y = rng.standard_normal((6, 3)), rng.standard_normal((4, 3))
    ell_arg = ell * np.array([1.0, 0.5, 2.0]) if ard else ell
    k = _make(name, ell_arg, var)
    assert_close(k(X, Y), _reference(name, X, Y, ell_arg, var), rtol=1e-9, atol=1e-12)
    G = np.asarray(k(X))
    assert_close(G, _reference(name, X, X, ell_arg, var), rtol=1e-9, atol=1e-12)
    assert np.linalg.eigvalsh(G).min() >= -1e-10 * np.abs(G).max()
    assert_close(k.diag(X), np.diag(G), rtol=1e-12)


def test_periodic_linear_and_white_match_their_formulas():
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((5, 2)), rng.standard_normal((3, 2))
    ell, p, var = 0.8, 1.7, 2.0
    S = np.sin(np.pi * np.abs(X[:, None, :] - Y[None, :, :]) / p) / ell
    assert_close(K.Periodic(ell, p, var)(X, Y), var * np.exp(-2 * np.sum(S**2, -1)), rtol=1e-12)
    # Periodic: exactly the variance one period away, in every direction.
    assert_close(K.Periodic(ell, p, var)(X, X + p), np.full((5, 5), var) * np.exp(
        -2 * np.sum((np.sin(np.pi * np.abs(X[:, None] - X[None]) / p) / ell) ** 2, -1)), rtol=1e-9)
    assert_close(K.Linear(2.0, 0.5)(X, Y), 2.0 * X @ Y.T + 0.5, rtol=1e-12)
    assert_close(K.Linear(2.0, 0.5).diag(X), 2.0 * np.sum(X**2, 1) + 0.5, rtol=1e-12)
    assert_close(K.White(0.3)(X), 0.3 * np.eye(5))
    assert_close(K.White(0.3)(X, X), np.zeros((5, 5)))  # a cross-covariance shares no noise


def test_sums_products_and_scalings_combine_elementwise():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((7, 2))
    a, b = K.RBF(0.7, 1.5), K.Periodic(1.0, 2.0)
    k = 2.0 * (a * b) + K.Linear(0.3) + K.White(0.1)
    ref = 2.0 * np.asarray(a(X)) * np.asarray(b(X)) + 0.3 * X @ X.T + 0.1 * np.eye(7)
    assert_close(k(X), ref, rtol=1e-12)
    assert_close(k.diag(X), np.diag(ref), rtol=1e-12)
    with pytest.raises(TypeError):
        _ = a + 1.0  # adding a number is ambiguous (a bias is Linear(bias=...)): refused


@pytest.mark.parametrize("block_size", [1, 3, 7, 50])
def test_tiled_gram_equals_the_dense_gram(block_size):
    rng = np.random.default_rng(2)
    X, Y = rng.standard_normal((10, 2)), rng.standard_normal((4, 2))
    k = K.Matern52(jnp.array([0.5, 2.0]), 1.3) + K.White(0.2)
    G = K.KernelGramOp(k, X, block_size=block_size)
    dense = np.asarray(k(X))
    V = rng.standard_normal((10, 3))
    assert_close(G @ V, dense @ V, rtol=1e-12)
    assert_close(G @ V[:, 0], dense @ V[:, 0], rtol=1e-12)
    assert_close(G.as_matrix(), dense, rtol=1e-12)
    assert_close(lo.diag(G), np.diag(dense), rtol=1e-12)  # exact, without the Gram
    assert "psd" in G.tags and "symmetric" in G.tags
    assert_symmetric(G)
    C = K.KernelGramOp(k, X, Y, block_size=block_size)  # cross-covariance: no white noise
    cross = np.asarray(k(X, Y))
    assert C.shape == (10, 4) and "symmetric" not in C.tags
    assert_close(C.as_matrix(), cross, rtol=1e-12)
    U = rng.standard_normal((10, 2))
    assert_close(C.T @ U, cross.T @ U, rtol=1e-12)
    assert_close(C.rmv(U[:, 0]), cross.T @ U[:, 0], rtol=1e-12)


def test_hyperparameters_are_differentiable_leaves():
    X = jnp.asarray(np.random.default_rng(3).standard_normal((6, 1)))
    v = jnp.ones(6)

    def quad(ell):
        return v @ (K.KernelGramOp(K.Matern32(ell, 1.0) + K.White(0.1), X, block_size=4) @ v)

    grad = jax.grad(quad)(0.7)
    h = 1e-6
    assert_close(grad, (quad(0.7 + h) - quad(0.7 - h)) / (2 * h), rtol=1e-6)
    # Matérn at coincident points: finite gradients (the distance's sqrt is guarded).
    g = jax.grad(lambda ell: jnp.sum(K.Matern12(ell)(X)))(1.0)
    assert np.isfinite(float(g))


def test_bad_input_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="RBF: lengthscale must be positive"):
        K.RBF(lengthscale=0.0)
    with pytest.raises(ValueError, match="Periodic: period must be positive"):
        K.Periodic(period=-1.0)
    with pytest.raises(ValueError, match="Linear: bias must be non-negative"):
        K.Linear(bias=-1.0)
    X = jnp.ones((4, 2))
    with pytest.raises(ValueError, match="KernelGramOp: X has 2 input dimensions but X2 has 3"):
        K.KernelGramOp(K.RBF(), X, jnp.ones((3, 3)))
    with pytest.raises(ValueError, match="RBF: 3 lengthscales for inputs of dimension 2"):
        K.KernelGramOp(K.RBF(jnp.ones(3)), X)
    with pytest.raises(ValueError, match=r"inputs must be 2-D \(n, d\), got shape \(4,\)"):
        K.KernelGramOp(K.RBF(), jnp.ones(4))
    with pytest.raises(TypeError, match="kernel must be a linops.kernels.Kernel"):
        K.KernelGramOp(lambda x, y: x @ y, X)
    with pytest.raises(lo.memory.MemoryBudgetError, match="KernelGramOp"):
        K.KernelGramOp(K.RBF(), jnp.ones((10**6, 1)), block_size=100).as_matrix()


def test_gp_log_marginal_likelihood_is_the_gaussian_log_density():
    from scipy.stats import multivariate_normal

    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((9, 2)), rng.standard_normal(9)
    k = K.Matern32(0.8, 1.5) + K.Linear(0.2)
    ref = multivariate_normal(np.zeros(9), np.asarray(k(X)) + 0.3 * np.eye(9)).logpdf(y)
    assert_close(K.gp_log_marginal_likelihood(k, X, y, 0.3), ref, rtol=1e-10)


def test_fit_gp_ends_at_a_local_maximum_of_the_exact_likelihood():
    rng = np.random.default_rng(6)
    X = jnp.asarray(rng.uniform(-3, 3, (60, 1)))
    y = jnp.sin(2 * X[:, 0]) + 0.1 * jnp.asarray(rng.standard_normal(60))
    fit = K.fit_gp(K.RBF(2.0, 1.0) + K.Linear(1.0, bias=0.0), X, y, noise_variance=0.5, num_steps=400,
                   learning_rate=0.05)
    assert fit.num_points == 60 and fit.log_marginal_likelihood.shape == (400,)
    best = float(K.gp_log_marginal_likelihood(fit.kernel, X, y, fit.noise_variance))
    assert best > float(fit.log_marginal_likelihood[0]) + 10
    assert float(fit.kernel.right.bias) == 0.0  # a zero hyperparameter stays fixed
    # Perturbing any hyperparameter by +-10% does not raise the likelihood by more than 0.01 (the
    # linear part's variance sits on a nearly flat ridge that Adam is still descending slowly).
    leaves, treedef = jax.tree_util.tree_flatten((fit.kernel, fit.noise_variance))
    for i, leaf in enumerate(leaves):
        if float(leaf) == 0.0:
            continue
        for f in (0.9, 1.1):
            moved = jax.tree_util.tree_unflatten(treedef, [a * f if j == i else a for j, a in enumerate(leaves)])
            assert float(K.gp_log_marginal_likelihood(moved[0], X, y, moved[1])) < best + 1e-2


def test_fit_gp_on_a_subset_needs_a_key_and_uses_that_many_points():
    X, y = jnp.linspace(0, 1, 30)[:, None], jnp.zeros(30)
    with pytest.raises(ValueError, match="a subset of 10 of the 30 points needs a PRNG key"):
        K.fit_gp(K.RBF(), X, y, max_points=10)
    fit = K.fit_gp(K.RBF(), X, y, max_points=10, key=jax.random.key(0), num_steps=5)
    assert fit.num_points == 10
    with pytest.raises(ValueError, match=r"y must have shape \(30,\)"):
        K.fit_gp(K.RBF(), X, jnp.zeros(29))


@pytest.mark.parametrize("name", STATIONARY)
def test_many_input_dimensions_use_the_expansion_and_stay_exact_on_the_diagonal(name):
    """d > 8: distances by one matrix product; the symmetric Gram's diagonal stays exact (Matérn's
    square root would turn a rounding-size r^2 into sqrt(eps))."""
    rng = np.random.default_rng(3)
    X, Y = 3.0 + rng.standard_normal((7, 12)), 3.0 + rng.standard_normal((5, 12))  # off-centre inputs
    ell = np.linspace(0.5, 2.0, 12)
    k = _make(name, ell, 1.7)
    assert_close(k(X, Y), _reference(name, X, Y, ell, 1.7), rtol=1e-9, atol=1e-12)
    G = jax.jit(lambda k, X: k(X))(k, X)
    assert_close(G, _reference(name, X, X, ell, 1.7), rtol=1e-9, atol=1e-12)
    assert bool(jnp.all(jnp.diag(G) == 1.7))
    Kop = K.KernelGramOp(k, X, block_size=3)
    assert_close(Kop.as_matrix(), _reference(name, X, X, ell, 1.7), rtol=1e-9, atol=1e-12)


def test_gram_product_gradients_do_not_keep_every_tile():
    """Reverse mode through a tiled product recomputes tiles: its temporary memory grows with n
    (one block of rows at a time), not n^2 (measured: 5.6 MB at n = 2,000 and 22 MB at 8,000;
    84 MB and 1.3 GB without the checkpoint)."""

    def grad_temp_bytes(n):
        X = draws.normal(jax.random.key(0), (n, 2), jnp.float32)
        loss = lambda ell: jnp.sum(K.KernelGramOp(K.RBF(ell), X, block_size=100) @ jnp.ones(n, jnp.float32))  # noqa: E731
        return jax.jit(jax.grad(loss)).lower(jnp.float32(1.0)).compile().memory_analysis().temp_size_in_bytes

    small, large = grad_temp_bytes(2000), grad_temp_bytes(8000)
    assert large < 0.1 * 8000**2 * 4, large
    assert large < 6 * small, (small, large)  # 4x the points: about 4x the memory
