r"""The projected and loss-projected posteriors (Miani, Roy, Hauberg, AISTATS 2025).

$q(\theta) = \mathcal N(\theta^*, \alpha^{-1} \Pi)$ with $\Pi$ the orthogonal projector onto
$\ker J$ (or $\ker J_L$), applied by `linops.AlternatingProjectionOp`. Samples
$\theta^* + \alpha^{-1/2} \Pi \varepsilon$ leave the linearised predictions on every training
example unchanged (lemma 3.1: no underfitting).

The optimal prior precision is $\alpha^* = r / \|\theta^*\|^2$ with $r = P - \operatorname{Tr}\Pi$
(the rank of the GGN). The paper prints $\|\theta^*\|^2 / (P - \operatorname{Tr}(I - P(G)))$,
which is the optimal prior VARIANCE; its own appendix A.3 gives the precision used here.
"""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp

import linops as lo
from linops.models import ravel
from posteriors._checks import check_data, check_examples, check_finite, check_likelihood, check_params
from posteriors._training import positive_int
from posteriors.gaussian import GaussianPosterior


class ProjectedPosterior(GaussianPosterior):
    r"""A Gaussian posterior $\mathcal N(\theta^*, \alpha^{-1}\Pi)$ over flat parameters.

    Attributes:
        fn: the per-example model.
        params: the MAP params pytree $\theta^*$.
        projection: the projector $\Pi$ (an `AlternatingProjectionOp`).
        prior_precision: $\alpha$.
        trace_estimate: $\operatorname{Tr}\Pi$ with its standard error when $\alpha$ was chosen
            by ``"optimal"``, else None.
        trace_draws: the projected Gaussian probes $\Pi\varepsilon_i$ of that estimate, shape
            ``(P, k)`` (None without ``"optimal"``); `trace_samples` turns them into samples.
        projection_converged: whether every probe's projection converged (None without
            ``"optimal"``).
        projection_sweeps: the most sweeps a probe's projection ran (None without ``"optimal"``).
        projection_residual: the largest kernel residual $\|J\Pi\varepsilon\| / \|J\varepsilon\|$ of the
            probes (0 for an exact projection; None without ``"optimal"``): how far the trace draws, and
            so $\alpha^*$, are from an exact projector's.

    Convergence policy: a projection that did not converge is not exactly in $\ker J$, so its samples
    move the training predictions. It is never passed on silently: building the posterior warns
    (``UserWarning``) when a trace probe's projection did not converge and records it in
    ``projection_converged``; `sample` warns when a sample's did not (eagerly; under ``jax.jit`` use
    ``projection.project_samples`` for the flags).
    """

    projection: lo.AlternatingProjectionOp
    prior_precision: jax.Array
    trace_estimate: lo.Estimate | None
    trace_draws: jax.Array | None
    projection_converged: jax.Array | None = None
    projection_sweeps: jax.Array | None = None
    projection_residual: jax.Array | None = None

    @property
    def covariance(self) -> lo.LinearOperator:
        """$\\alpha^{-1}\\Pi$, a lazy PSD operator."""
        return lo.Scaled(1.0 / self.prior_precision, self.projection, nonnegative=True)

    def sample(self, key: jax.Array, n: int, *, mesh=None, axis: str = "data") -> jax.Array:
        """``n`` flat parameter samples, shape ``(n, P)`` (all projected in one batched run).

        With a ``mesh`` (a `jax.sharding.Mesh`), the samples are projected in parallel, split over its
        devices along ``axis`` (`linops.sharded_mm`); they equal the single-device samples of the same key.
        A projection built on a mesh (``projected_posterior(..., mesh=mesh)``) already projects its
        samples in parallel on that mesh, with each batch's factors left on its device
        (`linops.AlternatingProjectionOp.project_samples`), and ignores this ``mesh``.
        """
        n = positive_int(n, "n", f"{type(self).__name__}.sample")
        eps = jax.random.normal(key, (self.mean.shape[0], n), self.mean.dtype)
        if mesh is None or self.projection.mesh is not None:  # a projection on a mesh already uses it
            result = self.projection.project_samples(eps)
            projected = result.value
            _warn_unconverged(result, "ProjectedPosterior.sample", f"{n} samples")
        else:
            projected = lo.sharded_mm(self.projection, eps, mesh, axis)
        return self.mean[None, :] + projected.T / jnp.sqrt(self.prior_precision)

    def trace_samples(self) -> jax.Array:
        r"""The ``k`` samples the trace estimate already paid for, shape ``(k, P)``.

        $\theta^* + \alpha^{-1/2}\Pi\varepsilon_i$ for the Gaussian probes $\varepsilon_i$ of
        ``prior_precision="optimal"``: draws from the posterior at no extra projection.
        """
        if self.trace_draws is None:
            raise ValueError("trace_samples: there are none; they come with prior_precision='optimal'")
        return self.mean[None, :] + self.trace_draws.T / jnp.sqrt(self.prior_precision)

    def ood_score(self, key: jax.Array, inputs, n: int) -> jax.Array:
        """The out-of-distribution score: the largest output variance per input, shape ``(M,)``."""
        return jnp.max(self.predictive_variance(key, inputs, n), axis=-1)


def optimal_prior_precision(projection: lo.AlternatingProjectionOp, theta, key, num_samples: int = 100):
    r"""$\alpha^* = (P - \operatorname{Tr}\Pi) / \|\theta^*\|^2$, with $\operatorname{Tr}\Pi$ by Hutchinson.

    The probes are standard Gaussian, so the projected probes $\Pi\varepsilon_i$ are also draws
    of $\mathcal N(0, \Pi)$: the posteriors keep them as samples (`ProjectedPosterior.trace_samples`)
    instead of paying for new projections. Returns ``(alpha, estimate)``; ``estimate`` carries the
    trace's standard error.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> from posteriors.projected import optimal_prior_precision
        >>> Pi = lo.AlternatingProjectionOp.from_matrix(jnp.array([[1.0, 0.0]]), batch_size=1)
        >>> alpha, est = optimal_prior_precision(Pi, jnp.array([2.0, 0.0]), jax.random.key(0), 400)
        >>> bool(abs(est.value - 1.0) < 4 * est.standard_error)   # Tr = 1 (rank 1, ||theta||^2 = 4)
        True
    """
    alpha, estimate, _, _ = _optimal(projection, theta, key, num_samples)
    return alpha, estimate


def _optimal(projection, theta, key, num_samples):
    """``(alpha, estimate, draws, result)`` (``result``: the probes' `linops.Projection`, whose value is
    ``draws``); refuses a rank that is not significantly positive."""
    who = "optimal_prior_precision"
    if num_samples < 2:
        raise ValueError(f"{who}: num_samples must be >= 2 for a standard error, got {num_samples}")
    P = projection.shape[0]
    eps = jax.random.normal(key, (P, num_samples), projection.dtype)
    result = projection.project_samples(eps)
    draws = result.value  # (P, k): also N(0, Pi) samples
    _warn_unconverged(result, who, f"{num_samples} trace probes")
    per_probe = jnp.sum(eps * draws, axis=0)
    estimate = lo.Estimate(jnp.mean(per_probe), jnp.std(per_probe, ddof=1) / jnp.sqrt(num_samples), num_samples)
    # The GGN's rank r = P - Tr(Pi), in [0, P]. When the estimate does not put it clearly above 0 (within two
    # standard errors; e.g. more Jacobian rows than parameters, where Tr(Pi) ~ 0 is estimated as ~P), alpha*
    # would be ~0 or negative and every sample NaN: refused.
    rank = jnp.clip(P - estimate.value, 0.0, P)
    norm2 = jnp.sum(jnp.asarray(theta) ** 2)
    bad = (rank <= 2 * estimate.standard_error) | ~(norm2 > 0)
    message = (f"{who}: the estimated rank of the GGN, P - Tr(Pi), is not significantly positive (or ||theta||^2 "
               "is 0), so alpha* = rank / ||theta||^2 is not a positive prior precision")
    if not isinstance(bad, jax.core.Tracer):
        if bool(bad):
            raise ValueError(f"{message}: P = {P}, Tr(Pi) = {float(estimate.value):.1f} +- "
                             f"{float(estimate.standard_error):.1f} ({num_samples} probes), ||theta||^2 = "
                             f"{float(norm2):.3g}. The kernel of J is (nearly) the whole space's complement of "
                             "nothing: use more trace probes, fewer examples or the loss-projected posterior, or "
                             "pass a positive prior_precision")
    else:
        rank = eqx.error_if(rank, bad, message)
    return rank / norm2, estimate, draws, result


def _warn_unconverged(result, who, what):
    """Warn (eagerly) when some columns of a `linops.Projection` did not converge."""
    converged = result.converged
    if isinstance(converged, jax.core.Tracer) or bool(jnp.all(converged)):
        return
    warnings.warn(f"{who}: the projections of {int(jnp.sum(~converged))} of {what} did not converge (largest "
                  f"kernel residual ||J Pi x|| / ||J x|| = {float(jnp.max(result.kernel_residual)):.2e}, after "
                  f"{int(jnp.max(result.sweeps))} sweeps): they are not exactly in the kernel of J. Raise max_sweeps, "
                  "loosen rtol, or use fewer examples or the loss-projected posterior", stacklevel=3)


def _check_prior(prior_precision, key, who):
    if isinstance(prior_precision, str):
        if prior_precision != "optimal":
            raise ValueError(f"{who}: prior_precision must be a positive number or 'optimal', got {prior_precision!r}")
        if key is None:
            raise ValueError(f"{who}: prior_precision='optimal' estimates Tr(Pi) by Hutchinson: "
                             "pass key=jax.random.key(...)")
    else:
        alpha = jnp.asarray(prior_precision)
        if alpha.ndim:
            raise ValueError(f"{who}: prior_precision must be a scalar (the projected posterior's covariance is "
                             f"Pi / alpha, one isotropic precision) or 'optimal', got an array of shape {alpha.shape}")
        if not isinstance(alpha, jax.core.Tracer) and not float(alpha) > 0:
            raise ValueError(f"{who}: prior_precision must be positive, got {float(alpha)}")
        if not isinstance(alpha, jax.core.Tracer) and float(alpha) == float("inf"):
            raise ValueError(f"{who}: prior_precision must be finite, got inf (a point mass at the MAP)")


def _build(fn, params, projection, prior_precision, key, num_trace_samples):
    flat, unravel = ravel(params)
    if isinstance(prior_precision, str):
        alpha, estimate, draws, result = _optimal(projection, flat, key, num_trace_samples)
        record = dict(projection_converged=jnp.all(result.converged), projection_sweeps=jnp.max(result.sweeps),
                      projection_residual=jnp.max(result.kernel_residual))
    else:
        alpha, estimate, draws, record = jnp.asarray(prior_precision, flat.dtype), None, None, {}
    return ProjectedPosterior(fn=fn, params=params, unravel=unravel, projection=projection, prior_precision=alpha,
                              trace_estimate=estimate, trace_draws=draws, **record)


def projected_posterior(fn, params, data, *, batch_size: int, prior_precision=1.0, key=None,
                        num_trace_samples: int = 100, **projection_options) -> ProjectedPosterior:
    r"""The projected posterior $\mathcal N(\theta^*, \alpha^{-1}\Pi_{\ker J})$.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``; ``params`` the MAP.
        data: the training inputs, or an ``(inputs, targets)`` pair (targets are not needed).
        batch_size: examples per projection batch ``S``.
        prior_precision: a positive number, or ``"optimal"`` ($r/\|\theta^*\|^2$, needs ``key``).
        num_trace_samples: Hutchinson samples for $\operatorname{Tr}\Pi$.
        projection_options: ``method``, ``max_sweeps``, ``rtol``, ``cutoff``, ``store_linearization``,
            ``progress`` (here True by default: a bar per projection that runs longer than two seconds;
            False silences it), and ``mesh``, ``axis``, ``split_sweeps`` (the batches' factors built and
            kept on the devices of a mesh) of `AlternatingProjectionOp`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import posteriors as pst
        >>> fn = lambda w, x: (x @ w)[None]
        >>> X = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        >>> post = pst.projected_posterior(fn, jnp.ones(3), X, batch_size=1)
        >>> samples = post.sample(jax.random.key(0), 4)
        >>> bool(jnp.allclose(samples[:, :2], 1.0, atol=1e-5))   # fixed where the data speak
        True
    """
    check_params(params, "projected_posterior")
    _check_prior(prior_precision, key, "projected_posterior")
    inputs = data[0] if isinstance(data, tuple) else data
    check_examples(inputs, "projected_posterior", "the training inputs")
    check_finite(inputs, "projected_posterior", "the inputs")
    projection_options.setdefault("progress", True)
    projection = lo.AlternatingProjectionOp.from_jacobian(fn, params, inputs, batch_size=batch_size,
                                                          **projection_options)
    return _build(fn, params, projection, prior_precision, key, num_trace_samples)


def loss_projected_posterior(fn, params, data, likelihood, *, batch_size: int, prior_precision=1.0, key=None,
                             num_trace_samples: int = 100, **projection_options) -> ProjectedPosterior:
    r"""The loss-projected posterior $\mathcal N(\theta^*, \alpha^{-1}\Pi_{\ker J_L})$ (section 4.1).

    One row per example whatever the number of outputs; $\ker J \subseteq \ker J_L$ (lemma 4.2).
    The arguments are `projected_posterior`'s, with the targets in ``data`` and the ``likelihood``.

    Examples:
        >>> import jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> fn = lambda w, x: (x @ w)[None]
        >>> X, Y = jnp.array([[1.0, 0.0]]), jnp.array([[0.0]])
        >>> post = pst.loss_projected_posterior(fn, jnp.ones(2), (X, Y), Gaussian(1.0), batch_size=1)
        >>> (post.covariance @ jnp.array([1.0, 1.0])).round(5) + 0.0
        Array([0., 1.], dtype=float32)
    """
    check_data(data, "loss_projected_posterior")
    check_likelihood(likelihood, "loss_projected_posterior")
    check_params(params, "loss_projected_posterior")
    _check_prior(prior_precision, key, "loss_projected_posterior")
    inputs, targets = data
    projection_options.setdefault("progress", True)
    projection = lo.AlternatingProjectionOp.from_loss_jacobian(fn, params, inputs, targets, likelihood,
                                                               batch_size=batch_size, **projection_options)
    return _build(fn, params, projection, prior_precision, key, num_trace_samples)


__all__ = ["ProjectedPosterior", "loss_projected_posterior", "optimal_prior_precision", "projected_posterior"]
