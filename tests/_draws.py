"""The tests' random data: `jax.random.normal` and `jax.random.uniform`'s own values, bit for bit, for a fraction
of their compilation.

Each `jax.random` draw is a compiled program per shape and dtype, and XLA:CPU at JAX's default optimisation level
takes up to 1-2 s to compile threefry for a two- or four-dimensional shape (0.2-0.3 s for a flat one; 0.1-0.2 s
at level 0; `benchmarks/draws.py`). At level 3 the suite's random programs took 398 s of its workers' 2,603,
244 s since (the rest: models' initialisers in equinox and flax, which draw shaped; issue 32). Threefry's
counters are the elements' flat indices, so a draw of shape ``s`` equals the first ``prod(s)`` elements of a flat
draw of any longer length, reshaped: `normal` draws a flat length rounded up to a power of two (one program per
length class and dtype) and cuts and reshapes it in NumPy (no program). `tests/test_draws.py` checks the
equality. Inside a trace, or given a batch of keys (which `jax.random` refuses), they are `jax.random`'s own
functions.
"""

import jax
import jax.numpy as jnp
import numpy as np


def _length_class(size: int) -> int:
    return max(64, 1 << max(size - 1, 0).bit_length())


def _one_concrete_key(key) -> bool:
    if isinstance(key, jax.core.Tracer):
        return False
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    return key.ndim == (0 if typed else 1)


def _flat_then_shaped(draw, key, shape, dtype, *args):
    shape = tuple(int(d) for d in shape) if np.iterable(shape) else (int(shape),)
    if not _one_concrete_key(key):
        return draw(key, shape, dtype, *args)
    size = int(np.prod(shape, dtype=np.int64))
    flat = draw(key, (_length_class(size),), dtype, *args)
    return jnp.asarray(np.asarray(flat)[:size].reshape(shape))


def normal(key, shape=(), dtype=None):
    """``jax.random.normal(key, shape, dtype)``, compiled once per length class."""
    return _flat_then_shaped(jax.random.normal, key, shape, dtype)


def uniform(key, shape=(), dtype=None, minval=0.0, maxval=1.0):
    """``jax.random.uniform(key, shape, dtype, minval, maxval)``, compiled once per length class (the bounds as
    Python numbers)."""
    return _flat_then_shaped(jax.random.uniform, key, shape, dtype, minval, maxval)
