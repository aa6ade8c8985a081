r"""Matrices held as their factorisations: `Triangular`, `Cholesky` and `LU`.

A factorisation is computed once, when the operator is built (`linops.factorize`), and kept as
operator state; every later solve, log-determinant or square-root factor reuses it. This is
lineax's init/compute split expressed as operators: `linops.inv` keeps one, so
``Ai = lo.inv(A); Ai @ (Ai @ v)`` factorises ``A`` once.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import lax

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._arrays import as_matrix_array, describe
from linops.algebra._base import LinearOperator


def _columns(b):
    return b if b.ndim == 2 else b[:, None]


class Triangular(LinearOperator):
    r"""A square triangular matrix $L$ (lower by default), applied and solved without forming anything.

    Its transpose is triangular too (the same array, read the other way round); `linops.solve`
    uses one triangular solve, `linops.logdet` the diagonal.

    Args:
        matrix: an ``(n, n)`` array; only the triangle named by ``lower`` is read.
        lower: whether ``matrix`` is lower (True) or upper (False) triangular.
        zero_other_triangle: zero the other triangle (a copy of the matrix); pass False for a matrix
            whose other triangle is zero already (a factor from `jax.numpy.linalg.cholesky`), to
            keep one ``n x n`` array instead of two.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> L = lo.Triangular(jnp.array([[2.0, 0.0], [1.0, 1.0]]))
        >>> lo.solve(L, jnp.array([2.0, 2.0])).value, lo.logdet(L)
        (Array([1., 1.], dtype=float32), Array(0.6931472, dtype=float32))
    """

    matrix: jax.Array
    lower: bool = eqx.field(static=True)
    transposed: bool = eqx.field(static=True)

    def __init__(self, matrix, lower: bool = True, *, transposed: bool = False,
                 zero_other_triangle: bool = True):
        matrix = as_matrix_array(matrix, "Triangular", 2)
        if matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"Triangular: expected a square matrix, got shape {tuple(matrix.shape)}")
        if zero_other_triangle:
            matrix = jnp.tril(matrix) if lower else jnp.triu(matrix)
        self.matrix = matrix
        self.lower = bool(lower)
        self.transposed = bool(transposed)

    @property
    def shape(self):
        return tuple(self.matrix.shape)

    @property
    def dtype(self):
        return self.matrix.dtype

    @property
    def is_lower(self) -> bool:
        """Whether the operator (not the stored array) is lower triangular."""
        return self.lower != self.transposed

    def _product(self, x, transposed):
        if transposed:  # contract axis 0: no transposed copy of the matrix
            return lax.dot_general(self.matrix, x, (((0,), (0,)), ((), ())))
        return self.matrix @ x

    def mv(self, v):
        return self._product(v, self.transposed)

    mm = mv

    def rmv(self, u):
        return self._product(u, not self.transposed)

    rmm = rmv

    def transpose(self):
        return Triangular(self.matrix, self.lower, transposed=not self.transposed,
                          zero_other_triangle=False)

    def as_matrix(self):
        return self.matrix.T if self.transposed else self.matrix


@closed_forms.diag.register(Triangular)
def _triangular_diag(op):
    return jnp.diagonal(op.matrix)


@closed_forms.solve.register(Triangular)
def _triangular_solve(op, b):
    x = jsl.solve_triangular(op.matrix, _columns(b), lower=op.lower, trans=1 if op.transposed else 0)
    return x.reshape(b.shape)


@closed_forms.logdet.register(Triangular)
def _triangular_logdet(op):
    return jnp.sum(jnp.log(jnp.abs(jnp.diagonal(op.matrix))))


@closed_forms.factorize.register(Triangular)
def _triangular_factorize(op):
    return op


class Cholesky(LinearOperator):
    r"""A symmetric positive definite $A$ held as its Cholesky factor: $A = L L^\top$.

    The factor may also be upper triangular ($A = R R^\top$, as for the inverse of a Cholesky-held
    matrix, which `linops.diag` of `linops.inv` uses).

    Build it with `Cholesky.of` (or `linops.factorize` on a PSD `Dense`); products apply
    $L (L^\top v)$, solves are two triangular solves, $\log\det A = 2\sum_i \log L_{ii}$, and
    `linops.root` gives $L$ itself (for sampling $\mathcal N(0, A)$, or $\mathcal N(0, A^{-1})$
    through $L^{-\top}$).

    Args:
        factor: the triangular ``(n, n)`` factor (a `Triangular`, or an array taken as lower triangular).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Cholesky.of(lo.Dense(jnp.array([[4.0, 2.0], [2.0, 2.0]]), tags={"psd"}))
        >>> A.factor.matrix
        Array([[2., 0.],
               [1., 1.]], dtype=float32)
        >>> lo.solve(A, jnp.array([6.0, 4.0])).value, lo.logdet(A)   # log 4
        (Array([1., 1.], dtype=float32), Array(1.3862944, dtype=float32))
    """

    factor: Triangular

    def __init__(self, factor):
        self.factor = factor if isinstance(factor, Triangular) else Triangular(factor, lower=True)

    @classmethod
    def of(cls, A: LinearOperator) -> Cholesky:
        """Factorise a PSD operator (materialised: ``A.as_matrix()``, which checks the memory first)."""
        if _tags.psd not in A.tags:
            raise ValueError(f"Cholesky.of: {describe(A)} is not tagged psd (its tags: {sorted(A.tags)})")
        return cls(Triangular(jnp.linalg.cholesky(A.as_matrix()), lower=True, zero_other_triangle=False))

    @property
    def shape(self):
        return self.factor.shape

    @property
    def dtype(self):
        return self.factor.dtype

    @property
    def tags(self):
        return _tags.close({_tags.psd}, self.shape)

    def mv(self, v):
        return self.factor.mv(self.factor.rmv(v))

    mm = rmv = rmm = mv


@closed_forms.diag.register(Cholesky)
def _cholesky_diag(op):  # the squared norms of the rows of the factor R (columns of the stored array if transposed)
    return jnp.sum(op.factor.matrix**2, axis=0 if op.factor.transposed else 1)


@closed_forms.solve.register(Cholesky)
def _cholesky_solve(op, b):
    return closed_forms.solve(op.factor.T, closed_forms.solve(op.factor, b))


@closed_forms.logdet.register(Cholesky)
def _cholesky_logdet(op):
    return 2.0 * closed_forms.logdet(op.factor)


@closed_forms.root.register(Cholesky)
def _cholesky_root(op):
    return op.factor


@closed_forms.inv.register(Cholesky)
def _cholesky_inv(op):
    r"""$A^{-1} = R^{-\top} (R^{-\top})^\top$ held the same way, $R^{-\top}$ triangular (``n`` triangular solves,
    as `Dense._inv` costs an LU): what an exact ``diag(inv(A))`` needs; products with `linops.inv` never form it."""
    R = op.factor
    stored_inverse = jsl.solve_triangular(R.matrix, jnp.eye(op.shape[0], dtype=op.dtype), lower=R.lower)
    return Cholesky(Triangular(stored_inverse, R.lower, transposed=not R.transposed, zero_other_triangle=False))


@closed_forms.factorize.register(Cholesky)
def _cholesky_factorize(op):
    return op


class LU(LinearOperator):
    """A square matrix held as its pivoted LU factorisation (`jax.scipy.linalg.lu_factor`).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.LU.of(lo.Dense(jnp.array([[0.0, 2.0], [1.0, 0.0]])))
        >>> lo.solve(A, jnp.array([2.0, 3.0])).value, lo.logdet(A)   # log |det A| = log 2
        (Array([3., 1.], dtype=float32), Array(0.6931472, dtype=float32))
    """

    lu: jax.Array
    pivots: jax.Array
    transposed: bool = eqx.field(static=True)

    def __init__(self, lu, pivots, *, transposed: bool = False):
        self.lu, self.pivots = jnp.asarray(lu), jnp.asarray(pivots)
        self.transposed = bool(transposed)

    @classmethod
    def of(cls, A: LinearOperator) -> LU:
        """Factorise a square operator (materialised: ``A.as_matrix()``)."""
        if not A.is_square:
            raise ValueError(f"LU.of: expected a square operator, got {describe(A)}")
        return cls(*jsl.lu_factor(A.as_matrix()))

    @property
    def shape(self):
        return tuple(self.lu.shape)

    @property
    def dtype(self):
        return self.lu.dtype

    def _lower(self):
        return jnp.tril(self.lu, -1) + jnp.eye(self.lu.shape[0], dtype=self.lu.dtype)

    def _permuted(self, y, inverse):
        """``P y`` (or ``P^T y``) where ``A = P L U``, from LAPACK's sequential row swaps."""
        perm = jax.lax.linalg.lu_pivots_to_permutation(self.pivots, self.lu.shape[0])
        if inverse:
            return y[perm]
        return jnp.zeros_like(y).at[perm].set(y)

    def _forward(self, v):
        return self._permuted(self._lower() @ (jnp.triu(self.lu) @ v), inverse=False)

    def _backward(self, u):
        return jnp.triu(self.lu).T @ (self._lower().T @ self._permuted(u, inverse=True))

    def mv(self, v):
        return self._backward(v) if self.transposed else self._forward(v)

    mm = mv

    def rmv(self, u):
        return self._forward(u) if self.transposed else self._backward(u)

    rmm = rmv

    def transpose(self):
        return LU(self.lu, self.pivots, transposed=not self.transposed)


@closed_forms.solve.register(LU)
def _lu_solve(op, b):
    x = jsl.lu_solve((op.lu, op.pivots), _columns(b), trans=1 if op.transposed else 0)
    return x.reshape(b.shape)


@closed_forms.logdet.register(LU)
def _lu_logdet(op):
    return jnp.sum(jnp.log(jnp.abs(jnp.diagonal(op.lu))))


@closed_forms.factorize.register(LU)
def _lu_factorize(op):
    return op


__all__ = ["Cholesky", "LU", "Triangular"]
