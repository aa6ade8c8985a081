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


def cg(matvec, b, *, x0=None, rtol, atol, maxiter, precondition=None, callback=None):
    """Solve ``A x = b`` for one vector ``b``; returns ``(x, converged, steps, residual_norm)``.

    ``callback(step, relative_residual)`` is called on the host after each step (for progress).
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

    def cond(state):
        _, r, _, _, k, broke = state
        return (jnp.linalg.norm(r) > threshold) & (k < maxiter) & ~broke

    def body(state):
        x, r, p, rz, k, _ = state
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
        if callback is not None:
            jax.debug.callback(callback, k + 1, jnp.linalg.norm(r))
        return x, r, p, rz_new, k + 1, broke

    state = (x, r, p, rz, jnp.asarray(0, jnp.int32), jnp.asarray(False))
    x, r, _, _, steps, _ = lax.while_loop(cond, body, state)
    res = jnp.linalg.norm(r)
    converged = (res <= threshold) & jnp.all(jnp.isfinite(x))
    return x * scale, converged, steps.astype(jnp.int32), res * scale


def cg_many(matvec, B, **kw):
    """`cg` on each column of ``B`` (shape ``(n, k)``)."""
    x0 = kw.pop("x0", None)
    fn = lambda b, x: cg(matvec, b, x0=x, **kw)  # noqa: E731
    in_axes = (1, None if x0 is None else 1)
    x, conv, steps, res = jax.vmap(fn, in_axes=in_axes, out_axes=(1, 0, 0, 0))(B, x0)
    return x, conv, steps, res
