r"""Sweeps over the row blocks of a `linops.nn._rowblocks.RowBlocks`: products of the projectors $Q_b$.

- `sequential`: $Q_B \cdots Q_1 v$, or the symmetric $Q_1 \cdots Q_{B-1} Q_B Q_{B-1} \cdots Q_1 v$,
  as ONE `lax.scan` over the stacked batches (on a mesh, XLA moves each batch's factors to the
  vector as the scan reaches them: the same product as on one device).
- `split`: each device sweeps its own batches, on its own factors, and the results are averaged
  (``psum``): $\frac1D \sum_d T_d v$.
- `ring`: a block of vectors split by columns over the devices, each column block travelling round
  them (``ppermute``) through every device's batches and back: the symmetric sweep in a rotated order,
  with the factors left in place. It runs a solver on each device's columns inside `jax.shard_map`.
- `repeat`: the paper's plain method, sweeps repeated until they stop changing the vector.

Sweeps run in the parameters' own pytree layout; vectors are flattened only at the ends.

Examples:
    >>> import jax.numpy as jnp
    >>> from linops.nn._rowblocks import RowBlocks
    >>> from linops.nn._rowsources import matrix_rows
    >>> blocks = RowBlocks.build(matrix_rows(jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), batch_size=1))
    >>> sequential(blocks, jnp.ones(3))
    Array([0., 0., 1.], dtype=float32)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from linops.runtime import _interrupt
from linops.runtime._batching import leaf_specs
from linops.runtime._conv_layout import canonical_convolutions


def scan(blocks, t, batches, reverse=False, watch=False, select=None):
    """$Q$ of each of ``batches`` in turn (in reverse order with ``reverse``) on a pytree ``t``; ``watch``: after
    each batch, a host callback that stops the program if Ctrl-C was pressed (`linops.runtime._interrupt`);
    ``select``: ``batches`` are indices, and ``select(i)`` is batch ``i``."""

    def step(t, b):
        b = b if select is None else select(b)
        if watch:  # on the batch's own factor, never on t: under jax.vmap of the sweep (a block of columns) a
            # callback given a batched value would run once per column
            jax.debug.callback(lambda _: _interrupt.check(), jnp.ravel(b[1])[:1])
        return blocks.project_out(t, b), None

    return lax.scan(canonical_convolutions(step), t, batches, reverse=reverse)[0]  # fast convolutions in a loop


def symmetric_scan(blocks, t, batches, watch=False):
    r"""Forward through ``batches``, then back: $Q_1 \cdots Q_B Q_B \cdots Q_1$, which is the symmetric sweep
    ($Q_B Q_B = Q_B$, a projector). The last batch is applied twice rather than left out of the way back:
    slicing it off would copy every batch's stored linearisation (as much memory again as the operator).

    ONE loop over the batch indices $0, \dots, B-1, B-1, \dots, 0$, each step reading its batch where it lies:
    the batch's products (a network's tangent and transposed passes, for a linearisation) are compiled once, not
    once per direction, and a projection's program holds three sweeps (its right-hand side, CG's step and the
    recomputed residual)."""
    count = jax.tree_util.tree_leaves(batches)[0].shape[0]
    order = jnp.concatenate([jnp.arange(count), jnp.arange(count - 1, -1, -1)])
    at = lambda i: jax.tree_util.tree_map(lambda a: lax.dynamic_index_in_dim(a, i, keepdims=False), batches)  # noqa: E731
    return scan(blocks, t, order, watch=watch, select=at)


def sequential(blocks, v, symmetric=False, watch=False):
    r"""$Q_B \cdots Q_1 v$ (or the symmetric sweep) over all batches, in order."""
    if blocks.apart:  # rows kept apart: the batches unrolled on the flat vector, each read where it is
        batches = range(blocks.num_batches)
        for b in [*batches, *reversed(batches[:-1])] if symmetric else batches:
            if watch:
                jax.debug.callback(lambda _: _interrupt.check(), blocks.W[b, :1, 0])
            v = blocks.project_apart(v, b)
        return v
    local = symmetric_scan if symmetric else scan
    return blocks.to_flat(local(blocks, blocks.to_tree(v), blocks.batches(), watch=watch))


def split(blocks, v, symmetric=False, watch=False):
    r"""$\frac1D \sum_d$ (device $d$'s sweep over its own batches) $v$: each device on its own factors."""
    from jax.sharding import PartitionSpec

    devices = blocks.mesh.shape[blocks.axis]
    local_sweep = symmetric_scan if symmetric else scan

    def local(batches):
        return lax.psum(blocks.to_flat(local_sweep(blocks, blocks.to_tree(v), batches, watch=watch)),
                        blocks.axis) / devices

    batches = blocks.batches()
    return jax.shard_map(local, mesh=blocks.mesh, in_specs=(leaf_specs(batches, PartitionSpec(blocks.axis)),),
                         out_specs=PartitionSpec(), check_vma=False)(batches)


def ring(blocks, V, solve):
    r"""``solve(I_minus_T, V_d)`` on each device's columns ``V_d`` of ``V`` ``(P, k)``, the factors left in place.

    ``I_minus_T`` maps a column block ``U`` to $U - T U$, $T$ the symmetric sweep over all batches
    in an order rotated per device (round the ring, then back). ``solve`` returns
    ``(value, diagnostics)``: ``value`` of ``V_d``'s shape and ``diagnostics`` a tuple of arrays
    with one entry per column; every device must call ``I_minus_T`` the same number of times.
    ``k`` must be a multiple of the number of devices.
    """
    from jax.sharding import PartitionSpec

    axis = blocks.axis
    D = blocks.mesh.shape[axis]
    forward = [(i, (i + 1) % D) for i in range(D)]
    backward = [(i, (i - 1) % D) for i in range(D)]

    def local(batches, block):
        def sweep(u):  # one column, round the ring and back: Q_first ... Q_last ... Q_first
            t = blocks.to_tree(u)
            for _ in range(D):
                t = lax.ppermute(scan(blocks, t, batches), axis, forward)
            for _ in range(D):
                t = scan(blocks, lax.ppermute(t, axis, backward), batches, reverse=True)
            return blocks.to_flat(t)

        return solve(jax.vmap(lambda u: u - sweep(u), in_axes=1, out_axes=1), block)

    batches = blocks.batches()
    columns = PartitionSpec(axis)
    return jax.shard_map(local, mesh=blocks.mesh, in_specs=(leaf_specs(batches, columns), PartitionSpec(None, axis)),
                         out_specs=(PartitionSpec(None, axis), columns), check_vma=False)(batches, V)


def repeat(sweep, x, max_sweeps, rtol, callback=None):
    r"""The plain method: ``sweep`` applied until it changes the vector by at most ``rtol`` relatively.

    ``x``: one vector ``(P,)``, or a block ``(P, k)`` whose columns stop each on its own (a stopped column
    is frozen; ``sweep`` is applied to the whole block). Returns ``(value, sweeps, converged, history)``,
    ``history[s]`` the relative change of sweep ``s + 1`` (NaN past a column's last; ``(max_sweeps, k)`` for
    a block); ``converged`` is always True for ``rtol = 0`` (a fixed number of sweeps).
    ``callback(sweep, change)`` is called on the host after each sweep (the largest change of a block).
    """
    columns = x.shape[1:]

    def cond(state):
        _, k, change, _, _ = state
        return (k < max_sweeps) & jnp.any(change > rtol)

    def body(state):
        v, k, change, sweeps, history = state
        active = change > rtol
        new = jnp.where(active, sweep(v), v)
        step = jnp.linalg.norm(new - v, axis=0) / jnp.maximum(jnp.linalg.norm(v, axis=0), jnp.finfo(v.dtype).tiny)
        change = jnp.where(active, step, change)
        if callback is not None:
            jax.debug.callback(callback, k + 1, jnp.max(step))
        history = history.at[k].set(jnp.where(active, step, jnp.nan))
        return new, k + 1, change, sweeps + active, history

    history = jnp.full((max_sweeps, *columns), jnp.nan, x.dtype)
    start = (x, jnp.asarray(0), jnp.full(columns, jnp.inf, x.dtype), jnp.zeros(columns, jnp.int32), history)
    v, _, change, sweeps, history = lax.while_loop(cond, body, start)
    return v, sweeps, (change <= rtol) | (rtol == 0), history


__all__ = ["repeat", "ring", "sequential", "split"]
