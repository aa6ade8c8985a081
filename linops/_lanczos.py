r"""Lanczos with full reorthogonalisation, and the low-rank operators built from it.

`lanczos` runs $m$ steps on a symmetric operator: one product with $A$ per step, and the
reorthogonalisation against all earlier vectors as two matrix-vector products with the basis
(classical Gram-Schmidt applied twice), not an inner loop. It returns the Krylov basis $Q$ and
the tridiagonal $T = Q^\top A Q$ (a `Lanczos`), from which

- `Lanczos.low_rank` gives the top Ritz pairs as $U \Lambda U^\top$ (`LanczosLowRankOp`), and
- `Lanczos.pinv_factor` gives $L$ with $L L^\top = Q T^{+} Q^\top \approx A^{+}$ on the Krylov
  space (the factor FSP-Laplace uses, started from a given vector).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linops._base import LinearOperator, describe
from linops._structured import LowRank
from linops._tags import symmetric


class Lanczos(eqx.Module):
    """The result of `lanczos`: the Krylov basis and the tridiagonal, with convergence information.

    Attributes:
        Q: ``(n, m)`` orthonormal basis (columns past ``steps`` are zero).
        alpha: ``(m,)`` the diagonal of $T$.
        beta: ``(m,)`` the off-diagonal of $T$ (``beta[j]`` couples steps ``j`` and ``j + 1``);
            ``beta[steps - 1]`` is the residual norm that multiplies the next basis vector.
        steps: the steps run (fewer than ``m`` when the Krylov space became invariant).
    """

    Q: jax.Array
    alpha: jax.Array
    beta: jax.Array
    steps: jax.Array

    def tridiagonal(self) -> jax.Array:
        """$T = Q^\\top A Q$ as a dense ``(m, m)`` matrix (zero past ``steps``)."""
        off = self.beta[:-1] * (jnp.arange(self.beta.shape[0] - 1) < self.steps - 1)
        return jnp.diag(self.alpha) + jnp.diag(off, 1) + jnp.diag(off, -1)

    def ritz(self):
        """``(values, vectors, residuals)``: Ritz values (descending by magnitude), Ritz vectors
        ``Q S`` as columns, and their residuals $\\|A u - \\theta u\\| = \\beta_m |s_m|$."""
        w, S = jnp.linalg.eigh(self.tridiagonal())
        order = jnp.argsort(-jnp.abs(w))
        w, S = w[order], S[:, order]
        last = jnp.take(S, jnp.maximum(self.steps - 1, 0), axis=0)
        residuals = jnp.abs(self.beta[jnp.maximum(self.steps - 1, 0)] * last)
        return w, self.Q @ S, residuals

    def low_rank(self, rank: int) -> LanczosLowRankOp:
        """The top ``rank`` Ritz pairs (by magnitude) as $U \\Lambda U^\\top$."""
        return LanczosLowRankOp(self, rank)

    def pinv_factor(self, rtol: float | None = None) -> jax.Array:
        r"""``L`` (``n x m``) with $L L^\top = Q T^+ Q^\top$, the pseudo-inverse on the Krylov space.

        Ritz values below ``rtol`` times the largest (default ``m * eps``) count as zero; for an
        indefinite $T$ their magnitudes are used, and negative ones are refused (the factor of a
        pseudo-inverse exists for PSD operators only), as a NaN-free zero column.
        """
        w, S = jnp.linalg.eigh(self.tridiagonal())
        rtol = self.alpha.shape[0] * float(np.finfo(w.dtype).eps) if rtol is None else rtol
        keep = w > rtol * jnp.max(jnp.abs(w))
        scale = jnp.where(keep, 1.0 / jnp.sqrt(jnp.where(keep, w, 1.0)), 0.0)
        return self.Q @ (S * scale[None, :])


def lanczos(A: LinearOperator, num_steps: int, *, key: jax.Array | None = None, v0=None) -> Lanczos:
    r"""``num_steps`` Lanczos steps on the symmetric operator ``A`` with full reorthogonalisation.

    Start from ``v0`` when given (normalised here), else from a Gaussian vector drawn with ``key``.
    Stops early, with ``steps < num_steps``, when the Krylov space is invariant (a relative test).

    Example:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> A = lo.Diagonal(jnp.array([5.0, 3.0, 1.0, 0.5]))
        >>> res = lo.lanczos(A, 4, key=jax.random.key(0))
        >>> w, _, _ = res.ritz()
        >>> w.round(4)   # four steps on a 4 x 4 operator: the exact spectrum
        Array([5. , 3. , 1. , 0.5], dtype=float32)
    """
    if not isinstance(A, LinearOperator):
        raise TypeError(f"lanczos: A must be a LinearOperator, got {type(A).__name__}")
    n = A.shape[0]
    if A.shape[0] != A.shape[1] or symmetric not in A.tags:
        raise ValueError(f"lanczos: {describe(A)} must be square and tagged symmetric, got shape {A.shape} and "
                         f"tags {sorted(A.tags)}")
    if not isinstance(num_steps, (int, np.integer)) or not 1 <= num_steps <= n:
        raise ValueError(f"lanczos: num_steps must be an integer in [1, {n}] for {describe(A)}, got {num_steps!r}")
    if v0 is None:
        if key is None:
            raise ValueError("lanczos: pass a start vector v0 or a PRNG key (key=jax.random.key(0))")
        v0 = jax.random.normal(key, (n,), A.dtype)
    v0 = jnp.asarray(v0, A.dtype)
    if v0.shape != (n,):
        raise ValueError(f"lanczos: v0 must have shape ({n},) for {describe(A)}, got {v0.shape}")
    m = int(num_steps)
    dtype = A.dtype
    tiny = float(np.finfo(dtype).eps) * m

    def cond(state):
        j, _, _, _, _, done = state
        return (j < m) & ~done

    def body(state):
        j, Q, alpha, beta, q, _ = state
        Q = Q.at[:, j].set(q)
        w = A @ q
        a = jnp.vdot(q, w)
        # Full reorthogonalisation against every basis vector so far, twice: this also removes
        # the a q + b q_prev terms of the three-term recurrence.
        w = w - Q @ (Q.T @ w)
        w = w - Q @ (Q.T @ w)
        b = jnp.linalg.norm(w)
        scale = jnp.maximum(jnp.max(jnp.abs(alpha)), jnp.abs(a))
        done = ~(b > tiny * jnp.maximum(scale, jnp.max(beta)))  # invariant subspace (or NaN)
        alpha, beta = alpha.at[j].set(a), beta.at[j].set(jnp.where(done, 0.0, b))
        q = jnp.where(done, 0.0, w / jnp.where(done, 1.0, b))
        return j + 1, Q, alpha, beta, q, done

    q0 = v0 / jnp.linalg.norm(v0)
    state = (jnp.asarray(0), jnp.zeros((n, m), dtype), jnp.zeros(m, dtype), jnp.zeros(m, dtype), q0,
             jnp.asarray(False))
    steps, Q, alpha, beta, _, _ = lax.while_loop(cond, body, state)
    return Lanczos(Q, alpha, beta, steps)


class LanczosLowRankOp(LowRank):
    r"""The top-``rank`` eigenpairs of a symmetric operator by Lanczos, as $U \Lambda U^\top$.

    A `LowRank` with orthonormal ``U``: it composes like one (a shift solves by Woodbury,
    `lo.logdet` by the determinant lemma, `lo.pinv` and `lo.sqrt` in closed form).
    ``residuals`` holds each Ritz pair's $\|A u_i - \lambda_i u_i\|$ (the convergence
    information) and ``steps`` the Lanczos steps run.

    Args:
        A: a symmetric operator.
        rank: the number of eigenpairs kept (largest in magnitude).
        key: PRNG key of the start vector.
        num_steps: Lanczos steps (default ``min(n, 2 rank + 10)``).

    Example:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> A = lo.Diagonal(jnp.array([4.0, 2.0, 1e-3, 1e-3, 1e-3]))
        >>> L = lo.LanczosLowRankOp(A, 2, jax.random.key(0), num_steps=5)
        >>> L.d.round(4), bool(L.residuals.max() < 1e-4)
        (Array([4., 2.], dtype=float32), True)
        >>> round(float(lo.logdet(L + lo.Identity(5))), 3)   # log 5 + log 3, by the determinant lemma
        2.708
    """

    residuals: jax.Array
    steps: jax.Array

    def __init__(self, A: LinearOperator | Lanczos, rank: int, key: jax.Array | None = None, *,
                 num_steps: int | None = None):
        if isinstance(A, Lanczos):  # an existing run (e.g. `Lanczos.low_rank`)
            run, limit = A, A.alpha.shape[0]
        else:
            if not isinstance(A, LinearOperator):
                raise TypeError(f"LanczosLowRankOp: A must be a LinearOperator, got {type(A).__name__}")
            limit = A.shape[0]
        if not isinstance(rank, (int, np.integer)) or not 1 <= rank <= limit:
            raise ValueError(f"LanczosLowRankOp: rank must be an integer in [1, {limit}], got {rank!r}")
        if not isinstance(A, Lanczos):
            num_steps = min(limit, 2 * int(rank) + 10) if num_steps is None else num_steps
            if isinstance(num_steps, (int, np.integer)) and num_steps < rank:
                raise ValueError(f"LanczosLowRankOp: num_steps ({num_steps}) must be at least rank ({rank})")
            run = lanczos(A, num_steps, key=key)
        w, U, residuals = run.ritz()
        super().__init__(U[:, :rank], w[:rank], orthonormal=True)
        self.residuals, self.steps = residuals[:rank], run.steps


__all__ = ["Lanczos", "LanczosLowRankOp", "lanczos"]
