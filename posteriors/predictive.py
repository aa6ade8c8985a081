r"""Predictives of a Gaussian posterior over a network's parameters.

- `linearized`: the linearised model's mean $f(\theta^*, x)$ and variance (or full covariance
  across a batch: the Laplace tangent kernel $J(X)\Sigma J(X)^\top$), exactly;
- `monte_carlo`: samples of the outputs, of the linearised model or of the network itself;
- `probit` and `laplace_bridge`: class probabilities from a mean and a variance;
- `classification` and `regression`: the usual end products.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> import posteriors as pst
    >>> from linops.likelihoods import Gaussian
    >>> fn = lambda w, x: (x @ w)[None]
    >>> X = jnp.array([[1.0, 0.0], [0.0, 2.0]]); Y = jnp.zeros((2, 1))
    >>> post = pst.laplace(fn, jnp.zeros(2), (X, Y), Gaussian(1.0), structure="full")
    >>> mean, var = pst.predictive.linearized(post, jnp.array([[1.0, 1.0]]))
    >>> var.round(4)                           # x^T (X^T X + I)^-1 x = 1/2 + 1/5
    Array([[0.7]], dtype=float32)
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
from linops.likelihoods import Bernoulli, Categorical, Flattened, Gaussian, HeteroscedasticGaussian, PerPosition
from linops.memory import check_fits
from linops.models import ravel, unravel_of
from linops.runtime import batched_map, program
from posteriors._checks import model_outputs
from posteriors._training import positive_int
from posteriors.ensemble import DeepEnsemble
from posteriors.gaussian import AbstractLowRankPosterior, GaussianPosterior
from posteriors.laplace_family import LaplacePosterior
from posteriors.projected import ProjectedPosterior


def _output_shape(post):
    """One example's output shape when the model has a position axis (``(T, V)``, read flattened:
    `linops.likelihoods.Flattened`), else None."""
    fn = getattr(post, "fn", None)
    return fn.shape if isinstance(fn, Flattened) else None


def _shaped(shape, a, *axes):
    """``a`` with each of ``axes`` (of length ``prod(shape)``, in increasing order) split into ``shape``."""
    if shape is None:
        return a
    for axis in sorted(axes, reverse=True):
        a = a.reshape(a.shape[:axis] + tuple(shape) + a.shape[axis + 1:])
    return a


def _likelihood(post):
    """The posterior's likelihood of one position (a `PerPosition`'s base), or None."""
    lik = getattr(post, "likelihood", None)
    return lik.base if isinstance(lik, PerPosition) else lik


def _parts(post):
    """``(fn, params, covariance)`` in the posterior's own parameter space (a last layer's alone)."""
    return post.own_space()


def _jacobian_rows(fn, params, X):
    """``(M O, P)``: the rows of the stacked Jacobian, by per-example reverse passes."""
    def example(x):
        _, vjp = jax.vjp(lambda p: fn(p, x), params)
        k = jax.eval_shape(fn, params, x).shape[0]
        return jax.vmap(lambda e: ravel(vjp(e)[0])[0])(jnp.eye(k, dtype=ravel(params)[0].dtype))

    rows = jax.vmap(example)(X)
    return rows.reshape(-1, rows.shape[-1])


def _jacobian_block(fn, params, X, outputs):
    """``(b, k, P)``: the Jacobian rows of outputs ``outputs`` (``(k,)``; -1 gives a zero row) of each input,
    one forward pass per input and one reverse pass per row."""
    def example(x):
        f, vjp = jax.vjp(lambda p: fn(p, x), params)
        E = jax.nn.one_hot(outputs, f.shape[0], dtype=f.dtype)
        return jax.vmap(lambda e: ravel(vjp(e)[0])[0])(E)

    return jax.vmap(example)(X)


def _quadratic_rows(post, J):
    """``diag(J Σ Jᵀ)`` from a Laplace structure's own accurate form, or None. ``J``'s columns are the
    posterior's own parameters (a last layer's or a subnetwork's alone: `_parts`), those of its GGN."""
    if not isinstance(post, LaplacePosterior):
        return None
    return post.ggn.quadratic_rows(J, post.prior_precision, post.noise_scale, post.factor)


ROW_BUDGET = 1 << 25
"""Numbers of Jacobian rows the linearised predictive holds at once (128 MB in float32)."""


def _plan(M, num_outputs, P, batch_size, output_covariance):
    """``(inputs per chunk, outputs per block)``: a chunk's rows hold about `ROW_BUDGET` numbers."""
    if batch_size is not None:
        return batch_size, num_outputs
    if num_outputs * P <= ROW_BUDGET or output_covariance:
        return max(1, min(M, ROW_BUDGET // max(num_outputs * P, 1))), num_outputs
    return 1, max(1, min(num_outputs, ROW_BUDGET // max(P, 1)))  # many outputs: blocks of outputs of one input


def _row_values(post, inputs, b, k, output_covariance, progress=None):
    """``(M, O)`` variances (or ``(M, O, O)`` covariances) from chunks of ``b`` inputs x ``k`` outputs of Jacobian
    rows, mapped with `jax.lax.map` (one compiled body; never more rows at once)."""
    fn, params, cov = _parts(post)
    num_outputs = jax.eval_shape(fn, params, inputs[0]).shape[0]
    P = unravel_of(params).size
    blocks = -(-num_outputs // k)
    outs = jnp.where(jnp.arange(blocks * k) < num_outputs, jnp.arange(blocks * k), -1).reshape(blocks, k)

    def block(Xc, oc):
        J = _jacobian_block(fn, params, Xc, oc)  # (b, k, P)
        rows = J.reshape(-1, P)
        if output_covariance:
            return jnp.einsum("bop,bqp->boq", J, cov.mm(rows.T).T.reshape(J.shape))
        exact = _quadratic_rows(post, rows)  # the structure's own form (e.g. low rank without cancellation)
        if exact is None:
            exact = jnp.sum(rows * cov.mm(rows.T).T, axis=1)
        return exact.reshape(J.shape[:2])

    def chunk(Xc):
        if blocks == 1:
            return block(Xc, outs[0])
        values = jax.lax.map(lambda oc: block(Xc, oc), outs)  # (blocks, b, k)
        return jnp.moveaxis(values, 0, 1).reshape(Xc.shape[0], blocks * k)[:, :num_outputs]

    return batched_map(chunk, inputs, b, progress)


_row_values_jit = program(_row_values)


_DRAW_BLOCK = 10
"""Draws per compiled program in a projected posterior's sampled predictive: the programs' shapes do not depend
on how many draws there are (the adaptive trace estimate's count depends on the values)."""


def _sampled(post, inputs, key, num_samples, full_covariance, output_covariance):
    r"""The linearised predictive of a posterior from linearised samples $J(x)\,\delta_s$ (JVPs): its fit's draws,
    topped up with fresh ones from ``key`` when ``num_samples`` asks for more (`ProjectedPosterior.draws`). The
    mean is known (zero offsets), so the second moment is an unbiased estimate of $J \Sigma J^\top$.

    The draws go through one compiled program in blocks of ``_DRAW_BLOCK``, each block's weighted moment summed,
    so that a refit whose trace estimate stopped at another number of probes compiles nothing new; the fit's
    draws are sliced on the host (an eager slice would compile a program for each number of them)."""
    if post.trace_draws is None and key is None:
        raise ValueError(f"linearized: a {type(post).__name__}'s predictive is estimated from linearised samples "
                         "(its exact variance would project every Jacobian row): pass key=jax.random.key(...) "
                         "(and num_samples), build it with prior_precision='optimal' (its trace draws are "
                         "samples), or pass exact=True")
    mode = "full" if full_covariance else "outputs" if output_covariance else "variances"
    used, fresh = post._draw_parts(num_samples, key, f"{type(post).__name__}.draws")
    n = used + (0 if fresh is None else fresh.shape[0])
    dtype = np.dtype(post.mean.dtype)
    traced = any(isinstance(a, jax.core.Tracer) for a in (post.trace_draws, post.prior_precision, fresh))
    parts = []  # (offsets (b, P), weight): the moment of J(x) offsets, times weight
    if traced:  # inside a trace the counts are static: all at once
        parts.append((post._joined_draws(used, fresh), jnp.asarray(1.0 / n, dtype)))
    else:  # sliced on the host, each block moved with jax.device_put
        if used:  # the fit's projected probes, each to be scaled by alpha^-1/2: the weight carries 1 / alpha
            parts += _host_blocks(np.asarray(post.trace_draws).T[:used], 1.0 / (n * float(post.prior_precision)),
                                  dtype)
        if fresh is not None:  # asked for beyond the fit's draws: projected now (their own programs)
            parts += _host_blocks(np.asarray(fresh), 1.0 / n, dtype)
    total = None
    for offsets, weight in parts:
        moment = _offset_moment(post.fn, post.params, post.unravel, offsets, weight, inputs, mode)
        total = moment if total is None else total + moment
    return total


def _host_blocks(offsets, weight, dtype):
    """``(block, weight)`` pairs of `_DRAW_BLOCK` rows of the host array ``offsets``, moved with `jax.device_put`."""
    weight = jax.device_put(np.asarray(weight, dtype))
    return [(jax.device_put(np.ascontiguousarray(offsets[i:i + _DRAW_BLOCK])), weight)
            for i in range(0, offsets.shape[0], _DRAW_BLOCK)]


@program
def _offset_moment(fn, params, unravel, deltas, weight, inputs, mode):
    r"""``weight`` times the second moment of $J(x)\,\delta$ over the rows of ``deltas``: summed variances
    ``(M, O)``, output covariances ``(M, O, O)`` (``mode="outputs"``) or the ``(M O, M O)`` covariance
    (``"full"``); inputs mapped in chunks."""
    def chunk(Xc):
        f = lambda p: jax.vmap(fn, in_axes=(None, 0))(p, Xc)  # noqa: E731
        offsets = jax.vmap(lambda d: jax.jvp(f, (params,), (unravel(d),))[1])(deltas)  # (n, b, O)
        return jnp.moveaxis(offsets, 0, 1)

    offsets = jnp.moveaxis(batched_map(chunk, inputs, max(1, min(inputs.shape[0], 64))), 0, 1)  # (n, M, O)
    if mode == "full":
        flat = offsets.reshape(offsets.shape[0], -1)
        return weight * (flat.T @ flat)
    if mode == "outputs":
        return weight * jnp.einsum("nmo,nmq->moq", offsets, offsets)
    return weight * jnp.sum(offsets**2, axis=0)


def linearized(post: GaussianPosterior, inputs, *, full_covariance: bool = False, output_covariance: bool = False,
               batch_size: int | None = None, key: jax.Array | None = None, num_samples: int | None = None,
               exact: bool = False, progress: bool = True):
    r"""The linearised predictive: mean $f(\theta^*, x)$ and variance $\operatorname{diag} J\Sigma J^\top$.

    The variances never hold the ``M O x P`` test Jacobian: its rows come in chunks of inputs (and,
    with many outputs, blocks of outputs) of about `ROW_BUDGET` numbers, mapped by one compiled
    program; each chunk goes through the posterior's own form (a Laplace structure's
    ``quadratic_rows``, else the covariance's product). A projected posterior (whose exact product
    projects every row) is estimated from linearised samples by JVPs unless ``exact=True``: by default the
    fit's projected trace probes (no projection here), topped up with fresh samples from ``key`` when
    ``num_samples`` asks for more (`ProjectedPosterior.draws`: each fresh one is projected).

    Args:
        post: any `GaussianPosterior` whose covariance is an operator (a low-rank one uses
            its exact factor).
        inputs: ``(M, ...)`` inputs.
        full_covariance: the ``(M O, M O)`` covariance across every input and output
            (example-major), the Laplace tangent kernel, instead of the variances.
        output_covariance: the ``(M, O, O)`` covariance between the outputs of each input
            instead of the variances.
        batch_size: inputs per chunk of Jacobian rows (default: chunks of about `ROW_BUDGET` numbers).
        key: a projected posterior's key for fresh predictive samples, used only when ``num_samples`` asks for
            more than its fit made (or it made none).
        num_samples: a projected posterior's number of samples (default: the fit's draws; 100 without them).
        exact: a projected posterior's exact predictive (one projection per Jacobian row).
        progress: a progress bar over the chunks of test inputs on stderr (the variances of a
            Laplace-family posterior), shown once they take longer than two seconds; False silences it.

    Returns:
        ``(mean (M, O), variance (M, O))``, or the covariances asked for in place of the variances. A model whose
        output has a position axis (``(T, V)`` per example, `posteriors.laplace`) gives ``(M, T, V)`` for each
        ``(M, O)``, ``(M, T, V, T, V)`` output covariances and an ``(M, T, V, M, T, V)`` full covariance.

    Examples:
        >>> import jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> post = pst.laplace(lambda w, x: (x @ w)[None], jnp.zeros(1), (jnp.ones((3, 1)), jnp.zeros((3, 1))),
        ...                    Gaussian(1.0), structure="diag", prior_precision=1.0)
        >>> pst.predictive.linearized(post, jnp.array([[2.0]]))[1]     # 2^2 / (3 + 1)
        Array([[1.]], dtype=float32)
    """
    _no_linearisation(post, "linearized")
    return _program(post, _linearized_shaped)(post, inputs, full_covariance, output_covariance, batch_size, key,
                                              num_samples, exact, progress)


def _program(post, body):
    """``body`` compiled as one program (cached per posterior structure, model, shapes and options: a second
    call on new values of the same shapes compiles nothing), where the posterior allows: a Laplace-family
    posterior of a built-in structure (a subnetwork's concrete indices become static data,
    `posteriors.weights.Weights.fit_form`: one program per index set). A custom structure may need concrete
    values, and the other posteriors run eagerly (their own programs are compiled)."""
    if isinstance(post, LaplacePosterior) and post.ggn.compile_fit:
        static = post.weights.fit_form()
        if static is post.weights:
            return _COMPILED[body]
        return lambda p, *args: _COMPILED[body](eqx.tree_at(lambda q: q.weights, p, static), *args)
    return body


def _linearized(post, inputs, full_covariance, output_covariance, batch_size, key, num_samples, exact, progress):
    M, num_outputs = post._output_spec(inputs).shape  # bad inputs refused before any work
    label = "linearized predictive" if progress else None
    layer_rules = isinstance(post, LaplacePosterior) and post.weights.indices is None
    if layer_rules and not (full_covariance or output_covariance):
        # the structure's per-layer forms of activations and output gradients (KFAC, diagonal): no Jacobian row,
        # and the means from the same forward passes
        P = unravel_of(post.params).size
        moments = post.ggn.output_moments(post, inputs, batch_size or max(1, ROW_BUDGET // max(num_outputs * P, 1)),
                                          label)
        if moments is not None:
            return moments
    mean = post.map_outputs(inputs)
    if isinstance(post, AbstractLowRankPosterior):
        if full_covariance:
            return mean, post.predictive_covariance(inputs).as_matrix()
        if output_covariance:
            JS = post.output_factor(inputs).reshape(mean.shape + (-1,))
            return mean, jnp.einsum("mor,mqr->moq", JS, JS)
        return post.predictive(inputs)
    if isinstance(post, ProjectedPosterior) and not exact:
        return mean, _sampled(post, inputs, key, num_samples, full_covariance, output_covariance)
    fn, params, cov = _parts(post)
    P = unravel_of(params).size
    # A subnetwork's rows come from reverse passes through the whole model: each row is a full-length
    # gradient before its subset is taken, so its chunks are planned with the model's P, not the subset's.
    planned = unravel_of(post.params).size if _restricted_by_index(post) else P
    if full_covariance:
        rows = M * num_outputs
        check_fits((rows * P + rows**2) * np.dtype(mean.dtype).itemsize,
                   f"the full predictive covariance of {M} inputs x {num_outputs} outputs",
                   "ask for the variances instead")
        J = _jacobian_rows(fn, params, inputs)
        return mean, J @ cov.mm(J.T)
    if output_covariance:
        check_fits((M * num_outputs**2 + num_outputs * P * 3) * np.dtype(mean.dtype).itemsize,
                   f"the output covariances of {M} inputs x {num_outputs} outputs", "ask for the variances instead")
    b, k = _plan(M, num_outputs, planned, batch_size, output_covariance)
    return mean, _row_values_jit(post, inputs, b, k, output_covariance, label)  # inside the caller's program


def _linearized_shaped(post, inputs, full_covariance, output_covariance, *args):
    """`_linearized` with a position axis restored: every output axis of length ``T V`` back to ``(T, V)``."""
    mean, second = _linearized(post, inputs, full_covariance, output_covariance, *args)
    shape = _output_shape(post)
    axes = (1, 3) if full_covariance else (1, 2) if output_covariance else (1,)
    if full_covariance and shape is not None:
        M = mean.shape[0]
        second = second.reshape(M, -1, M, second.shape[1] // M)
    return _shaped(shape, mean, 1), _shaped(shape, second, *axes)


def _no_linearisation(post, who):
    if isinstance(post, DeepEnsemble):
        raise TypeError(f"{who}: a DeepEnsemble has no linearisation (it is a mixture of {post.num_members} networks, "
                        "not a Gaussian around one): use classification(ens, x), regression(ens, x) or "
                        "monte_carlo(ens, key, x, n, linearized=False)")


def _restricted_by_index(post):
    """A posterior over flat parameter indices (a subnetwork): its rows pass through whole leaves."""
    return isinstance(post, LaplacePosterior) and post.weights.restricts_by_index


def monte_carlo(post: GaussianPosterior, key: jax.Array, inputs, num_samples: int, *, linearized: bool = True):
    """Output samples, shape ``(num_samples, M, O)`` (``(num_samples, M, T, V)`` for a model with a position
    axis): of the linearised model, or (``linearized=False``)
    of the network itself at parameter samples (the paper's predictive for SWAG, and for last-layer and
    diagonal Laplace in the projected-Bayes paper). A `DeepEnsemble` (no linearisation) needs
    ``linearized=False``: its samples are members drawn at random.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> post = pst.laplace(lambda w, x: jnp.tanh(x @ w)[None], jnp.zeros(1), (jnp.ones((3, 1)), jnp.zeros((3, 1))),
        ...                    Gaussian(1.0), structure="diag")
        >>> pst.predictive.monte_carlo(post, jax.random.key(0), jnp.ones((5, 1)), 4, linearized=False).shape
        (4, 5, 1)
    """
    if linearized:
        _no_linearisation(post, "monte_carlo")
        return _shaped(_output_shape(post), post.predictive_samples(key, inputs, num_samples), 2)
    thetas = post.sample(key, num_samples)
    outputs = jax.vmap(lambda t: jax.vmap(post.fn, in_axes=(None, 0))(post.unravel(t), inputs))(thetas)
    return _shaped(_output_shape(post), outputs, 2)


def sampled_variances(post: GaussianPosterior, key: jax.Array, inputs, num_samples: int = 100) -> lo.Estimate:
    r"""The linearised predictive's variances $\operatorname{diag} J\Sigma J^\top$, ``(M, O)`` (``(M, T, V)`` with a
    position axis), estimated from
    ``num_samples`` linearised samples $J(x)\,\delta_s$, $\delta_s \sim \mathcal N(0, \Sigma)$, as a
    `linops.Estimate` with each entry's standard error.

    Each sample costs one JVP per input, whatever the number of outputs: over a vocabulary of thousands of
    outputs it costs what ten classes cost, where the exact path (`linearized`) takes one reverse pass per
    output. The offsets' mean is known (zero), so the mean of their squares is unbiased for the variance; its
    standard error is the squares' spread over $\sqrt{n}$. Needs a posterior with samples (not a
    ``"sketched"`` Laplace posterior, nor a `DeepEnsemble`, which has no linearisation).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> fn = lambda W, x: x @ W                                   # 300 outputs
        >>> post = pst.laplace(fn, jnp.zeros((3, 300)), (jnp.eye(3), jnp.zeros((3, 300))), Gaussian(1.0),
        ...                    structure="diag")
        >>> est = pst.predictive.sampled_variances(post, jax.random.key(0), jnp.ones((1, 3)), 2000)
        >>> exact = pst.predictive.linearized(post, jnp.ones((1, 3)))[1]     # 3 x (1 + 1)^-1 = 1.5 each
        >>> est.value.shape, bool(jnp.all(jnp.abs(est.value - exact) < 5 * est.standard_error))
        ((1, 300), True)
    """
    _no_linearisation(post, "sampled_variances")
    num_samples = positive_int(num_samples, "num_samples", "sampled_variances", minimum=2)
    if key is None:
        raise ValueError("sampled_variances: the estimate draws posterior samples: pass key=jax.random.key(...)")
    M, _ = model_outputs(post.fn, post.params, inputs, "sampled_variances")  # shapes only, before any work
    value, se = _sampled_moments(post, key, inputs, num_samples, max(1, min(M, SAMPLED_CHUNK)))
    shape = _output_shape(post)  # a position axis: (M, T, V)
    return lo.Estimate(_shaped(shape, value, 1), _shaped(shape, se, 1), num_samples)


SAMPLED_CHUNK = 8
"""Inputs per chunk of `sampled_variances`: one JVP of a chunk per sample, the samples one after another."""


@program
def _sampled_moments(post, key, inputs, num_samples, chunk_size):
    r"""The mean of the squared offsets $J(x)\,\delta_s$ over the samples and its standard error, ``(M, O)`` each:
    inputs in chunks, one sample's JVP of a chunk at a time (memory: a chunk's forward pass and its ``n x O``
    offsets, never ``n x M`` passes at once). A Laplace posterior draws its samples over its own weights (an
    adapter's, a last layer's) and differentiates those alone."""
    if isinstance(post, LaplacePosterior):
        fn, params, _ = post.own_space()
        deltas = post.ggn.sample(key, num_samples, post.prior_precision, post.noise_scale, post.factor).T
    else:
        fn, params = post.fn, post.params
        deltas = post.sample(key, num_samples) - post.mean[None, :]
    unravel = unravel_of(params)

    def chunk(Xc):
        f = lambda p: jax.vmap(fn, in_axes=(None, 0))(p, Xc)  # noqa: E731
        squares = jax.lax.map(lambda d: jax.jvp(f, (params,), (unravel(d),))[1] ** 2, deltas)  # (n, b, O)
        return jnp.mean(squares, axis=0), jnp.std(squares, axis=0, ddof=1) / np.sqrt(num_samples)

    return batched_map(chunk, inputs, chunk_size)


def probit(mean, variance, *, multiclass: bool = True):
    r"""The probit approximation: $\operatorname{softmax}(\mu / \sqrt{1 + \pi\sigma^2/8})$ (or the sigmoid).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.predictive import probit
        >>> p = probit(jnp.array([[2.0, 0.0]]), jnp.array([[0.0, 0.0]]))   # no variance: the softmax
        >>> round(float(p[0, 0]), 4), round(float(p[0, 1]), 4)
        (0.8808, 0.1192)
    """
    kappa = 1.0 / jnp.sqrt(1.0 + jnp.pi / 8.0 * variance)
    return jax.nn.softmax(kappa * mean, axis=-1) if multiclass else jax.nn.sigmoid(kappa * mean)


def laplace_bridge(mean, covariance):
    r"""Expected class probabilities of the Laplace bridge (Hobbhahn, Kristiadi, Hennig 2022).

    The Gaussian over the ``K`` logits is first conditioned on $\sum_k f_k = 0$ (the bridge
    assumes logits that sum to zero): $\mu \leftarrow \mu - \Sigma\mathbf 1\,
    (\mathbf 1^\top\mu)/(\mathbf 1^\top\Sigma\mathbf 1)$,
    $\Sigma \leftarrow \Sigma - \Sigma\mathbf 1\mathbf 1^\top\Sigma/(\mathbf 1^\top\Sigma\mathbf 1)$;
    then it is mapped to a Dirichlet with
    $\alpha_k = \Sigma_{kk}^{-1}\,(1 - 2/K + e^{\mu_k} K^{-2} \sum_l e^{-\mu_l})$, whose mean
    $\alpha_k / \sum_l \alpha_l$ is returned, shape ``(M, K)``. Computed in log space (a log-sum-exp
    for $\sum_l e^{-\mu_l}$, a softmax for the normalisation), so logits of any size give finite
    probabilities that sum to one.

    Args:
        mean: ``(M, K)`` logit means.
        covariance: ``(M, K, K)`` logit covariances (`linearized` with ``output_covariance=True``),
            or ``(M, K)`` variances (a diagonal covariance).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.predictive import laplace_bridge
        >>> laplace_bridge(jnp.zeros((1, 2)), jnp.ones((1, 2)))       # symmetric: one half each
        Array([[0.5, 0.5]], dtype=float32)
    """
    K = mean.shape[-1]
    if covariance.ndim == 2:
        covariance = jax.vmap(jnp.diag)(covariance)
    s = jnp.sum(covariance, axis=-1)  # Sigma 1
    total = jnp.sum(s, axis=-1, keepdims=True)  # 1^T Sigma 1
    mean = mean - s * jnp.sum(mean, axis=-1, keepdims=True) / total
    var = jnp.diagonal(covariance, axis1=-2, axis2=-1) - s**2 / total
    if K == 1:  # one class: probability one (its variance is zero once the logits sum to zero)
        return jnp.ones_like(mean)
    log_a = np.log(1.0 - 2.0 / K) if K > 2 else -np.inf  # 1 - 2/K, zero for two classes
    log_tail = mean + jax.nn.logsumexp(-mean, axis=-1, keepdims=True) - 2.0 * np.log(K)
    log_alpha = jnp.logaddexp(log_a, log_tail) - jnp.log(jnp.maximum(var, jnp.finfo(var.dtype).tiny))
    return jax.nn.softmax(log_alpha, axis=-1)


def classification(post: GaussianPosterior, inputs, *, link: str = "probit", key: jax.Array | None = None,
                   num_samples: int | None = None, linearized_samples: bool = True, progress: bool = True):
    """Class probabilities ``(M, K)``: ``link`` is ``"probit"``, ``"bridge"`` or ``"mc"`` (needs ``key``;
    ``num_samples`` of them, default 100). A model with a position axis (``(T, V)`` logits per example,
    `posteriors.laplace`) gives ``(M, T, V)``: each position's distribution (the bridge from each position's
    ``V x V`` block). ``progress``: `linearized`'s progress bar (False silences it). A
    projected posterior's probit and bridge use its fit's draws, topped up from ``key`` to ``num_samples``
    (`linearized`).

    A single-output model is read as a Bernoulli logit (probabilities of class 1, ``(M, 1)``). A
    `DeepEnsemble` returns its exact predictive, the members' mean probabilities, for ``"probit"`` (the
    default) and ``"mc"`` alike (``key`` is not needed); ``"bridge"`` is refused.

    Examples:
        >>> import jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Categorical
        >>> fn = lambda w, x: x @ w
        >>> post = pst.laplace(fn, jnp.zeros((1, 2)), (jnp.ones((4, 1)), jnp.array([0, 1, 0, 1])),
        ...                    Categorical(), structure="diag")
        >>> pst.predictive.classification(post, jnp.ones((1, 1)))
        Array([[0.5, 0.5]], dtype=float32)
    """
    if link not in ("probit", "bridge", "mc"):
        raise ValueError(f"classification: link must be 'probit', 'bridge' or 'mc', got {link!r}")
    if isinstance(post, DeepEnsemble):
        if link == "bridge":
            raise ValueError("classification(link='bridge'): a DeepEnsemble is no Gaussian over the logits; its "
                             "predictive is the members' mean probabilities (link='probit' or 'mc')")
        return post.classification(inputs)
    if link == "mc":
        if key is None:
            raise ValueError("classification(link='mc'): pass key=jax.random.key(...)")
        logits = monte_carlo(post, key, inputs, 100 if num_samples is None else num_samples,
                             linearized=linearized_samples)  # (n, M, O), or (n, M, T, V) with a position axis
        if logits.shape[-1] == 1:
            return jnp.mean(jax.nn.sigmoid(logits), axis=0)
        return jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)
    _no_linearisation(post, "classification")
    return _program(post, _classification)(post, inputs, link, key, num_samples, progress)


def _classification(post, inputs, link, key, num_samples, progress):
    sampled = (key, num_samples) if isinstance(post, ProjectedPosterior) else (None, None)
    shape = _output_shape(post)
    if link == "bridge":
        width = shape[-1] if shape is not None else model_outputs(post.fn, post.params, inputs, "classification")[1]
        if width == 1:
            raise ValueError("classification(link='bridge'): the Laplace bridge needs K >= 2 logits, got 1")
        mean, cov = _linearized(post, inputs, False, True, None, *sampled, False, progress)
        if shape is None:
            return laplace_bridge(mean, cov)
        M, T, V = mean.shape[0], int(np.prod(shape[:-1])), shape[-1]
        blocks = cov.reshape(M, T, V, T, V)[:, jnp.arange(T), :, jnp.arange(T), :]  # (T, M, V, V): each position's
        probs = laplace_bridge(mean.reshape(M * T, V), jnp.moveaxis(blocks, 0, 1).reshape(M * T, V, V))
        return probs.reshape((M,) + tuple(shape))
    mean, var = _linearized(post, inputs, False, False, None, *sampled, False, progress)
    mean, var = _shaped(shape, mean, 1), _shaped(shape, var, 1)
    return _probit(mean, var, multiclass=mean.shape[-1] > 1)


def regression(post: GaussianPosterior, inputs, *, sigma=None, progress: bool = True):
    """The Gaussian predictive of a regression: ``(mean, variance)`` with the observation noise
    $\\sigma^2$ added (``sigma`` default: the posterior's Gaussian likelihood's); a `DeepEnsemble`'s is its
    mixture's mean and variance. ``progress``: `linearized`'s progress bar (False silences it).

    For a `linops.likelihoods.HeteroscedasticGaussian` (the network outputs means $\\mu$ and log-variances $s$),
    the moments of the predictive: the mean $\\mu$ and the variance $\\operatorname{Var}[\\mu] + \\exp(s +
    \\operatorname{Var}[s]/2)$ from the linearised ``(mean, variance)`` of both heads (``(M, O)`` each).

    Examples:
        >>> import jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> post = pst.laplace(lambda w, x: (x @ w)[None], jnp.zeros(1), (jnp.ones((3, 1)), jnp.zeros((3, 1))),
        ...                    Gaussian(0.5), structure="full", prior_precision=4.0)
        >>> pst.predictive.regression(post, jnp.ones((1, 1)))[1]        # 1/(12 + 4) + 0.25
        Array([[0.3125]], dtype=float32)
    """
    lik = _likelihood(post)
    if isinstance(lik, HeteroscedasticGaussian):
        if sigma is not None:
            raise ValueError("regression: a HeteroscedasticGaussian posterior's network predicts its noise; "
                             "sigma must be None")
        _no_linearisation(post, "regression")
        return _program(post, _heteroscedastic)(post, inputs, progress)
    if sigma is None:
        if not isinstance(lik, Gaussian) or lik.heteroscedastic:
            raise ValueError("regression: the posterior has no homoscedastic Gaussian likelihood; pass sigma=...")
        sigma = lik.sigma
    if isinstance(post, DeepEnsemble):
        return post.regression(inputs, sigma)
    _no_linearisation(post, "regression")
    if not isinstance(sigma, jax.Array):  # an array is data, not part of the compiled program's key
        sigma = jax.device_put(np.asarray(sigma, unravel_of(post.params).dtype))
    return _program(post, _regression)(post, inputs, sigma, progress)


def _regression(post, inputs, sigma, progress):
    mean, var = _linearized(post, inputs, False, False, None, None, None, False, progress)
    shape = _output_shape(post)
    return _shaped(shape, mean, 1), _shaped(shape, var, 1) + jnp.asarray(sigma) ** 2


def _heteroscedastic(post, inputs, progress):
    """Mean $\\mu$ and variance $\\operatorname{Var}[\\mu] + \\mathbb E[e^s]$, $s \\sim \\mathcal N(s^*,
    \\operatorname{Var}[s])$ linearised: the predictive's moments (its noise is log-normal, not fixed)."""
    mean, var = _linearized(post, inputs, False, False, None, None, None, False, progress)
    shape = _output_shape(post)  # a position axis: each position's means, then log-variances
    mean, var = _shaped(shape, mean, 1), _shaped(shape, var, 1)
    o = mean.shape[-1] // 2
    return mean[..., :o], var[..., :o] + jnp.exp(mean[..., o:] + var[..., o:] / 2)


_probit = program(probit)  # one program where the caller runs eagerly (a projected posterior's predictive)
_COMPILED = {body: program(body) for body in (_linearized_shaped, _classification, _regression, _heteroscedastic)}


def nll(post: GaussianPosterior, inputs, targets, *, link: str = "probit", key: jax.Array | None = None,
        num_samples: int | None = None, progress: bool = True) -> jax.Array:
    """The predictive negative log-likelihood of ``(inputs, targets)``, summed: Gaussian for a
    Gaussian likelihood, else the classification probabilities (``link``). With a position axis (``(T, V)``
    outputs), summed over positions too: the targets are the fit's (``(M, T)`` labels).

    Examples:
        >>> import jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> post = pst.laplace(lambda w, x: (x @ w)[None], jnp.zeros(1), (jnp.ones((3, 1)), jnp.zeros((3, 1))),
        ...                    Gaussian(1.0), structure="diag")
        >>> bool(pst.predictive.nll(post, jnp.ones((2, 1)), jnp.zeros((2, 1))) > 0)
        True
    """
    if _output_shape(post) is not None:
        return _nll_positions(post, inputs, targets, link, key, num_samples, progress)
    lik = getattr(post, "likelihood", None)
    targets = _checked_nll_targets(post, inputs, targets, lik)
    if isinstance(lik, Gaussian | HeteroscedasticGaussian):  # the Gaussian of the predictive's moments
        mean, var = regression(post, inputs, progress=progress)
        return 0.5 * jnp.sum(jnp.log(2 * jnp.pi * var) + (targets - mean) ** 2 / var)
    probs = classification(post, inputs, link=link, key=key, num_samples=num_samples, progress=progress)
    tiny = jnp.finfo(probs.dtype).tiny
    if isinstance(lik, Bernoulli) or probs.shape[-1] == 1:
        return -jnp.sum(targets * jnp.log(probs + tiny) + (1 - targets) * jnp.log(1 - probs + tiny))
    if not isinstance(lik, (Categorical, type(None))):
        raise ValueError(f"nll: no predictive for a {type(lik).__name__} likelihood")
    return -jnp.sum(jnp.log(jnp.take_along_axis(probs, targets[:, None], axis=1) + tiny))


def _nll_positions(post, inputs, targets, link, key, num_samples, progress):
    """`nll` of a model with a position axis: summed over inputs and positions (targets as the fit's:
    ``(M, T)`` labels, or ``(M, T, V)`` values)."""
    lik, shape = post.likelihood, _output_shape(post)
    M = model_outputs(post.fn, post.params, inputs, "nll")[0]
    targets = jnp.asarray(targets)
    lik.check(int(np.prod(shape)), targets, M, "nll")
    if isinstance(lik.base, Gaussian | HeteroscedasticGaussian):
        mean, var = regression(post, inputs, progress=progress)
        return 0.5 * jnp.sum(jnp.log(2 * jnp.pi * var) + (targets - mean) ** 2 / var)
    probs = classification(post, inputs, link=link, key=key, num_samples=num_samples, progress=progress)
    tiny = jnp.finfo(probs.dtype).tiny
    if isinstance(lik.base, Bernoulli):
        return -jnp.sum(targets * jnp.log(probs + tiny) + (1 - targets) * jnp.log(1 - probs + tiny))
    if not isinstance(lik.base, Categorical):
        raise ValueError(f"nll: no predictive for a {type(lik.base).__name__} likelihood")
    return -jnp.sum(jnp.log(jnp.take_along_axis(probs, targets[..., None], axis=-1) + tiny))


def _checked_nll_targets(post, inputs, targets, lik):
    """``targets`` for `nll`, refused before any work unless they match the model's outputs: ``(M, O)`` real values
    for a Gaussian likelihood (no broadcasting), ``(M,)`` or ``(M, 1)`` zeros and ones for one output (a Bernoulli
    logit, returned as ``(M, 1)``), else ``(M,)`` integer labels in ``[0, O)``."""
    M, K = model_outputs(post.fn, post.params, inputs, "nll")
    targets = jnp.asarray(targets)
    if isinstance(lik, HeteroscedasticGaussian):
        K = K // 2  # means, then log-variances
    if isinstance(lik, Gaussian | HeteroscedasticGaussian):
        if targets.shape != (M, K) or not jnp.issubdtype(targets.dtype, jnp.number):
            raise ValueError(f"nll: a Gaussian likelihood needs real targets of shape ({M}, {K}), one per output of "
                             f"each input (no broadcasting), got {targets.dtype}{targets.shape}")
        return targets
    concrete = not isinstance(targets, jax.core.Tracer)
    if isinstance(lik, Bernoulli) or K == 1:
        if targets.shape not in ((M,), (M, 1)):
            raise ValueError(f"nll: a single-output (Bernoulli) model needs targets of shape ({M},) or ({M}, 1), "
                             f"got {targets.shape}")
        if concrete and not bool(np.all(np.isin(np.asarray(targets), (0, 1)))):
            raise ValueError("nll: a single-output (Bernoulli) model needs targets 0 or 1, got values "
                             f"{sorted(set(np.unique(np.asarray(targets)).tolist()) - {0, 1})[:5]}")
        return targets.reshape(M, 1)
    if not jnp.issubdtype(targets.dtype, jnp.integer) or targets.shape != (M,):
        raise ValueError(f"nll: classification needs integer labels of shape ({M},), one per input, got "
                         f"{targets.dtype}{targets.shape}")
    if concrete:
        low, high = int(np.min(np.asarray(targets))), int(np.max(np.asarray(targets)))
        if low < 0 or high >= K:
            raise ValueError(f"nll: labels must lie in [0, {K}) for a model with {K} outputs, got labels from "
                             f"{low} to {high}")
    return targets


__all__ = ["classification", "laplace_bridge", "linearized", "monte_carlo", "nll", "probit", "regression",
           "sampled_variances"]
