r"""The linearised Laplace family: full, diagonal, last-layer, low-rank and KFAC posteriors.

$q(\theta) = \mathcal N(\theta^*, \Sigma)$ with $\Sigma = (G + \operatorname{diag}\alpha)^{-1}$,
$G$ the generalised Gauss-Newton matrix of the data at the trained $\theta^*$ in one of five
structures (`STRUCTURES`). The GGN is computed once; the prior precision $\alpha$ and, for a
Gaussian likelihood, the noise $\sigma$ can change afterwards at the cost of a
refactorisation (`LaplacePosterior.with_prior`), which is what evidence maximisation does
(`posteriors.marginal_log_likelihood`, `posteriors.optimize_prior_precision`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
from linops.likelihoods import Gaussian, Likelihood
from linops.models import example_spec, restrict, unravel_of
from linops.runtime import program
from posteriors import _structures as S
from posteriors._checks import check_data, check_likelihood, check_params
from posteriors.gaussian import GaussianPosterior

STRUCTURES = (*S.REGISTRY, "last_layer")
"""The curvature structures `laplace` accepts as ``structure=`` (the registered ones, and the last layer's full GGN)."""


class LaplacePosterior(GaussianPosterior):
    r"""$\mathcal N(\theta^*, (G/s + \operatorname{diag}\alpha)^{-1})$ in one of the Laplace structures.

    Attributes:
        structure: ``"full"``, ``"diag"``, ``"last_layer"``, ``"lowrank"``, ``"kfac"`` or
            ``"subnetwork"`` (`posteriors.subnetwork_laplace`).
        likelihood: the likelihood the GGN was computed with.
        prior_precision: $\alpha$, a scalar or one per parameter (of the subset, for ``"last_layer"``).
        noise_scale: $s = \sigma^2/\sigma_0^2$ when the Gaussian noise was re-tuned after the fit (else 1).
        subset: for ``"last_layer"`` and ``"subnetwork"``, the flat indices of the parameters with
            a posterior (the others stay at $\theta^*$); None otherwise.
        subset_leaves: for ``"last_layer"``, the indices of those parameters' leaves.
        loss: $\sum_n \ell(f(\theta^*, x_n), y_n)$ under ``likelihood`` (the evidence's data term).
        residual_ss: for a Gaussian likelihood, $\sum_n (y_n - f(\theta^*, x_n))^2$ per output
            (to re-tune the noise); None otherwise.
        num_examples: $N$.
    """

    structure: str = eqx.field(static=True)
    likelihood: Likelihood
    ggn: S.StructuredGGN
    prior_precision: jax.Array
    noise_scale: jax.Array
    subset: jax.Array | None
    subset_leaves: tuple | None = eqx.field(static=True)
    loss: jax.Array
    residual_ss: jax.Array | None
    num_examples: int = eqx.field(static=True)
    factor: object

    @property
    def num_params(self) -> int:
        """$P$, all the model's parameters."""
        return self.mean.shape[0]

    @property
    def _sub_mean(self):
        return self.mean if self.subset is None else self.mean[self.subset]

    def _embed(self, op):
        if self.subset is None:
            return op
        E = lo.Selection(self.subset, self.num_params, dtype=self.mean.dtype)
        return E.T @ op @ E

    def own_space(self):
        """``(fn, params, covariance)`` in the space the posterior lives in: the last layer's
        parameters alone for ``"last_layer"`` (the rest closed over), else the whole model."""
        if self.subset is None:
            return self.fn, self.params, self.covariance
        if self.subset_leaves is not None:
            fn_S, params_S, _ = _submodel(self.fn, self.params, self.subset_leaves)
        else:
            fn_S, params_S = restrict(self.fn, self.params, np.asarray(self.subset))
        return fn_S, params_S, self.ggn.covariance(self.prior_precision, self.noise_scale, self.factor)

    @property
    def covariance(self) -> lo.LinearOperator:
        """$\\Sigma$ as a lazy ``P x P`` operator (embedded from the subset for ``"last_layer"``)."""
        return self._embed(self.ggn.covariance(self.prior_precision, self.noise_scale, self.factor))

    @property
    def precision(self) -> lo.LinearOperator | None:
        """$G/s + \\operatorname{diag}\\alpha$; None for ``"last_layer"`` (the frozen parameters have none)."""
        if self.subset is not None:
            return None
        return self.ggn.precision(self.prior_precision, self.noise_scale)

    def sample(self, key: jax.Array, n: int) -> jax.Array:
        """``n`` flat parameter samples, shape ``(n, P)``."""
        deltas = self.ggn.sample(key, n, self.prior_precision, self.noise_scale, self.factor)
        if self.subset is not None:
            deltas = jnp.zeros((self.num_params, n), deltas.dtype).at[self.subset].set(deltas)
        return self.mean[None, :] + deltas.T

    def with_prior(self, prior_precision=None, sigma=None) -> LaplacePosterior:
        """The same fit with another prior precision and/or Gaussian noise $\\sigma$ (refactorised)."""
        alpha = self.prior_precision if prior_precision is None else _canonical_prior(
            prior_precision, self.params, self.subset, self.structure, "with_prior")
        if sigma is not None:
            sigma = _check_sigma(self, sigma, "with_prior")
        reprior = _reprior_compiled if self.ggn.compile_fit else _reprior
        new, finite = reprior(self, alpha, sigma)
        _check_factor(finite, alpha, new.noise_scale, jnp.result_type(alpha), "with_prior")
        return new


def _reprior(post, alpha, sigma):
    """``post`` at the prior ``alpha`` and (unless None) the noise ``sigma``, and whether its factor is finite."""
    scale, lik, loss = post.noise_scale, post.likelihood, post.loss
    if sigma is not None:
        scale, lik = _noise_scale(post, sigma)
        loss = gaussian_loss(post.residual_ss, post.num_examples, lik.sigma)
    factor, finite = _factor_and_check(post.ggn, alpha, scale)
    return eqx.tree_at(lambda p: (p.prior_precision, p.noise_scale, p.likelihood, p.loss, p.factor), post,
                       (alpha, scale, lik, loss, factor), is_leaf=lambda x: x is None), finite


_reprior_compiled = program(_reprior)


def _all_finite(tree) -> jax.Array:
    """Whether every inexact array of ``tree`` is finite, as one boolean computed where the tree is."""
    leaves = [a for a in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(jnp.result_type(a), jnp.inexact)]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in leaves])) if leaves else jnp.asarray(True)


def _factor_and_check(ggn, alpha, scale):
    return (factor := ggn.factorize(alpha, scale)), _all_finite(factor)


def _check_factor(finite, alpha, scale, dtype, who) -> None:
    """Refuse a factorisation that is not finite (``finite``: `_all_finite` of it).

    A Cholesky factor of a precision that is not numerically positive definite (a rank-deficient GGN with
    a prior precision near the dtype's rounding of its largest eigenvalues) is NaN; every sample,
    prediction and evidence would silently be NaN with it. A traced factor (under ``jax.jit``) cannot be
    checked here.
    """
    if isinstance(finite, jax.core.Tracer) or bool(finite):
        return
    a = np.asarray(alpha)
    prior = f"{float(a):.3g}" if a.size == 1 else f"in [{float(a.min()):.3g}, {float(a.max()):.3g}]"
    raise ValueError(
        f"{who}: the posterior precision (GGN / {float(scale):.3g} + prior precision {prior}) is not "
        f"numerically positive definite in {dtype}: its Cholesky factor is not finite. Use a "
        "larger prior precision (at least about eps x the GGN's largest eigenvalue), or float64 parameters")


def gaussian_loss(residual_ss, num_examples, sigma):
    r"""$\sum_n -\log \mathcal N(y_n \mid f_n, \sigma^2 I)$ from the residual sums of squares per output."""
    num_outputs = residual_ss.shape[0]
    return 0.5 * jnp.sum(residual_ss) / sigma**2 + num_examples * num_outputs * (jnp.log(sigma) +
                                                                              0.5 * jnp.log(2 * jnp.pi))


def _check_sigma(post, sigma, who):
    """``sigma`` as a scalar array of the parameters' dtype, refused unless the likelihood is Gaussian with one
    scalar sigma."""
    lik = post.likelihood
    if not isinstance(lik, Gaussian) or lik.heteroscedastic or jnp.ndim(lik.sigma) != 0:
        raise ValueError(f"{who}: sigma can be changed for a Gaussian likelihood with one scalar sigma only, "
                         f"got {type(lik).__name__}" + (f" with sigma of shape {jnp.shape(lik.sigma)}"
                                                       if isinstance(lik, Gaussian) else ""))
    if jnp.ndim(sigma) != 0:
        raise ValueError(f"{who}: sigma must be a scalar, got shape {jnp.shape(sigma)}")
    if isinstance(sigma, jax.Array):
        return sigma.astype(unravel_of(post.params).dtype)
    return jax.device_put(np.asarray(sigma, unravel_of(post.params).dtype))


def _noise_scale(post, sigma):
    """``(s, Gaussian(sigma))``: the GGN's scale at the noise ``sigma`` (checked by `_check_sigma`)."""
    # the GGN stored was computed with the noise of the fit, sigma_0 = lik.sigma / sqrt(noise_scale)
    sigma0_sq = post.likelihood.sigma**2 / post.noise_scale
    return sigma**2 / sigma0_sq, Gaussian(sigma)


def _canonical_prior(prior, params, subset, structure, who):
    """A scalar, or one precision per parameter (of the subset), as an array.

    Concrete priors are read and checked with NumPy on the host and moved to the device once: a check
    compiles no program of its own. A traced prior (tuning under ``jax.grad``) is kept traced, unchecked.
    """
    unravel = unravel_of(params)
    P, dtype = unravel.size, unravel.dtype
    traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((prior, subset)))
    xp = jnp if traced else np
    subset = None if subset is None else (subset if traced else np.asarray(subset))
    if isinstance(prior, (int, float, np.number)) or (hasattr(prior, "ndim") and jnp.ndim(prior) == 0):
        alpha = xp.asarray(prior, dtype)
    elif isinstance(prior, (jax.Array, np.ndarray)) and jnp.ndim(prior) == 1:
        alpha = xp.asarray(prior, dtype)
        if alpha.shape[0] != P:
            raise ValueError(f"{who}: a prior precision per parameter needs shape ({P},), got {alpha.shape}")
        if subset is not None:
            alpha = alpha[subset]
    else:
        try:
            leaves = jax.tree_util.tree_leaves(params)
            given = jax.tree_util.tree_leaves(prior)
            if len(given) != len(leaves):
                raise ValueError
            alpha = xp.concatenate([xp.broadcast_to(xp.asarray(g, dtype), jnp.shape(leaf)).reshape(-1)
                                    for g, leaf in zip(given, leaves, strict=True)])
        except (ValueError, TypeError):
            raise ValueError(f"{who}: prior_precision must be a positive scalar, an array of shape ({P},), or a "
                             "pytree shaped like params (one scalar or array per leaf)") from None
        if subset is not None:
            alpha = alpha[subset]
    if traced:
        return alpha
    if not np.all(alpha > 0):
        raise ValueError(f"{who}: prior_precision must be positive, got min {float(np.min(alpha))}")
    if structure == "kfac" and alpha.ndim == 1:
        starts = np.concatenate([[0], np.cumsum([np.size(leaf) for leaf in jax.tree_util.tree_leaves(params)])])
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            if not np.all(alpha[a:b] == alpha[a]):
                raise ValueError(f"{who}: a KFAC posterior takes one prior precision per leaf (per layer), but "
                                 f"parameters {a}..{b - 1} of one leaf have different ones")
    return jax.device_put(alpha)  # a transfer (jnp.asarray of a NumPy array compiles a program)


def last_layer_leaves(params, last_layer=None, *, fn=None, x=None) -> list[int]:
    """Leaf indices of the last layer: the weight and bias of the last dense layer in ``fn``'s traced program
    on one example ``x`` (`linops.nn.find_layers`: after any pooling or normalisation, for any model), or the
    leaves under the path prefix ``last_layer`` (``"layers.2"``). Without ``fn``: the leaves under the parent
    of the last 2-D leaf (an Equinox MLP's ``layers[-1]``; a Flax NNX layer's ``kernel`` and ``bias``).

    Examples:
        >>> import jax, equinox as eqx
        >>> from posteriors.laplace_family import last_layer_leaves
        >>> from linops.models import from_equinox
        >>> fn, params = from_equinox(eqx.nn.MLP(2, 3, 8, 2, key=jax.random.key(0)))
        >>> last_layer_leaves(params), last_layer_leaves(params, "layers.1")
        ([4, 5], [2, 3])
        >>> last_layer_leaves(params, fn=fn, x=jax.numpy.ones(2))
        [4, 5]
    """
    with_paths = jax.tree_util.tree_flatten_with_path(params)[0]
    names = [S.path_string(p) for p, _ in with_paths]
    if last_layer is not None:
        chosen = [i for i, name in enumerate(names) if name == last_layer or name.startswith(last_layer + ".")]
        if not chosen:
            raise ValueError(f"last_layer: no parameter path starts with {last_layer!r}; paths: {names}")
        return chosen
    if fn is not None:
        dense = [L for L in lo.nn.find_layers(fn, params, x) if L.kind == "dense"]
        if dense:
            return sorted(i for i in (dense[-1].weight, dense[-1].bias) if i is not None)
    matrices = [i for i, (_, leaf) in enumerate(with_paths) if jnp.ndim(leaf) == 2]
    if not matrices:
        raise ValueError("last_layer: found no dense layer in fn's program and params have no 2-D leaf (a weight "
                         f"matrix); name the layer: last_layer='<path prefix>', paths: {names}")
    path = with_paths[matrices[-1]][0]
    if getattr(path[-1], "name", None) == "value" or getattr(path[-1], "key", None) == "value":
        path = path[:-1]  # a Flax NNX variable's ``.value``: the layer is one level up
    prefix = path[:-1]
    return [i for i, (p, _) in enumerate(with_paths) if p[: len(prefix)] == prefix]


def _submodel(fn, params, chosen):
    """``(fn_L, params_L, flat indices)`` of the chosen leaves, the others closed over."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    sizes = [int(np.size(leaf)) for leaf in leaves]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    idx = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in chosen])

    def fn_L(params_L, x):
        full = list(leaves)
        for i, leaf in zip(chosen, params_L, strict=True):
            full[i] = leaf
        return fn(jax.tree_util.tree_unflatten(treedef, full), x)

    return fn_L, tuple(leaves[i] for i in chosen), jax.device_put(idx)


def laplace(fn: Callable, params, data, likelihood: Likelihood, *, structure: str = "full", prior_precision=1.0,
            batch_size: int | None = None, rank: int | None = None, num_steps: int | None = None,
            key: jax.Array | None = None, last_layer: str | None = None,
            kfac_fallback: str | None = "diag", kfac_approximation: str = "expand", mesh=None,
            progress: bool = True) -> LaplacePosterior:
    r"""The linearised Laplace posterior $\mathcal N(\theta^*, (G + \operatorname{diag}\alpha)^{-1})$.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``; ``params`` the trained $\theta^*$.
        data: the training ``(inputs, targets)``.
        likelihood: a `linops.likelihoods.Likelihood`.
        structure: ``"full"`` (dense GGN, Cholesky; refused before any work when it cannot fit),
            ``"diag"`` (exact GGN diagonal), ``"last_layer"`` (the full GGN of the last dense layer's
            weight and bias, found in ``fn``'s program or named by ``last_layer``; the rest stays at
            $\theta^*$), ``"lowrank"`` (the top ``rank`` GGN eigenpairs by Lanczos, Woodbury,
            never ``P x P``; needs ``key``) or ``"kfac"`` (Kronecker factors per dense and
            convolutional layer, `linops.kfac`).
        prior_precision: $\alpha$: a positive scalar, one per parameter (``(P,)`` or a
            params-shaped pytree of arrays), or one per leaf (a params-shaped pytree of
            scalars). ``"kfac"`` takes one per leaf at most.
        batch_size: examples per batch of the GGN computations (the short last batch counts).
        rank: ``"lowrank"``'s number of eigenpairs.
        num_steps: ``"lowrank"``'s Lanczos steps (default ``min(P, 2 rank + 10)``).
        key: ``"lowrank"``'s PRNG key of the Lanczos start vector.
        last_layer: ``"last_layer"``'s path prefix (e.g. ``"layers.2"``; default: the last dense
            layer in ``fn``'s traced program, `last_layer_leaves`).
        kfac_fallback: what ``"kfac"`` gives parameters in no dense or convolutional layer (norm
            scales, embeddings, position tables): ``"diag"`` (default) their exact GGN diagonal, named
            in ``post.ggn.diagonal_leaves``; ``"error"`` (or None) refuses them.
        kfac_approximation: ``"expand"`` (default) or ``"reduce"``: ``"kfac"``'s factors of a weight
            shared over positions (tokens, pixels); see `linops.kfac`.
        mesh: a `jax.sharding.Mesh` with a ``"data"`` axis: the GGN computations split the examples
            over its devices (`linops.GGNOp`'s and `linops.kfac`'s ``mesh``); the result equals the
            single-device one.
        progress: a progress bar on stderr over the data's batches while the GGN is formed (the
            ``"full"``, ``"diag"``, ``"last_layer"`` and ``"kfac"`` fits, on one device) or over the
            Lanczos steps (``"lowrank"``), shown once the fit runs longer than two seconds; False
            silences it.

    Returns:
        A `LaplacePosterior`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> fn = lambda w, x: (x @ w)[None]                      # Bayesian linear regression
        >>> X = jnp.array([[1.0, 0.0], [0.0, 2.0]]); Y = jnp.zeros((2, 1))
        >>> post = pst.laplace(fn, jnp.zeros(2), (X, Y), Gaussian(1.0), structure="diag", prior_precision=1.0)
        >>> post.covariance.as_matrix()                          # (X^T X + I)^-1
        Array([[0.5, 0. ],
               [0. , 0.2]], dtype=float32)
    """
    who = "laplace"
    if structure not in STRUCTURES:
        raise ValueError(f"{who}: unknown structure {structure!r}; expected one of {STRUCTURES}")
    check_likelihood(likelihood, who)
    check_data(data, who)
    if kfac_fallback not in (None, "diag", "error"):
        raise ValueError(f"{who}: kfac_fallback must be 'diag' or 'error', got {kfac_fallback!r}")
    if kfac_approximation not in ("expand", "reduce"):
        raise ValueError(f"{who}: kfac_approximation must be 'expand' or 'reduce', got {kfac_approximation!r}")
    check_params(params, who)
    X, Y = data
    subset = chosen = None
    fit_fn, fit_params = fn, params
    if structure == "last_layer":
        chosen = tuple(last_layer_leaves(params, last_layer, fn=fn, x=example_spec(X)))
        fit_fn, fit_params, subset = _submodel(fn, params, chosen)
    lo.GGNOp(fit_fn, fit_params, X, Y, likelihood, batch_size=batch_size, mesh=mesh)  # checks the data, eagerly
    alpha = _canonical_prior(prior_precision, params, subset, structure, who)
    cls = S.REGISTRY["full" if structure == "last_layer" else structure]
    label = f"{who}(structure={structure!r})" if progress else None
    options = _FitOptions(batch_size, mesh, rank, num_steps, kfac_fallback, who, kfac_approximation, label)
    fit = _fit_compiled if cls.compile_fit else _fit
    ggn, terms = fit(cls, fn, params, X, Y, likelihood, chosen, key, options, alpha)
    return make_posterior(fn, params, X, Y, likelihood, structure, ggn, alpha, subset, chosen, terms)


class _FitOptions(NamedTuple):
    """The static options of a fit (hashable: part of the compiled program's key)."""

    batch_size: int | None
    mesh: Any
    rank: int | None
    num_steps: int | None
    kfac_fallback: str | None
    who: str
    kfac_approximation: str
    progress: str | None = None


def _fit_structure(cls, fn, params, X, Y, likelihood, chosen, key, o):
    """``cls.fit`` on the GGN of ``fn`` (of the leaves ``chosen`` alone when given, the rest closed over)."""
    fit_fn, fit_params = fn, params
    if chosen is not None:
        fit_fn, fit_params, _ = _submodel(fn, params, chosen)
    # a pass over the data's batches, or (low rank) the Lanczos steps, each of them a GGN product
    lowrank = cls is S.REGISTRY["lowrank"]
    G = lo.GGNOp(fit_fn, fit_params, X, Y, likelihood, batch_size=o.batch_size, mesh=o.mesh,
                 progress=None if lowrank else o.progress)
    return cls.fit_and_sum(S.FitRequest(G, fit_fn, fit_params, (X, Y), likelihood, o.batch_size, o.mesh, o.rank,
                                        o.num_steps, key, o.kfac_fallback, o.who, o.kfac_approximation, o.progress),
                           _example_terms(likelihood))


def _fit(cls, fn, params, X, Y, likelihood, chosen, key, o, alpha):
    """The whole fit: the structure's GGN, then `_posterior_terms` at the prior ``alpha`` (the data terms from
    the GGN's own pass over the data where the structure sums them there: the last layer, an MLP's full GGN)."""
    ggn, data_terms = _fit_structure(cls, fn, params, X, Y, likelihood, chosen, key, o)
    return ggn, _posterior_terms(fn, params, X, Y, likelihood, ggn, alpha, data_terms)


# `_fit` as one program, compiled once per structure, model function, shapes and options (the arrays are its
# arguments): every batch, the curvature, the evidence's data terms and the factorisation; a second fit of the
# same kind, on new weights or data, compiles nothing. `program`: with XLA's CPU loop emitters (less compile time).
_fit_compiled = program(_fit)


def _posterior_terms(fn, params, X, Y, likelihood, ggn, alpha, data_terms=None):
    """``(loss, residual sums of squares, factorisation at alpha and noise scale 1, whether it is finite)``;
    ``data_terms``: the first two when already summed (`_example_terms`), else a forward pass computes them."""
    loss, rss = _data_terms(fn, params, X, Y, likelihood) if data_terms is None else data_terms
    factor, finite = _factor_and_check(ggn, alpha, jnp.ones((), jnp.result_type(alpha)))
    return loss, rss, factor, finite


_posterior_terms_compiled = program(_posterior_terms)


def _example_terms(likelihood):
    """``(f_n, y_n, lik_n) -> (loss, squared residuals or None)`` of one example: summed over the data, what
    `_data_terms` computes (``lik_n`` the example's own likelihood when it is per example, else None)."""
    gaussian = isinstance(likelihood, Gaussian)

    def terms(f_n, y_n, lik_n):
        return (likelihood if lik_n is None else lik_n).nll(f_n, y_n), ((y_n - f_n) ** 2 if gaussian else None)

    return terms


def _data_terms(fn, params, X, Y, likelihood):
    """The evidence's data terms: the summed loss, and (Gaussian likelihood) the residual sums of squares."""
    out = jax.vmap(fn, in_axes=(None, 0))(params, X)
    lik_axis = 0 if likelihood.per_example else None
    loss = jnp.sum(jax.vmap(lambda lk, f, y: lk.nll(f, y), in_axes=(lik_axis, 0, 0))(likelihood, out, Y))
    return loss, (jnp.sum((Y - out) ** 2, axis=0) if isinstance(likelihood, Gaussian) else None)


def make_posterior(fn, params, X, Y, likelihood, structure, ggn, alpha, subset, subset_leaves,
                   terms=None) -> LaplacePosterior:
    """A `LaplacePosterior` from a fitted GGN and its `_posterior_terms` (computed here, as one program for the
    built-in structures, when not given)."""
    if terms is None:
        terms = (_posterior_terms_compiled if ggn.compile_fit else _posterior_terms)(fn, params, X, Y, likelihood,
                                                                                    ggn, alpha)
    loss, rss, factor, finite = terms
    scale = np.ones((), jnp.result_type(alpha))
    _check_factor(finite, alpha, scale, jnp.result_type(alpha),
                  "subnetwork_laplace" if structure == "subnetwork" else f"laplace(structure={structure!r})")
    return LaplacePosterior(fn=fn, params=params, unravel=unravel_of(params), structure=structure,
                            likelihood=likelihood, ggn=ggn, prior_precision=alpha, noise_scale=jax.device_put(scale),
                            subset=subset, subset_leaves=subset_leaves, loss=loss, residual_ss=rss,
                            num_examples=int(jax.tree_util.tree_leaves(X)[0].shape[0]), factor=factor)


__all__ = ["LaplacePosterior", "STRUCTURES", "laplace", "last_layer_leaves"]
