"""Woodbury and the determinant lemma on every kind of diagonal-plus-low-rank sum, against dense references, with
no term that vanishes (each case has a non-scalar or negative diagonal, several terms, scales and asymmetric
factors), so that a wrong capacitance or a dropped term changes the checked value."""

import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo

from ._util import assert_close


def _case(name, rng):
    n = 7
    U1, V1, d1 = rng.standard_normal((n, 2)), rng.standard_normal((n, 2)), rng.uniform(0.5, 2.0, 2)
    U2, d2 = rng.standard_normal((n, 3)), rng.uniform(-0.4, 1.5, 3)
    D = rng.uniform(0.5, 3.0, n) * np.where(np.arange(n) % 3 == 0, -1.0, 1.0)
    if name == "vector diagonal, asymmetric term":
        op = lo.Diagonal(jnp.asarray(D)) + lo.LowRank(jnp.asarray(U1), jnp.asarray(d1), jnp.asarray(V1))
        dense = np.diag(D) + U1 @ np.diag(d1) @ V1.T
    elif name == "scaled identity, two scaled terms":
        op = (2.5 * lo.Identity(n) + 0.7 * lo.LowRank(jnp.asarray(U1), jnp.asarray(d1), jnp.asarray(V1))
              - 0.3 * lo.LowRank(jnp.asarray(U2), jnp.asarray(d2)))
        dense = 2.5 * np.eye(n) + 0.7 * U1 @ np.diag(d1) @ V1.T - 0.3 * U2 @ np.diag(d2) @ U2.T
    elif name == "negative scalar diagonal, orthonormal term":
        Q = np.linalg.qr(rng.standard_normal((n, 3)))[0]
        op = lo.shift(lo.LowRank(jnp.asarray(Q), jnp.asarray(d2 + 3.0), orthonormal=True), -1.5)
        dense = Q @ np.diag(d2 + 3.0) @ Q.T - 1.5 * np.eye(n)
    else:  # a Kronecker product plus low rank: Woodbury around the Kronecker solve
        A = rng.standard_normal((2, 2)) + 3 * np.eye(2)
        B = rng.standard_normal((4, 4)) + 4 * np.eye(4)
        U, d = rng.standard_normal((8, 2)), rng.uniform(0.5, 1.5, 2)
        op = lo.Kronecker(lo.factorize(lo.Dense(jnp.asarray(A))), lo.factorize(lo.Dense(jnp.asarray(B)))) + \
            lo.LowRank(jnp.asarray(U), jnp.asarray(d))
        dense = np.kron(A, B) + U @ np.diag(d) @ U.T
    return op, dense


CASES = ["vector diagonal, asymmetric term", "scaled identity, two scaled terms",
         "negative scalar diagonal, orthonormal term", "Kronecker plus low rank"]


@pytest.mark.parametrize("name", CASES)
def test_woodbury_solve_and_determinant_lemma_match_the_dense_matrix(name):
    rng = np.random.default_rng(CASES.index(name))
    op, dense = _case(name, rng)
    assert lo.closed_forms.logdet(op) is not NotImplemented  # in closed form, not densely
    assert_close(lo.logdet(op), np.linalg.slogdet(dense)[1], rtol=1e-9)
    b = rng.standard_normal((dense.shape[0], 2))
    assert_close(lo.solve(op, jnp.asarray(b)).value, np.linalg.solve(dense, b), rtol=1e-8)
    assert_close(lo.inv(op) @ jnp.asarray(b[:, 0]), np.linalg.solve(dense, b[:, 0]), rtol=1e-8)
