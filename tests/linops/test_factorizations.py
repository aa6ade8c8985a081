"""Factorisations as operator state: Triangular, Cholesky, LU, EigenDecomposed, factorize, root, and the
defects they fix (a Kronecker solve per right-hand side, an inverse refactorised per product, a closed
form that `Lowered` did not forward)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

import linops as lo
from linops.testing import strategies as lst

from ._util import assert_close, equations

RNG = np.random.default_rng(0)


def _spd(n, rng=RNG):
    A = rng.standard_normal((n, n))
    return A @ A.T / n + 0.5 * np.eye(n)


def _count(fn, *args, names=("cholesky", "lu", "eigh")):
    """How many factorisation primitives the traced program of ``fn`` contains (nested jaxprs included)."""
    return sum(eqn.primitive.name in names for eqn in equations(jax.make_jaxpr(fn)(*args).jaxpr))


# --- the defects -------------------------------------------------------------------------------

def test_kronecker_solve_with_many_right_hand_sides_factorises_each_factor_once():
    A, B = _spd(4), _spd(3)
    K = lo.Kronecker(lo.Dense(jnp.asarray(A), tags={"psd"}), lo.Dense(jnp.asarray(B), tags={"psd"}))
    rhs = jnp.asarray(RNG.standard_normal((12, 32)))
    x = lo.solve(K, rhs).value
    assert_close(x, np.linalg.solve(np.kron(A, B), rhs))
    # one Cholesky per factor for all 32 columns (was 2 per column: 64)
    assert _count(lambda b: lo.solve(K, b).value, rhs) == 2
    # a single vector and a non-symmetric factor take the same path
    C = RNG.standard_normal((3, 3)) + 3 * np.eye(3)
    K2 = lo.Kronecker(lo.Diagonal(jnp.arange(1.0, 5.0)), lo.Dense(jnp.asarray(C)))
    assert_close(lo.solve(K2, rhs[:, 0]).value, np.linalg.solve(np.kron(np.diag(np.arange(1.0, 5.0)), C), rhs[:, 0]))
    assert_close(lo.solve(K2, rhs).value, np.linalg.solve(np.kron(np.diag(np.arange(1.0, 5.0)), C), rhs))


@pytest.mark.parametrize("psd", [True, False])
def test_an_inverse_applied_twice_factorises_once(psd):
    M = _spd(5) if psd else RNG.standard_normal((5, 5)) + 3 * np.eye(5)
    A = lo.Dense(jnp.asarray(M), tags={"psd"} if psd else ())
    Ai = lo.inv(A)
    assert isinstance(Ai.factored, lo.Cholesky if psd else lo.LU)
    v = jnp.asarray(RNG.standard_normal(5))
    Minv = np.linalg.inv(M)
    assert_close(Ai @ (Ai @ v), Minv @ Minv @ v)
    assert_close(Ai.T @ v, Minv.T @ v)
    assert_close((v @ Ai), Minv.T @ v)
    assert _count(lambda u: Ai @ (Ai @ u), v) == 0  # the factor was computed once, at inv
    assert _count(lambda u: Ai.T @ u, v) == 0
    assert_close(lo.logdet(Ai), -np.linalg.slogdet(M)[1])
    # inside jit the factorisation is part of the traced program, once
    assert _count(lambda m, u: (lambda B: B @ (B @ u))(lo.inv(lo.Dense(m, tags=A.tags))), jnp.asarray(M), v) == 1
    # and a Kronecker product of dense factors keeps both factorisations
    K = lo.inv(lo.Kronecker(A, A))
    V = jnp.asarray(RNG.standard_normal((25, 3)))
    assert_close(K @ (K @ V), np.kron(Minv, Minv) @ np.kron(Minv, Minv) @ V)
    assert _count(lambda u: K @ (K @ u), V) == 0


def test_diag_of_the_inverse_of_a_lowered_operator():
    D = lo.Diagonal(jnp.array([2.0, 4.0, 5.0]))
    assert_close(lo.diag(lo.inv(lo.lower(D))), [0.5, 0.25, 0.2])  # raised "no closed form" before


@pytest.mark.parametrize("function", [f for f in lo.closed_forms.FUNCTIONS if f.name not in ("pinv", "shift")],
                         ids=lambda f: f.name)
def test_lowered_forwards_every_closed_form(function):
    Q = np.linalg.qr(RNG.standard_normal((4, 4)))[0]
    E = lo.EigenDecomposed(lo.Dense(jnp.asarray(Q), tags={"orthogonal"}), jnp.array([1.0, 2.0, 3.0, 4.0]))
    args = (jnp.ones(4),) if function is lo.closed_forms.solve else ()
    got, want = function(lo.lower(E), *args), function(E, *args)
    assert (got is NotImplemented) == (want is NotImplemented)
    if want is NotImplemented:
        return
    if isinstance(want, tuple):
        got, want = got[0], want[0]
    if isinstance(want, lo.LinearOperator):
        got, want = got.as_matrix(), want.as_matrix()
    assert_close(got, want)
    pinv = lo.closed_forms.pinv
    assert_close(pinv(lo.lower(E), None).as_matrix(), pinv(E, None).as_matrix())


# --- the factorised leaves ----------------------------------------------------------------------

@pytest.mark.parametrize("lower", [True, False])
def test_triangular_products_solves_and_transpose(lower):
    L = np.tril(RNG.standard_normal((5, 5))) + 3 * np.eye(5)
    M = L if lower else L.T
    junk = np.triu(np.ones((5, 5)), 1) if lower else np.tril(np.ones((5, 5)), -1)  # the other triangle: ignored
    T = lo.Triangular(jnp.asarray(M + junk), lower=lower)
    v = jnp.asarray(RNG.standard_normal(5))
    assert_close(T.as_matrix(), M)
    assert_close(T @ v, M @ v)
    assert_close(T.T @ v, M.T @ v)
    assert_close(lo.solve(T, v).value, np.linalg.solve(M, v))
    assert_close(lo.solve(T.T, v).value, np.linalg.solve(M.T, v))
    assert_close(lo.logdet(T), np.linalg.slogdet(M)[1])
    assert T.T.is_lower == (not lower)
    assert T.T.matrix is T.matrix  # a transpose reads the same array, no copy
    clean = jnp.asarray(M)
    assert lo.Triangular(clean, lower=lower, zero_other_triangle=False).matrix is clean
    with pytest.raises(ValueError, match="square"):
        lo.Triangular(jnp.ones((2, 3)))


def test_cholesky_and_lu_hold_their_factorisation():
    M = _spd(6)
    C = lo.Cholesky.of(lo.Dense(jnp.asarray(M), tags={"psd"}))
    assert_close(C.as_matrix(), M)
    assert_close(lo.diag(C), np.diag(M))
    b = jnp.asarray(RNG.standard_normal((6, 2)))
    assert_close(lo.solve(C, b).value, np.linalg.solve(M, b))
    assert_close(lo.logdet(C), np.linalg.slogdet(M)[1])
    assert "psd" in C.tags and lo.factorize(C) is C
    assert_close(lo.diag(lo.inv(C)), np.diag(np.linalg.inv(M)))        # through the inverse's own factor
    assert_close(lo.inv(C).as_matrix(), np.linalg.inv(M))
    assert_close(lo.closed_forms.inv(C).as_matrix(), np.linalg.inv(M))
    assert_close(lo.logdet(lo.closed_forms.inv(C)), -np.linalg.slogdet(M)[1])
    with pytest.raises(ValueError, match="not tagged psd"):
        lo.Cholesky.of(lo.Dense(jnp.asarray(M)))
    N = RNG.standard_normal((6, 6))
    F = lo.factorize(lo.Dense(jnp.asarray(N)))
    assert isinstance(F, lo.LU)
    assert_close(F.as_matrix(), N)
    assert_close(F.T.as_matrix(), N.T)
    assert_close(lo.solve(F, b).value, np.linalg.solve(N, b))
    assert_close(lo.solve(F.T, b).value, np.linalg.solve(N.T, b))
    assert_close(lo.logdet(F), np.linalg.slogdet(N)[1])


# --- EigenDecomposed ----------------------------------------------------------------------------

def _eigen(n, w=None):
    Q = np.linalg.qr(RNG.standard_normal((n, n)))[0]
    w = RNG.uniform(0.5, 3.0, n) if w is None else np.asarray(w)
    return lo.EigenDecomposed(lo.Dense(jnp.asarray(Q), tags={"orthogonal"}), jnp.asarray(w)), Q @ np.diag(w) @ Q.T


def test_eigen_decomposed_closed_forms_match_dense():
    E, M = _eigen(5)
    v = jnp.asarray(RNG.standard_normal(5))
    w, V = np.linalg.eigh(M)
    root = V @ np.diag(np.sqrt(w)) @ V.T
    assert_close(E @ v, M @ v)
    assert sorted(E.tags) == ["psd", "symmetric"]
    assert_close(lo.shift(E, 0.7).as_matrix(), M + 0.7 * np.eye(5))
    assert isinstance(lo.shift(E, 0.7), lo.EigenDecomposed)
    assert_close(lo.inv(E).as_matrix(), np.linalg.inv(M))
    assert_close(lo.sqrt(E).as_matrix(), root)
    assert_close(lo.sqrt(lo.inv(E)).as_matrix(), np.linalg.inv(root))      # inverse square root
    assert_close(lo.logdet(E), np.linalg.slogdet(M)[1])
    assert_close(lo.diag(E), np.diag(M))
    assert_close(lo.diag(lo.inv(E)), np.diag(np.linalg.inv(M)))
    assert_close(lo.trace(E), np.trace(M))
    assert_close(lo.eigvalsh(E), w)
    assert_close(lo.eigh(E)[0], w)
    assert_close(lo.solve(E, v).value, np.linalg.solve(M, v))
    assert_close(lo.pinv(E).as_matrix(), np.linalg.pinv(M))
    # an indefinite one: no square root, but inverse and log|det| hold
    F, N = _eigen(4, [-2.0, 1.0, 3.0, -0.5])
    assert "psd" not in F.tags
    assert_close(lo.logdet(F), np.linalg.slogdet(N)[1])
    with pytest.raises(ValueError, match="not tagged psd"):
        lo.sqrt(F)


def test_eigen_decomposed_as_kronecker_and_block_diagonal_factor():
    Ea, A = _eigen(2)
    Eb, B = _eigen(3)
    K = lo.Kronecker(Ea, Eb)
    v = jnp.asarray(RNG.standard_normal(6))
    assert_close(lo.solve(K, v).value, np.linalg.solve(np.kron(A, B), v))
    assert_close(lo.logdet(K), np.linalg.slogdet(np.kron(A, B))[1])
    assert_close(lo.diag(lo.inv(K)), np.diag(np.linalg.inv(np.kron(A, B))))
    assert_close(lo.sqrt(K).as_matrix() @ lo.sqrt(K).as_matrix(), np.kron(A, B))
    # eigen-decomposed as a whole: Q is the Kronecker product of the factors' eigenvectors
    E = lo.eigendecompose(K)
    assert isinstance(E.Q, lo.Kronecker)
    assert_close(E.as_matrix(), np.kron(A, B))
    assert_close(lo.diag(lo.inv(lo.shift(E, 2.0))), np.diag(np.linalg.inv(np.kron(A, B) + 2 * np.eye(6))))
    Bd = lo.BlockDiagonal([Ea, Eb])
    dense = np.block([[A, np.zeros((2, 3))], [np.zeros((3, 2)), B]])
    assert_close(lo.logdet(Bd), np.linalg.slogdet(dense)[1])
    assert_close(lo.inv(Bd) @ jnp.ones(5), np.linalg.solve(dense, np.ones(5)))
    assert_close(lo.diag(lo.EigenDecomposed(lo.BlockDiagonal([Ea.Q, Eb.Q]), jnp.concatenate([Ea.w, Eb.w]))),
                 np.diag(dense))


def test_eigendecompose_builds_from_structure_and_checks_its_input():
    D = lo.Diagonal(jnp.array([3.0, 1.0]))
    E = lo.eigendecompose(D)
    assert_close(E.as_matrix(), np.diag([3.0, 1.0]))
    M = _spd(3)
    E = lo.eigendecompose(lo.Dense(jnp.asarray(M), tags={"psd"}))
    assert "psd" in E.tags
    assert_close(E.as_matrix(), M)
    with pytest.raises(ValueError, match="not tagged symmetric"):
        lo.eigendecompose(lo.Dense(jnp.asarray(RNG.standard_normal((3, 3)))))
    with pytest.raises(ValueError, match="orthogonal"):
        lo.EigenDecomposed(lo.Dense(jnp.eye(2)), jnp.ones(2))
    with pytest.raises(ValueError, match="one column per eigenvalue"):
        lo.EigenDecomposed(lo.Dense(jnp.eye(2), tags={"orthogonal"}), jnp.ones(3))


# --- root ---------------------------------------------------------------------------------------

def _roots():
    M = _spd(4)
    d = RNG.uniform(0.5, 2.0, 4)
    U = np.linalg.qr(RNG.standard_normal((4, 2)))[0]
    lam = np.array([3.0, 0.5])
    dense = lo.Dense(jnp.asarray(M), tags={"psd"})
    woodbury = lo.LowRank(jnp.asarray(U), jnp.asarray(lam)) + lo.Diagonal(jnp.asarray(d))
    E, ME = _eigen(4)
    return [
        ("dense", dense, M),
        ("inverse dense", lo.inv(dense), np.linalg.inv(M)),
        ("cholesky", lo.factorize(dense), M),
        ("diagonal", lo.Diagonal(jnp.asarray(d)), np.diag(d)),
        ("diagonal + low rank", woodbury, np.diag(d) + U @ np.diag(lam) @ U.T),
        ("inverse of diagonal + low rank", lo.inv(woodbury), np.linalg.inv(np.diag(d) + U @ np.diag(lam) @ U.T)),
        ("kronecker", lo.Kronecker(dense, lo.Diagonal(jnp.asarray(d[:2]))), np.kron(M, np.diag(d[:2]))),
        ("scaled inverse", 2.0 * lo.inv(dense), 2.0 * np.linalg.inv(M)),
        ("block diagonal", lo.BlockDiagonal([lo.inv(dense), E]), np.block([[np.linalg.inv(M), np.zeros((4, 4))],
                                                                           [np.zeros((4, 4)), ME]])),
    ]


@pytest.mark.parametrize("case", _roots(), ids=lambda c: c[0])
def test_root_is_a_square_root_factor(case):
    _, A, M = case
    R = lo.root(A)
    assert R.shape[0] == M.shape[0]
    Rm = R.as_matrix()
    assert_close(Rm @ Rm.T, M)


def test_root_of_an_inverse_cholesky_is_one_triangular_solve():
    M = _spd(5)
    R = lo.root(lo.inv(lo.Dense(jnp.asarray(M), tags={"psd"})))
    z = jnp.asarray(RNG.standard_normal((5, 3)))
    assert _count(lambda u: R @ u, z, names=("cholesky", "triangular_solve")) == 1
    with pytest.raises(ValueError, match="not tagged psd"):
        lo.root(lo.Dense(jnp.asarray(M)))


@given(lst.operators(kinds=("eigen", "eigen_psd", "eigen_kronecker", "cholesky", "triangular", "lu",
                            "inverse_dense", "inverse_spd")))
def test_factorised_leaves_match_their_dense_reference(case):
    v = jnp.asarray(RNG.standard_normal(case.dense.shape[1]))
    assert_close(case.op @ v, case.dense @ v)
    assert_close(case.op.T @ v, case.dense.T @ v)
    assert_close(lo.solve(case.op, v).value, np.linalg.solve(case.dense, v), rtol=1e-6)
    assert_close(lo.logdet(case.op), np.linalg.slogdet(case.dense)[1], rtol=1e-6)
    assert_close(lo.inv(case.op) @ v, np.linalg.solve(case.dense, v), rtol=1e-6)
    if "psd" in case.op.tags:
        Rm = lo.root(case.op).as_matrix()
        assert_close(Rm @ Rm.T, case.dense, rtol=1e-6)


def test_a_sum_takes_woodbury_from_what_its_terms_declare():
    """Terms declare their Woodbury part (`lo.closed_forms.woodbury_part`): a lowered diagonal or a Lanczos factor
    counts."""
    d = RNG.uniform(1.0, 2.0, 5)
    U = RNG.standard_normal((5, 2))
    A = lo.lower(lo.Diagonal(jnp.asarray(d))) + lo.LowRank(jnp.asarray(U), jnp.array([2.0, 0.5]))
    dense = np.diag(d) + U @ np.diag([2.0, 0.5]) @ U.T
    b = jnp.asarray(RNG.standard_normal(5))
    assert_close(lo.solve(A, b).value, np.linalg.solve(dense, b))
    assert_close(lo.logdet(A), np.linalg.slogdet(dense)[1])
    with pytest.raises(ValueError, match="no closed form"):
        lo.solve(lo.Dense(jnp.asarray(dense)) + lo.LowRank(jnp.asarray(U), jnp.ones(2)), b)
