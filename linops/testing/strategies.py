"""Hypothesis strategies drawing random operators and expression trees with dense references.

Every strategy draws a `Case`: the operator and its dense ``numpy`` reference. Sizes come
from the small set `SIZES` so that jitted code does not recompile for every example.
Values are drawn from a seeded NumPy generator (Hypothesis draws and shrinks the seed).
Draw in float64 (``jax.config.update("jax_enable_x64", True)`` in your test session) to
check algebra to tight tolerances.

Example:
    >>> from hypothesis import given, settings
    >>> import numpy as np
    >>> from linops.testing import strategies as lst
    >>> @settings(max_examples=5, deadline=None)
    ... @given(lst.expressions(dtype="float32"))
    ... def test_matches(case):
    ...     np.testing.assert_allclose(case.op.as_matrix(), case.dense, rtol=1e-3, atol=1e-3)
    >>> test_matches()
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

import linops as lo

SIZES = (1, 2, 3, 4, 6)
"""Operator sizes drawn by default."""


class Case(NamedTuple):
    """An operator and its dense reference."""

    op: lo.LinearOperator
    dense: np.ndarray


def _rng(draw) -> np.random.Generator:
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


def _arr(x, dtype):
    return jnp.asarray(np.asarray(x, dtype=dtype))


def _spd(rng, n):
    A = rng.standard_normal((n, n))
    return A @ A.T / n + 0.5 * np.eye(n)


def _orthonormal(rng, n, k):
    return np.linalg.qr(rng.standard_normal((n, k)))[0]


@st.composite
def rectangular(draw, m: int, n: int, dtype=np.float64) -> Case:
    """A random ``(m, n)`` leaf: dense, low rank, zero, a transposed dense, or a restriction.

    Example:
        >>> from hypothesis import given, settings
        >>> from linops.testing import assert_operator_matches, strategies as lst
        >>> @settings(max_examples=3, deadline=None)
        ... @given(lst.rectangular(2, 3, dtype="float32"))
        ... def test_leaf(case):
        ...     assert_operator_matches(case.op, case.dense, rtol=1e-3)
        >>> test_leaf()
    """
    rng = _rng(draw)
    kinds = ["dense", "lowrank", "zero", "transposed"] + (["selection"] if m <= n else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "dense":
        M = rng.standard_normal((m, n))
        return Case(lo.Dense(_arr(M, dtype)), M)
    if kind == "transposed":
        M = rng.standard_normal((n, m))
        return Case(lo.Dense(_arr(M, dtype)).T, M.T)
    if kind == "lowrank":
        k = draw(st.integers(1, max(1, min(m, n))))
        U, d, V = rng.standard_normal((m, k)), rng.standard_normal(k), rng.standard_normal((n, k))
        return Case(lo.LowRank(_arr(U, dtype), _arr(d, dtype), _arr(V, dtype)), U @ np.diag(d) @ V.T)
    if kind == "zero":
        return Case(lo.Zero(m, n, dtype=dtype), np.zeros((m, n)))
    idx = np.sort(rng.choice(n, size=m, replace=False)) if draw(st.booleans()) else rng.choice(n, size=m, replace=False)
    dense = np.zeros((m, n))
    dense[np.arange(m), idx] = 1.0
    return Case(lo.Selection(jnp.asarray(idx), n, dtype=dtype), dense)


SQUARE_KINDS = (
    "dense", "dense_psd", "dense_symmetric", "diagonal", "diagonal_positive", "identity", "zero",
    "lowrank", "lowrank_orthonormal", "lowrank_general", "function", "block_diagonal", "kronecker",
    "projector_row", "projector_null", "complement", "mask", "permutation", "inverse_spd", "lineax",
    "eigen", "eigen_psd", "eigen_kronecker", "cholesky", "triangular", "lu", "inverse_dense",
)


@st.composite
def operators(draw, n: int | None = None, dtype=np.float64, kinds=SQUARE_KINDS) -> Case:
    """A random square leaf (or small structured composite) of size ``n``, with its reference.

    ``kinds`` restricts the draw to some of `SQUARE_KINDS`.

    Example:
        >>> from hypothesis import given, settings
        >>> from linops.testing import assert_tags_hold, strategies as lst
        >>> @settings(max_examples=3, deadline=None)
        ... @given(lst.operators(4, dtype="float32", kinds=("diagonal_positive", "dense_psd")))
        ... def test_tags(case):
        ...     assert_tags_hold(case.op, rtol=1e-3)
        >>> test_tags()
    """
    n = draw(st.sampled_from(SIZES)) if n is None else n
    rng = _rng(draw)
    allowed = [k for k in kinds if not (k in ("kronecker", "eigen_kronecker") and n not in (4, 6))]
    allowed = [k for k in allowed if not (k in ("block_diagonal", "mask") and n < 2)]
    kind = draw(st.sampled_from(allowed))
    a = lambda x: _arr(x, dtype)  # noqa: E731
    if kind == "dense":
        M = rng.standard_normal((n, n))
        return Case(lo.Dense(a(M)), M)
    if kind == "dense_psd":
        M = _spd(rng, n)
        return Case(lo.Dense(a(M), tags={"psd"}), M)
    if kind == "dense_symmetric":
        M = rng.standard_normal((n, n))
        M = M + M.T
        return Case(lo.Dense(a(M), tags={"symmetric"}), M)
    if kind in ("diagonal", "diagonal_positive"):
        d = rng.standard_normal(n)
        d = np.abs(d) + 0.1 if kind == "diagonal_positive" else d
        return Case(lo.Diagonal(a(d)), np.diag(d))
    if kind == "identity":
        return Case(lo.Identity(n, dtype), np.eye(n))
    if kind == "zero":
        return Case(lo.Zero(n, dtype=dtype), np.zeros((n, n)))
    if kind == "lowrank":
        k = draw(st.integers(1, n))
        U, d = rng.standard_normal((n, k)), rng.standard_normal(k)
        return Case(lo.LowRank(a(U), a(d)), U @ np.diag(d) @ U.T)
    if kind == "lowrank_orthonormal":
        k = draw(st.integers(1, n))
        U, d = _orthonormal(rng, n, k), np.abs(rng.standard_normal(k))
        return Case(lo.LowRank(a(U), a(d), orthonormal=True), U @ np.diag(d) @ U.T)
    if kind == "lowrank_general":
        k = draw(st.integers(1, n))
        U, d, V = rng.standard_normal((n, k)), rng.standard_normal(k), rng.standard_normal((n, k))
        return Case(lo.LowRank(a(U), a(d), a(V)), U @ np.diag(d) @ V.T)
    if kind == "function":
        M = rng.standard_normal((n, n))
        Mj = a(M)
        return Case(lo.FunctionOp(lambda v: Mj @ v, (n, n), Mj.dtype), M)
    if kind == "block_diagonal":
        split = draw(st.integers(1, n - 1))
        left = draw(operators(split, dtype, kinds=_SIMPLE))
        right = draw(operators(n - split, dtype, kinds=_SIMPLE))
        dense = np.zeros((n, n))
        dense[:split, :split], dense[split:, split:] = left.dense, right.dense
        return Case(lo.BlockDiagonal([left.op, right.op]), dense)
    if kind == "kronecker":
        na = 2
        left = draw(operators(na, dtype, kinds=_SIMPLE))
        right = draw(operators(n // na, dtype, kinds=_SIMPLE))
        return Case(lo.Kronecker(left.op, right.op), np.kron(left.dense, right.dense))
    if kind in ("projector_row", "projector_null", "complement"):
        k = draw(st.integers(1, n))
        M = rng.standard_normal((k, n))
        if k >= 2 and draw(st.booleans()):
            M[-1] = M[0] * 2.0  # rank deficient: the relative cut-off must catch it
        row = np.linalg.pinv(M) @ M
        if kind == "projector_row":
            return Case(lo.ProjectorOp.onto_row_space(a(M)), row)
        if kind == "projector_null":
            return Case(lo.ProjectorOp.onto_null_space(a(M)), np.eye(n) - row)
        return Case(lo.Complement(lo.Dense(a(row), tags={"projector"})), np.eye(n) - row)
    if kind == "mask":
        k = draw(st.integers(1, n - 1))
        idx = rng.choice(n, size=k, replace=False)
        S = lo.Selection(jnp.asarray(idx), n, dtype=dtype)
        dense = np.zeros((n, n))
        dense[idx, idx] = 1.0
        return Case(S.T @ S, dense)
    if kind == "permutation":
        perm = rng.permutation(n)
        return Case(lo.Selection(jnp.asarray(perm), n, dtype=dtype), np.eye(n)[perm])
    if kind == "lineax":
        import lineax as lx

        M = rng.standard_normal((n, n))
        Mj = a(M)
        return Case(lo.from_lineax(lx.FunctionLinearOperator(lambda v: Mj @ v, Mj[0])), M)
    if kind in ("eigen", "eigen_psd"):
        Q = _orthonormal(rng, n, n)
        w = rng.standard_normal(n)
        w = np.abs(w) + 0.1 if kind == "eigen_psd" else w
        return Case(lo.EigenDecomposed(lo.Dense(a(Q), tags={"orthogonal"}), a(w)), Q @ np.diag(w) @ Q.T)
    if kind == "eigen_kronecker":
        left = draw(operators(2, dtype, kinds=("eigen_psd",)))
        right = draw(operators(n // 2, dtype, kinds=("eigen_psd", "dense_psd")))
        E = lo.eigendecompose(lo.Kronecker(left.op, lo.eigendecompose(right.op)))
        return Case(E, np.kron(left.dense, right.dense))
    if kind == "cholesky":
        M = _spd(rng, n)
        return Case(lo.Cholesky(a(np.linalg.cholesky(M))), M)
    if kind == "triangular":
        L = np.tril(rng.standard_normal((n, n))) + 2.0 * np.eye(n)
        lower = draw(st.booleans())
        M = L if lower else L.T
        return Case(lo.Triangular(a(M), lower=lower), M)
    if kind in ("lu", "inverse_dense"):
        M = rng.standard_normal((n, n)) + 3.0 * np.eye(n)
        if kind == "lu":
            return Case(lo.factorize(lo.Dense(a(M))), M)
        return Case(lo.inv(lo.Dense(a(M))), np.linalg.inv(M))
    assert kind == "inverse_spd"
    M = _spd(rng, n)
    return Case(lo.inv(lo.Dense(a(M), tags={"psd"})), np.linalg.inv(M))


_SIMPLE = ("dense", "dense_psd", "diagonal", "diagonal_positive", "identity", "lowrank_orthonormal", "eigen_psd",
           "cholesky", "triangular")


@st.composite
def expressions(draw, n: int | None = None, max_depth: int = 3, dtype=np.float64) -> Case:
    """A random expression tree of square size ``n`` over every leaf and composite.

    Nodes: sums, differences, products, scalings, transposes, declared shifts, congruences
    ``R^T M R`` through rectangular factors, and the leaves of `operators`.

    Example:
        >>> from hypothesis import given, settings
        >>> import linops as lo
        >>> from linops.testing import assert_operators_close, strategies as lst
        >>> @settings(max_examples=3, deadline=None)
        ... @given(lst.expressions(n=3, max_depth=2, dtype="float32"))
        ... def test_simplify_is_sound(case):
        ...     assert_operators_close(lo.simplify(case.op), case.op, rtol=1e-3)
        >>> test_simplify_is_sound()
    """
    n = draw(st.sampled_from(SIZES)) if n is None else n
    depth = draw(st.integers(0, max_depth))
    return draw(_tree(n, depth, dtype))


@st.composite
def _tree(draw, n, depth, dtype):
    if depth == 0:
        return draw(operators(n, dtype))
    node = draw(st.sampled_from(["sum", "difference", "product", "scaled", "transpose", "shift", "congruence"]))
    sub = lambda: draw(_tree(n, depth - 1, dtype))  # noqa: E731
    if node == "sum":
        a, b = sub(), sub()
        return Case(a.op + b.op, a.dense + b.dense)
    if node == "difference":
        a, b = sub(), sub()
        return Case(a.op - b.op, a.dense - b.dense)
    if node == "product":
        a, b = sub(), sub()
        return Case(a.op @ b.op, a.dense @ b.dense)
    if node == "scaled":
        a = sub()
        c = draw(st.sampled_from([-2.0, -1.0, 0.5, 1.0, 3.0]))
        return Case(c * a.op, c * a.dense)
    if node == "transpose":
        a = sub()
        return Case(a.op.T, a.dense.T)
    if node == "shift":
        a = sub()
        c = draw(st.sampled_from([0.0, 0.1, 2.0]))
        return Case(lo.shift(a.op, c), a.dense + c * np.eye(n))
    k = draw(st.sampled_from(SIZES))
    R = draw(rectangular(k, n, dtype))
    M = draw(_tree(k, depth - 1, dtype))
    return Case(R.op.T @ M.op @ R.op, R.dense.T @ M.dense @ R.dense)


__all__ = ["Case", "SIZES", "SQUARE_KINDS", "expressions", "operators", "rectangular"]
