r"""The GGN in each Laplace structure, kept so that the prior precision and the noise can change.

Every structure stores the GGN $G$ (computed once) and gives, for a prior precision $\alpha$
(a scalar or one per parameter) and a GGN scale $s$ (the ratio $\sigma^2/\sigma_0^2$ of a new
Gaussian noise variance to the one $G$ was computed with; 1 otherwise), the posterior
precision $\Lambda = G/s + \operatorname{diag}(\alpha)$: its operator, the covariance
$\Lambda^{-1}$ as an operator, $\log\det\Lambda$ and samples of $\mathcal N(0, \Lambda^{-1})$.
"""

from __future__ import annotations

import abc
import functools
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
from linops.memory import check_fits
from linops.runtime import flat_draw
from posteriors._layer_predictive import diag_moments, kfac_moments
from posteriors.weights import path_string


def _full_alpha(alpha, n):
    return jnp.broadcast_to(alpha, (n,))


class FitRequest(NamedTuple):
    """What a structure's `fit` is given: the model, the data, the options of `posteriors.laplace`, and its
    GGN as a lazy operator ``G`` (`linops.GGNOp`)."""

    G: lo.LinearOperator
    fn: Callable
    params: Any
    data: tuple
    likelihood: Any
    batch_size: int | None
    mesh: Any
    rank: int | None
    num_steps: int | None
    key: Any
    kfac_fallback: str | None
    who: str
    kfac_approximation: str = "expand"
    progress: str | None = None  # the label of a progress bar over the data's batches, or None
    curvature: str = "ggn"  # "ggn", "ef", "fisher" (G and likelihood are then theirs) or "hessian" (G a HessianOp)
    num_points: int | None = None  # "functional": the M training points of its curvature (None: all)
    sketch_size: int | None = None  # "sketched": the rows of its sketch (None: min(P, max(4096, 50 rank)))


REGISTRY: dict[str, type] = {}
"""``structure=`` name -> its class; `register` fills it."""


def register(name: str):
    """Class decorator: make a `StructuredGGN` subclass available as ``laplace(..., structure=name)`` (and name it:
    ``cls.name``, which is what ``post.structure`` reads)."""

    def add(cls):
        REGISTRY[name] = cls
        cls.name = name
        return cls

    return add


class StructuredGGN(eqx.Module):
    """Base: a GGN in structured form; a subclass gives the precision as a linops operator.

    A subclass implements `fit` (the curvature from a `FitRequest`) and `precision`, and is registered
    with `register`. Everything else follows from the algebra: the covariance is `linops.inv` of the precision,
    samples are `linops.root` of the covariance applied to standard normals, the evidence's
    log-determinant is `linops.logdet` of the precision. A structure (and a posterior) keeps
    arrays, not operators: operators are built where they are used (operators of one structure are
    one static key, so two posteriors of one shape share their compiled programs either way).
    """

    name: ClassVar[str] = "unregistered"
    """The ``structure=`` name (set by `register`)."""

    compile_fit: ClassVar[bool] = False
    """Whether `posteriors.laplace` runs `fit` as one compiled program (cached per structure, model and shapes);
    the built-in structures do. A new structure whose `fit` needs concrete values (a Python loop over data, a
    host callback) keeps the default False and runs eagerly."""

    per_parameter_prior: ClassVar[bool] = True
    """Whether the structure takes one prior precision per parameter; False: one per leaf at most (KFAC's
    blocks shift their eigenvalues by one number each)."""

    scalar_prior: ClassVar[bool] = False
    """Whether the structure takes one scalar prior precision only (no per-leaf or per-parameter prior)."""

    batch_progress: ClassVar[bool] = True
    """Whether `fit`'s progress is a pass over the data's batches (the GGN operator shows it); False where the
    fit reports its own steps (Lanczos)."""

    @classmethod
    @abc.abstractmethod
    def fit(cls, request: FitRequest) -> StructuredGGN:
        """The structure's curvature from a `FitRequest`."""

    @classmethod
    def check_prior(cls, alpha: np.ndarray, group_sizes: list[int], who: str) -> None:
        """Refuse a concrete per-parameter prior ``alpha`` (over the covered weights, whose leaves have
        ``group_sizes``) the structure cannot take."""
        if cls.per_parameter_prior:
            return
        starts = np.concatenate([[0], np.cumsum(group_sizes)])
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            if not np.all(alpha[a:b] == alpha[a]):
                raise ValueError(f"{who}: a {cls.name!r} posterior takes one prior precision per leaf (per layer), but "
                                 f"parameters {a}..{b - 1} of one leaf have different ones")

    @classmethod
    def fit_and_sum(cls, request: FitRequest, per_example) -> tuple[StructuredGGN, Any]:
        """`fit`, and the sum over the data of ``per_example(f_n, y_n, lik_n)`` (the evidence's data terms) when
        the fit's own pass over the data sees every output ``f_n``, saving the evidence a forward pass of its
        own; None (the default) where it does not."""
        return cls.fit(request), None

    def factorize(self, alpha, scale):
        """What products and samples at this ``(alpha, scale)`` reuse (e.g. a Cholesky factor)."""
        return None

    def definite(self, alpha, scale) -> jax.Array:
        """Whether the precision at ``(alpha, scale)`` is positive definite, where the factorisation does not
        already say so (a non-finite Cholesky factor); True for a PSD curvature, which a positive prior makes
        definite."""
        return jnp.asarray(True)

    @abc.abstractmethod
    def precision(self, alpha, scale) -> lo.LinearOperator:
        """$G/s + \\operatorname{diag}\\alpha$ as a linops operator."""

    def covariance(self, alpha, scale, factor) -> lo.LinearOperator:
        return lo.inv(self.precision(alpha, scale))

    def logdet(self, alpha, scale) -> jax.Array:
        return lo.logdet(self.precision(alpha, scale))

    def sample(self, key, n, alpha, scale, factor) -> jax.Array:
        """``(P, n)`` draws of $\\mathcal N(0, \\Lambda^{-1})$: a square-root factor of the covariance times $z$."""
        R = lo.root(self.covariance(alpha, scale, factor))
        return R @ flat_draw(jax.random.normal, key, (R.shape[1], n), R.dtype)

    def logdet_fn(self, scalar_alpha: bool):
        """A function ``(alpha, scale) -> logdet`` for many evaluations (tuning)."""
        return self.logdet

    def quadratic_rows(self, J, alpha, scale, factor) -> jax.Array | None:
        r"""$\operatorname{diag}(J \Lambda^{-1} J^\top)$ for rows ``J`` ``(R, P)`` where the structure has a more
        accurate form than ``J`` times the covariance's product; None (the default) where it has none."""
        return None

    def output_variances(self, post, inputs, batch: int, progress: str | None) -> jax.Array | None:
        r"""``(M, O)`` $\operatorname{diag}(J \Sigma J^\top)$ of ``post`` (over every weight) from per-layer
        forms that need no Jacobian row, or None (the default): the predictive then forms Jacobian rows."""
        return None

    def output_moments(self, post, inputs, batch: int, progress: str | None) -> tuple[jax.Array, jax.Array] | None:
        """``(means, variances)``, each ``(M, O)``: the MAP outputs and `output_variances`, or None where there are
        no such variances. A structure whose per-layer forms pass forward through the model anyway overrides it to
        take the means from the same passes."""
        variances = self.output_variances(post, inputs, batch, progress)
        return None if variances is None else (post.map_outputs(inputs), variances)


@register("full")
class FullGGN(StructuredGGN):
    """The dense GGN: the posterior precision held as its Cholesky factor; for a scalar prior, the GGN's
    eigenvalues for cheap tuning."""

    compile_fit = True

    G: jax.Array
    psd: bool = eqx.field(static=True, default=True)  # False: a Hessian, possibly indefinite

    @classmethod
    def fit(cls, r):
        return cls.fit_and_sum(r, None)[0]

    @classmethod
    def fit_and_sum(cls, r, per_example):
        P = r.G.shape[0]
        check_fits(3 * P * P * np.dtype(r.G.dtype).itemsize, f"{r.who}(structure='full') with {P} parameters (the "
                   "GGN, the precision and its Cholesky factor)", "use structure='diag', 'kfac' or 'lowrank', or "
                   "subset_of_weights='last_layer'")
        if per_example is None:
            return cls(r.G.as_matrix(), psd=r.curvature != "hessian"), None
        G, sums = r.G._as_matrix(per_example)  # the sums from the Kronecker blocks' pass (a last layer, an MLP)
        return cls(G), sums

    def _Lambda(self, alpha, scale):
        return self.G / scale + jnp.diag(_full_alpha(alpha, self.G.shape[0]).astype(self.G.dtype))

    def factorize(self, alpha, scale):
        """The Cholesky factor $L$ of the precision (`linops.factorize`), kept as an array; nothing more P x P."""
        return lo.factorize(self.precision(alpha, scale)).factor.matrix

    def precision(self, alpha, scale):
        # a Hessian's precision is PSD where it is used: its Cholesky factor is checked finite (`definite`)
        return lo.Dense(self._Lambda(alpha, scale), tags={"psd"})

    def covariance(self, alpha, scale, factor):
        # two triangular solves per product; the factor came from a Cholesky: nothing to zero (no P x P copy)
        return lo.inv(lo.Cholesky(lo.Triangular(factor, lower=True, zero_other_triangle=False)))

    def logdet(self, alpha, scale):
        return lo.logdet(lo.factorize(self.precision(alpha, scale)))

    def logdet_fn(self, scalar_alpha):
        if not scalar_alpha:
            return self.logdet
        w = lo.eigvalsh(lo.Dense(self.G, tags={"symmetric"}))  # once: then O(P) per evaluation
        if self.psd:  # round-off leaves tiny negative eigenvalues of a PSD GGN; a Hessian's are its own (NaN below)
            w = jnp.clip(w, 0.0)
        return lambda alpha, scale: jnp.sum(jnp.log(w / scale + alpha))

    def quadratic_rows(self, J, alpha, scale, factor):
        r"""$\|L^{-1} J^\top\|^2$ per row: one triangular solve, a sum of squares (never negative)."""
        Rt_J = lo.root(self.covariance(alpha, scale, factor)).T @ J.T
        return jnp.sum(Rt_J**2, axis=0)


@register("diag")
class DiagGGN(StructuredGGN):
    """The exact diagonal of the GGN."""

    compile_fit = True

    g: jax.Array
    psd: bool = eqx.field(static=True, default=True)  # False: a Hessian's diagonal, possibly negative

    @classmethod
    def fit(cls, r):
        return cls.fit_and_sum(r, None)[0]

    @classmethod
    def fit_and_sum(cls, r, per_example):
        if r.curvature == "hessian":  # no closed form: P Hessian-vector products with the unit vectors
            return cls(lo.diag(r.G, method="exact"), psd=False), None
        if per_example is None:
            return cls(lo.diag(r.G)), None
        g, sums = r.G._diag_and_sums(per_example)  # the sums from the per-layer rules' forward passes
        return cls(g), sums

    def definite(self, alpha, scale):
        return jnp.asarray(True) if self.psd else jnp.all(self.g / scale + alpha > 0)

    def precision(self, alpha, scale):
        return lo.Diagonal(self.g / scale + alpha, nonnegative=True)

    def output_variances(self, post, inputs, batch, progress):
        """Per layer, squared activations and output gradients weighted by the variances (no Jacobian row)."""
        return diag_moments(post, inputs, batch, progress)[1]

    def output_moments(self, post, inputs, batch, progress):
        """`output_variances`, and the means from their forward passes."""
        return diag_moments(post, inputs, batch, progress)


class _LowRankForm(StructuredGGN):
    """Base of the structures held as $U \\operatorname{diag}(\\lambda) U^\\top$ (orthonormal $U$): Woodbury for
    products and solves, the determinant lemma, never ``P x P``."""

    U: jax.Array
    lam: jax.Array
    psd: bool = eqx.field(static=True, default=True)  # False: a Hessian's top eigenpairs (negative ones clipped)

    def precision(self, alpha, scale):
        P = self.U.shape[0]
        prior = alpha * lo.Identity(P, self.U.dtype) if jnp.ndim(alpha) == 0 else lo.Diagonal(alpha)
        return lo.LowRank(self.U, jnp.clip(self.lam, 0.0) / scale, orthonormal=True, nonnegative=True) + prior

    def quadratic_rows(self, J, alpha, scale, factor):
        r"""$\Lambda^{-1} = (I - UU^\top)/\alpha + U(\lambda + \alpha)^{-1}U^\top$, a sum of PSD terms.

        The covariance's product form $I/\alpha + U[(\lambda+\alpha)^{-1} - \alpha^{-1}]U^\top$ subtracts nearly
        equal numbers where the posterior variance is far below the prior's, and loses the variance to
        round-off in float32; here both terms are sums of squares.
        """
        if jnp.ndim(alpha) != 0:
            return None
        lam = jnp.clip(self.lam, 0.0) / scale
        C = J @ self.U  # (R, k)
        residual = J - C @ self.U.T  # the rows' part outside span U
        return jnp.sum(residual**2, axis=1) / alpha + jnp.sum(C**2 / (lam + alpha)[None, :], axis=1)


@register("lowrank")
class LowRankGGN(_LowRankForm):
    """Top GGN eigenpairs $U \\operatorname{diag}(\\lambda) U^\\top$ (orthonormal $U$): Woodbury, never ``P x P``."""

    compile_fit = True
    batch_progress = False

    @classmethod
    def fit(cls, r):
        if r.key is None:
            raise ValueError(f"{r.who}(structure='lowrank'): Lanczos needs a start vector: "
                             "pass key=jax.random.key(...)")
        if r.rank is None:
            raise ValueError(f"{r.who}(structure='lowrank'): pass rank=k, the number of GGN eigenpairs kept")
        low = lo.LanczosLowRankOp(r.G, r.rank, r.key, num_steps=r.num_steps, progress=r.progress)
        return cls(low.U, low.d, psd=r.curvature != "hessian")

class _Unavailable(lo.LinearOperator):
    """A ``P x P`` placeholder whose products refuse, with ``message``: what a structure cannot give."""

    n: int = eqx.field(static=True)
    _dtype: str = eqx.field(static=True)
    message: str = eqx.field(static=True)

    @property
    def shape(self):
        return (self.n, self.n)

    @property
    def dtype(self):
        return jnp.dtype(self._dtype)

    def mv(self, v):
        raise ValueError(self.message)

    def rmv(self, u):
        raise ValueError(self.message)


@register("sketched")
class SketchedLowRankGGN(StructuredGGN):
    r"""The top GGN eigenpairs by sketched Lanczos (`linops.sketched_lanczos`; Miani et al., NeurIPS 2024), kept
    as their eigenvalues and sketched eigenvectors: memory ``O(P)`` for the run and ``s x rank`` after it, never
    the ``P x num_steps`` basis of ``"lowrank"``.

    The posterior is the low-rank one, $\Lambda^{-1} = (I - UU^\top)/\alpha + U(\lambda + \alpha)^{-1}U^\top$,
    with $U^\top w$ read from the sketch ($Q^\top S w$): its predictive variances, log-determinant, evidence
    and prior tuning work; a product with the covariance, samples and output covariances need $U$ in parameter
    space and are refused (use ``"lowrank"``). ``rank`` is the number of converged, distinct pairs found
    (`linops.SketchedLanczos.low_rank`), at most the ``rank`` asked for. A scalar prior precision only.
    """

    compile_fit = True
    batch_progress = False
    per_parameter_prior = False
    scalar_prior = True

    lam: jax.Array
    top: lo.SketchedEigenbasis

    @classmethod
    def fit(cls, r):
        who = f"{r.who}(structure='sketched')"
        if r.key is None:
            raise ValueError(f"{who}: sketched Lanczos draws its sketch and start vector: pass key=jax.random.key(...)")
        if r.rank is None:
            raise ValueError(f"{who}: pass rank=k, the number of GGN eigenpairs kept")
        if r.curvature == "hessian":
            raise ValueError(f"{who}: a Hessian can be indefinite, and a sketched basis cannot say which of its "
                             "directions are: use curvature='ggn', 'ef' or 'fisher', or structure='lowrank'")
        P = r.G.shape[0]
        steps = min(P, 5 * r.rank + 50) if r.num_steps is None else r.num_steps
        size = min(P, max(4096, 50 * r.rank)) if r.sketch_size is None else r.sketch_size
        if not 1 <= r.rank <= steps <= P:
            raise ValueError(f"{who}: needs 1 <= rank <= num_steps <= P = {P}, got rank={r.rank}, num_steps={steps}")
        if not 1 <= size <= P:
            raise ValueError(f"{who}: sketch_size must be in [1, P = {P}], got {size}")
        run = lo.sketched_lanczos(r.G, steps, size, key=r.key, progress=r.progress)
        top = run.low_rank(r.rank)
        return cls(jnp.clip(top.values, 0.0), top)

    @classmethod
    def check_prior(cls, alpha, group_sizes, who):
        if not np.all(alpha == alpha.flat[0]):
            raise ValueError(f"{who}: a 'sketched' posterior takes one scalar prior precision (its eigenvectors are "
                             "known only through their sketches), got one per parameter or per leaf")

    def _refused(self, what):
        P = self.top.sketch.shape[1]
        return _Unavailable(P, self.lam.dtype.name, f"structure='sketched' keeps its eigenvectors only as sketches, "
                            f"so it has no {what}; its predictive variances, evidence and prior tuning work. Use "
                            "structure='lowrank' for it")

    def precision(self, alpha, scale):
        return self._refused("precision operator")

    def covariance(self, alpha, scale, factor):
        return self._refused("covariance products (output covariances, full covariances)")

    def sample(self, key, n, alpha, scale, factor):
        raise ValueError("structure='sketched' keeps its eigenvectors only as sketches, so it has no parameter "
                         "samples; use structure='lowrank' for samples")

    def logdet(self, alpha, scale):
        P, lam = self.top.sketch.shape[1], self.lam / scale
        alpha = jnp.reshape(alpha, (-1,))[0]  # one scalar (`check_prior`)
        return jnp.sum(jnp.log(lam + alpha)) + (P - self.lam.shape[0]) * jnp.log(alpha)

    def quadratic_rows(self, J, alpha, scale, factor):
        r"""$\|(I - UU^\top) J^\top\|^2$ over $\alpha$ plus $\sum_i (u_i^\top J^\top)^2/(\lambda_i + \alpha)$ per
        row, both read from the sketch (`linops.SketchedEigenbasis`): the first as a sketched residual, each within
        the embedding's relative error of its own value (no difference of nearly equal numbers)."""
        alpha = jnp.reshape(alpha, (-1,))[0]
        C, outside = self.top.split(J.T)  # one product with the sketch; C's rows past the pairs found are zero
        C = C.T  # (R, r)
        return outside / alpha + jnp.sum(C**2 / (self.lam / scale + alpha)[None, :], axis=1)


@register("functional")
class FunctionalGGN(_LowRankForm):
    r"""The linearised Laplace posterior as a Gaussian process on $M$ training points (laplace-torch's
    `FunctionalLaplace`), held in weight space: the GGN of those points, $G_M = R^\top R$ with $R$ the ``(M K, P)``
    rows $A_n J_n$, kept exactly as its thin SVD $V \operatorname{diag}(\lambda) V^\top$. The covariance
    $(G_M + \alpha I)^{-1} = \alpha^{-1}I - \alpha^{-2} J_M^\top (K_{MM} + \Lambda_M^{-1})^{-1} J_M$ is the GP
    posterior with the network's tangent kernel $K = J J^\top/\alpha$; every product, determinant and sample is
    the low-rank structure's (Woodbury, never ``P x P``). ``points``: the indices of the $M$ points (all, in order,
    by default; else drawn without replacement with ``key``)."""

    points: jax.Array | None = None

    compile_fit = True
    batch_progress = False

    @classmethod
    def fit(cls, r):
        if r.curvature == "hessian":
            raise ValueError(f"{r.who}(structure='functional'): the GP view is the GGN's (or a Fisher's): its kernel "
                             "is J J^T; the Hessian takes structure='full', 'diag' or 'lowrank'")
        X, Y = r.data
        n = int(jax.tree_util.tree_leaves(X)[0].shape[0])
        m = n if r.num_points is None else r.num_points
        if not 1 <= m <= n:
            raise ValueError(f"{r.who}(structure='functional'): num_points must be in [1, {n}], got {m}")
        if m == n:
            idx = jnp.arange(n)
        elif r.key is None:
            raise ValueError(f"{r.who}(structure='functional'): a subset of num_points={m} of the {n} examples is "
                             "drawn at random: pass key=jax.random.key(...)")
        else:
            idx = jnp.sort(jax.random.choice(r.key, n, (m,), replace=False))
        take = lambda t: jax.tree_util.tree_map(lambda a: a[idx], t)  # noqa: E731
        lik = take(r.likelihood) if r.likelihood.per_example else r.likelihood  # a per-example one: its rows too
        R = lo.GGNOp(r.fn, r.params, take(X), take(Y), lik, batch_size=r.batch_size, mesh=r.mesh).rows()
        _, S, V = lo.svd(lo.Dense(R))
        return cls(V.as_matrix(), S**2, points=idx)


LONG_EIGENDECOMPOSITION = 4096
"""Kronecker factors this wide or wider make a KFAC fit warn before its eigendecompositions (about 14 s for one
in float32 on 2 CPU cores, a cubic cost: 20,000 inputs take about half an hour)."""

EIGH_SECONDS_PER_CUBE = 2e-10
"""Seconds per d**3 of a float32 eigendecomposition (`jax.numpy.linalg.eigh`), measured on 2 CPU cores at d = 1,000
and 2,000 (0.2 s and 1.7 s, 2026-11-28); float64 counts twice."""


def warn_long_eigendecompositions(sizes, dtype, who: str) -> None:
    """Warn, before the work, when eigendecomposing Kronecker factors of these ``sizes`` takes minutes."""
    long = sorted((d for d in sizes if d >= LONG_EIGENDECOMPOSITION), reverse=True)
    if not long:
        return
    seconds = EIGH_SECONDS_PER_CUBE * (2 if np.dtype(dtype) == np.float64 else 1) * sum(float(d) ** 3 for d in sizes)
    estimate = f"{seconds / 60:.0f} minutes" if seconds >= 90 else f"{seconds:.0f} s"
    warnings.warn(f"{who}(structure='kfac'): eigendecomposing Kronecker factors of sizes "
                  f"{', '.join(f'{d:,}' for d in long)} (a cost cubic in the size) takes about {estimate} on 2 CPU "
                  "cores (less with more cores or on a GPU). To avoid it, leave the widest layers out (a last-layer or "
                  "diagonal posterior: subset_of_weights=..., structure='diag') or reduce their width", stacklevel=2)


@register("kfac")
class KFACGGN(StructuredGGN):
    """Per leaf an eigen-decomposed curvature block $Q \\operatorname{diag}(w) Q^\\top$ (`linops.EigenDecomposed`),
    $Q$ the Kronecker product of the eigenvectors in ``eigenvectors`` (two factors for a weight, one for a bias
    block, none (the identity) for the exact diagonal of a leaf in no recognised layer; a grouped convolution's
    factors carry a leading group axis, $Q$ block-diagonal over the groups). One prior precision per leaf shifts
    each block's eigenvalues. ``diagonal_leaves`` names the leaves given the exact GGN diagonal."""

    compile_fit = True
    per_parameter_prior = False

    eigenvectors: tuple  # per leaf: a tuple of orthogonal matrices (or stacks of them, one per group)
    eigenvalues: tuple  # per leaf: w >= 0
    sizes: tuple = eqx.field(static=True)
    diagonal_leaves: tuple = eqx.field(static=True, default=())
    approximation: str = eqx.field(static=True, default="expand")

    @classmethod
    def fit(cls, r):
        return cls.fit_and_sum(r, None)[0]

    @classmethod
    def fit_and_sum(cls, r, per_example):
        K = lo.kfac(r.fn, r.params, *r.data, r.likelihood, approximation=r.kfac_approximation,
                    batch_size=r.batch_size, mesh=r.mesh, other_diagonal=r.kfac_fallback == "diag",
                    progress=r.progress, per_example=per_example)
        names = [path_string(p) for p, _ in jax.tree_util.tree_flatten_with_path(r.params)[0]]
        if K.other_leaves and r.kfac_fallback in (None, "error"):
            raise ValueError(f"{r.who}(structure='kfac'): parameters outside any dense or convolutional layer have no "
                             f"Kronecker factors: {[names[i] for i in K.other_leaves]}; kfac_fallback='diag' (the "
                             "default) gives them the exact GGN diagonal")
        other_diagonals = dict(zip(K.other_leaves, K.other_diagonals, strict=True))
        # per leaf, the eigendecompositions of its Kronecker factors (round-off leaves tiny negative eigenvalues of
        # a PSD factor: clipped); Q is their Kronecker product, w the Kronecker product of their eigenvalues
        factors = [None] * len(K.leaf_sizes)
        for (first, second), w, b, B in zip(K.factors, K.weight_leaves, K.bias_leaves, K.bias_blocks, strict=True):
            factors[w] = (first, second)
            if b is not None:
                factors[b] = (B,)
        warn_long_eigendecompositions([F.shape[-1] for fs in factors if fs is not None for F in fs],
                                      jnp.result_type(*K.factors[0]) if K.factors else jnp.float32, r.who)
        eigenvectors, eigenvalues = [], []
        for i, fs in enumerate(factors):
            if fs is None:  # in no recognised layer: the exact GGN diagonal, eigenvectors the identity
                eigenvectors.append(())
                eigenvalues.append(jnp.clip(other_diagonals[i].reshape(-1), 0.0))
                continue
            if fs[0].ndim == 3:  # a grouped convolution: one pair of factors per group
                Es = [[lo.eigendecompose(lo.Dense(F[g], tags={"psd"})) for g in range(F.shape[0])] for F in fs]
                eigenvectors.append(tuple(jnp.stack([E.Q.matrix for E in per]) for per in Es))
                eigenvalues.append(jnp.concatenate([jnp.kron(*(jnp.clip(per[g].w, 0.0) for per in Es))
                                                    for g in range(fs[0].shape[0])]))
                continue
            Es = [lo.eigendecompose(lo.Dense(F, tags={"psd"})) for F in fs]
            eigenvectors.append(tuple(E.Q.matrix for E in Es))
            eigenvalues.append(functools.reduce(jnp.kron, [jnp.clip(E.w, 0.0) for E in Es]))
        return cls(tuple(eigenvectors), tuple(eigenvalues), K.leaf_sizes,
                   tuple(names[i] for i in K.other_leaves), K.approximation), K.sums

    def block(self, i, w) -> lo.EigenDecomposed:
        """Leaf ``i``'s block with eigenvalues ``w``."""
        vectors = self.eigenvectors[i]
        if vectors and vectors[0].ndim == 3:  # per group
            Q = lo.BlockDiagonal([functools.reduce(lo.Kronecker, [lo.Dense(V[g], tags={"orthogonal"})
                                                                  for V in vectors])
                                  for g in range(vectors[0].shape[0])])
        else:
            Qs = [lo.Dense(V, tags={"orthogonal"}) for V in vectors]
            Q = functools.reduce(lo.Kronecker, Qs) if Qs else lo.Identity(self.sizes[i], w.dtype)
        return lo.EigenDecomposed(Q, w, nonnegative=True)

    def _leaf_alpha(self, alpha):
        if jnp.ndim(alpha) == 0:
            return [alpha] * len(self.sizes)
        starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        return [alpha[s] for s in starts]  # constant per leaf (checked on construction)

    def precision(self, alpha, scale):
        alphas = self._leaf_alpha(alpha)
        return lo.BlockDiagonal([lo.shift(self.block(i, w / scale), alphas[i], nonnegative=True)
                                 for i, w in enumerate(self.eigenvalues)])

    def output_variances(self, post, inputs, batch, progress):
        """Per layer, activations and output gradients in the factors' eigenbases (no Jacobian row)."""
        return kfac_moments(post, inputs, batch, progress)[1]

    def output_moments(self, post, inputs, batch, progress):
        """`output_variances`, and the means from their forward passes."""
        return kfac_moments(post, inputs, batch, progress)


__all__ = ["DiagGGN", "FitRequest", "FullGGN", "FunctionalGGN", "KFACGGN", "LowRankGGN", "REGISTRY", "StructuredGGN",
           "register"]
