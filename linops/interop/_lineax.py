"""Conversion to and from lineax operators, tags included."""

from __future__ import annotations

import equinox as eqx
import jax
import lineax as lx

from linops.algebra import _tags
from linops.algebra._base import LinearOperator, user_tags
from linops.algebra._leaves import Dense, Diagonal, Identity

_TO_LINEAX = {
    _tags.symmetric: lx.symmetric_tag,
    _tags.psd: lx.positive_semidefinite_tag,
    _tags.diagonal: lx.diagonal_tag,
}


def to_lineax(op: LinearOperator) -> lx.AbstractLinearOperator:
    """A lineax operator with the same products and the tags lineax knows.

    Examples:
        >>> import jax.numpy as jnp, lineax as lx, linops as lo
        >>> A = lo.Diagonal(jnp.array([2.0, 4.0])) + lo.Identity(2)
        >>> x = lx.linear_solve(lo.to_lineax(A), jnp.ones(2), lx.CG(rtol=1e-6, atol=1e-6)).value
        >>> x.round(6)  # 1/3 and 1/5, to CG's tolerance
        Array([0.333333, 0.2     ], dtype=float32)
    """
    if isinstance(op, Dense):
        return lx.MatrixLinearOperator(op.matrix, _lineax_tags(op))
    if isinstance(op, Diagonal):
        return lx.DiagonalLinearOperator(op.d)
    structure = jax.ShapeDtypeStruct((op.shape[1],), op.dtype)
    if isinstance(op, Identity):
        return lx.IdentityLinearOperator(structure)
    return lx.FunctionLinearOperator(op.mv, structure, _lineax_tags(op))


def _lineax_tags(op):
    return frozenset(_TO_LINEAX[t] for t in op.tags if t in _TO_LINEAX)


def from_lineax(op: lx.AbstractLinearOperator) -> LinearOperator:
    """A linops operator from a lineax one with 1-D input and output structures.

    Examples:
        >>> import jax.numpy as jnp, lineax as lx, linops as lo
        >>> A = lo.from_lineax(lx.MatrixLinearOperator(jnp.eye(2), lx.positive_semidefinite_tag))
        >>> sorted(A.tags)
        ['psd', 'symmetric']
    """
    if not isinstance(op, lx.AbstractLinearOperator):
        raise TypeError(f"from_lineax: expected a lineax.AbstractLinearOperator, got {type(op).__name__}")
    tags = set()
    if lx.is_symmetric(op):
        tags.add(_tags.symmetric)
    if lx.is_positive_semidefinite(op):
        tags.add(_tags.psd)
    if lx.is_diagonal(op):
        tags.add(_tags.diagonal)
    if isinstance(op, lx.MatrixLinearOperator):
        return Dense(op.matrix, tags=tags)
    if isinstance(op, lx.DiagonalLinearOperator):
        return Diagonal(op.diagonal)
    ins, outs = op.in_structure(), op.out_structure()
    for name, s in (("input", ins), ("output", outs)):
        if not isinstance(s, jax.ShapeDtypeStruct) or len(s.shape) != 1:
            raise ValueError(
                f"from_lineax: {type(op).__name__} has the {name} structure {s}; expected 1-D vectors "
                "(ravel pytree-structured operators first)"
            )
    if isinstance(op, lx.IdentityLinearOperator) and ins.shape == outs.shape:
        return Identity(ins.shape[0], ins.dtype)
    return LineaxOp(op, frozenset(tags))


class LineaxOp(LinearOperator):
    """A lineax operator seen as a linops leaf (built by `from_lineax`).

    Its arrays stay pytree leaves; everything else (a closure-converted function, say) is
    kept as static data, so the operator also passes through a plain `jax.jit`.

    Examples:
        >>> import jax.numpy as jnp, lineax as lx, linops as lo
        >>> f = lx.FunctionLinearOperator(lambda v: 2.0 * v, jnp.zeros(2), lx.symmetric_tag)
        >>> A = lo.from_lineax(f)
        >>> type(A).__name__, A @ jnp.ones(2)
        ('LineaxOp', Array([2., 2.], dtype=float32))
    """

    arrays: object
    rest: object = eqx.field(static=True)
    declared: frozenset = eqx.field(static=True)

    def __init__(self, lineax_op: lx.AbstractLinearOperator, tags=frozenset()):
        self.arrays, self.rest = eqx.partition(lineax_op, eqx.is_array)
        self.declared = user_tags(tags, self.shape)

    @property
    def lineax_op(self) -> lx.AbstractLinearOperator:
        return eqx.combine(self.arrays, self.rest)

    @property
    def shape(self):
        return (self.lineax_op.out_size(), self.lineax_op.in_size())

    @property
    def dtype(self):
        return self.lineax_op.out_structure().dtype

    @property
    def tags(self):
        return self.declared

    def mv(self, v):
        return self.lineax_op.mv(v)

    def rmv(self, u):
        return self.lineax_op.transpose().mv(u)
