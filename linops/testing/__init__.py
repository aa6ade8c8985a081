"""Checks for your own operators: tags, transposes and agreement, by dense comparison or probes.

Operators whose sides are both at most `DENSE_MAX` are compared densely (exact); larger
ones only through random probes, so nothing large is ever materialised. Every check
takes a ``seed`` (an explicit, deterministic source of probes) and raises
`AssertionError` naming the operator and the size of the violation.

Hypothesis strategies that draw random operators and expression trees with their dense
references live in `linops.testing.strategies` (it needs the ``hypothesis`` package).

Examples:
    >>> import jax.numpy as jnp, linops as lo
    >>> from linops.testing import assert_projector
    >>> assert_projector(lo.ProjectorOp.onto_null_space(jnp.ones((1, 4))))
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from linops.algebra import _tags
from linops.algebra._arrays import describe
from linops.algebra._base import LinearOperator

DENSE_MAX = 64
"""Largest side compared densely; above it checks use `num_probes` random vectors."""


def _default_rtol(dtype) -> float:
    return 10.0 * float(np.sqrt(np.finfo(np.dtype(dtype)).eps))


def _probes(seed, n, k, dtype):
    """``k`` standard Gaussian probes of length ``n`` (complex: unit variance), drawn by NumPy from ``seed``.

    Not `jax.random`: its draw compiles one program per shape and dtype (1 s each at XLA's default optimisation
    level on 2 cores), and the checks draw probes of every shape they meet. The checks' own arithmetic (the
    dense references, norms and inner products) is NumPy's too, for the same reason: an eager `jax.numpy`
    operation compiles a program of its own; only the operator's products are JAX's."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    V = rng.standard_normal((n, k))
    if np.issubdtype(dtype, np.complexfloating):
        V = (V + 1j * rng.standard_normal((n, k))) / np.sqrt(2.0)
    return V.astype(dtype)


def _small(A) -> bool:
    return max(A.shape) <= DENSE_MAX


def _close(X, Y, rtol, atol, what, inputs=None):
    """``||X - Y|| <= atol + rtol max(||X||, ||Y||) + eps^(3/4) ||inputs||``.

    The last term admits the rounding of a product that cancels to (nearly) zero, such as
    ``v - P v`` for ``v`` in the range of ``P``; it is relative to the probes' size.
    """
    X, Y = np.asarray(X), np.asarray(Y)
    err = float(np.linalg.norm(X - Y))
    scale = max(float(np.linalg.norm(X)), float(np.linalg.norm(Y)))
    if inputs is not None:
        inputs = np.asarray(inputs)
        atol = atol + float(np.finfo(inputs.dtype).eps) ** 0.75 * float(np.linalg.norm(inputs))
    if not np.isfinite(err) or err > atol + rtol * scale:
        raise AssertionError(f"{what}: difference {err:.3e} exceeds {atol:.1e} + {rtol:.1e} * {scale:.3e}")


def _tols(A, rtol, atol):
    return (_default_rtol(A.dtype) if rtol is None else rtol), (0.0 if atol is None else atol)


def assert_operators_close(A, B, *, seed: int = 0, num_probes: int = 8, rtol=None, atol=None) -> None:
    """Assert that ``A`` and ``B`` (operators or arrays) are the same linear map.

    Compares ``A @ V`` with ``B @ V`` and ``A.T @ U`` with ``B.T @ U``: densely when both sides
    are at most `DENSE_MAX`, else on ``num_probes`` Gaussian probes.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.array([[1.0, 2.0], [3.0, 4.0]]))
        >>> assert_operators_close(A.T.T, A)
    """
    A_op = A if isinstance(A, LinearOperator) else _as_op(A)
    B_op = B if isinstance(B, LinearOperator) else _as_op(B)
    if tuple(A_op.shape) != tuple(B_op.shape):
        raise AssertionError(f"shapes differ: {describe(A_op)} vs {describe(B_op)}")
    rtol, atol = _tols(A_op, rtol, atol)
    m, n = A_op.shape
    dtype = jnp.result_type(A_op.dtype, B_op.dtype)
    if _small(A_op):
        V, U = np.eye(n, dtype=dtype), np.eye(m, dtype=dtype)
    else:
        V, U = _probes(seed, n, num_probes, dtype), _probes(seed + 1, m, num_probes, dtype)
    name = f"{describe(A_op)} vs {describe(B_op)}"
    _close(A_op @ V, B_op @ V, rtol, atol, f"{name}: products differ", V)
    _close(A_op.T @ U, B_op.T @ U, rtol, atol, f"{name}: transposed products differ", U)


def _as_op(M):
    from linops.algebra._leaves import Dense

    return Dense(jnp.asarray(M))


def assert_adjoint(A: LinearOperator, *, seed: int = 0, num_probes: int = 4, rtol=None) -> None:
    r"""Assert the adjoint identity $\langle A x, y\rangle = \langle x, A^\top y\rangle$ on probes.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> assert_adjoint(lo.Dense(jnp.ones((2, 3))))
    """
    rtol, _ = _tols(A, rtol, None)
    m, n = A.shape
    X, Y = _probes(seed, n, num_probes, A.dtype), _probes(seed + 1, m, num_probes, A.dtype)
    AX, ATY = np.asarray(A @ X), np.asarray(A.T @ Y)
    lhs = np.sum(AX * Y, axis=0)
    rhs = np.sum(X * ATY, axis=0)
    nx, ny = np.linalg.norm(X, axis=0), np.linalg.norm(Y, axis=0)
    scale = np.linalg.norm(AX, axis=0) * ny + nx * np.linalg.norm(ATY, axis=0)
    floor = float(np.finfo(np.dtype(A.dtype)).eps) ** 0.75 * nx * ny  # rounding of products that cancel
    bad = np.abs(lhs - rhs) > rtol * scale + floor
    if bad.any() or not np.isfinite(lhs).all():
        raise AssertionError(f"{describe(A)}: <Ax, y> != <x, A^T y>: {lhs} vs {rhs}")


def _square(A, what):
    if not A.is_square:
        raise AssertionError(f"{what}: {describe(A)} is not square")


def assert_symmetric(A: LinearOperator, *, seed: int = 0, num_probes: int = 8, rtol=None) -> None:
    """Assert ``A = A^T`` (densely when small, else on probes ``A v = A^T v``).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> J = lo.Dense(jnp.ones((2, 3)))
        >>> assert_symmetric(J.T @ J)
    """
    _square(A, "assert_symmetric")
    rtol, atol = _tols(A, rtol, None)
    n = A.shape[0]
    V = np.eye(n, dtype=A.dtype) if _small(A) else _probes(seed, n, num_probes, A.dtype)
    _close(A @ V, A.T @ V, rtol, atol, f"{describe(A)} is not symmetric", V)
    if _small(A):
        M = np.asarray(A @ V)
        _close(M, M.T, rtol, atol, f"{describe(A)} is not symmetric", V)


def assert_psd(A: LinearOperator, *, seed: int = 0, num_probes: int = 8, rtol=None) -> None:
    r"""Assert ``A`` is symmetric positive semi-definite.

    Small operators: the smallest eigenvalue is $\ge -(\mathrm{rtol}\cdot\max|\lambda| + \epsilon^{3/4})$.
    Large ones: $v^\top A v \ge -(\mathrm{rtol}\,\|A v\|\|v\| + \epsilon^{3/4}\|v\|^2)$ on probes (a
    necessary condition only). The $\epsilon^{3/4}$ term admits rounding relative to the probes.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> assert_psd(lo.Diagonal(jnp.array([0.0, 2.0])))
    """
    assert_symmetric(A, seed=seed, num_probes=num_probes, rtol=rtol)
    rtol, _ = _tols(A, rtol, None)
    n = A.shape[0]
    if _small(A):
        w = np.linalg.eigvalsh(np.asarray(A @ np.eye(n, dtype=A.dtype)))
        floor = float(np.finfo(np.dtype(A.dtype)).eps) ** 0.75  # rounding, relative to unit probes
        if w.min() < -(rtol * abs(w).max() + floor):
            raise AssertionError(f"{describe(A)} is not PSD: smallest eigenvalue {w.min():.3e}")
        return
    V = _probes(seed, n, num_probes, A.dtype)
    AV = np.asarray(A @ V)
    q = np.sum(V * AV, axis=0)
    nv = np.linalg.norm(V, axis=0)
    floor = float(np.finfo(np.dtype(A.dtype)).eps) ** 0.75 * nv**2
    bound = rtol * np.linalg.norm(AV, axis=0) * nv + floor
    if (q < -bound).any():
        raise AssertionError(f"{describe(A)} is not PSD: v^T A v = {q.min():.3e} on a probe")


def assert_projector(P: LinearOperator, *, seed: int = 0, num_probes: int = 8, rtol=None) -> None:
    """Assert ``P`` is an orthogonal projector: ``P = P^T`` and ``P P = P``.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> assert_projector(lo.ProjectorOp.onto_row_space(jnp.ones((1, 3))))
    """
    assert_symmetric(P, seed=seed, num_probes=num_probes, rtol=rtol)
    rtol, atol = _tols(P, rtol, None)
    n = P.shape[0]
    V = np.eye(n, dtype=P.dtype) if _small(P) else _probes(seed, n, num_probes, P.dtype)
    PV = np.asarray(P @ V)
    # A projector has norm <= 1, so the error is measured against the probes' size.
    _close(P @ PV, PV, 0.0, atol + rtol * float(np.linalg.norm(V)), f"{describe(P)} is not idempotent (P P != P)")


def assert_tags_hold(A: LinearOperator, *, seed: int = 0, num_probes: int = 8, rtol=None) -> None:
    """Assert every tag ``A`` claims holds (on probes, or densely when small).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> J = lo.Dense(jnp.array([[1.0, 2.0], [0.0, 1.0]]))
        >>> assert_tags_hold(J.T @ lo.Diagonal(jnp.array([1.0, 3.0])) @ J)
    """
    tags = A.tags
    kw = dict(seed=seed, num_probes=num_probes, rtol=rtol)
    if _tags.projector in tags:
        assert_projector(A, **kw)
    if _tags.psd in tags:
        assert_psd(A, **kw)
    elif _tags.symmetric in tags:
        assert_symmetric(A, **kw)
    rtol_, atol = _tols(A, rtol, None)
    n = A.shape[1]
    V = np.eye(n, dtype=A.dtype) if _small(A) else _probes(seed, n, num_probes, A.dtype)
    AV = np.asarray(A @ V)
    if _tags.zero in tags:
        _close(AV, np.zeros_like(AV), rtol_, atol, f"{describe(A)} is tagged zero but is not", V)
    if _tags.identity in tags:
        _close(AV, V, rtol_, atol, f"{describe(A)} is tagged identity but is not", V)
    if _tags.diagonal in tags:
        d = np.asarray(A @ np.ones(n, A.dtype))
        _close(AV, d[:, None] * V, rtol_, atol, f"{describe(A)} is tagged diagonal but is not", V)
    if _tags.orthogonal in tags:
        _close(A.T @ AV, V, rtol_, atol, f"{describe(A)} is tagged orthogonal but A^T A != I", V)


def assert_operator_matches(A: LinearOperator, dense, *, seed: int = 0, rtol=None) -> None:
    """The conformance check for a new operator: products, transposes, ``as_matrix``,
    the adjoint identity, linearity and every claimed tag, against a dense reference.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> M = jnp.array([[1.0, 2.0], [3.0, 4.0]])
        >>> assert_operator_matches(lo.Dense(M), M)
    """
    dense = np.asarray(dense)
    rtol_, atol = _tols(A, rtol, None)
    if tuple(dense.shape) != tuple(A.shape):
        raise AssertionError(f"{describe(A)} vs reference of shape {tuple(dense.shape)}")
    m, n = A.shape
    x = _probes(seed, n, 1, A.dtype)[:, 0]
    y = _probes(seed + 1, m, 1, A.dtype)[:, 0]
    X = _probes(seed + 2, n, 3, A.dtype)
    eye = np.eye(n, dtype=A.dtype)
    _close(A @ x, dense @ x, rtol_, atol, f"{describe(A)}: mv differs from the reference", x)
    _close(A @ X, dense @ X, rtol_, atol, f"{describe(A)}: mm differs from the reference", X)
    _close(A.T @ y, dense.T @ y, rtol_, atol, f"{describe(A)}: transposed mv differs from the reference", y)
    _close(A.as_matrix(), dense, rtol_, atol, f"{describe(A)}: as_matrix differs from the reference", eye)
    combined = 2.0 * np.asarray(A @ x) + np.asarray(A @ X[:, 0])
    _close(A @ (2.0 * x + X[:, 0]), combined, rtol_, atol, f"{describe(A)} is not linear", X)
    assert_adjoint(A, seed=seed, rtol=rtol)
    assert_tags_hold(A, seed=seed, rtol=rtol)


_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def count_compilations():
    """Count the XLA compilations inside a ``with`` block (`jax.monitoring`'s backend-compile events).

    Yields a list that holds each compilation's duration in seconds once the block ends: check that a
    second call of your function on new values of the same shapes compiles nothing, or that freshly
    built operators of one structure reuse one program. Run what warms up before the block; a program
    read back from a persistent compilation cache is not a compilation.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> from linops.testing import count_compilations
        >>> apply = jax.jit(lambda op, v: op @ v)
        >>> v, M = jnp.ones(3), jnp.arange(9.0).reshape(3, 3)
        >>> _ = apply(lo.Dense(jnp.eye(3)), v)          # compiles once
        >>> with count_compilations() as compiled:
        ...     _ = apply(lo.Dense(M), v)               # a fresh operator of the same structure
        >>> len(compiled)
        0
    """
    events: list[float] = []

    def listen(name, duration, **kwargs):
        if name == _COMPILE_EVENT:
            events.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


__all__ = [
    "DENSE_MAX",
    "assert_adjoint",
    "assert_operator_matches",
    "assert_operators_close",
    "assert_projector",
    "assert_psd",
    "assert_symmetric",
    "assert_tags_hold",
    "count_compilations",
]
