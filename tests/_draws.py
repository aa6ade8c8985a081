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

`install` (tests/conftest.py) routes the test session's other draws through them too: the models' initialisers
in equinox and flax draw each weight shaped, and at level 3 those programs took about 195 s of the workers' 1,944
(2026-12-02: 285 uniform programs, 205 normal, 16 truncated normal at 1.3 s each). Only calls from outside the
library are routed: `linops` and `posteriors` call `jax.random` as users' programs do.
"""

import sys

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


def _concrete_scalars(args) -> bool:
    return all(not isinstance(a, jax.core.Tracer) and np.ndim(a) == 0 for a in args)


def _flat_then_shaped(draw, key, shape, dtype, *args):
    shape = tuple(int(d) for d in shape) if np.iterable(shape) else (int(shape),)
    if not (_one_concrete_key(key) and _concrete_scalars(args)):
        return draw(key, shape, dtype, *args)
    size = int(np.prod(shape, dtype=np.int64))
    flat = draw(key, (_length_class(size),), dtype, *args)
    return jax.device_put(np.asarray(flat)[:size].reshape(shape))  # jnp.asarray would compile a `stage` per shape


def normal(key, shape=(), dtype=None):
    """``jax.random.normal(key, shape, dtype)``, compiled once per length class."""
    return _flat_then_shaped(_JAX["normal"], key, shape, dtype)


def uniform(key, shape=(), dtype=None, minval=0.0, maxval=1.0):
    """``jax.random.uniform(key, shape, dtype, minval, maxval)``, compiled once per length class (the bounds as
    Python numbers)."""
    return _flat_then_shaped(_JAX["uniform"], key, shape, dtype, minval, maxval)


def truncated_normal(key, lower, upper, shape=None, dtype=None):
    """``jax.random.truncated_normal(key, lower, upper, shape, dtype)``, compiled once per length class (scalar
    bounds and a given shape; otherwise `jax.random`'s own)."""
    if shape is None:
        return _JAX["truncated_normal"](key, lower, upper, shape, dtype)
    return _flat_then_shaped(lambda k, s, d, lo, hi: _JAX["truncated_normal"](k, lo, hi, s, d), key, shape, dtype,
                             lower, upper)


_JAX = {name: getattr(jax.random, name) for name in ("normal", "uniform", "truncated_normal")}
_OURS = {"normal": normal, "uniform": uniform, "truncated_normal": truncated_normal}


def _routed(name):
    ours, theirs = _OURS[name], _JAX[name]

    def draw(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.split(".")[0] in ("linops", "posteriors") or kwargs.get("out_sharding") is not None:
            return theirs(*args, **kwargs)
        kwargs.pop("out_sharding", None)
        return ours(*args, **kwargs)

    draw.__wrapped__ = theirs
    return draw


def install():
    """Route `jax.random.normal`, `uniform` and `truncated_normal`, called from outside the library, through this
    module's draws (the same values, fewer programs) for the rest of the process."""
    for name in _OURS:
        if getattr(jax.random, name) is _JAX[name]:
            setattr(jax.random, name, _routed(name))
