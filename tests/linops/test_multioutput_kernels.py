"""Multi-output kernels and their tiled Gram operators against dense numpy references.

The convention checked throughout: stacked outputs are example-major, row ``i * O + o`` is
output ``o`` of example ``i``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
from linops import kernels as K

from ._util import assert_close


@jax.jit
def _dense(kernel, X, Y=None):
    return kernel(X, Y)


_log_likelihood = jax.jit(K.gp_log_marginal_likelihood)


def _psd_matrix(rng, n_out, rank=None):
    W = rng.standard_normal((n_out, rank or n_out))
    return W @ W.T + 0.1 * np.eye(n_out)


def _example_major(blocks):
    """``blocks[o][p]`` is the (n, m) covariance of output o with output p; stack them example-major."""
    n_out = len(blocks)
    n, m = blocks[0][0].shape
    G = np.zeros((n * n_out, m * n_out))
    for i in range(n):
        for j in range(m):
            for o in range(n_out):
                for p in range(n_out):
                    G[i * n_out + o, j * n_out + p] = blocks[o][p][i, j]
    return G


def _independent_reference(tiles):
    n_out = len(tiles)
    zero = np.zeros_like(tiles[0])
    return _example_major([[tiles[o] if o == p else zero for p in range(n_out)] for o in range(n_out)])


def test_coregionalized_dense_gram_is_the_kronecker_product():
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((5, 2)), rng.standard_normal((3, 2))
    base, B = K.Matern52(jnp.array([0.7, 1.5]), 1.3), _psd_matrix(rng, 3)
    k = K.Coregionalized(base, B)
    assert k.num_outputs == 3
    Kxx, Kxy = np.asarray(_dense(base, X)), np.asarray(_dense(base, X, Y))
    assert_close(_dense(k, X), np.kron(Kxx, B), rtol=1e-12)
    assert_close(_dense(k, X, Y), np.kron(Kxy, B), rtol=1e-12)
    # The Kronecker order is the example-major one, written out entry by entry.
    assert_close(_dense(k, X, Y), _example_major([[B[o, p] * Kxy for p in range(3)] for o in range(3)]), rtol=1e-12)
    assert_close(k.diag(X), np.diag(np.kron(Kxx, B)), rtol=1e-12)


def test_independent_dense_gram_is_block_diagonal_per_output():
    rng = np.random.default_rng(1)
    X, Y = rng.standard_normal((4, 2)), rng.standard_normal((3, 2))
    base = K.RBF(0.8, 2.0) + K.Linear(0.3)  # a diagonal that varies along the examples
    shared = K.Independent(base, num_outputs=3)
    assert shared.num_outputs == 3 and shared.is_shared
    assert_close(_dense(shared, X), _independent_reference([np.asarray(_dense(base, X))] * 3), rtol=1e-12)
    assert_close(_dense(shared, X, Y), _independent_reference([np.asarray(_dense(base, X, Y))] * 3), rtol=1e-12)
    E = [np.outer(np.eye(3)[o], np.eye(3)[o]) for o in range(3)]
    assert_close(_dense(shared, X), sum(np.kron(np.asarray(_dense(base, X)), E[o]) for o in range(3)), rtol=1e-12)
    assert_close(shared.diag(X), np.repeat(np.diag(np.asarray(_dense(base, X))), 3), rtol=1e-12)

    parts = [K.Matern12(0.5), K.Linear(0.3, 0.1), K.Periodic(1.0, 2.0) + K.White(0.2)]
    per_output = K.Independent(parts)
    assert per_output.num_outputs == 3 and not per_output.is_shared
    ref = _independent_reference([np.asarray(_dense(p, X)) for p in parts])
    assert_close(_dense(per_output, X), ref, rtol=1e-12)
    by_kron = sum(np.kron(np.asarray(_dense(parts[o], X)), E[o]) for o in range(3))
    assert_close(_dense(per_output, X), by_kron, rtol=1e-12)
    cross = _independent_reference([np.asarray(_dense(p, X, Y)) for p in parts])
    assert_close(_dense(per_output, X, Y), cross, rtol=1e-12)
    assert_close(per_output.diag(X), np.diag(ref), rtol=1e-12)


def test_sums_of_coregionalized_kernels_are_the_linear_model_of_coregionalisation():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((6, 1))
    k1, k2 = K.RBF(0.5), K.Matern32(2.0, 0.7)
    B1, B2 = _psd_matrix(rng, 2, rank=1), _psd_matrix(rng, 2)
    noise = K.Independent([K.White(0.1), K.White(0.3)])
    lmc = 2.0 * (K.Coregionalized(k1, B1) + K.Coregionalized(k2, B2)) + noise
    assert lmc.num_outputs == 2
    ref = 2.0 * (np.kron(np.asarray(_dense(k1, X)), B1) + np.kron(np.asarray(_dense(k2, X)), B2)) + np.kron(np.eye(6),
                                                                                             np.diag([0.1, 0.3]))
    assert_close(_dense(lmc, X), ref, rtol=1e-12)
    assert_close(lmc.diag(X), np.diag(ref), rtol=1e-12)
    assert np.linalg.eigvalsh(np.asarray(_dense(lmc, X))).min() > 0


def _multi_output_kernels():
    rng = np.random.default_rng(3)
    return {
        "coregionalized": K.Coregionalized(K.Matern52(jnp.array([0.5, 2.0]), 1.3), _psd_matrix(rng, 3)),
        "independent_shared": K.Independent(K.RBF(0.7) + K.Linear(0.5) + K.White(0.2), num_outputs=3),
        "independent_list": K.Independent([K.RBF(0.7), K.Matern12(1.5) + K.White(0.1), K.Linear(0.5)]),
        "lmc": K.Coregionalized(K.RBF(0.3), _psd_matrix(rng, 3, rank=1))
        + 0.5 * K.Coregionalized(K.Periodic(1.0, 2.0), _psd_matrix(rng, 3))
        + K.Independent(K.White(0.05), num_outputs=3),
    }


@pytest.mark.parametrize("name", ["coregionalized", "independent_shared", "independent_list", "lmc"])
def test_multi_output_gram_operator_matches_the_dense_gram(name):
    k = _multi_output_kernels()[name]
    rng = np.random.default_rng(4)
    n, m, n_out = 7, 4, 3
    X, Y = rng.standard_normal((n, 2)), rng.standard_normal((m, 2))
    G = K.KernelGramOp(k, X, block_size=3)  # blocks of 3, 3 and a padded 1
    dense = np.asarray(_dense(k, X))
    assert G.shape == (n * n_out, n * n_out) and {"psd", "symmetric"} <= set(G.tags)
    P = rng.standard_normal((n * n_out, 16))
    GP = np.asarray(G @ P)
    assert_close(GP, dense @ P, rtol=1e-12)
    assert np.min(np.einsum("ik,ik->k", P, GP)) >= -1e-10 * np.abs(dense).max()  # PSD on probes
    assert_close(G @ P[:, 0], dense @ P[:, 0], rtol=1e-12)
    Gd = np.asarray(G.as_matrix())
    assert_close(Gd, dense, rtol=1e-12)
    assert np.linalg.eigvalsh(Gd).min() >= -1e-10 * np.abs(dense).max()
    assert_close(lo.diag(G), np.diag(dense), rtol=1e-12)

    C = K.KernelGramOp(k, X, Y, block_size=3)  # cross-covariance: no white noise, not square
    cross = np.asarray(_dense(k, X, Y))
    assert C.shape == (n * n_out, m * n_out) and C.T.shape == (m * n_out, n * n_out) and "symmetric" not in C.tags
    assert_close(C @ P[: m * n_out, :2], cross @ P[: m * n_out, :2], rtol=1e-12)
    assert_close(C.as_matrix(), cross, rtol=1e-12)
    assert_close(C.rmv(P[:, 0]), cross.T @ P[:, 0], rtol=1e-12)
    assert_close(C.T @ P[:, :2], cross.T @ P[:, :2], rtol=1e-12)


def test_the_default_block_size_accounts_for_the_outputs():
    X = jnp.zeros((3000, 2))
    assert K.KernelGramOp(K.RBF(), X).block_size == (1 << 22) // (3000 * 2)
    assert K.KernelGramOp(K.Independent(K.RBF(), num_outputs=4), X).block_size == (1 << 22) // (3000 * 2 * 4)


def test_one_output_kernels_are_unchanged():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((5, 2))
    k = K.Matern32(0.9)
    assert k.num_outputs == 1 and (k + K.White(0.1)).num_outputs == 1 and (2.0 * k).num_outputs == 1
    assert_close(K.Independent(k, num_outputs=1)(X), k(X), rtol=0, atol=0)
    assert_close(K.Coregionalized(k, jnp.array([[2.0]]))(X), 2.0 * np.asarray(k(X)), rtol=1e-14)


def _gp_data(rng, n, n_out):
    X = rng.uniform(-2, 2, (n, 1))
    f = np.sin(2 * X[:, 0])
    y = np.stack([f, -f + 0.3 * X[:, 0], 0.5 * f][:n_out], axis=1) + 0.1 * rng.standard_normal((n, n_out))
    return X, y


def test_multi_output_gp_log_likelihood_is_the_gaussian_log_density():
    from scipy.stats import multivariate_normal

    rng = np.random.default_rng(6)
    X, y = _gp_data(rng, 8, 3)
    k = K.Coregionalized(K.Matern32(0.8, 1.5), _psd_matrix(rng, 3)) + K.Independent(K.Linear(0.2), num_outputs=3)
    Kd = np.asarray(_dense(k, X))
    ref = multivariate_normal(np.zeros(24), Kd + 0.3 * np.eye(24)).logpdf(y.reshape(-1))
    assert_close(_log_likelihood(k, X, y, 0.3), ref, rtol=1e-10)
    noise = np.array([0.1, 0.2, 0.4])  # one variance per output, repeated example-major
    ref = multivariate_normal(np.zeros(24), Kd + np.diag(np.tile(noise, 8))).logpdf(y.reshape(-1))
    assert_close(_log_likelihood(k, X, y, noise), ref, rtol=1e-10)
    # Output-major flattening is a different (wrong) likelihood: the order matters and is checked.
    wrong = multivariate_normal(np.zeros(24), Kd + 0.3 * np.eye(24)).logpdf(y.T.reshape(-1))
    assert abs(float(_log_likelihood(k, X, y, 0.3)) - wrong) > 1e-3


def test_gradients_with_respect_to_the_output_covariance_and_lengthscale_are_right():
    rng = np.random.default_rng(7)
    X, y = _gp_data(rng, 6, 2)
    B0 = jnp.asarray(_psd_matrix(rng, 2))

    @jax.jit
    def nll(ell, B):
        return -_log_likelihood(K.Coregionalized(K.RBF(ell), B), X, y, 0.1)

    g_ell, g_B = jax.grad(nll, argnums=(0, 1))(0.9, B0)
    assert np.all(np.isfinite(g_ell)) and np.all(np.isfinite(np.asarray(g_B)))
    h = 1e-6
    assert_close(g_ell, (nll(0.9 + h, B0) - nll(0.9 - h, B0)) / (2 * h), rtol=1e-5)
    D = jnp.array([[0.0, 1.0], [1.0, 0.0]])  # a symmetric direction
    assert_close(jnp.sum(g_B * D), (nll(0.9, B0 + h * D) - nll(0.9, B0 - h * D)) / (2 * h), rtol=1e-5)

    # Through the tiled operator too, with B traced under jit.
    V = jnp.asarray(rng.standard_normal(6 * 2))

    @jax.jit
    def quad(B):
        return V @ (K.KernelGramOp(K.Coregionalized(K.Matern32(0.7), B), X, block_size=4) @ V)

    g = jax.grad(quad)(B0)
    assert_close(jnp.sum(g * D), (quad(B0 + h * D) - quad(B0 - h * D)) / (2 * h), rtol=1e-5)


def test_fit_gp_fits_the_output_covariance_and_keeps_it_psd():
    rng = np.random.default_rng(8)
    X, y = _gp_data(rng, 25, 2)  # the second output is about minus the first
    k0 = K.Coregionalized(K.RBF(1.0), jnp.eye(2))
    fit = K.fit_gp(k0, X, y, noise_variance=jnp.array([0.1, 0.1]), num_steps=150, learning_rate=0.05)
    B = np.asarray(fit.kernel.output_covariance)
    assert fit.noise_variance.shape == (2,)
    assert_close(B, B.T, rtol=0, atol=0)
    assert np.linalg.eigvalsh(B).min() >= 0
    assert B[0, 1] / np.sqrt(B[0, 0] * B[1, 1]) < -0.5  # it learned the negative correlation
    best = float(_log_likelihood(fit.kernel, X, y, fit.noise_variance))
    assert best > float(fit.log_marginal_likelihood[0]) + 5
    # Dropping the learned correlation (keeping the fitted variances) costs likelihood.
    uncorrelated = K.Coregionalized(fit.kernel.kernel, jnp.diag(jnp.diag(fit.kernel.output_covariance)))
    assert best > float(_log_likelihood(uncorrelated, X, y, fit.noise_variance)) + 5


def test_bad_multi_output_input_is_refused_with_a_clear_error():
    co = K.Coregionalized(K.RBF(), jnp.eye(3))
    with pytest.raises(ValueError, match="Independent: the shared kernel must be a single-output kernel, got "
                                         "Coregionalized with 3 outputs"):
        K.Independent(co, num_outputs=2)
    with pytest.raises(ValueError, match="Independent: kernel 1 must be a single-output kernel, got Coregionalized"):
        K.Independent([K.RBF(), co])
    with pytest.raises(ValueError, match="Independent: expected at least one kernel .* got an empty list"):
        K.Independent([])
    with pytest.raises(ValueError, match="Independent: num_outputs must be a positive integer, got 0"):
        K.Independent(K.RBF(), num_outputs=0)
    with pytest.raises(ValueError, match="Independent: one kernel needs num_outputs=O"):
        K.Independent(K.RBF())
    with pytest.raises(ValueError, match="Independent: give one kernel with num_outputs, or a list .* got 2 kernels "
                                         "and num_outputs=2"):
        K.Independent([K.RBF(), K.RBF()], num_outputs=2)
    with pytest.raises(TypeError, match="Independent: kernel 0 must be a linops.kernels.Kernel, got int"):
        K.Independent([1])

    with pytest.raises(ValueError, match=r"Coregionalized: output_covariance must be a square \(O, O\) matrix .* "
                                         r"got shape \(2, 3\)"):
        K.Coregionalized(K.RBF(), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="Coregionalized: output_covariance must be symmetric"):
        K.Coregionalized(K.RBF(), jnp.array([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="Coregionalized: output_covariance must be positive semi-definite, got "
                                         "the eigenvalue -1"):
        K.Coregionalized(K.RBF(), jnp.array([[1.0, 2.0], [2.0, 1.0]]))
    K.Coregionalized(K.RBF(), jnp.array([[1.0, 1.0], [1.0, 1.0 - 1e-12]]))  # rounding-level: accepted
    with pytest.raises(ValueError, match="Coregionalized: kernel must be a single-output kernel, got Independent"):
        K.Coregionalized(K.Independent(K.RBF(), num_outputs=2), jnp.eye(2))

    with pytest.raises(ValueError, match=r"SumKernel: cannot add a kernel with 1 output to a kernel with 3 outputs; .*"
                                         r"Independent\(k, num_outputs=3\)"):
        K.RBF() + co
    with pytest.raises(ValueError, match="SumKernel: cannot add a kernel with 2 outputs to a kernel with 3 outputs"):
        K.Independent(K.RBF(), num_outputs=2) + co
    with pytest.raises(ValueError, match="ProductKernel: only single-output kernels multiply, got kernels with "
                                         "3 outputs and 1 output"):
        co * K.RBF()
    assert (3.0 * co).num_outputs == 3  # scaling is fine

    X = jnp.zeros((4, 1))
    with pytest.raises(ValueError, match=r"gp_log_marginal_likelihood: y must have shape \(4, 3\) \(examples x "
                                         r"outputs\) for a kernel with 3 outputs and 4 inputs, got \(12,\)"):
        K.gp_log_marginal_likelihood(co, X, jnp.zeros(12), 0.1)
    with pytest.raises(ValueError, match=r"fit_gp: y must have shape \(4,\) for a kernel with 1 output .* got "
                                         r"\(4, 1\)"):
        K.fit_gp(K.RBF(), X, jnp.zeros((4, 1)))
    with pytest.raises(ValueError, match=r"noise_variance must be a scalar or one variance per output, shape \(3,\), "
                                         r"got shape \(2,\)"):
        K.gp_log_marginal_likelihood(co, X, jnp.zeros((4, 3)), jnp.ones(2))
