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
import numpy as np

import linops as lo
from linops.models import ravel
from linops.runtime import flat_draw, program
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
        trace_estimate: $\operatorname{Tr}\Pi$ with its standard error and its number of probes ``k`` when
            $\alpha$ was chosen by ``"optimal"`` (as many as $\alpha^*$'s target error needed), else None.
        trace_draws: the projected Gaussian probes $\Pi\varepsilon_i$ of that estimate, shape
            ``(P, k)`` (None without ``"optimal"``); `trace_samples` turns them into samples, and the
            predictive uses them (`draws`).
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
        eps = flat_draw(jax.random.normal, key, (self.mean.shape[0], n), self.mean.dtype)
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

    def draws(self, num_samples: int | None = None, *, key: jax.Array | None = None) -> jax.Array:
        r"""Parameter offsets $\theta_s - \theta^*$ for the predictive, shape ``(n, P)``: the fit's draws first.

        The projected trace probes of ``prior_precision="optimal"`` are posterior samples already (as
        `trace_samples`); they cost nothing more. ``num_samples=None`` returns all of them; a smaller number
        returns the first ones; a larger one adds ``num_samples - k`` fresh samples from ``key`` (one
        projection of those together, `sample`). A posterior built with a given ``prior_precision`` has no
        draws: it needs ``key`` and draws ``num_samples`` (default 100). The predictive
        (`posteriors.predictive.linearized`, ``classification``) uses this with its ``key`` and ``num_samples``.

        Examples:
            >>> import jax, jax.numpy as jnp
            >>> import posteriors as pst
            >>> X = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
            >>> post = pst.projected_posterior(lambda w, x: (x @ w)[None], jnp.ones(3), X, batch_size=1,
            ...                                prior_precision="optimal", key=jax.random.key(0))
            >>> k = post.trace_draws.shape[1]
            >>> bool(jnp.allclose(post.draws(), post.trace_samples() - post.mean, atol=1e-6))   # the fit's
            True
            >>> post.draws(k + 5, key=jax.random.key(1)).shape == (k + 5, 3)       # five fresh ones on top
            True
        """
        return self._joined_draws(*self._draw_parts(num_samples, key, f"{type(self).__name__}.draws"))

    def _joined_draws(self, used, fresh):
        """The first ``used`` of the fit's draws, scaled, then the ``fresh`` offsets: `draws`' value."""
        parts = [] if not used else [self.trace_draws[:, :used].T / jnp.sqrt(self.prior_precision)]
        parts += [] if fresh is None else [fresh]
        return parts[0] if len(parts) == 1 else jnp.concatenate(parts)

    def _draw_parts(self, num_samples, key, who):
        """``(used, fresh)``: how many of the fit's draws (`trace_draws`' first columns) `draws` returns, and the
        fresh offsets ``(n - used, P)`` drawn from ``key`` on top of them (None when none are asked for)."""
        have = 0 if self.trace_draws is None else self.trace_draws.shape[1]
        if num_samples is None:
            num_samples = have if have else 100
        num_samples = positive_int(num_samples, "num_samples", who)
        if num_samples <= have:
            return num_samples, None
        if key is None:
            made = (f"the fit made {have} (the trace probes of prior_precision='optimal')" if have else
                    "the fit made none (they come with prior_precision='optimal')")
            raise ValueError(f"{who}: {num_samples} samples asked for and {made}: pass key=jax.random.key(...) "
                             f"for the {num_samples - have} fresh ones (each projected), or ask for fewer")
        return have, self.sample(key, num_samples - have) - self.mean[None, :]

    def ood_score(self, key: jax.Array, inputs, n: int) -> jax.Array:
        """The out-of-distribution score: the largest output variance per input, shape ``(M,)``."""
        return jnp.max(self.predictive_variance(key, inputs, n), axis=-1)


TRACE_RTOL = 0.02
"""Default target for $\\alpha^*$'s relative standard error (the rank estimate's): 2%."""
TRACE_BLOCK = 10
"""Default number of trace probes projected together, one block at a time, until the target is met."""
MIN_PROBES = 10
"""The fewest probes the adaptive rule stops at: a standard error from fewer is too noisy to stop on. (With blocks of
2, stopping as soon as the estimated error met the target covered the truth within two stated errors in 81% of
keys; waiting for 10 probes and asking the error's one-sigma upper bound to meet it, 94%.)"""


def optimal_prior_precision(projection: lo.AlternatingProjectionOp, theta, key, num_samples: int = 100, *,
                            rtol: float | None = TRACE_RTOL, block: int = TRACE_BLOCK):
    r"""$\alpha^* = r / \|\theta^*\|^2$ with the GGN's rank $r = \operatorname{Tr}(I - \Pi)$ by Hutchinson.

    The probes are standard Gaussian $\varepsilon_i$, projected ``block`` at a time (one projection per block)
    until $\alpha^*$'s relative standard error is at most ``rtol`` (never before 10 probes), or ``num_samples``
    probes were used (``rtol=None``: exactly ``num_samples``, in one projection). Each probe estimates $r$ by
    $c\,\varepsilon_i^\top(\varepsilon_i - \Pi\varepsilon_i) + (1 - c)(P - \varepsilon_i^\top\Pi\varepsilon_i)$ with
    $c = \operatorname{Tr}\Pi / P$ (estimated): both terms are unbiased, and the blend's variance
    $2r\operatorname{Tr}\Pi / P$ is at most $2r$, where $P - \varepsilon_i^\top\Pi\varepsilon_i$ alone has
    $2\operatorname{Tr}\Pi$. So $\alpha^*$'s relative standard error is at most about $\sqrt{2 / (r k)}$ after $k$
    probes: a network whose GGN has rank in the thousands needs one block, a rank of 10 about 500 probes for 2%.
    Under ``jax.jit`` the count cannot depend on values: all ``num_samples`` are used. Block ``i`` is drawn from
    ``key`` (``i = 0``) or ``jax.random.fold_in(key, i)``.

    The projected probes $\Pi\varepsilon_i$ are draws of $\mathcal N(0, \Pi)$: the posteriors keep them as
    samples (`ProjectedPosterior.trace_samples`, and the predictive by default) instead of paying for new
    projections. Returns ``(alpha, estimate)``; ``estimate`` is $\operatorname{Tr}\Pi = P - \hat r$ with its
    standard error (that of $\hat r$) and the number of probes used.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> from posteriors.projected import optimal_prior_precision
        >>> Pi = lo.AlternatingProjectionOp.from_matrix(jnp.eye(100)[:40], batch_size=10)   # rank 40 of 100
        >>> alpha, est = optimal_prior_precision(Pi, jnp.ones(100), jax.random.key(0), 400)
        >>> bool(abs(est.value - 60) < 4 * est.standard_error), est.num_samples < 400   # stopped early...
        (True, True)
        >>> bool(est.standard_error <= 0.02 * (100 - est.value))   # ...with alpha* = rank / 100 known to 2%
        True
    """
    alpha, estimate, _, _ = _optimal(projection, theta, key, num_samples, rtol, block)
    return alpha, estimate


def _probe_blocks(num_samples, rtol, block, who, names=("num_samples", "rtol", "block")):
    """The probe counts of the blocks, in order (the adaptive rule may stop before the last); ``names``: the
    caller's names of the three arguments, for its errors."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 2:
        raise ValueError(f"{who}: {names[0]} must be an int >= 2 for a standard error, got {num_samples!r}")
    if rtol is None:
        return [num_samples]
    if isinstance(rtol, bool) or not isinstance(rtol, int | float) or not 0 < rtol < 1:
        raise ValueError(f"{who}: {names[1]} (the target relative standard error of alpha*) must be in (0, 1) or "
                         f"None, got {rtol!r}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 2:
        raise ValueError(f"{who}: {names[2]} (probes projected together) must be an int >= 2, got {block!r}")
    full, rest = divmod(num_samples, block)
    return [block] * full + ([rest] if rest else [])


def _optimal(projection, theta, key, num_samples, rtol=TRACE_RTOL, block=TRACE_BLOCK):
    """``(alpha, estimate, draws, result)`` (``result``: the probes' `linops.Projection`, whose value is
    ``draws``); refuses a rank that is not significantly positive."""
    who = "optimal_prior_precision"
    sizes = _probe_blocks(num_samples, rtol, block, who)
    P = projection.shape[0]
    traced = any(isinstance(a, jax.core.Tracer) for a in (theta, *jax.tree_util.tree_leaves(projection)))
    # ||theta||^2: on the host in float64 unless traced (an eager jnp reduction compiles programs of its own)
    norm2 = jnp.sum(jnp.asarray(theta) ** 2) if traced else float(np.sum(np.asarray(theta, np.float64) ** 2))
    results, kept, seen = [], [], []
    for i, size in enumerate(sizes):
        eps = flat_draw(jax.random.normal, key if i == 0 else _fold_in(key, i), (P, size), projection.dtype)
        results.append(projection.project_samples(eps))
        k_i, s_i = _probe_terms(eps, results[-1].value)
        kept.append(k_i)
        seen.append(s_i)
        if rtol is not None and not traced and i + 1 < len(sizes):
            per_probe = _rank_per_probe(*_on_host(kept, seen), P)
            k = per_probe.shape[0]
            # the standard error is itself estimated: stopping as soon as its estimate meets the target favours
            # estimates that happen to be low, so its one-sigma upper bound (relative error 1/sqrt(2(k-1))) must
            # meet the target
            error = per_probe.std(ddof=1) / np.sqrt(k) * (1.0 + 1.0 / np.sqrt(2.0 * (k - 1)))
            if k >= MIN_PROBES and error <= rtol * per_probe.mean():
                break
    result = results[0] if len(results) == 1 else _joined(results, traced)
    draws = result.value  # (P, k): also N(0, Pi) samples
    k = draws.shape[1]
    _warn_unconverged(result, who, f"{k} trace probes")
    message = (f"{who}: the estimated rank of the GGN, Tr(I - Pi) = P - Tr(Pi), is not significantly positive (or "
               "||theta||^2 is 0), so alpha* = rank / ||theta||^2 is not a positive prior precision")
    # The GGN's rank r = Tr(I - Pi), in [0, P]. When the estimate does not put it clearly above 0 (within two
    # standard errors), alpha* would be ~0 or negative and every sample NaN: refused.
    if traced:
        per_probe = _rank_per_probe(jnp.concatenate(kept), jnp.concatenate(seen), P)
        rank, error = jnp.mean(per_probe), jnp.std(per_probe, ddof=1) / jnp.sqrt(k)
        estimate = lo.Estimate(P - rank, error, k)
        rank = eqx.error_if(jnp.clip(rank, 0.0, P), (rank <= 2 * error) | ~(norm2 > 0), message)
        return rank / norm2, estimate, draws, result
    # eagerly, in float64 numpy: a few numbers, no program to compile for each probe count
    per_probe = _rank_per_probe(*_on_host(kept, seen), P)
    rank, error = float(per_probe.mean()), float(per_probe.std(ddof=1) / np.sqrt(k))
    dtype = projection.dtype
    estimate = lo.Estimate(_on_device(P - rank, dtype), _on_device(error, dtype), k)
    rank = min(max(rank, 0.0), P)
    if rank <= 2 * error or not norm2 > 0:
        raise ValueError(f"{message}: P = {P}, Tr(Pi) = {P - rank:.1f} +- {error:.1f} ({k} probes), ||theta||^2 = "
                         f"{norm2:.3g}. The training Jacobian sees (almost) no direction: check the model and the "
                         "data, or pass a positive prior_precision")
    return _on_device(rank / norm2, dtype), estimate, draws, result


_fold_in = jax.jit(jax.random.fold_in)  # one program (called eagerly, fold_in compiles two)


@program
def _probe_terms(eps, projected):
    r"""Per probe, $P - \varepsilon^\top\Pi\varepsilon$ and $\varepsilon^\top(I - \Pi)\varepsilon$ (one program per
    block shape)."""
    return eps.shape[0] - jnp.sum(eps * projected, axis=0), jnp.sum(eps * (eps - projected), axis=0)


def _on_device(value, dtype):
    """A host number as a device scalar of ``dtype``, by `jax.device_put` (``jnp.asarray`` would compile a
    conversion)."""
    return jax.device_put(np.asarray(value, dtype))


def _joined(results, traced):
    """The probe blocks' `linops.Projection` results as one (probes along the columns of ``value``). Joined on the
    host and moved back with `jax.device_put` (an eager ``jnp.concatenate`` compiles a program for each number of
    blocks, and the number of blocks depends on the values), except inside a trace or for arrays split over
    devices, where ``jnp.concatenate`` keeps their placement."""
    fields = ("value", "sweeps", "converged", "kernel_residual", "residuals")
    if traced or any(len(p.value.sharding.device_set) > 1 for p in results):
        return lo.Projection(*(jnp.concatenate([getattr(p, f) for p in results], axis=int(f == "value"))
                               for f in fields))
    return lo.Projection(*(jax.device_put(np.concatenate([np.asarray(getattr(p, f)) for p in results],
                                                         axis=int(f == "value"))) for f in fields))


def _on_host(*blocks):
    """Each list of per-block arrays as one float64 numpy array."""
    return [np.concatenate([np.asarray(a, np.float64) for a in b]) for b in blocks]


def _rank_per_probe(kept, seen, P):
    r"""Per-probe estimates of the rank $r = \operatorname{Tr}(I - \Pi)$: $c\,\varepsilon^\top(I - \Pi)\varepsilon +
    (1 - c)(P - \varepsilon^\top\Pi\varepsilon)$. Both terms are unbiased, with variances $2r$ and
    $2\operatorname{Tr}\Pi$ (they differ by the control variate $\|\varepsilon\|^2 - P$); the weight
    $c = \operatorname{Tr}\Pi / P$, estimated, minimises the variance, to $2 r \operatorname{Tr}\Pi / P$: about
    $2r$ for an over-parameterised network (a GGN of rank $r \ll P$), about 0 when the kernel is trivial."""
    xp = np if isinstance(kept, np.ndarray) else jnp
    c = xp.clip(1.0 - xp.mean(kept) / P, 0.0, 1.0)
    return c * seen + (1.0 - c) * kept


def _warn_unconverged(result, who, what):
    """Warn (eagerly) when some columns of a `linops.Projection` did not converge."""
    if isinstance(result.converged, jax.core.Tracer):
        return
    converged = np.asarray(result.converged)  # on the host: no program per number of columns
    if converged.all():
        return
    warnings.warn(f"{who}: the projections of {int(np.sum(~converged))} of {what} did not converge (largest "
                  f"kernel residual ||J Pi x|| / ||J x|| = {float(np.max(result.kernel_residual)):.2e}, after "
                  f"{int(np.max(result.sweeps))} sweeps): they are not exactly in the kernel of J. Raise max_sweeps, "
                  "loosen rtol, or use fewer examples or the loss-projected posterior", stacklevel=3)


def _check_prior(prior_precision, key, who, trace_options):
    if isinstance(prior_precision, str):
        if prior_precision != "optimal":
            raise ValueError(f"{who}: prior_precision must be a positive number or 'optimal', got {prior_precision!r}")
        if key is None:
            raise ValueError(f"{who}: prior_precision='optimal' estimates Tr(Pi) by Hutchinson: "
                             "pass key=jax.random.key(...)")
        _probe_blocks(*trace_options, who, ("num_trace_samples", "trace_rtol", "trace_block"))
    else:
        alpha = jnp.asarray(prior_precision)
        if alpha.ndim:
            raise ValueError(f"{who}: prior_precision must be a scalar (the projected posterior's covariance is "
                             f"Pi / alpha, one isotropic precision) or 'optimal', got an array of shape {alpha.shape}")
        if not isinstance(alpha, jax.core.Tracer) and not float(alpha) > 0:
            raise ValueError(f"{who}: prior_precision must be positive, got {float(alpha)}")
        if not isinstance(alpha, jax.core.Tracer) and float(alpha) == float("inf"):
            raise ValueError(f"{who}: prior_precision must be finite, got inf (a point mass at the MAP)")


def _summary(result):
    """The projection's record for the posterior: all converged, the most sweeps, the largest kernel residual; on the
    host (no program for each number of probes) unless traced."""
    parts = (result.converged, result.sweeps, result.kernel_residual)
    if any(isinstance(a, jax.core.Tracer) for a in parts):
        values = (jnp.all(parts[0]), jnp.max(parts[1]), jnp.max(parts[2]))
    else:
        values = (jax.device_put(np.all(np.asarray(parts[0]))),
                  *(jax.device_put(np.max(np.asarray(a))) for a in parts[1:]))
    return dict(zip(("projection_converged", "projection_sweeps", "projection_residual"), values, strict=True))


def _build(fn, params, projection, prior_precision, key, num_trace_samples, trace_rtol, trace_block):
    flat, unravel = ravel(params)
    if isinstance(prior_precision, str):
        alpha, estimate, draws, result = _optimal(projection, flat, key, num_trace_samples, trace_rtol, trace_block)
        record = _summary(result)
    else:
        alpha, estimate, draws, record = jnp.asarray(prior_precision, flat.dtype), None, None, {}
    return ProjectedPosterior(fn=fn, params=params, unravel=unravel, projection=projection, prior_precision=alpha,
                              trace_estimate=estimate, trace_draws=draws, **record)


def projected_posterior(fn, params, data, *, batch_size: int, prior_precision=1.0, key=None,
                        num_trace_samples: int = 100, trace_rtol: float | None = TRACE_RTOL,
                        trace_block: int = TRACE_BLOCK, **projection_options) -> ProjectedPosterior:
    r"""The projected posterior $\mathcal N(\theta^*, \alpha^{-1}\Pi_{\ker J})$.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``; ``params`` the MAP.
        data: the training inputs, or an ``(inputs, targets)`` pair (targets are not needed).
        batch_size: examples per projection batch ``S``.
        prior_precision: a positive number, or ``"optimal"`` ($r/\|\theta^*\|^2$, needs ``key``).
        num_trace_samples: the most Hutchinson probes for $\alpha^*$ (``trace_rtol=None``: exactly this many).
        trace_rtol: ``"optimal"``'s target relative standard error of $\alpha^*$ (default 2%): probes are
            projected ``trace_block`` at a time until it is met (`optimal_prior_precision`). A network whose GGN
            has rank $r$ in the thousands needs one block; the error is about $\sqrt{2/(r k)}$ after $k$ probes.
        trace_block: probes projected together per block (default 10). The projected probes are posterior
            samples: the predictive uses them by default (`ProjectedPosterior.draws`).
        projection_options: ``method``, ``max_sweeps``, ``rtol``, ``cutoff``, ``store_linearization``,
            ``row_dtype`` (with ``store_linearization="rows"``: the rows kept in float16, half their memory),
            ``progress`` (here True by default: a bar per projection that runs longer than two seconds; False
            silences it), ``mesh``, ``axis``, ``split_sweeps`` (the batches' factors built and kept on the
            devices of a mesh) and ``precision`` (default ``"highest"``: the projection's products in full float32
            also on a GPU, whose default TF32 products stall CG) of `AlternatingProjectionOp`.

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
    _check_prior(prior_precision, key, "projected_posterior", (num_trace_samples, trace_rtol, trace_block))
    inputs = data[0] if isinstance(data, tuple) else data
    check_examples(inputs, "projected_posterior", "the training inputs")
    check_finite(inputs, "projected_posterior", "the inputs")
    projection_options.setdefault("progress", True)
    projection = lo.AlternatingProjectionOp.from_jacobian(fn, params, inputs, batch_size=batch_size,
                                                          **projection_options)
    return _build(fn, params, projection, prior_precision, key, num_trace_samples, trace_rtol, trace_block)


def loss_projected_posterior(fn, params, data, likelihood, *, batch_size: int, prior_precision=1.0, key=None,
                             num_trace_samples: int = 100, trace_rtol: float | None = TRACE_RTOL,
                             trace_block: int = TRACE_BLOCK, **projection_options) -> ProjectedPosterior:
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
    _check_prior(prior_precision, key, "loss_projected_posterior", (num_trace_samples, trace_rtol, trace_block))
    inputs, targets = data
    projection_options.setdefault("progress", True)
    projection = lo.AlternatingProjectionOp.from_loss_jacobian(fn, params, inputs, targets, likelihood,
                                                               batch_size=batch_size, **projection_options)
    return _build(fn, params, projection, prior_precision, key, num_trace_samples, trace_rtol, trace_block)


__all__ = ["ProjectedPosterior", "loss_projected_posterior", "optimal_prior_precision", "projected_posterior"]
