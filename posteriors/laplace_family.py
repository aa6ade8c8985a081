r"""The linearised Laplace family: full, diagonal, low-rank, KFAC and functional (GP) posteriors, over every weight
or a selection (the last layer, a subnetwork).

$q(\theta) = \mathcal N(\theta^*, \Sigma)$ with $\Sigma = (G + \operatorname{diag}\alpha)^{-1}$,
$G$ the generalised Gauss-Newton matrix (or another curvature, `CURVATURES`) of the data at the trained
$\theta^*$ in one of the structures (`STRUCTURES`). The GGN is computed once; the prior precision $\alpha$ and, for a
Gaussian likelihood, the noise $\sigma$ can change afterwards at the cost of a
refactorisation (`LaplacePosterior.with_prior`), which is what evidence maximisation does
(`posteriors.marginal_log_likelihood`, `posteriors.optimize_prior_precision`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
from linops.likelihoods import EmpiricalFisher, Gaussian, Likelihood, MonteCarloFisher
from linops.memory import check_fits, format_bytes
from linops.models import example_spec, num_shards, unravel_of
from linops.runtime import program
from posteriors import _structures as S
from posteriors import weights as W
from posteriors._checks import check_data, check_likelihood, check_params, check_targets, with_position_axis
from posteriors._prior import canonical_prior, check_sigma, noise_scale
from posteriors._training import positive_int
from posteriors.gaussian import GaussianPosterior

STRUCTURES = tuple(S.REGISTRY)
"""The curvature structures `laplace` accepts as ``structure=`` (`posteriors._structures.REGISTRY`)."""

CURVATURES = ("ggn", "ef", "fisher", "hessian")
"""The curvatures `laplace` accepts as ``curvature=``: the generalised Gauss-Newton matrix (default), the
empirical Fisher, a Monte-Carlo Fisher and the Hessian of the data term (see `laplace`)."""


class LaplacePosterior(GaussianPosterior):
    r"""$\mathcal N(\theta^*, E_s (G_s/s + \operatorname{diag}\alpha)^{-1} E_s^\top)$: a curvature structure over a
    selection of weights (`posteriors.weights`; every weight by default, $E_s = I$).

    Attributes:
        likelihood: the likelihood the GGN was computed with (`linops.likelihoods.PerPosition` of the one given, for
            a model with a position axis, whose ``fn`` is then the `linops.likelihoods.Flattened` model).
        ggn: the GGN of the covered weights in its structure (a `posteriors._structures.StructuredGGN`:
            `FullGGN`, `DiagGGN`, `LowRankGGN`, `KFACGGN`); ``post.structure`` is its name.
        weights: the covered weights (`posteriors.weights.Weights`: all, a last layer, leaves, a subnetwork's
            indices); the others stay at $\theta^*$.
        prior_precision: $\alpha$, a scalar or one per covered parameter.
        noise_scale: $s = \sigma^2/\sigma_0^2$ when the Gaussian noise was re-tuned after the fit (else 1).
        loss: $\sum_n \ell(f(\theta^*, x_n), y_n)$ under ``likelihood`` (the evidence's data term).
        residual_ss: for a Gaussian likelihood, $\sum_n (y_n - f(\theta^*, x_n))^2$ per output
            (to re-tune the noise); None otherwise.
        num_examples: $N$.
        curvature: what $G$ is (`CURVATURES`): ``"ggn"``, ``"ef"`` (empirical Fisher), ``"fisher"``
            (Monte-Carlo Fisher) or ``"hessian"``; ``ggn`` holds it whichever it is.
    """

    likelihood: Likelihood
    ggn: S.StructuredGGN
    weights: W.Weights
    prior_precision: jax.Array
    noise_scale: jax.Array
    loss: jax.Array
    residual_ss: jax.Array | None
    num_examples: int = eqx.field(static=True)
    factor: object
    curvature: str = eqx.field(static=True, default="ggn")

    @property
    def structure(self) -> str:
        """The curvature structure's name (``"full"``, ``"diag"``, ``"lowrank"``, ``"kfac"``, ...)."""
        return self.ggn.name

    @property
    def num_params(self) -> int:
        """$P$, all the model's parameters."""
        return self.mean.shape[0]

    def own_space(self):
        """``(fn, params, covariance)`` in the space the posterior lives in: the covered weights alone (the rest
        closed over; `posteriors.weights.Weights.restrict`), the whole model when it covers every weight."""
        fn_s, params_s = self.weights.restrict(self.fn, self.params)
        return fn_s, params_s, self.ggn.covariance(self.prior_precision, self.noise_scale, self.factor)

    @property
    def covariance(self) -> lo.LinearOperator:
        r"""$\Sigma$ as a lazy ``P x P`` operator (embedded from the covered weights)."""
        return self.weights.embed(self.ggn.covariance(self.prior_precision, self.noise_scale, self.factor),
                                  self.num_params, self.mean.dtype)

    @property
    def precision(self) -> lo.LinearOperator | None:
        r"""$G/s + \operatorname{diag}\alpha$; None for a subset of the weights (the frozen ones have none)."""
        if self.weights.indices is not None:
            return None
        return self.ggn.precision(self.prior_precision, self.noise_scale)

    def sample(self, key: jax.Array, n: int) -> jax.Array:
        """``n`` flat parameter samples, shape ``(n, P)``."""
        n = positive_int(n, "n", f"{type(self).__name__}.sample")
        deltas = self.ggn.sample(key, n, self.prior_precision, self.noise_scale, self.factor)
        return self.mean[None, :] + self.weights.scatter(deltas, self.num_params).T

    def with_prior(self, prior_precision=None, sigma=None) -> LaplacePosterior:
        r"""The same fit with another prior precision and/or Gaussian noise $\sigma$ (refactorised)."""
        alpha = self.prior_precision if prior_precision is None else canonical_prior(
            prior_precision, self.params, self.weights, type(self.ggn), who="with_prior")
        if sigma is not None:
            sigma = check_sigma(self, sigma, "with_prior")
        reprior = _reprior_compiled if self.ggn.compile_fit else _reprior
        new, finite = reprior(self, alpha, sigma)
        _check_factor(finite, alpha, new.noise_scale, jnp.result_type(alpha), "with_prior", self.curvature)
        return new


def _reprior(post, alpha, sigma):
    """``post`` at the prior ``alpha`` and (unless None) the noise ``sigma``, and whether its factor is finite."""
    scale, lik, loss = post.noise_scale, post.likelihood, post.loss
    if sigma is not None:
        (scale, loss), lik = noise_scale(post, sigma), Gaussian(sigma)
    factor, finite = _factor_and_check(post.ggn, alpha, scale)
    return eqx.tree_at(lambda p: (p.prior_precision, p.noise_scale, p.likelihood, p.loss, p.factor), post,
                       (alpha, scale, lik, loss, factor), is_leaf=lambda x: x is None), finite


_reprior_compiled = program(_reprior)


_FINITE_CONCAT = 2**20  # leaves up to this many entries are checked together, in one reduction


def _all_finite(tree) -> jax.Array:
    """Whether every inexact array of ``tree`` is finite, as one boolean computed where the tree is.

    ``sum(a * 0)`` is 0 when every entry of ``a`` is finite and NaN otherwise (``0 * inf`` is NaN; XLA keeps IEEE
    semantics), so one reduction over the small leaves concatenated checks them all: XLA compiles one loop where a
    reduction per leaf took one each (a KFAC posterior of LeNet-5 has 21 leaves: 0.56 s of compile time against
    0.02 s, 2 CPU cores). Large leaves (a dense GGN) get their own reduction, never copied."""
    leaves = [a for a in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(jnp.result_type(a), jnp.inexact)]
    small = [jnp.ravel(a) for a in leaves if a.size <= _FINITE_CONCAT]
    sums = [jnp.sum(a * 0) for a in leaves if a.size > _FINITE_CONCAT]
    if small:
        sums.append(jnp.sum(jnp.concatenate(small) * 0))
    return jnp.isfinite(functools.reduce(jnp.add, sums)) if sums else jnp.asarray(True)


def _factor_and_check(ggn, alpha, scale):
    factor = ggn.factorize(alpha, scale)
    return factor, _all_finite(factor) & ggn.definite(alpha, scale)


def _check_fitted(fitted, loss, who) -> None:
    """Refuse a fit whose curvature or loss is not finite (``fitted``: computed with them): the model's outputs or
    their derivatives overflow at these parameters and data, and every later quantity would be NaN or Inf."""
    if isinstance(fitted, jax.core.Tracer) or bool(fitted):
        return
    where = "the loss on the data is not finite" if not np.isfinite(np.asarray(loss)) else \
        "the loss is finite, but the fitted curvature is not"
    raise ValueError(f"{who}: {where}: the model's outputs or their derivatives overflow (or are NaN) at these "
                     "parameters and data, so the posterior would be NaN. Check the model's outputs on the data (an "
                     "exp or a large logit overflows first in float32), or use float64 parameters")


def _check_factor(finite, alpha, scale, dtype, who, curvature="ggn") -> None:
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
    if curvature == "hessian":
        raise ValueError(
            f"{who}: the posterior precision (Hessian / {float(scale):.3g} + prior precision {prior}) is not "
            "positive definite: the Hessian of the data term is indefinite (negative curvature) beyond what this "
            "prior precision covers. Use a prior precision above its most negative eigenvalue's magnitude, or "
            "curvature='ggn' (PSD by construction)")
    raise ValueError(
        f"{who}: the posterior precision (GGN / {float(scale):.3g} + prior precision {prior}) is not "
        f"numerically positive definite in {dtype}: its Cholesky factor is not finite. Use a "
        "larger prior precision (at least about eps x the GGN's largest eigenvalue), or float64 parameters")


def laplace(fn: Callable, params, data, likelihood: Likelihood, *, structure: str = "full",
            subset_of_weights="all", prior_precision=1.0, batch_size: int | None = None, rank: int | None = None,
            num_steps: int | None = None, key: jax.Array | None = None, last_layer: str | None = None,
            kfac_fallback: str | None = "diag", kfac_approximation: str = "expand", mesh=None,
            progress: bool = True, curvature: str = "ggn", num_samples: int = 1,
            num_points: int | None = None, sketch_size: int | None = None) -> LaplacePosterior:
    r"""The linearised Laplace posterior $\mathcal N(\theta^*, (G + \operatorname{diag}\alpha)^{-1})$ over the
    chosen weights, in the chosen curvature structure: two independent axes, as in laplace-torch, and a third,
    which curvature $G$ is (the GGN by default).

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``; ``params`` the trained $\theta^*$. A model with a
            position axis, ``(T, V)`` (a sequence model's next-token logits), is read flattened with the
            likelihood summed over positions (`linops.likelihoods.PerPosition`; the posterior's ``fn`` is the
            `linops.likelihoods.Flattened` model), its targets ``(N, T)`` labels (``(N, T, V)`` reals for a
            Gaussian), and the predictives return ``(M, T, V)``. Its exact GGN takes ``T V`` reverse passes per
            example (``"full"``, ``"diag"``, ``"kfac"``: a warning says so past 1,024 rows); ``curvature="fisher"``
            takes ``num_samples``.
        data: the training ``(inputs, targets)``.
        likelihood: a `linops.likelihoods.Likelihood`.
        structure: the GGN's structure (`STRUCTURES`): ``"full"`` (dense GGN, Cholesky; refused before
            any work when it cannot fit), ``"diag"`` (exact GGN diagonal), ``"lowrank"`` (the top
            ``rank`` GGN eigenpairs by Lanczos, Woodbury, never ``P x P``; needs ``key``), ``"kfac"``
            (Kronecker factors per dense and convolutional layer, `linops.kfac`), ``"functional"`` (the
            GP view: the exact GGN of ``num_points`` training points, low rank, `FunctionalGGN`) or
            ``"sketched"`` (the top ``rank`` eigenpairs by sketched Lanczos, kept as sketches: memory ``O(P)``,
            no ``P x num_steps`` basis; variances, evidence and tuning, no samples; `SketchedLowRankGGN`).
        subset_of_weights: which weights have a posterior; the others stay at $\theta^*$
            (`posteriors.weights`): ``"all"`` (default), ``"last_layer"`` (the last dense layer's weight
            and bias, found in ``fn``'s program or named by ``last_layer``), a selection of leaves
            (`posteriors.weights.leaves`: an adapter's matrices), or a `posteriors.Subnetwork` (flat
            indices; `posteriors.subnetwork_laplace` is the paper's recipe around it).
        prior_precision: $\alpha$: a positive scalar, one per parameter (``(P,)`` or a
            params-shaped pytree of arrays), or one per leaf (a params-shaped pytree of
            scalars); only the covered weights' entries are kept. ``"kfac"`` takes one per leaf at most.
        batch_size: examples per batch of the GGN computations (the short last batch counts).
        rank: ``"lowrank"``'s and ``"sketched"``'s number of eigenpairs.
        num_steps: ``"lowrank"``'s Lanczos steps (default ``min(P, 2 rank + 10)``); ``"sketched"``'s (default
            ``min(P, 5 rank + 50)``: without reorthogonalisation, copies of converged eigenvalues take steps).
        key: ``"lowrank"``'s PRNG key of the Lanczos start vector (and ``"sketched"``'s sketch).
        last_layer: ``subset_of_weights="last_layer"``'s path prefix (e.g. ``"layers.2"``; default: the last
            dense layer in ``fn``'s traced program, `last_layer_leaves`).
        kfac_fallback: what ``"kfac"`` gives parameters in no dense or convolutional layer (norm
            scales, embeddings, position tables): ``"diag"`` (default) their exact GGN diagonal, named
            in ``post.ggn.diagonal_leaves``; ``"error"`` (or None) refuses them.
        kfac_approximation: ``"expand"`` (default) or ``"reduce"``: ``"kfac"``'s factors of a weight
            shared over positions (tokens, pixels); see `linops.kfac`.
        mesh: a `jax.sharding.Mesh` with a ``"data"`` axis: the GGN computations split the examples
            over its devices (`linops.GGNOp`'s and `linops.kfac`'s ``mesh``); the result equals the
            single-device one.
        progress: a progress bar on stderr over the data's batches while the GGN is formed (the
            ``"full"``, ``"diag"`` and ``"kfac"`` fits, on one device) or over the Lanczos steps
            (``"lowrank"``), shown once the fit runs longer than two seconds; False silences it.
        curvature: what $G$ is (`CURVATURES`), in every structure unless said: ``"ggn"`` (default)
            $\sum_n J_n^\top H_n J_n$; ``"ef"`` the empirical Fisher $\sum_n \nabla\ell_n \nabla\ell_n^\top$
            (gradients at the observed targets; `linops.likelihoods.EmpiricalFisher`); ``"fisher"`` a
            Monte-Carlo Fisher, the same with ``num_samples`` targets per example drawn from the model (needs
            ``key``; `linops.likelihoods.MonteCarloFisher`); ``"hessian"`` the exact Hessian of the data term by
            Hessian-vector products (`linops.HessianOp`; ``"full"``, ``"diag"`` by ``P`` products with the unit
            vectors, or ``"lowrank"``; not ``"kfac"``). A Hessian can be indefinite: a posterior whose precision
            is not positive definite is refused, and negative eigenvalues a low-rank fit keeps are clipped to 0
            with a warning. The empirical Fisher scales with a re-tuned Gaussian noise as $\sigma^{-4}$, the
            others as $\sigma^{-2}$ (``with_prior(sigma=...)`` knows).
        num_samples: ``"fisher"``'s draws per example.
        num_points: ``"functional"``'s $M$: the GGN of $M$ training points drawn without replacement with ``key``
            (None: all of them, where the posterior is the full GGN's, held as its SVD); the prior stays $\alpha$
            (laplace-torch's subset-of-data GP scales its kernel prior variance by $M/N$ instead).
        sketch_size: ``"sketched"``'s rows of the sketch $s$ (default ``min(P, max(4096, 50 rank))``): each
            variance is read to a relative error of about $\sqrt{2/s}$ (a sketched norm; 2% at the default),
            exactly at ``s = P`` (`linops.sketch`).

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
        >>> sub = pst.subnetwork.from_indices(jnp.zeros(2), [1])  # w[1] alone: (2^2 + 1)^-1; w[0] stays fixed
        >>> last = pst.laplace(fn, jnp.zeros(2), (X, Y), Gaussian(1.0), subset_of_weights=sub)
        >>> (5 * last.covariance.as_matrix()).round(4)
        Array([[0., 0.],
               [0., 1.]], dtype=float32)
    """
    label = None
    if progress:
        label = f"laplace(structure={structure!r}" + ("" if subset_of_weights == "all" else
                                                      f", subset_of_weights={_describe(subset_of_weights)}") + ")"
    return _laplace(fn, params, data, likelihood, structure=structure, subset_of_weights=subset_of_weights,
                    prior_precision=prior_precision, batch_size=batch_size, rank=rank, num_steps=num_steps, key=key,
                    last_layer=last_layer, kfac_fallback=kfac_fallback, kfac_approximation=kfac_approximation,
                    mesh=mesh, label=label, who="laplace", curvature=curvature, num_samples=num_samples,
                    num_points=num_points, sketch_size=sketch_size)


def _describe(spec) -> str:
    """``subset_of_weights=`` as a label shows it."""
    return repr(spec) if isinstance(spec, str) else spec.describe() if isinstance(spec, W.Weights) else type(
        spec).__name__


def _laplace(fn, params, data, likelihood, *, structure, subset_of_weights, prior_precision, batch_size, rank,
             num_steps, key, last_layer, kfac_fallback, kfac_approximation, mesh, label, who, curvature="ggn",
             num_samples=1, num_points=None, sketch_size=None):
    """`laplace` for a caller named ``who`` in errors, with the progress bar's ``label`` (None: no bar)."""
    if structure not in S.REGISTRY:
        hint = " (the last layer is subset_of_weights='last_layer' now)" if structure == "last_layer" else ""
        raise ValueError(f"{who}: unknown structure {structure!r}; expected one of {tuple(S.REGISTRY)}{hint}")
    if curvature not in CURVATURES:
        raise ValueError(f"{who}: unknown curvature {curvature!r}; expected one of {CURVATURES}")
    if curvature == "hessian" and structure == "kfac":
        raise ValueError(f"{who}: structure='kfac' has no Hessian: its Kronecker factors are those of the GGN or a "
                         "Fisher (curvature='ggn', 'ef' or 'fisher'); the Hessian takes structure='full', 'diag' or "
                         "'lowrank'")
    if curvature == "fisher" and key is None:
        raise ValueError(f"{who}(curvature='fisher'): the Monte-Carlo Fisher draws targets from the model: pass "
                         "key=jax.random.key(...)")
    num_samples = positive_int(num_samples, "num_samples", who)
    check_likelihood(likelihood, who)
    check_data(data, who)
    if kfac_fallback not in (None, "diag", "error"):
        raise ValueError(f"{who}: kfac_fallback must be 'diag' or 'error', got {kfac_fallback!r}")
    if kfac_approximation not in ("expand", "reduce"):
        raise ValueError(f"{who}: kfac_approximation must be 'expand' or 'reduce', got {kfac_approximation!r}")
    check_params(params, who)
    fn, likelihood = with_position_axis(fn, params, data[0], likelihood, who)  # (T, V) outputs: read flattened
    check_targets(fn, params, data, likelihood, who)  # in laplace's name (shapes only: nothing compiles)
    X, Y = data
    weights = W.select(subset_of_weights, params, fn=fn, x=example_spec(X), last_layer_name=last_layer, who=who)
    fit_params = weights.restrict(fn, params)[1]  # the selected weights (their count plans the fit)
    # checks the data, eagerly (on the whole model: the same outputs, and its shapes are traced once, not per call)
    lo.GGNOp(fn, params, X, Y, likelihood, batch_size=batch_size, mesh=mesh)
    cls = S.REGISTRY[structure]
    alpha = canonical_prior(prior_precision, params, weights, cls, who=who)
    _plan_devices(params, fit_params, structure, rank, num_steps, num_points, X, who)
    if curvature == "ggn" and structure in ("full", "diag", "kfac"):
        _plan_factor_rows(fn, params, fit_params, X, likelihood, who)
    if curvature == "fisher" and type(likelihood).sample is Likelihood.sample:
        raise ValueError(f"{who}(curvature='fisher'): a {type(likelihood).__name__} likelihood cannot draw targets "
                         "(it has no sample(key, f, n))")
    if num_points is not None:
        if structure != "functional":
            raise ValueError(f"{who}: num_points is structure='functional''s, got structure={structure!r}")
        num_points = positive_int(num_points, "num_points", who)
    if sketch_size is not None:
        if structure != "sketched":
            raise ValueError(f"{who}: sketch_size is structure='sketched''s, got structure={structure!r}")
        sketch_size = positive_int(sketch_size, "sketch_size", who)
    options = _FitOptions(batch_size, mesh, rank, num_steps, kfac_fallback, who, kfac_approximation, label,
                          curvature, num_samples, num_points, sketch_size)
    fit = _fit_compiled if cls.compile_fit else _fit
    ggn, terms = fit(cls, fn, params, X, Y, likelihood, weights.fit_form(), key, options, alpha)
    if curvature == "hessian" and structure == "lowrank":
        _warn_negative(ggn.lam, who)
    if structure == "sketched":
        _warn_fewer(ggn.top.rank, rank, who)
    name = f"{who}(structure={structure!r})" if who == "laplace" else who
    return make_posterior(fn, params, X, Y, likelihood, ggn, alpha, weights, terms, who=name, curvature=curvature)


def _plan_devices(params, fit_params, structure, rank, num_steps, num_points, X, who):
    """The fit's memory per device, refused before any work when it cannot fit: the parameters and the structure's
    state (a lower bound: temporaries come on top), each divided over the devices the parameters are sharded over
    (`linops.models.shard`), against one device's free memory. Unsharded, the refusal says how many devices a
    sharded fit would need. ``"full"`` plans itself: its dense GGN is held whole on each device."""
    if structure == "full":
        return
    P, S = unravel_of(params).size, unravel_of(fit_params).size
    itemsize = np.dtype(unravel_of(params).dtype).itemsize
    steps = num_steps or (2 * rank + 10 if rank else 0)
    n = jax.tree_util.tree_leaves(X)[0].shape[0]
    state = {"diag": 2 * S, "kfac": 2 * S, "lowrank": (steps + 2) * S, "sketched": 4 * S,
             "functional": (num_points or n) * S}.get(structure, 2 * S)
    need = (P + state) * itemsize
    devices = num_shards(params)
    free = lo.memory.available_bytes(_first_device(params))
    if free is None or need <= devices * free:
        return
    what = (f"{who}(structure={structure!r}) over {S:,} of {P:,} parameters (the parameters and the structure's "
            f"state, at least {format_bytes(need)})")
    if devices == 1:
        shards = -(-need // free)
        check_fits(need, what, f"shard the parameters over a mesh of at least {shards} devices "
                               f"(linops.models.shard(params, mesh)), or choose a smaller structure", limit=free)
    check_fits(need // devices, f"{what}, sharded over {devices} devices: each device's share",
               f"even this mesh is too small: use at least {-(-need // free)} devices, or a smaller structure",
               limit=free)


def _first_device(params):
    leaf = jax.tree_util.tree_leaves(params)[0]
    devices = getattr(getattr(leaf, "sharding", None), "device_set", None)
    return min(devices, key=lambda d: d.id) if devices else None


MANY_ROWS = 1024
"""Factor rows per example above which an exact GGN fit warns (one reverse pass per row)."""


def _plan_factor_rows(fn, params, fit_params, X, likelihood, who):
    """The exact GGN's cost per example, one reverse pass per row of the likelihood's Hessian factor: refused before
    any work when one example's factor and its rows' gradients cannot fit, and said when there are more than
    `MANY_ROWS` rows per example (a vocabulary at every position: ``T x V``), with the unbiased alternative."""
    num_outputs = jax.eval_shape(fn, params, example_spec(X)).shape[0]  # the restricted model's too
    rows = likelihood.factor_rows(num_outputs)
    if rows <= MANY_ROWS:
        return
    P = unravel_of(fit_params).size
    n = jax.tree_util.tree_leaves(X)[0].shape[0]
    itemsize = np.dtype(unravel_of(fit_params).dtype).itemsize
    remedy = ("use curvature='fisher' (num_samples reverse passes per example whatever the outputs, unbiased for the "
              "GGN), or fewer outputs per example")
    check_fits((rows * num_outputs + rows * P) * itemsize,
               f"{who}: the exact GGN of one example ({rows:,} rows of its Hessian factor over {num_outputs:,} "
               f"outputs, one reverse pass each through {P:,} parameters)", remedy)
    warnings.warn(f"{who}: the exact GGN takes {rows:,} reverse passes per example ({rows * n:,} in all) for "
                  f"{num_outputs:,} outputs per example; {remedy}", stacklevel=4)


def _warn_negative(lam, who):
    """Say so when Lanczos kept negative Hessian eigenvalues (largest in magnitude), which the precision clips."""
    lam = np.asarray(lam)
    if np.any(lam < 0):
        warnings.warn(f"{who}(curvature='hessian', structure='lowrank'): {int(np.sum(lam < 0))} of the {lam.size} "
                      f"eigenpairs kept are negative (down to {float(lam.min()):.3g}): the Hessian is indefinite "
                      "there, and those eigenvalues are clipped to 0 (the posterior keeps the prior's variance along "
                      "them). curvature='ggn' is PSD by construction", stacklevel=3)


def _warn_fewer(found, rank, who):
    """Say so when sketched Lanczos found fewer converged, distinct eigenpairs than asked for."""
    if int(found) < rank:
        warnings.warn(f"{who}(structure='sketched'): {int(found)} of the {rank} eigenpairs asked for converged as "
                      "distinct pairs (the rest are kept at the prior's variance); pass more num_steps (without "
                      "reorthogonalisation, copies of converged eigenvalues take steps)", stacklevel=3)


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
    curvature: str = "ggn"
    num_samples: int = 1
    num_points: int | None = None
    sketch_size: int | None = None


def _curvature_data(Y, likelihood, key, o):
    """``(targets, likelihood)`` whose GGN is the chosen curvature (the Hessian's: the data's own)."""
    if o.curvature == "ef":
        return Y, EmpiricalFisher(likelihood)
    if o.curvature == "fisher":  # its own key: a low-rank fit's Lanczos start vector uses ``key`` itself
        mc = MonteCarloFisher(likelihood, o.num_samples)
        return mc.with_keys(Y, jax.random.fold_in(key, 1)), mc
    return Y, likelihood


def _fit_structure(cls, fn, params, X, Y, likelihood, weights, key, o):
    """``cls.fit`` on the GGN of ``fn`` restricted to ``weights`` (the rest closed over)."""
    fit_fn, fit_params = weights.restrict(fn, params)
    Yc, lik_c = _curvature_data(Y, likelihood, key, o)
    # a pass over the data's batches, or (low rank) the Lanczos steps, each of them a GGN product
    if o.curvature == "hessian":
        G = lo.HessianOp(fit_fn, fit_params, X, Y, likelihood, batch_size=o.batch_size, mesh=o.mesh)
    else:
        G = lo.GGNOp(fit_fn, fit_params, X, Yc, lik_c, batch_size=o.batch_size, mesh=o.mesh,
                     progress=o.progress if cls.batch_progress else None)
    request = S.FitRequest(G, fit_fn, fit_params, (X, Yc), lik_c, o.batch_size, o.mesh, o.rank, o.num_steps, key,
                           o.kfac_fallback, o.who, o.kfac_approximation, o.progress, o.curvature, o.num_points,
                           o.sketch_size)
    # the evidence's data terms from the fit's own pass: only where its targets and likelihood are the data's
    return cls.fit_and_sum(request, _example_terms(likelihood) if o.curvature in ("ggn", "ef") else None)


def _fit(cls, fn, params, X, Y, likelihood, weights, key, o, alpha):
    """The whole fit: the structure's GGN, then `_posterior_terms` at the prior ``alpha`` (the data terms from
    the GGN's own pass over the data where the structure sums them there: the last layer, an MLP's full GGN)."""
    ggn, data_terms = _fit_structure(cls, fn, params, X, Y, likelihood, weights, key, o)
    return ggn, _posterior_terms(fn, params, X, Y, likelihood, ggn, alpha, data_terms)


# `_fit` as one program, compiled once per structure, model function, shapes and options (the arrays are its
# arguments): every batch, the curvature, the evidence's data terms and the factorisation; a second fit of the
# same kind, on new weights or data, compiles nothing. `program`: with XLA's CPU loop emitters (less compile time).
_fit_compiled = program(_fit)


def _posterior_terms(fn, params, X, Y, likelihood, ggn, alpha, data_terms=None):
    """``(loss, residual sums of squares, factorisation at alpha and noise scale 1, whether it is finite, whether
    the fitted curvature and the loss are)``; ``data_terms``: the first two when already summed
    (`_example_terms`), else a forward pass computes them."""
    loss, rss = _data_terms(fn, params, X, Y, likelihood) if data_terms is None else data_terms
    factor, finite = _factor_and_check(ggn, alpha, jnp.ones((), jnp.result_type(alpha)))
    return loss, rss, factor, finite, _all_finite(ggn) & jnp.isfinite(loss)


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


def make_posterior(fn, params, X, Y, likelihood, ggn, alpha, weights=None, terms=None, *,
                   who: str | None = None, curvature: str = "ggn") -> LaplacePosterior:
    """A `LaplacePosterior` from a fitted GGN over ``weights`` (default every weight) and its `_posterior_terms`
    (computed here, as one program for the built-in structures, when not given)."""
    weights = W.AllWeights() if weights is None else weights
    if terms is None:
        terms = (_posterior_terms_compiled if ggn.compile_fit else _posterior_terms)(fn, params, X, Y, likelihood,
                                                                                    ggn, alpha)
    loss, rss, factor, finite, fitted = terms
    scale = np.ones((), jnp.result_type(alpha))
    _check_fitted(fitted, loss, who or f"laplace(structure={ggn.name!r})")
    _check_factor(finite, alpha, scale, jnp.result_type(alpha), who or f"laplace(structure={ggn.name!r})", curvature)
    return LaplacePosterior(fn=fn, params=params, unravel=unravel_of(params), likelihood=likelihood, ggn=ggn,
                            weights=weights, prior_precision=alpha, noise_scale=jax.device_put(scale), loss=loss,
                            residual_ss=rss, num_examples=int(jax.tree_util.tree_leaves(X)[0].shape[0]),
                            factor=factor, curvature=curvature)


__all__ = ["CURVATURES", "LaplacePosterior", "STRUCTURES", "laplace"]
