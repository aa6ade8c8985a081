"""Functions on operators: solve, inv, pinv, sqrt, diag, trace, logdet, eigh, hutchinson.

Each dispatches to the operator's closed form. Where none exists the call raises and
names the explicit alternatives (``method="cg"``, ``"exact"``, ``"hutchinson"``,
``"dense"``); nothing is ever densified unless ``method="dense"`` asks for it.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Inexact, Int, PRNGKeyArray

from linops import _tags
from linops._base import LinearOperator, check_square, describe
from linops._cg import cg, cg_many
from linops._composite import Inverse
from linops._leaves import Dense, check_vector


def _check_op(A, what):
    if not isinstance(A, LinearOperator):
        raise TypeError(f"{what}: expected a linops.LinearOperator, got {type(A).__name__}")


def _closed_form(result, A, what, alternatives):
    """``result`` of a structure hook, or the error naming the explicit alternatives."""
    if result is NotImplemented:
        raise ValueError(f"{what}: {describe(A)} has no closed form here; choose a method explicitly: {alternatives}")
    return result


def _check_method(what, method, allowed):
    if method not in allowed:
        raise ValueError(f"{what}: unknown method {method!r}; expected one of {allowed}")


class Solution(eqx.Module):
    """The result of `linops.solve`.

    Attributes:
        value: the solution ``x``, shaped like ``b``.
        converged: whether the stopping rule was met (always True for direct methods).
        num_steps: iterations taken (0 for direct methods); one per column of ``b``.
        residual_norm: ``||b - A x||`` as the iteration measured it (NaN for direct methods).
    """

    value: Inexact[Array, " n *k"]
    converged: Bool[Array, " *k"]
    num_steps: Int[Array, " *k"]
    residual_norm: Inexact[Array, " *k"]


def _direct(x):
    k = () if x.ndim == 1 else (x.shape[1],)
    return Solution(x, jnp.ones(k, bool), jnp.zeros(k, jnp.int32), jnp.full(k, jnp.nan, x.dtype))


def solve(
    A: LinearOperator,
    b: Inexact[ArrayLike, " n *k"],
    *,
    method: str | None = None,
    rtol: float | None = None,
    atol: float = 0.0,
    maxiter: int | None = None,
    preconditioner: LinearOperator | None = None,
    x0: Inexact[ArrayLike, " n *k"] | None = None,
) -> Solution:
    r"""Solve $A x = b$ for ``b`` of shape ``(n,)`` or ``(n, k)``.

    Args:
        A: a square operator.
        b: the right-hand side.
        method: ``None`` uses the closed form of ``A``'s structure (diagonal, Kronecker,
            block diagonal, diagonal/identity + low rank by Woodbury, products of those,
            dense by LU or Cholesky); ``"cg"`` runs conjugate gradients (``A`` must be
            tagged ``psd``); ``"dense"`` materialises ``A`` (``n`` products) and uses LU.
        rtol: CG's relative tolerance: it stops at ``||r|| <= max(rtol ||b||, atol)``;
            default ``sqrt(eps)`` of the dtype.
        atol: CG's absolute tolerance (default 0).
        maxiter: CG iteration cap (default ``10 n``).
        preconditioner: an operator approximating ``A^{-1}`` (for example
            ``lo.inv(lo.Diagonal(lo.diag(A)))``).
        x0: CG starting point.

    Returns:
        A `Solution` with the value and the convergence information.

    Raises:
        ValueError: ``A`` is not square, ``b`` has the wrong shape, or ``A`` has no
            closed form and no method was chosen.

    Example:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Diagonal(jnp.array([2.0, 4.0]))
        >>> lo.solve(A, jnp.array([2.0, 2.0])).value
        Array([1. , 0.5], dtype=float32)
    """
    _check_op(A, "solve")
    check_square(A, "solve")
    _check_method("solve", method, (None, "cg", "dense"))
    b = check_vector(A, b, "solve", A.shape[0])
    if method is None:
        return _direct(_closed_form(A._solve(b), A, "solve", "method='cg' (A tagged psd) or method='dense'"))
    if method == "dense":
        M = A.as_matrix()
        return _direct(jnp.linalg.solve(M, b if b.ndim == 2 else b[:, None]).reshape(b.shape))
    if _tags.psd not in A.tags:
        raise ValueError(
            f"solve(method='cg'): {describe(A)} is not tagged psd (its tags: {sorted(A.tags)}); "
            "CG needs a symmetric positive definite operator. Declare it (e.g. "
            "lo.Dense(M, tags={'psd'}) or lo.shift(G, lam, nonnegative=True)) or use method='dense'"
        )
    dtype = jnp.result_type(A.dtype, b.dtype)
    b = b.astype(dtype)
    options: dict[str, Any] = dict(
        rtol=float(np.sqrt(np.finfo(dtype).eps)) if rtol is None else rtol,  # NumPy: static under jit
        atol=atol,
        maxiter=10 * A.shape[0] if maxiter is None else maxiter,
        precondition=None if preconditioner is None else preconditioner.mv,
    )
    if b.ndim == 1:
        x, conv, steps, res = cg(A.mv, b, x0=x0, **options)
    else:
        x, conv, steps, res = cg_many(A.mv, b, x0=x0, **options)
    return Solution(x, conv, steps, res)


def inv(A: LinearOperator, *, method: str | None = None, **options) -> LinearOperator:
    r"""The lazy inverse $A^{-1}$: nothing is computed until it is applied.

    ``method`` and ``options`` are passed to `linops.solve` at each product.
    `linops.simplify` rewrites ``inv(A) @ A`` to the identity.

    Example:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Diagonal(jnp.array([2.0, 4.0]))
        >>> lo.inv(A) @ jnp.ones(2)
        Array([0.5 , 0.25], dtype=float32)
    """
    _check_op(A, "inv")
    check_square(A, "inv")
    _check_method("inv", method, (None, "cg", "dense"))
    if method == "cg" and _tags.psd not in A.tags:
        raise ValueError(f"inv(method='cg'): {describe(A)} is not tagged psd")
    if isinstance(A, Inverse):
        return A.op
    return Inverse(A, method, tuple(sorted(options.items())))


def pinv(A: LinearOperator, *, rtol: float | None = None, method: str | None = None) -> LinearOperator:
    r"""The Moore-Penrose pseudo-inverse, with a RELATIVE cut-off.

    Singular values below ``rtol * max singular value`` count as zero
    (default ``rtol = max(m, n) * eps``). A projector is its own pseudo-inverse.

    Example:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.pinv(lo.Diagonal(jnp.array([2.0, 0.0]))) @ jnp.ones(2)
        Array([0.5, 0. ], dtype=float32)
    """
    _check_op(A, "pinv")
    _check_method("pinv", method, (None, "dense"))
    if _tags.projector in A.tags:
        return A
    if method is None:
        return _closed_form(A._pinv(rtol), A, "pinv", "method='dense'")
    return Dense(A.as_matrix(), tags=A.tags & {_tags.symmetric})._pinv(rtol)


def sqrt(A: LinearOperator, *, method: str | None = None) -> LinearOperator:
    r"""The principal square root $S = S^\top \succeq 0$ with $S S = A$, for a PSD ``A``.

    Use it to sample: if $\varepsilon \sim \mathcal N(0, I)$ then $S\varepsilon \sim \mathcal N(0, A)$.
    A projector is its own square root.

    Example:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.sqrt(4.0 * lo.Identity(2)) @ jnp.ones(2)
        Array([2., 2.], dtype=float32)
    """
    _check_op(A, "sqrt")
    check_square(A, "sqrt")
    _check_method("sqrt", method, (None, "dense"))
    if _tags.psd not in A.tags:
        raise ValueError(
            f"sqrt: {describe(A)} is not tagged psd (its tags: {sorted(A.tags)}); the principal "
            "square root is defined here for PSD operators only"
        )
    if _tags.projector in A.tags:
        return A
    if method is None:
        return _closed_form(A._sqrt(), A, "sqrt", "method='dense'")
    return Dense(A.as_matrix(), tags={_tags.psd})._sqrt()


def _basis_probe(A, fn, chunk):
    """Apply ``fn(A, E)`` to blocks ``E`` of the identity's columns: O(n * chunk) memory."""
    n = A.shape[1]
    chunk = min(chunk, n)
    starts = jnp.arange(0, n, chunk)

    def block(start):
        cols = start + jnp.arange(chunk)
        E = (jnp.arange(n)[:, None] == cols[None, :]).astype(A.dtype)
        return fn(A, E, cols)

    out = jax.lax.map(block, starts)  # (num_blocks, chunk)
    return out.reshape(-1)[:n]


def diag(
    A: LinearOperator,
    *,
    method: str | None = None,
    key: PRNGKeyArray | None = None,
    num_samples: int = 64,
    chunk: int = 32,
) -> Inexact[Array, " n"]:
    r"""The diagonal of ``A``.

    Args:
        method: ``None`` for the closed form; ``"exact"`` probes with the ``n`` unit vectors in
            blocks of ``chunk`` (``n`` products, ``O(n * chunk)`` memory); ``"hutchinson"``
            gives the unbiased estimate $\mathbb E[z \odot A z]$ with Rademacher ``z``
            (needs ``key``).

    Example:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.array([[1.0, 2.0], [3.0, 4.0]]))
        >>> lo.diag(A @ A, method="exact")
        Array([ 7., 22.], dtype=float32)
    """
    _check_op(A, "diag")
    _check_method("diag", method, (None, "exact", "hutchinson"))
    if method is None:
        return _closed_form(A._diag(), A, "diag", "method='exact' (n products) or method='hutchinson' (with key)")
    check_square(A, f"diag(method={method!r})")
    if method == "exact":
        pick = lambda A, E, cols: jnp.take_along_axis(A.mm(E), jnp.minimum(cols, A.shape[0] - 1)[None, :], 0)[0]  # noqa: E731
        return _basis_probe(A, pick, chunk)
    Z = _rademacher(key, A, num_samples, "diag")
    return jnp.mean(Z * A.mm(Z), axis=1)


def trace(
    A: LinearOperator,
    *,
    method: str | None = None,
    key: PRNGKeyArray | None = None,
    num_samples: int = 64,
) -> Inexact[Array, ""]:
    r"""The trace of a square ``A``.

    ``method=None`` uses the closed form (the rank for a projector); ``"exact"`` sums the exact
    diagonal; ``"hutchinson"`` returns the estimate of `linops.hutchinson` (use that function
    directly for its standard error).

    Example:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.trace(lo.Kronecker(lo.Identity(2), lo.Diagonal(jnp.array([1.0, 2.0]))))
        Array(6., dtype=float32)
    """
    _check_op(A, "trace")
    check_square(A, "trace")
    _check_method("trace", method, (None, "exact", "hutchinson"))
    if method is None:
        return _closed_form(A._trace(), A, "trace", "method='exact' (n products) or method='hutchinson' (with key)")
    if method == "exact":
        return jnp.sum(diag(A, method="exact"))
    return hutchinson(A, key, num_samples).value


class Estimate(eqx.Module):
    """A Monte Carlo estimate with its standard error (`linops.hutchinson`)."""

    value: Inexact[Array, ""]
    standard_error: Float[Array, ""]
    num_samples: int = eqx.field(static=True)


def _rademacher(key, A, num_samples, what):
    if key is None:
        raise ValueError(f"{what}: a stochastic estimate needs an explicit PRNG key (key=jax.random.key(0))")
    if num_samples < 2:
        raise ValueError(f"{what}: num_samples must be >= 2 to report a standard error, got {num_samples}")
    return jax.random.rademacher(key, (A.shape[1], num_samples), dtype=A.dtype)


def hutchinson(A: LinearOperator, key: PRNGKeyArray | None, num_samples: int = 64, *, mesh=None,
               axis: str = "data") -> Estimate:
    r"""Hutchinson's trace estimate $\frac1s \sum_i z_i^\top A z_i$ with Rademacher $z_i$.

    Returns the estimate and its standard error (sample standard deviation over $\sqrt s$). With a
    ``mesh`` (a `jax.sharding.Mesh`), the probes are split over its devices along ``axis``
    (`sharded_mm`); the estimate is the same as without.

    Example:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> est = lo.hutchinson(lo.Diagonal(jnp.arange(4.0)), jax.random.key(0), 16)
        >>> est.value, est.standard_error   # exact for a diagonal operator
        (Array(6., dtype=float32), Array(0., dtype=float32))
    """
    _check_op(A, "hutchinson")
    check_square(A, "hutchinson")
    Z = _rademacher(key, A, num_samples, "hutchinson")
    if mesh is None:
        AZ = A.mm(Z)
    else:
        from linops._sharding import sharded_mm

        AZ = sharded_mm(A, Z, mesh, axis)
    samples = jnp.sum(Z * AZ, axis=0)
    return Estimate(jnp.mean(samples), jnp.std(samples, ddof=1) / jnp.sqrt(num_samples), num_samples)


def logdet(A: LinearOperator, *, method: str | None = None) -> Float[Array, ""]:
    r"""$\log|\det A|$ of a square operator.

    Closed forms: diagonal, Kronecker ($n_B \log|A| + n_A \log|B|$), block diagonal, products of
    square factors, scalings, inverses, and diagonal/identity + low rank (the matrix
    determinant lemma, never forming ``n x n``). ``method="dense"`` materialises ``A``.

    Example:
        >>> import jax.numpy as jnp, linops as lo
        >>> U = jnp.array([[1.0], [1.0]])
        >>> lo.logdet(lo.LowRank(U, jnp.array([1.0])) + lo.Identity(2))   # log 3
        Array(1.0986123, dtype=float32)
    """
    _check_op(A, "logdet")
    check_square(A, "logdet")
    _check_method("logdet", method, (None, "dense"))
    if method is None:
        return _closed_form(A._logdet(), A, "logdet", "method='dense'")
    return Dense(A.as_matrix(), tags=A.tags & {_tags.psd})._logdet()


def eigh(A: LinearOperator, *, method: str | None = None) -> tuple[Float[Array, " n"], LinearOperator]:
    r"""Eigendecomposition $A = Q \operatorname{diag}(w) Q^\top$ of a symmetric operator.

    Returns ``(w, Q)``: eigenvalues in ascending order and the eigenvectors as an
    orthogonal operator (structured where ``A`` is: a permutation for a diagonal, a
    Kronecker product for a Kronecker product).

    Example:
        >>> import jax.numpy as jnp, linops as lo
        >>> w, Q = lo.eigh(lo.Diagonal(jnp.array([3.0, 1.0])))
        >>> w, Q @ jnp.array([1.0, 0.0])
        (Array([1., 3.], dtype=float32), Array([0., 1.], dtype=float32))
    """
    _check_op(A, "eigh")
    check_square(A, "eigh")
    _check_method("eigh", method, (None, "dense"))
    if _tags.symmetric not in A.tags:
        raise ValueError(f"eigh: {describe(A)} is not tagged symmetric (its tags: {sorted(A.tags)})")
    if method is None:
        return _closed_form(A._eigh(), A, "eigh", "method='dense'")
    return Dense(A.as_matrix(), tags={_tags.symmetric})._eigh()


__all__ = ["Solution", "Estimate", "solve", "inv", "pinv", "sqrt", "diag", "trace", "logdet", "eigh",
           "hutchinson"]
