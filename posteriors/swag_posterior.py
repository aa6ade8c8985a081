r"""SWAG (Maddox, Izmailov, Garipov, Vetrov, Wilson; NeurIPS 2019): a Gaussian fitted to SGD's iterates.

From the trained parameters, SGD with momentum and a constant learning rate runs on random
minibatches of the mean negative log-likelihood (plus $\tfrac{\alpha}{2N}\|\theta\|^2$: weight decay
$\alpha/N$). Every ``collect_every`` steps the iterate $\theta_i$ is collected, ``num_snapshots``
times in all ($i = 1 \dots n$):

- the SWA mean $\bar\theta = \frac1n \sum_i \theta_i$, which is SWAG's mean (not the starting point);
- the diagonal variance $\Sigma_{\text{diag}} = \operatorname{diag}(\overline{\theta^2} - \bar\theta^2)$
  (accumulated with Welford's update, without the cancellation of the two moments in float32);
- the deviations $D$ of the last $K$ (``rank``) iterates from the running mean, $\theta_i - \bar\theta_i$.

The covariance is $\Sigma = \tfrac12 \Sigma_{\text{diag}} + \tfrac{1}{2(K-1)} D D^\top$ and a sample is
$\bar\theta + \tfrac{1}{\sqrt2}\Sigma_{\text{diag}}^{1/2} z_1 + \tfrac{1}{\sqrt{2(K-1)}} D z_2$;
``rank=0`` is SWAG-diagonal, $\Sigma = \Sigma_{\text{diag}}$. The paper predicts with the network at
samples (`posteriors.predictive.monte_carlo` with ``linearized=False``); the linearised predictive
works as for any `GaussianPosterior`.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> import posteriors as pst
    >>> from linops.likelihoods import Gaussian
    >>> X = jax.random.normal(jax.random.key(0), (64, 3)); Y = X @ jnp.array([[1.0], [-2.0], [0.5]])
    >>> fn = lambda w, x: (x @ w)[None]
    >>> post = pst.swag(fn, jnp.zeros(3), (X, Y), Gaussian(1.0), key=jax.random.key(1), num_snapshots=10,
    ...                 collect_every=20, batch_size=8, progress=False)
    >>> post.deviations.shape, post.covariance.shape
    ((3, 10), (3, 3))
"""

from __future__ import annotations

import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
from linops.likelihoods import Likelihood
from linops.models import ravel
from linops.runtime import canonical_convolutions, flat_draw, program, tick
from posteriors._checks import check_data, check_likelihood, check_params, check_targets
from posteriors._training import check_step_settings, check_trained, minibatch_loss, positive_int
from posteriors.gaussian import GaussianPosterior


def _sgd_moments(fn, params, data, likelihood: Likelihood, *, key: jax.Array, num_steps: int, collect_every: int,
                learning_rate: float, batch_size: int, prior_precision, momentum: float, rank: int,
                label: str | None, who: str):
    r"""SGD with momentum from ``params``; the moments of the iterates collected every ``collect_every`` steps.

    Returns ``(mean (P,), variance (P,), deviations (P, rank), count)``: the mean of the collected iterates,
    their population variance (Welford), the deviations $\theta_i - \bar\theta_i$ of the last ``rank``
    collected iterates from the running mean after each update (in ring-buffer order: the order does not
    change $D D^\top$), and the number collected. Used by `swag` and `posteriors.subnetwork.swag` (``who``):
    the step settings are checked before the first step, and a run that diverged is refused, never returned.
    """
    flat, unravel = ravel(params)
    check_step_settings(who, learning_rate, prior_precision, flat.shape[0], momentum)
    # numbers as arrays: data of the compiled program, not part of its key (a new rate or prior compiles nothing)
    rate, alpha = (jax.device_put(np.asarray(v, flat.dtype)) for v in (learning_rate, prior_precision))
    mean, variance, deviations, count = _sgd_run(
        fn, unravel, data, likelihood, alpha, rate, flat, key, num_steps=num_steps, collect_every=collect_every,
        batch_size=int(batch_size), momentum=momentum, rank=rank, label=label)
    check_trained(who, f"SGD at learning_rate={learning_rate!r} is too large for this loss: use a smaller one",
                  variance=variance, mean=mean, deviations=deviations)
    return mean, variance, deviations, count


@program
def _sgd_run(fn, unravel, data, likelihood, prior_precision, learning_rate, theta, key, *, num_steps, collect_every,
             batch_size, momentum, rank, label):
    """`_sgd_moments`' loop as one program (cached per model, shapes and options; the data are its arguments)."""
    import optax

    n = jax.tree_util.tree_leaves(data[0])[0].shape[0]
    loss = minibatch_loss(fn, unravel, data, likelihood, prior_precision, theta.dtype)
    opt = optax.sgd(learning_rate, momentum=momentum or None)

    def step(carry, k):
        th, state, mean, m2, dev, count, t = carry
        idx = jax.random.choice(k, n, (batch_size,), replace=False) if batch_size < n else jnp.arange(n)
        updates, state = opt.update(jax.grad(loss)(th, idx), state, th)
        th = optax.apply_updates(th, updates)
        take = (t + 1) % collect_every == 0
        new_count = count + take
        delta = th - mean
        new_mean = mean + delta / jnp.maximum(new_count, 1)
        m2 = jnp.where(take, m2 + delta * (th - new_mean), m2)
        if rank:
            column = jnp.where(take, th - new_mean, dev[:, count % rank])
            dev = dev.at[:, count % rank].set(column)
        mean = jnp.where(take, new_mean, mean)
        tick(label, t + 1, num_steps, unit="step")
        return (th, state, mean, m2, dev, new_count, t + 1), None

    zeros = jnp.zeros_like(theta)
    init = (theta, opt.init(theta), zeros, zeros, jnp.zeros((theta.shape[0], rank), theta.dtype), jnp.asarray(0),
            jnp.asarray(0))
    (_, _, mean, m2, dev, count, _), _ = jax.lax.scan(canonical_convolutions(step), init,
                                                      jax.random.split(key, num_steps))
    return mean, m2 / jnp.maximum(count, 1), dev, count


class SWAGPosterior(GaussianPosterior):
    r"""SWAG's Gaussian $\mathcal N(\bar\theta, \tfrac12\Sigma_{\text{diag}} + \tfrac{1}{2(K-1)} D D^\top)$
    (``rank`` $K = 0$: $\mathcal N(\bar\theta, \Sigma_{\text{diag}})$). Built by `swag`.

    Attributes:
        params: the SWA mean $\bar\theta$ as a params pytree (`mean` is its flat vector).
        variance: $\operatorname{diag}\Sigma_{\text{diag}}$, shape ``(P,)``.
        deviations: $D$, shape ``(P, K)``.
        num_snapshots: how many iterates were collected.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.swag_posterior import SWAGPosterior
        >>> post = SWAGPosterior(lambda w, x: (x @ w)[None], jnp.zeros(2), jnp.array([2.0, 4.0]),
        ...                      jnp.array([[1.0, -1.0], [0.0, 0.0]]), num_snapshots=2)
        >>> post.covariance.as_matrix()                       # diag/2 + D D^T / (2 (K - 1))
        Array([[2., 0.],
               [0., 2.]], dtype=float32)
    """

    variance: jax.Array
    deviations: jax.Array
    num_snapshots: int = eqx.field(static=True)

    def __init__(self, fn: Callable, params, variance, deviations, *, num_snapshots: int):
        flat, unravel = ravel(params)
        P = flat.shape[0]
        variance, deviations = jnp.asarray(variance), jnp.asarray(deviations)
        if variance.shape != (P,):
            raise ValueError(f"SWAGPosterior: variance must have shape ({P},) for {P} parameters, got {variance.shape}")
        if deviations.ndim != 2 or deviations.shape[0] != P or deviations.shape[1] == 1:
            raise ValueError(f"SWAGPosterior: deviations must have shape ({P}, K) with K = 0 or K >= 2, got "
                             f"{deviations.shape}")
        self.fn, self.params, self.unravel = fn, params, unravel
        self.variance, self.deviations, self.num_snapshots = variance, deviations, int(num_snapshots)

    @property
    def rank(self) -> int:
        """$K$, the number of deviation columns (0: SWAG-diagonal)."""
        return self.deviations.shape[1]

    @property
    def covariance(self) -> lo.LinearOperator:
        r"""$\tfrac12\Sigma_{\text{diag}} + \tfrac{1}{2(K-1)} D D^\top$ as a lazy sum of `linops.Diagonal` and
        `linops.LowRank` (PSD), or $\Sigma_{\text{diag}}$ for $K = 0$."""
        diagonal = lo.Diagonal(self.variance)
        if self.rank == 0:
            return diagonal
        weights = jnp.full(self.rank, 1.0 / (2 * (self.rank - 1)), self.deviations.dtype)
        return 0.5 * diagonal + lo.LowRank(self.deviations, weights, nonnegative=True)

    def sample(self, key: jax.Array, n: int) -> jax.Array:
        """``n`` samples $\\bar\\theta + \\Sigma_{diag}^{1/2} z_1/\\sqrt2 + D z_2/\\sqrt{2(K-1)}$, shape ``(n, P)``."""
        n = positive_int(n, "n", f"{type(self).__name__}.sample")
        k1, k2 = jax.random.split(key)
        std = jnp.sqrt(jnp.clip(self.variance, 0.0))
        z1 = flat_draw(jax.random.normal, k1, (n, std.shape[0]), std.dtype)
        if self.rank == 0:
            return self.mean[None, :] + z1 * std[None, :]
        z2 = flat_draw(jax.random.normal, k2, (n, self.rank), std.dtype)
        return (self.mean[None, :] + z1 * std[None, :] / math.sqrt(2.0)
                + (z2 @ self.deviations.T) / math.sqrt(2.0 * (self.rank - 1)))


def swag(fn, params, data, likelihood: Likelihood, *, key: jax.Array, num_snapshots: int = 20,
         collect_every: int | None = None, rank: int | None = None, learning_rate: float = 1e-2,
         momentum: float = 0.9, batch_size: int = 128, prior_precision=0.0, progress: bool = True) -> SWAGPosterior:
    r"""SWAG around trained ``params``: SGD's iterates summarised as a Gaussian (module docstring).

    Args:
        fn: the per-example model ``fn(params, x) -> (O,)``.
        params: the trained params pytree, where SGD starts.
        data: ``(X, Y)`` training data.
        likelihood: a `linops.likelihoods` likelihood; its ``nll`` is the loss.
        key: the minibatches' randomness.
        num_snapshots: iterates collected (the paper's 20).
        collect_every: SGD steps between snapshots (default: one epoch, ``ceil(N / batch_size)``).
        rank: $K$, the deviations kept (default ``num_snapshots``; 0: SWAG-diagonal; else at least 2).
        learning_rate: SGD's constant learning rate (the paper's 1e-2).
        momentum: SGD's momentum (the paper's 0.9).
        batch_size: examples per step.
        prior_precision: $\alpha$ of the Gaussian prior: weight decay $\alpha / N$ (the paper's
            3e-4 is $\alpha = 3 \cdot 10^{-4} N$).
        progress: a bar over the SGD steps on stderr, shown after two seconds; False silences it.

    Returns:
        a `SWAGPosterior`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> X = jnp.array([[1.0, 0.0], [2.0, 0.0], [0.5, 0.0]]); Y = jnp.array([[1.0], [0.0], [2.0]])
        >>> post = pst.swag(lambda w, x: (x @ w)[None], jnp.zeros(2), (X, Y), Gaussian(1.0), key=jax.random.key(0),
        ...                 num_snapshots=5, collect_every=10, batch_size=1, rank=0, progress=False)
        >>> float(post.variance[1])                       # w[1] has no gradient: SGD never moves it
        0.0
    """
    who = "swag"
    check_params(params, who)
    check_likelihood(likelihood, who)
    check_data(data, who)
    check_targets(fn, params, data, likelihood, who)
    n = jax.tree_util.tree_leaves(data[0])[0].shape[0]
    num_snapshots = positive_int(num_snapshots, "num_snapshots", who)
    batch_size = min(positive_int(batch_size, "batch_size", who), n)
    collect_every = -(-n // batch_size) if collect_every is None else positive_int(collect_every, "collect_every",
                                                                                     who)
    rank = num_snapshots if rank is None else positive_int(rank, "rank", who, minimum=0)
    if rank == 1 or rank > num_snapshots:
        raise ValueError(f"{who}: rank must be 0 (SWAG-diagonal) or between 2 and num_snapshots = {num_snapshots} "
                         f"(D D^T / (K - 1) needs K >= 2 deviations), got {rank}")
    mean, variance, deviations, _ = _sgd_moments(
        fn, params, data, likelihood, key=key, num_steps=num_snapshots * collect_every, collect_every=collect_every,
        learning_rate=learning_rate, batch_size=batch_size, prior_precision=prior_precision, momentum=momentum,
        rank=rank, label=who if progress else None, who=who)
    unravel = ravel(params)[1]
    # every collect_every-th of num_snapshots * collect_every steps is collected: the count is num_snapshots, a
    # Python int (not the loop's traced counter), so that swag traces under jit and eval_shape
    return SWAGPosterior(fn, unravel(mean), variance, deviations, num_snapshots=num_snapshots)


__all__ = ["SWAGPosterior", "swag"]
