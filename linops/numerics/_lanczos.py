r"""Lanczos with full reorthogonalisation, its adjoint, and the low-rank operators built from it.

`lanczos` runs $m$ steps on a symmetric operator: one product with $A$ per step, and the
reorthogonalisation against all earlier vectors as matrix-vector products with the stored
basis (classical Gram-Schmidt applied twice), not an inner loop. The basis is stored row by
row, so both products read it contiguously. It returns the Krylov basis $Q$ and the
tridiagonal $T = Q^\top A Q$ (a `Lanczos`), from which

- `Lanczos.low_rank` gives the top Ritz pairs as $U \Lambda U^\top$ (`LanczosLowRankOp`), and
- `Lanczos.pinv_factor` gives $L$ with $L L^\top = Q T^{+} Q^\top \approx A^{+}$ on the Krylov
  space (the factor FSP-Laplace uses, started from a given vector).

Reverse-mode derivatives (w.r.t. the operator's arrays and the start vector) do not unroll
the loop: a custom adjoint solves the linearised Lanczos relations

$$A Q = Q T + r e_m^\top, \qquad Q^\top Q = I, \qquad Q^\top r = 0, \qquad Q e_1 = v / \|v\|$$

backwards, one product with $A$ per step, then one batched vector-Jacobian product of
$A \mapsto A Q$ (the approach of Krämer, Moreno-Muñoz, Roy and Hauberg, "Gradients of
functions of large matrices", NeurIPS 2024; derived and written here for the symmetric,
row-stored, early-stopping case). Memory is that of the forward pass: two $m \times n$ arrays.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linops.algebra._arrays import describe, is_known_nonnegative
from linops.algebra._base import LinearOperator
from linops.algebra._lowrank import AbstractLowRank
from linops.algebra._tags import symmetric
from linops.runtime._progress import check_label, finish_after, tick


class Lanczos(eqx.Module):
    """The result of `lanczos`: the Krylov basis and the tridiagonal, with convergence information.

    Attributes:
        Q: ``(n, m)`` orthonormal basis (columns past ``steps`` are zero).
        alpha: ``(m,)`` the diagonal of $T$.
        beta: ``(m,)`` the off-diagonal of $T$ (``beta[j]`` couples steps ``j`` and ``j + 1``);
            ``beta[steps - 1]`` is the residual norm that multiplies the next basis vector.
        steps: the steps run (fewer than ``m`` when the Krylov space became invariant and
            ``restart`` was off).
        restarts: how many times an invariant Krylov space was left for a new direction
            (``beta`` is zero there, and $T$ is block tridiagonal).
    """

    Q: jax.Array
    alpha: jax.Array
    beta: jax.Array
    steps: jax.Array
    restarts: jax.Array

    def tridiagonal(self) -> jax.Array:
        """$T = Q^\\top A Q$ as a dense ``(m, m)`` matrix (zero past ``steps``)."""
        return tridiagonal(self.alpha, self.beta, self.steps)

    def ritz(self, A: LinearOperator | None = None):
        """``(values, vectors, residuals)``: Ritz values (descending by magnitude), Ritz vectors
        ``Q S`` as columns, and their residuals $\\|A u - \\theta u\\|$.

        Without a restart the residuals come from the recurrence, $\\beta_m |s_m|$, at no cost. A
        restart drops the (small) remainder that was judged invariant, so the recurrence no longer
        measures them: they are then computed as $\\|A u - \\theta u\\|$ when ``A`` is given (one
        product with ``A`` per Ritz pair) and reported as NaN (unknown) when it is not. The recurrence
        also cannot see rounding: below $m \\epsilon \\max|\\theta|$ (`rounding_floor`) its residual says
        nothing (with a dominant eigenvalue in float32 it reads 0 where the true residual is near 1), so
        when any is below that floor and ``A`` is given, every residual is measured with ``A``.
        """
        w, S = jnp.linalg.eigh(self.tridiagonal())
        order = jnp.argsort(-jnp.abs(w))
        w, S = w[order], S[:, order]
        last = jnp.take(S, jnp.maximum(self.steps - 1, 0), axis=0)
        residuals = jnp.abs(self.beta[jnp.maximum(self.steps - 1, 0)] * last)
        U = self.Q @ S
        if A is None:
            residuals = jnp.where(self.restarts > 0, jnp.nan, residuals)
        else:
            unmeasured = (self.restarts > 0) | jnp.any(residuals < rounding_floor(w, self.alpha.shape[0]))
            residuals = lax.cond(unmeasured, lambda: _true_residuals(A, U, w), lambda: residuals)
        return w, U, residuals

    def low_rank(self, rank: int) -> LanczosLowRankOp:
        """The top ``rank`` Ritz pairs (by magnitude) as $U \\Lambda U^\\top$."""
        return LanczosLowRankOp(self, rank)

    def pinv_factor(self, rtol: float | None = None) -> jax.Array:
        r"""``L`` (``n x m``) with $L L^\top = Q T^+ Q^\top$, the pseudo-inverse on the Krylov space.

        Ritz values below ``rtol`` times the largest magnitude (default ``m * eps``) count as
        zero, and so do negative ones (the factor of a pseudo-inverse exists for PSD operators
        only): their columns of ``L`` are zero, without NaNs.
        """
        w, S = jnp.linalg.eigh(self.tridiagonal())
        rtol = self.alpha.shape[0] * float(np.finfo(w.dtype).eps) if rtol is None else rtol
        keep = w > rtol * jnp.max(jnp.abs(w))
        scale = jnp.where(keep, 1.0 / jnp.sqrt(jnp.where(keep, w, 1.0)), 0.0)
        return self.Q @ (S * scale[None, :])


def lanczos(A: LinearOperator, num_steps: int, *, key: jax.Array | None = None, v0=None,
            restart: bool = False, progress: str | None = None) -> Lanczos:
    r"""``num_steps`` Lanczos steps on the symmetric operator ``A`` with full reorthogonalisation.

    Start from ``v0`` when given (normalised here), else from a Gaussian vector drawn with ``key``.
    When the Krylov space becomes invariant (a relative test on the new residual), the run
    stops early with ``steps < num_steps``; with ``restart=True`` it goes on instead from the
    coordinate vector least represented in the basis so far (deterministic, orthogonalised
    against the basis), so the basis always reaches ``num_steps`` vectors. Restarting matters
    when $A$ has few distinct eigenvalues (a kernel Gram of points far apart relative to the
    lengthscale is nearly $cI$: its Krylov space from one vector is one-dimensional).
    ``progress``: a label: a progress bar over the steps under it (once the run takes longer than
    two seconds); None (default): none.

    Differentiable in reverse mode w.r.t. the operator's arrays and ``v0`` by a custom adjoint
    (no unrolled loop). The derivative is defined for a run that neither stopped early (the
    padded zeros of $T$ are repeated eigenvalues) nor restarted (the new direction is not a
    differentiable function of the inputs): after a restart the gradients are NaN.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> A = lo.Diagonal(jnp.array([5.0, 3.0, 1.0, 0.5]))
        >>> res = lo.lanczos(A, 4, key=jax.random.key(0))
        >>> w, _, _ = res.ritz()
        >>> w.round(4)   # four steps on a 4 x 4 operator: the exact spectrum
        Array([5. , 3. , 1. , 0.5], dtype=float32)
        >>> def largest(d):   # d(largest eigenvalue)/d(diagonal) = e_1, through the adjoint
        ...     values, _, _ = lo.lanczos(lo.Diagonal(d), 4, key=jax.random.key(0)).ritz()
        ...     return values.max()
        >>> jax.grad(largest)(A.d).round(4) + 0.0
        Array([1., 0., 0., 0.], dtype=float32)
    """
    if not isinstance(A, LinearOperator):
        raise TypeError(f"lanczos: A must be a LinearOperator, got {type(A).__name__}")
    n = A.shape[0]
    if A.shape[0] != A.shape[1] or symmetric not in A.tags:
        raise ValueError(f"lanczos: {describe(A)} must be square and tagged symmetric, got shape {A.shape} and "
                         f"tags {sorted(A.tags)}")
    if not isinstance(num_steps, (int, np.integer)) or not 1 <= num_steps <= n:
        raise ValueError(f"lanczos: num_steps must be an integer in [1, {n}] for {describe(A)}, got {num_steps!r}")
    check_label(progress, "lanczos")
    if v0 is None:
        if key is None:
            raise ValueError("lanczos: pass a start vector v0 or a PRNG key (key=jax.random.key(0))")
        v0 = jax.random.normal(key, (n,), A.dtype)
    v0 = jnp.asarray(v0, A.dtype)
    if v0.shape != (n,):
        raise ValueError(f"lanczos: v0 must have shape ({n},) for {describe(A)}, got {v0.shape}")
    basis, alpha, beta, steps, restarts = _tridiagonalise((A, v0), int(num_steps), bool(restart), progress)
    return Lanczos(basis.T, alpha, beta, steps, restarts)


def tridiagonal(alpha, beta, steps) -> jax.Array:
    """The dense ``(m, m)`` tridiagonal of a Lanczos run's ``alpha`` and ``beta`` (zero past ``steps``)."""
    off = beta[:-1] * (jnp.arange(beta.shape[0] - 1) < steps - 1)
    return jnp.diag(alpha) + jnp.diag(off, 1) + jnp.diag(off, -1)


def rounding_floor(w, m):
    """$m \\epsilon \\max|w|$: below it a Ritz pair's recurrence residual measures rounding, not convergence."""
    return m * float(np.finfo(w.dtype).eps) * jnp.max(jnp.abs(w))


def _true_residuals(A, U, w):
    """$\\|A u_i - w_i u_i\\|$ for the columns of ``U``, one product with ``A`` each."""
    return jnp.linalg.norm(A.mm(U) - U * w[None, :], axis=0)


def _new_direction(Q):
    """The unit coordinate vector least represented in the row space of ``Q``, orthogonalised against it."""
    i = jnp.argmin(jnp.sum(Q**2, axis=0))
    w = jnp.zeros(Q.shape[1], Q.dtype).at[i].set(1.0)
    w = w - (Q @ w) @ Q
    w = w - (Q @ w) @ Q
    return w / jnp.linalg.norm(w)


def _forward(A, v0, m, restart, progress=None):
    """The Lanczos recursion: ``(basis (m, n) by rows, alpha, beta, steps, restarts, next unit vector)``."""
    n, dtype = v0.shape[0], A.dtype
    tiny = float(np.finfo(dtype).eps) * m

    def cond(state):
        j, _, _, _, _, done, _ = state
        return (j < m) & ~done

    def body(state):
        j, Q, alpha, beta, q, _, restarts = state
        Q = Q.at[j].set(q)
        w = A.mv(q)
        a = jnp.vdot(q, w)
        # The invariance test is relative to this step's own scale ||A q||: what is left after
        # orthogonalising A q is rounding noise when it is below eps ||A q||. (Against the largest
        # value seen so far, a dominant eigenvalue would make every later step look invariant.)
        scale = jnp.linalg.norm(w)
        # Full reorthogonalisation against every basis vector so far, twice; this also removes
        # the a q + b q_prev terms of the three-term recurrence. (Rows past j are zero.)
        w = w - (Q @ w) @ Q
        w = w - (Q @ w) @ Q
        b = jnp.linalg.norm(w)
        invariant = ~(b > tiny * scale)  # (or NaN)
        alpha, beta = alpha.at[j].set(a), beta.at[j].set(jnp.where(invariant, 0.0, b))
        tick(progress, j + 1, m, unit="step")
        if restart:
            more = invariant & (j + 1 < m)
            q = lax.cond(more, lambda: _new_direction(Q), lambda: w / jnp.where(invariant, 1.0, b))
            q = jnp.where(invariant & ~more, 0.0, q)
            return j + 1, Q, alpha, beta, q, jnp.asarray(False), restarts + more.astype(restarts.dtype)
        q = jnp.where(invariant, 0.0, w / jnp.where(invariant, 1.0, b))
        return j + 1, Q, alpha, beta, q, invariant, restarts

    q0 = v0 / jnp.linalg.norm(v0)
    state = (jnp.asarray(0), jnp.zeros((m, n), dtype), jnp.zeros(m, dtype), jnp.zeros(m, dtype), q0,
             jnp.asarray(False), jnp.asarray(0))
    steps, Q, alpha, beta, q_next, _, restarts = lax.while_loop(cond, body, state)
    finish_after(progress, steps)  # a run that stopped early (an invariant Krylov space) ends its bar
    return Q, alpha, beta, steps, restarts, q_next


@eqx.filter_custom_vjp
def _tridiagonalise(operands, m, restart, progress=None):
    A, v0 = operands
    return _forward(A, v0, m, restart, progress)[:5]


@_tridiagonalise.def_fwd
def _tridiagonalise_fwd(perturbed, operands, m, restart, progress=None):
    A, v0 = operands
    Q, alpha, beta, steps, restarts, q_next = _forward(A, v0, m, restart, progress)
    return (Q, alpha, beta, steps, restarts), (Q, alpha, beta, steps, restarts, q_next)


@_tridiagonalise.def_bwd
def _tridiagonalise_bwd(residuals, cotangents, perturbed, operands, m, restart, progress=None):
    r"""The adjoint of the Lanczos relations, solved backwards (0-based steps $j$).

    With multipliers $\Lambda = [\lambda_0, \dots]$ for $AQ = QH + re^\top$, a symmetric $\Sigma$
    for $Q^\top Q = I$, $\gamma$ for $Q^\top r = 0$ and $\mu$ for the start vector, the
    stationarity conditions read, column by column,
    $\beta_{j-1}\lambda_{j-1} = \bar q_j + A\lambda_j - \alpha_j\lambda_j - \beta_j\lambda_{j+1}
    + Q\Sigma_{:,j} + \gamma_j r$, where the rows $l \le j$ of $\Sigma_{:,j}$ follow from
    $(Q^\top\lambda_{j-1})_l = \bar H_{l,j-1}$ and the rows $l > j$ from the symmetry of $\Sigma$.
    Then $\bar A = \sum_j \lambda_j q_j^\top$ (one VJP of $A \mapsto AQ$) and
    $\bar v = -\|v\|^{-1}(I - q_0 q_0^\top)\mu$.
    """
    A, v0 = operands
    Q, alpha, beta, steps, restarts, q_next = residuals
    Q_bar, alpha_bar, beta_bar, _, _ = cotangents
    undefined = jnp.where(restarts > 0, jnp.nan, 1.0).astype(Q.dtype)  # a restarted run has no derivative
    dtype = Q.dtype
    Q_bar = jnp.zeros_like(Q) if Q_bar is None else Q_bar
    alpha_bar = jnp.zeros_like(alpha) if alpha_bar is None else alpha_bar
    beta_bar = jnp.zeros_like(beta) if beta_bar is None else beta_bar
    s = steps
    last = s - 1
    idx = jnp.arange(m)
    b_last = beta[last]
    r = b_last * q_next
    r_bar = beta_bar[last] * q_next  # d||r||/dr = r/||r|| = q_next (zero after an early stop)
    gamma = jnp.where(idx == last, alpha_bar[last], 0.0).astype(dtype) - Q @ r_bar
    lam_last = r_bar + gamma @ Q

    def column(j, lam_j, lam_next, Sigma, known):
        """$\\Sigma_{:,j}$ and the right-hand side of the equation for $\\lambda_{j-1}$."""
        A_lam = A.mv(lam_j)
        c_j, c_next = Q @ lam_j, Q @ lam_next
        b_next = jnp.where(j < last, beta[j], 0.0)
        upper = beta[jnp.maximum(j - 1, 0)] * known - Q @ Q_bar[j] - Q @ A_lam + alpha[j] * c_j + b_next * c_next
        col = jnp.where(idx <= j, upper, Sigma[:, j])
        col = jnp.where(idx == 0, jnp.where(j == 0, 0.0, col), col)  # Sigma_00 is free: take 0
        rhs = Q_bar[j] + A_lam - alpha[j] * lam_j - b_next * lam_next + col @ Q + gamma[j] * r
        return col, rhs

    def cond(state):
        return state[0] >= 1

    def body(state):
        j, lam_j, lam_next, Sigma, Lam = state
        # Known components of Q^T lambda_{j-1}: H_bar[j-1, j-1] = alpha_bar, H_bar[j, j-1] = beta_bar.
        known = jnp.where(idx == j - 1, alpha_bar[j - 1], 0.0) + jnp.where(idx == j, beta_bar[j - 1], 0.0)
        known = known.astype(dtype)
        col, rhs = column(j, lam_j, lam_next, Sigma, known)
        Sigma = Sigma.at[:, j].set(col).at[j, :].set(col)
        lam_prev = rhs / beta[j - 1]
        # Re-impose the known components exactly (the backward recursion amplifies rounding).
        mask = (idx <= j).astype(dtype)
        lam_prev = lam_prev + (mask * (known - Q @ lam_prev)) @ Q
        Lam = Lam.at[j - 1].set(lam_prev)
        return j - 1, lam_prev, lam_j, Sigma, Lam

    Lam = jnp.zeros_like(Q).at[last].set(lam_last)
    state = (last, lam_last, jnp.zeros_like(lam_last), jnp.zeros((m, m), dtype), Lam)
    _, lam_0, lam_1, Sigma, Lam = lax.while_loop(cond, body, state)
    _, rhs0 = column(jnp.asarray(0), lam_0, lam_1, Sigma, jnp.zeros(m, dtype))
    mu = -rhs0
    q0 = Q[0]
    v_bar = -(mu - jnp.vdot(q0, mu) * q0) / jnp.linalg.norm(v0) * undefined
    Lam = Lam * undefined

    A_perturbed, v_perturbed = perturbed
    if any(jax.tree_util.tree_leaves(A_perturbed)):
        _, vjp = eqx.filter_vjp(lambda op: op.mm(Q.T), A)
        (A_bar,) = vjp(Lam.T)
        A_bar = jax.tree_util.tree_map(lambda g, p: g if p else None, A_bar, A_perturbed,
                                       is_leaf=lambda x: x is None)
    else:
        A_bar = jax.tree_util.tree_map(lambda _: None, A_perturbed)
    return A_bar, (v_bar if v_perturbed else None)


class LanczosLowRankOp(AbstractLowRank):
    r"""The top-``rank`` eigenpairs of a symmetric operator by Lanczos, as $U \Lambda U^\top$.

    A low-rank operator with orthonormal ``U`` (an `AbstractLowRank`, as `LowRank` is): it composes
    like one (a shift solves by Woodbury, `lo.logdet` by the determinant lemma, `lo.pinv` and `lo.sqrt`
    in closed form).
    ``residuals`` holds each Ritz pair's $\|A u_i - \lambda_i u_i\|$ (the convergence
    information: from the recurrence, or measured with ``A`` (``rank`` more products) after a restart or
    when a kept pair's recurrence residual is below the rounding floor, where it says nothing; NaN when
    built from an existing restarted `Lanczos` run, which no longer measures them) and ``steps`` the Lanczos
    steps run. The run restarts on an invariant Krylov
    space (`lanczos` with ``restart=True``), so ``rank`` orthonormal pairs come back whenever
    ``num_steps >= rank``. Differentiable in reverse mode through the adjoint of `lanczos`
    (when no restart was needed).

    Args:
        A: a symmetric operator.
        rank: the number of eigenpairs kept (largest in magnitude).
        key: PRNG key of the start vector.
        num_steps: Lanczos steps (default ``min(n, 2 rank + 10)``).
        progress: a label: a progress bar over the Lanczos steps (`lanczos`); None (default): none.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> A = lo.Diagonal(jnp.array([4.0, 2.0, 1e-3, 1e-3, 1e-3]))
        >>> L = lo.LanczosLowRankOp(A, 2, jax.random.key(0), num_steps=5)
        >>> L.d.round(4), bool(L.residuals.max() < 1e-4)
        (Array([4., 2.], dtype=float32), True)
        >>> round(float(lo.logdet(L + lo.Identity(5))), 3)   # log 5 + log 3, by the determinant lemma
        2.708
    """

    U: jax.Array
    d: jax.Array
    residuals: jax.Array
    steps: jax.Array
    V: None = None
    orthonormal: bool = eqx.field(static=True, default=True)
    nonnegative: bool = eqx.field(static=True, default=False)

    def __init__(self, A: LinearOperator | Lanczos, rank: int, key: jax.Array | None = None, *,
                 num_steps: int | None = None, progress: str | None = None):
        if isinstance(A, Lanczos):  # an existing run (e.g. `Lanczos.low_rank`)
            run, limit = A, A.alpha.shape[0]
        else:
            if not isinstance(A, LinearOperator):
                raise TypeError(f"LanczosLowRankOp: A must be a LinearOperator, got {type(A).__name__}")
            limit = A.shape[0]
        if not isinstance(rank, (int, np.integer)) or not 1 <= rank <= limit:
            raise ValueError(f"LanczosLowRankOp: rank must be an integer in [1, {limit}], got {rank!r}")
        operator = None
        if not isinstance(A, Lanczos):
            num_steps = min(limit, 2 * int(rank) + 10) if num_steps is None else num_steps
            if isinstance(num_steps, (int, np.integer)) and num_steps < rank:
                raise ValueError(f"LanczosLowRankOp: num_steps ({num_steps}) must be at least rank ({rank})")
            run, operator = lanczos(A, num_steps, key=key, restart=True, progress=progress), A
        w, U, residuals = run.ritz()  # NaN after a restart: the recurrence no longer measures them
        floor = rounding_floor(w, run.alpha.shape[0])
        U, w, residuals = U[:, :rank], w[:rank], residuals[:rank]
        if operator is not None:  # measured with A on the kept pairs only, where the recurrence cannot tell
            unmeasured = (run.restarts > 0) | jnp.any(residuals < floor)
            residuals = lax.cond(unmeasured, lambda: _true_residuals(operator, U, w), lambda: residuals)
        self.U, self.d = U, w
        self.nonnegative = is_known_nonnegative(w, None)
        self.residuals = residuals
        self.steps = run.steps


__all__ = ["Lanczos", "LanczosLowRankOp", "lanczos"]
