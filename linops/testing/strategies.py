"""Hypothesis strategies drawing random operators and expression trees with dense references.

Every strategy draws a `Case`: the operator and its dense ``numpy`` reference. Sizes come
from the small set `SIZES` so that jitted code does not recompile for every example.
Values are drawn from a seeded NumPy generator (Hypothesis draws and shrinks the seed).
Draw in float64 (``jax.config.update("jax_enable_x64", True)`` in your test session) to
check algebra to tight tolerances.

Examples:
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

from collections.abc import Callable, Sequence
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

    Examples:
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


Builder = Callable[..., Case]
"""``builder(draw, rng, n, dtype, kind) -> Case``: one kind of random square operator of size ``n``."""

_KINDS: dict[str, tuple[Builder, Callable[[int], bool]]] = {}


def register_kind(name: str, builder: Builder, *, sizes: Callable[[int], bool] = lambda n: True) -> None:
    """Add a kind of square operator to `operators` (and so to `expressions`), for the sizes ``sizes`` accepts.

    ``builder(draw, rng, n, dtype, kind)`` returns a `Case`: draw sub-operators with ``draw(operators(...))`` and
    values from the NumPy generator ``rng``. Registering your own operator here puts it under every property
    test that draws from these strategies.

    Examples:
        >>> import numpy as np, linops as lo
        >>> from linops.testing import strategies as lst
        >>> def scaled_identity(draw, rng, n, dtype, kind):
        ...     c = float(rng.uniform(0.5, 2.0))
        ...     return lst.Case(c * lo.Identity(n, dtype), c * np.eye(n))
        >>> lst.register_kind("scaled_identity", scaled_identity)
        >>> "scaled_identity" in lst.kinds()
        True
    """
    _KINDS[name] = (builder, sizes)


def kinds() -> tuple[str, ...]:
    """Every registered kind, built-in (`SQUARE_KINDS`) and yours, in registration order.

    Examples:
        >>> from linops.testing import strategies as lst
        >>> set(lst.SQUARE_KINDS) <= set(lst.kinds()), "cholesky" in lst.kinds()
        (True, True)
    """
    return tuple(_KINDS)


def _kind(*names, sizes=lambda n: True):
    def add(builder):
        for name in names:
            register_kind(name, builder, sizes=sizes)
        return builder

    return add


@st.composite
def operators(draw, n: int | None = None, dtype=np.float64, kinds: Sequence[str] | None = None) -> Case:
    """A random square leaf (or small structured composite) of size ``n``, with its reference.

    ``kinds`` restricts the draw to some of the registered kinds (default: all of them, `kinds()`;
    `register_kind` adds one).

    Examples:
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
    allowed = [k for k in (tuple(_KINDS) if kinds is None else kinds) if _KINDS[k][1](n)]
    kind = draw(st.sampled_from(allowed))
    return _KINDS[kind][0](draw, rng, n, dtype, kind)


@_kind("dense")
def _dense(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    M = rng.standard_normal((n, n))
    return Case(lo.Dense(a(M)), M)


@_kind("dense_psd")
def _dense_psd(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    M = _spd(rng, n)
    return Case(lo.Dense(a(M), tags={"psd"}), M)


@_kind("dense_symmetric")
def _dense_symmetric(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    M = rng.standard_normal((n, n))
    M = M + M.T
    return Case(lo.Dense(a(M), tags={"symmetric"}), M)


@_kind("diagonal", "diagonal_positive")
def _diagonal(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    d = rng.standard_normal(n)
    d = np.abs(d) + 0.1 if kind == "diagonal_positive" else d
    return Case(lo.Diagonal(a(d)), np.diag(d))


@_kind("circulant", "circulant_psd")
def _circulant(draw, rng, n, dtype, kind):
    if kind == "circulant_psd":  # a symmetric, positive spectrum (lambda_k = lambda_{n-k}) gives a real SPD c
        w = rng.uniform(0.2, 2.0, n)
        c = np.fft.ifft((w + w[(-np.arange(n)) % n]) / 2).real
    else:
        c = rng.standard_normal(n)
    M = c[(np.arange(n)[:, None] - np.arange(n)[None, :]) % n]
    return Case(lo.Circulant(_arr(c, dtype), tags={"psd"} if kind == "circulant_psd" else ()), M)


@_kind("identity")
def _identity(draw, rng, n, dtype, kind):
    return Case(lo.Identity(n, dtype), np.eye(n))


@_kind("zero")
def _zero(draw, rng, n, dtype, kind):
    return Case(lo.Zero(n, dtype=dtype), np.zeros((n, n)))


@_kind("lowrank")
def _lowrank(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    k = draw(st.integers(1, n))
    U, d = rng.standard_normal((n, k)), rng.standard_normal(k)
    return Case(lo.LowRank(a(U), a(d)), U @ np.diag(d) @ U.T)


@_kind("lowrank_orthonormal")
def _lowrank_orthonormal(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    k = draw(st.integers(1, n))
    U, d = _orthonormal(rng, n, k), np.abs(rng.standard_normal(k))
    return Case(lo.LowRank(a(U), a(d), orthonormal=True), U @ np.diag(d) @ U.T)


@_kind("lowrank_general")
def _lowrank_general(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    k = draw(st.integers(1, n))
    U, d, V = rng.standard_normal((n, k)), rng.standard_normal(k), rng.standard_normal((n, k))
    return Case(lo.LowRank(a(U), a(d), a(V)), U @ np.diag(d) @ V.T)


@_kind("function")
def _function(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    M = rng.standard_normal((n, n))
    Mj = a(M)
    return Case(lo.FunctionOp(lambda v: Mj @ v, (n, n), Mj.dtype), M)


@_kind("block_diagonal", sizes=lambda n: n >= 2)
def _block_diagonal(draw, rng, n, dtype, kind):
    split = draw(st.integers(1, n - 1))
    left = draw(operators(split, dtype, kinds=_SIMPLE))
    right = draw(operators(n - split, dtype, kinds=_SIMPLE))
    dense = np.zeros((n, n))
    dense[:split, :split], dense[split:, split:] = left.dense, right.dense
    return Case(lo.BlockDiagonal([left.op, right.op]), dense)


@_kind("kronecker", sizes=lambda n: n in (4, 6))
def _kronecker(draw, rng, n, dtype, kind):
    na = 2
    left = draw(operators(na, dtype, kinds=_SIMPLE))
    right = draw(operators(n // na, dtype, kinds=_SIMPLE))
    return Case(lo.Kronecker(left.op, right.op), np.kron(left.dense, right.dense))


@_kind("projector_row", "projector_null", "complement")
def _projector_row(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
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


@_kind("mask", sizes=lambda n: n >= 2)
def _mask(draw, rng, n, dtype, kind):
    k = draw(st.integers(1, n - 1))
    idx = rng.choice(n, size=k, replace=False)
    S = lo.Selection(jnp.asarray(idx), n, dtype=dtype)
    dense = np.zeros((n, n))
    dense[idx, idx] = 1.0
    return Case(S.T @ S, dense)


@_kind("permutation")
def _permutation(draw, rng, n, dtype, kind):
    perm = rng.permutation(n)
    return Case(lo.Selection(jnp.asarray(perm), n, dtype=dtype), np.eye(n)[perm])


@_kind("lineax")
def _lineax(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    import lineax as lx

    M = rng.standard_normal((n, n))
    Mj = a(M)
    return Case(lo.from_lineax(lx.FunctionLinearOperator(lambda v: Mj @ v, Mj[0])), M)


@_kind("eigen", "eigen_psd")
def _eigen(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    Q = _orthonormal(rng, n, n)
    w = rng.standard_normal(n)
    w = np.abs(w) + 0.1 if kind == "eigen_psd" else w
    return Case(lo.EigenDecomposed(lo.Dense(a(Q), tags={"orthogonal"}), a(w)), Q @ np.diag(w) @ Q.T)


@_kind("eigen_kronecker", sizes=lambda n: n in (4, 6))
def _eigen_kronecker(draw, rng, n, dtype, kind):
    left = draw(operators(2, dtype, kinds=("eigen_psd",)))
    right = draw(operators(n // 2, dtype, kinds=("eigen_psd", "dense_psd")))
    E = lo.eigendecompose(lo.Kronecker(left.op, lo.eigendecompose(right.op)))
    return Case(E, np.kron(left.dense, right.dense))


@_kind("cholesky")
def _cholesky(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    M = _spd(rng, n)
    return Case(lo.Cholesky(a(np.linalg.cholesky(M))), M)


@_kind("triangular")
def _triangular(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    L = np.tril(rng.standard_normal((n, n))) + 2.0 * np.eye(n)
    lower = draw(st.booleans())
    M = L if lower else L.T
    return Case(lo.Triangular(a(M), lower=lower), M)


@_kind("lu", "inverse_dense")
def _lu(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    M = rng.standard_normal((n, n)) + 3.0 * np.eye(n)
    if kind == "lu":
        return Case(lo.factorize(lo.Dense(a(M))), M)
    return Case(lo.inv(lo.Dense(a(M))), np.linalg.inv(M))


@_kind("inverse_spd")
def _inverse_spd(draw, rng, n, dtype, kind):
    a = lambda x: _arr(x, dtype)  # noqa: E731
    M = _spd(rng, n)
    return Case(lo.inv(lo.Dense(a(M), tags={"psd"})), np.linalg.inv(M))


SQUARE_KINDS = tuple(_KINDS)
"""The built-in kinds `operators` draws."""

_SIMPLE = ("dense", "dense_psd", "diagonal", "diagonal_positive", "identity", "lowrank_orthonormal", "eigen_psd",
           "cholesky", "triangular")


@st.composite
def expressions(draw, n: int | None = None, max_depth: int = 3, dtype=np.float64) -> Case:
    """A random expression tree of square size ``n`` over every leaf and composite.

    Nodes: sums, differences, products, scalings, transposes, declared shifts, congruences
    ``R^T M R`` through rectangular factors, and the leaves of `operators`.

    Examples:
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


__all__ = ["Builder", "Case", "SIZES", "SQUARE_KINDS", "expressions", "kinds", "operators", "rectangular",
           "register_kind"]
