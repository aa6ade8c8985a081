"""Streaming over the examples with `lax.scan`, every batch of one shape where it can be, so the loop body
compiles once: a map's last batch overlaps the one before it (its repeated rows dropped), a sum takes a batch
size that divides the examples where one of at least half the asked size does, else sums the short last batch on
its own (it is never dropped). Memory is that of one batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from linops.runtime._compile import program
from linops.runtime._conv_layout import canonical_convolutions
from linops.runtime._progress import tick


def num_examples(data) -> int:
    sizes = {jnp.shape(a)[0] for a in jax.tree_util.tree_leaves(data)}
    if len(sizes) != 1:
        raise ValueError(f"data leaves disagree on the number of examples: {sorted(sizes)}")
    return sizes.pop()


def _split(data, batch_size):
    """``(full, head, tail)``: ``full`` batches stacked in ``head``, and the short last batch (or None).

    Where the examples split into batches of at least half the asked size, that size is taken instead, so there is
    no short last batch: the loop body is then compiled once, where a short last batch compiles it a second time
    for its own shape (N = 1,000 in batches of 128 runs as 8 batches of 125). Memory is that of one batch either
    way; the sums agree to rounding."""
    n = num_examples(data)
    b = max(1, min(batch_size, n))
    b = next((d for d in range(b, (b - 1) // 2, -1) if n % d == 0), b)
    full, rest = divmod(n, b)
    head = jax.tree_util.tree_map(lambda a: a[: full * b].reshape((full, b) + a.shape[1:]), data)
    tail = jax.tree_util.tree_map(lambda a: a[full * b:], data) if rest else None
    return full, head, tail


def _traced(data) -> bool:
    """Whether ``data`` is being traced (inside a caller's program). Called eagerly, a loop would otherwise run
    its slicing, its short last batch and its additions as single operations, each compiled on its own (the
    last batch's body op by op: hundreds of programs for a small CNN, 27 ms each at XLA's default optimisation
    level on 2 cores, against one program for the whole). A closure over traced values with untraced ``data``
    is fine too: `program` then nests in the caller's trace."""
    return any(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves(data))


def batched_sum(fn, data, batch_size: int, progress: str | None = None):
    """``sum(fn(batch) for batch in batches(data))`` with `lax.scan`, remainder included; ``progress``: the
    label of a progress bar over the batches (`tick`), or None.

    ``data`` is a pytree of arrays with the examples on their first axis; ``fn`` maps a batch of it to a
    pytree of arrays of fixed shapes. Memory is that of one batch. Batches have at most ``batch_size``
    examples: where a size of at least half of it divides the examples, every batch has that size (the body
    compiles once); otherwise the short last batch is summed on its own, a second shape. Called outside a trace
    (eagerly), the whole loop is compiled as one program (`program`), so ``fn`` must be traceable.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.runtime import batched_sum
        >>> X, y = jnp.arange(10.0).reshape(5, 2), jnp.ones(5)
        >>> batched_sum(lambda b: b[0].T @ b[1], (X, y), 3)   # X^T y over batches of 3 and 2
        Array([20., 25.], dtype=float32)
    """
    if not _traced(data):  # called eagerly: the whole loop as one program (see `_traced`)
        return program(lambda d: batched_sum(fn, d, batch_size, progress))(data)
    fn = canonical_convolutions(fn)  # the loop body's convolutions in the CPU backend's fast layout
    full, head, tail = _split(data, batch_size)
    count = full + (tail is not None)
    progress = progress if count > 1 else None  # one batch: nothing to show progress on
    total = None
    if full:
        first = jax.tree_util.tree_map(lambda a: a[0], head)
        init = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn, first))

        def step(acc, indexed):
            i, batch = indexed
            out = fn(batch)
            tick(progress, i + 1, count, unit="batch")
            return jax.tree_util.tree_map(jnp.add, acc, out), None

        total, _ = lax.scan(step, init, (jnp.arange(full), head))
    if tail is not None:
        last = fn(tail)
        tick(progress, count, count, unit="batch", after=total)  # after the loop's ticks
        total = last if total is None else jax.tree_util.tree_map(jnp.add, total, last)
    return total


def batched_map(fn, data, batch_size: int, progress: str | None = None):
    """``concatenate([fn(batch) for batch in batches(data)])`` along the example axis; ``progress``: the
    label of a progress bar over the batches, or None.

    Every batch has one size, at most ``batch_size``, so the body compiles once: the last batch starts at
    ``n - b`` and overlaps the one before it, and its repeated rows are dropped. ``fn`` must therefore map the
    examples of a batch independently (row ``i`` of its outputs a function of example ``i`` alone), as a
    `jax.vmap` of a per-example function does. Called outside a trace (eagerly), the whole loop is compiled as
    one program (`program`), so ``fn`` must be traceable.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.runtime import batched_map
        >>> batched_map(lambda b: 2 * b, jnp.arange(5.0), 2)   # rows 0-1, 2-3 and 3-4 (row 3 kept once)
        Array([0., 2., 4., 6., 8.], dtype=float32)
    """
    if not _traced(data):  # called eagerly: the whole loop as one program (see `_traced`)
        return program(lambda d: batched_map(fn, d, batch_size, progress))(data)
    fn = canonical_convolutions(fn)
    n = num_examples(data)
    count = -(-n // max(1, min(batch_size, n)))
    if count == 1:
        return fn(data)
    b = -(-n // count)  # count batches of b: the last starts at n - b, overlapping the one before it
    overlap = count * b - n

    def step(_, i):
        start = jnp.minimum(i * b, n - b)
        out = fn(jax.tree_util.tree_map(lambda a: lax.dynamic_slice_in_dim(a, start, b), data))
        tick(progress, i + 1, count, unit="batch")
        return None, out

    out = lax.scan(step, None, jnp.arange(count))[1]  # (count, b, ...)

    def join(a):
        flat = a.reshape((-1,) + a.shape[2:])
        if not overlap:
            return flat
        # the last batch's first `overlap` rows are the examples the batch before it mapped already
        return jnp.concatenate([flat[: (count - 1) * b], a[-1, overlap:]], axis=0)

    return jax.tree_util.tree_map(join, out)


def check_mesh(mesh, axis, who):
    """``(mesh, axis)`` checked: a `jax.sharding.Mesh` with that axis, or ``(None, axis)``."""
    if mesh is None:
        return None, axis
    from jax.sharding import Mesh

    if not isinstance(mesh, Mesh):
        raise TypeError(f"{who}: mesh must be a jax.sharding.Mesh (or None), got {type(mesh).__name__}")
    if axis not in mesh.axis_names:
        raise ValueError(f"{who}: mesh has axes {tuple(mesh.axis_names)}; the example axis {axis!r} is not one of them")
    return mesh, axis


def leaf_specs(tree, spec):
    """``spec`` (a `PartitionSpec`) for every leaf of ``tree``: the ``in_specs`` of a `shard_map`."""
    return jax.tree_util.tree_map(lambda _: spec, tree)


def _even_split(data, devices: int):
    """The leading examples that split evenly over ``devices``, and the rest (or None)."""
    n = num_examples(data)
    even = (n // devices) * devices
    head = jax.tree_util.tree_map(lambda a: a[:even], data)
    rest = jax.tree_util.tree_map(lambda a: a[even:], data) if even < n else None
    return even, head, rest


def sharded_sum(fn, data, batch_size: int, mesh, axis: str, progress: str | None = None):
    """`batched_sum` with the examples split over the devices of ``mesh`` along ``axis`` (``mesh`` None:
    `batched_sum` itself, on one device).

    Each device streams over its own examples in batches of ``batch_size`` and the partial sums
    are reduced with ``psum``; the examples left over by an uneven split (fewer than the number
    of devices) are summed on their own, replicated, and added: none is dropped. ``progress``: a bar's
    label (one device only: on a mesh every device would advance it).
    """
    if mesh is None:
        return batched_sum(fn, data, batch_size, progress)
    from jax.sharding import PartitionSpec

    even, head, rest = _even_split(data, mesh.shape[axis])
    total = None
    if even:
        specs = leaf_specs(head, PartitionSpec(axis))
        local = lambda block: jax.lax.psum(batched_sum(fn, block, batch_size), axis)  # noqa: E731
        # check_vma=False: the scan inside starts from zeros that are the same on every device, and psum
        # must add the per-device partial sums (not multiply a value it believes replicated).
        total = jax.shard_map(local, mesh=mesh, in_specs=(specs,), out_specs=PartitionSpec(), check_vma=False)(head)
    if rest is not None:
        last = batched_sum(fn, rest, batch_size)
        total = last if total is None else jax.tree_util.tree_map(jnp.add, total, last)
    return total


def sharded_map(fn, data, batch_size: int, mesh, axis: str):
    """`batched_map` with the examples split over the devices of ``mesh`` along ``axis`` (None: one
    device; the output stays split the same way; the uneven remainder is mapped on its own and appended)."""
    if mesh is None:
        return batched_map(fn, data, batch_size)
    from jax.sharding import PartitionSpec

    even, head, rest = _even_split(data, mesh.shape[axis])
    parts = []
    if even:
        specs = leaf_specs(head, PartitionSpec(axis))
        local = lambda block: batched_map(fn, block, batch_size)  # noqa: E731
        parts.append(jax.shard_map(local, mesh=mesh, in_specs=(specs,), out_specs=PartitionSpec(axis),
                                   check_vma=False)(head))
    if rest is not None:
        parts.append(batched_map(fn, rest, batch_size))
    if len(parts) == 1:
        return parts[0]
    return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a, axis=0), *parts)
