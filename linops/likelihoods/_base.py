"""The likelihoods of one example's output vector and the curvatures built on them (`linops.likelihoods`)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops.algebra._leaves import Dense, Diagonal
from linops.runtime import flat_draw


class Likelihood(eqx.Module):
    """Base class. ``per_example`` says the likelihood's arrays have a leading example axis."""

    @property
    def per_example(self) -> bool:
        return False

    def nll(self, f, y):
        raise NotImplementedError

    def grad(self, f, y):
        raise NotImplementedError

    def hvp(self, f, y, u):
        raise NotImplementedError

    def hessian(self, f, y):
        raise NotImplementedError

    def hessian_factor(self, f, y):
        raise NotImplementedError

    def factor_rows(self, num_outputs: int) -> int:
        """``K``: the rows of `hessian_factor` for ``num_outputs`` outputs (``O`` unless a subclass says less)."""
        return num_outputs

    def sample(self, key, f, n: int):
        """``n`` targets of one example drawn from $p(y \\mid f)$, stacked on a leading axis."""
        raise NotImplementedError(f"{type(self).__name__} has no sample(key, f, n): a Monte-Carlo Fisher needs it")

    def check(self, num_outputs: int, targets, num_examples: int, who: str) -> None:
        """Raise a `ValueError` naming ``who`` when the targets do not fit this likelihood."""


class _DiagonalCurvature(Likelihood):
    """A likelihood whose output curvature is a diagonal ``_w(f)`` (nonnegative): its products, operator and
    factor follow from it."""

    def _w(self, f):
        raise NotImplementedError

    def hvp(self, f, y, u):
        return self._w(f) * u

    def hessian(self, f, y):
        return Diagonal(self._w(f), nonnegative=True)

    def hessian_factor(self, f, y):
        return jnp.diag(jnp.sqrt(self._w(f)))


def _target_shape_error(who, lik, expected, targets):
    return ValueError(
        f"{who}: a {type(lik).__name__} likelihood needs targets of shape {expected}, "
        f"got {tuple(jnp.shape(targets))}"
    )


class Gaussian(Likelihood):
    r"""Gaussian noise $y \sim \mathcal N(f, \sigma^2)$, $H = I/\sigma^2$.

    Args:
        sigma: the noise standard deviation: a scalar, one per output ``(O,)``, or, with
            ``heteroscedastic=True``, one per example ``(N,)`` or ``(N, O)``.
        heteroscedastic: ``sigma`` has a leading example axis (known noise per example; a network that
            predicts its own noise is `HeteroscedasticGaussian`'s).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.likelihoods import Gaussian
        >>> Gaussian(0.5).hessian(jnp.zeros(2), jnp.zeros(2)).as_matrix()
        Array([[4., 0.],
               [0., 4.]], dtype=float32)
    """

    sigma: jax.Array
    heteroscedastic: bool = eqx.field(static=True, default=False)

    def __init__(self, sigma=1.0, *, heteroscedastic: bool = False):
        sigma = jnp.asarray(sigma)
        if not jnp.issubdtype(sigma.dtype, jnp.inexact):
            sigma = sigma.astype(float)
        if not isinstance(sigma, jax.core.Tracer):
            host = np.asarray(sigma)
            if not bool(np.all(np.isfinite(host))):
                raise ValueError(f"Gaussian: sigma must be finite, got {int(np.sum(~np.isfinite(host)))} NaN or "
                                 "infinite value(s)")
            if bool(np.any(host <= 0)):
                raise ValueError(f"Gaussian: sigma must be positive, got min {float(np.min(host))}")
        if heteroscedastic and sigma.ndim not in (1, 2):
            raise ValueError(f"Gaussian: a heteroscedastic sigma has shape (N,) or (N, O), got {sigma.shape}")
        if not heteroscedastic and sigma.ndim > 1:
            raise ValueError(
                f"Gaussian: sigma of shape {sigma.shape} needs heteroscedastic=True (one row per example)"
            )
        self.sigma = sigma
        self.heteroscedastic = heteroscedastic

    @property
    def per_example(self) -> bool:
        return self.heteroscedastic

    def _var(self, f):
        return jnp.broadcast_to(self.sigma**2, f.shape).astype(f.dtype)

    def nll(self, f, y):
        var = self._var(f)
        return 0.5 * jnp.sum((f - y) ** 2 / var + jnp.log(2 * jnp.pi * var))

    def grad(self, f, y):
        return (f - y) / self._var(f)

    def hvp(self, f, y, u):
        return u / self._var(f)

    def hessian(self, f, y):
        return Diagonal(1.0 / self._var(f), nonnegative=True)

    def hessian_factor(self, f, y):
        return jnp.diag(1.0 / jnp.sqrt(self._var(f)))

    def sample(self, key, f, n):
        return f[None] + jnp.sqrt(self._var(f))[None] * flat_draw(jax.random.normal, key, (n,) + f.shape, f.dtype)

    def check(self, num_outputs, targets, num_examples, who):
        if jnp.shape(targets) != (num_examples, num_outputs):
            raise _target_shape_error(who, self, (num_examples, num_outputs), targets)
        s = self.sigma.shape
        ok = (
            (s[0] == num_examples and (len(s) == 1 or s[1] == num_outputs))
            if self.heteroscedastic
            else (s in ((), (1,), (num_outputs,)))
        )
        if not ok:
            expected = f"({num_examples},) or ({num_examples}, {num_outputs})" if self.heteroscedastic else \
                f"() or ({num_outputs},)"
            raise ValueError(f"{who}: Gaussian sigma must have shape {expected}, got {s}")


class HeteroscedasticGaussian(_DiagonalCurvature):
    r"""Gaussian noise the network predicts: outputs $f = (\mu, s)$ of shape ``(2 O,)``, a mean $\mu$ and a
    log-variance $s$ per target, $y \sim \mathcal N(\mu, e^{s})$, targets ``(O,)``.

    The GGN's output curvature is the Fisher information of $(\mu, s)$, $H = \operatorname{diag}(e^{-s},
    \tfrac12)$: the expected Hessian of $\ell$ under the model (the Hessian itself, $\partial^2_s \ell =
    \tfrac12 (y - \mu)^2 e^{-s}$ with a cross term $(\mu - y) e^{-s}$, is not PSD; ``curvature="hessian"``
    uses it). Not `Gaussian` with ``heteroscedastic=True``, whose per-example noise is known data.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.likelihoods import HeteroscedasticGaussian
        >>> f = jnp.array([0.0, jnp.log(4.0)])                   # mean 0, variance 4
        >>> HeteroscedasticGaussian().hessian(f, jnp.zeros(1)).as_matrix()
        Array([[0.25, 0.  ],
               [0.  , 0.5 ]], dtype=float32)
    """

    @staticmethod
    def _split(f):
        o = f.shape[0] // 2
        return f[:o], f[o:]

    def nll(self, f, y):
        mu, s = self._split(f)
        return 0.5 * jnp.sum((y - mu) ** 2 * jnp.exp(-s) + s + jnp.log(2 * jnp.pi))

    def grad(self, f, y):
        mu, s = self._split(f)
        r2 = (y - mu) ** 2 * jnp.exp(-s)
        return jnp.concatenate([(mu - y) * jnp.exp(-s), 0.5 * (1 - r2)])

    def _w(self, f):
        _, s = self._split(f)
        return jnp.concatenate([jnp.exp(-s), jnp.full(s.shape, 0.5, f.dtype)])

    def sample(self, key, f, n):
        mu, s = self._split(f)
        return mu[None] + jnp.exp(0.5 * s)[None] * flat_draw(jax.random.normal, key, (n,) + mu.shape, f.dtype)

    def check(self, num_outputs, targets, num_examples, who):
        if num_outputs % 2:
            raise ValueError(f"{who}: a HeteroscedasticGaussian needs a model with 2 O outputs (O means, then O "
                             f"log-variances), got {num_outputs}")
        if jnp.shape(targets) != (num_examples, num_outputs // 2):
            raise _target_shape_error(who, self, (num_examples, num_outputs // 2), targets)


class Categorical(Likelihood):
    r"""Softmax classification with integer labels, $H = \operatorname{diag}(p) - p p^\top$.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.likelihoods import Categorical
        >>> Categorical().nll(jnp.zeros(4), jnp.asarray(2))   # log 4
        Array(1.3862944, dtype=float32)
    """

    def nll(self, f, y):
        return jax.nn.logsumexp(f) - f[y]

    def grad(self, f, y):
        return jax.nn.softmax(f) - jax.nn.one_hot(y, f.shape[0], dtype=f.dtype)

    def hvp(self, f, y, u):
        p = jax.nn.softmax(f)
        return p * u - p * jnp.dot(p, u)

    def hessian(self, f, y):
        p = jax.nn.softmax(f)
        return Dense(jnp.diag(p) - jnp.outer(p, p), tags={"psd"})

    def hessian_factor(self, f, y):
        p = jax.nn.softmax(f)
        s = jnp.sqrt(p)
        return jnp.diag(s) - jnp.outer(s, p)

    def sample(self, key, f, n):
        return jax.random.categorical(key, f, shape=(n,))

    def check(self, num_outputs, targets, num_examples, who):
        t = jnp.asarray(targets)
        if t.shape != (num_examples,) or not jnp.issubdtype(t.dtype, jnp.integer):
            raise ValueError(
                f"{who}: a Categorical likelihood needs integer class labels of shape ({num_examples},), "
                f"got {t.dtype}{tuple(t.shape)}"
            )
        if not isinstance(t, jax.core.Tracer) and t.size:
            if getattr(t, "is_fully_addressable", True):  # read on the host: a check compiles no program
                host = np.asarray(t)
                lo_, hi = int(host.min()), int(host.max())
            else:
                with jax.ensure_compile_time_eval():  # a global array over several processes is reduced, not fetched
                    lo_, hi = int(t.min()), int(t.max())
            if lo_ < 0 or hi >= num_outputs:
                raise ValueError(f"{who}: labels must lie in [0, {num_outputs}) for {num_outputs} outputs, "
                                 f"got range [{lo_}, {hi}]")


class Bernoulli(_DiagonalCurvature):
    r"""Independent sigmoid outputs (binary or multi-label), $H = \operatorname{diag}(p(1-p))$.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.likelihoods import Bernoulli
        >>> Bernoulli().grad(jnp.zeros(2), jnp.array([1.0, 0.0]))
        Array([-0.5,  0.5], dtype=float32)
    """

    def nll(self, f, y):
        return jnp.sum(jax.nn.softplus(f) - y * f)

    def grad(self, f, y):
        return jax.nn.sigmoid(f) - y

    def _w(self, f):
        p = jax.nn.sigmoid(f)
        return p * (1 - p)

    def sample(self, key, f, n):
        p = jnp.broadcast_to(jax.nn.sigmoid(f), (n,) + f.shape).reshape(-1)  # flat: see flat_draw
        return jax.random.bernoulli(key, p).reshape((n,) + f.shape).astype(f.dtype)

    def check(self, num_outputs, targets, num_examples, who):
        if jnp.shape(targets) != (num_examples, num_outputs):
            raise _target_shape_error(who, self, (num_examples, num_outputs), targets)
        t = targets
        if not isinstance(t, jax.core.Tracer) and jnp.size(t) and getattr(t, "is_fully_addressable", True):
            host = np.asarray(t, dtype=np.float64)  # read on the host: a check compiles no program
            if not (host.min() >= 0.0 and host.max() <= 1.0):  # NaN fails too
                raise ValueError(f"{who}: a Bernoulli likelihood needs targets in [0, 1] (labels 0 or 1, or "
                                 f"probabilities), got range [{host.min():g}, {host.max():g}]")


def _checked_base(base, who):
    """``base`` for a curvature likelihood: a likelihood that is not itself a curvature."""
    if not isinstance(base, Likelihood) or isinstance(base, EmpiricalFisher | MonteCarloFisher):
        raise TypeError(f"{who}: base must be a likelihood (not a curvature), got {type(base).__name__}")
    return base


class EmpiricalFisher(Likelihood):
    r"""The empirical Fisher's output curvature $g g^\top$, $g = \partial \ell(f, y)/\partial f$ at the observed
    target, in place of ``base``'s Hessian: with it `linops.GGNOp` is $\sum_n \nabla_\theta \ell_n
    \nabla_\theta \ell_n^\top$ (one reverse pass per example). ``nll``, ``grad``, ``sample`` and the checks
    are ``base``'s.

    Not the Fisher: it is the outer product of the training gradients, which vanish where the network fits its
    targets (Kunstner et al., 2019); it scales with the Gaussian noise as $\sigma^{-4}$, the GGN as $\sigma^{-2}$.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.likelihoods import Categorical, EmpiricalFisher
        >>> EmpiricalFisher(Categorical()).hessian_factor(jnp.zeros(2), jnp.asarray(0))   # g = softmax - e_0
        Array([[-0.5,  0.5]], dtype=float32)
    """

    base: Likelihood

    def __init__(self, base: Likelihood):
        self.base = _checked_base(base, "EmpiricalFisher")

    @property
    def per_example(self) -> bool:
        return self.base.per_example

    def nll(self, f, y):
        return self.base.nll(f, y)

    def grad(self, f, y):
        return self.base.grad(f, y)

    def hvp(self, f, y, u):
        g = self.base.grad(f, y)
        return g * jnp.dot(g, u)

    def hessian(self, f, y):
        g = self.base.grad(f, y)
        return Dense(jnp.outer(g, g), tags={"psd"})

    def hessian_factor(self, f, y):
        return self.base.grad(f, y)[None, :]

    def factor_rows(self, num_outputs):
        return 1

    def sample(self, key, f, n):
        return self.base.sample(key, f, n)

    def check(self, num_outputs, targets, num_examples, who):
        self.base.check(num_outputs, targets, num_examples, who)


class MonteCarloFisher(Likelihood):
    r"""A Monte-Carlo Fisher: ``base``'s output Hessian replaced by $\frac1S \sum_{s=1}^S g_s g_s^\top$,
    $g_s = \partial \ell(f, \hat y_s)/\partial f$ at targets $\hat y_s \sim p(y \mid f)$ drawn from the model.

    Its expectation is the Fisher, which for the Gaussian, categorical and Bernoulli likelihoods is their
    output Hessian: the GGN. Each example's draws need their own key, so the targets are a pair
    ``(Y, keys)``: `with_keys` builds it (one key per example from one ``key``), and the draws are the same
    wherever the pair goes (every batch size, every device, every structure). ``nll`` and ``grad`` read the
    observed ``Y``.

    Args:
        base: the likelihood whose targets are drawn (it needs `Likelihood.sample`).
        num_samples: $S$, the draws per example (the factor's rows).

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> from linops.likelihoods import Gaussian, MonteCarloFisher
        >>> fn = lambda w, x: (x @ w)[None]
        >>> X, Y = jnp.eye(2), jnp.zeros((2, 1))
        >>> mc = MonteCarloFisher(Gaussian(1.0), num_samples=10_000)
        >>> G = lo.GGNOp(fn, jnp.zeros(2), X, mc.with_keys(Y, jax.random.key(0)), mc)
        >>> bool(jnp.allclose(G.as_matrix(), jnp.eye(2), atol=0.05))     # E[g g^T] = 1/sigma^2
        True
    """

    base: Likelihood
    num_samples: int = eqx.field(static=True)

    def __init__(self, base: Likelihood, num_samples: int = 1):
        _checked_base(base, "MonteCarloFisher")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int | np.integer) or num_samples < 1:
            raise ValueError(f"MonteCarloFisher: num_samples must be a positive integer, got {num_samples!r}")
        self.base, self.num_samples = base, int(num_samples)

    @staticmethod
    def with_keys(targets, key):
        """``(targets, keys)``: one key per example (the raw key data, ``(N, k)`` unsigned integers), split from
        ``key``."""
        n = jax.tree_util.tree_leaves(targets)[0].shape[0]
        if not jnp.issubdtype(jnp.asarray(key).dtype if not hasattr(key, "dtype") else key.dtype,
                              jax.dtypes.prng_key):
            key = jax.random.wrap_key_data(key)
        return targets, jax.random.key_data(jax.random.split(key, n))

    @property
    def per_example(self) -> bool:
        return self.base.per_example

    def nll(self, f, y):
        return self.base.nll(f, y[0])

    def grad(self, f, y):
        return self.base.grad(f, y[0])

    def hessian_factor(self, f, y):
        draws = self.base.sample(jax.random.wrap_key_data(y[1]), jax.lax.stop_gradient(f), self.num_samples)
        return jax.vmap(lambda t: self.base.grad(f, t))(draws) / jnp.sqrt(jnp.asarray(self.num_samples, f.dtype))

    def hvp(self, f, y, u):
        A = self.hessian_factor(f, y)
        return A.T @ (A @ u)

    def hessian(self, f, y):
        A = self.hessian_factor(f, y)
        return Dense(A.T @ A, tags={"psd"})

    def factor_rows(self, num_outputs):
        return self.num_samples

    def sample(self, key, f, n):
        return self.base.sample(key, f, n)

    def check(self, num_outputs, targets, num_examples, who):
        if not (isinstance(targets, tuple) and len(targets) == 2):
            raise ValueError(f"{who}: a MonteCarloFisher needs targets (Y, keys): "
                             "MonteCarloFisher.with_keys(Y, key) builds them")
        Y, keys = targets
        self.base.check(num_outputs, Y, num_examples, who)
        k = jnp.asarray(keys) if not isinstance(keys, jax.Array) else keys
        if k.ndim != 2 or k.shape[0] != num_examples or not jnp.issubdtype(k.dtype, jnp.unsignedinteger):
            raise ValueError(f"{who}: a MonteCarloFisher's keys must be raw key data of shape ({num_examples}, k) "
                             f"(MonteCarloFisher.with_keys), got {k.dtype}{tuple(k.shape)}")


__all__ = ["Bernoulli", "Categorical", "EmpiricalFisher", "Gaussian", "HeteroscedasticGaussian", "Likelihood",
           "MonteCarloFisher"]
