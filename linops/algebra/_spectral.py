"""`svd`: the thin singular value decomposition of an operator, by its closed form or densely on request."""

from jaxtyping import Array, Float

from linops import closed_forms
from linops.algebra._arrays import describe
from linops.algebra._base import LinearOperator
from linops.algebra._leaves import Dense
from linops.algebra._solvers import closed_form


def svd(A: LinearOperator, *, method: str | None = None) -> tuple[LinearOperator, Float[Array, " k"], LinearOperator]:
    r"""The thin singular value decomposition $A = U \operatorname{diag}(s) V^\top$ of an ``(m, n)`` operator.

    Returns ``(U, s, V)``: ``U`` ``(m, k)`` and ``V`` ``(n, k)`` as operators with orthonormal columns,
    ``s`` the ``k = min(m, n)`` singular values in descending order. ``method=None`` uses the closed form
    of ``A``'s structure (`linops.closed_forms.svd`: a dense matrix's LAPACK SVD); ``method="dense"``
    materialises ``A`` first (``min(m, n)`` products).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> M = jnp.array([[3.0, 0.0], [0.0, -2.0], [0.0, 0.0]])
        >>> U, s, V = lo.svd(lo.Dense(M))
        >>> s, U.shape, V.shape
        (Array([3., 2.], dtype=float32), (3, 2), (2, 2))
        >>> bool(jnp.allclose((U.as_matrix() * s[None, :]) @ V.as_matrix().T, M))
        True
    """
    if not isinstance(A, LinearOperator):
        raise TypeError(f"svd: expected a linops.LinearOperator, got {type(A).__name__}")
    if method not in (None, "dense"):
        raise ValueError(f"svd: unknown method {method!r}; expected one of (None, 'dense')")
    if method is None:
        return closed_form(closed_forms.svd(A), A, "svd", "method='dense'")
    if A.shape[0] == 0 or A.shape[1] == 0:
        raise ValueError(f"svd: {describe(A)} is empty")
    return closed_forms.svd(Dense(A.as_matrix()))


__all__ = ["svd"]
