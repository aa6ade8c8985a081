r"""Where the rows of a row-partitioned $M$ come from: a matrix, a network's Jacobian, a loss Jacobian.

A `RowSource` says how to apply each row block $M_b$ (a batch of examples) in the parameters' own
pytree layout: ``forward`` ($M_b t$), ``backward`` ($M_b^\top u$) and ``rows`` (the ``R`` rows of
$M_b$, each from its own example). The examples are grouped into batches of ``batch_size``; the
short last batch repeats its own examples, so it has the same row space and nothing is dropped.
`linops.nn._rowblocks.RowBlocks.build` turns a source into factors.

Examples:
    >>> import jax.numpy as jnp
    >>> rows = matrix_rows(jnp.arange(6.0).reshape(3, 2), batch_size=2)
    >>> rows.data.shape, rows.num_rows, rows.size       # 2 batches of 2 rows; the last repeats row 3
    ((2, 2, 2), 2, 2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linops.models import ravel, unravel_of
from linops.nn._operators import _check_model

_WHO = "AlternatingProjectionOp"


class RowSource(NamedTuple):
    r"""How to apply the row blocks $M_b$ of a row-partitioned $M$, batch by batch.

    ``forward(params, data_b, t) -> (R,)`` is $M_b t$ for a tangent ``t`` in the parameters' pytree
    layout, ``backward(params, data_b, u)`` is $M_b^\top u$ in that layout, and
    ``rows(params, data_b)`` gives the ``R`` rows of $M_b$ stacked on a leading axis. ``data`` holds
    every batch's data stacked on a leading batch axis; ``params`` is shared by all batches.
    ``to_tree`` / ``to_flat`` convert between flat vectors of ``size`` entries and that layout.

    The maps are structural: module-level functions, or frozen dataclasses of the model function (and a
    likelihood's static part), equal for equal inputs. They are static data of the compiled programs that
    build and apply the projection, so a refit on new parameter values or data of the same shapes (with the
    same model function) reuses every one of those programs.
    """

    params: object
    data: object
    forward: Callable
    backward: Callable
    rows: Callable
    num_rows: int
    size: int
    dtype: np.dtype
    to_tree: Callable
    to_flat: Callable


def matrix_rows(M, batch_size: int) -> RowSource:
    """The rows of a wide matrix ``M``, in batches of ``batch_size`` rows."""
    M = jnp.asarray(M)
    if M.ndim != 2:
        raise ValueError(f"{_WHO}: M must be 2-D, got shape {M.shape}")
    check_batch(batch_size, M.shape[0])
    blocks = take(M, pad_indices(M.shape[0], batch_size))  # (B, S, P)
    return RowSource(None, blocks, _matrix_forward, _matrix_backward, _matrix_rows, batch_size, M.shape[1], M.dtype,
                     _identity, _identity)


def _matrix_forward(_, Mb, v):
    return Mb @ v


def _matrix_backward(_, Mb, u):
    return u @ Mb


def _matrix_rows(_, Mb):
    return Mb


def jacobian_rows(fn, params, inputs, batch_size: int) -> RowSource:
    """The rows of the Jacobian of ``fn(params, x) -> (O,)`` on ``inputs``: ``batch_size * O`` per batch."""
    n, o = _check_model(fn, params, inputs, _WHO)
    check_batch(batch_size, n)
    unravel = unravel_of(params)  # no flat vector formed: nothing runs here
    pad = pad_indices(n, batch_size)
    data = jax.tree_util.tree_map(lambda a: take(a, pad), inputs)
    return RowSource(params, data, _JacobianForward(fn), _JacobianBackward(fn), _JacobianRows(fn), batch_size * o,
                     unravel.size, unravel.dtype, unravel, _flatten)


def _batched(fn, xb):
    return lambda q: jax.vmap(fn, in_axes=(None, 0))(q, xb)


@dataclasses.dataclass(frozen=True)
class _JacobianForward:
    """``(params, x_b, t) -> M_b t``: the batch's Jacobian times a tangent."""

    fn: Callable

    def __call__(self, p, xb, t):
        return jax.jvp(_batched(self.fn, xb), (p,), (t,))[1].reshape(-1)


@dataclasses.dataclass(frozen=True)
class _JacobianBackward:
    """``(params, x_b, u) -> M_b^T u`` in the parameters' layout."""

    fn: Callable

    def __call__(self, p, xb, u):
        out, vjp = jax.vjp(_batched(self.fn, xb), p)
        return vjp(u.reshape(out.shape).astype(out.dtype))[0]


@dataclasses.dataclass(frozen=True)
class _JacobianRows:
    """``(params, x_b) -> rows``: row ``n * O + o`` of ``M_b`` is example ``n``'s Jacobian row ``o``."""

    fn: Callable

    def __call__(self, p, xb):
        jac = jax.vmap(lambda x: jax.jacrev(self.fn)(p, x))(xb)
        return jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]), jac)


def loss_jacobian_rows(fn, params, inputs, targets, likelihood, batch_size: int) -> RowSource:
    r"""The rows $g_n^\top J_n$ of the loss Jacobian: one per example, whatever ``O``."""
    from linops.nn._operators import LossJacobianOp

    JL = LossJacobianOp(fn, params, inputs, targets, likelihood)  # validates everything
    n = JL.num_examples
    check_batch(batch_size, n)
    unravel = unravel_of(params)
    pad = pad_indices(n, batch_size)
    # The likelihood's arrays travel with the data (per example: padded like it; else one copy per batch), its
    # static part with the maps, so that the maps compare equal across fits.
    arrays, static = eqx.partition(likelihood, eqx.is_array)
    if likelihood.per_example:
        lik_data = jax.tree_util.tree_map(lambda a: take(a, pad), arrays)
    else:
        lik_data = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (len(pad),) + jnp.shape(a)), arrays)
    data = (jax.tree_util.tree_map(lambda a: take(a, pad), inputs), jax.tree_util.tree_map(lambda a: take(a, pad),
                                                                                             targets), lik_data)
    maps = _LossMaps(fn, static, bool(likelihood.per_example))
    return RowSource(params, data, _LossForward(maps), _LossBackward(maps), _LossRows(maps), batch_size,
                     unravel.size, unravel.dtype, unravel, _flatten)


@dataclasses.dataclass(frozen=True)
class _LossMaps:
    """The model function and the likelihood's static part; ``grads`` gives a batch's loss gradients."""

    fn: Callable
    likelihood_static: object
    per_example: bool

    def grads(self, p, data_b):
        xb, yb, lb = data_b
        f = _batched(self.fn, xb)
        lik = eqx.combine(lb, self.likelihood_static)
        axis = 0 if self.per_example else None
        g = jax.vmap(lambda l_, o_, y_: l_.grad(o_, y_), in_axes=(axis, 0, 0))(lik, f(p), yb)
        return f, lax.stop_gradient(g)


@dataclasses.dataclass(frozen=True)
class _LossForward:
    maps: _LossMaps

    def __call__(self, p, data_b, t):
        f, g = self.maps.grads(p, data_b)
        return jnp.sum(g * jax.jvp(f, (p,), (t,))[1], axis=-1)


@dataclasses.dataclass(frozen=True)
class _LossBackward:
    maps: _LossMaps

    def __call__(self, p, data_b, u):
        f, g = self.maps.grads(p, data_b)
        _, vjp = jax.vjp(f, p)
        return vjp(u[:, None].astype(g.dtype) * g)[0]


@dataclasses.dataclass(frozen=True)
class _LossRows:
    """Row ``n`` of ``M_b``: the gradient of ``g_n . f(p, x_n)``, example ``n`` alone."""

    maps: _LossMaps

    def __call__(self, p, data_b):
        _, g = self.maps.grads(p, data_b)
        fn = self.maps.fn
        return jax.vmap(lambda x, g_n: jax.grad(lambda q: jnp.sum(g_n * fn(q, x)))(p))(data_b[0], g)


@jax.jit
def take(a, idx):
    """``a[idx]`` as one compiled program per shape: ``jnp`` indexing called eagerly compiles several small ones
    (the index's conversion, bounds and gather), every first call of a fit."""
    return a[idx]


def pad_indices(n, batch_size):
    """Example indices per batch; the short last batch repeats its own examples (same row space)."""
    full, rest = divmod(n, batch_size)
    idx = [np.arange(b * batch_size, (b + 1) * batch_size) for b in range(full)]
    if rest:
        tail = np.arange(full * batch_size, n)
        idx.append(tail[np.arange(batch_size) % rest])
    return np.stack(idx)


def check_batch(batch_size, n):
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"{_WHO}: batch_size must be a positive integer, got {batch_size!r}")
    if batch_size > n:
        raise ValueError(f"{_WHO}: batch_size {batch_size} is larger than the {n} examples")


def _identity(x):
    return x


def _flatten(tree):
    return ravel(tree)[0]


__all__ = ["RowSource", "jacobian_rows", "loss_jacobian_rows", "matrix_rows"]
