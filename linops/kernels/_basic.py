r"""Non-stationary and special single-output kernels: periodic, linear (dot product), white noise."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from linops.kernels._base import Kernel, _check_inputs, _pairwise_sum, _positive


class Periodic(Kernel):
    r"""Periodic $\sigma^2 \exp\!\big(-2 \sum_i \sin^2(\pi |x_i - y_i| / p) / \ell^2\big)$.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Periodic
        >>> k = Periodic(lengthscale=1.0, period=2.0)
        >>> k(jnp.array([[0.0]]), jnp.array([[2.0], [4.0]]))   # one and two periods away
        Array([[1., 1.]], dtype=float32)
    """

    lengthscale: jax.Array
    period: jax.Array
    variance: jax.Array

    def __init__(self, lengthscale=1.0, period=1.0, variance=1.0):
        self.lengthscale = _positive("lengthscale", "Periodic", lengthscale)
        self.period = _positive("period", "Periodic", period)
        self.variance = _positive("variance", "Periodic", variance)

    def _tile(self, X, Y, offset):
        ell = self.lengthscale

        def term(diff, k):
            scale = ell if ell.ndim == 0 else ell[k]
            return (jnp.sin(jnp.pi * diff / self.period) / scale) ** 2

        return self.variance * jnp.exp(-2 * _pairwise_sum(X, Y, term))

    def diag(self, X):
        X = _check_inputs(X, "Periodic")
        return jnp.full(X.shape[:1], self.variance, X.dtype)


class Linear(Kernel):
    r"""Linear (dot product) $\sigma^2 x^\top y + c$ (``bias`` $c \ge 0$).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Linear
        >>> Linear(variance=2.0, bias=1.0)(jnp.array([[1.0, 2.0]]), jnp.array([[3.0, 1.0]]))
        Array([[11.]], dtype=float32)
    """

    variance: jax.Array
    bias: jax.Array

    def __init__(self, variance=1.0, bias=0.0):
        self.variance = _positive("variance", "Linear", variance)
        bias = jnp.asarray(bias, dtype=jnp.result_type(float, bias))
        if not isinstance(bias, jax.core.Tracer) and not float(bias) >= 0:
            raise ValueError(f"Linear: bias must be non-negative, got {float(bias)}")
        self.bias = bias

    def _tile(self, X, Y, offset):
        return self.variance * (X @ Y.T) + self.bias

    def diag(self, X):
        X = _check_inputs(X, "Linear")
        return self.variance * jnp.sum(X**2, axis=1) + self.bias


class White(Kernel):
    r"""White noise: $\sigma^2$ on the diagonal of $k(X, X)$, zero elsewhere and in every $k(X, Y)$.

    It depends on the identity of the points, not their values (as in scikit-learn): a test
    point that coincides with a training point shares no noise with it.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import White
        >>> X = jnp.zeros((2, 1))
        >>> White(0.5)(X), White(0.5)(X, X)
        (Array([[0.5, 0. ],
               [0. , 0.5]], dtype=float32), Array([[0., 0.],
               [0., 0.]], dtype=float32))
    """

    variance: jax.Array

    def __init__(self, variance=1.0):
        self.variance = _positive("variance", "White", variance)

    def _tile(self, X, Y, offset):
        dtype = jnp.result_type(X.dtype, self.variance.dtype)
        if offset is None:
            return jnp.zeros((X.shape[0], Y.shape[0]), dtype)
        same = (offset + jnp.arange(X.shape[0]))[:, None] == jnp.arange(Y.shape[0])[None, :]
        return jnp.where(same, self.variance, 0.0).astype(dtype)

    def diag(self, X):
        X = _check_inputs(X, "White")
        return jnp.full(X.shape[:1], self.variance, X.dtype)
