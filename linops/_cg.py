"""Conjugate gradients with a relative stopping rule and its convergence information.

Written here rather than taken from lineax because the solve must (a) return the step
count and residual as values, and (b) work in float32 at n ~ 1e5: the right-hand side is
normalised to unit length first, so the iteration never sees the problem's absolute scale
(lineax's CG declares a breakdown on such problems unless the operator is rescaled).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def cg(matvec, b, *, x0=None, rtol, atol, maxiter, precondition=None, callback=None, patience=None):
    """Solve ``A x = b`` for one vector ``b``; returns ``(x, converged, steps, residual_norm)``.

    ``callback(step, relative_residual)`` is called on the host after each step (for progress).
    ``patience``: when set, keep the iterate with the smallest residual and stop once ``patience``
    steps have passed without a new smallest residual: in finite precision the residual of a
    semi-definite or badly conditioned problem levels off and then grows, and the best iterate
    is returned instead of the last. (``converged`` stays False unless the tolerance was met.)
    """
    precondition = precondition or (lambda r: r)
    # ||b|| itself over/underflows in float32 for |b| ~ 1e+-20: take it after dividing by max|b|.
    b_max = jnp.max(jnp.abs(b))
    b_max = jnp.where(b_max > 0, b_max, 1.0)
    b_norm = b_max * jnp.linalg.norm(b / b_max)
    scale = jnp.where(b_norm > 0, b_norm, 1.0)
    b_hat = b / scale
    x = jnp.zeros_like(b_hat) if x0 is None else x0 / scale
    r = b_hat - matvec(x)
    z = precondition(r)
    p = z
    rz = jnp.vdot(r, z)
    # Stop at ||r|| <= max(rtol ||b||, atol), measured in the normalised problem.
    threshold = jnp.maximum(rtol, atol / scale)

    track = patience is not None
    patience = 0 if patience is None else int(patience)

    def cond(state):
        _, r, _, _, k, broke, best = state
        going = (jnp.linalg.norm(r) > threshold) & (k < maxiter) & ~broke
        if track:
            going &= k - best[2] < patience
        return going

    def body(state):
        x, r, p, rz, k, _, best = state
        Ap = matvec(p)
        pAp = jnp.vdot(p, Ap)
        broke = ~(pAp > 0)  # not positive definite along p (or NaN): stop, report it
        alpha = jnp.where(broke, 0.0, rz / jnp.where(broke, 1.0, pAp))
        x = x + alpha * p
        r = r - alpha * Ap
        z = precondition(r)
        rz_new = jnp.vdot(r, z)
        beta = jnp.where(broke | (rz == 0), 0.0, rz_new / jnp.where(rz == 0, 1.0, rz))
        p = z + beta * p
        res = jnp.linalg.norm(r)
        if callback is not None:
            jax.debug.callback(callback, k + 1, res)
        if track:
            better = res < best[1]
            best = (jnp.where(better, x, best[0]), jnp.where(better, res, best[1]), jnp.where(better, k + 1, best[2]))
        return x, r, p, rz_new, k + 1, broke, best

    r0 = jnp.linalg.norm(r)
    best = (x, r0, jnp.asarray(0, jnp.int32)) if track else ()
    state = (x, r, p, rz, jnp.asarray(0, jnp.int32), jnp.asarray(False), best)
    x, r, _, _, steps, _, best = lax.while_loop(cond, body, state)
    res = jnp.linalg.norm(r)
    if track:
        x, res = best[0], best[1]
    converged = (res <= threshold) & jnp.all(jnp.isfinite(x))
    return x * scale, converged, steps.astype(jnp.int32), res * scale


def cg_many(matvec, B, **kw):
    """`cg` on each column of ``B`` (shape ``(n, k)``)."""
    x0 = kw.pop("x0", None)
    fn = lambda b, x: cg(matvec, b, x0=x, **kw)  # noqa: E731
    in_axes = (1, None if x0 is None else 1)
    x, conv, steps, res = jax.vmap(fn, in_axes=in_axes, out_axes=(1, 0, 0, 0))(B, x0)
    return x, conv, steps, res
