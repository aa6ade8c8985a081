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

import dataclasses
import functools
import time
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops.likelihoods import Categorical, Gaussian
from linops.models import ravel, unravel_of
from linops.runtime import canonical_convolutions, new_bar, program, tick, update
from posteriors._checks import check_data, check_likelihood, check_params, check_targets, with_position_axis
from posteriors._prior import canonical_prior, check_sigma, noise_scale
from posteriors._structures import REGISTRY
from posteriors._training import check_rate, check_trained, minibatch_loss, positive_int
from posteriors.laplace_family import STRUCTURES, LaplacePosterior, laplace
from posteriors.weights import select


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
                             validation=None, grid=None, objective: str = "nll", link: str = "probit",
                             check=None, progress: bool = True):
    r"""Tune the prior precision (and, for a Gaussian likelihood, $\sigma$): the refitted posterior and a report.

    Args:
        post: a `LaplacePosterior`.
        method: ``"marglik"`` maximises `marginal_log_likelihood` by Adam (optax) on
            $\log\alpha$ (and $\log\sigma$), starting from the posterior's values; ``"gridsearch"``
            minimises ``objective`` of the predictive on ``validation`` over ``grid`` (scalar $\alpha$),
            warning when the best value sits at an edge of the grid.
        prior_structure: for ``"marglik"``: ``"scalar"``, ``"layerwise"`` (one per leaf) or
            ``"diag"`` (one per parameter).
        tune_sigma: also tune a Gaussian likelihood's scalar $\sigma$ (``"marglik"`` only).
        num_steps: Adam's steps.
        learning_rate: Adam's learning rate (on the logarithms).
        validation: ``(inputs, targets)`` for ``"gridsearch"``.
        grid: candidate scalar precisions (default $10^{-4}, \dots, 10^{4}$, 33 values).
        objective: what ``"gridsearch"`` minimises on ``validation``: ``"nll"`` (the predictive negative
            log-likelihood, any likelihood), ``"ece"`` (expected calibration error, 15 bins) or ``"brier"``
            (a categorical likelihood's classification predictive).
        link: the classification predictive of ``"gridsearch"`` (see `posteriors.predictive.nll`).
        check: for ``"marglik"``, the training data ``(inputs, targets)`` (optional): the tuned predictive's
            negative log-likelihood on its first 256 examples (`CHECK_EXAMPLES`) is compared with the network's alone,
            and a warning says when the predictive explains them far worse (more than the network's value plus
            0.1 nats above it): the evidence is not a calibration criterion, and on a trained CNN its
            predictive can be near-uniform. Costs one predictive on those examples.
        progress: a progress bar over Adam's steps or the grid on stderr, shown once the tuning runs
            longer than two seconds; False silences it.

    Returns:
        ``(posterior, report)``: ``report`` holds ``"prior_precision"``, ``"sigma"`` and the
        trace (``"log_marginal_likelihood"`` per step, or ``"grid"`` and the objective's value at each point
        under its name, ``"nll"``, ``"ece"`` or ``"brier"``).

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
    if check is not None:
        if method != "marglik":
            raise ValueError(f"{who}: check= compares an evidence-tuned predictive with the network (method="
                             f"'marglik'); with method={method!r} the validation data already judge the predictive")
        check = check_data(check, who, "check")
        check_targets(post.fn, post.params, check, post.likelihood, who)
    if method == "gridsearch":
        return _gridsearch(post, validation, grid, link, who, label, objective)
    if method != "marglik":
        raise ValueError(f"{who}: method must be 'marglik' or 'gridsearch', got {method!r}")
    if prior_structure not in ("scalar", "layerwise", "diag"):
        raise ValueError(f"{who}: prior_structure must be 'scalar', 'layerwise' or 'diag', got {prior_structure!r}")
    if post.ggn.scalar_prior and prior_structure != "scalar":
        raise ValueError(f"{who}: a {post.structure!r} posterior takes one scalar prior precision: use "
                         f"prior_structure='scalar', got {prior_structure!r}")
    if not post.ggn.per_parameter_prior and prior_structure == "diag":
        raise ValueError(f"{who}: a {post.structure!r} posterior takes one prior precision per leaf: use 'scalar' or "
                         "'layerwise'")
    if tune_sigma:
        check_sigma(post, 1.0, who)  # refuses a non-Gaussian or per-output sigma with a clear error
    check_rate(learning_rate, "learning_rate", who)
    num_steps = positive_int(num_steps, "num_steps", who)
    rate = jax.device_put(np.asarray(learning_rate, unravel_of(post.params).dtype))  # data, not a program key
    alpha, sigma, trace = _tune(post, rate, num_steps=num_steps, prior_structure=prior_structure,
                                tune_sigma=tune_sigma, sizes=tuple(post.weights.group_sizes(post.params)), label=label)
    check_trained(who, f"Adam on the log evidence at learning_rate={learning_rate!r} is too large (the steps are "
                  "on the logarithms of the precisions): use a smaller one", prior_precision=alpha,
                  **({"sigma": sigma} if tune_sigma else {}))
    try:
        tuned = _with_subset_prior(post, alpha, sigma)
    except ValueError as e:
        if post.curvature != "hessian":
            raise
        raise ValueError(f"{who}: the evidence of this Hessian posterior has no maximum: its Hessian is indefinite, "
                         "and as the prior precision falls toward the point where Hessian + prior stops being "
                         "positive definite its log-determinant falls without bound (the tuning crossed it). Tune "
                         "a curvature='ggn' posterior, or use method='gridsearch' with validation data") from e
    report = {"prior_precision": alpha, "sigma": sigma if tune_sigma else getattr(post.likelihood, "sigma", None),
              "log_marginal_likelihood": trace}
    if check is not None:
        _warn_if_flatter_than_the_network(tuned, *check, who)
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
        # a gather by a constant index, not jnp.repeat: XLA constant-folds repeat's cumulative sum over all P
        # entries (3 s of compilation at P = 244k)
        leaf_of = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
        expand = lambda la: jnp.exp(la)[leaf_of]  # noqa: E731
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


def _gridsearch(post, validation, grid, link, who, label=None, objective="nll"):
    from posteriors import metrics
    from posteriors.predictive import _checked_nll_targets, classification, nll

    if not (isinstance(validation, tuple) and len(validation) == 2):
        raise ValueError(f"{who}(method='gridsearch'): pass validation=(inputs, targets)")
    if objective not in ("nll", "ece", "brier"):
        raise ValueError(f"{who}: objective must be 'nll', 'ece' or 'brier', got {objective!r}")
    if objective != "nll" and not isinstance(post.likelihood, Categorical):
        raise ValueError(f"{who}: objective={objective!r} scores a categorical likelihood's class probabilities; "
                         f"this posterior's likelihood is {type(post.likelihood).__name__} (use objective='nll')")
    grid = jnp.logspace(-4, 4, 33) if grid is None else jnp.asarray(grid)
    if grid.ndim != 1 or grid.shape[0] < 2 or not bool(jnp.all((grid > 0) & jnp.isfinite(grid))):
        raise ValueError(f"{who}: grid must be a 1-D array of at least two finite positive precisions, got {grid}")
    Xv, Yv = validation
    Yv = _checked_nll_targets(post, Xv, Yv, post.likelihood)  # refused before any predictive
    score = {"ece": metrics.ece, "brier": metrics.brier}.get(objective)
    bar = new_bar(label, grid.shape[0], "value") if label else None
    values = []
    for a in grid:
        try:
            tuned = _with_subset_prior(post, a, None)
        except ValueError:
            if post.curvature != "hessian":
                raise
            values.append(jnp.asarray(jnp.nan))  # an indefinite Hessian's precision at this prior: no posterior
            if bar is not None:
                bar.update(1)
            continue
        if score is None:
            values.append(nll(tuned, Xv, Yv, link=link, progress=False))
        else:
            values.append(score(classification(tuned, Xv, link=link, progress=False), Yv))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    values = jnp.stack(values)
    if not bool(jnp.any(jnp.isfinite(values))):
        raise ValueError(f"{who}: no prior precision of the grid gives a finite {objective}"
                         + (" (the Hessian is indefinite beyond every one: widen the grid upwards)"
                            if post.curvature == "hessian" else ""))
    best = int(jnp.nanargmin(values))
    if best in (0, grid.shape[0] - 1):
        warnings.warn(f"{who}: the best prior precision {float(grid[best]):.3g} is at the "
                      f"{'lower' if best == 0 else 'upper'} edge of the grid [{float(grid[0]):.3g}, "
                      f"{float(grid[-1]):.3g}]; widen the grid", UserWarning, stacklevel=2)
    tuned = _with_subset_prior(post, grid[best], None)
    return tuned, {"prior_precision": grid[best], "sigma": getattr(post.likelihood, "sigma", None), "grid": grid,
                   objective: values}


@dataclasses.dataclass(frozen=True)
class MarglikTraining:
    """What `marglik_training` returns: the trained ``params``, the ``posterior`` fitted and tuned at them, and
    the ``history`` (a dict of NumPy arrays: ``loss``, the training objective's mean over each epoch, and
    ``epoch_seconds``; ``marglik_epochs``, the epochs after which the hyperparameters were updated, and at each
    of those ``update_seconds`` (the fit and the tuning, their compilation included), ``log_marginal_likelihood``,
    ``prior_precision`` and ``sigma`` (``None`` unless the likelihood is Gaussian); ``best_epoch``, the epoch
    whose weights and posterior are returned).

    Examples:
        >>> import posteriors as pst
        >>> import dataclasses
        >>> [f.name for f in dataclasses.fields(pst.MarglikTraining)]
        ['params', 'posterior', 'history']
    """

    params: Any
    posterior: LaplacePosterior
    history: dict


def marglik_training(fn, params, data, likelihood, *, key: jax.Array, num_epochs: int, batch_size: int = 128,
                     optimizer=None, structure: str = "kfac", prior_structure: str = "layerwise",
                     prior_precision=1.0, tune_sigma: bool | None = None, burn_in: int = 0, every: int = 1,
                     hyper_steps: int = 10, hyper_learning_rate: float = 0.1, laplace_options: dict | None = None,
                     restore_best: bool = True, progress: bool = True) -> MarglikTraining:
    r"""Train a network and its prior precision (and Gaussian noise) together by the Laplace evidence.

    Immer et al. (2021), algorithm 1. Each epoch takes optimizer steps on minibatches of the mean negative
    log-likelihood plus $\tfrac{1}{2N}\theta^\top\operatorname{diag}(\alpha)\,\theta$, the prior the evidence
    tunes (the scaling of `swag` and `deep_ensemble`). After ``burn_in`` epochs, every ``every`` epochs and after
    the last one, `laplace` fits the posterior of ``structure`` at the current weights and
    `optimize_prior_precision` takes ``hyper_steps`` Adam steps on the log evidence in $\log\alpha$ (and
    $\log\sigma$); the training then goes on under the new prior and noise. The evidence means something only
    for a network trained under the prior it tunes. Measured on small CNNs (the docs' how-to "Calibrated without
    validation data"), the network it trains is well calibrated with no validation data, but its linearised
    predictive can stay under-confident: it then warns, comparing the two on the first 256
    training examples.

    Args:
        fn: the per-example model ``fn(params, x) -> (O,)``.
        params: the initial parameters.
        data: ``(X, Y)``.
        likelihood: a `linops.likelihoods.Likelihood`; a Gaussian's scalar ``sigma`` is the noise's initial value.
        key: the minibatches' key (a permutation of the examples each epoch).
        num_epochs: passes over the data (each drops the last incomplete batch).
        batch_size: examples per step.
        optimizer: an optax optimizer for the weights (default ``optax.adam(1e-3)``).
        structure: the curvature of the evidence: ``"kfac"`` (default), ``"diag"``, ``"full"``, ``"lowrank"``.
        prior_structure: ``"scalar"``, ``"layerwise"`` (one per leaf, the default) or ``"diag"`` (one per
            parameter; ``"full"``, ``"diag"`` and ``"lowrank"`` structures only).
        prior_precision: the initial prior precision (a scalar, or one per parameter).
        tune_sigma: learn a Gaussian likelihood's scalar noise too (default: whenever the likelihood is one).
        burn_in: epochs before the first hyperparameter update.
        every: epochs between hyperparameter updates (the paper's F).
        hyper_steps: Adam steps on the log evidence at each update (the paper's K).
        hyper_learning_rate: their learning rate, on the logarithms.
        laplace_options: more keyword arguments of `laplace` (``batch_size``, ``rank`` and ``key`` of low rank,
            ``kfac_fallback``, ``curvature`` and ``num_samples``, ...); not ``subset_of_weights``: the prior the
            evidence tunes is every weight's. ``curvature="fisher"`` without a ``key`` draws fresh targets at every
            update (from ``key``): one reverse pass per draw and example, where the GGN takes one per output.
        restore_best: return the weights and posterior of the update with the highest log evidence (as
            laplace-torch does), not the last; ``history["best_epoch"]`` says which.
        progress: a bar over the epochs with the loss and the log evidence, on stderr after two seconds.

    Returns:
        A `MarglikTraining`: ``.params`` and ``.posterior`` (a `LaplacePosterior` with the learnt prior and
        noise) of the update with the highest log evidence (the last with ``restore_best=False``), and
        ``.history``.

    Examples:
        >>> import jax, jax.numpy as jnp, optax
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> X = jax.random.normal(jax.random.key(0), (64, 3))
        >>> Y = X @ jnp.array([[1.0], [-2.0], [0.5]]) + 0.3 * jax.random.normal(jax.random.key(1), (64, 1))
        >>> fit = pst.marglik_training(lambda w, x: x @ w, jnp.zeros((3, 1)), (X, Y), Gaussian(1.0),
        ...                            key=jax.random.key(2), num_epochs=300, batch_size=64, structure="full",
        ...                            prior_structure="scalar", optimizer=optax.adam(3e-2), every=20,
        ...                            hyper_steps=50, progress=False)
        >>> round(float(fit.posterior.likelihood.sigma), 1), fit.history["log_marginal_likelihood"].shape
        (0.3, (15,))
    """
    who = "marglik_training"
    check_params(params, who)
    check_likelihood(likelihood, who)
    X, Y = check_data(data, who)
    fn, likelihood = with_position_axis(fn, params, X, likelihood, who)  # (T, V) outputs: read flattened
    check_targets(fn, params, (X, Y), likelihood, who)
    n = jax.tree_util.tree_leaves(X)[0].shape[0]
    num_epochs = positive_int(num_epochs, "num_epochs", who)
    batch_size = min(positive_int(batch_size, "batch_size", who), n)
    burn_in = positive_int(burn_in, "burn_in", who, minimum=0)
    every = positive_int(every, "every", who)
    hyper_steps = positive_int(hyper_steps, "hyper_steps", who)
    if burn_in >= num_epochs:
        raise ValueError(f"{who}: burn_in ({burn_in}) must be smaller than num_epochs ({num_epochs}), or the "
                         "prior is never tuned")
    if structure not in STRUCTURES:
        raise ValueError(f"{who}: structure must be one of {STRUCTURES}, got {structure!r}")
    if prior_structure not in ("scalar", "layerwise", "diag"):
        raise ValueError(f"{who}: prior_structure must be 'scalar', 'layerwise' or 'diag', got {prior_structure!r}")
    if prior_structure != "scalar" and REGISTRY[structure].scalar_prior:
        raise ValueError(f"{who}: a {structure!r} posterior takes one scalar prior precision: use "
                         f"prior_structure='scalar', got {prior_structure!r}")
    if prior_structure == "diag" and not REGISTRY[structure].per_parameter_prior:
        raise ValueError(f"{who}: a {structure!r} posterior takes one prior precision per leaf: use "
                         "prior_structure='scalar' or 'layerwise'")
    options = dict(laplace_options or {})
    if "subset_of_weights" in options or "prior_precision" in options or "structure" in options:
        raise ValueError(f"{who}: laplace_options may not set subset_of_weights, structure or prior_precision "
                         f"(the prior the evidence tunes is every weight's); got {sorted(options)}")
    gaussian = isinstance(likelihood, Gaussian) and not likelihood.heteroscedastic and jnp.ndim(likelihood.sigma) == 0
    tune_sigma = gaussian if tune_sigma is None else bool(tune_sigma)
    if tune_sigma and not gaussian:
        raise ValueError(f"{who}: tune_sigma needs a Gaussian likelihood with one scalar sigma, got "
                         f"{type(likelihood).__name__}")
    if not float(hyper_learning_rate) > 0:
        raise ValueError(f"{who}: hyper_learning_rate must be positive, got {hyper_learning_rate!r}")
    optimizer = _default_optimizer() if optimizer is None else optimizer
    flat, unravel = ravel(params)
    P = flat.shape[0]
    alpha = canonical_prior(prior_precision, params, select("all", params, who=who), REGISTRY[structure], who=who)
    if prior_structure != "scalar":  # the form every update returns: the first fit and tuning compile the programs
        alpha = jnp.asarray(np.broadcast_to(np.asarray(alpha), (P,)))  # the later ones reuse (one per parameter)

    state, lik, keys = optimizer.init(flat), likelihood, jax.random.split(key, num_epochs)
    history = {"loss": [], "epoch_seconds": [], "marglik_epochs": [], "update_seconds": [],
               "log_marginal_likelihood": [], "prior_precision": [], "sigma": []}
    posterior, evidence, best = None, None, None
    for e in range(1, num_epochs + 1):
        t0 = time.perf_counter()
        flat, state, loss = _epoch(fn, unravel, optimizer, flat, state, jnp.broadcast_to(alpha, (P,)), lik, X, Y,
                                   keys[e - 1], batch_size=batch_size)
        history["loss"].append(float(loss))  # waits for the epoch
        history["epoch_seconds"].append(time.perf_counter() - t0)
        if e > burn_in and ((e - burn_in) % every == 0 or e == num_epochs):
            t0 = time.perf_counter()
            opts = options
            if options.get("curvature") == "fisher" and "key" not in options:  # fresh draws at every update
                opts = {**options, "key": jax.random.fold_in(key, e)}
            post = laplace(fn, unravel(flat), (X, Y), lik, structure=structure, prior_precision=alpha,
                           progress=False, **opts)
            posterior, report = optimize_prior_precision(post, prior_structure=prior_structure, tune_sigma=tune_sigma,
                                                         num_steps=hyper_steps, learning_rate=hyper_learning_rate,
                                                         progress=False)
            alpha, evidence = report["prior_precision"], float(report["log_marginal_likelihood"][-1])
            if tune_sigma:
                lik = Gaussian(report["sigma"])
            history["marglik_epochs"].append(e)
            history["update_seconds"].append(time.perf_counter() - t0)
            history["log_marginal_likelihood"].append(evidence)
            history["prior_precision"].append(np.asarray(alpha))
            history["sigma"].append(None if not gaussian else float(lik.sigma))
            if best is None or not restore_best or np.isnan(best[0]) or evidence > best[0]:
                best = (evidence, e, posterior)
        if progress:
            update(who, "epoch", e, num_epochs, f"loss {history['loss'][-1]:.4g}" + (
                "" if evidence is None else f", log evidence {evidence:.6g}"))
    history = {k: np.asarray(v) if k != "sigma" or gaussian else None for k, v in history.items()}
    _, history["best_epoch"], posterior = best
    _warn_if_flatter_than_the_network(posterior, X, Y, who)
    return MarglikTraining(params=posterior.params, posterior=posterior, history=history)


CHECK_EXAMPLES = 256
"""How many training examples `marglik_training` compares the tuned predictive and the network on."""


def _warn_if_flatter_than_the_network(post, X, Y, who):
    """Warn when the tuned predictive explains the training data far worse than the network alone: a mean
    negative log-likelihood more than the network's magnitude plus 0.1 nats above it, on the first `CHECK_EXAMPLES`
    examples
    (the evidence is not a calibration criterion, and its predictive can be near-uniform; issue 39)."""
    m = min(CHECK_EXAMPLES, Y.shape[0])
    if isinstance(post.likelihood, Gaussian) and post.likelihood.heteroscedastic:
        return  # a per-example noise does not slice with the examples here
    network, predictive = (float(v) for v in _check_nlls(post, X, Y, m))
    if predictive - network > abs(network) + 0.1:
        warnings.warn(f"{who}: on the first {m} training examples the evidence-tuned predictive's negative "
                      f"log-likelihood is {predictive:.3g} per example, the network's alone {network:.3g}: the "
                      "linearised predictive is far less confident than the network it was fitted to, and may be "
                      "under-confident on new data too. The network's own predictions (.params), or a prior chosen "
                      "on validation data (optimize_prior_precision(method='gridsearch', objective='nll' or 'ece')) "
                      "may serve better: see the docs' how-to 'Calibrated without validation data'.",
                      UserWarning, stacklevel=3)


@program
def _check_nlls(post, X, Y, m):
    """The network's mean negative log-likelihood and the predictive's, on the first ``m`` examples, as one
    program (run eagerly, the network's forward pass and the likelihood compiled about 50 small programs)."""
    from posteriors.predictive import nll

    Xs, Ys = jax.tree_util.tree_map(lambda a: a[:m], X), Y[:m]
    out = jax.vmap(post.fn, in_axes=(None, 0))(post.params, Xs)
    return jnp.mean(jax.vmap(post.likelihood.nll)(out, Ys)), nll(post, Xs, Ys, progress=False) / m


@functools.cache
def _default_optimizer():
    """``optax.adam(1e-3)``, one object (the epoch's program is keyed by the optimizer's functions)."""
    import optax

    return optax.adam(1e-3)


@program
def _epoch(fn, unravel, optimizer, theta, state, alpha, lik, X, Y, key, *, batch_size):
    """One epoch of `marglik_training`'s weight steps as one program (cached per model, optimizer and shapes; the
    prior, the noise and the data are its arguments): ``(theta, state, mean objective)``."""
    import optax

    n = Y.shape[0]
    order = jax.random.permutation(key, n)[: (n // batch_size) * batch_size].reshape(-1, batch_size)
    loss = minibatch_loss(fn, unravel, (X, Y), lik, alpha, theta.dtype)  # SWAG's and the ensemble's objective

    def step(carry, idx):
        th, st = carry
        value, grads = jax.value_and_grad(loss)(th, idx)
        updates, st = optimizer.update(grads, st, th)
        return (optax.apply_updates(th, updates), st), value

    (theta, state), values = jax.lax.scan(canonical_convolutions(step), (theta, state), order)
    return theta, state, jnp.mean(values)


__all__ = ["MarglikTraining", "marginal_log_likelihood", "marglik_training", "optimize_prior_precision"]
