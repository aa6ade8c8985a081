"""Conjugate gradients with a relative stopping rule and its convergence information.

Written here rather than taken from lineax because the solve must (a) return the step
count and residual as values, and (b) work in float32 at n ~ 1e5: each right-hand side is
normalised to unit length first, so the iteration never sees the problem's absolute scale
(lineax's CG declares a breakdown on such problems unless the operator is rescaled).

ONE implementation, `cg`, with one stopping rule: for one vector, or for independent CGs on
the columns of a block run in step (a stopped column is frozen; the matvec is applied to the
whole block, so it may be a sweep of several vectors at once, or one with collectives on a mesh
``axis``). `cg_many` adapts a matvec of one vector to a block. `linops.solve` uses both;
alternating projections use `cg` on one device and on the column blocks of a mesh.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def cg(matvec, b, *, x0=None, rtol, atol=0.0, maxiter, precondition=None, callback=None, patience=None,
       axis=None):
    """Solve ``A x = b`` for ``b`` of shape ``(n,)``, or for each column of ``b`` ``(n, k)``.

    Returns ``(x, converged, steps, residual_norm)``: ``x`` shaped like ``b``; the others scalars,
    or one per column. ``matvec`` and ``precondition`` act on arrays shaped like ``b``.
    ``residual_norm`` is the true $\\|b - A x\\|$, recomputed from the returned ``x`` with one more
    ``matvec`` (not the recursive residual, which drifts from it in finite precision); ``converged``
    needs the recursive rule met and the recomputed residual within 10x the threshold (the
    recomputation's own rounding, about eps ||A|| ||x||, can exceed a float32 tolerance that was met).

    A column stops when ``||r|| <= max(rtol ||b||, atol)`` (``atol``: a scalar, or one per
    column), on a breakdown (``pᵀAp <= 0`` or NaN: not positive definite along ``p``), or after
    ``maxiter`` steps. ``patience``: when set, keep each column's iterate with the smallest
    residual and stop the column once ``patience`` steps have passed without a new smallest
    residual: in finite precision the residual of a semi-definite or badly conditioned problem
    levels off and then grows, and the best iterate is returned instead of the last.
    (``converged`` stays False unless the tolerance was met.)
    ``callback(step, relative_residual)`` is called on the host after each step (for progress;
    for a block, with the largest over the columns).
    ``axis``: run inside `jax.shard_map` with the columns split over the devices of this mesh
    axis; every device steps (and calls ``matvec``) until all columns on all devices have stopped.

    Examples:
        >>> import jax.numpy as jnp
        >>> x, converged, steps, _ = cg(lambda v: 2.0 * v, jnp.ones(3), rtol=1e-6, maxiter=5)
        >>> x.round(5), converged, steps
        (Array([0.5, 0.5, 0.5], dtype=float32), Array(True, dtype=bool), Array(1, dtype=int32))
        >>> A = jnp.array([[4.0, 1.0], [1.0, 3.0]])
        >>> X, converged, steps, _ = cg(lambda X: A @ X, jnp.eye(2), rtol=1e-6, maxiter=10)
        >>> converged, steps
        (Array([ True,  True], dtype=bool), Array([2, 2], dtype=int32))
    """
    precondition = precondition or (lambda r: r)
    dot = lambda u, v: jnp.sum(u * v, axis=0)  # noqa: E731  (one inner product per column)
    norm = lambda u: jnp.sqrt(dot(u, u))  # noqa: E731
    each = (lambda c: c) if b.ndim == 1 else (lambda c: c[None, :])  # noqa: E731  (a column's scalar, broadcast)
    # ||b|| itself over/underflows in float32 for |b| ~ 1e+-20: take it after dividing by max|b|.
    b_max = jnp.max(jnp.abs(b), axis=0)
    b_max = jnp.where(b_max > 0, b_max, 1.0)
    b_norm = b_max * norm(b / each(b_max))
    scale = jnp.where(b_norm > 0, b_norm, 1.0)
    b_hat = b / each(scale)
    x = jnp.zeros_like(b_hat) if x0 is None else x0 / each(scale)
    r = b_hat if x0 is None else b_hat - matvec(x)
    z = precondition(r)
    # Stop at ||r|| <= max(rtol ||b||, atol), measured in the normalised problem.
    threshold = jnp.maximum(rtol, atol / scale)
    res = norm(r)
    track = patience is not None
    never = jnp.zeros(b.shape[1:], jnp.int32)
    best = (x, res, never) if track else ()

    def cond(state):
        k, active = state[4], state[5]
        going = jnp.any(active)
        if axis is not None:
            going = lax.pmax(going.astype(jnp.int32), axis) > 0
        return going & (k < maxiter)

    def body(state):
        x, r, p, rz, k, active, steps, best = state
        steps = steps + active.astype(jnp.int32)
        Ap = matvec(p)  # on every column, stopped or not (a matvec with collectives needs all devices)
        pAp = dot(p, Ap)
        ok = active & (pAp > 0)
        alpha = jnp.where(ok, rz / jnp.where(ok, pAp, 1.0), 0.0)
        x = x + each(alpha) * p
        r = r - each(alpha) * Ap
        z = precondition(r)
        rz_new = dot(r, z)
        beta = jnp.where(ok & (rz != 0), rz_new / jnp.where(rz == 0, 1.0, rz), 0.0)
        p = jnp.where(each(ok), z + each(beta) * p, p)
        rz = jnp.where(ok, rz_new, rz)
        res = norm(r)
        if callback is not None:
            jax.debug.callback(callback, k + 1, jnp.max(res))
        active = ok & (res > threshold)
        if track:
            better = ok & (res < best[1])
            best = (jnp.where(each(better), x, best[0]), jnp.where(better, res, best[1]),
                    jnp.where(better, k + 1, best[2]))
            active &= k + 1 - best[2] < patience
        return x, r, p, rz, k + 1, active, steps, best

    state = (x, r, z, dot(r, z), jnp.asarray(0, jnp.int32), res > threshold, never, best)
    x, r, *_, steps, best = lax.while_loop(cond, body, state)
    recursive = norm(r)
    if track:
        x, recursive = best[0], best[1]
    # The residual reported is recomputed from the returned x (one more product): the recursive one drifts
    # from the true ||b - A x|| in finite precision (0.1 against 190 was seen). Convergence needs the
    # recursive rule met AND the recomputed residual within 10x the threshold: the recomputation has its own
    # rounding (about eps ||A|| ||x||), which alone can exceed a float32 tolerance that was in fact met.
    res = norm(b_hat - matvec(x))
    converged = (recursive <= threshold) & (res <= 10 * threshold) & jnp.all(jnp.isfinite(x), axis=0)
    return x * each(scale), converged, steps, res * scale


def cg_many(matvec, B, *, precondition=None, **options):
    """`cg` on each column of ``B`` ``(n, k)``, with ``matvec`` (and ``precondition``) of one vector ``(n,)``."""
    columns = lambda f: None if f is None else jax.vmap(f, in_axes=1, out_axes=1)  # noqa: E731
    return cg(columns(matvec), B, precondition=columns(precondition), **options)
