"""solve, inv, pinv, sqrt, diag, trace, logdet, eigh, hutchinson against dense NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

import linops as lo
from linops.testing import strategies as lst
from tests import _draws as draws

from ._util import assert_close


def _closed_form(fn, *args, **kw):
    """The closed-form result, or None when the structure has none (a ValueError saying so)."""
    try:
        return fn(*args, **kw)
    except ValueError as e:
        assert "has no closed form" in str(e), str(e)
        return None


def _well_conditioned(M):
    return np.linalg.cond(M) < 1e6


@given(lst.expressions())
def test_diag_and_trace_closed_forms_match_dense(case):
    d = _closed_form(lo.diag, case.op)
    if d is not None:
        assert_close(d, np.diag(case.dense))
    t = _closed_form(lo.trace, case.op)
    if t is not None:
        assert_close(t, np.trace(case.dense))
    assert_close(lo.diag(case.op, method="exact", chunk=4), np.diag(case.dense))


@given(lst.expressions())
def test_solve_inv_logdet_closed_forms_match_dense(case):
    if not _well_conditioned(case.dense):
        return
    n = case.dense.shape[0]
    b = np.linspace(1.0, 2.0, n)
    sol = _closed_form(lo.solve, case.op, jnp.asarray(b))
    if sol is not None:
        assert_close(sol.value, np.linalg.solve(case.dense, b), rtol=1e-6, atol=1e-6)
        assert bool(sol.converged)
        assert_close(lo.inv(case.op) @ jnp.asarray(b), np.linalg.solve(case.dense, b), rtol=1e-6, atol=1e-6)
        B = np.stack([b, -b**2], axis=1)
        assert_close(lo.solve(case.op, jnp.asarray(B)).value, np.linalg.solve(case.dense, B), rtol=1e-6, atol=1e-6)
    ld = _closed_form(lo.logdet, case.op)
    if ld is not None:
        assert_close(ld, np.linalg.slogdet(case.dense)[1], rtol=1e-6, atol=1e-6)
    assert_close(lo.logdet(case.op, method="dense"), np.linalg.slogdet(case.dense)[1], rtol=1e-6, atol=1e-6)


@given(lst.expressions())
def test_sqrt_pinv_eigh_closed_forms_match_dense(case):
    A = case.dense
    if "psd" in case.op.tags:
        S = _closed_form(lo.sqrt, case.op)
        if S is not None:
            Sd = np.asarray(S.as_matrix())
            assert_close(Sd, Sd.T, atol=1e-7)
            assert_close(Sd @ Sd, A, rtol=1e-6, atol=1e-6)
            assert np.linalg.eigvalsh((Sd + Sd.T) / 2).min() > -1e-6 * max(1.0, abs(Sd).max())
    P = _closed_form(lo.pinv, case.op)
    if P is not None:
        assert_close(P.as_matrix(), np.linalg.pinv(A, rcond=1e-10), rtol=1e-5, atol=1e-5)
    if "symmetric" in case.op.tags:
        wq = _closed_form(lo.eigh, case.op)
        if wq is not None:
            w, Q = wq
            assert_close(w, np.linalg.eigvalsh(A), atol=1e-7)
            Qd = np.asarray(Q.as_matrix())
            assert_close(Qd.T @ Qd, np.eye(A.shape[0]), atol=1e-7)
            assert_close(Qd @ np.diag(np.asarray(w)) @ Qd.T, A, atol=1e-7)


def test_structured_closed_forms_exist_where_promised():
    """Each structure the docs promise a closed form for has one (no silent fallback)."""
    rng = np.random.default_rng(0)
    n, k = 6, 2
    U = np.linalg.qr(rng.standard_normal((n, k)))[0]
    d = np.array([3.0, 0.5])
    D = np.abs(rng.standard_normal(n)) + 0.5
    woodbury = lo.Diagonal(jnp.asarray(D)) + 2.0 * lo.LowRank(jnp.asarray(U), jnp.asarray(d), orthonormal=True)
    dense = np.diag(D) + 2.0 * U @ np.diag(d) @ U.T
    b = rng.standard_normal(n)
    assert_close(lo.solve(woodbury, jnp.asarray(b)).value, np.linalg.solve(dense, b))
    assert_close(lo.logdet(woodbury), np.linalg.slogdet(dense)[1])
    shifted = lo.shift(lo.LowRank(jnp.asarray(U), jnp.asarray(d), orthonormal=True), 0.7)
    S = lo.sqrt(shifted)
    assert_close(S.as_matrix() @ S.as_matrix(), U @ np.diag(d) @ U.T + 0.7 * np.eye(n))
    A2, B3 = _spd(rng, 2), _spd(rng, 3)
    K = lo.Kronecker(lo.Dense(jnp.asarray(A2), tags={"psd"}), lo.Dense(jnp.asarray(B3), tags={"psd"}))
    assert_close(lo.logdet(K), np.linalg.slogdet(np.kron(A2, B3))[1])
    assert_close(lo.solve(K, jnp.asarray(b)).value, np.linalg.solve(np.kron(A2, B3), b))
    w, Q = lo.eigh(K)
    assert_close(w, np.linalg.eigvalsh(np.kron(A2, B3)))
    assert isinstance(lo.sqrt(K), lo.Kronecker)
    blocks = lo.BlockDiagonal([lo.Dense(jnp.asarray(A2), tags={"psd"}), lo.Diagonal(jnp.array([1.0, 2.0]))])
    assert_close(lo.logdet(blocks), np.linalg.slogdet(A2)[1] + np.log(2.0))


def _spd(rng, n):
    A = rng.standard_normal((n, n))
    return A @ A.T + n * np.eye(n)


def test_solve_without_closed_form_asks_for_a_method():
    A = lo.Dense(jnp.eye(3)) @ lo.Dense(jnp.ones((3, 3)))  # a product with a singular factor
    G = lo.FunctionOp(lambda v: 2.0 * v, (3, 3), jnp.float64, tags={"psd"})
    with pytest.raises(ValueError, match=r"solve: FunctionOp\(3, 3\) has no closed form.*method='cg'"):
        lo.solve(G, jnp.ones(3))
    with pytest.raises(ValueError, match="logdet: .* has no closed form"):
        lo.logdet(G)
    with pytest.raises(ValueError, match="diag: .* method='exact'"):
        lo.diag(G)
    assert_close(lo.solve(G, jnp.ones(3), method="cg").value, 0.5 * np.ones(3))
    assert A is not None


def test_cg_matches_dense_and_reports_convergence():
    rng = np.random.default_rng(1)
    M = _spd(rng, 20)
    A = lo.Dense(jnp.asarray(M), tags={"psd"})
    b = rng.standard_normal(20)
    sol = lo.solve(A, jnp.asarray(b), method="cg", rtol=1e-12)
    assert bool(sol.converged) and 0 < int(sol.num_steps) <= 20 * 10
    assert_close(sol.value, np.linalg.solve(M, b), rtol=1e-9)
    assert float(sol.residual_norm) <= 1e-12 * np.linalg.norm(b) * 1.01
    capped = lo.solve(A, jnp.asarray(b), method="cg", rtol=1e-12, maxiter=2)
    assert not bool(capped.converged) and int(capped.num_steps) == 2
    B = np.stack([b, 2 * b, np.zeros(20)], axis=1)  # several right-hand sides, one of them zero
    many = lo.solve(A, jnp.asarray(B), method="cg", rtol=1e-12)
    assert_close(many.value, np.linalg.solve(M, B), rtol=1e-9)
    assert many.converged.shape == (3,) and bool(many.converged.all())
    pre = lo.inv(lo.Diagonal(lo.diag(A)))
    preconditioned = lo.solve(A, jnp.asarray(b), method="cg", rtol=1e-12, preconditioner=pre)
    assert_close(preconditioned.value, np.linalg.solve(M, b), rtol=1e-9)


def test_cg_refuses_an_operator_not_tagged_psd():
    with pytest.raises(ValueError, match=r"Dense\(2, 2\) is not tagged psd"):
        lo.solve(lo.Dense(jnp.eye(2)), jnp.ones(2), method="cg")


def test_cg_reports_breakdown_on_an_indefinite_operator_declared_psd():
    A = lo.Dense(jnp.diag(jnp.array([1.0, -1.0])), tags={"psd"})  # a false promise
    sol = lo.solve(A, jnp.array([1.0, 1.0]), method="cg")
    assert not bool(sol.converged)


@pytest.mark.parametrize("scale", [1.0, pytest.param(1e3, marks=pytest.mark.slow),
                                   pytest.param(1e-3, marks=pytest.mark.slow)])  # 3 s each
def test_cg_in_float32_at_n_1e5(scale):
    """lineax's CG stalls or diverges on this problem in float32; the normalised CG converges."""
    n, k = 100_000, 20
    U = jnp.linalg.qr(draws.normal(jax.random.key(0), (n, k), jnp.float32))[0]
    d = jnp.logspace(0, 4, k, dtype=jnp.float32)
    D = jnp.linspace(1.0, 10.0, n, dtype=jnp.float32)
    structured = scale * (lo.Diagonal(D) + lo.LowRank(U, d))
    matrix_free = lo.FunctionOp(lambda v: structured @ v, (n, n), jnp.float32, tags={"psd"})
    b = draws.normal(jax.random.key(1), (n,), jnp.float32)
    exact = lo.solve(structured, b).value  # Woodbury closed form
    exact64 = scale * (lo.Diagonal(D.astype(jnp.float64)) + lo.LowRank(U.astype(jnp.float64), d.astype(jnp.float64)))
    for rtol in (1e-4, 1e-5):
        sol = lo.solve(matrix_free, b, method="cg", rtol=rtol)
        assert sol.value.dtype == jnp.float32 and not bool(jnp.isnan(sol.value).any())
        # the returned x's true residual, computed in float64
        residual = float(jnp.linalg.norm(exact64 @ sol.value.astype(jnp.float64) - b) / jnp.linalg.norm(b))
        assert residual < 1e-4
        assert float(jnp.linalg.norm(sol.value - exact) / jnp.linalg.norm(exact)) < 1e-3
        # The reported residual is the true one (recomputed from x), not CG's recursive estimate, which runs
        # below it: never a third of the true residual. Convergence is the recursive rule confirmed by it within
        # the recomputation's rounding. At rtol = 1e-4 the two also agree from above (within 3x); at 1e-5 the
        # float32 recomputation is at its rounding floor (eps ||A|| ||x|| / ||b||, about 2e-4 at worst here) and
        # reads up to 8x the float64 value (measured with XLA's back end at optimisation level 0), which errs
        # on the side of "not converged", never the other.
        reported = float(sol.residual_norm / jnp.linalg.norm(b))
        assert residual / 3 <= reported
        if rtol >= 1e-4:
            assert reported <= 3 * residual
        assert bool(sol.converged) and reported <= 10 * rtol


def test_hutchinson_is_unbiased_with_an_honest_standard_error():
    rng = np.random.default_rng(2)
    M = rng.standard_normal((30, 30))
    A = lo.Dense(jnp.asarray(M))
    true = np.trace(M)
    z_scores = []
    for i in range(20):
        est = lo.hutchinson(A, jax.random.key(i), 50)
        z_scores.append((float(est.value) - true) / float(est.standard_error))
    z = np.asarray(z_scores)
    # With 20 independent estimates, |z| > 4 has probability ~1e-3; the mean z is ~N(0, 1/20).
    assert np.all(np.abs(z) < 4.0), z
    assert abs(z.mean()) < 4.0 / np.sqrt(20)
    wide = lo.hutchinson(A, jax.random.key(0), 400)
    narrow = lo.hutchinson(A, jax.random.key(0), 25)
    assert float(wide.standard_error) < 0.5 * float(narrow.standard_error)
    exact = lo.hutchinson(lo.Diagonal(jnp.arange(5.0)), jax.random.key(0), 8)
    assert float(exact.value) == 10.0 and float(exact.standard_error) == 0.0
    via_trace = lo.trace(A, method="hutchinson", key=jax.random.key(3), num_samples=2000)
    direct = lo.hutchinson(A, jax.random.key(3), 2000)
    assert float(via_trace.value) == float(direct.value)  # lo.trace's estimate is lo.hutchinson's, error and all
    assert float(via_trace.standard_error) == float(direct.standard_error) and via_trace.num_samples == 2000
    assert abs(float(direct.value) - true) < 4 * float(direct.standard_error)


def test_stochastic_diag_needs_a_key_and_is_close_on_average():
    rng = np.random.default_rng(3)
    M = rng.standard_normal((8, 8))
    A = lo.Dense(jnp.asarray(M))
    with pytest.raises(ValueError, match="explicit PRNG key"):
        lo.diag(A, method="hutchinson")
    with pytest.raises(ValueError, match="explicit PRNG key"):
        lo.hutchinson(A, None)
    est = lo.diag(A, method="hutchinson", key=jax.random.key(0), num_samples=20_000)
    off = np.sqrt((M**2).sum(1) - np.diag(M) ** 2)  # per-entry standard deviation with one probe
    assert np.all(np.abs(np.asarray(est.value) - np.diag(M)) < 5 * off / np.sqrt(20_000))
    # each entry's standard error estimates that per-entry deviation over sqrt(s) (20,000 probes: within 3%)
    np.testing.assert_allclose(np.asarray(est.standard_error), off / np.sqrt(20_000), rtol=0.03)


def test_functions_reject_non_square_and_bad_shapes():
    A = lo.Dense(jnp.ones((2, 3)))
    for fn in (lo.solve,):
        with pytest.raises(ValueError, match=r"solve: expected a square operator, got Dense\(2, 3\)"):
            fn(A, jnp.ones(2))
    with pytest.raises(ValueError, match=r"logdet: expected a square operator, got Dense\(2, 3\)"):
        lo.logdet(A)
    with pytest.raises(ValueError, match=r"inv: expected a square operator"):
        lo.inv(A)
    S = lo.Dense(jnp.eye(3))
    with pytest.raises(ValueError, match=r"solve: Dense\(3, 3\) needs a right-hand side of shape \(3,\).*got \(4,\)"):
        lo.solve(S, jnp.ones(4))
    with pytest.raises(ValueError, match="unknown method 'lu'"):
        lo.solve(S, jnp.ones(3), method="lu")
    with pytest.raises(ValueError, match="sqrt: .* is not tagged psd"):
        lo.sqrt(S)
    with pytest.raises(ValueError, match="eigh: .* is not tagged symmetric"):
        lo.eigh(lo.Dense(jnp.ones((3, 3))))


def test_pinv_uses_a_relative_cut_off():
    for scale in (1e-12, 1.0, 1e12):
        d = scale * jnp.array([1.0, 1e-20, 2.0])
        P = lo.pinv(lo.Diagonal(d))
        assert_close(P @ d, jnp.array([1.0, 0.0, 1.0]))  # the tiny entry is dropped at every scale
    M = np.array([[1.0, 2.0], [2.0, 4.0]]) * 1e-9  # rank one, tiny entries
    assert_close(lo.pinv(lo.Dense(jnp.asarray(M))).as_matrix(), np.linalg.pinv(M), rtol=1e-6)


def test_functions_work_under_jit_and_grad():
    def f(lam):
        A = lo.shift(lo.Diagonal(jnp.array([1.0, 2.0, 3.0])), lam, nonnegative=True)
        return lo.logdet(A) + lo.solve(A, jnp.ones(3)).value.sum()

    lam = 0.5
    d = np.array([1.0, 2.0, 3.0]) + lam
    assert_close(jax.jit(f)(lam), np.log(d).sum() + (1 / d).sum())
    assert_close(jax.grad(f)(lam), (1 / d).sum() - (1 / d**2).sum())


def test_cg_under_jit_with_default_tolerance_and_inside_a_lowered_inverse():
    rng = np.random.default_rng(4)
    M = _spd(rng, 5)
    A = lo.Dense(jnp.asarray(M), tags={"psd"})
    b = jnp.arange(1.0, 6.0)
    sol = jax.jit(lambda A, b: lo.solve(A, b, method="cg"))(A, b)
    assert bool(sol.converged) and sol.num_steps.dtype == jnp.int32
    assert_close(sol.value, np.linalg.solve(M, b), rtol=1e-6)
    L = lo.lower(lo.inv(A, method="cg") @ lo.Diagonal(jnp.ones(5)))
    assert_close(L @ b, np.linalg.solve(M, b), rtol=1e-6)


@pytest.mark.parametrize("size", [1e-30, 1e-21, 1.0, 1e21, 1e30])
def test_cg_handles_huge_and_tiny_right_hand_sides_in_float32(size):
    A = lo.Dense(jnp.asarray(_spd(np.random.default_rng(5), 6), jnp.float32), tags={"psd"})
    b = jnp.linspace(1.0, 2.0, 6, dtype=jnp.float32) * jnp.float32(size)
    sol = lo.solve(A, b, method="cg")
    assert bool(sol.converged)
    x = np.asarray(sol.value, np.float64)
    ref = np.linalg.solve(np.asarray(A.matrix, np.float64), np.asarray(b, np.float64))
    assert np.isfinite(x).all()
    assert np.linalg.norm(x - ref) <= 1e-3 * np.linalg.norm(ref)


def test_permutations_solve_by_their_transpose():
    perm = lo.Selection(jnp.array([2, 0, 1]), 3)
    b = jnp.array([1.0, 2.0, 3.0])
    assert_close(perm @ lo.solve(perm, b).value, b)
    assert_close(lo.inv(perm) @ (perm @ b), b)
    assert float(lo.logdet(perm)) == 0.0


def test_direct_solves_of_singular_systems_do_not_claim_convergence():
    """A dense LU of a singular matrix, or a closed form on a zero diagonal, gives Inf/NaN: not converged."""
    singular = lo.Dense(jnp.array([[1.0, 2.0], [2.0, 4.0]]))
    sol = lo.solve(singular, jnp.array([1.0, 0.0]), method="dense")
    assert not bool(jnp.all(jnp.isfinite(sol.value))) and not bool(sol.converged)
    sol = lo.solve(lo.Diagonal(jnp.array([2.0, 0.0])), jnp.array([[1.0, 1.0], [0.0, 1.0]]))
    assert sol.converged.tolist() == [False, False]  # 0/0 and 1/0
    sol = lo.solve(lo.Diagonal(jnp.array([2.0, 4.0])), jnp.array([1.0, 1.0]))
    assert bool(sol.converged) and bool(jnp.isnan(sol.residual_norm))  # direct: not measured, not claimed 0


def test_an_inverse_without_a_closed_form_is_refused_when_built_not_at_its_first_product():
    """A sum of two Kronecker products has no closed-form solve: `lo.inv` says so when called, naming the
    explicit methods, which give the dense inverse; diagonal plus low rank (Woodbury) is built and exact."""
    rng = np.random.default_rng(0)
    A, B, C, D = (rng.standard_normal((k, k)) for k in (2, 3, 2, 3))
    A, B, C, D = (M @ M.T + np.eye(len(M)) for M in (A, B, C, D))
    S = (lo.Kronecker(lo.Dense(jnp.asarray(A), tags={"psd"}), lo.Dense(jnp.asarray(B), tags={"psd"}))
         + lo.Kronecker(lo.Dense(jnp.asarray(C), tags={"psd"}), lo.Dense(jnp.asarray(D), tags={"psd"})))
    dense = np.kron(A, B) + np.kron(C, D)
    with pytest.raises(ValueError, match=r"inv: .* has no closed-form solve here; .*method='cg'.*method='dense'"):
        lo.inv(S)
    assert_close(lo.inv(S, method="dense").as_matrix(), np.linalg.inv(dense), rtol=1e-9)
    U, d = rng.standard_normal((6, 2)), np.array([0.5, 2.0])
    W = lo.Diagonal(jnp.arange(1.0, 7.0)) + lo.LowRank(jnp.asarray(U), jnp.asarray(d))
    assert_close(lo.inv(W).as_matrix(), np.linalg.inv(np.diag(np.arange(1.0, 7.0)) + U @ np.diag(d) @ U.T),
                 rtol=1e-9)


@pytest.mark.parametrize("base", ["kronecker", "cholesky"])
def test_woodbury_and_the_determinant_lemma_around_any_operator_with_closed_forms(base):
    """``s B + U1 C1 V1ᵀ + U2 C2 U2ᵀ`` with B a Kronecker product or a Cholesky-factored matrix (each with its own
    solve and log-determinant): solve (a vector and columns), inverse and log-determinant equal numpy's, with no
    method named."""
    rng = np.random.default_rng(2)
    A, B = (rng.standard_normal((k, k)) for k in (2, 3))
    A, B = A @ A.T + np.eye(2), B @ B.T + np.eye(3)
    if base == "kronecker":
        op = lo.Kronecker(lo.Dense(jnp.asarray(A), tags={"psd"}), lo.Dense(jnp.asarray(B), tags={"psd"}))
    else:
        op = lo.factorize(lo.Dense(jnp.asarray(np.kron(A, B)), tags={"psd"}))
    U1, V1, U2 = rng.standard_normal((6, 2)), rng.standard_normal((6, 2)), rng.standard_normal((6, 1))
    c1, c2 = np.array([0.5, -0.3]), np.array([2.0])
    S = 2.5 * op + lo.LowRank(jnp.asarray(U1), jnp.asarray(c1), jnp.asarray(V1)) + lo.LowRank(jnp.asarray(U2),
                                                                                              jnp.asarray(c2))
    dense = 2.5 * np.kron(A, B) + U1 @ np.diag(c1) @ V1.T + U2 @ np.diag(c2) @ U2.T
    b, M = rng.standard_normal(6), rng.standard_normal((6, 3))
    assert_close(lo.solve(S, jnp.asarray(b)).value, np.linalg.solve(dense, b), rtol=1e-9)
    assert_close(lo.solve(S, jnp.asarray(M)).value, np.linalg.solve(dense, M), rtol=1e-9)
    assert_close(lo.inv(S).as_matrix(), np.linalg.inv(dense), rtol=1e-9)
    assert_close(lo.logdet(S), np.linalg.slogdet(dense)[1], rtol=1e-12)


def test_the_square_root_refusal_points_to_root_which_samples():
    """Diagonal plus low rank has no principal square root here; the refusal names `lo.root`, whose factor
    reproduces the operator (R Rᵀ = A)."""
    rng = np.random.default_rng(1)
    U, d = rng.standard_normal((5, 2)), np.array([1.0, 3.0])
    W = lo.Diagonal(jnp.arange(1.0, 6.0)) + lo.LowRank(jnp.asarray(U), jnp.asarray(d))
    assert "psd" in W.tags  # positive diagonal and weights
    with pytest.raises(ValueError, match=r"sqrt: .*lo\.root\(A\)"):
        lo.sqrt(W)
    R = lo.root(W).as_matrix()
    assert_close(R @ R.T, np.diag(np.arange(1.0, 6.0)) + U @ np.diag(d) @ U.T, rtol=1e-10)


def test_an_eager_cg_solve_compiles_its_loop_once():
    """`lo.solve(A, b, method="cg")` outside `jax.jit` is one compiled program per operator structure, shapes and
    options: a second call, on a freshly built operator of the same structure and new values, compiles nothing."""
    from linops.testing import count_compilations

    rng = np.random.default_rng(5)

    def spd():
        M = rng.standard_normal((12, 12))
        return M @ M.T / 12 + np.eye(12)

    b = jnp.asarray(rng.standard_normal(12))
    first = lo.solve(lo.Dense(jnp.asarray(spd()), tags={"psd"}), b, method="cg")
    assert bool(first.converged)
    M, c = spd(), jnp.asarray(rng.standard_normal(12))
    with count_compilations() as compiled:
        sol = lo.solve(lo.Dense(jnp.asarray(M), tags={"psd"}), c, method="cg")
        jax.block_until_ready(sol.value)
    assert compiled == []
    assert bool(sol.converged)
    assert_close(sol.value, np.linalg.solve(M, np.asarray(c)), rtol=1e-6)


def test_cg_reports_converged_only_when_the_true_residual_meets_the_tolerance():
    """In float32 at condition number 1e4 the recursive residual meets rtol = 1e-5 while the true residual stalls
    ~25x above it: CG stops there, and must say it did not converge (a mutant that trusted the recursion
    reported converged)."""
    rng = np.random.default_rng(0)
    n = 100
    Q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    M = (Q * np.logspace(0, 4, n)) @ Q.T
    A = lo.Dense(jnp.asarray(M, jnp.float32), tags={"psd"})
    b = rng.standard_normal(n).astype(np.float32)
    sol = lo.solve(A, jnp.asarray(b), method="cg", rtol=1e-5, maxiter=2000)
    x = np.asarray(sol.value, np.float64)
    true = np.linalg.norm(b - M @ x)
    threshold = 1e-5 * np.linalg.norm(b)
    assert int(sol.num_steps) < 2000  # stopped by the recursion, not by the cap
    assert true > 10 * threshold  # the true residual did not follow it
    assert not bool(sol.converged)
    assert float(sol.residual_norm) > 10 * threshold  # the recomputed residual, not the recursion's
    # The recomputation is a float32 product, so it is the true residual of the matrix the operator holds (M
    # rounded to float32) up to that product's rounding, which `cg` documents as about eps ||A|| ||x||: here
    # 3.0e-3, more than the true residual itself (2.3e-3). Measured: 2.6e-7 at XLA's optimisation level 0,
    # 7.5e-5 at JAX's default level 3.
    M32 = np.asarray(A.as_matrix(), np.float64)
    rounding = np.finfo(np.float32).eps * np.linalg.norm(M32, 2) * np.linalg.norm(x)
    assert abs(float(sol.residual_norm) - np.linalg.norm(b - M32 @ x)) <= rounding, (float(sol.residual_norm), rounding)
    # The test's original expectation, kept: 1e-3 relative against float64 and M (not M32: 0.3% apart on their
    # own at level 3). 0.07% off at level 0, which the test session uses; 3.2% at level 3, 0.4% in numpy's
    # float32. Float32 promises none of these, so it fails at level 3 (issue 32's note).
    assert_close(float(sol.residual_norm), true, rtol=1e-3)
