"""Lanczos against eigh on matrices with prescribed spectra, and its low-rank operators."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo

from ._util import assert_close


def _prescribed(spectrum, seed=0):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((len(spectrum), len(spectrum))))
    return Q @ np.diag(spectrum) @ Q.T, Q


def test_full_lanczos_recovers_the_spectrum_with_an_orthonormal_basis():
    spectrum = np.array([10.0, 7.0, 3.0, 1.0, 0.3, 0.1, -0.5, -2.0])
    M, _ = _prescribed(spectrum)
    run = lo.lanczos(lo.Dense(jnp.asarray(M), tags={"symmetric"}), 8, key=jax.random.key(0))
    assert int(run.steps) == 8
    assert_close(run.Q.T @ run.Q, np.eye(8), atol=1e-12)  # full reorthogonalisation
    assert_close(run.Q.T @ M @ run.Q, run.tridiagonal(), atol=1e-10)
    w, U, res = run.ritz()
    assert_close(w, spectrum[np.argsort(-np.abs(spectrum))], rtol=1e-10)
    assert_close(np.asarray(M) @ np.asarray(U), np.asarray(U) * np.asarray(w)[None, :], atol=1e-9)
    assert float(jnp.max(res)) < 1e-8


def test_top_eigenpairs_of_a_decaying_spectrum_from_fewer_steps():
    spectrum = np.concatenate([[100.0, 50.0, 25.0, 12.0], 0.01 * np.random.default_rng(1).random(96)])
    M, Q = _prescribed(spectrum, seed=2)
    A = lo.Dense(jnp.asarray(M), tags={"symmetric", "psd"})
    L = lo.LanczosLowRankOp(A, 4, jax.random.key(3), num_steps=20)
    assert_close(L.d, spectrum[:4], rtol=1e-10)
    overlap = np.abs(np.sum(np.asarray(L.U) * Q[:, :4], axis=0))  # eigenvectors, up to sign
    assert_close(overlap, np.ones(4), atol=1e-8)
    assert float(L.residuals.max()) < 1e-6 * spectrum[0]
    # It composes like any LowRank: Woodbury solve and the determinant lemma against dense.
    dense = np.asarray(L.as_matrix()) + 0.5 * np.eye(100)
    b = np.random.default_rng(4).standard_normal(100)
    assert_close(lo.solve(L + 0.5 * lo.Identity(100), jnp.asarray(b)).value, np.linalg.solve(dense, b), rtol=1e-9)
    assert_close(lo.logdet(L + 0.5 * lo.Identity(100)), np.linalg.slogdet(dense)[1], rtol=1e-10)
    assert_close(lo.pinv(L).as_matrix(), np.linalg.pinv(np.asarray(L.as_matrix()), rcond=1e-10), atol=1e-10)


def test_pinv_factor_is_the_pseudo_inverse_on_the_krylov_space():
    # PSD, rank 4, with an exact null space: a rotation by a 4 x 4 Hadamard matrix / 2 (entries +-1/2, so M is
    # exact in binary) of the range, the null space the last two coordinates. (A random rotation left M's zero
    # eigenvalues at rounding size, ~1e-16, so whether the Krylov space was invariant at 5 steps or went on to a
    # sixth depended on how XLA rounded the reorthogonalisation: 6 steps at its default optimisation level.)
    H = 0.5 * np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]])
    R = np.eye(6)
    R[:4, :4] = H
    M = R @ np.diag([4.0, 2.0, 1.0, 0.5, 0.0, 0.0]) @ R.T
    assert not M[4:].any() and not M[:, 4:].any()
    A = lo.Dense(jnp.asarray(M), tags={"symmetric", "psd"})
    v0 = np.random.default_rng(6).standard_normal(6)
    run = lo.lanczos(A, 6, v0=jnp.asarray(v0))
    # The Krylov space is the 4-dimensional range plus v0's null-space component: invariant at 5.
    assert int(run.steps) == 5
    assert bool(jnp.all(jnp.isfinite(run.Q)))
    assert_close(run.Q[:, 0], v0 / np.linalg.norm(v0), rtol=1e-12)  # started from the given vector
    L = np.asarray(run.pinv_factor())
    Q = np.asarray(run.Q)
    T = np.asarray(run.tridiagonal())
    assert_close(L @ L.T, Q @ np.linalg.pinv(T) @ Q.T, atol=1e-10)
    # v0 has a component in the null space, so the Krylov space is the range plus that
    # direction; on the range, L L^T is the pseudo-inverse.
    P = M @ np.linalg.pinv(M)
    assert_close(P @ L @ L.T @ P, np.linalg.pinv(M), atol=1e-9)


def test_bad_input_is_refused_with_a_clear_error():
    A = lo.Dense(jnp.eye(4), tags={"symmetric"})
    with pytest.raises(ValueError, match="must be square and tagged symmetric"):
        lo.lanczos(lo.Dense(jnp.ones((3, 4))), 2, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"num_steps must be an integer in \[1, 4\]"):
        lo.lanczos(A, 5, key=jax.random.key(0))
    with pytest.raises(ValueError, match="pass a start vector v0 or a PRNG key"):
        lo.lanczos(A, 2)
    with pytest.raises(ValueError, match=r"v0 must have shape \(4,\)"):
        lo.lanczos(A, 2, v0=jnp.ones(3))
    with pytest.raises(ValueError, match=r"rank must be an integer in \[1, 4\], got 5"):
        lo.LanczosLowRankOp(A, 5, jax.random.key(0))
    with pytest.raises(ValueError, match=r"num_steps \(2\) must be at least rank \(3\)"):
        lo.LanczosLowRankOp(A, 3, jax.random.key(0), num_steps=2)


# --- reverse-mode derivatives through the custom adjoint --------------------------------------


def _unrolled(M, v, m):
    """The same recursion as a Python loop, differentiated by plain autodiff (the reference)."""
    q = v / jnp.linalg.norm(v)
    Q, alpha, beta = [], [], []
    for _ in range(m):
        Q.append(q)
        w = M @ q
        alpha.append(q @ w)
        B = jnp.stack(Q)
        w = w - B.T @ (B @ w)
        w = w - B.T @ (B @ w)
        beta.append(jnp.linalg.norm(w))
        q = w / beta[-1]
    return jnp.stack(Q).T, jnp.stack(alpha), jnp.stack(beta)


def _weights(n, m, seed):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s)) for s in ((n, m), (m,), (m,))]


@pytest.mark.parametrize("m", [1, 5, 12])
def test_gradients_of_the_basis_and_tridiagonal_match_unrolled_autodiff(m):
    n = 12
    rng = np.random.default_rng(7)
    B = rng.standard_normal((n, n))
    M = jnp.asarray(B @ B.T / n + np.diag(np.linspace(0.0, 3.0, n)))
    v = jnp.asarray(rng.standard_normal(n))
    W = _weights(n, m, 8)
    nb = m if m < n else m - 1  # at m = n the last residual is rounding noise: leave it out

    def ours(M, v):
        run = lo.lanczos(lo.Dense(M, tags={"symmetric"}), m, v0=v)
        return jnp.sum(W[0] * run.Q) + W[1] @ run.alpha + W[2][:nb] @ run.beta[:nb]

    def reference(M, v):
        Q, alpha, beta = _unrolled(M, v, m)
        return jnp.sum(W[0] * Q) + W[1] @ alpha + W[2][:nb] @ beta[:nb]

    assert_close(ours(M, v), reference(M, v), rtol=1e-12)
    grads = [jax.jit(jax.grad(f, argnums=(0, 1)))(M, v) for f in (ours, reference)]
    for got, want in zip(*grads, strict=True):
        assert_close(got, want, rtol=1e-9, atol=1e-11)


def test_gradient_after_an_exact_early_stop():
    d = jnp.array([4.0, 3.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    v = jnp.asarray(np.random.default_rng(3).standard_normal(8))
    assert int(lo.lanczos(lo.Diagonal(d), 7, v0=v).steps) == 5  # range (4) + v's null component
    W = _weights(8, 5, 4)

    def ours(d, v):
        run = lo.lanczos(lo.Diagonal(d), 7, v0=v)
        return jnp.sum(W[0] * run.Q[:, :5]) + W[1] @ run.alpha[:5] + W[2][:4] @ run.beta[:4]

    def reference(d, v):
        Q, alpha, beta = _unrolled(jnp.diag(d), v, 5)
        return jnp.sum(W[0] * Q) + W[1] @ alpha + W[2][:4] @ beta[:4]

    grads = [jax.jit(jax.grad(f, argnums=(0, 1)))(d, v) for f in (ours, reference)]
    for got, want in zip(*grads, strict=True):
        assert_close(got, want, rtol=1e-9, atol=1e-11)


def test_gradient_of_top_eigenvalues_is_the_eigenprojector_and_flows_to_kernel_hyperparameters():
    spectrum = np.array([5.0, 4.0, 2.5, 1.0, 0.5, 0.2])
    M, Q = _prescribed(spectrum, seed=9)
    top2 = lambda M: jnp.sum(lo.LanczosLowRankOp(lo.Dense(M, tags={"symmetric"}), 2, jax.random.key(0),  # noqa: E731
                                                 num_steps=6).d)
    G = np.asarray(jax.jit(jax.grad(top2))(jnp.asarray(M)))
    assert_close((G + G.T) / 2, Q[:, :2] @ Q[:, :2].T, atol=1e-10)  # d(l1 + l2)/dM = U_2 U_2^T
    X = jnp.asarray(np.random.default_rng(10).standard_normal((30, 2)))

    def lanczos_top3(ell):
        return jnp.sum(lo.LanczosLowRankOp(lo.KernelGramOp(lo.kernels.RBF(ell), X), 3, jax.random.key(1),
                                           num_steps=30).d)

    dense_top3 = lambda ell: jnp.sum(jnp.linalg.eigvalsh(lo.kernels.RBF(ell)(X))[-3:])  # noqa: E731
    assert_close(jax.jit(jax.grad(lanczos_top3))(0.7), jax.grad(dense_top3)(0.7), rtol=1e-8)


def test_gradient_program_does_not_grow_with_the_number_of_steps():
    """The adjoint is a loop, not an unrolled chain: the traced program has the same size."""
    M = jnp.asarray(_prescribed(np.linspace(1.0, 2.0, 60))[0])

    def size(m):
        f = lambda M: jnp.sum(lo.lanczos(lo.Dense(M, tags={"symmetric"}), m, key=jax.random.key(0)).alpha)  # noqa: E731
        return len(jax.make_jaxpr(jax.grad(f))(M).eqns)

    assert size(5) == size(50)


def test_restart_leaves_an_invariant_krylov_space_and_completes_the_basis():
    d = jnp.array([2.0, 2.0, 2.0, 1.0, 1.0, 0.5])  # three distinct eigenvalues: Krylov dimension 3
    v = jnp.ones(6)
    plain = lo.lanczos(lo.Diagonal(d), 6, v0=v)
    assert int(plain.steps) == 3 and int(plain.restarts) == 0
    run = lo.lanczos(lo.Diagonal(d), 6, v0=v, restart=True)
    assert int(run.steps) == 6 and int(run.restarts) == 3
    assert_close(run.Q.T @ run.Q, np.eye(6), atol=1e-12)
    assert_close(run.Q @ run.tridiagonal() @ run.Q.T, np.diag(d), atol=1e-12)  # Q T Q^T = A on the whole space
    L = run.pinv_factor()
    assert_close(L @ L.T, np.diag(1 / np.asarray(d)), atol=1e-12)
    # LanczosLowRankOp restarts by default: four orthonormal eigenpairs although the Krylov space of
    # a start vector has dimension three
    low = lo.LanczosLowRankOp(lo.Diagonal(d), 4, jax.random.key(0), num_steps=6)
    assert_close(low.U.T @ low.U, np.eye(4), atol=1e-12)
    assert_close(np.sort(np.asarray(low.d)), [1.0, 2.0, 2.0, 2.0], atol=1e-12)
    # a restarted run has no derivative: NaN, not a silently wrong number
    grad = jax.grad(lambda d: jnp.sum(lo.lanczos(lo.Diagonal(d), 6, v0=v, restart=True).alpha))(d)
    assert bool(jnp.all(jnp.isnan(grad)))


@pytest.mark.parametrize("dtype, scale", [(jnp.float32, 1e3), (jnp.float64, 1e3), (jnp.float64, 1e4)])
def test_a_dominant_eigenvalue_does_not_make_later_steps_look_invariant(dtype, scale):
    """Linear regression with one input column scaled by 10³ or 10⁴ (λ₁/λ₂ ~ 10⁶-10⁸): the GGN XᵀX.

    Judged against the largest value so far, every step after the first looked invariant (27
    restarts in 30 steps, eigenvalues 2-4 off by 30-60%) and the reported Ritz residuals were 0
    while the true ones were in the hundreds. Each step is now judged against its own scale, and a
    reported residual is one that was measured: it equals ||A u - θ u|| recomputed here, and every
    Ritz value lies within its residual of an exact eigenvalue (the symmetric residual bound)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 30))
    X[:, 0] *= scale
    G = X.T @ X
    exact = np.linalg.eigvalsh(G)
    A = lo.Dense(jnp.asarray(G, dtype), tags={"symmetric", "psd"})
    run = lo.lanczos(A, 30, key=jax.random.key(0), restart=True)
    assert int(run.restarts) <= 2
    w, U, reported = run.ritz(A)
    w, U = np.asarray(w, np.float64), np.asarray(U, np.float64)
    true = np.linalg.norm(G @ U - U * w[None, :], axis=0)
    eps, top = float(jnp.finfo(dtype).eps), exact.max()
    assert np.all(np.isfinite(np.asarray(reported)))
    assert_close(reported, true, rtol=0.05, atol=100 * eps * top)
    for theta, r in zip(w, np.asarray(reported), strict=True):
        assert np.min(np.abs(exact - theta)) <= r + 100 * eps * top
    # eigenvalues 2-4 to the accuracy the dtype allows next to λ₁ (eps λ₁ absolute), not tens of percent off
    assert_close(w[1:4], exact[::-1][1:4], rtol=0.05 if dtype == jnp.float32 else 1e-6)
    # without A the restarted run's residuals are not measured: NaN, never a claimed 0
    if int(run.restarts) > 0:
        assert bool(jnp.all(jnp.isnan(run.ritz()[2])))
    low = lo.LanczosLowRankOp(A, 4, jax.random.key(0), num_steps=30)
    assert np.all(np.isfinite(np.asarray(low.residuals)))
    U4 = np.asarray(low.U, np.float64)
    assert_close(low.residuals, np.linalg.norm(G @ U4 - U4 * np.asarray(low.d, np.float64)[None, :], axis=0),
                 rtol=0.05, atol=100 * eps * top)


def test_after_a_restart_the_reported_residuals_are_the_measured_ones():
    """A start vector in a 3-dimensional invariant subspace restarts after 3 steps; the 3 steps after it leave Ritz
    pairs far from converged. `ritz(A)` must report their true residuals ||A u - θ u|| (a mutant that kept the
    recurrence's values after the restart reported ~0 against true residuals of order one)."""
    S = np.random.default_rng(1).standard_normal((6, 6))
    M = np.zeros((12, 12))
    M[:6, :6] = np.diag([2.0, 2.0, 2.0, 1.0, 1.0, 0.5])
    M[6:, 6:] = S @ S.T / 6 + 0.5 * np.eye(6)  # a dense block the restart goes on into
    A = lo.Dense(jnp.asarray(M), tags={"symmetric", "psd"})
    v = jnp.concatenate([jnp.ones(6), jnp.zeros(6)])
    run = lo.lanczos(A, 6, v0=v, restart=True)
    assert int(run.restarts) >= 1
    w, U, reported = run.ritz(A)
    true = np.linalg.norm(M @ np.asarray(U) - np.asarray(U) * np.asarray(w)[None, :], axis=0)
    assert true.max() > 0.1  # some pairs are far from converged: the check has something to see
    assert_close(reported, true, rtol=1e-8, atol=1e-12)


def test_residuals_below_the_rounding_floor_are_measured_not_read_from_the_recurrence():
    """Issue 37: with a dominant eigenvalue in float32 the recurrence reads residual 0 for Ritz pairs whose true
    residual is near 1 (a run of full length, no restart). Given A, every reported residual is the measured
    ||A u - theta u|| (the recurrence cannot resolve below m eps max|theta|)."""
    d = jnp.concatenate([jnp.array([1e6]), jnp.linspace(0.5, 5, 29)]).astype(jnp.float32)
    A = lo.Diagonal(d)
    run = lo.lanczos(A, 30, key=jax.random.key(0))
    assert int(run.steps) == 30 and int(run.restarts) == 0
    w, U, recurrence = run.ritz()
    measured = jnp.linalg.norm(A.mm(U) - U * w[None, :], axis=0)
    assert float(jnp.max(measured)) > 0.1 and float(jnp.max(recurrence[1:])) < 1e-3  # the recurrence's blind spot
    _, _, residuals = run.ritz(A)
    np.testing.assert_allclose(residuals, measured, rtol=0.05, atol=1e-3)
    low = lo.LanczosLowRankOp(A, 5, jax.random.key(0), num_steps=30)
    truth = jnp.linalg.norm(A.mm(low.U) - low.U * low.d[None, :], axis=0)
    np.testing.assert_allclose(low.residuals, truth, rtol=0.05, atol=1e-3)
    assert float(jnp.max(low.residuals)) > 0.05
