r"""Kernel algebra: sums, products and positive scalings of kernels."""

from __future__ import annotations

import jax

from linops.kernels._base import Kernel, _outputs, _positive


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


class Sum(_Pair):
    r"""``k1 + k2``; two multi-output kernels with as many outputs add blockwise.

    A sum of coregionalised kernels is the linear model of coregionalisation
    $\sum_q K_q \otimes B_q$.

    Example:
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
        raise ValueError(f"Sum: cannot add a kernel with {_outputs(a)} to a kernel with {_outputs(b)}{hint}")

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


class Product(_Pair):
    """``k1 * k2`` of single-output kernels (elementwise: PSD by Schur's theorem).

    Example:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Linear
        >>> (Linear() * Linear())(jnp.array([[2.0]]))
        Array([[16.]], dtype=float32)
    """

    def __check_init__(self):
        a, b = self._output_counts()
        if a != 1 or b != 1:
            raise ValueError(
                f"Product: only single-output kernels multiply, got kernels with {_outputs(a)} and {_outputs(b)}; "
                "multiply the single-output kernels first and then make the product multi-output, "
                "e.g. Coregionalized(k1 * k2, B) or Independent(k1 * k2, num_outputs=O)")

    def _tile(self, X, Y, offset):
        return self.left._tile(X, Y, offset) * self.right._tile(X, Y, offset)

    def diag(self, X):
        return self.left.diag(X) * self.right.diag(X)


class Scaled(Kernel):
    """``c * k`` for a positive scalar ``c`` (any kernel, single- or multi-output).

    Example:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import White
        >>> (3.0 * White(1.0)).diag(jnp.zeros((2, 1)))
        Array([3., 3.], dtype=float32)
    """

    scale: jax.Array
    kernel: Kernel

    def __init__(self, scale, kernel):
        if not isinstance(kernel, Kernel):
            raise TypeError(f"Scaled kernel: kernel must be a linops.kernels.Kernel, got {type(kernel).__name__}")
        self.scale = _positive("scale", "Scaled kernel", scale)
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
