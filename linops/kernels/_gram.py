r"""`KernelGramOp`: a kernel's Gram matrix as a lazy operator, evaluated in row tiles."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._base import LinearOperator
from linops.kernels._base import Kernel, _check_inputs
from linops.memory import check_fits
from linops.runtime._batching import check_mesh, leaf_specs


class KernelGramOp(LinearOperator):
    r"""The Gram matrix $K_{ij} = k(x_i, y_j)$ as an operator, computed tile by tile.

    Products run as one `lax.map` over blocks of ``block_size`` rows of ``X``: each block's
    ``block_size x m`` tile is formed, used and dropped, so memory is $O(\text{block} \cdot m d)$
    (the pairwise differences of ``d``-dimensional inputs), never $O(nm)$. The default block
    keeps a tile near $2^{22}$ numbers. With ``X2`` None the operator is $k(X, X)$, tagged symmetric PSD, with an
    exact `lo.diag`; with ``X2`` it is the cross-covariance $k(X, X_2)$ (``n x m``).

    Reverse-mode derivatives (w.r.t. the kernel's hyperparameters or the inputs) recompute each
    tile in the backward pass (`jax.checkpoint`), so they too stay at $O(\text{block} \cdot m)$
    memory instead of keeping every tile.

    For a kernel with $O$ outputs the operator is $(nO) \times (mO)$ in example-major order (row
    $iO + o$ is output $o$ of example $i$, as in `JacobianOp`). Structured kernels never form the
    $(bO) \times (mO)$ block: a `Coregionalized` kernel applies $B$ to one tile's product and a
    shared `Independent` kernel uses one tile for every output.

    With a ``mesh`` (a `jax.sharding.Mesh`), the row tiles are split over its devices along ``axis``:
    each device forms and applies its own tiles (the inputs and the vectors are replicated), and a
    product's rows come back split the same way; the transposed product of a cross-covariance sums
    each device's part with ``psum``. Results equal the single-device ones to float round-off; when the
    tiles do not split evenly, the last devices repeat a tile whose rows are then dropped.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> from linops.kernels import RBF, KernelGramOp
        >>> X = jnp.linspace(0.0, 1.0, 5)[:, None]
        >>> K = KernelGramOp(RBF(lengthscale=0.5), X, block_size=2)
        >>> bool(jnp.allclose(K @ jnp.ones(5), RBF(lengthscale=0.5)(X) @ jnp.ones(5)))
        True
        >>> sorted(K.tags), lo.diag(K)
        (['psd', 'symmetric'], Array([1., 1., 1., 1., 1.], dtype=float32))
        >>> from linops.kernels import Independent
        >>> KernelGramOp(Independent(RBF(), num_outputs=3), X).shape   # 5 examples x 3 outputs
        (15, 15)
    """

    kernel: Kernel
    X: jax.Array
    X2: jax.Array | None
    block_size: int = eqx.field(static=True)
    mesh: object = eqx.field(static=True)
    axis: str = eqx.field(static=True)

    def __init__(self, kernel: Kernel, X, X2=None, *, block_size: int | None = None, mesh=None, axis: str = "data"):
        if not isinstance(kernel, Kernel):
            raise TypeError(f"KernelGramOp: kernel must be a linops.kernels.Kernel, got {type(kernel).__name__}")
        X = _check_inputs(X, "KernelGramOp")
        X2 = None if X2 is None else _check_inputs(X2, "KernelGramOp")
        if X2 is not None and X2.shape[1] != X.shape[1]:
            raise ValueError(f"KernelGramOp: X has {X.shape[1]} input dimensions but X2 has {X2.shape[1]}")
        kernel.check_inputs(X, X2)
        m = X.shape[0] if X2 is None else X2.shape[0]
        if block_size is None:
            # Tiles of about 2^22 numbers (16 MB in float32): the pairwise differences, and with O outputs
            # up to O tiles at once (one per output of an `Independent` list).
            per_row = m * max(X.shape[1], 1) * kernel.num_outputs
            block_size = max(1, min(X.shape[0], (1 << 22) // max(per_row, 1)))
        if not isinstance(block_size, (int, np.integer)) or block_size < 1:
            raise ValueError(f"KernelGramOp: block_size must be a positive integer, got {block_size!r}")
        self.kernel, self.X, self.X2 = kernel, X, X2
        self.block_size = int(min(block_size, X.shape[0]))
        self.mesh, self.axis = check_mesh(mesh, axis, "KernelGramOp")

    @property
    def shape(self):
        n_out = self.kernel.num_outputs
        return (self.X.shape[0] * n_out, self._columns().shape[0] * n_out)

    @property
    def dtype(self):
        return jnp.result_type(self.X.dtype, *jax.tree_util.tree_leaves(self.kernel))

    @property
    def tags(self):
        return _tags.close({_tags.psd} if self.X2 is None else set(), self.shape)

    def _blocks(self):
        """Row blocks of X, padded with its last rows to a whole number of blocks (and of blocks per device)."""
        n, b = self.X.shape[0], self.block_size
        count = -(-n // b)
        if self.mesh is not None:
            devices = self.mesh.shape[self.axis]
            count = -(-count // devices) * devices
        idx = np.minimum(np.arange(count * b), n - 1).reshape(count, b)
        starts = np.arange(count) * b
        return self.X[idx], jnp.asarray(starts)

    def _columns(self):
        return self.X if self.X2 is None else self.X2

    def _offset(self, start):
        return start if self.X2 is None else None

    def _block_mm(self, Xb, start, V):
        """Rows ``Xb`` of the Gram times ``V`` ``(m, O, k)``: ``(b, O, k)``."""
        return self.kernel._block_mm(Xb, self._columns(), self._offset(start), V).astype(self.dtype)

    def mm(self, V):
        n_out, m = self.kernel.num_outputs, self._columns().shape[0]
        V = jnp.asarray(V, self.dtype)
        blocks, starts = self._blocks()
        # Checkpointed: reverse mode recomputes each tile instead of keeping all of them (n x m).
        block = jax.checkpoint(lambda a: self._block_mm(a[0], a[1], V.reshape(m, n_out, -1)))
        out = self._tiles(lambda tiles: lax.map(block, tiles), (blocks, starts))
        return out.reshape(-1, V.shape[1])[: self.shape[0]]

    def _tiles(self, fn, tiles, reduce=False):
        """``fn`` over the stacked tiles: here, or with the tiles split over the mesh's devices (outputs
        split the same way, or ``psum``-reduced when ``reduce``)."""
        if self.mesh is None:
            return fn(tiles)
        from jax.sharding import PartitionSpec

        split = PartitionSpec(self.axis)
        local = (lambda t: lax.psum(fn(t), self.axis)) if reduce else fn
        return jax.shard_map(local, mesh=self.mesh, in_specs=(leaf_specs(tiles, split),),
                             out_specs=PartitionSpec() if reduce else split, check_vma=False)(tiles)

    def mv(self, v):
        return self.mm(v[:, None])[:, 0]

    def rmm(self, U):
        if self.X2 is None:
            return self.mm(U)
        blocks, starts = self._blocks()
        n, b, n_out, m = self.X.shape[0], self.block_size, self.kernel.num_outputs, self.X2.shape[0]
        U = jnp.asarray(U, self.dtype)
        k = U.shape[1]
        pad = jnp.zeros(((blocks.shape[0] * b - n) * n_out, k), self.dtype)  # padded rows contribute 0
        Ub = jnp.concatenate([U, pad]).reshape(blocks.shape[0], b, n_out, k)
        columns = jax.ShapeDtypeStruct((m, n_out, k), self.dtype)

        @jax.checkpoint
        def step(acc, a):
            # The transposed block product, derived by JAX from the block product (linear in V).
            (contribution,) = jax.linear_transpose(lambda V: self._block_mm(a[0], a[1], V), columns)(a[2])
            return acc + contribution, None

        init = jnp.zeros((m, n_out, k), self.dtype)
        total = self._tiles(lambda tiles: lax.scan(step, init, tiles)[0], (blocks, starts, Ub), reduce=True)
        return total.reshape(m * n_out, k)

    def rmv(self, u):
        return self.rmm(u[:, None])[:, 0]

    def transpose(self):
        if self.X2 is None:
            return self
        return KernelGramOp(self.kernel, self.X2, self.X, block_size=self.block_size, mesh=self.mesh, axis=self.axis)

    def as_matrix(self):
        n, m = self.shape
        check_fits(n * m * np.dtype(self.dtype).itemsize, f"KernelGramOp({n} x {m}).as_matrix()",
                   "apply the operator to vectors (K @ v) instead")
        blocks, starts = self._blocks()
        cols = self._columns()
        tiles = self._tiles(lambda t: lax.map(lambda a: self.kernel._block(a[0], cols, self._offset(a[1]))
                                              .astype(self.dtype), t), (blocks, starts))
        return tiles.reshape(-1, m)[:n]


@closed_forms.diag.register(KernelGramOp)
def _kernel_gram_op_diag(op):
    if op.X2 is not None:
        return NotImplemented
    return op.kernel.diag(op.X).astype(op.dtype)
