"""Orthogonal projectors: `ProjectorOp` (onto the row space or null space of ``M``) and `Complement`."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._arrays import describe
from linops.algebra._base import LinearOperator
from linops.algebra._leaves import Dense


def gram_rtol(shape, dtype) -> float:
    r"""The default relative cut-off of the eigenvalues of the Gram $M M^\top$ of an ``(m, n)`` matrix ``M``:
    $\max(m, \sqrt n)\,\epsilon$, the accuracy of an ``m x m`` eigendecomposition and the typical rounding of
    inner products of ``n`` terms.

    Not numpy's rank rule $\max(m, n)\,\epsilon$: that applies to the singular values of ``M`` itself, and on
    the Gram's eigenvalues (their squares) it drops every row direction below $\sqrt{\max(m, n)\,\epsilon}$ of
    the largest singular value: 8.6% for LeNet-5's 61,706 parameters in float32, where a batch's 160 Jacobian
    rows have Gram eigenvalues from 1 down to 7e-5 of the largest, all known to 2.5e-7 (measured against the
    same rows' Gram in float64), and that rule kept 18 to 21 of them.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.algebra._projector import gram_rtol
        >>> round(gram_rtol((160, 61706), jnp.float32) / float(jnp.finfo(jnp.float32).eps))   # sqrt(61706)
        248
    """
    m, n = shape
    return max(float(m), float(n) ** 0.5) * float(jnp.finfo(dtype).eps)


def gram_factor(gram, shape, rtol=None):
    r"""``(W, rank)`` with $W^\top W = (M M^\top)^+$ from the Gram of an ``(m, n)`` matrix ``M``.

    Eigenvalues below ``rtol * max eigenvalue`` count as zero (default `gram_rtol`: $\max(m, \sqrt n)\,\epsilon$).
    """
    gram = 0.5 * (gram + gram.T)
    w, Q = jnp.linalg.eigh(gram)
    rtol = gram_rtol(shape, w.dtype) if rtol is None else rtol
    keep = w > rtol * jnp.max(w)
    scale = jnp.where(keep, 1.0 / jnp.sqrt(jnp.where(keep, w, 1.0)), 0.0)
    return (Q * scale[None, :]).T, jnp.sum(keep)


class ProjectorOp(LinearOperator):
    r"""Orthogonal projector onto $\operatorname{range}(M^\top)$ or $\ker(M)$ of a wide ``M``.

    $P_{\mathrm{row}} = M^\top (M M^\top)^{+} M$ and $P_{\ker} = I - P_{\mathrm{row}}$. The
    ``m x m`` Gram $M M^\top$ is factorised once (an eigendecomposition kept as the cached
    factor ``W`` with $W^\top W = (M M^\top)^+$); each product then costs one product with
    ``M``, one with ``M^T`` and an ``m x m`` matrix-vector product. Rank deficiency is
    handled by a RELATIVE cut-off: Gram eigenvalues below ``rtol * max eigenvalue`` count as
    zero (default ``rtol = max(m, sqrt(n)) * eps``, the accuracy to which the Gram's eigenvalues are
    known: an ``m x m`` eigendecomposition's, and the typical rounding of ``n``-term inner
    products), never by an absolute threshold.

    Working through the Gram squares the condition number: expect errors of order
    $\epsilon\,\kappa(M)^2$, so use float64 for ill-conditioned ``M`` in float32 workloads.

    Build it with `ProjectorOp.onto_row_space(M)` or `ProjectorOp.onto_null_space(M)`.
    ``M`` may be an array or any operator (for a matrix-free ``M`` the Gram costs ``m``
    transposed products and ``m`` products; memory ``O(n m)``).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> P = lo.ProjectorOp.onto_null_space(jnp.array([[1.0, 1.0]]))
        >>> (P @ jnp.array([1.0, 0.0])).round(4), lo.trace(P)
        (Array([ 0.5, -0.5], dtype=float32), Array(1., dtype=float32))
    """

    M: LinearOperator
    W: jax.Array
    rank: jax.Array
    onto: str = eqx.field(static=True)

    def __init__(self, M, W, rank, onto: str):
        if onto not in ("row_space", "null_space"):
            raise ValueError(f"ProjectorOp: onto must be 'row_space' or 'null_space', got {onto!r}")
        self.M, self.W, self.rank, self.onto = M, W, rank, onto

    @classmethod
    def _build(cls, M, rtol, onto):
        if not isinstance(M, LinearOperator):
            M = jnp.asarray(M)
            if M.ndim != 2:
                raise ValueError(f"ProjectorOp: M must be a 2-D array or an operator, got shape {M.shape}")
            M = Dense(M)
        m, n = M.shape
        if m == 0:
            raise ValueError(f"ProjectorOp: M = {describe(M)} has no rows")
        if isinstance(M, Dense):
            gram = M.matrix @ M.matrix.T
        else:
            gram = M.mm(M.rmm(jnp.eye(m, dtype=M.dtype)))
        W, rank = gram_factor(gram, M.shape, rtol)
        return cls(M, W, rank, onto)

    @classmethod
    def onto_row_space(cls, M, *, rtol: float | None = None) -> ProjectorOp:
        r"""Projector onto $\operatorname{range}(M^\top)$ (the span of the rows of ``M``)."""
        return cls._build(M, rtol, "row_space")

    @classmethod
    def onto_null_space(cls, M, *, rtol: float | None = None) -> ProjectorOp:
        r"""Projector onto $\ker M$: $I - M^\top (M M^\top)^+ M$."""
        return cls._build(M, rtol, "null_space")

    def complement(self) -> ProjectorOp:
        """``I - P``, sharing the cached factor."""
        other = "null_space" if self.onto == "row_space" else "row_space"
        return ProjectorOp(self.M, self.W, self.rank, other)

    @property
    def shape(self):
        n = self.M.shape[1]
        return (n, n)

    @property
    def dtype(self):
        return self.M.dtype

    @property
    def tags(self):
        return _tags.close({_tags.projector}, self.shape)

    def _row(self, v):
        inner = self.W.T @ (self.W @ (self.M.mv(v) if v.ndim == 1 else self.M.mm(v)))
        return self.M.rmv(inner) if v.ndim == 1 else self.M.rmm(inner)

    def mv(self, v):
        row = self._row(v)
        return row if self.onto == "row_space" else v - row

    mm = rmv = rmm = mv


@closed_forms.diag.register(ProjectorOp)
def _projector_op_diag(op):
    B = op.M.rmm(op.W.T)  # (n, m): columns span the row space, orthonormal
    row = jnp.sum(B * B, axis=1)
    return row if op.onto == "row_space" else 1.0 - row


@closed_forms.trace.register(ProjectorOp)
def _projector_op_trace(op):
    r = op.rank.astype(op.dtype)
    return r if op.onto == "row_space" else op.shape[0] - r



class Complement(LinearOperator):
    """``I - P`` for an operator ``P`` tagged ``projector`` (itself a projector).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> P = lo.Dense(jnp.array([[1.0, 0.0], [0.0, 0.0]]), tags={"projector"})
        >>> lo.Complement(P) @ jnp.ones(2)
        Array([0., 1.], dtype=float32)
    """

    op: LinearOperator

    def __init__(self, op: LinearOperator):
        if _tags.projector not in op.tags:
            raise ValueError(f"Complement: {describe(op)} is not tagged projector (its tags: {sorted(op.tags)})")
        self.op = op

    @property
    def shape(self):
        return tuple(self.op.shape)

    @property
    def dtype(self):
        return self.op.dtype

    @property
    def tags(self):
        return _tags.close({_tags.projector}, self.shape)

    def children(self):
        return (self.op,)

    def with_children(self, children):
        return Complement(children[0])

    def signature(self):
        return ("Complement", self.op.signature())

    def mv(self, v):
        return v - self.op.mv(v)

    def mm(self, V):
        return V - self.op.mm(V)

    rmv = mv
    rmm = mm


@closed_forms.diag.register(Complement)
def _complement_diag(op):
    d = closed_forms.diag(op.op)
    return d if d is NotImplemented else 1.0 - d


@closed_forms.trace.register(Complement)
def _complement_trace(op):
    t = closed_forms.trace(op.op)
    return t if t is NotImplemented else op.shape[0] - t

