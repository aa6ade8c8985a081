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

import contextlib
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp

from linops.algebra import _tags
from linops.algebra._arrays import describe
from linops.algebra._base import LinearOperator
from linops.algebra._cg import cg
from linops.nn import _sweeps
from linops.nn._rowblocks import RowBlocks
from linops.nn._rowsources import jacobian_rows, loss_jacobian_rows, matrix_rows
from linops.runtime import _progress
from linops.runtime._compile import program


class Projection(eqx.Module):
    """The result of `AlternatingProjectionOp.project`.

    Attributes:
        value: $\\Pi x$.
        sweeps: sweeps over all batches that were run.
        converged: whether the method's stopping rule was met (CG's on its recomputed residual; the
            plain method's always, for a fixed run) AND the result is in the kernel to the dtype's
            accuracy, $\\|M \\Pi x\\| \\le \\sqrt{\\epsilon}\\,\\|M\\|_F \\|x\\|$, recomputed from ``value``.
            This certifies what the training outputs see ($M \\Pi x$), not the error in the parameters:
            that is up to $\\|M \\Pi x\\| / \\sigma_{\\min}^+(M)$ and in float32 it is large for an
            ill-conditioned $M$ (``docs/howto/reliability.md``: 16% at $\\kappa(M) = 10^3$); use float64 there.
        kernel_residual: $\\|M \\Pi x\\| / \\|M x\\|$ (0 for an exact projection; 1 for none).
        residuals: per-iteration residuals (CG's relative residual, or the plain method's
            relative change per sweep), NaN past the last iteration.
    """

    value: jax.Array
    sweeps: jax.Array
    converged: jax.Array
    kernel_residual: jax.Array
    residuals: jax.Array


class AlternatingProjectionOp(LinearOperator):
    r"""The orthogonal projector onto $\ker M$ by alternating projections over row batches.

    Build it with `AlternatingProjectionOp.from_jacobian` (rows of a network's Jacobian, the
    projected posterior), `from_loss_jacobian` (the loss-projected posterior) or `from_matrix`.
    ``A @ x`` applies the projector; `project` also returns the diagnostics.

    Set-up, per batch: the rows of $M_b$ come from per-example reverse passes (each row needs
    only its own example), and the Gram $M_b M_b^\top$ from forward-mode products of $M_b$ with
    them (or their inner products); it is factored by an eigendecomposition with a relative cut-off.
    Sweeps run in the parameters' own pytree layout, on what each batch stored once: its linearisation
    (activations and derivatives, not the shared weights: a tangent and a transposed pass per batch),
    or for a convolutional network whose rows fit, the rows themselves.

    Args (of the constructors):
        batch_size: examples (rows) per batch ``S``; the short last batch is projected too.
        method: ``"cg"`` (accelerated, default) or ``"plain"`` (the paper's sweeps).
        max_sweeps: the iteration cap (CG steps, or plain sweeps).
        rtol: CG's relative residual tolerance (default ``eps**(2/3)``: 2.4e-5 in float32, 3.7e-11 in
            float64; CG keeps its best iterate and stops after 50 steps without progress, so a
            tolerance below the attainable accuracy costs sweeps, never accuracy); for ``"plain"``,
            stop when a sweep changes the vector by less than ``rtol`` relatively (0: never).
        cutoff: relative eigenvalue cut-off of each Gram $M_b M_b^\top$, a number in [0, 1) (default
            ``max(R, sqrt(P)) eps``, the accuracy of its eigenvalues; `linops.algebra._projector.gram_rtol`).
        store_linearization: keep each batch's linearisation (True), its ``R x P`` rows (``"rows"``: two
            matrix products per batch, 4x faster than LeNet-5's tangent and transposed passes on CPU),
            nothing (False: recompute the forward pass), or (None) the rows when XLA counts more flops for a
            tangent pass and they fit in half the free memory, else the linearisation when it fits, else
            nothing. `storage` says which was chosen.
        row_dtype: with ``store_linearization="rows"``, keep the rows in this narrower floating dtype
            (``"float16"``: half the memory of float32 rows; float32 for float64 parameters). Each row is scaled
            by a power of two so that its largest entry is at most 1 (exact; no overflow). Products still run in
            the parameters' dtype, and the Grams, factors and diagnostics are those of the rows as stored: the
            projector is the one onto their kernel, which differs from the full-precision rows' by their rounding
            (float16: a relative 2^-11 per entry). `benchmarks/projected.py --cnn-storage` measures a CNN's fit
            with float32 and with float16 rows.
        progress: a progress bar per projection (of a vector or of a block of them) on stderr
            (`tqdm`; shown once a projection runs longer than two seconds), advanced at every sweep
            with the residual (the largest over a block's columns) and ended with the outcome. Off by
            default; it adds a host callback per sweep.
        mesh: a `jax.sharding.Mesh` to split the batches over along ``axis`` (default None: one
            device). Each device builds the Grams, factors and linearisations of its own batches and
            keeps them: they are stored split over the devices, never gathered on one. When the
            batches do not split evenly, the last batch is repeated (its projector is idempotent,
            so the projection is unchanged).
        axis: the mesh axis the batches are split along (default ``"data"``).
        split_sweeps: with a mesh, how a sweep runs. False (default): the sweep is the same
            product $Q_B \cdots Q_1$ as on one device (identical results); XLA moves each batch's factors to
            the vector as the scan reaches them; a block of vectors (``A @ V``, `project_samples`) runs
            sample-parallel instead, the vectors travelling round the devices and the factors staying put.
            True: each device sweeps its own batches, on its own factors, and the results are averaged
            (``psum``): $\bar T = \frac1D \sum_d T_d$ with $T_d$ device $d$'s symmetric sweep. Every $T_d$
            is symmetric PSD with eigenvalue 1 exactly on $\ker M_d \supseteq \ker M$, so $\bar T$ is too,
            with eigenvalue 1 exactly on $\ker M$, and CG converges to the same projector; but a product of
            projectors depends on its order and an average of shorter products contracts less than the full
            product, so it takes more sweeps, each costing $1/D$ of one (`benchmarks/scaling.py` measures both),
            and on an ill-conditioned problem it may stop short of the tolerance (reported as not converged).
        precision: of every product and convolution the projector traces (set-up, the network's passes, sweeps),
            as `jax.default_matmul_precision` takes it: ``"highest"`` (default; full float32) or None (whatever is
            in effect). A GPU's default float32 products are TF32, on which CG stalls (`docs/methods/projected.md`:
            a CNN's projection stopped at a kernel residual of 2.1e-2 on an H200); CPUs compute them in full.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> M = jnp.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
        >>> Pi = lo.AlternatingProjectionOp.from_matrix(M, batch_size=1)
        >>> (Pi @ jnp.array([1.0, 1.0, 1.0])).round(5) + 0.0   # + 0.0 turns -0. into 0.
        Array([0., 0., 1.], dtype=float32)
        >>> lo.AlternatingProjectionOp.from_matrix(M, batch_size=1, store_linearization="rows").storage
        'rows'
    """

    blocks: RowBlocks
    method: str = eqx.field(static=True)
    max_sweeps: int = eqx.field(static=True)
    rtol: float = eqx.field(static=True)
    progress: bool = eqx.field(static=True)
    split_sweeps: bool = eqx.field(static=True)
    precision: str | None = eqx.field(static=True)

    def __init__(self, blocks: RowBlocks, *, method="cg", max_sweeps=500, rtol=None, progress=False,
                 split_sweeps=False, precision="highest"):
        # Internal: use `from_jacobian`, `from_loss_jacobian` or `from_matrix`.
        _check_options(method, max_sweeps, split_sweeps, blocks.mesh, precision)
        self.blocks, self.method, self.max_sweeps = blocks, method, int(max_sweeps)
        default = float(jnp.finfo(blocks.dtype).eps ** (2 / 3)) if method == "cg" else 0.0
        self.rtol = default if rtol is None else float(rtol)
        self.progress, self.split_sweeps, self.precision = bool(progress), bool(split_sweeps), precision

    @classmethod
    def from_matrix(cls, M, *, batch_size: int, **options) -> AlternatingProjectionOp:
        r"""Projector onto $\ker M$ for a wide matrix ``M``, in batches of ``batch_size`` rows."""
        return _from_rows(cls, lambda: matrix_rows(M, batch_size), **options)

    @classmethod
    def from_jacobian(cls, fn, params, inputs, *, batch_size: int, **options) -> AlternatingProjectionOp:
        r"""Projector onto $\ker J$, $J$ the Jacobian of ``fn(params, x) -> (O,)`` on ``inputs``."""
        return _from_rows(cls, lambda: jacobian_rows(fn, params, inputs, batch_size), **options)

    @classmethod
    def from_loss_jacobian(cls, fn, params, inputs, targets, likelihood, *, batch_size: int,
                           **options) -> AlternatingProjectionOp:
        r"""Projector onto $\ker J_L$ (rows $g_n^\top J_n$): one row per example, whatever ``O``."""
        return _from_rows(cls, lambda: loss_jacobian_rows(fn, params, inputs, targets, likelihood, batch_size),
                          **options)

    # --- the row blocks' attributes, and the operator's ------------------------------------

    W = property(lambda self: self.blocks.W, doc="The factors ``(B, R, R)``: $W_b^\\top W_b = (M_b M_b^\\top)^+$.")
    stored = property(lambda self: self.blocks.stored, doc="The stored per-batch linearisations or rows (or ``()``), "
                      "stacked; large rows in the parameters' dtype kept apart: per batch ``(rows,)`` ``(R, P)``.")
    size = property(lambda self: self.blocks.size, doc="The number of parameters ``P``.")
    mesh = property(lambda self: self.blocks.mesh, doc="The mesh the batches are split over (or None).")
    axis = property(lambda self: self.blocks.axis, doc="The mesh axis the batches are split along.")
    num_batches = property(lambda self: self.blocks.num_batches, doc="The number of (padded) batches.")
    stores_linearization = property(lambda self: self.blocks.stores_linearization, doc="Whether anything is stored.")
    storage = property(lambda self: self.blocks.storage, doc='``"rows"``, ``"linearization"`` or ``"none"``.')
    shape = property(lambda self: (self.size, self.size))
    dtype = property(lambda self: self.blocks.dtype)
    tags = property(lambda self: _tags.close({_tags.projector}, self.shape))

    # --- sweeps ------------------------------------------------------------------------------

    def sweep(self, v):
        """$Q_B \\cdots Q_1 v$: one pass over the batches (compiled once per operator)."""
        return _sweep_jit(self, v)

    def symmetric_sweep(self, v):
        """$Q_1 \\cdots Q_{B-1} Q_B Q_{B-1} \\cdots Q_1 v$ (symmetric PSD; compiled once per operator)."""
        return _symmetric_sweep_jit(self, v)

    def _sweep(self, v, symmetric=False):
        # with a progress bar, Ctrl-C is watched for after every batch (a sweep over many batches can take seconds);
        # at the operator's precision wherever it is traced (its programs, or an iteration of one's own around it)
        with _precise(self.precision):
            sweep = _sweeps.split if self.split_sweeps else _sweeps.sequential
            return sweep(self.blocks, v, symmetric, watch=self.progress)

    def project(self, x) -> Projection:
        """$\\Pi x$ with its diagnostics (a `Projection`).

        Compiled once per operator (``jax.jit`` with the operator as an argument), so repeated
        calls, also through ``A @ x``, do not trace the iteration again.
        """
        x = jnp.asarray(x)
        if x.shape != (self.size,):
            raise ValueError(f"{describe(self)}.project: expected x of shape ({self.size},), got {x.shape}")
        return _project_jit(self, x)

    def _project(self, x) -> Projection:
        r"""$\Pi x$ for a vector ``x`` ``(P,)``, or for each column of a block ``x`` ``(P, k)`` in ONE iteration:
        each sweep acts on all columns together (matrix products per batch), each column stops on its own
        rule and is then frozen. The fields other than ``value`` then have a leading axis of ``k``."""
        x = jnp.asarray(x, self.dtype)
        block = x.ndim == 2
        sweep = self._sweep
        if block:
            sweep = lambda v, symmetric=False: jax.vmap(  # noqa: E731
                lambda u: self._sweep(u, symmetric), in_axes=1, out_axes=1)(v)
        report = _Progress(x.shape[1] if block else 1, self.method, self.max_sweeps) if self.progress else None
        if self.method == "plain":
            value, sweeps, converged, history = _sweeps.repeat(sweep, x, self.max_sweeps, self.rtol,
                                                               report and report.step)
            last = history[jnp.maximum(sweeps - 1, 0)] if not block else \
                history[jnp.maximum(sweeps - 1, 0), jnp.arange(x.shape[1])]
            history = history.T if block else history
        else:
            value, (sweeps, converged, last) = self._accelerated(lambda u: u - sweep(u, symmetric=True), x,
                                                                 callback=report and report.step)
            history = (jax.vmap(_history, (None, 0, 0)) if block else _history)(self, sweeps, last)
        residual = jax.vmap(_kernel_residual, (None, 1, 1)) if block else _kernel_residual
        kernel_residual, remaining = residual(self.blocks, x, value)
        converged = converged & _in_kernel(self.blocks, remaining, x)
        if report is not None:
            jax.debug.callback(report.done, jnp.max(sweeps), jnp.max(last), jnp.all(converged))
        return Projection(value, sweeps, converged, kernel_residual, history)

    def _accelerated(self, I_minus_T, X, axis=None, callback=None):
        r"""$X - U$, $U$ from CG on $(I - T) U = (I - T) X$ (``X``: a vector, or a block of columns).

        The stopping rule of every path (one device, or the columns on a mesh): relative to
        $\max(\|(I - T)x\|, \|x\|)$, not $\|b\|$ alone: for $x$ (nearly) in the kernel, $b$ is rounding
        noise with a part outside $\operatorname{range}(I - T)$, and chasing it to a relative tolerance
        diverges. In finite precision the residual levels off and then grows past the attainable
        accuracy (float32: a kernel residual around 1e-4 to 1e-3): keep the best iterate, stop on a
        stall. Returns ``(value, (sweeps, converged, relative residual))``; one sweep forms $b$ and one
        recomputes the final residual.
        """
        B = I_minus_T(X)
        U, converged, steps, residual = cg(I_minus_T, B, rtol=self.rtol, atol=self.rtol * jnp.linalg.norm(X, axis=0),
                                           maxiter=self.max_sweeps, patience=_PATIENCE, callback=callback, axis=axis)
        b = jnp.linalg.norm(B, axis=0)
        return X - U, (steps + 2, converged, residual / jnp.where(b > 0, b, 1.0))

    def project_samples(self, V) -> Projection:
        r"""$\Pi V$ for a block of vectors ``V`` ``(P, k)`` with its diagnostics, sample-parallel on the mesh.

        Returns a `Projection` whose ``value`` is ``(P, k)`` (column ``j`` is $\Pi v_j$) and whose other
        fields have a leading axis of ``k`` (one entry per column). On the operator's mesh (built with
        ``mesh=``), each device keeps its own batches' factors and takes ``k / D`` of the columns; a column
        block travels round the devices (``ppermute``): forward through every device's batches, then back
        in reverse, which is the symmetric sweep over all batches in a rotated order. Each device runs CG
        on its columns, all in step (the iteration goes on until every column on every device has
        converged; a converged column is frozen), so the factors never move and only vectors do. The
        order differs per device, so the results equal the single-device ones to the projection's
        tolerance, not bit for bit. Without a mesh (and for columns left over by an uneven split, with
        ``split_sweeps``, whose sweeps already use every device, or with ``method="plain"``) the columns
        are projected together in one iteration: each sweep is applied to the whole block, so ``k``
        vectors cost far less than ``k`` separate projections (`benchmarks/scale.py` measures it), and
        each column still stops on its own rule.
        ``A @ V`` is this method's ``value``.

        Examples:
            >>> import jax.numpy as jnp, linops as lo
            >>> Pi = lo.AlternatingProjectionOp.from_matrix(jnp.array([[1.0, 0.0, 0.0]]), batch_size=1)
            >>> r = Pi.project_samples(jnp.ones((3, 2)))
            >>> r.value[:, 0].round(5) + 0.0, r.converged
            (Array([0., 1., 1.], dtype=float32), Array([ True,  True], dtype=bool))
        """
        V = jnp.asarray(V, self.dtype)
        if V.ndim != 2 or V.shape[0] != self.size:
            raise ValueError(f"{describe(self)}.project_samples: expected V of shape ({self.size}, k), got {V.shape}")
        k = V.shape[1]
        devices = 1 if self.mesh is None else self.mesh.shape[self.axis]
        ring_ok = self.mesh is not None and not self.split_sweeps and self.method == "cg"
        ring = (k // devices) * devices if ring_ok else 0
        parts = [_ring_jit(self, V[:, :ring])] if ring else []
        if ring < k:
            parts.append(_project_jit(self, V[:, ring:]))
        if len(parts) == 1:
            return parts[0]
        joined = [jnp.concatenate([getattr(p, f) for p in parts], axis=0)
                  for f in ("sweeps", "converged", "kernel_residual", "residuals")]
        return Projection(jnp.concatenate([p.value for p in parts], axis=1), *joined)

    def _ring_project(self, V):
        solve = lambda I_minus_T, block: self._accelerated(I_minus_T, block, axis=self.axis)  # noqa: E731
        value, (sweeps, converged, residual) = _sweeps.ring(self.blocks, V, solve)
        kernel_residual, remaining = jax.vmap(_kernel_residual, (None, 1, 1))(self.blocks, V, value)
        converged = converged & _in_kernel(self.blocks, remaining, V)
        history = jax.vmap(_history, (None, 0, 0))(self, sweeps, residual)
        return Projection(value, sweeps, converged, kernel_residual, history)

    def mv(self, v):
        return self.project(v).value

    def mm(self, V):
        return self.project_samples(V).value

    rmv = mv


def _precisely(A, method, *args):
    """``method(*args)`` traced at the operator's precision (`_precise`); `_sweep` sets it itself."""
    with _precise(A.precision):
        return method(*args)


# compiled as a public call's program (`linops.runtime.program`): one per operator structure, and Ctrl-C stops a
# projection at its next batch (with a progress bar) instead of after its last sweep
_project_jit = program(lambda A, x: _precisely(A, A._project, x))
_sweep_jit = program(lambda A, v: A._sweep(v))
_ring_jit = program(lambda A, V: _precisely(A, A._ring_project, V))
_symmetric_sweep_jit = program(lambda A, v: A._sweep(v, symmetric=True))


def _history(A, sweeps, residual):
    """The residual history of the accelerated path: NaN except at the last step."""
    return jnp.full(A.max_sweeps, jnp.nan, residual.dtype).at[jnp.maximum(sweeps - 2, 0)].set(residual)


def _kernel_residual(blocks, x, value):
    """``(||M value|| / ||M x||, ||M value||)``."""
    before, after = blocks.kernel_norm(x), blocks.kernel_norm(value)
    return after / jnp.where(before > 0, before, 1.0), after


def _in_kernel(blocks, remaining, x):
    r"""Whether $\|M \Pi x\| \le \sqrt{\epsilon}\,\|M\|_F \|x\|$ (per column of a block): a stopping rule met is
    not yet a projection. Both methods are judged by it: a plain sweep that barely changes the vector says nothing
    when the batches' row spaces are nearly aligned (a 6.5% kernel residual was reported converged), and CG's
    residual is of $(I - T)$, whose small eigenvalues hide what is left in the row space (float32,
    $\kappa(M) = 10^4$: a 0.5% kernel residual at CG's tolerance)."""
    tol = jnp.sqrt(jnp.finfo(blocks.dtype).eps) * blocks.frobenius_norm
    return remaining <= tol * jnp.linalg.norm(x, axis=0)


_PATIENCE = 50  # CG steps without a new smallest residual before the projection stops


def _from_rows(cls, make_rows, *, method="cg", max_sweeps=500, rtol=None, cutoff=None, store_linearization=None,
               row_dtype=None, progress=False, mesh=None, axis="data", split_sweeps=False, precision="highest"):
    """The projector on the rows ``make_rows()`` gives, built (rows, Grams, factors) at ``precision``."""
    _check_options(method, max_sweeps, split_sweeps, mesh, precision)  # before any work
    with _precise(precision):  # the rows, Grams and factors at the sweeps' precision
        rows = make_rows()
        _warn_if_few_free_directions(rows)
        blocks = RowBlocks.build(rows, cutoff=cutoff, store_linearization=store_linearization,
                                 row_dtype=row_dtype, mesh=mesh, axis=axis)
    return cls(blocks, method=method, max_sweeps=max_sweeps, rtol=rtol, progress=progress,
               split_sweeps=split_sweeps, precision=precision)


def _precise(precision):
    """`jax.default_matmul_precision` of ``precision`` while the projector's programs are traced (None: as it is)."""
    return contextlib.nullcontext() if precision is None else jax.default_matmul_precision(precision)


_PRECISIONS = ("default", "high", "highest", "bfloat16", "tensorfloat32", "float32")


def _check_options(method, max_sweeps, split_sweeps, mesh, precision="highest"):
    if precision is not None and precision not in _PRECISIONS:
        raise ValueError(f"AlternatingProjectionOp: precision must be None or one of {_PRECISIONS} (as "
                         f"jax.default_matmul_precision takes it), got {precision!r}")
    if method not in ("cg", "plain"):
        raise ValueError(f"AlternatingProjectionOp: method must be 'cg' or 'plain', got {method!r}")
    if int(max_sweeps) < 1:
        raise ValueError(f"AlternatingProjectionOp: max_sweeps must be >= 1, got {max_sweeps}")
    if split_sweeps not in (True, False):
        raise ValueError(f"AlternatingProjectionOp: split_sweeps must be True or False, got {split_sweeps!r}")
    if split_sweeps and mesh is None:
        raise ValueError("AlternatingProjectionOp: split_sweeps=True splits the batch sequence over the "
                         "devices of a mesh: pass mesh=")


def _warn_if_few_free_directions(rows):
    """Warn when the rows nearly span the parameter space: the kernel is then small and CG slow to converge."""
    total = rows.num_rows * int(jax.tree_util.tree_leaves(rows.data)[0].shape[0])
    if total >= FEW_FREE_DIRECTIONS * rows.size:
        warnings.warn(f"AlternatingProjectionOp: {total} rows for {rows.size} parameters ({total / rows.size:.0%}): "
                      "the kernel is small (at most P - rows directions) and the projection converges slowly, "
                      "if at all; project on fewer examples, use the loss Jacobian (one row per example) or a "
                      "Laplace posterior in this regime", stacklevel=4)


FEW_FREE_DIRECTIONS = 0.5
"""The fraction of rows to parameters from which `AlternatingProjectionOp` warns that the kernel is small."""


class _Progress:
    """A progress bar per projection (`linops.runtime.tick`), advanced at every sweep and closed with the outcome."""

    def __init__(self, columns, method, max_sweeps):
        what = f"{columns} vectors" if columns > 1 else "1 vector"
        self.label = f"AlternatingProjectionOp ({what})"
        self.measure = "residual" if method == "cg" else "change"
        self.offset = 1 if method == "cg" else 0  # CG's steps follow the sweep that forms its right-hand side
        self.total = int(max_sweeps) + self.offset

    def step(self, sweep, residual):
        # the last sweep leaves the bar open: `done` ends it with the outcome (NOT converged, at the cap)
        _progress.update(self.label, "sweep", int(sweep) + self.offset, self.total,
                         f"{self.measure} {float(residual):.2e}", close_at_total=False)

    def done(self, sweeps, residual, converged):
        state = "converged" if converged else "NOT converged"
        _progress.finish(self.label, f"{state} after {int(sweeps)} sweeps, {self.measure} {float(residual):.2e}",
                         done=int(sweeps))


__all__ = ["AlternatingProjectionOp", "Projection"]
