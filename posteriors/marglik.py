r"""The Laplace evidence and the tuning of the prior precision (and a Gaussian noise).

$$\log p(\mathcal D \mid \alpha, \sigma) \approx -\sum_n \ell(f(\theta^*, x_n), y_n)
- \tfrac12 \theta^{*\top}\operatorname{diag}(\alpha)\,\theta^* + \tfrac12 \sum_i \log \alpha_i
- \tfrac12 \log\det\big(G/s + \operatorname{diag}\alpha\big),$$

$s = \sigma^2/\sigma_0^2$ (the GGN of a Gaussian likelihood scales as $1/\sigma^2$). For a linear
model with a Gaussian likelihood it is the exact log evidence (at the exact MAP). For a
posterior over a subset of the weights (a last layer, a subnetwork) it is the evidence of those weights, the rest
held at $\theta^*$.
"""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops.models import unravel_of
from linops.runtime import new_bar, program, tick
from posteriors._prior import canonical_prior, check_sigma, noise_scale
from posteriors.laplace_family import LaplacePosterior


def _check(post, who):
    if not isinstance(post, LaplacePosterior):
        raise TypeError(f"{who}: expected a LaplacePosterior (from pst.laplace), got {type(post).__name__}")


def _evidence(post, alpha, scale, loss, logdet):
    theta = post.weights.take(post.mean)
    P = theta.shape[0]
    log_prior_det = P * jnp.log(alpha) if jnp.ndim(alpha) == 0 else jnp.sum(jnp.log(alpha))
    return -loss - 0.5 * jnp.sum(alpha * theta**2) + 0.5 * log_prior_det - 0.5 * logdet(alpha, scale)


def marginal_log_likelihood(post: LaplacePosterior, prior_precision=None, sigma=None) -> jax.Array:
    r"""The Laplace approximation of $\log p(\mathcal D \mid \alpha, \sigma)$, differentiable in both.

    Args:
        post: a `LaplacePosterior`.
        prior_precision: $\alpha$ (default the posterior's); any form `posteriors.laplace` takes,
            or a traced array of the same shape.
        sigma: a new Gaussian noise standard deviation (a scalar; default the posterior's).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> X = jnp.array([[1.0], [2.0]]); Y = jnp.array([[1.0], [2.0]])
        >>> post = pst.laplace(lambda w, x: (x @ w)[None], jnp.array([5.0 / 6.0]), (X, Y), Gaussian(1.0),
        ...                    structure="full", prior_precision=1.0)
        >>> # exact for Bayesian linear regression at its MAP: log N(y | 0, I + X X^T)
        >>> K = jnp.eye(2) + X @ X.T
        >>> exact = -0.5 * (Y[:, 0] @ jnp.linalg.solve(K, Y[:, 0]) + jnp.linalg.slogdet(K)[1] + 2 * jnp.log(2 * jnp.pi))
        >>> bool(jnp.allclose(pst.marginal_log_likelihood(post), exact, rtol=1e-5))
        True
    """
    who = "marginal_log_likelihood"
    _check(post, who)
    alpha = post.prior_precision if prior_precision is None else canonical_prior(
        prior_precision, post.params, post.weights, type(post.ggn), who=who)
    if sigma is not None:
        sigma = check_sigma(post, sigma, who)
    return _marginal_log_likelihood(post, alpha, sigma)


@program
def _marginal_log_likelihood(post, alpha, sigma):
    scale, loss = post.noise_scale, post.loss
    if sigma is not None:
        scale, loss = noise_scale(post, sigma)
    return _evidence(post, alpha, scale, loss, post.ggn.logdet)


def optimize_prior_precision(post: LaplacePosterior, *, method: str = "marglik", prior_structure: str = "scalar",
                             tune_sigma: bool = False, num_steps: int = 200, learning_rate: float = 0.1,
                             validation=None, grid=None, link: str = "probit", progress: bool = True):
    r"""Tune the prior precision (and, for a Gaussian likelihood, $\sigma$): the refitted posterior and a report.

    Args:
        post: a `LaplacePosterior`.
        method: ``"marglik"`` maximises `marginal_log_likelihood` by Adam (optax) on
            $\log\alpha$ (and $\log\sigma$), starting from the posterior's values; ``"gridsearch"``
            minimises the predictive negative log-likelihood of ``validation`` over ``grid``
            (scalar $\alpha$), warning when the best value sits at an edge of the grid.
        prior_structure: for ``"marglik"``: ``"scalar"``, ``"layerwise"`` (one per leaf) or
            ``"diag"`` (one per parameter).
        tune_sigma: also tune a Gaussian likelihood's scalar $\sigma$ (``"marglik"`` only).
        num_steps: Adam's steps.
        learning_rate: Adam's learning rate (on the logarithms).
        validation: ``(inputs, targets)`` for ``"gridsearch"``.
        grid: candidate scalar precisions (default $10^{-4}, \dots, 10^{4}$, 33 values).
        link: the classification predictive of ``"gridsearch"`` (see `posteriors.predictive.nll`).
        progress: a progress bar over Adam's steps or the grid on stderr, shown once the tuning runs
            longer than two seconds; False silences it.

    Returns:
        ``(posterior, report)``: ``report`` holds ``"prior_precision"``, ``"sigma"`` and the
        trace (``"log_marginal_likelihood"`` per step, or ``"grid"`` and ``"nll"``).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> X = jax.random.normal(jax.random.key(0), (50, 3)); w = jnp.array([1.0, -2.0, 0.5])
        >>> Y = (X @ w)[:, None] + 0.1 * jax.random.normal(jax.random.key(1), (50, 1))
        >>> post = pst.laplace(lambda w, x: (x @ w)[None], w, (X, Y), Gaussian(0.1), prior_precision=100.0)
        >>> tuned, report = pst.optimize_prior_precision(post, num_steps=300)
        >>> trace = report["log_marginal_likelihood"]
        >>> bool(trace[-1] > trace[0])
        True
    """
    who = "optimize_prior_precision"
    _check(post, who)
    label = f"{who}(method={method!r})" if progress else None
    if method == "gridsearch":
        return _gridsearch(post, validation, grid, link, who, label)
    if method != "marglik":
        raise ValueError(f"{who}: method must be 'marglik' or 'gridsearch', got {method!r}")
    if prior_structure not in ("scalar", "layerwise", "diag"):
        raise ValueError(f"{who}: prior_structure must be 'scalar', 'layerwise' or 'diag', got {prior_structure!r}")
    if not post.ggn.per_parameter_prior and prior_structure == "diag":
        raise ValueError(f"{who}: a {post.structure!r} posterior takes one prior precision per leaf: use 'scalar' or "
                         "'layerwise'")
    if tune_sigma:
        check_sigma(post, 1.0, who)  # refuses a non-Gaussian or per-output sigma with a clear error
    rate = jax.device_put(np.asarray(learning_rate, unravel_of(post.params).dtype))  # data, not a program key
    alpha, sigma, trace = _tune(post, rate, num_steps=num_steps, prior_structure=prior_structure,
                                tune_sigma=tune_sigma, sizes=tuple(post.weights.group_sizes(post.params)), label=label)
    tuned = _with_subset_prior(post, alpha, sigma)
    report = {"prior_precision": alpha, "sigma": sigma if tune_sigma else getattr(post.likelihood, "sigma", None),
              "log_marginal_likelihood": trace}
    return tuned, report


@program
def _tune(post, learning_rate, *, num_steps, prior_structure, tune_sigma, sizes, label):
    """Adam on the log evidence as one program (cached per posterior structure, shapes and options): the tuned
    ``(alpha, sigma or None, log evidence per step and at the end)``."""
    import optax

    P = sum(sizes)
    alpha0 = jnp.broadcast_to(post.prior_precision, (P,))
    if prior_structure == "scalar":
        log_a = jnp.log(jnp.mean(alpha0))
        expand = lambda la: jnp.exp(la)  # noqa: E731
    elif prior_structure == "layerwise":
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        log_a = jnp.log(alpha0[starts])
        expand = lambda la: jnp.repeat(jnp.exp(la), np.asarray(sizes), total_repeat_length=P)  # noqa: E731
    else:
        log_a = jnp.log(alpha0)
        expand = jnp.exp
    logdet = post.ggn.logdet_fn(prior_structure == "scalar")
    theta = {"log_alpha": log_a, "log_sigma": jnp.log(post.likelihood.sigma) if tune_sigma else None}

    def objective(theta):
        scale, loss = post.noise_scale, post.loss
        if tune_sigma:
            scale, loss = noise_scale(post, jnp.exp(theta["log_sigma"]))
        return -_evidence(post, expand(theta["log_alpha"]), scale, loss, logdet)

    opt = optax.adam(learning_rate)

    def step(carry, i):
        th, state = carry
        value, grads = jax.value_and_grad(objective)(th)
        updates, state = opt.update(grads, state, th)
        tick(label, i + 1, num_steps, unit="step", note=(lambda v: f"log evidence {float(v):.6g}", (-value,)))
        return (optax.apply_updates(th, updates), state), -value

    (th, _), trace = jax.lax.scan(step, (theta, opt.init(theta)), jnp.arange(num_steps))
    alpha = expand(th["log_alpha"])
    alpha = alpha if prior_structure != "scalar" else alpha.reshape(())
    sigma = jnp.exp(th["log_sigma"]) if tune_sigma else None
    return alpha, sigma, jnp.concatenate([trace, -objective(th)[None]])


def _with_subset_prior(post, alpha, sigma):
    """``post.with_prior`` for a precision already in the posterior's own (subset) space."""
    base = eqx.tree_at(lambda p: p.prior_precision, post, alpha)
    return base.with_prior(None, sigma) if sigma is not None else base.with_prior(None)


def _gridsearch(post, validation, grid, link, who, label=None):
    from posteriors.predictive import nll

    if not (isinstance(validation, tuple) and len(validation) == 2):
        raise ValueError(f"{who}(method='gridsearch'): pass validation=(inputs, targets)")
    grid = jnp.logspace(-4, 4, 33) if grid is None else jnp.asarray(grid)
    if grid.ndim != 1 or grid.shape[0] < 2 or not bool(jnp.all(grid > 0)):
        raise ValueError(f"{who}: grid must be a 1-D array of at least two positive precisions, got {grid}")
    Xv, Yv = validation
    bar = new_bar(label, grid.shape[0], "value") if label else None
    values = []
    for a in grid:
        values.append(nll(_with_subset_prior(post, a, None), Xv, Yv, link=link, progress=False))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    values = jnp.stack(values)
    best = int(jnp.nanargmin(values))
    if best in (0, grid.shape[0] - 1):
        warnings.warn(f"{who}: the best prior precision {float(grid[best]):.3g} is at the "
                      f"{'lower' if best == 0 else 'upper'} edge of the grid [{float(grid[0]):.3g}, "
                      f"{float(grid[-1]):.3g}]; widen the grid", UserWarning, stacklevel=2)
    tuned = _with_subset_prior(post, grid[best], None)
    return tuned, {"prior_precision": grid[best], "sigma": getattr(post.likelihood, "sigma", None), "grid": grid,
                   "nll": values}


__all__ = ["marginal_log_likelihood", "optimize_prior_precision"]
