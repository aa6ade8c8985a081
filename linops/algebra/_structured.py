"""Structured leaves: `Selection`, `BlockDiagonal`, `Kronecker`."""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._arrays import default_float
from linops.algebra._base import LinearOperator, SharedArrays, factorize_children, result_dtype, shares_arrays
from linops.algebra._products import inverse_of


class Selection(LinearOperator):
    r"""Restriction to an index set: $(S v)_i = v_{\text{indices}_i}$, shape ``(k, n)``.

    Its transpose embeds a ``(k,)`` vector into zeros of length ``n``;
    `simplify` rewrites restriction-after-embedding ``S @ S.T`` to the identity.

    Args:
        indices: ``k`` distinct integers in ``[0, n)``.
        n: the size of the full space.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> S = lo.Selection(jnp.array([2, 0]), 3)
        >>> S @ jnp.array([10.0, 11.0, 12.0]), S.T @ jnp.array([1.0, 2.0])
        (Array([12., 10.], dtype=float32), Array([2., 0., 1.], dtype=float32))
    """

    indices: jax.Array
    n: int = eqx.field(static=True)
    is_permutation: bool = eqx.field(static=True)
    dtype_: np.dtype = eqx.field(static=True)

    def __init__(self, indices, n: int, *, dtype=None, is_permutation: bool | None = None):
        indices = jnp.asarray(indices)
        if indices.ndim != 1 or not jnp.issubdtype(indices.dtype, jnp.integer):
            raise ValueError(f"Selection: indices must be a 1-D integer array, got {indices.dtype}{indices.shape}")
        if not isinstance(indices, jax.core.Tracer):
            idx = np.asarray(indices)
            if idx.size and (idx.min() < 0 or idx.max() >= n):
                raise ValueError(f"Selection: indices must lie in [0, {n}), got range [{idx.min()}, {idx.max()}]")
            if np.unique(idx).size != idx.size:
                raise ValueError("Selection: indices must be distinct (a repeated index is not a restriction)")
            if is_permutation is None:
                is_permutation = idx.size == n
        self.indices = indices
        self.n = int(n)
        self.is_permutation = bool(is_permutation)
        self.dtype_ = np.dtype(default_float() if dtype is None else dtype)

    @property
    def shape(self):
        return (self.indices.shape[0], self.n)

    @property
    def dtype(self):
        return self.dtype_

    @property
    def tags(self):
        return frozenset({_tags.orthogonal}) if self.is_permutation else frozenset()

    def mv(self, v):
        return v[self.indices]

    mm = mv

    def rmv(self, u):
        return jnp.zeros((self.n,) + u.shape[1:], u.dtype).at[self.indices].set(u)

    rmm = rmv


@closed_forms.hadamard_square.register(Selection)
def _selection_hadamard_square(op):
    return op  # entries 0 and 1


def _split_points(sizes):
    return list(np.cumsum(sizes)[:-1])


@shares_arrays("blocks")
class BlockDiagonal(LinearOperator):
    """Block-diagonal operator ``diag(A_1, ..., A_k)`` (blocks may be rectangular).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> B = lo.BlockDiagonal([lo.Identity(1), lo.Diagonal(jnp.array([2.0, 3.0]))])
        >>> lo.diag(B)
        Array([1., 2., 3.], dtype=float32)
    """

    blocks: tuple
    _shared: SharedArrays = eqx.field(static=True, repr=False)

    def __init__(self, blocks: Sequence[LinearOperator]):
        blocks = tuple(blocks)
        if not blocks or not all(isinstance(b, LinearOperator) for b in blocks):
            raise ValueError("BlockDiagonal: expected a non-empty sequence of LinearOperators")
        self.blocks = blocks
        type(self)._shared.track(self)

    @property
    def shape(self):
        return (sum(b.shape[0] for b in self.blocks), sum(b.shape[1] for b in self.blocks))

    @property
    def dtype(self):
        return result_dtype(*self.blocks)

    @property
    def tags(self):
        if any(not b.is_square for b in self.blocks):
            return frozenset()
        common = frozenset.intersection(*(b.tags for b in self.blocks))
        return _tags.close(common, self.shape)

    def children(self):
        return self.blocks

    def with_children(self, children):
        return BlockDiagonal(children)

    def signature(self):
        return ("BlockDiagonal",) + tuple(b.signature() for b in self.blocks)

    def _apply(self, x, fn, axis_sizes):
        parts = jnp.split(x, _split_points(axis_sizes), axis=0)
        return jnp.concatenate([fn(b, p) for b, p in zip(self.blocks, parts, strict=True)], axis=0)

    def mv(self, v):
        return self._apply(v, lambda b, p: b.mv(p), [b.shape[1] for b in self.blocks])

    def mm(self, V):
        return self._apply(V, lambda b, p: b.mm(p), [b.shape[1] for b in self.blocks])

    def rmv(self, u):
        return self._apply(u, lambda b, p: b.rmv(p), [b.shape[0] for b in self.blocks])

    def rmm(self, U):
        return self._apply(U, lambda b, p: b.rmm(p), [b.shape[0] for b in self.blocks])

    def transpose(self):
        return BlockDiagonal([b.T for b in self.blocks])

    def _per_block(self, function, *args):
        outs = [function(b, *args) for b in self.blocks]
        return NotImplemented if any(o is NotImplemented for o in outs) else outs

    def _blockwise(self, function, *args):
        """``diag(f(A_1), ..., f(A_k))`` for a closed form ``f`` every block has, else NotImplemented."""
        outs = self._per_block(function, *args)
        return outs if outs is NotImplemented else BlockDiagonal(outs)


@closed_forms.diag.register(BlockDiagonal)
def _block_diagonal_diag(op):
    outs = op._per_block(closed_forms.diag)
    return outs if outs is NotImplemented else jnp.concatenate(outs)


@closed_forms.solve.register(BlockDiagonal)
def _block_diagonal_solve(op, b):
    if any(not blk.is_square for blk in op.blocks):
        return NotImplemented
    parts = jnp.split(b, _split_points([blk.shape[0] for blk in op.blocks]), axis=0)
    outs = [closed_forms.solve(blk, p) for blk, p in zip(op.blocks, parts, strict=True)]
    return NotImplemented if any(o is NotImplemented for o in outs) else jnp.concatenate(outs, axis=0)


@closed_forms.inv.register(BlockDiagonal)
def _block_diagonal_inv(op):
    return BlockDiagonal([inverse_of(b) for b in op.blocks])


@closed_forms.logdet.register(BlockDiagonal)
def _block_diagonal_logdet(op):
    outs = op._per_block(closed_forms.logdet)
    return outs if outs is NotImplemented else sum(outs)


@closed_forms.pinv.register(BlockDiagonal)
def _block_diagonal_pinv(op, rtol):
    return op._blockwise(closed_forms.pinv, rtol)


@closed_forms.sqrt.register(BlockDiagonal)
def _block_diagonal_sqrt(op):
    return op._blockwise(closed_forms.sqrt)


@closed_forms.root.register(BlockDiagonal)
def _block_diagonal_root(op):
    return op._blockwise(closed_forms.root)


@closed_forms.hadamard_square.register(BlockDiagonal)
def _block_diagonal_hadamard_square(op):
    return op._blockwise(closed_forms.hadamard_square)


@closed_forms.eigendecompose.register(BlockDiagonal)
def _block_diagonal_eigendecompose(op):
    outs = op._per_block(closed_forms.eigendecompose)
    if outs is NotImplemented or any(not b.is_square for b in op.blocks):
        return NotImplemented
    nonnegative = all(o.nonnegative for o in outs) or None
    return type(outs[0])(BlockDiagonal([o.Q for o in outs]), jnp.concatenate([o.w for o in outs]),
                         nonnegative=nonnegative)


@closed_forms.factorize.register(BlockDiagonal)
def _block_diagonal_factorize(op):
    if any(not b.is_square for b in op.blocks):
        return NotImplemented
    return factorize_children(op, op.blocks)


@shares_arrays("A", "B")
class Kronecker(LinearOperator):
    r"""The Kronecker product $A \otimes B$ (row-major: $(A \otimes B)\,\mathrm{vec}(X) = \mathrm{vec}(A X B^\top)$).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> K = lo.Kronecker(lo.Diagonal(jnp.array([1.0, 2.0])), lo.Diagonal(jnp.array([1.0, 3.0])))
        >>> lo.diag(K), lo.logdet(K)
        (Array([1., 3., 2., 6.], dtype=float32), Array(3.583519, dtype=float32))
    """

    A: LinearOperator
    B: LinearOperator
    _shared: SharedArrays = eqx.field(static=True, repr=False)

    def __init__(self, A: LinearOperator, B: LinearOperator):
        for name, op in (("A", A), ("B", B)):
            if not isinstance(op, LinearOperator):
                raise TypeError(f"Kronecker: {name} must be a LinearOperator, got {type(op).__name__}")
        self.A, self.B = A, B
        type(self)._shared.track(self)

    @property
    def shape(self):
        return (self.A.shape[0] * self.B.shape[0], self.A.shape[1] * self.B.shape[1])

    @property
    def dtype(self):
        return result_dtype(self.A, self.B)

    @property
    def tags(self):
        a, b = self.A.tags, self.B.tags
        if _tags.zero in a or _tags.zero in b:
            return _tags.close({_tags.zero}, self.shape)
        if not (self.A.is_square and self.B.is_square):
            return frozenset()
        keep = {_tags.symmetric, _tags.psd, _tags.diagonal, _tags.orthogonal, _tags.identity, _tags.projector}
        return _tags.close(a & b & keep, self.shape)

    def children(self):
        return (self.A, self.B)

    def with_children(self, children):
        return Kronecker(*children)

    def signature(self):
        return ("Kronecker", self.A.signature(), self.B.signature())

    def _apply(self, x, fa, fb, n_in):
        (na, nb) = n_in
        k = x.shape[1:]
        X = x.reshape((na, nb) + k)
        if not k:
            Y = fa(self.A, X)  # (ma, nb)
            return fb(self.B, Y.T).T.reshape(-1)
        # several vectors: fold the trailing axis into the matrix columns.
        Y = jax.vmap(lambda Xi: fb(self.B, fa(self.A, Xi).T).T, in_axes=2, out_axes=2)(X)
        return Y.reshape((-1,) + k)

    def mv(self, v):
        return self._apply(v, lambda op, X: op.mm(X), lambda op, X: op.mm(X), (self.A.shape[1], self.B.shape[1]))

    def rmv(self, u):
        return self._apply(u, lambda op, X: op.rmm(X), lambda op, X: op.rmm(X), (self.A.shape[0], self.B.shape[0]))

    mm = mv
    rmm = rmv

    def transpose(self):
        return Kronecker(self.A.T, self.B.T)

    def _both(self, function, *args):
        a, b = function(self.A, *args), function(self.B, *args)
        return NotImplemented if (a is NotImplemented or b is NotImplemented) else (a, b)


@closed_forms.diag.register(Kronecker)
def _kronecker_diag(op):
    ab = op._both(closed_forms.diag)
    return ab if ab is NotImplemented else jnp.kron(*ab)


@closed_forms.solve.register(Kronecker)
def _kronecker_solve(op, b):
    r"""$(A \otimes B)^{-1} \mathrm{vec}(X) = \mathrm{vec}(A^{-1} X B^{-\top})$, by the factors' closed forms."""
    if not (op.A.is_square and op.B.is_square):
        return NotImplemented

    # Every right-hand side at once: one solve with each factor, however many columns b has.
    na, nb = op.A.shape[0], op.B.shape[0]
    k = b.shape[1:]
    X = b.reshape((na, nb) + k)
    Y = closed_forms.solve(op.A, X.reshape(na, -1))  # A^-1 along the first axis
    if Y is NotImplemented:
        return Y
    Y = jnp.moveaxis(Y.reshape((na, nb) + k), 1, 0).reshape(nb, -1)
    Z = closed_forms.solve(op.B, Y)  # B^-1 along the second axis
    if Z is NotImplemented:
        return Z
    return jnp.moveaxis(Z.reshape((nb, na) + k), 0, 1).reshape(b.shape)


@closed_forms.inv.register(Kronecker)
def _kronecker_inv(op):
    return Kronecker(inverse_of(op.A), inverse_of(op.B))


@closed_forms.logdet.register(Kronecker)
def _kronecker_logdet(op):
    ab = op._both(closed_forms.logdet)
    if ab is NotImplemented:
        return ab
    return op.B.shape[0] * ab[0] + op.A.shape[0] * ab[1]


@closed_forms.pinv.register(Kronecker)
def _kronecker_pinv(op, rtol):
    ab = op._both(closed_forms.pinv, rtol)
    return ab if ab is NotImplemented else Kronecker(*ab)


@closed_forms.sqrt.register(Kronecker)
def _kronecker_sqrt(op):
    ab = op._both(closed_forms.sqrt)
    return ab if ab is NotImplemented else Kronecker(*ab)


@closed_forms.root.register(Kronecker)
def _kronecker_root(op):
    ab = op._both(closed_forms.root)  # (R_A R_A^T) kron (R_B R_B^T) = (R_A kron R_B)(R_A kron R_B)^T
    return ab if ab is NotImplemented else Kronecker(*ab)


@closed_forms.hadamard_square.register(Kronecker)
def _kronecker_hadamard_square(op):
    ab = op._both(closed_forms.hadamard_square)  # (A kron B) o (A kron B) = (A o A) kron (B o B)
    return ab if ab is NotImplemented else Kronecker(*ab)


@closed_forms.factorize.register(Kronecker)
def _kronecker_factorize(op):
    if not (op.A.is_square and op.B.is_square):
        return NotImplemented
    return factorize_children(op, (op.A, op.B))


@closed_forms.eigendecompose.register(Kronecker)
def _kronecker_eigendecompose(op):
    ab = op._both(closed_forms.eigendecompose)
    if ab is NotImplemented:
        return ab
    a, b = ab  # (Q_A kron Q_B) diag(w_A kron w_B) (Q_A kron Q_B)^T
    return type(a)(Kronecker(a.Q, b.Q), jnp.kron(a.w, b.w), nonnegative=(a.nonnegative and b.nonnegative) or None)

