r"""Sketched Lanczos: the top eigenpairs of a symmetric operator without keeping its Krylov basis.

`lanczos` keeps every basis vector (``m x n`` numbers: at 10⁷ parameters and 100 steps, 4 GB in float32).
`sketched_lanczos` runs the three-term recurrence without reorthogonalisation, so it holds three
``n``-vectors, and compresses each basis vector $v_j$ as it is made by a subspace embedding $S$
(``s x n``, `Sketch`): the basis is kept as $SV$ (``s x m``). The tridiagonal $T$ is Lanczos's own, so its
Ritz values are those of a Lanczos run without reorthogonalisation; each Ritz vector $u_i = V y_i$ is known
through its sketch $S u_i = (SV) y_i$ alone.

Without reorthogonalisation, an eigenvalue that has converged comes back as a copy (a "ghost") whose Ritz
vector is nearly parallel to the first. `SketchedLanczos.low_rank` walks the Ritz pairs from the largest
down and keeps a pair only when its sketched vector adds a new direction to those kept (more than half its
norm outside their span), orthonormalising them in the sketch: $Q$ (``s x r``). For a vector $w$,
$U^\top w \approx Q^\top S w$ and $\|w - UU^\top w\|^2$ (the part of $w$ the top eigenvectors do not
explain) $\approx \|(I - QQ^\top) S w\|^2$. The errors are those of the embedding on the span of
$\{u_1, \dots, u_r, w\}$: for a sketch of ``s`` rows, a squared norm is typically read to a relative
$\sqrt{2/s}$ and at worst about $\sqrt{(r + 1)/s}$; none at ``s = n``, where $S$ is orthogonal. The
sketch's own memory is small (``s x m`` numbers), so ``s`` can be thousands.

This is the construction of Miani, Beretta and Hauberg, "Sketched Lanczos uncertainty score: a low-memory
summary of the Fisher information" (NeurIPS 2024), written here with a deduplication of the ghosts by their
residuals and sketched Ritz vectors (a public implementation of the score, read for `docs/comparison.md`, takes
an SVD of the sketched vectors scaled by their Ritz values, which inflates a ghost pair's value to
$\sqrt{2}\lambda$).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.fft import dct, idct

from linops.algebra._arrays import describe
from linops.algebra._base import LinearOperator
from linops.algebra._tags import symmetric
from linops.numerics._lanczos import tridiagonal
from linops.runtime._progress import check_label, finish_after, tick

BLOCK = 1 << 16
"""Coordinates per block of a large `Sketch`'s transform (its temporaries are one block's, not ``n``'s)."""

MIN_ROWS = 256
"""Fewest sketch rows a block keeps: fewer blocks than that would leave each too few rows to mix."""


def _layout(n: int, size: int) -> tuple[int, int]:
    """``(blocks, block length)`` of a sketch of ``size`` rows of ``n`` coordinates: at ``size = n`` one block of
    ``n`` (an orthogonal map); else blocks of a power of two (fast transforms), at least `BLOCK` long (or ``n``
    rounded up, when smaller), and few enough that each keeps `MIN_ROWS` rows where ``size`` allows."""
    if size == n:
        return 1, n
    target = max(min(n, BLOCK), -(-n // max(1, size // MIN_ROWS)))
    b = 1 << (target - 1).bit_length()
    return -(-n // b), b


class Sketch(LinearOperator):
    r"""A subsampled randomised trigonometric transform, ``s x n``, by blocks: $S v = \sqrt{b/s_b}\, R\, C\, D v$.

    $D$ flips the signs of the coordinates at random; the coordinates, zero-padded, are dealt into $B$ blocks
    of $b$ (a power of two; block $i$ holds coordinates $i, i + B, i + 2B, \dots$, so that a contiguous range,
    such as one layer's weights, spreads over every block); $C$ is the orthonormal discrete cosine transform
    (type II) of each block, and $R$ keeps $s_b$ of each block's $b$ rows, drawn without replacement
    ($s = B s_b$). One block (up to $2^{16}$ coordinates) is the classic transform; at ``s = n`` it is one
    unpadded block, an orthogonal matrix. Blocks keep the transform's temporaries to one block's instead of
    several ``n``-vectors, and each keeps at least `MIN_ROWS` rows where ``s`` allows. $S$ embeds any fixed
    ``r``-dimensional subspace with relative distortion about $\sqrt{r/s}$ (norms and inner products of its
    vectors are kept to that accuracy; one vector's squared norm typically to $\sqrt{2/s}$). It stores ``n``
    signs (one byte each) and ``s`` row indices, and a product costs one transform, $O(n \log b)$. Build one
    with `sketch`.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> S = lo.sketch(1000, 200, key=jax.random.key(0))
        >>> S.shape
        (200, 1000)
        >>> v = jax.random.normal(jax.random.key(1), (1000,))
        >>> bool(abs(jnp.linalg.norm(S @ v) / jnp.linalg.norm(v) - 1) < 0.2)   # the norm, roughly kept
        True
        >>> Q = lo.sketch(6, 6, key=jax.random.key(0)).as_matrix()       # s = n: orthogonal
        >>> bool(jnp.allclose(Q @ Q.T, jnp.eye(6), atol=1e-5))
        True
    """

    signs: jax.Array  # (n,) int8, +-1
    rows: jax.Array  # (B, s_b) int32: each block's rows, distinct within the block
    _dtype: str = eqx.field(static=True, default="float32")
    block: int = eqx.field(static=True, default=0)  # b, the (padded) block length; 0: n

    @property
    def shape(self):
        return (self.rows.shape[0] * self.rows.shape[1], self.signs.shape[0])

    @property
    def dtype(self):
        return jnp.dtype(self._dtype)

    @property
    def _block(self) -> int:
        return self.block or self.signs.shape[0]

    def _scale(self, dtype):
        return jnp.asarray(math.sqrt(self._block / self.rows.shape[1]), dtype)

    def mv(self, v):
        return self.mm(v[:, None])[:, 0]

    def mm(self, V):
        (n, c), (B, sb), b = V.shape, self.rows.shape, self._block

        def block(a):  # block i's coordinates read from V (zero past n): no padded copy of V
            i, rows = a
            idx = i + B * jnp.arange(b)  # every B-th coordinate: a contiguous range (a layer) spreads over all
            x = jnp.where((idx < n)[:, None], V[jnp.minimum(idx, n - 1)], 0.0)
            x = x * self.signs[jnp.minimum(idx, n - 1)].astype(V.dtype)[:, None]
            return dct(x, type=2, norm="ortho", axis=0)[rows]

        if B == 1:
            Y = block((0, self.rows[0]))
        else:
            Y = lax.map(block, (jnp.arange(B), self.rows)).reshape(B * sb, c)  # one block's temporaries at a time
        return Y * self._scale(V.dtype)

    def rmv(self, u):
        return self.rmm(u[:, None])[:, 0]

    def rmm(self, U):
        (B, sb), b, n, c = self.rows.shape, self._block, self.signs.shape[0], U.shape[1]

        def block(a):
            u, rows = a
            return idct(jnp.zeros((b, c), U.dtype).at[rows].set(u), type=2, norm="ortho", axis=0)

        if B == 1:
            Z = block((U, self.rows[0]))[:n]
        else:
            Z = lax.map(block, (U.reshape(B, sb, c), self.rows))  # (B, b, c): block i holds coordinates i + B j
            Z = jnp.swapaxes(Z, 0, 1).reshape(B * b, c)[:n]
        return self.signs.astype(U.dtype)[:, None] * Z * self._scale(U.dtype)


def sketch(n: int, size: int, *, key: jax.Array, dtype=jnp.float32) -> Sketch:
    """A `Sketch` (``size x n``) drawn with ``key``: random signs and each block's rows of the cosine transform.
    With several blocks (``n`` above $2^{16}$ and ``size < n``), ``size`` is rounded down to a multiple of their
    number (``S.shape[0]`` says what was kept).

    Examples:
        >>> import jax, linops as lo
        >>> lo.sketch(10, 4, key=jax.random.key(0)).shape
        (4, 10)
        >>> lo.sketch(200_000, 1000, key=jax.random.key(0)).shape   # 4 blocks of 2^16 coordinates, 250 rows each
        (1000, 200000)
        >>> lo.sketch(10, 11, key=jax.random.key(0))
        Traceback (most recent call last):
        ...
        ValueError: sketch: size must be an integer in [1, n=10], got 11
    """
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"sketch: n must be a positive integer, got {n!r}")
    if not isinstance(size, (int, np.integer)) or not 1 <= size <= n:
        raise ValueError(f"sketch: size must be an integer in [1, n={n}], got {size!r}")
    if key is None:
        raise ValueError("sketch: pass key=jax.random.key(...): the signs and rows are drawn at random")
    n, size = int(n), int(size)
    B, b = _layout(n, size)
    sb = size // B
    k_signs, k_rows = jax.random.split(key)
    signs = jnp.where(jax.random.bernoulli(k_signs, 0.5, (n,)), 1, -1).astype(jnp.int8)
    rows = jax.vmap(lambda k: jax.random.permutation(k, b)[:sb])(jax.random.split(k_rows, B)).astype(jnp.int32)
    return Sketch(signs, rows, jnp.dtype(dtype).name, b)


class SketchedEigenbasis(eqx.Module):
    r"""The top eigenpairs of a symmetric operator held as sketches: values $\lambda$ (``r``), an orthonormal
    ``s x r`` basis $Q$ of the sketched eigenvectors, and the `Sketch` that maps a vector into its space
    (`SketchedLanczos.low_rank`). $U^\top w \approx Q^\top S w$.

    Attributes:
        values: ``(r,)`` Ritz values, largest first; entries past ``rank`` are zero.
        basis: ``(s, r)`` orthonormal sketched eigenvectors; columns past ``rank`` are zero.
        residuals: ``(r,)`` each pair's residual $\|A u - \lambda u\| / \|u\|$ from the recurrence (the
            convergence information: each is at most ``tol`` $\lambda$; below about ``m`` times the dtype's
            epsilon times $\lambda_1$ it measures rounding, not convergence).
        rank: how many distinct pairs were found (at most ``r``; fewer when the run had fewer distinct
            directions than asked for).
        sketch: the `Sketch`.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> d = jnp.array([4.0, 2.0] + [0.01] * 198)
        >>> top = lo.sketched_lanczos(lo.Diagonal(d), 10, 200, key=jax.random.key(0)).low_rank(2)
        >>> w = jnp.zeros(200).at[0].set(3.0).at[5].set(4.0)   # 3 e_0 + 4 e_5: e_0 is the top eigenvector
        >>> jnp.abs(top.coefficients(w)).round(2)               # |U^T w| (s = n: exact)
        Array([3., 0.], dtype=float32)
        >>> top.residual_norms(w).round(2)                      # ||w - U U^T w||^2 = 4^2
        Array(16., dtype=float32)
    """

    values: jax.Array
    basis: jax.Array
    residuals: jax.Array
    rank: jax.Array
    sketch: Sketch

    def coefficients(self, W: jax.Array) -> jax.Array:
        r"""$U^\top W \approx Q^\top S W$ for ``W`` of shape ``(n,)`` or ``(n, c)``."""
        return self.split(W)[0]

    def residual_norms(self, W: jax.Array) -> jax.Array:
        r"""$\|w - UU^\top w\|^2$ per column of ``W`` (``(n,)`` or ``(n, c)``): the squared norm of what the
        eigenvectors do not explain (the SLU score).

        Read as $\|(I - QQ^\top) S w\|^2$, the sketched least-squares residual of $w$ on the sketched basis,
        not as $\|w\|^2 - \|Q^\top S w\|^2$: where $w$ lies mostly in the eigenvectors' span the difference
        of two nearly equal numbers would carry the sketch's error of $\|w\|^2$ into a small result, while the
        residual is within the embedding's relative error of the true one (exact at ``s = n``).
        """
        return self.split(W)[1]

    def split(self, W: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(coefficients(W), residual_norms(W))`` from one product with the sketch."""
        SW = self.sketch @ W
        C = self.basis.T @ SW
        R = SW - self.basis @ C
        return C, jnp.sum(R**2, axis=0)


class SketchedLanczos(eqx.Module):
    """The result of `sketched_lanczos`: the sketched basis, the tridiagonal and the steps run.

    Attributes:
        sketch: the `Sketch` $S$ (``s x n``).
        SV: ``(s, m)`` the sketches of the Lanczos vectors (columns past ``steps`` are zero).
        alpha: ``(m,)`` the diagonal of $T$.
        beta: ``(m,)`` the off-diagonal of $T$; ``beta[steps - 1]`` is the residual norm of the last step.
        steps: the steps run (fewer than ``m`` when the Krylov space became invariant).

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> A = lo.Diagonal(jnp.linspace(1.0, 2.0, 500))
        >>> run = lo.sketched_lanczos(A, 30, 100, key=jax.random.key(0))
        >>> run.SV.shape, int(run.steps)          # 100 x 30 numbers kept, not 500 x 30
        ((100, 30), 30)
        >>> float(run.low_rank(1).values[0]) > 1.99
        True
    """

    sketch: Sketch
    SV: jax.Array
    alpha: jax.Array
    beta: jax.Array
    steps: jax.Array

    def tridiagonal(self) -> jax.Array:
        """$T$ as a dense ``(m, m)`` matrix (zero past ``steps``)."""
        return tridiagonal(self.alpha, self.beta, self.steps)

    def low_rank(self, rank: int, *, tol: float = 1e-2, new_direction: float = 0.5) -> SketchedEigenbasis:
        r"""The top ``rank`` converged, distinct Ritz pairs (largest values first) as a `SketchedEigenbasis`.

        Walking down from the largest Ritz value, a pair is kept when

        - it has converged: its residual $\|A u - \theta u\| / \|u\|$ (from the recurrence) is at most
          ``tol`` $|\theta|$, so an eigenvalue of $A$ lies within ``tol`` (relative) of $\theta$. Without
          reorthogonalisation a Ritz value on its way to becoming a ghost sits between eigenvalues with a
          residual of its own size; this drops it, and so does a pair that has not converged yet;
        - it is the best converged of its copies: it is skipped when another pair that passes the test above,
          with a smaller residual, has a sketched vector within ``new_direction`` of its own (the sine of their
          angle). A copy still on its way to convergence can sit just above the converged one (8.000014, residual
          8e-3, over 8.0, residual 1e-22, was seen): the walk by value would keep it and skip the better copy;
        - it is new: more than ``new_direction`` of its sketched vector's norm lies outside the span of the
          pairs kept before it. A ghost copy of a converged eigenvalue (nearly parallel to its first copy) is
          skipped.

        ``rank`` in the result says how many were found: fewer than asked when the run had too few converged
        distinct pairs (run more steps).
        """
        m = self.alpha.shape[0]
        if not isinstance(rank, (int, np.integer)) or not 1 <= rank <= m:
            raise ValueError(f"SketchedLanczos.low_rank: rank must be an integer in [1, {m}] (the steps), got "
                             f"{rank!r}")
        if not tol > 0:
            raise ValueError(f"SketchedLanczos.low_rank: tol must be positive, got {tol!r}")
        if not 0.0 < new_direction < 1.0:
            raise ValueError(f"SketchedLanczos.low_rank: new_direction must be in (0, 1), got {new_direction!r}")
        w, Y = jnp.linalg.eigh(self.tridiagonal())
        # T's zero padding past `steps` gives Ritz vectors with a zero sketch: never kept (norm > 0 below)
        order = jnp.argsort(-w)
        w, Y = w[order], Y[:, order]
        Z = self.SV @ Y  # (s, m) sketched Ritz vectors
        res = jnp.abs(self.beta[jnp.maximum(self.steps - 1, 0)] * Y[jnp.maximum(self.steps - 1, 0)])
        s, dtype = self.SV.shape[0], self.SV.dtype
        norms = jnp.linalg.norm(Z, axis=0)
        safe = jnp.where(norms > 0, norms, 1.0)
        rel = res / safe
        converged = (norms > 0) & (rel <= tol * jnp.abs(w))
        cos = (Z / safe[None, :]).T @ (Z / safe[None, :])
        close = 1.0 - cos**2 <= new_direction**2  # sin^2 of the angle between two sketched Ritz vectors
        dominated = jnp.any(close & converged[None, :] & (rel[None, :] < rel[:, None]), axis=1)

        def body(i, state):
            Q, values, residuals, count = state
            z, norm, relative = Z[:, i], norms[i], rel[i]
            r = z - Q @ (Q.T @ z)
            r = r - Q @ (Q.T @ r)
            rn = jnp.linalg.norm(r)
            keep = (count < rank) & (rn > new_direction * norm) & converged[i] & ~dominated[i]
            col = jnp.where(keep, r / jnp.where(keep, rn, 1.0), 0.0)
            Q = jnp.where(keep, Q.at[:, jnp.minimum(count, rank - 1)].set(col), Q)
            values = jnp.where(keep, values.at[jnp.minimum(count, rank - 1)].set(w[i]), values)
            residuals = jnp.where(keep, residuals.at[jnp.minimum(count, rank - 1)].set(relative), residuals)
            return Q, values, residuals, count + keep.astype(count.dtype)

        init = (jnp.zeros((s, rank), dtype), jnp.zeros(rank, dtype), jnp.zeros(rank, dtype), jnp.asarray(0))
        Q, values, residuals, count = lax.fori_loop(0, m, body, init)
        return SketchedEigenbasis(values, Q, residuals, count, self.sketch)


def sketched_lanczos(A: LinearOperator, num_steps: int, sketch_size: int, *, key: jax.Array, v0=None,
                     progress: str | None = None) -> SketchedLanczos:
    r"""``num_steps`` Lanczos steps on the symmetric operator ``A`` keeping the basis only as a sketch.

    The recurrence runs without reorthogonalisation (each new vector is orthogonalised twice against the
    two before it only), so memory is three ``n``-vectors, the `Sketch` (``n`` bytes) and the ``s x m``
    sketched basis, against `lanczos`'s ``m x n`` basis. ``sketch_size`` is ``s``: many times the rank
    wanted (a squared norm is read to a relative error of about $\sqrt{2/s}$, `SketchedEigenbasis`). The
    start vector is ``v0`` when given, else drawn with ``key``; the sketch is drawn with ``key`` too. Take the
    eigenpairs with `SketchedLanczos.low_rank`. ``progress``: a label for a progress bar over the steps, or None.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> d = jnp.concatenate([jnp.array([9.0, 5.0, 3.0]), 0.01 * jnp.ones(997)])
        >>> run = lo.sketched_lanczos(lo.Diagonal(d), 20, 100, key=jax.random.key(0))
        >>> top = run.low_rank(3)
        >>> top.values.round(2), int(top.rank)
        (Array([9., 5., 3.], dtype=float32), 3)
        >>> e0 = jnp.zeros(1000).at[0].set(1.0)   # the top eigenvector: nothing left outside the basis
        >>> bool(top.residual_norms(e0) < 0.1)
        True
    """
    if not isinstance(A, LinearOperator):
        raise TypeError(f"sketched_lanczos: A must be a LinearOperator, got {type(A).__name__}")
    n = A.shape[0]
    if A.shape[0] != A.shape[1] or symmetric not in A.tags:
        raise ValueError(f"sketched_lanczos: {describe(A)} must be square and tagged symmetric, got shape "
                         f"{A.shape} and tags {sorted(A.tags)}")
    if not isinstance(num_steps, (int, np.integer)) or not 1 <= num_steps <= n:
        raise ValueError(f"sketched_lanczos: num_steps must be an integer in [1, {n}] for {describe(A)}, got "
                         f"{num_steps!r}")
    if not isinstance(sketch_size, (int, np.integer)) or not 1 <= sketch_size <= n:
        raise ValueError(f"sketched_lanczos: sketch_size must be an integer in [1, {n}] for {describe(A)}, got "
                         f"{sketch_size!r}")
    if key is None:
        raise ValueError("sketched_lanczos: pass key=jax.random.key(...) (the sketch, and the start vector "
                         "unless v0 is given)")
    check_label(progress, "sketched_lanczos")
    k_sketch, k_start = jax.random.split(key)
    S = sketch(n, int(sketch_size), key=k_sketch, dtype=A.dtype)
    v0 = jax.random.normal(k_start, (n,), A.dtype) if v0 is None else jnp.asarray(v0, A.dtype)
    if v0.shape != (n,):
        raise ValueError(f"sketched_lanczos: v0 must have shape ({n},) for {describe(A)}, got {v0.shape}")
    SV, alpha, beta, steps = _recurrence(A, S, v0, int(num_steps), progress)
    return SketchedLanczos(S, SV, alpha, beta, steps)


def _recurrence(A, S, v0, m, progress):
    """The three-term recurrence: ``(SV (s, m), alpha, beta, steps)``."""
    n, dtype = v0.shape[0], A.dtype
    tiny = float(np.finfo(dtype).eps) * m

    def cond(state):
        j, *_, done = state
        return (j < m) & ~done

    def body(state):
        j, SV, alpha, beta, q, q_prev, b_prev, _ = state
        SV = SV.at[:, j].set(S.mv(q))
        w = A.mv(q)
        scale = jnp.linalg.norm(w)
        w = w - b_prev * q_prev
        a = jnp.vdot(q, w)
        w = w - a * q
        for _ in range(2):  # local reorthogonalisation against the two latest vectors only
            w = w - jnp.vdot(q, w) * q - jnp.vdot(q_prev, w) * q_prev
        b = jnp.linalg.norm(w)
        invariant = ~(b > tiny * scale)
        alpha, beta = alpha.at[j].set(a), beta.at[j].set(jnp.where(invariant, 0.0, b))
        tick(progress, j + 1, m, unit="step")
        q_next = jnp.where(invariant, 0.0, w / jnp.where(invariant, 1.0, b))
        return j + 1, SV, alpha, beta, q_next, q, b, invariant

    q0 = v0 / jnp.linalg.norm(v0)
    state = (jnp.asarray(0), jnp.zeros((S.shape[0], m), dtype), jnp.zeros(m, dtype), jnp.zeros(m, dtype), q0,
             jnp.zeros(n, dtype), jnp.zeros((), dtype), jnp.asarray(False))
    steps, SV, alpha, beta, *_ = lax.while_loop(cond, body, state)
    finish_after(progress, steps)
    return SV, alpha, beta, steps


__all__ = ["Sketch", "SketchedEigenbasis", "SketchedLanczos", "sketch", "sketched_lanczos"]
