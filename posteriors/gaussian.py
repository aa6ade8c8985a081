r"""The interface every posterior shares: a Gaussian $\mathcal N(\theta^*, \Sigma)$ over flat parameters.

A posterior holds the per-example model ``fn(params, x) -> (O,)``, the MAP params pytree
$\theta^*$ and the way back from flat vectors (``unravel``). Subclasses give the covariance
as a `linops` operator and a sampler; the linearised predictive
$f(\theta^*, x) + J(x)(\theta - \theta^*)$ is shared.

Examples:
    >>> import jax, jax.numpy as jnp, linops as lo
    >>> from posteriors.gaussian import LowRankPosterior
    >>> fn = lambda w, x: (x @ w)[None]
    >>> post = LowRankPosterior(fn, jnp.zeros(2), jnp.array([[1.0], [0.0]]))   # Sigma = e1 e1^T (d = 1)
    >>> mean, var = post.predictive(jnp.array([[2.0, 5.0]]))
    >>> var                                                                   # J Sigma J^T = 2^2
    Array([[4.]], dtype=float32)
"""


import abc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from equinox import AbstractVar

import linops as lo
from linops.models import example_spec, ravel
from linops.runtime import flat_draw, program
from posteriors._training import positive_int


@program
def _batched_outputs(fn, params, inputs):
    """``fn`` on every input, as one program per model and shapes."""
    return jax.vmap(fn, in_axes=(None, 0))(params, inputs)


class GaussianPosterior(eqx.Module):
    r"""Base class: $\mathcal N(\theta^*, \Sigma)$ over the flat parameters of ``fn``.

    Subclasses define `covariance` and `sample`. Shared here: `mean`, `unravel`,
    `predictive_samples` (the linearised model at parameter samples) and
    `predictive_variance` (their Monte Carlo variance).

    Attributes:
        fn: the per-example model ``fn(params, x) -> (O,)``.
        params: the MAP params pytree $\theta^*$.
        unravel: flat vector ``(P,)`` to a params pytree.
    """

    fn: Callable = eqx.field(static=True)
    params: object
    unravel: Callable = eqx.field(static=True)

    @property
    def mean(self) -> jax.Array:
        """$\\theta^*$ as a flat vector of length ``P``."""
        return ravel(self.params)[0]

    @property
    @abc.abstractmethod
    def covariance(self) -> lo.LinearOperator:
        """$\\Sigma$ as a lazy ``P x P`` operator."""

    @abc.abstractmethod
    def sample(self, key: jax.Array, n: int) -> jax.Array:
        """``n`` flat parameter samples, shape ``(n, P)``."""

    def own_space(self):
        """``(fn, params, covariance)`` in the parameter space the posterior lives in (the linearised predictive
        works there): the whole model here; a posterior over a subset of the weights restricts the model."""
        return self.fn, self.params, self.covariance

    def map_outputs(self, inputs) -> jax.Array:
        """The MAP network's outputs $f(\\theta^*, x)$, shape ``(M, O)``.

        Inputs the model cannot take (a wrong feature count or image size) are refused with a
        `ValueError` naming the shapes, before any Jacobian work, instead of a raw XLA shape error.
        """
        self._output_spec(inputs)
        return _batched_outputs(self.fn, self.params, inputs)

    def _output_spec(self, inputs) -> jax.ShapeDtypeStruct:
        """The ``(M, O)`` shape and dtype of `map_outputs` on ``inputs``, computing nothing; inputs the model
        cannot take are refused as there."""
        leaves = jax.tree_util.tree_leaves(inputs)
        if not leaves or any(jnp.ndim(a) == 0 for a in leaves):
            raise ValueError(f"{type(self).__name__}: inputs must be a batch (M, ...) of examples, got "
                             f"{[jnp.shape(a) for a in leaves]}")
        if jnp.shape(leaves[0])[0] == 0:
            raise ValueError(f"{type(self).__name__}: the inputs hold no example (M = 0): nothing to predict")
        try:
            out = jax.eval_shape(self.fn, self.params, example_spec(inputs))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{type(self).__name__}: the model fails on the first input (shape "
                             f"{[jnp.shape(a)[1:] for a in leaves]}): is it shaped like the training inputs? "
                             f"({e})") from e
        if len(out.shape) != 1:
            raise ValueError(f"{type(self).__name__}: fn(params, x) must return a 1-D vector of outputs for one "
                             f"example, got shape {out.shape}")
        return jax.ShapeDtypeStruct((jnp.shape(leaves[0])[0],) + out.shape, out.dtype)

    def linearized_outputs(self, deltas, inputs) -> jax.Array:
        r"""$f(\theta^*, x) + J(x)\,\delta$ for each row $\delta$ of ``deltas`` ``(n, P)``, shape ``(n, M, O)``."""
        f = lambda p: jax.vmap(self.fn, in_axes=(None, 0))(p, inputs)  # noqa: E731
        mean = f(self.params)
        return mean[None] + jax.vmap(lambda d: jax.jvp(f, (self.params,), (self.unravel(d),))[1])(deltas)

    def predictive_samples(self, key: jax.Array, inputs, n: int) -> jax.Array:
        """Linearised predictive samples $f(\\theta^*, x) + J(x)(\\theta_s - \\theta^*)$, shape ``(n, M, O)``."""
        return self.linearized_outputs(self.sample(key, n) - self.mean[None, :], inputs)

    def predictive_variance(self, key: jax.Array, inputs, n: int) -> jax.Array:
        """Monte Carlo variance of each output's linearised prediction, shape ``(M, O)``."""
        return jnp.var(self.predictive_samples(key, inputs, n), axis=0, ddof=1)


class AbstractLowRankPosterior(GaussianPosterior):
    r"""$\mathcal N(\theta^*, U \operatorname{diag}(d) U^\top)$: what `LowRankPosterior` and the FSP-Laplace
    posterior share (the factor, samples, the exact linearised predictive). Abstract: a subclass declares the
    fields ``U``, ``d``, ``orthonormal`` and ``batch_size``; their shapes are checked here, once built.

    Examples:
        >>> import jax.numpy as jnp
        >>> import posteriors as pst
        >>> post = pst.LowRankPosterior(lambda w, x: (x @ w)[None], jnp.ones(2), jnp.array([[0.0], [1.0]]))
        >>> isinstance(post, pst.AbstractLowRankPosterior)
        True
        >>> pst.LowRankPosterior(lambda w, x: (x @ w)[None], jnp.ones(3), jnp.array([[0.0], [1.0]]))
        Traceback (most recent call last):
        ...
        ValueError: LowRankPosterior: U must have shape (3, r) for 3 parameters, got (2, 1)
    """

    U: AbstractVar[jax.Array]
    d: AbstractVar[jax.Array]
    orthonormal: AbstractVar[bool]
    batch_size: AbstractVar[int | None]

    def __check_init__(self):
        P = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(self.params))
        if self.U.ndim != 2 or self.U.shape[0] != P:
            raise ValueError(f"{type(self).__name__}: U must have shape ({P}, r) for {P} parameters, got "
                             f"{self.U.shape}")
        if self.d.shape != (self.U.shape[1],):
            raise ValueError(f"{type(self).__name__}: d must have shape ({self.U.shape[1]},), got {self.d.shape}")

    @property
    def factor(self) -> jax.Array:
        """$S = U \\operatorname{diag}(\\sqrt d)$, shape ``(P, r)``: $\\Sigma = S S^\\top$."""
        return self.U * jnp.sqrt(self.d)[None, :]

    @property
    def covariance(self) -> lo.LinearOperator:
        """$U \\operatorname{diag}(d) U^\\top$ as a `linops.LowRank` (PSD)."""
        return lo.LowRank(self.U, self.d, orthonormal=self.orthonormal, nonnegative=True)

    def sample(self, key: jax.Array, n: int) -> jax.Array:
        """``n`` samples $\\theta^* + S z$, shape ``(n, P)``."""
        n = positive_int(n, "n", f"{type(self).__name__}.sample")
        z = flat_draw(jax.random.normal, key, (self.U.shape[1], n), self.U.dtype)
        return self.mean[None, :] + (self.factor @ z).T

    def output_factor(self, inputs) -> jax.Array:
        """$J(X) S$, shape ``(M O, r)`` (rows example-major): $J \\Sigma J^\\top = (JS)(JS)^\\top$."""
        J = lo.JacobianOp(self.fn, self.params, inputs, batch_size=self.batch_size)
        return J @ self.factor

    def predictive(self, inputs):
        """Exact linearised predictive ``(mean, variance)``, each of shape ``(M, O)``."""
        mean = self.map_outputs(inputs)
        JS = self.output_factor(inputs)
        return mean, jnp.sum(JS**2, axis=1).reshape(mean.shape)

    def predictive_covariance(self, inputs) -> lo.LinearOperator:
        """$J(X)\\Sigma J(X)^\\top$ across all inputs and outputs, a lazy ``(MO, MO)`` `linops.LowRank`."""
        JS = self.output_factor(inputs)
        return lo.LowRank(JS, jnp.ones(JS.shape[1], JS.dtype), nonnegative=True)

    def predictive_samples(self, key: jax.Array, inputs, n: int) -> jax.Array:
        """Linearised predictive samples $f(\\theta^*, x) + J(x) S z$, shape ``(n, M, O)``.

        The same distribution as the base class's, from $r$ JVPs (``J S``) instead of one per sample.
        """
        mean = self.map_outputs(inputs)
        z = flat_draw(jax.random.normal, key, (self.U.shape[1], n), self.U.dtype)
        return mean[None] + (self.output_factor(inputs) @ z).T.reshape((n,) + mean.shape)


class LowRankPosterior(AbstractLowRankPosterior):
    r"""A Gaussian with a low-rank covariance $\Sigma = U \operatorname{diag}(d) U^\top$, ``U`` of shape ``(P, r)``.

    Sampling is $\theta^* + U \operatorname{diag}(\sqrt d)\, z$ with $z \sim \mathcal N(0, I_r)$,
    and the linearised predictive is exact: $\operatorname{Var} f_o(x) = \|(J(x) S)_{o,:}\|^2$
    with $S = U \operatorname{diag}(\sqrt d)$, from $r$ JVPs per batch of inputs (`predictive`),
    never a ``P x P`` matrix.

    Args:
        fn: the per-example model.
        params: the MAP params pytree.
        U: ``(P, r)``.
        d: ``(r,)``, non-negative.
        orthonormal: promise that the columns of ``U`` are orthonormal (closed-form `lo.sqrt`
            and `lo.pinv` of the covariance).
        batch_size: inputs per batch in `predictive` (default all).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.gaussian import LowRankPosterior
        >>> post = LowRankPosterior(lambda w, x: (x @ w)[None], jnp.ones(2), jnp.array([[0.0], [1.0]]),
        ...                         jnp.array([9.0]))
        >>> post.covariance.as_matrix()
        Array([[0., 0.],
               [0., 9.]], dtype=float32)
    """

    U: jax.Array
    d: jax.Array
    orthonormal: bool = eqx.field(static=True)
    batch_size: int | None = eqx.field(static=True)

    def __init__(self, fn, params, U, d=None, *, orthonormal: bool = False, batch_size: int | None = None):
        U = jnp.asarray(U)
        d = jnp.ones(U.shape[1:2], U.dtype) if d is None else jnp.asarray(d)
        self.fn, self.params, self.unravel = fn, params, ravel(params)[1]
        self.U, self.d, self.orthonormal, self.batch_size = U, d, bool(orthonormal), batch_size


__all__ = ["AbstractLowRankPosterior", "GaussianPosterior", "LowRankPosterior"]
