r"""`HessianOp`: the exact Hessian of a network's data loss, lazily, by Hessian-vector products.

$H = \nabla^2_\theta \sum_n \ell(f(\theta, x_n), y_n) = G + \sum_n \sum_o \partial_{f_o}\ell_n
\nabla^2_\theta f_o(\theta, x_n)$: the GGN $G$ plus the network's own curvature weighted by the residuals.
Unlike the GGN it can be indefinite away from a minimum of the loss (and even at one of the regularised loss).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from linops.algebra import _tags
from linops.likelihoods import Likelihood
from linops.nn._operators import _flat, _LikelihoodOperator, per_example_likelihood


class HessianOp(_LikelihoodOperator):
    r"""The Hessian $\nabla^2_\theta \sum_n \ell(f(\theta, x_n), y_n)$ (``P x P``) of the summed data loss.

    Each product is, per batch, forward-over-reverse differentiation of the batch's loss (a JVP of its
    gradient), summed with `lax.scan` over full batches plus the short last batch. Tagged symmetric, not
    PSD: the network's second derivatives weighted by the residuals can make it indefinite. It has no closed
    diagonal: ``lo.diag(H, method="exact")`` probes with the ``P`` unit vectors, ``method="hutchinson"``
    estimates it with its standard errors. ``as_matrix()`` costs ``P`` products, in blocks of columns.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``.
        params: the params pytree (where the Hessian is taken).
        inputs: inputs with a leading example axis ``N``.
        targets: targets with a leading example axis (shape set by the likelihood).
        likelihood: a `linops.likelihoods.Likelihood`: $\ell$ is its ``nll``.
        batch_size: examples per batch (default all).
        mesh: a `jax.sharding.Mesh` to split the examples over (as for `linops.GGNOp`); None for one device.
        axis: the mesh axis the examples are split along (default ``"data"``).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> fn = lambda w, x: jnp.tanh(x @ w)[None]
        >>> X, Y = jnp.array([[1.0, 0.0], [0.0, 1.0]]), jnp.array([[1.0], [1.0]])
        >>> H = lo.HessianOp(fn, jnp.zeros(2), X, Y, lo.likelihoods.Gaussian(1.0))
        >>> H.as_matrix()         # at w = 0 the residuals times tanh'' vanish: H = X^T X, the GGN
        Array([[1., 0.],
               [0., 1.]], dtype=float32)
    """

    def __init__(self, fn, params, inputs, targets, likelihood: Likelihood, *, batch_size: int | None = None,
                 mesh=None, axis: str = "data"):
        self._init_lik(fn, params, inputs, targets, likelihood, batch_size, "HessianOp", mesh, axis)

    @property
    def shape(self):
        return (self.num_params, self.num_params)

    @property
    def tags(self):
        return _tags.close({_tags.symmetric}, self.shape)

    def _batch_loss(self, xb, yb, lik, axis):
        def loss(p):
            out = jax.vmap(self.fn, in_axes=(None, 0))(p, xb)
            return jnp.sum(per_example_likelihood("nll", lik, axis, out, yb))

        return loss

    def mv(self, v):
        return self.mm(v[:, None])[:, 0]

    def mm(self, V):
        tangents = jax.vmap(self.unravel, in_axes=1)(V)  # params-shaped, a leading axis of k
        lik, axis = self._lik_axis()

        def batch(data):
            xb, yb, lb = data
            grad = jax.grad(self._batch_loss(xb, yb, lb if axis == 0 else lik, axis))
            hv = jax.vmap(lambda t: jax.jvp(grad, (self.params,), (t,))[1])(tangents)  # one linearisation
            return jax.vmap(_flat)(hv).T

        return self._sum(batch, self._data(), self.batch_size)

    rmv = mv

    def rmm(self, U):
        return self.mm(U)

    def as_matrix(self, chunk: int = 64):
        """The dense Hessian from ``P`` products, ``chunk`` unit vectors per pass over the data; refused before
        any work when it would not fit in memory."""
        from linops.memory import check_fits

        P = self.num_params
        check_fits(P * P * np.dtype(self.dtype).itemsize, f"HessianOp({P} x {P}).as_matrix()",
                   "use lo.diag(H, method='hutchinson', key=...), Lanczos (lo.LanczosLowRankOp) or H @ V products")
        chunk = max(1, min(chunk, P))
        starts = jnp.arange(0, P, chunk)

        def block(start):
            E = (jnp.arange(P)[:, None] == (start + jnp.arange(chunk))[None, :]).astype(self.dtype)
            return self.mm(E)

        blocks = jax.lax.map(block, starts)  # (num_blocks, P, chunk)
        H = jnp.moveaxis(blocks, 0, 1).reshape(P, -1)[:, :P]
        return (H + H.T) / 2  # exact in exact arithmetic; round-off asymmetry removed


__all__ = ["HessianOp"]
