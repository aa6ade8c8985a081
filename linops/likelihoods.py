r"""Likelihoods: per-example loss $\ell(f, y) = -\log p(y \mid f)$, its output-space gradient and Hessian.

Each likelihood works on ONE example's network output ``f`` of shape ``(O,)``:

- `nll(f, y)`: the negative log-likelihood (with its normalising constant);
- `grad(f, y)`: $\partial \ell / \partial f$, shape ``(O,)``;
- `hvp(f, y, u)`: $H u$ with $H = \partial^2 \ell / \partial f^2$ (closed forms, no autodiff);
- `hessian(f, y)`: $H$ as a PSD operator (``O x O``);
- `hessian_factor(f, y)`: an ``(O, O)`` matrix $A$ with $A^\top A = H$ (a square root of $H$).

Closed forms: Gaussian $I/\sigma^2$; categorical $\operatorname{diag}(p) - p p^\top$ with
$p = \operatorname{softmax}(f)$; Bernoulli $\operatorname{diag}(p (1 - p))$ with $p = \sigma(f)$.

Examples:
    >>> import jax.numpy as jnp
    >>> from linops.likelihoods import Categorical
    >>> Categorical().hvp(jnp.zeros(2), jnp.asarray(0), jnp.array([1.0, 0.0]))
    Array([ 0.25, -0.25], dtype=float32)
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops.algebra._leaves import Dense, Diagonal


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

    def check(self, num_outputs: int, targets, num_examples: int, who: str) -> None:
        """Raise a `ValueError` naming ``who`` when the targets do not fit this likelihood."""


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
        heteroscedastic: ``sigma`` has a leading example axis.

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


class Bernoulli(Likelihood):
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

    def hvp(self, f, y, u):
        return self._w(f) * u

    def hessian(self, f, y):
        return Diagonal(self._w(f), nonnegative=True)

    def hessian_factor(self, f, y):
        return jnp.diag(jnp.sqrt(self._w(f)))

    def check(self, num_outputs, targets, num_examples, who):
        if jnp.shape(targets) != (num_examples, num_outputs):
            raise _target_shape_error(who, self, (num_examples, num_outputs), targets)


__all__ = ["Bernoulli", "Categorical", "Gaussian", "Likelihood"]
