r"""Stationary kernels: functions of the scaled distance $r = \|(x - y) / \ell\|$ (RBF, Matérn, RQ)."""

from __future__ import annotations

import abc
import math

import jax
import jax.numpy as jnp

from linops.kernels._base import _FEW_DIMS, Kernel, _check_inputs, _pairwise_sum, _positive


class Stationary(Kernel):
    """A kernel of the scaled distance $r = \\|(x - y)/\\ell\\|$, times a variance $\\sigma^2$.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import RBF
        >>> RBF(lengthscale=jnp.array([1.0, 2.0]))(jnp.zeros((1, 2)), jnp.array([[1.0, 2.0]]))
        Array([[0.36787945]], dtype=float32)
    """

    lengthscale: jax.Array
    variance: jax.Array

    def __init__(self, lengthscale=1.0, variance=1.0):
        self.lengthscale = _positive("lengthscale", type(self).__name__, lengthscale)
        self.variance = _positive("variance", type(self).__name__, variance)

    def check_inputs(self, X, Y=None):
        super().check_inputs(X, Y)
        if self.lengthscale.ndim == 1 and self.lengthscale.shape[0] != X.shape[1]:
            raise ValueError(f"{type(self).__name__}: {self.lengthscale.shape[0]} lengthscales for inputs of "
                             f"dimension {X.shape[1]}")

    @abc.abstractmethod
    def _profile(self, r2):
        """$k / \\sigma^2$ as a function of the squared scaled distance."""

    def _tile(self, X, Y, offset):
        return self.variance * self._profile(_scaled_sq_dist(X, Y, self.lengthscale, offset))

    def diag(self, X):
        X = _check_inputs(X, type(self).__name__)
        return jnp.broadcast_to(self.variance * self._profile(jnp.zeros((), X.dtype)), X.shape[:1]).astype(X.dtype)


def _scaled_sq_dist(X, Y, ell, offset):
    r"""Squared distances $\|(x - y)/\ell\|^2$ between the rows of ``X`` and ``Y``.

    Few dimensions: exact differences, one dimension at a time, each scaled after the
    subtraction (scaling the inputs first and slicing their columns triggered an XLA:CPU
    miscompilation of the Matérn-5/2 profile followed by a broadcast product, in jaxlib 0.10.2:
    `tests/linops/test_multioutput_kernels.py` caught it). Many: the expansion
    $|x|^2 + |y|^2 - 2x^\top y$ (one matrix product) after centring both on ``Y``'s mean (the
    distance is translation invariant, and centring shrinks the expansion's rounding
    $\approx \text{eps}\,(|x|^2 + |y|^2)$), clamped at 0, with the diagonal of a symmetric Gram
    (``offset`` given) set to exactly 0. Only coincident points of a cross-covariance keep an
    $r^2$ of rounding size, which the Matérn kernels' square root turns into $\sqrt{\text{eps}}$.
    """
    if X.shape[1] <= _FEW_DIMS:
        return _pairwise_sum(X, Y, lambda diff, k: (diff / (ell if ell.ndim == 0 else ell[k])) ** 2)
    scale = ell if ell.ndim == 0 else ell[None, :]
    X, Y = X / scale, Y / scale
    centre = jnp.mean(Y, axis=0, keepdims=True)
    X, Y = X - centre, Y - centre
    r2 = jnp.maximum(jnp.sum(X**2, axis=1)[:, None] + jnp.sum(Y**2, axis=1)[None, :] - 2 * (X @ Y.T), 0.0)
    if offset is not None:
        same = (offset + jnp.arange(X.shape[0]))[:, None] == jnp.arange(Y.shape[0])[None, :]
        r2 = jnp.where(same, 0.0, r2)
    return r2


def _safe_sqrt(r2):
    # sqrt with a finite gradient at 0 (Matérn kernels at coincident points).
    pos = r2 > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, r2, 1.0)), 0.0)


class RBF(Stationary):
    r"""Squared exponential $\sigma^2 \exp(-r^2/2)$.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import RBF
        >>> round(float(RBF(lengthscale=2.0, variance=3.0)(jnp.array([[0.0]]), jnp.array([[2.0]]))[0, 0]), 4)
        1.8196
    """

    def _profile(self, r2):
        return jnp.exp(-0.5 * r2)


class Matern12(Stationary):
    r"""Matérn 1/2 (exponential) $\sigma^2 e^{-r}$.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Matern12
        >>> Matern12()(jnp.array([[0.0]]), jnp.array([[1.0]]))
        Array([[0.36787945]], dtype=float32)
    """

    def _profile(self, r2):
        return jnp.exp(-_safe_sqrt(r2))


class Matern32(Stationary):
    r"""Matérn 3/2 $\sigma^2 (1 + \sqrt3 r) e^{-\sqrt3 r}$.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Matern32
        >>> round(float(Matern32()(jnp.array([[0.0]]), jnp.array([[1.0]]))[0, 0]), 4)
        0.4834
    """

    def _profile(self, r2):
        s = math.sqrt(3.0) * _safe_sqrt(r2)
        return (1 + s) * jnp.exp(-s)


class Matern52(Stationary):
    r"""Matérn 5/2 $\sigma^2 (1 + \sqrt5 r + 5r^2/3) e^{-\sqrt5 r}$.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Matern52
        >>> Matern52()(jnp.array([[0.0]]), jnp.array([[1.0]]))
        Array([[0.5239941]], dtype=float32)
    """

    def _profile(self, r2):
        s = math.sqrt(5.0) * _safe_sqrt(r2)
        return (1 + s + s**2 / 3) * jnp.exp(-s)


class RationalQuadratic(Stationary):
    r"""Rational quadratic $\sigma^2 (1 + r^2 / (2\alpha))^{-\alpha}$ (a scale mixture of RBFs).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import RationalQuadratic
        >>> RationalQuadratic(alpha=1.0)(jnp.array([[0.0]]), jnp.array([[2.0]]))
        Array([[0.33333334]], dtype=float32)
    """

    alpha: jax.Array

    def __init__(self, lengthscale=1.0, variance=1.0, alpha=1.0):
        super().__init__(lengthscale, variance)
        self.alpha = _positive("alpha", "RationalQuadratic", alpha)

    def _profile(self, r2):
        return (1 + r2 / (2 * self.alpha)) ** (-self.alpha)
