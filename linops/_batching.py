"""Streaming over the examples: full batches with `lax.scan` / `lax.map`, then the short last
batch on its own (it is never dropped). Memory is that of one batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def num_examples(data) -> int:
    sizes = {jnp.shape(a)[0] for a in jax.tree_util.tree_leaves(data)}
    if len(sizes) != 1:
        raise ValueError(f"data leaves disagree on the number of examples: {sorted(sizes)}")
    return sizes.pop()


def _split(data, batch_size):
    n = num_examples(data)
    b = max(1, min(batch_size, n))
    full, rest = divmod(n, b)
    head = jax.tree_util.tree_map(lambda a: a[: full * b].reshape((full, b) + a.shape[1:]), data)
    tail = jax.tree_util.tree_map(lambda a: a[full * b:], data) if rest else None
    return full, head, tail


def batched_sum(fn, data, batch_size: int):
    """``sum(fn(batch) for batch in batches(data))`` with `lax.scan`, remainder included."""
    full, head, tail = _split(data, batch_size)
    total = None
    if full:
        first = jax.tree_util.tree_map(lambda a: a[0], head)
        init = jax.tree_util.tree_map(jnp.zeros_like, jax.eval_shape(fn, first))
        init = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), init)
        total, _ = lax.scan(lambda acc, batch: (jax.tree_util.tree_map(jnp.add, acc, fn(batch)), None), init, head)
    if tail is not None:
        last = fn(tail)
        total = last if total is None else jax.tree_util.tree_map(jnp.add, total, last)
    return total


def batched_map(fn, data, batch_size: int):
    """``concatenate([fn(batch) for batch in batches(data)])`` along the example axis."""
    full, head, tail = _split(data, batch_size)
    parts = []
    if full:
        out = lax.map(fn, head)
        parts.append(jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]), out))
    if tail is not None:
        parts.append(fn(tail))
    if len(parts) == 1:
        return parts[0]
    return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a, axis=0), *parts)
