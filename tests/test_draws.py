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


def test_the_sessions_routed_draws_equal_jax_randoms_bit_for_bit(dtype=jnp.float32):
    """conftest routes `jax.random`'s draws from outside the library through `tests._draws` (`install`): the
    models' initialisers must draw the values they always drew, truncated normals included."""
    key = jax.random.key(11)
    for name in ("normal", "uniform", "truncated_normal"):
        assert getattr(jax.random, name).__wrapped__ is draws._JAX[name]  # installed
    for shape in [(), (7, 5)]:  # (more shapes: test_draws_equal_jax_random_bit_for_bit; each compiles jax's own)
        pairs = [(jax.random.normal(key, shape, dtype), draws._JAX["normal"](key, shape, dtype)),
                 (jax.random.uniform(key, shape, dtype, minval=-0.5, maxval=0.25),
                  draws._JAX["uniform"](key, shape, dtype, -0.5, 0.25)),
                 (jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype),
                  draws._JAX["truncated_normal"](key, -2.0, 2.0, shape, dtype))]
        for ours, theirs in pairs:
            assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
            np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    # bounds of their own shape, and no shape: jax.random's own path
    bounds = jnp.array([-1.0, 0.0, 1.0])
    np.testing.assert_array_equal(jax.random.uniform(key, (3,), minval=bounds, maxval=bounds + 1),
                                  draws._JAX["uniform"](key, (3,), minval=bounds, maxval=bounds + 1))
    np.testing.assert_array_equal(jax.random.truncated_normal(key, bounds, bounds + 1),
                                  draws._JAX["truncated_normal"](key, bounds, bounds + 1))


def test_an_initialiser_draws_through_the_sessions_routed_draws():
    """equinox's initialisers call `jax.random.uniform` shaped; in the session they compile one flat program per
    length class, so a second layer of another shape in the same class compiles no draw."""
    import equinox as eqx

    compiled = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration" and "uniform" in kwargs.get("fun_name", ""):
            compiled.append(kwargs["fun_name"])

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        eqx.nn.Linear(13, 11, key=jax.random.key(0))  # 143 weights: the class of 256, compiled (or already)
        compiled.clear()
        layer = eqx.nn.Linear(17, 9, key=jax.random.key(1))  # 153 weights, 9 biases: classes 256 and 64
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiled == []
    wkey, bkey = jax.random.split(jax.random.key(1))
    lim = 1 / np.sqrt(17)
    np.testing.assert_array_equal(layer.weight, draws._JAX["uniform"](wkey, (9, 17), minval=-lim, maxval=lim))
