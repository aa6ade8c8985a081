r"""`EigenDecomposed`: a symmetric operator held as $Q \operatorname{diag}(w) Q^\top$.

Every function of a symmetric matrix is then a function of its eigenvalues: shifts, inverses,
square roots and their inverses, log-determinants, pseudo-inverses. The eigenvectors $Q$ are any
orthogonal operator: a dense matrix, a Kronecker product of them (KFAC), a block-diagonal one.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._arrays import as_matrix_array, cutoff_inverse, describe, is_known_nonnegative
from linops.algebra._base import LinearOperator


class EigenDecomposed(LinearOperator):
    r"""The symmetric operator $Q \operatorname{diag}(w) Q^\top$ with orthogonal $Q$ (eigenvalues unsorted).

    Closed forms: `linops.shift` ($w + \lambda$), `linops.inv` ($1/w$), `linops.pinv` (relative
    cut-off), `linops.sqrt` and its inverse ($\sqrt w$), `linops.logdet`, `linops.eigh`,
    `linops.trace` and `linops.diag` (where $Q \circ Q$, the hook ``_hadamard_square``, has a
    structure: dense, Kronecker, block diagonal, permutation, identity). It works as a factor of
    `Kronecker` and `BlockDiagonal`, and `linops.eigendecompose` builds one from a symmetric operator.

    Args:
        Q: the eigenvectors: an ``(n, n)`` operator tagged orthogonal.
        w: the eigenvalues, ``(n,)``, in the order of ``Q``'s columns.
        nonnegative: declare ``w >= 0`` (PSD); by default read from concrete values.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> E = lo.eigendecompose(lo.Dense(jnp.array([[2.0, 1.0], [1.0, 2.0]]), tags={"symmetric"}))
        >>> E.w                                  # eigenvalues 1 and 3
        Array([1., 3.], dtype=float32)
        >>> lo.logdet(lo.shift(E, 1.0)), lo.diag(lo.inv(E))   # log(2 * 4); the inverse's diagonal
        (Array(2.0794415, dtype=float32), Array([0.6666666, 0.6666666], dtype=float32))
    """

    Q: LinearOperator
    w: jax.Array
    nonnegative: bool = eqx.field(static=True)

    def __init__(self, Q, w, *, nonnegative: bool | None = None):
        if not isinstance(Q, LinearOperator):
            raise TypeError("EigenDecomposed: Q must be an orthogonal operator (e.g. lo.Dense(Q, "
                            f"tags={{'orthogonal'}})), got {type(Q).__name__}")
        w = as_matrix_array(w, "EigenDecomposed w", 1)
        if not Q.is_square or Q.shape[1] != w.shape[0]:
            raise ValueError(f"EigenDecomposed: Q must be square with one column per eigenvalue; got {describe(Q)} "
                             f"and {w.shape[0]} eigenvalues")
        if _tags.orthogonal not in Q.tags:
            raise ValueError(f"EigenDecomposed: Q must be tagged orthogonal (its tags: {sorted(Q.tags)}); "
                             "declare it, e.g. lo.Dense(Q, tags={'orthogonal'})")
        self.Q, self.w = Q, w
        self.nonnegative = is_known_nonnegative(w, nonnegative)

    def _with(self, w, nonnegative=None):
        return EigenDecomposed(self.Q, w, nonnegative=nonnegative)

    @property
    def shape(self):
        return self.Q.shape

    @property
    def dtype(self):
        return jnp.result_type(self.Q.dtype, self.w.dtype)

    @property
    def tags(self):
        return _tags.close({_tags.symmetric} | ({_tags.psd} if self.nonnegative else set()), self.shape)

    def mv(self, v):
        return self.Q.mv(self.w * self.Q.rmv(v))

    def mm(self, V):
        return self.Q.mm(self.w[:, None] * self.Q.rmm(V))

    rmv, rmm = mv, mm


@closed_forms.shift.register(EigenDecomposed)
def _eigen_decomposed_shift(op, lam, nonnegative):
    keep = op.nonnegative and bool(nonnegative)
    return op._with(op.w + lam, nonnegative=keep or None)


@closed_forms.diag.register(EigenDecomposed)
def _eigen_decomposed_diag(op):  # diag(Q diag(w) Q^T) = (Q o Q) w
    Q2 = closed_forms.hadamard_square(op.Q)
    return NotImplemented if Q2 is NotImplemented else Q2.mv(op.w)


@closed_forms.trace.register(EigenDecomposed)
def _eigen_decomposed_trace(op):
    return jnp.sum(op.w)


@closed_forms.solve.register(EigenDecomposed)
def _eigen_decomposed_solve(op, b):
    return op.Q.mv(op.Q.rmv(b) / op.w) if b.ndim == 1 else op.Q.mm(op.Q.rmm(b) / op.w[:, None])


@closed_forms.inv.register(EigenDecomposed)
def _eigen_decomposed_inv(op):
    return op._with(1.0 / op.w, nonnegative=op.nonnegative or None)


@closed_forms.pinv.register(EigenDecomposed)
def _eigen_decomposed_pinv(op, rtol):
    return op._with(cutoff_inverse(op.w, rtol, op.shape), nonnegative=op.nonnegative or None)


@closed_forms.sqrt.register(EigenDecomposed)
def _eigen_decomposed_sqrt(op):
    if not op.nonnegative:
        return NotImplemented
    return op._with(jnp.sqrt(jnp.clip(op.w, 0.0)), nonnegative=True)


@closed_forms.logdet.register(EigenDecomposed)
def _eigen_decomposed_logdet(op):
    return jnp.sum(jnp.log(jnp.abs(op.w)))


@closed_forms.eigvalsh.register(EigenDecomposed)
def _eigen_decomposed_eigvalsh(op):
    return jnp.sort(op.w)


@closed_forms.eigendecompose.register(EigenDecomposed)
def _eigen_decomposed_eigendecompose(op):
    return op


@closed_forms.factorize.register(EigenDecomposed)
def _eigen_decomposed_factorize(op):
    return op


__all__ = ["EigenDecomposed"]
