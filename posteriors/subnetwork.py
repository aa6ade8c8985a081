r"""Subnetwork inference (Daxberger et al., ICML 2021): a full-covariance Laplace over $S \ll P$ chosen weights.

Selection strategies each return a `Subnetwork`: sorted flat indices into the parameters,
the scores they were chosen by, and the memory the posterior over them will take. The
paper's rule (section 5) keeps the weights of LARGEST marginal posterior variance: under an
independence assumption it minimises the 2-Wasserstein distance to the full posterior. The
variances come from a diagonal Laplace (`diagonal_laplace`) or from diagonal SWAG (`swag`),
the paper's choice for ReLU networks: a dead unit's weights have no data gradient, so diagonal
Laplace gives them the prior's variance (the largest) although they do not change the
function, while SWAG's iterates never move them.

`subnetwork_laplace` then fits $\mathcal N(\theta^*_s, (E_s^\top G E_s + \lambda_S I)^{-1})$ with
$J E_s$ from derivatives of the model restricted to the subset (`linops.models.restrict`:
never the full Jacobian sliced afterwards) and $\lambda_S = \lambda S / P$ (appendix C).

Examples:
    >>> import jax, jax.numpy as jnp
    >>> import posteriors as pst
    >>> from linops.likelihoods import Gaussian
    >>> fn = lambda w, x: (x @ w)[None]
    >>> X = jax.random.normal(jax.random.key(0), (20, 4)); Y = X[:, :1]
    >>> sub = pst.subnetwork.largest_magnitude(jnp.array([0.1, -3.0, 0.5, 2.0]), 2)
    >>> sub.indices, sub.memory_bytes
    (Array([1, 3], dtype=int32), 48)
    >>> post = pst.subnetwork_laplace(fn, jnp.array([0.1, -3.0, 0.5, 2.0]), (X, Y), Gaussian(1.0), sub)
    >>> post.covariance.shape, post.structure, post.weights.indices
    ((4, 4), 'full', Array([1, 3], dtype=int32))
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
from linops.likelihoods import Likelihood
from linops.memory import check_fits, format_bytes
from linops.models import check_indices, ravel
from posteriors._checks import check_data, check_likelihood, check_params, check_targets
from posteriors._prior import canonical_prior
from posteriors._training import positive_int
from posteriors.laplace_family import LaplacePosterior, _laplace
from posteriors.swag_posterior import _sgd_moments
from posteriors.weights import AllWeights, Indices, last_layer_leaves

#: What `subnetwork_laplace` keeps per subnetwork weight pair: the GGN block, its Cholesky factor
#: and the covariance, each S x S.
_SQUARES = 3


class Subnetwork(eqx.Module):
    """A parameter subset: sorted flat indices, how they were chosen, and the memory they need.

    Attributes:
        indices: ``(S,)`` sorted flat indices into the raveled parameters.
        num_params: $P$, all the parameters.
        strategy: the selection rule's name.
        scores: the per-parameter scores the rule ranked (variances, magnitudes), or None.
        itemsize: bytes per number of the parameters' dtype.
    """

    indices: jax.Array
    num_params: int = eqx.field(static=True)
    strategy: str = eqx.field(static=True)
    scores: jax.Array | None
    itemsize: int = eqx.field(static=True)

    @property
    def size(self) -> int:
        """$S$."""
        return int(self.indices.shape[0])

    @property
    def memory_bytes(self) -> int:
        """Bytes of the ``S x S`` arrays `subnetwork_laplace` needs at its peak: three (the GGN, the posterior
        precision and its Cholesky factor); it keeps two (the GGN and the factor)."""
        return _SQUARES * self.size**2 * self.itemsize

    def as_weights(self, params, who: str = "laplace") -> Indices:
        """The selection `posteriors.laplace` covers for ``subset_of_weights=subnetwork``: its `Indices`, checked
        against ``params``' parameter count."""
        P = int(ravel(params)[0].shape[0])
        if self.num_params != P:
            raise ValueError(f"{who}: the subnetwork indexes {self.num_params} parameters but params have {P}")
        return Indices(self.indices)


def _make(indices, params, strategy, scores=None):
    flat, _ = ravel(params)
    idx = check_indices(indices, flat.shape[0], f"subnetwork.{strategy}")
    return Subnetwork(jnp.asarray(idx, jnp.int32), int(flat.shape[0]), strategy, scores,
                      int(np.dtype(flat.dtype).itemsize))


def _check_size(size, P, who):
    if not isinstance(size, (int, np.integer)) or not 1 <= size <= P:
        raise ValueError(f"{who}: size must be an integer in [1, {P}], got {size!r}")
    return int(size)


def _top(scores, size, key=None):
    """The ``size`` largest scores; ties in index order, or in a random order drawn with ``key``."""
    scores = np.asarray(scores)
    if key is None:
        return np.argsort(-scores, kind="stable")[:size]
    tiebreak = np.asarray(jax.random.permutation(key, scores.shape[0]))
    return np.lexsort((tiebreak, -scores))[:size]


def from_indices(params, indices) -> Subnetwork:
    """A subnetwork given by flat indices (checked: in range, no duplicates).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.subnetwork import from_indices
        >>> from_indices(jnp.zeros(5), [4, 0]).indices
        Array([0, 4], dtype=int32)
    """
    return _make(indices, params, "from_indices")


def largest_variance(params, variances, size: int, *, key: jax.Array | None = None,
                     strategy: str = "largest_variance") -> Subnetwork:
    """The ``size`` parameters of largest marginal variance (the Wasserstein rule), from given variances.

    Weights the training data do not constrain at all (e.g. those of ReLU units inactive on
    every training input) all have exactly the prior variance: the rule cannot rank them. Ties
    go in index order, or in a random order drawn with ``key``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.subnetwork import largest_variance
        >>> largest_variance(jnp.zeros(4), jnp.array([0.1, 5.0, 2.0, 0.3]), 2).indices
        Array([1, 2], dtype=int32)
    """
    flat, _ = ravel(params)
    variances = jnp.asarray(variances)
    if variances.shape != flat.shape:
        raise ValueError(f"subnetwork.{strategy}: variances must have shape {flat.shape}, got {variances.shape}")
    size = _check_size(size, flat.shape[0], f"subnetwork.{strategy}")
    return _make(_top(variances, size, key), params, strategy, variances)


def diagonal_laplace(fn, params, data, likelihood: Likelihood, size: int, *, prior_precision=1.0,
                     batch_size: int | None = None, key: jax.Array | None = None, progress: bool = True) -> Subnetwork:
    r"""Largest marginal variances $1/(\operatorname{diag} G + \alpha)$ of a diagonal Laplace (the paper's rule).

    Ties (weights without any data gradient) go in index order, or at random with ``key``. ``progress``:
    a bar over the data's batches of the GGN diagonal (shown after two seconds); False silences it.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.subnetwork import diagonal_laplace
        >>> from linops.likelihoods import Gaussian
        >>> X = jnp.array([[1.0, 0.0, 3.0], [1.0, 0.0, 3.0]])   # w[1] is never seen: prior variance
        >>> diagonal_laplace(lambda w, x: (x @ w)[None], jnp.zeros(3), (X, jnp.zeros((2, 1))), Gaussian(1.0), 1).indices
        Array([1], dtype=int32)
    """
    who = "subnetwork.diagonal_laplace"
    check_params(params, who)
    check_likelihood(likelihood, who)
    X, Y = check_data(data, who)
    label = who if progress else None
    g = lo.diag(lo.GGNOp(fn, params, X, Y, likelihood, batch_size=batch_size, progress=label))
    alpha = canonical_prior(prior_precision, params, AllWeights(), who=who)
    return largest_variance(params, 1.0 / (g + alpha), size, key=key, strategy="diagonal_laplace")


def swag(fn, params, data, likelihood: Likelihood, size: int, *, key: jax.Array, num_steps: int = 1000,
         learning_rate: float = 1e-2, batch_size: int = 32, collect_every: int = 1, prior_precision=0.0,
         momentum: float = 0.9, progress: bool = True) -> Subnetwork:
    r"""Largest marginal variances of diagonal SWAG (Maddox et al., 2019): SGD from ``params``.

    SGD with momentum (optax) on the mean negative log-likelihood of random mini-batches (drawn
    with ``key``), plus $\tfrac{\alpha}{2N}\|\theta\|^2$ when ``prior_precision`` $\alpha > 0$
    (default 0, so that weights without data gradients stay put and get no variance), starting
    at ``params``; every ``collect_every`` steps the iterate enters running first and second
    moments, and the variance is $\overline{\theta^2} - \bar\theta^2$. ``progress``: a bar over the
    SGD steps (shown after two seconds); False silences it.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.subnetwork import swag
        >>> from linops.likelihoods import Gaussian
        >>> X = jnp.array([[1.0, 0.0], [2.0, 0.0], [0.5, 0.0]]); Y = jnp.array([[1.0], [0.0], [2.0]])
        >>> sub = swag(lambda w, x: (x @ w)[None], jnp.zeros(2), (X, Y), Gaussian(1.0), 1, key=jax.random.key(0),
        ...            num_steps=200, batch_size=1)
        >>> sub.indices, float(sub.scores[1])                  # w[1] has no gradient: it never moves
        (Array([0], dtype=int32), 0.0)
    """
    who = "subnetwork.swag"
    check_params(params, who)
    check_likelihood(likelihood, who)
    check_data(data, who)
    check_targets(fn, params, data, likelihood, who)
    flat, _ = ravel(params)
    size = _check_size(size, flat.shape[0], who)
    num_steps = positive_int(num_steps, "num_steps", who)
    batch_size = min(positive_int(batch_size, "batch_size", who), jax.tree_util.tree_leaves(data[0])[0].shape[0])
    collect_every = positive_int(collect_every, "collect_every", who)
    _, variances, _, _ = _sgd_moments(fn, params, data, likelihood, key=key, num_steps=num_steps,
                                     collect_every=collect_every, learning_rate=learning_rate, batch_size=batch_size,
                                     prior_precision=prior_precision, momentum=momentum, rank=0,
                                     label=who if progress else None, who=who)
    return largest_variance(params, variances, size, strategy="swag")


def largest_magnitude(params, size: int) -> Subnetwork:
    """The ``size`` parameters of largest absolute value (a baseline).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.subnetwork import largest_magnitude
        >>> largest_magnitude(jnp.array([0.5, -4.0, 1.0]), 1).indices
        Array([1], dtype=int32)
    """
    flat, _ = ravel(params)
    size = _check_size(size, flat.shape[0], "subnetwork.largest_magnitude")
    return _make(_top(jnp.abs(flat), size), params, "largest_magnitude", jnp.abs(flat))


def random(key: jax.Array, params, size: int) -> Subnetwork:
    """``size`` parameters uniformly at random, without replacement (a baseline; explicit ``key``).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.subnetwork import random
        >>> random(jax.random.key(0), jnp.zeros(10), 3).size
        3
    """
    flat, _ = ravel(params)
    size = _check_size(size, flat.shape[0], "subnetwork.random")
    return _make(np.asarray(jax.random.choice(key, flat.shape[0], (size,), replace=False)), params, "random")


def _leaf_indices(params, chosen):
    sizes = [int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(params)]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return np.concatenate([np.arange(starts[i], starts[i + 1]) for i in chosen])


def last_layer(params, last_layer: str | None = None) -> Subnetwork:
    """The last layer's parameters (found as `posteriors.last_layer_leaves` does, or named).

    Examples:
        >>> import jax, equinox as eqx
        >>> from posteriors.subnetwork import last_layer
        >>> from linops.models import from_equinox
        >>> _, params = from_equinox(eqx.nn.MLP(2, 3, 8, 1, key=jax.random.key(0)))
        >>> last_layer(params).size                   # 8 x 3 weights + 3 biases
        27
    """
    return _make(_leaf_indices(params, last_layer_leaves(params, last_layer)), params, "last_layer")


def by_name(params, prefix: str) -> Subnetwork:
    """Every parameter whose path (``"layers.0.weight"``) starts with ``prefix``.

    Examples:
        >>> import jax, equinox as eqx
        >>> from posteriors.subnetwork import by_name
        >>> from linops.models import from_equinox
        >>> _, params = from_equinox(eqx.nn.MLP(2, 3, 8, 1, key=jax.random.key(0)))
        >>> by_name(params, "layers.0.bias").size
        8
    """
    return _make(_leaf_indices(params, last_layer_leaves(params, prefix)), params, "by_name")


def size_for_memory(memory_bytes: int, *, dtype=jnp.float32) -> int:
    """The largest $S$ whose `subnetwork_laplace` arrays fit in ``memory_bytes``.

    Examples:
        >>> from posteriors.subnetwork import size_for_memory
        >>> size_for_memory(7_200_000_000)            # the paper's 7.2 GB, float32
        24494
    """
    return int(np.floor(np.sqrt(memory_bytes / (_SQUARES * np.dtype(dtype).itemsize))))


def subnetwork_laplace(fn, params, data, likelihood: Likelihood, subnetwork: Subnetwork, prior_precision=1.0, *,
                       rescale_prior: bool = True, batch_size: int | None = None, mesh=None,
                       progress: bool = True) -> LaplacePosterior:
    r"""Laplace over a subnetwork: covariance $E_s (E_s^\top G E_s + \lambda_S I)^{-1} E_s^\top$.

    $E_s^\top G E_s$ is the dense GGN of the model restricted to the subset
    (`linops.models.restrict`): its Jacobian rows come from reverse passes that stop at the
    leaves holding selected weights, never from the full Jacobian. The other weights stay at
    $\theta^*$. It also runs on a traced subnetwork (``jax.jit``, or ``eqx.filter_eval_shape`` to
    build the free template `posteriors.load` reads a saved posterior into).

    Args:
        fn: per-example model ``fn(params, x) -> (O,)`` (as for `posteriors.laplace`).
        params: the trained params pytree $\theta^*$.
        data: the training ``(inputs, targets)``.
        likelihood: a `linops.likelihoods.Likelihood`.
        subnetwork: a `Subnetwork` (from a selection strategy or `from_indices`).
        prior_precision: $\lambda$, a scalar or one per parameter (of all $P$).
        rescale_prior: use $\lambda_S = \lambda S/P$ (appendix C: it keeps the magnitude of the
            implied tangent kernel); ``False`` keeps $\lambda$.
        batch_size: examples per batch of the GGN.
        mesh: a `jax.sharding.Mesh` with a ``"data"`` axis: the subnetwork's GGN splits the examples
            over its devices (`linops.GGNOp`); the result equals the single-device one.
        progress: a progress bar over the data's batches of the subnetwork's GGN on stderr, shown once
            it runs longer than two seconds; False silences it.

    Returns:
        A `LaplacePosterior` of ``structure="full"`` over the subnetwork's weights (``post.weights``, a
        `posteriors.weights.Indices`): `posteriors.laplace` with ``subset_of_weights=subnetwork`` and the
        rescaled prior. The same interface as every other posterior (``.mean``, ``.covariance``,
        ``.sample``, the predictives, the evidence, save/load).

    Raises:
        ValueError: a subnetwork of another parameter count; `linops.memory.MemoryBudgetError`
            when its ``S x S`` arrays cannot fit (see `Subnetwork.memory_bytes`, `size_for_memory`).

    Examples:
        >>> import jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> X = jnp.eye(3); Y = jnp.zeros((3, 1))
        >>> sub = pst.subnetwork.from_indices(jnp.zeros(3), [0, 2])
        >>> post = pst.subnetwork_laplace(lambda w, x: (x @ w)[None], jnp.zeros(3), (X, Y), Gaussian(1.0), sub,
        ...                               prior_precision=3.0)           # lambda_S = 3 * 2/3 = 2
        >>> (3 * post.covariance.as_matrix()).round(4)   # (1 + 2)^-1 for w[0] and w[2]; w[1] is fixed
        Array([[1., 0., 0.],
               [0., 0., 0.],
               [0., 0., 1.]], dtype=float32)
    """
    who = "subnetwork_laplace"
    if not isinstance(subnetwork, Subnetwork):
        raise TypeError(f"{who}: subnetwork must be a posteriors.subnetwork.Subnetwork, "
                        f"got {type(subnetwork).__name__}")
    check_likelihood(likelihood, who)
    check_data(data, who)
    check_params(params, who)
    flat, _ = ravel(params)
    P, s = flat.shape[0], subnetwork.size
    subnetwork.as_weights(params, who)  # the parameter count, before any work
    check_fits(subnetwork.memory_bytes, f"{who} over {s} weights ({format_bytes(subnetwork.memory_bytes)} for its "
               "GGN, precision and Cholesky factor)", "choose fewer weights: posteriors.subnetwork.size_for_memory "
               "gives the largest S that fits")
    if rescale_prior:  # lambda_S = lambda S / P, on the host when concrete (an eager product compiles a program)
        ratio = s / P
        prior_precision = jax.tree_util.tree_map(
            lambda a: a * ratio if isinstance(a, jax.core.Tracer) else np.asarray(a) * ratio, prior_precision)
    label = f"{who} ({s} weights)" if progress else None
    return _laplace(fn, params, data, likelihood, structure="full", subset_of_weights=subnetwork,
                    prior_precision=prior_precision, batch_size=batch_size, rank=None, num_steps=None, key=None,
                    last_layer=None, kfac_fallback=None, kfac_approximation="expand", mesh=mesh, label=label, who=who)


__all__ = [
    "Subnetwork", "by_name", "diagonal_laplace", "from_indices", "largest_magnitude", "largest_variance",
    "last_layer", "random", "size_for_memory", "subnetwork_laplace", "swag",
]
