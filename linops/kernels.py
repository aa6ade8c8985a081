r"""Covariance kernels and `KernelGramOp`, their Gram matrices as lazy operators.

A kernel is an `equinox.Module` whose hyperparameters are array leaves, so ``jax.grad`` (or
``eqx.filter_grad``) differentiates through them. Kernels add (``k1 + k2``), multiply
(``k1 * k2``) and scale (``2.0 * k``). ``k(X)`` and ``k(X, Y)`` give small dense Gram matrices;
`KernelGramOp` gives the same matrix as an operator evaluated tile by tile, never holding the
``n x m`` matrix.

Inputs are 2-D, ``(n, d)``. Stationary kernels use the scaled distance
$r = \|(x - y) / \ell\|$ with a scalar or per-dimension (ARD) lengthscale $\ell$.

Example:
    >>> import jax.numpy as jnp
    >>> from linops.kernels import RBF, White
    >>> k = RBF(lengthscale=1.0) + White(0.1)
    >>> G = k(jnp.array([[0.0], [1.0]]))
    >>> [[round(float(g), 4) for g in row] for row in G]   # exp(-1/2) off the diagonal
    [[1.1, 0.6065], [0.6065, 1.1]]
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linops import _tags
from linops._base import LinearOperator, new_key
from linops.memory import check_fits


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


class Kernel(eqx.Module):
    """Base class: a positive semi-definite covariance function $k(x, y)$.

    Subclasses implement ``_tile(X, Y, offset)``: the block $k(X, Y)$ where ``offset`` is the
    index of ``X[0]`` in ``Y`` when ``X`` is a slice of the same set (None for a cross-covariance;
    only `White` needs it), and ``diag(X)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Matern32
        >>> k = 2.0 * Matern32(lengthscale=0.5)
        >>> k.diag(jnp.zeros((3, 1)))
        Array([2., 2., 2.], dtype=float32)
    """

    def __call__(self, X, Y=None):
        """The dense Gram $k(X, Y)$ (``Y`` None: $k(X, X)$, symmetric PSD)."""
        X = _check_inputs(X, type(self).__name__)
        if Y is None:
            self.check_inputs(X)
            return self._tile(X, X, 0)
        Y = _check_inputs(Y, type(self).__name__)
        self.check_inputs(X, Y)
        return self._tile(X, Y, None)

    def _tile(self, X, Y, offset):
        raise NotImplementedError(f"{type(self).__name__} must define `_tile`")

    def diag(self, X):
        """$k(x_i, x_i)$ for each row of ``X``, without the Gram."""
        raise NotImplementedError(f"{type(self).__name__} must define `diag`")

    def check_inputs(self, X, Y=None):
        """Raise a clear error when the inputs do not fit the kernel (e.g. an ARD lengthscale)."""
        if Y is not None and X.shape[1] != Y.shape[1]:
            raise ValueError(f"{type(self).__name__}: inputs have {X.shape[1]} and {Y.shape[1]} dimensions")

    def __add__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return Sum(self, other)

    def __mul__(self, other):
        if isinstance(other, Kernel):
            return Product(self, other)
        if isinstance(other, (int, float, jax.Array, np.ndarray)) and jnp.ndim(other) == 0:
            return Scaled(other, self)
        return NotImplemented

    __rmul__ = __mul__


class Stationary(Kernel):
    """A kernel of the scaled distance $r = \\|(x - y)/\\ell\\|$, times a variance $\\sigma^2$.

    Example:
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

    def _profile(self, r2):
        """$k / \\sigma^2$ as a function of the squared scaled distance."""
        raise NotImplementedError

    def _tile(self, X, Y, offset):
        ell = self.lengthscale if self.lengthscale.ndim == 0 else self.lengthscale[None, None, :]
        # Differences, not |x|^2 + |y|^2 - 2 x.y: the expansion leaves r^2 ~ eps |x|^2 at coincident
        # points, which the Matérn kernels' sqrt turns into an error of sqrt(eps).
        r2 = jnp.sum(((X[:, None, :] - Y[None, :, :]) / ell) ** 2, axis=-1)
        return self.variance * self._profile(r2)

    def diag(self, X):
        X = _check_inputs(X, type(self).__name__)
        return jnp.broadcast_to(self.variance * self._profile(jnp.zeros((), X.dtype)), X.shape[:1]).astype(X.dtype)


def _safe_sqrt(r2):
    # sqrt with a finite gradient at 0 (Matérn kernels at coincident points).
    pos = r2 > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, r2, 1.0)), 0.0)


class RBF(Stationary):
    r"""Squared exponential $\sigma^2 \exp(-r^2/2)$.

    Example:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import RBF
        >>> round(float(RBF(lengthscale=2.0, variance=3.0)(jnp.array([[0.0]]), jnp.array([[2.0]]))[0, 0]), 4)
        1.8196
    """

    def _profile(self, r2):
        return jnp.exp(-0.5 * r2)


class Matern12(Stationary):
    r"""Matérn 1/2 (exponential) $\sigma^2 e^{-r}$.

    Example:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Matern12
        >>> Matern12()(jnp.array([[0.0]]), jnp.array([[1.0]]))
        Array([[0.36787945]], dtype=float32)
    """

    def _profile(self, r2):
        return jnp.exp(-_safe_sqrt(r2))


class Matern32(Stationary):
    r"""Matérn 3/2 $\sigma^2 (1 + \sqrt3 r) e^{-\sqrt3 r}$.

    Example:
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

    Example:
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

    Example:
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


class Periodic(Kernel):
    r"""Periodic $\sigma^2 \exp\!\big(-2 \sum_i \sin^2(\pi |x_i - y_i| / p) / \ell^2\big)$.

    Example:
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
        ell = self.lengthscale if self.lengthscale.ndim == 0 else self.lengthscale[None, None, :]
        s = jnp.sin(jnp.pi * (X[:, None, :] - Y[None, :, :]) / self.period) / ell
        return self.variance * jnp.exp(-2 * jnp.sum(s**2, axis=-1))

    def diag(self, X):
        X = _check_inputs(X, "Periodic")
        return jnp.full(X.shape[:1], self.variance, X.dtype)


class Linear(Kernel):
    r"""Linear (dot product) $\sigma^2 x^\top y + c$ (``bias`` $c \ge 0$).

    Example:
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

    Example:
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


class _Pair(Kernel):
    left: Kernel
    right: Kernel

    def check_inputs(self, X, Y=None):
        self.left.check_inputs(X, Y)
        self.right.check_inputs(X, Y)


class Sum(_Pair):
    """``k1 + k2``.

    Example:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Linear, White
        >>> (Linear() + White(1.0))(jnp.array([[2.0]]))
        Array([[5.]], dtype=float32)
    """

    def _tile(self, X, Y, offset):
        return self.left._tile(X, Y, offset) + self.right._tile(X, Y, offset)

    def diag(self, X):
        return self.left.diag(X) + self.right.diag(X)


class Product(_Pair):
    """``k1 * k2`` (elementwise: the product of PSD kernels is PSD, by Schur's theorem).

    Example:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import Linear
        >>> (Linear() * Linear())(jnp.array([[2.0]]))
        Array([[16.]], dtype=float32)
    """

    def _tile(self, X, Y, offset):
        return self.left._tile(X, Y, offset) * self.right._tile(X, Y, offset)

    def diag(self, X):
        return self.left.diag(X) * self.right.diag(X)


class Scaled(Kernel):
    """``c * k`` for a positive scalar ``c``.

    Example:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import White
        >>> (3.0 * White(1.0)).diag(jnp.zeros((2, 1)))
        Array([3., 3.], dtype=float32)
    """

    scale: jax.Array
    kernel: Kernel

    def __init__(self, scale, kernel):
        self.scale = _positive("scale", "Scaled kernel", scale)
        self.kernel = kernel

    def check_inputs(self, X, Y=None):
        self.kernel.check_inputs(X, Y)

    def _tile(self, X, Y, offset):
        return self.scale * self.kernel._tile(X, Y, offset)

    def diag(self, X):
        return self.scale * self.kernel.diag(X)


class KernelGramOp(LinearOperator):
    r"""The Gram matrix $K_{ij} = k(x_i, y_j)$ as an operator, computed tile by tile.

    Products run as one `lax.map` over blocks of ``block_size`` rows of ``X``: each block's
    ``block_size x m`` tile is formed, used and dropped, so memory is $O(\text{block} \cdot m d)$
    (the pairwise differences of ``d``-dimensional inputs), never $O(nm)$. The default block
    keeps a tile near $2^{22}$ numbers. With ``X2`` None the operator is $k(X, X)$, tagged symmetric PSD, with an
    exact `lo.diag`; with ``X2`` it is the cross-covariance $k(X, X_2)$ (``n x m``).

    Example:
        >>> import jax.numpy as jnp, linops as lo
        >>> from linops.kernels import RBF, KernelGramOp
        >>> X = jnp.linspace(0.0, 1.0, 5)[:, None]
        >>> K = KernelGramOp(RBF(lengthscale=0.5), X, block_size=2)
        >>> bool(jnp.allclose(K @ jnp.ones(5), RBF(lengthscale=0.5)(X) @ jnp.ones(5)))
        True
        >>> sorted(K.tags), lo.diag(K)
        (['psd', 'symmetric'], Array([1., 1., 1., 1., 1.], dtype=float32))
    """

    kernel: Kernel
    X: jax.Array
    X2: jax.Array | None
    block_size: int = eqx.field(static=True)
    uid: int = eqx.field(static=True)

    def __init__(self, kernel: Kernel, X, X2=None, *, block_size: int | None = None):
        if not isinstance(kernel, Kernel):
            raise TypeError(f"KernelGramOp: kernel must be a linops.kernels.Kernel, got {type(kernel).__name__}")
        X = _check_inputs(X, "KernelGramOp")
        X2 = None if X2 is None else _check_inputs(X2, "KernelGramOp")
        if X2 is not None and X2.shape[1] != X.shape[1]:
            raise ValueError(f"KernelGramOp: X has {X.shape[1]} input dimensions but X2 has {X2.shape[1]}")
        kernel.check_inputs(X, X2)
        m = X.shape[0] if X2 is None else X2.shape[0]
        if block_size is None:  # tiles of about 2^22 numbers (16 MB in float32), differences included
            block_size = max(1, min(X.shape[0], (1 << 22) // max(m * X.shape[1], 1)))
        if not isinstance(block_size, (int, np.integer)) or block_size < 1:
            raise ValueError(f"KernelGramOp: block_size must be a positive integer, got {block_size!r}")
        self.kernel, self.X, self.X2 = kernel, X, X2
        self.block_size = int(min(block_size, X.shape[0]))
        self.uid = new_key()

    @property
    def shape(self):
        return (self.X.shape[0], self.X.shape[0] if self.X2 is None else self.X2.shape[0])

    @property
    def dtype(self):
        return jnp.result_type(self.X.dtype, *jax.tree_util.tree_leaves(self.kernel))

    @property
    def tags(self):
        return _tags.close({_tags.psd} if self.X2 is None else set(), self.shape)

    def _blocks(self):
        """Row blocks of X, padded with its last rows to a whole number of blocks."""
        n, b = self.X.shape[0], self.block_size
        count = -(-n // b)
        idx = np.minimum(np.arange(count * b), n - 1).reshape(count, b)
        starts = np.arange(count) * b
        return self.X[idx], jnp.asarray(starts)

    def _columns(self):
        return self.X if self.X2 is None else self.X2

    def _tile(self, Xb, start):
        return self.kernel._tile(Xb, self._columns(), start if self.X2 is None else None).astype(self.dtype)

    def mm(self, V):
        blocks, starts = self._blocks()
        out = lax.map(lambda a: self._tile(a[0], a[1]) @ V.astype(self.dtype), (blocks, starts))
        return out.reshape((-1,) + out.shape[2:])[: self.shape[0]]

    def mv(self, v):
        return self.mm(v[:, None])[:, 0]

    def rmm(self, U):
        if self.X2 is None:
            return self.mm(U)
        blocks, starts = self._blocks()
        n, b = self.X.shape[0], self.block_size
        U = jnp.asarray(U, self.dtype)
        pad = jnp.zeros((blocks.shape[0] * b - n,) + U.shape[1:], self.dtype)  # padded rows contribute 0
        Ub = jnp.concatenate([U, pad]).reshape((blocks.shape[0], b) + U.shape[1:])

        def step(acc, a):
            return acc + self._tile(a[0], a[1]).T @ a[2], None

        init = jnp.zeros((self.shape[1],) + U.shape[1:], self.dtype)
        return lax.scan(step, init, (blocks, starts, Ub))[0]

    def rmv(self, u):
        return self.rmm(u[:, None])[:, 0]

    def transpose(self):
        if self.X2 is None:
            return self
        return KernelGramOp(self.kernel, self.X2, self.X, block_size=self.block_size)

    def as_matrix(self):
        n, m = self.shape
        check_fits(n * m * np.dtype(self.dtype).itemsize, f"KernelGramOp({n} x {m}).as_matrix()",
                   "apply the operator to vectors (K @ v) instead")
        blocks, starts = self._blocks()
        tiles = lax.map(lambda a: self._tile(a[0], a[1]), (blocks, starts))
        return tiles.reshape(-1, m)[:n]

    def _diag(self):
        if self.X2 is not None:
            return NotImplemented
        return self.kernel.diag(self.X).astype(self.dtype)




class GPFit(eqx.Module):
    """The result of `fit_gp`: the fitted kernel and noise, and the optimisation's trace.

    Attributes:
        kernel: the kernel at the last step.
        noise_variance: the Gaussian noise variance at the last step.
        log_marginal_likelihood: per step, the exact log marginal likelihood of the (sub)set.
        num_points: how many points the likelihood used.
    """

    kernel: Kernel
    noise_variance: jax.Array
    log_marginal_likelihood: jax.Array
    num_points: int = eqx.field(static=True)


def gp_log_marginal_likelihood(kernel: Kernel, X, y, noise_variance) -> jax.Array:
    r"""$\log \mathcal N(y \mid 0, K + \sigma^2 I)$, exactly (a Cholesky of the ``n x n`` Gram).

    Example:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import White, gp_log_marginal_likelihood
        >>> # K + noise = 2 I: two independent N(0, 2) terms
        >>> round(float(gp_log_marginal_likelihood(White(1.0), jnp.zeros((2, 1)), jnp.zeros(2), 1.0)), 4)
        -2.531
    """
    X = _check_inputs(X, "gp_log_marginal_likelihood")
    y = jnp.asarray(y)
    if y.shape != X.shape[:1]:
        raise ValueError(f"gp_log_marginal_likelihood: y must have shape ({X.shape[0]},), got {y.shape}")
    n = X.shape[0]
    check_fits(n * n * np.dtype(jnp.result_type(X.dtype, float)).itemsize, f"the exact GP likelihood of {n} points",
               "fit on a subset (fit_gp(..., max_points=m, key=key))")
    G = kernel(X) + noise_variance * jnp.eye(n, dtype=X.dtype)
    L = jnp.linalg.cholesky(G)
    alpha = jax.scipy.linalg.cho_solve((L, True), y)
    return -0.5 * y @ alpha - jnp.sum(jnp.log(jnp.diag(L))) - 0.5 * n * jnp.log(2 * jnp.pi)


def fit_gp(kernel: Kernel, X, y, *, noise_variance=0.1, num_steps: int = 200, learning_rate: float = 0.05,
           max_points: int | None = None, key: jax.Array | None = None, fit_noise: bool = True) -> GPFit:
    r"""Maximise the exact GP marginal likelihood over the kernel's hyperparameters (and the noise).

    Adam (optax) on the logarithms of every positive hyperparameter, so they stay positive;
    hyperparameters that are exactly zero (a `Linear` bias of 0) stay fixed. With ``max_points``
    the likelihood uses a random subset of that size (drawn with ``key``), as FSP-Laplace does
    to set its prior. Returns a `GPFit` with the per-step likelihood.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from linops.kernels import RBF, fit_gp
        >>> X = jnp.linspace(-3, 3, 40)[:, None]
        >>> y = jnp.sin(2 * X[:, 0])
        >>> fit = fit_gp(RBF(lengthscale=3.0), X, y, noise_variance=0.1, num_steps=100)
        >>> bool(fit.log_marginal_likelihood[-1] > fit.log_marginal_likelihood[0])
        True
    """
    import optax

    X = _check_inputs(X, "fit_gp")
    y = jnp.asarray(y)
    if y.shape != X.shape[:1]:
        raise ValueError(f"fit_gp: y must have shape ({X.shape[0]},), got {y.shape}")
    kernel.check_inputs(X)
    if max_points is not None and X.shape[0] > max_points:
        if key is None:
            raise ValueError(f"fit_gp: a subset of {max_points} of the {X.shape[0]} points needs a PRNG key")
        idx = jax.random.choice(key, X.shape[0], (max_points,), replace=False)
        X, y = X[idx], y[idx]
    noise = _positive("noise_variance", "fit_gp", noise_variance)
    params, static = eqx.partition((kernel, noise), eqx.is_inexact_array)
    fixed = jax.tree_util.tree_map(lambda a: a <= 0, params)
    logs = jax.tree_util.tree_map(lambda a, f: jnp.log(jnp.where(f, 1.0, a)), params, fixed)

    def unpack(logs):
        values = jax.tree_util.tree_map(lambda lg, a, f: jnp.where(f, a, jnp.exp(lg)), logs, params, fixed)
        kern, noise_ = eqx.combine(values, static)
        return kern, (noise_ if fit_noise else noise)

    def loss(logs):
        kern, noise_ = unpack(logs)
        return -gp_log_marginal_likelihood(kern, X, y, noise_)

    opt = optax.adam(learning_rate)

    @jax.jit
    def run(logs):
        def step(state, _):
            logs, opt_state = state
            value, grad = jax.value_and_grad(loss)(logs)
            updates, opt_state = opt.update(grad, opt_state, logs)
            return (optax.apply_updates(logs, updates), opt_state), -value

        (logs, _), history = lax.scan(step, (logs, opt.init(logs)), None, length=num_steps)
        return logs, history

    logs, history = run(logs)
    kern, noise_ = unpack(logs)
    return GPFit(kern, noise_, history, int(X.shape[0]))


__all__ = [
    "fit_gp", "gp_log_marginal_likelihood", "GPFit", "Kernel", "KernelGramOp", "Linear", "Matern12", "Matern32",
    "Matern52", "Periodic", "Product", "RationalQuadratic", "RBF", "Scaled", "Stationary", "Sum", "White",
]
