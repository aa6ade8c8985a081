r"""Outputs with a position axis: a likelihood summed over positions, and the model whose outputs it reads.

A sequence model's output for one example is ``(T, V)``: ``V`` logits at each of ``T`` positions (next-token
prediction), the loss summed over positions. Every operator of the library reads one example's output as a vector
``(O,)``; `PerPosition` is the likelihood of the flattened ``(T V,)`` output and `Flattened` the model that
flattens it, so that the GGN, its structures, the evidence and the predictives take a position axis without a
reshape from the user (`posteriors.laplace` wraps both itself when the model returns more than one axis).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops.algebra._leaves import Dense
from linops.likelihoods._base import EmpiricalFisher, Likelihood, MonteCarloFisher


def _block_diagonal(blocks):
    """``(T K, T V)`` from ``T`` blocks ``(K, V)`` on the diagonal."""
    T, K, V = blocks.shape
    eye = jnp.eye(T, dtype=blocks.dtype)
    return (eye[:, None, :, None] * blocks[:, :, None, :]).reshape(T * K, T * V)


class PerPosition(Likelihood):
    r"""``base`` at every position of an output of shape ``shape`` = ``(*positions, V)``, summed:
    $\ell(f, y) = \sum_t \ell_{\text{base}}(f_t, y_t)$, read on the flattened output ``(prod(shape),)``.

    Its output Hessian is block diagonal (one ``V x V`` block per position), its factor ``(T K, T V)`` block
    diagonal too: the exact GGN costs one reverse pass per row, ``T V`` per example. A
    `MonteCarloFisher` around it draws a whole sequence per sample: ``num_samples`` rows per example, whatever
    ``T`` and ``V`` (the positions' draws are independent, so the cross-position terms vanish in expectation).

    The targets of one example have shape ``shape[:-1]`` for a categorical base (one label per position), else
    ``shape``; a base with per-example arrays (a known per-example noise) is refused.

    Args:
        base: the likelihood of one position (`Categorical`, `Gaussian`, `Bernoulli`, ...), not a curvature.
        shape: one example's output shape, at least two axes: the positions, then the outputs of each.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.likelihoods import Categorical, PerPosition
        >>> lik = PerPosition(Categorical(), (3, 4))            # 3 positions, 4 classes each
        >>> lik.nll(jnp.zeros(12), jnp.array([0, 1, 2]))        # 3 log 4
        Array(4.158883, dtype=float32)
        >>> lik.hessian_factor(jnp.zeros(12), jnp.array([0, 1, 2])).shape
        (12, 12)
    """

    base: Likelihood
    shape: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, base: Likelihood, shape):
        if not isinstance(base, Likelihood) or isinstance(base, EmpiricalFisher | MonteCarloFisher | PerPosition):
            raise TypeError(f"PerPosition: base must be a likelihood of one position (not a curvature, nor another "
                            f"PerPosition), got {type(base).__name__}")
        if base.per_example:
            raise ValueError(f"PerPosition: a {type(base).__name__} with per-example arrays has no per-position "
                             "form; give one noise for every position")
        shape = tuple(int(s) for s in shape)
        if len(shape) < 2 or min(shape) < 1:
            raise ValueError(f"PerPosition: shape must have positions and outputs, each at least 1, got {shape}")
        self.base, self.shape = base, shape

    @property
    def positions(self) -> int:
        """``T``: the number of positions (the product of every axis but the last)."""
        return math.prod(self.shape[:-1])

    @property
    def width(self) -> int:
        """``V``: the outputs at each position."""
        return self.shape[-1]

    def _f(self, f):
        return f.reshape(self.positions, self.width)

    def _y(self, y):
        lead = len(self.shape) - 1
        return y.reshape((self.positions,) + tuple(jnp.shape(y)[lead:]))

    def nll(self, f, y):
        return jnp.sum(jax.vmap(self.base.nll)(self._f(f), self._y(y)))

    def grad(self, f, y):
        return jax.vmap(self.base.grad)(self._f(f), self._y(y)).reshape(-1)

    def hvp(self, f, y, u):
        return jax.vmap(self.base.hvp)(self._f(f), self._y(y), self._f(u)).reshape(-1)

    def hessian(self, f, y):
        blocks = jax.vmap(lambda ft, yt: self.base.hessian(ft, yt).as_matrix())(self._f(f), self._y(y))
        return Dense(_block_diagonal(blocks), tags={"psd"})

    def hessian_factor(self, f, y):
        return _block_diagonal(jax.vmap(self.base.hessian_factor)(self._f(f), self._y(y)))

    def factor_rows(self, num_outputs):
        return self.positions * self.base.factor_rows(self.width)

    def sample(self, key, f, n):
        keys = jax.random.split(key, self.positions)
        draws = jax.vmap(lambda k, ft: self.base.sample(k, ft, n))(keys, self._f(f))  # (T, n, ...)
        draws = jnp.moveaxis(draws, 0, 1)
        return draws.reshape((n,) + self.shape[:-1] + draws.shape[2:])

    def check(self, num_outputs, targets, num_examples, who):
        if num_outputs != math.prod(self.shape):
            raise ValueError(f"{who}: a PerPosition likelihood of shape {self.shape} needs {math.prod(self.shape)} "
                             f"outputs, the model has {num_outputs}")
        lead = self.shape[:-1]
        t_shape = tuple(jnp.shape(targets))
        if t_shape[:1 + len(lead)] != (num_examples,) + lead:
            raise ValueError(f"{who}: the targets of a model with outputs {self.shape} per example must have shape "
                             f"({num_examples}, {', '.join(map(str, lead))}, ...), one per position, got {t_shape}")
        rows = (num_examples * self.positions,) + t_shape[1 + len(lead):]
        traced = isinstance(targets, jax.core.Tracer) or not getattr(targets, "is_fully_addressable", True)
        flat = jnp.reshape(targets, rows) if traced else np.asarray(targets).reshape(rows)  # host: compiles nothing
        self.base.check(self.width, flat, rows[0], who)


class Flattened(eqx.Module):
    """``fn(params, x).reshape(-1)``: a model whose output for one example has several axes (positions, then
    outputs), read as one vector. Equal for equal ``fn`` and ``shape`` (its compiled programs are shared).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.likelihoods import Flattened
        >>> fn = Flattened(lambda W, x: x[:, None] * W, (2, 3))
        >>> fn(jnp.ones(3), jnp.array([1.0, 2.0]))
        Array([1., 1., 1., 2., 2., 2.], dtype=float32)
    """

    fn: Callable
    shape: tuple[int, ...] = eqx.field(static=True)

    def __call__(self, params, x):
        return self.fn(params, x).reshape(-1)


def with_positions(likelihood: Likelihood, shape) -> Likelihood:
    """``likelihood`` for outputs of ``shape`` (``(T, ..., V)``): `PerPosition` of it, inside a curvature
    (`EmpiricalFisher`, `MonteCarloFisher`) when it is one; unchanged when it already reads that shape.

    Examples:
        >>> from linops.likelihoods import Categorical, MonteCarloFisher, with_positions
        >>> with_positions(MonteCarloFisher(Categorical(), 4), (8, 256)).base.shape
        (8, 256)
    """
    shape = tuple(int(s) for s in shape)
    if isinstance(likelihood, PerPosition):
        if likelihood.shape != shape:
            raise ValueError(f"PerPosition: the likelihood reads outputs of shape {likelihood.shape}, the model "
                             f"returns {shape}")
        return likelihood
    if isinstance(likelihood, EmpiricalFisher):
        return EmpiricalFisher(with_positions(likelihood.base, shape))
    if isinstance(likelihood, MonteCarloFisher):
        return MonteCarloFisher(with_positions(likelihood.base, shape), likelihood.num_samples)
    return PerPosition(likelihood, shape)
