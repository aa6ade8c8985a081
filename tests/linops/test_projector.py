"""ProjectorOp and Complement: idempotence, symmetry, relative cut-off, matrix-free M."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import linops as lo
from linops.testing import assert_projector

from ._util import assert_close


def _wide(seed, m, n, rank=None):
    rng = np.random.default_rng(seed)
    rank = m if rank is None else rank
    return rng.standard_normal((m, rank)) @ rng.standard_normal((rank, n))


@given(st.integers(0, 2**31), st.sampled_from([(1, 4), (3, 6), (4, 6), (6, 6)]), st.integers(1, 6))
def test_projector_matches_the_pseudo_inverse_reference(seed, mn, rank):
    m, n = mn
    M = _wide(seed, m, n, min(rank, m))
    row = np.linalg.pinv(M) @ M
    P_row = lo.ProjectorOp.onto_row_space(jnp.asarray(M))
    P_null = lo.ProjectorOp.onto_null_space(jnp.asarray(M))
    assert_close(P_row.as_matrix(), row, atol=1e-8)
    assert_close(P_null.as_matrix(), np.eye(n) - row, atol=1e-8)
    assert int(P_row.rank) == np.linalg.matrix_rank(M)
    for P in (P_row, P_null):
        assert_projector(P)
        assert_close(lo.diag(P), np.diag(P.as_matrix()), atol=1e-8)
        assert_close(lo.trace(P), np.trace(P.as_matrix()), atol=1e-8)
    assert_close(M @ (P_null @ jnp.ones(n)), np.zeros(m), atol=1e-8)  # lands in ker M


@pytest.mark.parametrize("scale", [1e-150, 1e-8, 1.0, 1e8, 1e150])
def test_cut_off_is_relative_so_the_projector_is_scale_invariant(scale):
    """An absolute cut-off (the reference code's 1e-3 or 1e-7) fails at one end of this range."""
    M = _wide(0, 4, 7, rank=2)  # rank deficient: two Gram eigenvalues are rounding noise
    expected = np.linalg.pinv(M) @ M
    P = lo.ProjectorOp.onto_row_space(jnp.asarray(scale * M))
    assert int(P.rank) == 2
    assert_close(P.as_matrix(), expected, atol=1e-7)


def test_matrix_free_M_gives_the_same_projector():
    M = _wide(1, 3, 8)
    Mj = jnp.asarray(M)
    free = lo.FunctionOp(lambda v: Mj @ v, (3, 8), Mj.dtype)
    P_free = lo.ProjectorOp.onto_null_space(free)
    P_dense = lo.ProjectorOp.onto_null_space(Mj)
    assert_close(P_free.as_matrix(), P_dense.as_matrix(), atol=1e-10)
    assert_projector(P_free)


def test_projector_identities():
    M = jnp.asarray(_wide(2, 2, 5))
    P = lo.ProjectorOp.onto_row_space(M)
    v = jnp.arange(5.0)
    assert lo.pinv(P) is P and lo.sqrt(P) is P
    Q = P.complement()
    assert_close(P @ v + Q @ v, v)
    assert_close(P @ (Q @ v), np.zeros(5), atol=1e-12)
    assert Q.complement().signature() == P.signature()
    assert isinstance(lo.simplify(lo.Complement(P)), lo.ProjectorOp)
    assert_close(lo.trace(Q), 3.0)
    P2 = jax.jit(lambda p: p)(P)
    assert_projector(P2)
    assert_close(jax.jit(lambda p, v: (p @ p) @ v)(P, v), P @ v)
    # sampling from N(0, P) through sqrt(P) = P: covariance P P^T = P
    S = lo.sqrt(P)
    assert_close(S.as_matrix() @ S.as_matrix().T, P.as_matrix(), atol=1e-12)


def test_big_projector_is_checked_on_probes_only():
    """Above DENSE_MAX the testing helpers never materialise the operator."""
    M = jnp.asarray(_wide(3, 5, 300))
    P = lo.ProjectorOp.onto_null_space(M)
    assert P.shape[0] > lo.testing.DENSE_MAX
    assert_projector(P)
    bad = lo.Dense(0.5 * jnp.eye(300), tags={"projector"})  # symmetric but not idempotent
    with pytest.raises(AssertionError, match="not idempotent"):
        assert_projector(bad)


def test_projector_input_errors():
    with pytest.raises(ValueError, match="ProjectorOp: M must be a 2-D array"):
        lo.ProjectorOp.onto_row_space(jnp.ones(3))
    with pytest.raises(ValueError, match="Complement: Dense\\(2, 2\\) is not tagged projector"):
        lo.Complement(lo.Dense(jnp.eye(2)))


def test_a_wide_float32_matrix_keeps_every_row_its_gram_resolves():
    """The Gram's default cut-off is max(m, sqrt(n)) eps of its largest eigenvalue, the accuracy of those
    eigenvalues: 20 rows of 20,000 float32 columns with singular values from 1 down to 1e-2 (Gram eigenvalues
    down to 1e-4) are all kept, by the exact projector and by alternating projections. numpy's rank rule
    max(m, n) eps = 2.4e-3, applied to the Gram's eigenvalues, kept 13 and left the rest of the row space in place."""
    m, n = 20, 20_000
    rng = np.random.default_rng(21)
    U = np.linalg.qr(rng.standard_normal((m, m)))[0]
    V = np.linalg.qr(rng.standard_normal((n, m)))[0]
    M = jnp.asarray((U * np.logspace(0, -2, m)) @ V.T, jnp.float32)
    x = jnp.asarray(rng.standard_normal(n), jnp.float32)
    P = lo.ProjectorOp.onto_null_space(M)
    assert int(P.rank) == m
    A = lo.AlternatingProjectionOp.from_matrix(M, batch_size=m)
    assert int(jnp.sum(jnp.any(A.W[0] != 0, axis=1))) == m
    for op in (P, A):  # the rows with the smallest singular values are projected out too
        assert float(jnp.linalg.norm(M @ (op @ x)) / jnp.linalg.norm(M @ x)) < 1e-3
