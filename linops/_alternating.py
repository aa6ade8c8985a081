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
from linops._batching import check_mesh
from linops._batching import leaf_specs as _specs
from linops._cg import cg
from linops._nn import _check_model
from linops._projector import gram_factor
from linops.memory import MemoryBudgetError, check_fits
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

    Set-up, per batch: the rows of $M_b$ come from per-example reverse passes (each row needs
    only its own example), and the Gram $M_b M_b^\top$ from forward-mode products of $M_b$ with
    them; it is factored by an eigendecomposition with a relative cut-off. Sweeps run in the
    parameters' own pytree layout (no flattening per batch), and by default on a linearisation of
    each batch stored once (the activations and derivatives of the forward pass, not the weights,
    which are shared), so a sweep costs a tangent and a transposed pass per batch and no forward.

    Args (of the constructors):
        batch_size: examples (rows) per batch ``S``; the short last batch is projected too.
        method: ``"cg"`` (accelerated, default) or ``"plain"`` (the paper's sweeps).
        max_sweeps: the iteration cap (CG steps, or plain sweeps).
        rtol: CG's relative residual tolerance (default ``eps**(2/3)``: 2.4e-5 in float32, 3.7e-11 in
            float64; CG keeps its best iterate and stops after 50 steps without progress, so a
            tolerance below the attainable accuracy costs sweeps, never accuracy); for ``"plain"``,
            stop when a sweep changes the vector by less than ``rtol`` relatively (0: never).
        cutoff: relative eigenvalue cut-off of each Gram $M_b M_b^\top$ (default ``max(R, P) eps``).
        store_linearization: keep each batch's linearisation for the sweeps (True), recompute the
            forward pass in every sweep (False), or (None, default) keep it when it fits in memory.
            `stores_linearization` says which was chosen.
        progress: print the sweep count and residual to stderr as the iteration runs (off by
            default; it adds a host callback per sweep).
        mesh: a `jax.sharding.Mesh` to split the batches over along ``axis`` (default None: one
            device). Each device builds the Grams, factors and linearisations of its own batches and
            keeps them: they are stored split over the devices, never gathered on one. When the
            batches do not split evenly, the last batch is repeated (its projector is idempotent,
            so the projection is unchanged).
        axis: the mesh axis the batches are split along (default ``"data"``).
        split_sweeps: with a mesh, how a sweep runs. False (default): the sweep is the same
            product $Q_B \cdots Q_1$ as on one device (identical results); XLA moves each
            batch's factors to the vector as the scan reaches them; a block of vectors (``A @ V``,
            `project_samples`) runs sample-parallel instead, the vectors travelling round the
            devices and the factors staying put. True: each device sweeps its
            own batches, on its own factors, and the results are averaged (``psum``):
            $\bar T = \frac1D \sum_d T_d$ with $T_d$ device $d$'s symmetric sweep. Every $T_d$
            is symmetric PSD with eigenvalue 1 exactly on $\ker M_d \supseteq \ker M$, so $\bar T$
            is too, with eigenvalue 1 exactly on $\ker M$, and CG converges to the same projector;
            but a product of projectors depends on its order and an average of shorter products
            contracts less than the full product, so it takes more sweeps, each costing $1/D$ of
            one (`benchmarks/scaling.py` measures both).

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
    stored: tuple
    forward: Callable = eqx.field(static=True)
    backward: Callable = eqx.field(static=True)
    to_tree: Callable = eqx.field(static=True)
    to_flat: Callable = eqx.field(static=True)
    recipe: object = eqx.field(static=True)
    size: int = eqx.field(static=True)
    dtype_: np.dtype = eqx.field(static=True)
    method: str = eqx.field(static=True)
    max_sweeps: int = eqx.field(static=True)
    rtol: float = eqx.field(static=True)
    progress: bool = eqx.field(static=True)
    mesh: object = eqx.field(static=True)
    axis: str = eqx.field(static=True)
    split_sweeps: bool = eqx.field(static=True)
    uid: int = eqx.field(static=True)

    def __init__(self, params, data, forward, backward, rows, num_rows, size, dtype, to_tree, to_flat, *,
                 method="cg", max_sweeps=500, rtol=None, cutoff=None, store_linearization=None, progress=False,
                 mesh=None, axis="data", split_sweeps=False):
        # Internal: use `from_jacobian`, `from_loss_jacobian` or `from_matrix`.
        #
        # ``forward(params, data_b, t) -> (R,)`` is $M_b t$ for a tangent ``t`` in the parameters'
        # pytree layout, ``backward(params, data_b, u)`` is $M_b^\top u$ in that layout, and
        # ``rows(params, data_b)`` gives the R rows of $M_b$ stacked on a leading axis.
        if method not in ("cg", "plain"):
            raise ValueError(f"AlternatingProjectionOp: method must be 'cg' or 'plain', got {method!r}")
        if int(max_sweeps) < 1:
            raise ValueError(f"AlternatingProjectionOp: max_sweeps must be >= 1, got {max_sweeps}")
        if store_linearization not in (None, True, False):
            raise ValueError("AlternatingProjectionOp: store_linearization must be None, True or False, "
                             f"got {store_linearization!r}")
        self.mesh, self.axis = check_mesh(mesh, axis, "AlternatingProjectionOp")
        if split_sweeps not in (True, False):
            raise ValueError(f"AlternatingProjectionOp: split_sweeps must be True or False, got {split_sweeps!r}")
        if split_sweeps and mesh is None:
            raise ValueError("AlternatingProjectionOp: split_sweeps=True splits the batch sequence over the "
                             "devices of a mesh: pass mesh=")
        self.split_sweeps = bool(split_sweeps)
        if mesh is not None:  # a whole number of batches per device: repeat the last batch (Q_B Q_B = Q_B)
            count = jax.tree_util.tree_leaves(data)[0].shape[0]
            devices = mesh.shape[axis]
            idx = np.minimum(np.arange(-(-count // devices) * devices), count - 1)
            data = jax.tree_util.tree_map(lambda a: a[idx], data)
        self.params, self.data, self.forward, self.backward = params, data, forward, backward
        self.to_tree, self.to_flat = to_tree, to_flat
        self.size, self.dtype_ = int(size), np.dtype(dtype)
        # per device: with a mesh, each one holds its share of the (padded) batches
        batches = jax.tree_util.tree_leaves(data)[0].shape[0] // (1 if mesh is None else mesh.shape[axis])
        item = self.dtype_.itemsize
        # The Grams and their factors (both alive between the two loops), plus one batch's rows
        # (R x P) and their forward-mode products while building them.
        base = (2 * batches * num_rows * num_rows + 2 * num_rows * self.size) * item
        what = (f"AlternatingProjectionOp: the factors of {batches} batches of {num_rows} rows ({self.size} parameters)"
                + ("" if mesh is None else " per device"))
        hint = "use a smaller batch_size, or from_loss_jacobian (one row per example whatever the outputs)"
        check_fits(base, what, hint)
        first = jax.tree_util.tree_map(lambda a: a[0], data)
        found = {}
        jax.eval_shape(lambda d: self._linearize(d, found)[0], first)
        per_batch = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in found["stored"])
        store = store_linearization
        if store is None:
            try:
                check_fits(base + batches * per_batch, what, hint)
                store = True
            except MemoryBudgetError:
                store = False
        elif store:
            check_fits(base + batches * per_batch, what + " and their stored linearisations",
                       hint + ", or store_linearization=False (recompute the forward pass in every sweep)")

        def gram(data_b):
            stored, recipe = self._linearize(data_b, {})  # the recipe is the one traced above, outside any mesh
            linear = _rebuild(recipe, params, data_b, stored)
            # The Gram M_b M_b^T = M_b (rows of M_b): per-example reverse passes, then forward mode.
            return jax.vmap(linear)(rows(params, data_b)), (tuple(stored) if store else ())

        def factors(data):
            grams, stored = lax.map(gram, data)
            # A separate loop: an eigendecomposition inside the loop above slows its products ~1.7x on CPU.
            return lax.map(lambda g: gram_factor(g, (num_rows, self.size), cutoff)[0], grams), stored

        if mesh is None:
            self.W, self.stored = factors(data)
        else:  # each device factors its own batches, and keeps them
            from jax.sharding import NamedSharding, PartitionSpec

            split = PartitionSpec(axis)
            sharded = jax.shard_map(factors, mesh=mesh, in_specs=(_specs(data, split),), out_specs=split,
                                    check_vma=False)(data)
            self.W, self.stored = jax.device_put(sharded, NamedSharding(mesh, split))
            self.data = jax.device_put(data, NamedSharding(mesh, split))
        self.recipe = found["recipe"] if store else None
        self.method, self.max_sweeps = method, int(max_sweeps)
        default = float(np.finfo(self.dtype_).eps ** (2 / 3)) if method == "cg" else 0.0
        self.rtol = default if rtol is None else float(rtol)
        self.progress = bool(progress)
        self.uid = new_key()

    def _linearize(self, data_b, found):
        r"""Linearise ``t -> M_b t`` once: the stored arrays, and how to rebuild the linear map.

        Arrays of the linearisation that ARE the params or the batch's data are referenced, not
        stored, so only what the forward pass computes (activations, derivatives) is kept.
        """
        zeros = self.to_tree(jnp.zeros(self.size, self.dtype_))
        linear = jax.linearize(lambda t: self.forward(self.params, data_b, t), zeros)[1]
        leaves, treedef = jax.tree_util.tree_flatten(linear)
        shared = {"p": jax.tree_util.tree_leaves(self.params), "d": jax.tree_util.tree_leaves(data_b)}
        sources, stored = [], []
        for leaf in leaves:
            where = next(((k, i) for k, ls in shared.items() for i, x in enumerate(ls) if x is leaf), None)
            if where is None:
                where = ("s", len(stored))
                stored.append(leaf)
            sources.append(where)
        found["recipe"], found["stored"] = (treedef, tuple(sources)), stored
        return stored, (treedef, tuple(sources))

    @property
    def stores_linearization(self) -> bool:
        """Whether the sweeps run on stored per-batch linearisations (else they recompute the forward)."""
        return self.recipe is not None

    # --- constructors ------------------------------------------------------------------

    @classmethod
    def from_matrix(cls, M, *, batch_size: int, **options) -> AlternatingProjectionOp:
        r"""Projector onto $\ker M$ for a wide matrix ``M``, in batches of ``batch_size`` rows."""
        M = jnp.asarray(M)
        if M.ndim != 2:
            raise ValueError(f"AlternatingProjectionOp: M must be 2-D, got shape {M.shape}")
        _check_batch(batch_size, M.shape[0])
        blocks = M[_pad_indices(M.shape[0], batch_size)]  # (B, S, P)
        return cls(None, blocks, lambda _, Mb, v: Mb @ v, lambda _, Mb, u: u @ Mb, lambda _, Mb: Mb, batch_size,
                   M.shape[1], M.dtype, _identity, _identity, **options)

    @classmethod
    def from_jacobian(cls, fn, params, inputs, *, batch_size: int, **options) -> AlternatingProjectionOp:
        r"""Projector onto $\ker J$, $J$ the Jacobian of ``fn(params, x) -> (O,)`` on ``inputs``."""
        n, o = _check_model(fn, params, inputs, "AlternatingProjectionOp")
        _check_batch(batch_size, n)
        flat, unravel = ravel(params)
        data = jax.tree_util.tree_map(lambda a: a[_pad_indices(n, batch_size)], inputs)

        def batched(xb):
            return lambda q: jax.vmap(fn, in_axes=(None, 0))(q, xb)

        def forward(p, xb, t):
            return jax.jvp(batched(xb), (p,), (t,))[1].reshape(-1)

        def backward(p, xb, u):
            out, vjp = jax.vjp(batched(xb), p)
            return vjp(u.reshape(out.shape).astype(out.dtype))[0]

        def rows(p, xb):  # row n * O + o of M_b is example n's Jacobian row o
            jac = jax.vmap(lambda x: jax.jacrev(fn)(p, x))(xb)
            return jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]), jac)

        return cls(params, data, forward, backward, rows, batch_size * o, flat.shape[0], flat.dtype, unravel,
                   _flatten, **options)

    @classmethod
    def from_loss_jacobian(cls, fn, params, inputs, targets, likelihood, *, batch_size: int,
                           **options) -> AlternatingProjectionOp:
        r"""Projector onto $\ker J_L$ (rows $g_n^\top J_n$): one row per example, whatever ``O``."""
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

        def forward(p, data_b, t):
            f, g = grads(p, data_b)
            return jnp.sum(g * jax.jvp(f, (p,), (t,))[1], axis=-1)

        def backward(p, data_b, u):
            f, g = grads(p, data_b)
            _, vjp = jax.vjp(f, p)
            return vjp(u[:, None].astype(g.dtype) * g)[0]

        def rows(p, data_b):  # row n of M_b: the gradient of g_n . f(p, x_n), example n alone
            _, g = grads(p, data_b)
            return jax.vmap(lambda x, g_n: jax.grad(lambda q: jnp.sum(g_n * fn(q, x)))(p))(data_b[0], g)

        return cls(params, data, forward, backward, rows, batch_size, flat.shape[0], flat.dtype, unravel,
                   _flatten, **options)

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

    def _linear(self, data_b, stored_b):
        """The batch's linear map ``t -> M_b t`` (stored, or recomputed from the forward pass)."""
        if self.recipe is None:
            return lambda t: self.forward(self.params, data_b, t)
        return _rebuild(self.recipe, self.params, data_b, stored_b)

    def _q(self, t, batch):
        data_b, W_b, stored_b = batch
        linear = self._linear(data_b, stored_b)
        u = linear(t)
        c = W_b.T @ (W_b @ u)
        if self.recipe is None:
            g = self.backward(self.params, data_b, c)
        else:
            g = jax.linear_transpose(linear, t)(c.astype(u.dtype))[0]
        return jax.tree_util.tree_map(lambda a, b: a - b.astype(a.dtype), t, g)

    def _batches(self):
        return (self.data, self.W, self.stored)

    def _scan(self, t, batches, reverse=False):
        return lax.scan(lambda t, b: (self._q(t, b), None), t, batches, reverse=reverse)[0]

    def sweep(self, v):
        """$Q_B \\cdots Q_1 v$: one pass over the batches (compiled once per operator)."""
        return _sweep_jit(self, v)

    def _sweep(self, v):
        if self.split_sweeps:
            return self._averaged(lambda t, batches: self._scan(t, batches), v)
        return self.to_flat(self._scan(self.to_tree(v), self._batches()))

    def _averaged(self, local_sweep, v):
        r"""$\frac1D \sum_d$ ``local_sweep`` (device $d$'s batches) $v$: each device on its own factors."""
        from jax.sharding import PartitionSpec

        devices = self.mesh.shape[self.axis]

        def local(batches):
            return lax.psum(self.to_flat(local_sweep(self.to_tree(v), batches)), self.axis) / devices

        batches = self._batches()
        return jax.shard_map(local, mesh=self.mesh, in_specs=(_specs(batches, PartitionSpec(self.axis)),),
                             out_specs=PartitionSpec(), check_vma=False)(batches)

    def symmetric_sweep(self, v):
        """$Q_1 \\cdots Q_{B-1} Q_B Q_{B-1} \\cdots Q_1 v$ (symmetric PSD; compiled once per operator)."""
        return _symmetric_sweep_jit(self, v)

    def _symmetric_sweep(self, v):
        if self.split_sweeps:
            return self._averaged(self._symmetric_scan, v)
        return self.to_flat(self._symmetric_scan(self.to_tree(v), self._batches()))

    def _symmetric_scan(self, t, batches):
        t = self._scan(t, batches)
        rest = jax.tree_util.tree_map(lambda a: a[:-1], batches)
        return self._scan(t, rest, reverse=True)

    def _kernel_norm(self, v):
        t = self.to_tree(v)
        return jnp.sqrt(lax.map(lambda b: jnp.sum(self._linear(b[0], b[2])(t) ** 2), self._batches()).sum())

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
            return u - self._symmetric_sweep(u)

        b = I_minus_T(x)
        # Relative to ||x||, not ||b||: for x (nearly) in the kernel, b is rounding noise with a
        # part outside range(I - T), and chasing it to a relative tolerance diverges.
        atol = self.rtol * jnp.linalg.norm(x)
        # In finite precision the residual levels off and then grows past the attainable accuracy
        # (float32: a kernel residual around 1e-4 to 1e-3): keep the best iterate, stop on a stall.
        u, converged, steps, residual = cg(I_minus_T, b, rtol=self.rtol, atol=atol, maxiter=self.max_sweeps,
                                           callback=_report if self.progress else None, patience=_PATIENCE)
        history = history.at[jnp.maximum(steps - 1, 0)].set(residual / jnp.maximum(jnp.linalg.norm(b), 1e-300))
        return x - u, steps + 1, converged, history

    def _project_plain(self, x, history):
        def cond(state):
            _, k, change, _ = state
            return (k < self.max_sweeps) & (change > self.rtol)

        def body(state):
            v, k, _, hist = state
            new = self._sweep(v)
            change = jnp.linalg.norm(new - v) / jnp.maximum(jnp.linalg.norm(v), jnp.finfo(v.dtype).tiny)
            if self.progress:
                jax.debug.callback(_report, k + 1, change)
            return new, k + 1, change, hist.at[k].set(change)

        v, k, change, history = lax.while_loop(cond, body, (x, jnp.asarray(0), jnp.asarray(jnp.inf, x.dtype), history))
        return v, k, (change <= self.rtol) | (self.rtol == 0), history

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
        tolerance, not bit for bit. Columns left over by an uneven split are projected one by one, as
        are all of them without a mesh, with ``split_sweeps`` (whose sweeps already use every device) or
        with ``method="plain"``.
        ``A @ V`` is this method's ``value``.

        Example:
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
            one = jax.vmap(self.project, in_axes=1)(V[:, ring:])
            parts.append(eqx.tree_at(lambda r: r.value, one, one.value.T))
        if len(parts) == 1:
            return parts[0]
        joined = [jnp.concatenate([getattr(p, f) for p in parts], axis=0)
                  for f in ("sweeps", "converged", "kernel_residual", "residuals")]
        return Projection(jnp.concatenate([p.value for p in parts], axis=1), *joined)

    def _ring_project(self, V):
        from jax.sharding import PartitionSpec

        D = self.mesh.shape[self.axis]
        forward = [(i, (i + 1) % D) for i in range(D)]
        backward = [(i, (i - 1) % D) for i in range(D)]

        def local(batches, block):
            def sweep(u):  # one column, round the ring and back: Q_first ... Q_last ... Q_first
                t = self.to_tree(u)
                for _ in range(D):
                    t = lax.ppermute(self._scan(t, batches), self.axis, forward)
                for _ in range(D):
                    t = self._scan(lax.ppermute(t, self.axis, backward), batches, reverse=True)
                return self.to_flat(t)

            I_minus_T = jax.vmap(lambda u: u - sweep(u), in_axes=1, out_axes=1)
            return _block_cg(I_minus_T, block, I_minus_T(block), self.rtol, self.max_sweeps, self.axis)

        batches = self._batches()
        columns = PartitionSpec(self.axis)
        value, sweeps, converged, residual = jax.shard_map(
            local, mesh=self.mesh, in_specs=(_specs(batches, columns), PartitionSpec(None, self.axis)),
            out_specs=(PartitionSpec(None, self.axis), columns, columns, columns), check_vma=False)(batches, V)
        norms = jax.vmap(self._kernel_norm, in_axes=1)
        before, after = norms(V), norms(value)
        history = jnp.full((V.shape[1], self.max_sweeps), jnp.nan, V.dtype)
        history = history.at[jnp.arange(V.shape[1]), jnp.maximum(sweeps - 2, 0)].set(residual)
        return Projection(value, sweeps, converged, after / jnp.where(before > 0, before, 1.0), history)

    def mv(self, v):
        return self.project(v).value

    def mm(self, V):
        return self.project_samples(V).value

    rmv = mv

    def transpose(self):
        return self

    def _sqrt(self):
        return self

    def _pinv(self, rtol):
        return self


_project_jit = jax.jit(lambda A, x: A._project(x))
_sweep_jit = jax.jit(lambda A, v: A._sweep(v))
_ring_jit = jax.jit(lambda A, V: A._ring_project(V))
_symmetric_sweep_jit = jax.jit(lambda A, v: A._symmetric_sweep(v))
_PATIENCE = 50  # CG steps without a new smallest residual before the projection stops


def _identity(x):
    return x


def _block_cg(matvec, X, B, rtol, maxiter, axis):
    r"""$X - U$ (and per column: sweeps, converged, relative residual) with $U$ from independent CGs on
    $(I - T) U = B$, one per column, run in step over the
    devices of ``axis`` (the loop goes on while any column on any device is active; a finished column is
    frozen). Stops a column as `AlternatingProjectionOp.project` does: at ``rtol max(||b||, ||x||)``, or
    after `_PATIENCE` steps without a new smallest residual (keeping the best iterate)."""
    dot = lambda a, b: jnp.sum(a * b, axis=0)  # noqa: E731
    threshold = rtol * jnp.maximum(jnp.sqrt(dot(B, B)), jnp.sqrt(dot(X, X)))
    U = jnp.zeros_like(B)
    R, Pd = B, B
    rr = dot(R, R)
    res = jnp.sqrt(rr)
    active = res > threshold
    zeros = jnp.zeros(B.shape[1], jnp.int32)
    best = (U, res, zeros)

    def cond(state):
        *_, k, active, _, _ = state
        anywhere = lax.pmax(jnp.any(active).astype(jnp.int32), axis)
        return (anywhere > 0) & (k < maxiter)

    def body(state):
        U, R, Pd, rr, k, active, best, steps = state
        steps = steps + active.astype(jnp.int32)
        AP = matvec(Pd)  # every device takes part (the ring), active columns or not
        pAp = dot(Pd, AP)
        ok = active & (pAp > 0)
        alpha = jnp.where(ok, rr / jnp.where(ok, pAp, 1.0), 0.0)
        U = U + alpha[None, :] * Pd
        R = R - alpha[None, :] * AP
        rr_new = dot(R, R)
        beta = jnp.where(ok & (rr > 0), rr_new / jnp.where(rr > 0, rr, 1.0), 0.0)
        Pd = jnp.where(ok[None, :], R + beta[None, :] * Pd, Pd)
        res = jnp.sqrt(rr_new)
        better = ok & (res < best[1])
        best = (jnp.where(better[None, :], U, best[0]), jnp.where(better, res, best[1]),
                jnp.where(better, k + 1, best[2]))
        active = ok & (res > threshold) & (k + 1 - best[2] < _PATIENCE)
        return U, R, Pd, rr_new, k + 1, active, best, steps

    state = lax.while_loop(cond, body, (U, R, Pd, rr, jnp.asarray(0, jnp.int32), active, best, zeros))
    steps, (U, res, _) = state[-1], state[-2]
    # as `project` counts: the steps of CG plus the sweep that formed its right-hand side
    b_norm = jnp.sqrt(dot(B, B))
    return X - U, steps + 1, res <= threshold, res / jnp.where(b_norm > 0, b_norm, 1.0)


def _flatten(tree):
    return ravel(tree)[0]


def _rebuild(recipe, params, data_b, stored_b):
    treedef, sources = recipe
    shared = {"p": jax.tree_util.tree_leaves(params), "d": jax.tree_util.tree_leaves(data_b), "s": stored_b}
    return jax.tree_util.tree_unflatten(treedef, [shared[k][i] for k, i in sources])


def _report(sweep, residual):
    print(f"\rAlternatingProjectionOp: sweep {int(sweep)}, residual {float(residual):.2e}", end="",
          file=sys.stderr, flush=True)


def _check_batch(batch_size, n):
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"AlternatingProjectionOp: batch_size must be a positive integer, got {batch_size!r}")
    if batch_size > n:
        raise ValueError(f"AlternatingProjectionOp: batch_size {batch_size} is larger than the {n} examples")


__all__ = ["AlternatingProjectionOp", "Projection"]
