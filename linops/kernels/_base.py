r"""The `Kernel` base class and the input and hyperparameter checks every kernel shares."""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def _positive(name, owner, value):
    """``value`` as an array; refused when a concrete value is not strictly positive."""
    value = jnp.asarray(value, dtype=jnp.result_type(float, value))
    if not isinstance(value, jax.core.Tracer):
        arr = np.asarray(value)
        if arr.ndim > 1:
            raise ValueError(f"{owner}: {name} must be a scalar or a vector, got shape {arr.shape}")
        if not np.all(arr > 0):
            raise ValueError(f"{owner}: {name} must be positive, got {arr}")
    return value


def _check_inputs(X, who):
    X = jnp.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"{who}: inputs must be 2-D (n, d), got shape {X.shape}")
    return X


def _outputs(count):
    return f"{count} output" if count == 1 else f"{count} outputs"


class Kernel(eqx.Module):
    r"""Base class: a positive semi-definite covariance function $k(x, y)$.

    A kernel has `num_outputs` $O$ outputs (1 unless it is multi-output); its Gram matrix on
    $n$ and $m$ inputs is $(nO) \times (mO)$ in example-major order: row $iO + o$ is output $o$
    of example $i$, as in `JacobianOp`.

    Single-output subclasses implement ``_tile(X, Y, offset)``: the block $k(X, Y)$ where
    ``offset`` is the index of ``X[0]`` in ``Y`` when ``X`` is a slice of the same set (None for a
    cross-covariance; only `White` needs it), and ``diag(X)``. Multi-output subclasses implement
    ``_block_mm(X, Y, offset, V)`` (a row block of the Gram times ``V`` of shape ``(m, O, k)``,
    returning ``(b, O, k)``), ``_block(X, Y, offset)`` (the dense block, ``(b, O, m, O)``) and
    ``diag(X)``; single-output kernels get both from ``_tile``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Matern32
        >>> k = 2.0 * Matern32(lengthscale=0.5)
        >>> k.num_outputs, k.diag(jnp.zeros((3, 1)))
        (1, Array([2., 2., 2.], dtype=float32))
    """

    @property
    def num_outputs(self) -> int:
        """How many outputs $O$ the kernel covaries (1 for a single-output kernel)."""
        return 1

    def __call__(self, X, Y=None):
        """The dense Gram $k(X, Y)$, ``(n·O, m·O)`` (``Y`` None: $k(X, X)$, symmetric PSD)."""
        X = _check_inputs(X, type(self).__name__)
        if Y is None:
            self.check_inputs(X)
            Y, offset = X, 0
        else:
            Y = _check_inputs(Y, type(self).__name__)
            self.check_inputs(X, Y)
            offset = None
        if self.num_outputs == 1:
            return self._tile(X, Y, offset)
        n_out = self.num_outputs
        return self._block(X, Y, offset).reshape(X.shape[0] * n_out, Y.shape[0] * n_out)

    def _tile(self, X, Y, offset):
        raise NotImplementedError(f"{type(self).__name__} must define `_tile` (a single-output kernel) or "
                                  "`_block_mm` and `_block` (a multi-output kernel)")

    def _block_mm(self, X, Y, offset, V):
        """The row block of the Gram for ``X`` against ``Y``, times ``V`` ``(m, O, k)``: ``(b, O, k)``."""
        tile = self._tile(X, Y, offset)
        return (tile @ V.reshape(V.shape[0], -1)).reshape(X.shape[0], 1, -1)

    def _block(self, X, Y, offset):
        """The dense row block ``(b, O, m, O)``: entry ``[i, o, j, p]`` is $\\mathrm{cov}(f_o(x_i), f_p(y_j))$."""
        return self._tile(X, Y, offset)[:, None, :, None]

    @abc.abstractmethod
    def diag(self, X):
        """The Gram's diagonal $k(x_i, x_i)_{oo}$, ``(n·O,)`` in example-major order, without the Gram."""

    def check_inputs(self, X, Y=None):
        """Raise a clear error when the inputs do not fit the kernel (e.g. an ARD lengthscale)."""
        if Y is not None and X.shape[1] != Y.shape[1]:
            raise ValueError(f"{type(self).__name__}: inputs have {X.shape[1]} and {Y.shape[1]} dimensions")

    def __add__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return SumKernel(self, other)

    def __mul__(self, other):
        if isinstance(other, Kernel):
            return ProductKernel(self, other)
        if isinstance(other, (int, float, jax.Array, np.ndarray)) and jnp.ndim(other) == 0:
            return ScaledKernel(other, self)
        return NotImplemented

    __rmul__ = __mul__


# Inputs of at most this many dimensions get their pairwise sums by an unrolled loop over
# dimensions: on XLA:CPU a reduction over a short trailing axis of a (b, m, d) array runs
# 5-10x slower than d fused elementwise passes (measured for d = 2 and 8).
_FEW_DIMS = 8


def _pairwise_sum(X, Y, term):
    """``sum_k term(X[:, None, k] - Y[None, :, k], k)``, shape ``(len(X), len(Y))``."""
    if X.shape[1] <= _FEW_DIMS:
        total = term(X[:, None, 0] - Y[None, :, 0], 0)
        for k in range(1, X.shape[1]):
            total = total + term(X[:, None, k] - Y[None, :, k], k)
        return total
    return jnp.sum(term(X[:, None, :] - Y[None, :, :], slice(None)), axis=-1)


# --- combinations: k1 + k2, k1 * k2, c * k ----------------------------------------------------


class _Pair(Kernel):
    left: Kernel
    right: Kernel

    def check_inputs(self, X, Y=None):
        self.left.check_inputs(X, Y)
        self.right.check_inputs(X, Y)

    def _output_counts(self):
        for side in (self.left, self.right):
            if not isinstance(side, Kernel):
                raise TypeError(f"{type(self).__name__}: operands must be linops.kernels.Kernel, "
                                f"got {type(side).__name__}")
        return self.left.num_outputs, self.right.num_outputs


class SumKernel(_Pair):
    r"""``k1 + k2``; two multi-output kernels with as many outputs add blockwise.

    A sum of coregionalised kernels is the linear model of coregionalisation
    $\sum_q K_q \otimes B_q$.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Linear, White
        >>> (Linear() + White(1.0))(jnp.array([[2.0]]))
        Array([[5.]], dtype=float32)
    """

    def __check_init__(self):
        a, b = self._output_counts()
        if a == b:
            return
        hint = ""
        if min(a, b) == 1:
            hint = (f"; to give every output the single-output kernel, wrap it as "
                    f"Independent(k, num_outputs={max(a, b)}) (or Coregionalized(k, B))")
        raise ValueError(f"SumKernel: cannot add a kernel with {_outputs(a)} to a kernel with {_outputs(b)}{hint}")

    @property
    def num_outputs(self) -> int:
        return self.left.num_outputs

    def _tile(self, X, Y, offset):
        return self.left._tile(X, Y, offset) + self.right._tile(X, Y, offset)

    def _block_mm(self, X, Y, offset, V):
        if self.num_outputs == 1:  # one product with the summed tile, not one per term
            return super()._block_mm(X, Y, offset, V)
        return self.left._block_mm(X, Y, offset, V) + self.right._block_mm(X, Y, offset, V)

    def _block(self, X, Y, offset):
        return self.left._block(X, Y, offset) + self.right._block(X, Y, offset)

    def diag(self, X):
        return self.left.diag(X) + self.right.diag(X)


class ProductKernel(_Pair):
    """``k1 * k2`` of single-output kernels (elementwise: PSD by Schur's theorem).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Linear
        >>> (Linear() * Linear())(jnp.array([[2.0]]))
        Array([[16.]], dtype=float32)
    """

    def __check_init__(self):
        a, b = self._output_counts()
        if a != 1 or b != 1:
            raise ValueError(
                "ProductKernel: only single-output kernels multiply, got kernels with "
                f"{_outputs(a)} and {_outputs(b)}; "
                "multiply the single-output kernels first and then make the product multi-output, "
                "e.g. Coregionalized(k1 * k2, B) or Independent(k1 * k2, num_outputs=O)")

    def _tile(self, X, Y, offset):
        return self.left._tile(X, Y, offset) * self.right._tile(X, Y, offset)

    def diag(self, X):
        return self.left.diag(X) * self.right.diag(X)


class ScaledKernel(Kernel):
    """``c * k`` for a positive scalar ``c`` (any kernel, single- or multi-output).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import White
        >>> (3.0 * White(1.0)).diag(jnp.zeros((2, 1)))
        Array([3., 3.], dtype=float32)
    """

    scale: jax.Array
    kernel: Kernel

    def __init__(self, scale, kernel):
        if not isinstance(kernel, Kernel):
            raise TypeError(f"ScaledKernel: kernel must be a linops.kernels.Kernel, got {type(kernel).__name__}")
        self.scale = _positive("scale", "ScaledKernel", scale)
        self.kernel = kernel

    @property
    def num_outputs(self) -> int:
        return self.kernel.num_outputs

    def check_inputs(self, X, Y=None):
        self.kernel.check_inputs(X, Y)

    def _tile(self, X, Y, offset):
        return self.scale * self.kernel._tile(X, Y, offset)

    def _block_mm(self, X, Y, offset, V):
        if self.num_outputs == 1:
            return super()._block_mm(X, Y, offset, V)
        return self.scale * self.kernel._block_mm(X, Y, offset, V)

    def _block(self, X, Y, offset):
        return self.scale * self.kernel._block(X, Y, offset)

    def diag(self, X):
        return self.scale * self.kernel.diag(X)
