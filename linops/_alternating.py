r"""`AlternatingProjectionOp`: the projector onto $\ker M$ of a row-partitioned $M$, batch by batch.

$M$ is split into row blocks $M_b$ (batches of examples); $Q_b = I - M_b^\top (M_b M_b^\top)^+ M_b$
projects onto $\ker M_b$, and $\ker M = \cap_b \ker M_b$. Only the small ``R x R`` factors of
$M_b M_b^\top$ are stored (``R`` rows per batch); each $Q_b$ costs one product with $M_b$, an
``R x R`` product and one with $M_b^\top$. All batches go through ONE `lax.scan` over the
stacked factors.

Two ways to apply the projector $\Pi$:

- ``method="cg"`` (default): the symmetric sweep $T = Q_1 \cdots Q_B \cdots Q_1$ is symmetric PSD
  with eigenvalue 1 exactly on $\ker M$; conjugate gradients on $(I - T) u = (I - T) x$ (from
  $u_0 = 0$, $u$ stays in $\operatorname{range} M^\top$) give $\Pi x = x - u$. Stopped when
  $\|r\| \le \mathrm{rtol} \max(\|(I - T)x\|, \|x\|)$: run on past convergence, CG on this singular
  system diverges.
- ``method="plain"``: the paper's $(Q_B \cdots Q_1)^t x$, a fixed number of sweeps, linear
  convergence at the Kayalar-Weinert rate (slow when the batches' row spaces are nearly aligned).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linops import _tags
from linops._base import LinearOperator, describe, new_key
from linops._cg import cg
from linops._nn import _check_model
from linops._projector import gram_factor
from linops.memory import check_fits
from linops.models import ravel


class Projection(eqx.Module):
    """The result of `AlternatingProjectionOp.project`.

    Attributes:
        value: $\\Pi x$.
        sweeps: sweeps over all batches that were run.
        converged: whether the stopping rule was met (always True for a fixed ``plain`` run).
        kernel_residual: $\\|M \\Pi x\\| / \\|M x\\|$ (0 for an exact projection; 1 for none).
        residuals: per-iteration residuals (CG's relative residual, or the plain method's
            relative change per sweep), NaN past the last iteration.
    """

    value: jax.Array
    sweeps: jax.Array
    converged: jax.Array
    kernel_residual: jax.Array
    residuals: jax.Array


def _pad_indices(n, batch_size):
    """Example indices per batch; the short last batch repeats its own examples (same row space)."""
    full, rest = divmod(n, batch_size)
    idx = [np.arange(b * batch_size, (b + 1) * batch_size) for b in range(full)]
    if rest:
        tail = np.arange(full * batch_size, n)
        idx.append(tail[np.arange(batch_size) % rest])
    return np.stack(idx)


class AlternatingProjectionOp(LinearOperator):
    r"""The orthogonal projector onto $\ker M$ by alternating projections over row batches.

    Build it with `AlternatingProjectionOp.from_jacobian` (rows of a network's Jacobian, the
    projected posterior), `from_loss_jacobian` (the loss-projected posterior) or `from_matrix`.
    ``A @ x`` applies the projector; `project` also returns the diagnostics.

    Args (of the constructors):
        batch_size: examples (rows) per batch ``S``; the short last batch is projected too.
        method: ``"cg"`` (accelerated, default) or ``"plain"`` (the paper's sweeps).
        max_sweeps: the iteration cap (CG steps, or plain sweeps).
        rtol: CG's relative residual tolerance (default ``sqrt(eps)``); for ``"plain"``,
            stop when a sweep changes the vector by less than ``rtol`` relatively (0: never).
        cutoff: relative eigenvalue cut-off of each Gram $M_b M_b^\top$ (default ``max(R, P) eps``).
        progress: print the sweep count and residual to stderr as the iteration runs (off by
            default; it adds a host callback per sweep).

    Example:
        >>> import jax.numpy as jnp, linops as lo
        >>> M = jnp.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
        >>> Pi = lo.AlternatingProjectionOp.from_matrix(M, batch_size=1)
        >>> (Pi @ jnp.array([1.0, 1.0, 1.0])).round(5) + 0.0   # + 0.0 turns -0. into 0.
        Array([0., 0., 1.], dtype=float32)
    """

    params: object
    data: object
    W: jax.Array
    forward: Callable = eqx.field(static=True)
    backward: Callable = eqx.field(static=True)
    size: int = eqx.field(static=True)
    dtype_: np.dtype = eqx.field(static=True)
    method: str = eqx.field(static=True)
    max_sweeps: int = eqx.field(static=True)
    rtol: float = eqx.field(static=True)
    progress: bool = eqx.field(static=True)
    uid: int = eqx.field(static=True)

    def __init__(self, params, data, forward, backward, rows, size, dtype, *, method="cg", max_sweeps=500,
                 rtol=None, cutoff=None, progress=False):
        if method not in ("cg", "plain"):
            raise ValueError(f"AlternatingProjectionOp: method must be 'cg' or 'plain', got {method!r}")
        if int(max_sweeps) < 1:
            raise ValueError(f"AlternatingProjectionOp: max_sweeps must be >= 1, got {max_sweeps}")
        self.params, self.data, self.forward, self.backward = params, data, forward, backward
        self.size, self.dtype_ = int(size), np.dtype(dtype)
        batches = jax.tree_util.tree_leaves(data)[0].shape[0]
        check_fits(  # the stored factors, plus one batch's R x R and R x P products while building them
            (batches * rows * rows + rows * rows + rows * self.size) * self.dtype_.itemsize,
            f"AlternatingProjectionOp: the factors of {batches} batches of {rows} rows ({self.size} parameters)",
            "use a smaller batch_size, or from_loss_jacobian (one row per example whatever the outputs)",
        )
        eye = jnp.eye(rows, dtype=self.dtype_)

        def factor(data_b):
            # The Gram M_b M_b^T by R products M_b (M_b^T e_i): M_b is never materialised.
            gram = jax.vmap(lambda e: forward(params, data_b, backward(params, data_b, e)))(eye)
            return gram_factor(gram, (rows, self.size), cutoff)[0]

        self.W = lax.map(factor, data)
        self.method, self.max_sweeps = method, int(max_sweeps)
        default = float(np.sqrt(np.finfo(self.dtype_).eps)) if method == "cg" else 0.0
        self.rtol = default if rtol is None else float(rtol)
        self.progress = bool(progress)
        self.uid = new_key()

    # --- constructors ------------------------------------------------------------------

    @classmethod
    def from_matrix(cls, M, *, batch_size: int, **options) -> AlternatingProjectionOp:
        """Projector onto $\\ker M$ for a wide matrix ``M``, in batches of ``batch_size`` rows."""
        M = jnp.asarray(M)
        if M.ndim != 2:
            raise ValueError(f"AlternatingProjectionOp: M must be 2-D, got shape {M.shape}")
        _check_batch(batch_size, M.shape[0])
        blocks = M[_pad_indices(M.shape[0], batch_size)]  # (B, S, P)
        return cls(None, blocks, lambda _, Mb, v: Mb @ v, lambda _, Mb, u: u @ Mb, batch_size, M.shape[1],
                   M.dtype, **options)

    @classmethod
    def from_jacobian(cls, fn, params, inputs, *, batch_size: int, **options) -> AlternatingProjectionOp:
        """Projector onto $\\ker J$, $J$ the Jacobian of ``fn(params, x) -> (O,)`` on ``inputs``."""
        n, o = _check_model(fn, params, inputs, "AlternatingProjectionOp")
        _check_batch(batch_size, n)
        flat, unravel = ravel(params)
        data = jax.tree_util.tree_map(lambda a: a[_pad_indices(n, batch_size)], inputs)

        def batched(p, xb):
            return lambda q: jax.vmap(fn, in_axes=(None, 0))(q, xb)

        def forward(p, xb, v):
            return jax.jvp(batched(p, xb), (p,), (unravel(v),))[1].reshape(-1)

        def backward(p, xb, u):
            out, vjp = jax.vjp(batched(p, xb), p)
            return ravel(vjp(u.reshape(out.shape).astype(out.dtype))[0])[0]

        return cls(params, data, forward, backward, batch_size * o, flat.shape[0], flat.dtype, **options)

    @classmethod
    def from_loss_jacobian(cls, fn, params, inputs, targets, likelihood, *, batch_size: int,
                           **options) -> AlternatingProjectionOp:
        """Projector onto $\\ker J_L$ (rows $g_n^\\top J_n$): one row per example, whatever ``O``."""
        from linops._nn import LossJacobianOp

        JL = LossJacobianOp(fn, params, inputs, targets, likelihood)  # validates everything
        n = JL.num_examples
        _check_batch(batch_size, n)
        flat, unravel = ravel(params)
        lik_axis = 0 if likelihood.per_example else None
        pad = _pad_indices(n, batch_size)
        data = (jax.tree_util.tree_map(lambda a: a[pad], inputs), jax.tree_util.tree_map(lambda a: a[pad], targets),
                jax.tree_util.tree_map(lambda a: a[pad], likelihood) if lik_axis == 0 else None)

        def grads(p, data_b):
            xb, yb, lb = data_b
            f = lambda q: jax.vmap(fn, in_axes=(None, 0))(q, xb)  # noqa: E731
            lik = lb if lik_axis == 0 else likelihood
            g = jax.vmap(lambda l_, o_, y_: l_.grad(o_, y_), in_axes=(lik_axis, 0, 0))(lik, f(p), yb)
            return f, lax.stop_gradient(g)

        def forward(p, data_b, v):
            f, g = grads(p, data_b)
            return jnp.sum(g * jax.jvp(f, (p,), (unravel(v),))[1], axis=-1)

        def backward(p, data_b, u):
            f, g = grads(p, data_b)
            _, vjp = jax.vjp(f, p)
            return ravel(vjp(u[:, None].astype(g.dtype) * g)[0])[0]

        return cls(params, data, forward, backward, batch_size, flat.shape[0], flat.dtype, **options)

    # --- the operator --------------------------------------------------------------------

    @property
    def shape(self):
        return (self.size, self.size)

    @property
    def dtype(self):
        return self.dtype_

    @property
    def tags(self):
        return _tags.close({_tags.projector}, self.shape)

    @property
    def num_batches(self) -> int:
        return self.W.shape[0]

    def _q(self, v, data_b, W_b):
        return v - self.backward(self.params, data_b, W_b.T @ (W_b @ self.forward(self.params, data_b, v)))

    def sweep(self, v):
        """$Q_B \\cdots Q_1 v$: one pass over the batches."""
        return lax.scan(lambda v, b: (self._q(v, *b), None), v, (self.data, self.W))[0]

    def symmetric_sweep(self, v):
        """$Q_1 \\cdots Q_{B-1} Q_B Q_{B-1} \\cdots Q_1 v$ (symmetric PSD)."""
        v = self.sweep(v)
        rest = jax.tree_util.tree_map(lambda a: a[:-1], (self.data, self.W))
        return lax.scan(lambda v, b: (self._q(v, *b), None), v, rest, reverse=True)[0]

    def _kernel_norm(self, v):
        return jnp.sqrt(lax.map(lambda b: jnp.sum(self.forward(self.params, b, v) ** 2), self.data).sum())

    def project(self, x) -> Projection:
        """$\\Pi x$ with its diagnostics (a `Projection`)."""
        x = jnp.asarray(x, self.dtype)
        if x.shape != (self.size,):
            raise ValueError(f"{describe(self)}.project: expected x of shape ({self.size},), got {x.shape}")
        history = jnp.full(self.max_sweeps, jnp.nan, x.dtype)
        if self.method == "cg":
            value, sweeps, converged, history = self._project_cg(x, history)
        else:
            value, sweeps, converged, history = self._project_plain(x, history)
        before = self._kernel_norm(x)
        kernel = self._kernel_norm(value) / jnp.where(before > 0, before, 1.0)
        return Projection(value, sweeps, converged, kernel, history)

    def _project_cg(self, x, history):
        def I_minus_T(u):
            return u - self.symmetric_sweep(u)

        b = I_minus_T(x)
        # Relative to ||x||, not ||b||: for x (nearly) in the kernel, b is rounding noise with a
        # part outside range(I - T), and chasing it to a relative tolerance diverges.
        atol = self.rtol * jnp.linalg.norm(x)
        u, converged, steps, residual = cg(I_minus_T, b, rtol=self.rtol, atol=atol, maxiter=self.max_sweeps,
                                           callback=_report if self.progress else None)
        history = history.at[jnp.maximum(steps - 1, 0)].set(residual / jnp.maximum(jnp.linalg.norm(b), 1e-300))
        return x - u, steps + 1, converged, history

    def _project_plain(self, x, history):
        def cond(state):
            _, k, change, _ = state
            return (k < self.max_sweeps) & (change > self.rtol)

        def body(state):
            v, k, _, hist = state
            new = self.sweep(v)
            change = jnp.linalg.norm(new - v) / jnp.maximum(jnp.linalg.norm(v), jnp.finfo(v.dtype).tiny)
            if self.progress:
                jax.debug.callback(_report, k + 1, change)
            return new, k + 1, change, hist.at[k].set(change)

        v, k, change, history = lax.while_loop(cond, body, (x, jnp.asarray(0), jnp.asarray(jnp.inf, x.dtype), history))
        return v, k, (change <= self.rtol) | (self.rtol == 0), history

    def mv(self, v):
        return self.project(v).value

    rmv = mv

    def transpose(self):
        return self

    def _sqrt(self):
        return self

    def _pinv(self, rtol):
        return self


def _report(sweep, residual):
    print(f"\rAlternatingProjectionOp: sweep {int(sweep)}, residual {float(residual):.2e}", end="",
          file=sys.stderr, flush=True)


def _check_batch(batch_size, n):
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"AlternatingProjectionOp: batch_size must be a positive integer, got {batch_size!r}")
    if batch_size > n:
        raise ValueError(f"AlternatingProjectionOp: batch_size {batch_size} is larger than the {n} examples")


__all__ = ["AlternatingProjectionOp", "Projection"]
