r"""Multi-output kernels: independent outputs and coregionalised (Kronecker) outputs.

A multi-output kernel with $O$ outputs gives $\mathrm{cov}(f_o(x_i), f_{o'}(y_j))$; its Gram matrix
is $(nO) \times (mO)$ in example-major order (row $iO + o$ is output $o$ of example $i$, as in
`JacobianOp`).
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops.kernels._base import Kernel, _outputs


def _single_output(kernel, who, what):
    if not isinstance(kernel, Kernel):
        raise TypeError(f"{who}: {what} must be a linops.kernels.Kernel, got {type(kernel).__name__}")
    if kernel.num_outputs != 1:
        raise ValueError(f"{who}: {what} must be a single-output kernel, got {type(kernel).__name__} with "
                         f"{_outputs(kernel.num_outputs)}")
    return kernel


def _check_one_output(kernel):
    if kernel.num_outputs != 1:  # an internal error: multi-output kernels are evaluated by blocks
        raise NotImplementedError(f"{type(kernel).__name__} with {_outputs(kernel.num_outputs)} has no "
                                  "single-output tile; use `_block_mm` or `_block`")


class Independent(Kernel):
    r"""Independent outputs: $\mathrm{cov}(f_o(x), f_{o'}(y)) = \delta_{oo'}\, k_o(x, y)$.

    Two forms: ``Independent(k, num_outputs=O)`` gives all $O$ outputs the same kernel $k$ (a Gram
    product computes its tile once, not $O$ times); ``Independent([k_1, ..., k_O])`` gives each
    output its own single-output kernel. The Gram is block diagonal in output-major order;
    in the example-major order used here it is $\sum_o K_o \otimes e_o e_o^\top$.

    Args:
        kernels: one single-output kernel (with ``num_outputs``) or a list of them, one per output.
        num_outputs: how many outputs share the one kernel; only with a single kernel.

    Raises:
        ValueError: for a multi-output component, an empty list, ``num_outputs < 1``, a single
            kernel without ``num_outputs`` or a list with it.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Independent, RBF, White
        >>> k = Independent([RBF(), White(2.0)])
        >>> k.num_outputs, k(jnp.zeros((1, 1)))
        (2, Array([[1., 0.],
               [0., 2.]], dtype=float32))
    """

    kernels: tuple[Kernel, ...]
    _num_outputs: int = eqx.field(static=True)

    def __init__(self, kernels: Kernel | Sequence[Kernel], num_outputs: int | None = None):
        if isinstance(kernels, Kernel):
            if num_outputs is None:
                raise ValueError("Independent: one kernel needs num_outputs=O, how many outputs share it "
                                 "(or give a list of kernels, one per output)")
            if isinstance(num_outputs, bool) or not isinstance(num_outputs, (int, np.integer)) or num_outputs < 1:
                raise ValueError(f"Independent: num_outputs must be a positive integer, got {num_outputs!r}")
            self.kernels = (_single_output(kernels, "Independent", "the shared kernel"),)
            self._num_outputs = int(num_outputs)
            return
        if not isinstance(kernels, Sequence):
            raise TypeError(f"Independent: expected a Kernel or a list of kernels, got {type(kernels).__name__}")
        if num_outputs is not None:
            raise ValueError(f"Independent: give one kernel with num_outputs, or a list of kernels (one per "
                             f"output) without it; got {len(kernels)} kernels and num_outputs={num_outputs!r}")
        if len(kernels) == 0:
            raise ValueError("Independent: expected at least one kernel (one per output), got an empty list")
        self.kernels = tuple(_single_output(k, "Independent", f"kernel {i}") for i, k in enumerate(kernels))
        self._num_outputs = len(kernels)

    @property
    def num_outputs(self) -> int:
        return self._num_outputs

    @property
    def is_shared(self) -> bool:
        """Whether one kernel serves every output."""
        return len(self.kernels) == 1

    def check_inputs(self, X, Y=None):
        for k in self.kernels:
            k.check_inputs(X, Y)

    def _tile(self, X, Y, offset):  # one output: a single-output kernel like any other
        _check_one_output(self)
        return self.kernels[0]._tile(X, Y, offset)

    def _block_mm(self, X, Y, offset, V):
        m, n_out = V.shape[0], self.num_outputs
        if self.is_shared:
            tile = self.kernels[0]._tile(X, Y, offset)
            return (tile @ V.reshape(m, -1)).reshape(X.shape[0], n_out, -1)
        return jnp.stack([k._tile(X, Y, offset) @ V[:, o, :] for o, k in enumerate(self.kernels)], axis=1)

    def _block(self, X, Y, offset):
        n_out = self.num_outputs
        if self.is_shared:
            tile = self.kernels[0]._tile(X, Y, offset)
            return tile[:, None, :, None] * jnp.eye(n_out, dtype=tile.dtype)[None, :, None, :]
        tiles = jnp.stack([k._tile(X, Y, offset) for k in self.kernels])  # (O, b, m)
        return jnp.einsum("obm,op->bomp", tiles, jnp.eye(n_out, dtype=tiles.dtype))

    def diag(self, X):
        if self.is_shared:
            return jnp.repeat(self.kernels[0].diag(X), self.num_outputs)
        return jnp.stack([k.diag(X) for k in self.kernels], axis=1).reshape(-1)


class Coregionalized(Kernel):
    r"""Coregionalised outputs: $\mathrm{cov}(f_o(x), f_{o'}(y)) = k(x, y)\, B_{oo'}$, a Gram $K \otimes B$.

    ``B`` (``output_covariance``) is the $O \times O$ covariance between outputs, an array leaf
    differentiated like the other hyperparameters. A concrete ``B`` must be symmetric and
    positive semi-definite up to a relative tolerance of $10\sqrt{\epsilon}$ of its dtype.
    A `SumKernel` of these is the linear model of coregionalisation.

    Args:
        kernel: a single-output kernel $k$.
        output_covariance: the symmetric PSD matrix $B$, shape ``(O, O)``.

    Raises:
        ValueError: for a multi-output ``kernel``, a non-square, asymmetric or indefinite ``B``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Coregionalized, White
        >>> B = jnp.array([[1.0, 0.5], [0.5, 2.0]])
        >>> Coregionalized(White(1.0), B)(jnp.zeros((2, 1)))   # I ⊗ B
        Array([[1. , 0.5, 0. , 0. ],
               [0.5, 2. , 0. , 0. ],
               [0. , 0. , 1. , 0.5],
               [0. , 0. , 0.5, 2. ]], dtype=float32)
    """

    kernel: Kernel
    output_covariance: jax.Array

    def __init__(self, kernel: Kernel, output_covariance):
        self.kernel = _single_output(kernel, "Coregionalized", "kernel")
        B = jnp.asarray(output_covariance, dtype=jnp.result_type(float, output_covariance))
        if B.ndim != 2 or B.shape[0] != B.shape[1] or B.shape[0] < 1:
            raise ValueError(f"Coregionalized: output_covariance must be a square (O, O) matrix with O >= 1, "
                             f"got shape {B.shape}")
        if not isinstance(B, jax.core.Tracer):
            _check_psd(np.asarray(B))
        self.output_covariance = B

    @property
    def num_outputs(self) -> int:
        return self.output_covariance.shape[0]

    def check_inputs(self, X, Y=None):
        self.kernel.check_inputs(X, Y)

    def _tile(self, X, Y, offset):  # one output: a single-output kernel like any other
        _check_one_output(self)
        return self.output_covariance[0, 0] * self.kernel._tile(X, Y, offset)

    def _block_mm(self, X, Y, offset, V):
        m, n_out = V.shape[0], self.num_outputs
        tile = self.kernel._tile(X, Y, offset)
        KV = (tile @ V.reshape(m, -1)).reshape(X.shape[0], n_out, -1)
        return jnp.einsum("op,bpk->bok", self.output_covariance, KV)

    def _block(self, X, Y, offset):
        tile = self.kernel._tile(X, Y, offset)
        return tile[:, None, :, None] * self.output_covariance[None, :, None, :]

    def diag(self, X):
        return (self.kernel.diag(X)[:, None] * jnp.diag(self.output_covariance)[None, :]).reshape(-1)


def _check_psd(B):
    rtol = 10 * float(np.sqrt(np.finfo(B.dtype).eps))
    if not np.all(np.isfinite(B)):
        raise ValueError(f"Coregionalized: output_covariance must be finite, got {B}")
    scale = float(np.max(np.abs(B)))
    asym = float(np.max(np.abs(B - B.T)))
    if asym > rtol * scale:
        raise ValueError(f"Coregionalized: output_covariance must be symmetric, got max |B - B.T| = {asym:.3g} "
                         f"for max |B| = {scale:.3g} (relative tolerance {rtol:.1e}); symmetrise it, (B + B.T) / 2")
    eig = np.linalg.eigvalsh(B)
    if eig[0] < -rtol * np.max(np.abs(eig)):
        raise ValueError(f"Coregionalized: output_covariance must be positive semi-definite, got the eigenvalue "
                         f"{eig[0]:.3g} (largest |eigenvalue| {np.max(np.abs(eig)):.3g}, relative tolerance "
                         f"{rtol:.1e}); build it as W @ W.T + diag(kappa)")
