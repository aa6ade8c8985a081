"""The model contract and adapters.

A model is a per-example function ``fn(params, x) -> (O,)`` and a params pytree. The
neural-network operators ravel params at the boundary (`ravel`); these adapters produce
``(fn, params)`` from the libraries people train with.

Example:
    >>> import jax, equinox as eqx
    >>> from linops.models import from_equinox, ravel
    >>> fn, params = from_equinox(eqx.nn.MLP(3, 2, 8, 1, key=jax.random.key(0)))
    >>> flat, unravel = ravel(params)
    >>> fn(params, jax.numpy.ones(3)).shape, flat.shape
    ((2,), (50,))
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
from jax.flatten_util import ravel_pytree


def ravel(params):
    """``(flat, unravel)``: the params pytree as one vector, and the way back.

    Example:
        >>> import jax.numpy as jnp
        >>> from linops.models import ravel
        >>> flat, unravel = ravel({"w": jnp.ones((2, 2)), "b": jnp.zeros(2)})
        >>> flat.shape, unravel(flat)["w"].shape
        ((6,), (2, 2))
    """
    return ravel_pytree(params)


def from_equinox(module) -> tuple[Callable, object]:
    """``(fn, params)`` for an Equinox module called on one example: ``module(x)``.

    The trainable arrays (inexact arrays) are the params; everything else is closed over.

    Example:
        >>> import jax, equinox as eqx
        >>> from linops.models import from_equinox
        >>> fn, params = from_equinox(eqx.nn.Linear(2, 3, key=jax.random.key(0)))
        >>> fn(params, jax.numpy.ones(2)).shape
        (3,)
    """
    params, static = eqx.partition(module, eqx.is_inexact_array)

    def fn(p, x):
        return eqx.combine(p, static)(x)

    return fn, params


def from_flax_nnx(module) -> tuple[Callable, object]:
    """``(fn, params)`` for a Flax NNX module called on one example (needs ``flax``).

    Example:
        >>> from linops.models import from_flax_nnx   # doctest: +SKIP
        >>> fn, params = from_flax_nnx(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))  # doctest: +SKIP
    """
    try:
        from flax import nnx
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("from_flax_nnx needs flax (pip install flax)") from e
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)

    def fn(p, x):
        return nnx.merge(graphdef, p, rest)(x)

    return fn, params


def per_example(batched_fn: Callable) -> Callable:
    """Turn ``batched_fn(params, X) -> (N, O)`` into the per-example ``fn(params, x) -> (O,)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from linops.models import per_example
        >>> fn = per_example(lambda p, X: X @ p)
        >>> fn(jnp.ones((3, 2)), jnp.arange(3.0))
        Array([3., 3.], dtype=float32)
    """

    def fn(params, x):
        return batched_fn(params, jax.tree_util.tree_map(lambda a: a[None], x))[0]

    return fn


__all__ = ["from_equinox", "from_flax_nnx", "per_example", "ravel"]
