"""`flat_draw`: a `jax.random` draw of any shape, compiled as a flat one."""

from __future__ import annotations

import math

import jax


def flat_draw(draw, key, shape, *args, **kwargs) -> jax.Array:
    """``draw(key, shape, *args, **kwargs)``, drawn flat and reshaped.

    ``draw`` is a `jax.random` sampler of independent elements that takes ``(key, shape, ...)``: normal,
    uniform, rademacher, ... The values are the same, bit for bit: threefry counts the elements in row-major
    order (with or without ``jax_threefry_partitionable``). XLA:CPU at JAX's default optimisation level compiles
    threefry for a flat shape up to 4-5 times faster than for a multi-dimensional one (shapes (63, 10) and
    (32, 3, 3, 16): 0.8-1.0 s against 0.2-0.3 s, alone or inside a product; 1.1-1.6 times for (256, 100) and
    (1000, 20); jaxlib 0.10.2, `benchmarks/draws.py`), so the library draws its samples and probes this way.

    Examples:
        >>> import jax
        >>> from linops.runtime import flat_draw
        >>> key = jax.random.key(0)
        >>> z = flat_draw(jax.random.normal, key, (3, 4))
        >>> z.shape, bool((z == jax.random.normal(key, (3, 4))).all())
        ((3, 4), True)
    """
    shape = (shape,) if isinstance(shape, int) or getattr(shape, "ndim", None) == 0 else tuple(shape)  # as jax.random
    return draw(key, (math.prod(shape),), *args, **kwargs).reshape(shape)
