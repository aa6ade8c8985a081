r"""`RowBlocks`: the per-batch row blocks $M_b$ of a row-partitioned $M$, built once for projecting.

For each batch, the factor $W_b$ with $W_b^\top W_b = (M_b M_b^\top)^+$ (``R x R``, from an
eigendecomposition of the Gram with a relative cut-off) and, when it fits in memory, the batch's
linear map $t \mapsto M_b t$ stored once, in one of two forms:

- ``"linearization"``: the activations and derivatives of its forward pass (not the weights or the
  data, which are shared). $Q_b = I - M_b^\top W_b^\top W_b M_b$ (the projector onto $\ker M_b$)
  then costs a tangent and a transposed pass and no forward pass.
- ``"rows"``: the ``R x P`` rows of $M_b$ themselves (in the parameters' layout), so $Q_b$ costs two
  matrix products. ``row_dtype`` keeps them in a narrower floating type (float16: half the memory of float32
  rows), each row scaled by a power of two so that its largest entry is at most 1 (exact, and no overflow);
  the products still run in the parameters' dtype, and the Gram, its factor and every diagnostic are those
  of the rows as stored, so the projector is exactly the one onto their kernel. Large rows in the parameters'
  dtype built eagerly are kept apart, one ``(R, P)`` array per batch, and the sweeps unrolled over them
  (`_keep_apart`: a loop over stacked rows copies each batch's slice before its products).
  A convolution reuses each weight at every pixel, so its tangent pass costs more than the ``2 R P``
  flops of a product with the rows, and runs far below a matrix product's speed on CPU: LeNet-5's
  sweeps run 4x faster on its rows (`benchmarks/projected.py` (e)).

Set-up, per batch: the rows of $M_b$ come from per-example reverse passes (each row needs only its
own example), and the Gram $M_b M_b^\top$ from forward-mode products of $M_b$ with them or from their
inner products, whichever costs fewer flops. On a mesh,
each device builds and keeps the factors and linearisations of its own batches (split along the
batch axis, never gathered on one device). Before any work, the memory plan checks that the
factors fit, and decides whether the linearisations do.

Examples:
    >>> import jax.numpy as jnp
    >>> from linops.nn._rowsources import matrix_rows
    >>> blocks = RowBlocks.build(matrix_rows(jnp.array([[1.0, 0.0], [0.0, 2.0]]), batch_size=1))
    >>> blocks.num_batches, blocks.W.shape
    (2, (2, 1, 1))
    >>> blocks.project_out(jnp.ones(2), (blocks.data[0], blocks.W[0], ()))  # Q_1: the first row removed
    Array([0., 1.], dtype=float32)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linops.algebra._projector import gram_factor
from linops.memory import MemoryBudgetError, available_bytes, check_fits
from linops.nn._rowsources import RowSource, take
from linops.runtime._batching import check_mesh, leaf_specs
from linops.runtime._conv_layout import canonical_convolutions
from linops.runtime._memo import memo

_WHO = "AlternatingProjectionOp"
_ROWS = "rows"  # what products run on: the stored rows, the stored linearisation's arrays, or None (recomputed)
_LINEARIZATION = "linearization"


class RowBlocks(eqx.Module):
    r"""The row blocks $M_b$ of $M$ with their Gram factors $W_b$ and stored linearisations.

    Build it with `RowBlocks.build` from a `linops.nn._rowsources.RowSource`. Arrays with a leading
    batch axis: ``data`` (each batch's data), ``W`` (``(B, R, R)``) and ``stored`` (the stored
    linearisations, a tuple of arrays; empty when the forward pass is recomputed). On a ``mesh``
    they are split along ``axis``.
    """

    params: object
    data: object
    W: jax.Array
    stored: tuple
    traces: jax.Array  # (B,) trace of each batch's Gram: ||M_b||_F^2
    forward: Callable = eqx.field(static=True)
    backward: Callable = eqx.field(static=True)
    to_tree: Callable = eqx.field(static=True)
    to_flat: Callable = eqx.field(static=True)
    store: str | None = eqx.field(static=True)  # "rows", "linearization" or None (recomputed)
    size: int = eqx.field(static=True)
    dtype: np.dtype = eqx.field(static=True)
    mesh: object = eqx.field(static=True)
    axis: str = eqx.field(static=True)
    row_dtype: np.dtype | None = eqx.field(static=True, default=None)
    apart: bool = eqx.field(static=True, default=False)  # stored: per batch, its (R, P) rows (`_keep_apart`)

    @classmethod
    def build(cls, rows: RowSource, *, cutoff=None, store_linearization=None, row_dtype=None, mesh=None,
              axis: str = "data") -> RowBlocks:
        r"""Factor every batch's Gram $M_b M_b^\top$ (relative eigenvalue ``cutoff``, default ``max(R, sqrt(P)) eps``).

        ``store_linearization``: keep each batch's linearisation (True), its rows (``"rows"``), recompute the
        forward pass in every product (False), or (None) choose: the rows when a tangent pass costs more flops
        than a product with them (XLA's count; a convolution's) and they fit in half the free memory, else
        the linearisation when it fits, else nothing. ``row_dtype`` (with ``store_linearization="rows"``):
        keep the rows in this narrower floating dtype, each row scaled by a power of two (stored beside it).
        ``mesh``: split the
        batches over its devices along ``axis`` (the last batch repeated to split them evenly: its
        projector is idempotent, so a sweep's projection is unchanged).

        Raises:
            linops.memory.MemoryBudgetError: the factors (or the rows or linearisations asked for) do not fit.
        """
        if store_linearization not in (None, True, False, _ROWS):
            raise ValueError(f"{_WHO}: store_linearization must be None, True, False or 'rows', got "
                             f"{store_linearization!r}")
        cutoff = _check_cutoff(cutoff)  # a plain number: part of the factoring program's static plan
        row_dtype = _check_row_dtype(row_dtype, store_linearization, rows.dtype)
        mesh, axis = check_mesh(mesh, axis, _WHO)
        data, devices = rows.data, 1 if mesh is None else mesh.shape[axis]
        if mesh is not None:  # a whole number of batches per device: repeat the last batch (Q_B Q_B = Q_B)
            count = jax.tree_util.tree_leaves(data)[0].shape[0]
            idx = np.minimum(np.arange(-(-count // devices) * devices), count - 1)
            data = jax.tree_util.tree_map(lambda a: take(a, idx), data)
        batches = jax.tree_util.tree_leaves(data)[0].shape[0] // devices  # per device

        first = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), data)  # a batch's shapes

        def per_batch_bytes():  # an abstract trace (no work), once per model, shapes and layout while it lives
            return memo(("linearization bytes", rows.to_tree, int(rows.size), np.dtype(rows.dtype)), rows.forward,
                        (rows.params, first), lambda: _linearization_bytes(rows, first))

        by_products = _gram_by_products(rows, first)
        store = _plan_memory(rows, batches, store_linearization, per_batch_bytes, mesh is not None,
                             rows_cheaper=not by_products, row_dtype=row_dtype)

        plan = _FactorPlan(rows.rows, rows.forward, rows.to_tree, int(rows.size), np.dtype(rows.dtype),
                           int(rows.num_rows), store, bool(by_products), cutoff, row_dtype)
        apart = mesh is None and _keep_apart(store, row_dtype, batches, rows.num_rows * int(rows.size) * np.dtype(
            rows.dtype).itemsize, (rows.params, data))
        if apart:  # each batch's rows in an array of its own: a sweep reads them where they are
            W, stored, traces = _factor_apart(rows.params, data, plan._replace(apart=True), batches)
        elif mesh is None:  # one program per plan (structural) and shapes: a refit compiles nothing
            W, stored, traces = _factor_batches_jit(rows.params, data, plan)
        else:  # each device factors its own batches, and keeps them
            from jax.sharding import NamedSharding, PartitionSpec

            split = PartitionSpec(axis)
            sharded = jax.shard_map(lambda d: _factor_batches(rows.params, d, plan), mesh=mesh,
                                    in_specs=(leaf_specs(data, split),), out_specs=split, check_vma=False)(data)
            W, stored, traces = jax.device_put(sharded, NamedSharding(mesh, split))
            data = jax.device_put(data, NamedSharding(mesh, split))
        return cls(rows.params, data, W, stored, traces, rows.forward, rows.backward, rows.to_tree, rows.to_flat,
                   store, int(rows.size), np.dtype(rows.dtype), mesh, axis, row_dtype, apart)

    @property
    def num_batches(self) -> int:
        """The number of batches (on a mesh: with the repeated last batch that evens the split)."""
        return self.W.shape[0]

    @property
    def stores_linearization(self) -> bool:
        """Whether products use stored per-batch linearisations or rows (else they recompute the forward)."""
        return self.store is not None

    @property
    def storage(self) -> str:
        """What products run on: ``"rows"``, ``"linearization"`` or ``"none"`` (the forward pass recomputed)."""
        return "none" if self.store is None else self.store

    def batches(self):
        """``(data, W, stored)``: what a `lax.scan` over the batches runs over (not rows kept apart)."""
        return (self.data, self.W, self.stored)

    def project_apart(self, v, b: int):
        r"""$Q_b v$ for a flat ``v`` ``(P,)`` from batch ``b``'s rows kept apart (`_keep_apart`): two products with
        its ``(R, P)`` rows, read where they are."""
        rows = self.stored[b][0]
        c = self.W[b].T @ (self.W[b] @ (rows @ v))
        return v - c.astype(v.dtype) @ rows

    def linear(self, data_b, stored_b):
        """The batch's linear map ``t -> M_b t`` (stored, or recomputed from the forward pass)."""
        if self.store is None:
            return lambda t: self.forward(self.params, data_b, t)
        if self.store == _ROWS:  # stored_b: the rows, leaf by leaf ((R, *leaf shape), in t's leaf order)
            if self.row_dtype is None:
                return lambda t: sum(r.reshape(r.shape[0], -1) @ leaf.reshape(-1)
                                     for r, leaf in zip(stored_b, jax.tree_util.tree_leaves(t), strict=True))
            *narrow, scale = stored_b  # rows scaled by 2^-e, and 2^e per row; the products in t's dtype
            return lambda t: scale * sum(r.reshape(r.shape[0], -1).astype(leaf.dtype) @ leaf.reshape(-1)
                                         for r, leaf in zip(narrow, jax.tree_util.tree_leaves(t), strict=True))
        return _rebuild(_recipe(self.forward, self.to_tree, self.size, self.dtype, self.params, data_b), self.params,
                        data_b, stored_b)

    def project_out(self, t, batch):
        r"""$Q_b t = t - M_b^\top W_b^\top W_b M_b t$ for one ``batch`` ``(data_b, W_b, stored_b)``, ``t`` a pytree."""
        data_b, W_b, stored_b = batch
        linear = self.linear(data_b, stored_b)
        u = linear(t)
        c = W_b.T @ (W_b @ u)
        if self.store is None:
            g = self.backward(self.params, data_b, c)
        else:
            g = jax.linear_transpose(linear, t)(c.astype(u.dtype))[0]
        return jax.tree_util.tree_map(lambda a, b: a - b.astype(a.dtype), t, g)

    @property
    def frobenius_norm(self):
        r"""$\|M\|_F$ (from the Grams' traces; on a mesh with the repeated last batch counted twice)."""
        return jnp.sqrt(jnp.sum(self.traces))

    def kernel_norm(self, v):
        r"""$\|M v\|$ for a flat vector ``v`` (0 exactly on $\ker M$)."""
        if self.apart:
            return jnp.sqrt(sum(jnp.sum((rows @ v) ** 2) for (rows,) in self.stored))
        t = self.to_tree(v)
        norms = canonical_convolutions(lambda b: jnp.sum(self.linear(b[0], b[2])(t) ** 2))
        return jnp.sqrt(lax.map(norms, self.batches()).sum())


class _FactorPlan(NamedTuple):
    """The static part of factoring the batches (hashable, compared by value: the row maps are structural)."""

    rows: Callable
    forward: Callable
    to_tree: Callable
    size: int
    dtype: np.dtype
    num_rows: int
    store: str | None
    by_products: bool
    cutoff: float | None
    row_dtype: np.dtype | None = None
    apart: bool = False  # the rows kept as one (R, P) array (flat parameters' order), for `_factor_apart`


def _check_cutoff(cutoff) -> float | None:
    """The relative eigenvalue cut-off as a Python float in [0, 1), or None (the default)."""
    if cutoff is None:
        return None
    try:
        value = float(cutoff)
    except (TypeError, ValueError):
        raise TypeError(f"{_WHO}: cutoff must be a number or None, got {type(cutoff).__name__} {cutoff!r}") from None
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{_WHO}: cutoff is relative to each Gram's largest eigenvalue and must lie in [0, 1), "
                         f"got {value}")
    return value


def _check_row_dtype(row_dtype, store, dtype) -> np.dtype | None:
    """``row_dtype`` as a NumPy floating dtype no wider than the parameters' (None: theirs), asked for with rows."""
    if row_dtype is None:
        return None
    try:
        narrow = jnp.dtype(row_dtype)
    except TypeError:
        raise TypeError(f"{_WHO}: row_dtype must be a floating dtype such as 'float16', got {row_dtype!r}") from None
    if not jnp.issubdtype(narrow, jnp.floating) or narrow.itemsize > np.dtype(dtype).itemsize:
        raise ValueError(f"{_WHO}: row_dtype must be a floating dtype no wider than the parameters' "
                         f"({np.dtype(dtype)}), got {narrow}")
    if store != _ROWS:
        raise ValueError(f"{_WHO}: row_dtype={narrow} keeps the stored rows in that dtype: pass "
                         f"store_linearization='rows' with it (got store_linearization={store!r})")
    return None if narrow == np.dtype(dtype) else narrow


def _narrow_rows(leaves, row_dtype, dtype):
    """Rows leaf by leaf ``(R, ...)`` in ``row_dtype``, each row scaled by ``2^-e`` (its largest entry in [0.5, 1)),
    with the scales ``2^e`` ``(R,)``; and the rows they stand for (in ``dtype``), for the Gram."""
    largest = functools.reduce(jnp.maximum, [jnp.max(jnp.abs(a.reshape(a.shape[0], -1)), axis=1) for a in leaves])
    e = jnp.frexp(largest)[1]  # largest = f 2^e with f in [0.5, 1); 0 for a zero row
    expand = lambda v, a: v.reshape((-1,) + (1,) * (a.ndim - 1))  # noqa: E731
    narrow = tuple(jnp.ldexp(a, expand(-e, a)).astype(row_dtype) for a in leaves)
    scale = jnp.ldexp(jnp.ones((), dtype), e)
    return narrow + (scale,), [expand(scale, a) * n.astype(dtype) for a, n in zip(leaves, narrow, strict=True)]


def _linearization_bytes(rows: RowSource, data_b) -> int:
    """The bytes of one batch's stored linearisation (an abstract trace: nothing runs)."""
    stored = jax.eval_shape(lambda p, d: _linearize_batch(rows.forward, rows.to_tree, rows.size, rows.dtype, p, d)[0],
                            rows.params, data_b)
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in stored)


def _recipe(forward, to_tree, size, dtype, params, data_b):
    """How to rebuild a batch's linear map from its stored arrays, read from an abstract trace of the linearisation
    (nothing runs, and nothing enters the caller's program) wherever a program uses it. A traced recipe holds the
    linearisation's own program, new at every trace: as static data of the `RowBlocks` it made every fit a new
    structure, so a refit compiled its projection and predictive again."""
    box = {}

    def trace(p, d):
        stored, box["recipe"] = _linearize_batch(forward, to_tree, size, dtype, p, d)
        return stored

    jax.eval_shape(trace, params, data_b)
    return box["recipe"]


def _linearize_batch(forward, to_tree, size, dtype, params, data_b):
    """`_linearize` of the batch's map ``t -> M_b t``."""
    zeros = to_tree(jnp.zeros(size, dtype))
    return _linearize(lambda t: forward(params, data_b, t), params, data_b, zeros)


def _batch_gram(params, data_b, plan: _FactorPlan):
    """``(gram_b, stored_b)``: one batch's Gram and what it keeps (its rows, its linearisation, or ``()``)."""
    # The Gram M_b M_b^T from the rows (per-example reverse passes): either forward-mode products of M_b
    # with them (R tangent passes over the batch) or their inner products (2 R^2 P flops), whichever
    # XLA's cost analysis counts fewer flops for: an MLP's tangent pass is cheap (products: 2.2x faster
    # at P = 118k), a convolution's is not (inner products: 2.2x faster on LeNet-5).
    rows_b = plan.rows(params, data_b)
    if plan.store == _ROWS:  # the rows are kept: their inner products (of the rows as kept) are the Gram
        leaves = tuple(jax.tree_util.tree_leaves(rows_b))
        if plan.apart:  # one (R, P) array, the leaves side by side in the flat parameters' order (never narrow)
            leaves = (jnp.concatenate([a.reshape(a.shape[0], -1) for a in leaves], axis=1),)
        narrow = plan.row_dtype is not None
        kept, used = _narrow_rows(leaves, plan.row_dtype, plan.dtype) if narrow else (leaves, leaves)
        return sum(a.reshape(a.shape[0], -1) @ a.reshape(a.shape[0], -1).T for a in used), kept
    keep = plan.store == _LINEARIZATION
    if plan.by_products or keep:
        stored, recipe = _linearize_batch(plan.forward, plan.to_tree, plan.size, plan.dtype, params, data_b)
    if plan.by_products:
        gram_b = jax.vmap(_rebuild(recipe, params, data_b, stored))(rows_b)
    else:
        flat = [a.reshape(a.shape[0], -1) for a in jax.tree_util.tree_leaves(rows_b)]
        gram_b = sum(a @ a.T for a in flat)
    return gram_b, (tuple(stored) if keep else ())


def _factor_grams(grams, plan: _FactorPlan):
    """``(W, traces)`` of the stacked Grams ``(B, R, R)``."""
    shape = (plan.num_rows, plan.size)
    return lax.map(lambda g: gram_factor(g, shape, plan.cutoff)[0], grams), jax.vmap(jnp.trace)(grams)


def _factor_batches(params, data, plan: _FactorPlan):
    """``(W, stored, traces)``: every batch's Gram factor, stored rows or linearisation, and Gram trace."""
    grams, stored = lax.map(canonical_convolutions(lambda d: _batch_gram(params, d, plan)), data)
    # A separate loop: an eigendecomposition inside the loop above slows its products ~1.7x on CPU.
    W, traces = _factor_grams(grams, plan)
    return W, stored, traces


_factor_batches_jit = jax.jit(_factor_batches, static_argnums=2)
# One batch's Gram and rows, the batch taken inside (its index an argument): one program called once per batch.
_batch_gram_jit = jax.jit(lambda params, data, b, plan: canonical_convolutions(functools.partial(
    _batch_gram, plan=plan))(params, jax.tree_util.tree_map(lambda a: a[b], data)), static_argnums=3)
_factor_grams_jit = jax.jit(lambda grams, plan: _factor_grams(jnp.stack(grams), plan), static_argnums=1)

# Rows kept apart (`RowBlocks.project_apart`): a `lax.scan` over stacked rows copies each batch's slice before its
# products (XLA:CPU), as many bytes written and read again as the products read: a sweep of 10 vectors over a
# CNN's rows (500 x 124,814 per batch) ran 1.4-1.6x slower stacked (`benchmarks/projected.py`'s `_cnn_sweep_job`,
# old and new code side by side, 2026-12-02; the 124,814-parameter fit 648 s -> 465 s). Kept apart, one
# (R, P) array per batch, the sweep is unrolled over the batches on the flat vector (two products each): one
# set-up program called once per batch, and a projection's program that grows with the number of batches
# (measured on an MLP: compiled in 2.5 s stacked whatever the batches, 7 s with 72 batches apart, 26 s with 256).
# A batch saves about a third of four reads of its rows per sweep and costs a tenth of a second or more of
# compilation, so only for batches whose rows are large (a projection takes tens to hundreds of sweeps), and
# not too many of them.
_APART_BYTES = 1 << 26  # a batch's rows at least this large (64 MiB) ...
_APART_MAX_BATCHES = 128  # ... and at most this many batches


def _keep_apart(store, row_dtype, batches, batch_bytes, arrays) -> bool:
    """Whether to keep each batch's rows (in the parameters' dtype) in arrays of their own: rows large and few enough,
    built eagerly (under a trace the set-up is one program's loop, whose outputs are stacked). Narrow rows stay
    stacked: the loop widens each batch as it slices it, so it copies nothing more; kept apart, XLA ran every batch's
    widening before the sweep (nothing else orders them; an optimization barrier does not survive XLA:CPU) and held
    every wide copy at once: 7.7 GB where a CNN's float16 rows take 2.5 GB (`benchmarks/projected.py --cnn-storage`,
    2026-12-02)."""
    if store != _ROWS or row_dtype is not None or not 1 < batches <= _APART_MAX_BATCHES or batch_bytes < _APART_BYTES:
        return False
    return not any(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves(arrays))


def _factor_apart(params, data, plan: _FactorPlan, batches: int):
    """`_factor_batches` with each batch's rows in an array of its own: ``stored[b]`` is ``(rows,)`` (``(R, P)``)."""
    grams, stored = zip(*(_batch_gram_jit(params, data, b, plan) for b in range(batches)), strict=True)
    W, traces = _factor_grams_jit(tuple(grams), plan)
    return W, tuple(stored), traces


def _plan_memory(rows, batches, store, per_batch_bytes, on_mesh, rows_cheaper, row_dtype=None) -> str | None:
    """What to store (``"rows"``, ``"linearization"`` or None); refuses factors (or asked-for storage) that
    cannot fit. ``rows_cheaper``: a tangent pass costs more flops than a product with the rows."""
    item = np.dtype(rows.dtype).itemsize
    row_item = item if row_dtype is None else np.dtype(row_dtype).itemsize
    R, P = rows.num_rows, int(rows.size)
    # The Grams and their factors (both alive between the two loops), plus one batch's rows
    # (R x P, twice: as computed and flattened) while building them.
    base = (2 * batches * R * R + 2 * R * P) * item
    what = f"{_WHO}: the factors of {batches} batches of {R} rows ({P} parameters)" + (" per device" if on_mesh else "")
    hint = "use a smaller batch_size, or from_loss_jacobian (one row per example whatever the outputs)"
    check_fits(base, what, hint)
    with_rows = base + batches * R * P * row_item + (0 if row_dtype is None else batches * R * item)  # and scales
    if store == _ROWS:
        check_fits(with_rows, what + " and their rows",
                   hint + ", or store_linearization=None (the linearisations, when they fit)")
        return _ROWS
    if store is None and rows_cheaper:
        free = available_bytes()
        if free is not None and with_rows <= free // 2:  # the rest for the vectors and everything else
            return _ROWS
    if store is False:
        return None
    total = base + batches * per_batch_bytes()
    if store is None:
        try:
            check_fits(total, what, hint)
        except MemoryBudgetError:
            return None
        return _LINEARIZATION
    check_fits(total, what + " and their stored linearisations",
               hint + ", or store_linearization=False (recompute the forward pass in every sweep)")
    return _LINEARIZATION


def _gram_by_products(rows, data_b) -> bool:
    """Whether ``R`` tangent passes over a batch cost fewer flops than the ``2 R^2 P`` of the rows' inner products
    (XLA's count for one tangent pass, from lowering alone; the products when it gives none)."""
    spec = lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)) if hasattr(a, "__array__") else a  # noqa: E731
    tangent = jax.eval_shape(lambda v: rows.to_tree(v), jax.ShapeDtypeStruct((rows.size,), rows.dtype))  # no program
    try:
        args = jax.tree_util.tree_map(spec, (rows.params, data_b, tangent))
        cost = jax.jit(rows.forward).lower(*args).cost_analysis()
        flops = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
    except Exception:  # noqa: BLE001 - no cost model on this backend: the products, as before
        return True
    return not flops > 2 * rows.num_rows * rows.size


def _linearize(linear_in_t, params, data_b, zeros):
    r"""Linearise ``t -> M_b t`` once: ``(stored, recipe)``, the arrays to keep and how to rebuild the map.

    Arrays of the linearisation that ARE the params or the batch's data are referenced, not
    stored, so only what the forward pass computes (activations, derivatives) is kept.
    """
    linear = jax.linearize(linear_in_t, zeros)[1]
    leaves, treedef = jax.tree_util.tree_flatten(linear)
    shared = {"p": jax.tree_util.tree_leaves(params), "d": jax.tree_util.tree_leaves(data_b)}
    sources, stored = [], []
    for leaf in leaves:
        where = next(((k, i) for k, ls in shared.items() for i, x in enumerate(ls) if x is leaf), None)
        if where is None:
            where = ("s", len(stored))
            stored.append(leaf)
        sources.append(where)
    return stored, (treedef, tuple(sources))


def _rebuild(recipe, params, data_b, stored_b):
    treedef, sources = recipe
    shared = {"p": jax.tree_util.tree_leaves(params), "d": jax.tree_util.tree_leaves(data_b), "s": stored_b}
    return jax.tree_util.tree_unflatten(treedef, [shared[k][i] for k, i in sources])


__all__ = ["RowBlocks"]
