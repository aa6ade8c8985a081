"""`tests._draws` gives `jax.random`'s own values (the suite's data would change silently otherwise)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import _draws as draws


@pytest.mark.parametrize("key", [jax.random.key(3), jax.random.PRNGKey(5)], ids=["typed", "raw"])
@pytest.mark.parametrize("dtype", [None, jnp.float32, jnp.float64])
def test_draws_equal_jax_random_bit_for_bit(key, dtype):
    for shape in [(), (1,), (3,), (64,), (65,), (7, 5), (2, 3, 4, 5)]:
        for ours, theirs in [(draws.normal(key, shape, dtype), jax.random.normal(key, shape, dtype)),
                             (draws.uniform(key, shape, dtype, -2.0, 3.0),
                              jax.random.uniform(key, shape, dtype, -2.0, 3.0))]:
            assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
            np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_draws_inside_a_trace_are_jax_randoms():
    key = jax.random.key(0)
    traced = jax.jit(lambda k: draws.normal(k, (3, 2)))(key)
    np.testing.assert_array_equal(traced, jax.random.normal(key, (3, 2)))
    with pytest.raises(ValueError, match="accepts a single key"):  # a batch of keys: jax.random's own error
        draws.normal(jax.random.split(key, 3), (3, 2))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_the_librarys_flat_draws_equal_jax_randoms_shaped_draws(dtype):
    """The library draws flat and reshapes (`linops.runtime.flat_draw`; XLA:CPU compiles that faster): the values
    must not move."""
    from linops.runtime import flat_draw

    key = jax.random.key(7)
    for shape in [(1,), (6, 7), (3, 4, 5)]:
        for draw, args in [(jax.random.normal, ()), (jax.random.uniform, (-1.0, 2.0)), (jax.random.rademacher, ())]:
            np.testing.assert_array_equal(flat_draw(draw, key, shape, dtype, *args), draw(key, shape, dtype, *args))
    np.testing.assert_array_equal(flat_draw(jax.random.normal, key, 5, dtype), jax.random.normal(key, 5, dtype))
    np.testing.assert_array_equal(flat_draw(jax.random.normal, key, np.int64(5), dtype),
                                  jax.random.normal(key, (5,), dtype))
