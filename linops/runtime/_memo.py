"""What the library reads from a model's program before a fit (its layers, its kernels), traced once per model
and input shapes instead of on every call.

`memo` keeps an entry as long as the model function lives (a weak reference, as `jax.jit`'s caches hold
functions), found by the function's equality (a `linops.models.BoundModel` wrapped again after more training
compares equal) and by the pytree structure, shapes and dtypes of the arguments, never their values. A function
that cannot be hashed or weakly referenced is traced every time. Like `jax.jit`, it assumes that a function's
program depends on nothing but its arguments' shapes (not on a global it reads and that changes)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax

PER_MODEL = 32
"""Entries kept per model function (the oldest dropped first): one per kind of trace and input shapes."""

_entries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _spec(leaf):
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        return (type(leaf),)  # a Python scalar traces by its type (weakly typed), not its value
    return tuple(shape), dtype, bool(getattr(leaf, "weak_type", False))


def memo(kind: str, fn: Callable, args, build: Callable[[], Any]):
    """``build()``, computed once per (``kind``, ``fn``, the structure, shapes and dtypes of ``args``, and the
    ``jax_enable_x64`` and ``jax_default_matmul_precision`` settings) while ``fn`` lives; ``build`` must depend on
    ``args`` only through those.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.runtime._memo import memo
        >>> fn = lambda p, x: p * x
        >>> calls = []
        >>> trace = lambda args: memo("demo", fn, args, lambda: calls.append(1) or len(calls))
        >>> trace((jnp.ones(3), 1.0)), trace((jnp.zeros(3), 2.0)), trace((jnp.ones(4), 1.0))   # new values, shapes
        (1, 1, 2)
    """
    leaves, treedef = jax.tree_util.tree_flatten(args)
    config = (jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision)  # what else shapes a trace
    key = (kind, treedef, tuple(_spec(leaf) for leaf in leaves), config)
    try:
        hash(key)
        entries = _entries.setdefault(fn, {})
    except TypeError:  # fn or the arguments' structure cannot be a key: trace every time
        return build()
    if key not in entries:
        if len(entries) >= PER_MODEL:
            entries.pop(next(iter(entries)))
        entries[key] = build()
    return entries[key]
