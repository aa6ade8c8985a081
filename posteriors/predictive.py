r"""Predictives of a Gaussian posterior over a network's parameters.

- `linearized`: the linearised model's mean $f(\theta^*, x)$ and variance (or full covariance
  across a batch: the Laplace tangent kernel $J(X)\Sigma J(X)^\top$), exactly;
- `monte_carlo`: samples of the outputs, of the linearised model or of the network itself;
- `probit` and `laplace_bridge`: class probabilities from a mean and a variance;
- `classification` and `regression`: the usual end products.

Example:
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

import jax
import jax.numpy as jnp
import numpy as np

from linops.likelihoods import Bernoulli, Categorical, Gaussian
from linops.memory import check_fits
from linops.models import ravel
from posteriors.gaussian import GaussianPosterior, LowRankPosterior
from posteriors.laplace_family import LaplacePosterior


def _parts(post):
    """``(fn, params, covariance)`` in the posterior's own parameter space (a last layer's alone)."""
    if hasattr(post, "own_space"):
        return post.own_space()
    return post.fn, post.params, post.covariance


def _jacobian_rows(fn, params, X):
    """``(M O, P)``: the rows of the stacked Jacobian, by per-example reverse passes."""
    def example(x):
        _, vjp = jax.vjp(lambda p: fn(p, x), params)
        k = jax.eval_shape(fn, params, x).shape[0]
        return jax.vmap(lambda e: ravel(vjp(e)[0])[0])(jnp.eye(k, dtype=ravel(params)[0].dtype))

    rows = jax.vmap(example)(X)
    return rows.reshape(-1, rows.shape[-1])


def _quadratic_rows(post, J):
    """``diag(J Σ Jᵀ)`` from a Laplace structure's own accurate form, or None. ``J``'s columns are the
    posterior's own parameters (a last layer's or a subnetwork's alone: `_parts`), those of its GGN."""
    if not isinstance(post, LaplacePosterior):
        return None
    return post.ggn.quadratic_rows(J, post.prior_precision, post.noise_scale, post.factor)


def _batches(X, batch_size):
    n = X.shape[0]
    return [X[i:i + batch_size] for i in range(0, n, batch_size)]


def linearized(post: GaussianPosterior, inputs, *, full_covariance: bool = False, output_covariance: bool = False,
               batch_size: int | None = None):
    r"""The linearised predictive: mean $f(\theta^*, x)$ and variance $\operatorname{diag} J\Sigma J^\top$.

    Args:
        post: any `GaussianPosterior` whose covariance is an operator (a low-rank one uses
            its exact factor).
        inputs: ``(M, ...)`` inputs.
        full_covariance: the ``(M O, M O)`` covariance across every input and output
            (example-major), the Laplace tangent kernel, instead of the variances.
        output_covariance: the ``(M, O, O)`` covariance between the outputs of each input
            instead of the variances.
        batch_size: inputs per batch of Jacobian rows (default: about $2^{25}$ numbers of rows).

    Returns:
        ``(mean (M, O), variance (M, O))``, or the covariances asked for in place of the variances.

    Example:
        >>> import jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> post = pst.laplace(lambda w, x: (x @ w)[None], jnp.zeros(1), (jnp.ones((3, 1)), jnp.zeros((3, 1))),
        ...                    Gaussian(1.0), structure="diag", prior_precision=1.0)
        >>> pst.predictive.linearized(post, jnp.array([[2.0]]))[1]     # 2^2 / (3 + 1)
        Array([[1.]], dtype=float32)
    """
    mean = post.map_outputs(inputs)
    if isinstance(post, LowRankPosterior):
        if full_covariance:
            return mean, post.predictive_covariance(inputs).as_matrix()
        if output_covariance:
            JS = post.output_factor(inputs).reshape(mean.shape + (-1,))
            return mean, jnp.einsum("mor,mqr->moq", JS, JS)
        return post.predictive(inputs)
    fn, params, cov = _parts(post)
    P = ravel(params)[0].shape[0]
    num_outputs = mean.shape[1]
    if batch_size is None:
        batch_size = max(1, (1 << 25) // max(num_outputs * P, 1))
    if full_covariance:
        M = inputs.shape[0]
        rows = M * num_outputs
        check_fits((rows * P + rows**2) * np.dtype(mean.dtype).itemsize,
                   f"the full predictive covariance of {M} inputs x {num_outputs} outputs",
                   "ask for the variances instead")
        J = _jacobian_rows(fn, params, inputs)
        return mean, J @ cov.mm(J.T)
    parts = []
    for Xb in _batches(inputs, batch_size):
        J = _jacobian_rows(fn, params, Xb)
        if not output_covariance and (exact := _quadratic_rows(post, J)) is not None:
            parts.append(exact)  # the structure's own form (e.g. low rank without cancellation)
            continue
        SJ = cov.mm(J.T).T  # rows of J Sigma
        if output_covariance:
            B = Xb.shape[0]
            parts.append(jnp.einsum("bop,bqp->boq", J.reshape(B, num_outputs, -1), SJ.reshape(B, num_outputs, -1)))
        else:
            parts.append(jnp.sum(J * SJ, axis=1))
    if output_covariance:
        return mean, jnp.concatenate(parts)
    return mean, jnp.concatenate(parts).reshape(mean.shape)


def monte_carlo(post: GaussianPosterior, key: jax.Array, inputs, num_samples: int, *, linearized: bool = True):
    """Output samples, shape ``(num_samples, M, O)``: of the linearised model, or (``linearized=False``)
    of the network itself at parameter samples.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> post = pst.laplace(lambda w, x: jnp.tanh(x @ w)[None], jnp.zeros(1), (jnp.ones((3, 1)), jnp.zeros((3, 1))),
        ...                    Gaussian(1.0), structure="diag")
        >>> pst.predictive.monte_carlo(post, jax.random.key(0), jnp.ones((5, 1)), 4, linearized=False).shape
        (4, 5, 1)
    """
    if linearized:
        return post.predictive_samples(key, inputs, num_samples)
    thetas = post.sample(key, num_samples)
    return jax.vmap(lambda t: jax.vmap(post.fn, in_axes=(None, 0))(post.unravel(t), inputs))(thetas)


def probit(mean, variance, *, multiclass: bool = True):
    r"""The probit approximation: $\operatorname{softmax}(\mu / \sqrt{1 + \pi\sigma^2/8})$ (or the sigmoid).

    Example:
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
    $\alpha_k / \sum_l \alpha_l$ is returned, shape ``(M, K)``.

    Args:
        mean: ``(M, K)`` logit means.
        covariance: ``(M, K, K)`` logit covariances (`linearized` with ``output_covariance=True``),
            or ``(M, K)`` variances (a diagonal covariance).

    Example:
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
    alpha = (1.0 - 2.0 / K + jnp.exp(mean) / K**2 * jnp.sum(jnp.exp(-mean), axis=-1, keepdims=True)) / var
    return alpha / jnp.sum(alpha, axis=-1, keepdims=True)


def classification(post: GaussianPosterior, inputs, *, link: str = "probit", key: jax.Array | None = None,
                   num_samples: int = 100, linearized_samples: bool = True):
    """Class probabilities ``(M, K)``: ``link`` is ``"probit"``, ``"bridge"`` or ``"mc"`` (needs ``key``).

    A single-output model is read as a Bernoulli logit (probabilities of class 1, ``(M, 1)``).

    Example:
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
    if link == "mc":
        if key is None:
            raise ValueError("classification(link='mc'): pass key=jax.random.key(...)")
        logits = monte_carlo(post, key, inputs, num_samples, linearized=linearized_samples)
        if logits.shape[-1] == 1:
            return jnp.mean(jax.nn.sigmoid(logits), axis=0)
        return jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)
    if link == "bridge":
        mean, cov = linearized(post, inputs, output_covariance=True)
        if mean.shape[-1] == 1:
            raise ValueError("classification(link='bridge'): the Laplace bridge needs K >= 2 logits")
        return laplace_bridge(mean, cov)
    mean, var = linearized(post, inputs)
    return probit(mean, var, multiclass=mean.shape[-1] > 1)


def regression(post: GaussianPosterior, inputs, *, sigma=None):
    """The Gaussian predictive of a regression: ``(mean, variance)`` with the observation noise
    $\\sigma^2$ added (``sigma`` default: the posterior's Gaussian likelihood's).

    Example:
        >>> import jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> post = pst.laplace(lambda w, x: (x @ w)[None], jnp.zeros(1), (jnp.ones((3, 1)), jnp.zeros((3, 1))),
        ...                    Gaussian(0.5), structure="full", prior_precision=4.0)
        >>> pst.predictive.regression(post, jnp.ones((1, 1)))[1]        # 1/(12 + 4) + 0.25
        Array([[0.3125]], dtype=float32)
    """
    if sigma is None:
        lik = getattr(post, "likelihood", None)
        if not isinstance(lik, Gaussian) or lik.heteroscedastic:
            raise ValueError("regression: the posterior has no homoscedastic Gaussian likelihood; pass sigma=...")
        sigma = lik.sigma
    mean, var = linearized(post, inputs)
    return mean, var + jnp.asarray(sigma) ** 2


def nll(post: GaussianPosterior, inputs, targets, *, link: str = "probit", key: jax.Array | None = None,
        num_samples: int = 100) -> jax.Array:
    """The predictive negative log-likelihood of ``(inputs, targets)``, summed: Gaussian for a
    Gaussian likelihood, else the classification probabilities (``link``).

    Example:
        >>> import jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> post = pst.laplace(lambda w, x: (x @ w)[None], jnp.zeros(1), (jnp.ones((3, 1)), jnp.zeros((3, 1))),
        ...                    Gaussian(1.0), structure="diag")
        >>> bool(pst.predictive.nll(post, jnp.ones((2, 1)), jnp.zeros((2, 1))) > 0)
        True
    """
    lik = getattr(post, "likelihood", None)
    if isinstance(lik, Gaussian):
        mean, var = regression(post, inputs)
        return 0.5 * jnp.sum(jnp.log(2 * jnp.pi * var) + (targets - mean) ** 2 / var)
    probs = classification(post, inputs, link=link, key=key, num_samples=num_samples)
    tiny = jnp.finfo(probs.dtype).tiny
    if isinstance(lik, Bernoulli) or probs.shape[-1] == 1:
        return -jnp.sum(targets * jnp.log(probs + tiny) + (1 - targets) * jnp.log(1 - probs + tiny))
    if not isinstance(lik, (Categorical, type(None))):
        raise ValueError(f"nll: no predictive for a {type(lik).__name__} likelihood")
    return -jnp.sum(jnp.log(jnp.take_along_axis(probs, targets[:, None], axis=1) + tiny))


__all__ = ["classification", "laplace_bridge", "linearized", "monte_carlo", "nll", "probit", "regression"]
