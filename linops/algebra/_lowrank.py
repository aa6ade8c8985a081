"""Low-rank leaves: `LowRank` $U \\operatorname{diag}(d) V^\\top$ and their abstract base (shared with
`linops.LanczosLowRankOp`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
from equinox import AbstractVar

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._arrays import as_matrix_array, cutoff_inverse, is_known_nonnegative
from linops.algebra._base import LinearOperator


class AbstractLowRank(LinearOperator):
    r"""$U \operatorname{diag}(d) V^\top$: what `LowRank` and `LanczosLowRankOp` share (products, tags,
    closed forms, the Woodbury part). Abstract: a subclass declares the fields ``U``, ``d``, ``V``,
    ``orthonormal`` and ``nonnegative``; a rule registered for it serves both.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> L = lo.LanczosLowRankOp(lo.Diagonal(jnp.array([3.0, 2.0, 1.0])), 2, jax.random.key(0))
        >>> isinstance(L, lo.AbstractLowRank), isinstance(L, lo.LowRank)
        (True, False)
        >>> lo.diag(L).round(4)   # the rule registered for AbstractLowRank
        Array([3., 2., 0.], dtype=float32)
    """

    U: AbstractVar[jax.Array]
    d: AbstractVar[jax.Array]
    V: AbstractVar[jax.Array | None]
    orthonormal: AbstractVar[bool]
    nonnegative: AbstractVar[bool]

    @property
    def Vm(self):
        return self.U if self.V is None else self.V

    @property
    def shape(self):
        return (self.U.shape[0], self.Vm.shape[0])

    @property
    def dtype(self):
        return jnp.result_type(self.U.dtype, self.d.dtype)

    @property
    def symmetric(self) -> bool:
        return self.V is None

    @property
    def tags(self):
        if not self.symmetric:
            return frozenset()
        return _tags.close({_tags.symmetric} | ({_tags.psd} if self.nonnegative else set()), self.shape)

    def mv(self, v):
        return self.U @ (self.d * (self.Vm.T @ v))

    def mm(self, V):
        return self.U @ (self.d[:, None] * (self.Vm.T @ V))

    def rmv(self, u):
        return self.Vm @ (self.d * (self.U.T @ u))

    def rmm(self, U):
        return self.Vm @ (self.d[:, None] * (self.U.T @ U))

    def transpose(self):
        return self if self.symmetric else super().transpose()


class LowRank(AbstractLowRank):
    r"""The rank-$k$ operator $U \operatorname{diag}(d) V^\top$ (symmetric when `V` is omitted).

    Args:
        U: ``(m, k)``.
        d: ``(k,)``.
        V: ``(n, k)``; omit it for the symmetric ``U diag(d) U^T``.
        orthonormal: promise that the columns of ``U`` are orthonormal (Lanczos and
            eigendecompositions give such factors). It unlocks closed forms for `sqrt`,
            `pinv` and `eigh`-free shifts.
        nonnegative: declare ``d >= 0`` (read from concrete values by default).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> U = jnp.array([[1.0], [0.0]])
        >>> A = lo.LowRank(U, jnp.array([3.0])) + 2.0 * lo.Identity(2)
        >>> lo.solve(A, jnp.array([5.0, 2.0])).value   # Woodbury, never densified
        Array([1., 1.], dtype=float32)
    """

    U: jax.Array
    d: jax.Array
    V: jax.Array | None
    orthonormal: bool = eqx.field(static=True)
    nonnegative: bool = eqx.field(static=True)

    def __init__(self, U, d, V=None, *, orthonormal: bool = False, nonnegative: bool | None = None):
        U = as_matrix_array(U, "LowRank U", 2)
        d = as_matrix_array(d, "LowRank d", 1)
        if d.shape[0] != U.shape[1]:
            raise ValueError(f"LowRank: U is {U.shape} so d must have {U.shape[1]} entries, got {d.shape}")
        if V is not None:
            V = as_matrix_array(V, "LowRank V", 2)
            if V.shape[1] != U.shape[1]:
                raise ValueError(f"LowRank: U is {U.shape} so V must have {U.shape[1]} columns, got {V.shape}")
        self.U, self.d, self.V = U, d, V
        self.orthonormal = bool(orthonormal)
        self.nonnegative = is_known_nonnegative(d, nonnegative)


@closed_forms.diag.register(AbstractLowRank)
def _low_rank_diag(op):
    return jnp.einsum("ik,k,ik->i", op.U, op.d, op.Vm)


@closed_forms.sqrt.register(AbstractLowRank)
def _low_rank_sqrt(op):
    if op.symmetric and op.orthonormal and op.nonnegative:
        return LowRank(op.U, jnp.sqrt(op.d), orthonormal=True, nonnegative=True)
    return NotImplemented


@closed_forms.woodbury_part.register(AbstractLowRank)
def _low_rank_woodbury_part(op):
    return ("lowrank", op)


@closed_forms.pinv.register(AbstractLowRank)
def _low_rank_pinv(op, rtol):
    if op.symmetric and op.orthonormal:
        return LowRank(op.U, cutoff_inverse(op.d, rtol, op.shape), orthonormal=True,
                       nonnegative=op.nonnegative or None)
    return NotImplemented
