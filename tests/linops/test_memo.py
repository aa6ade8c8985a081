"""`linops.runtime._memo.memo`: what the library traces from a model (its layers, its program) is traced once per
model function and argument shapes, kept while the function lives, and never keyed by values."""

import gc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops.models import from_equinox
from linops.nn.layers import trace_layers
from linops.runtime import _memo


def _counting():
    built = []
    return built, lambda: built.append(1) or len(built)


def test_built_once_per_function_and_shapes_never_per_value():
    fn = lambda p, x: p * x  # noqa: E731
    built, build = _counting()
    assert _memo.memo("k", fn, (jnp.ones(3), 1.0), build) == 1
    assert _memo.memo("k", fn, (jnp.zeros(3), 2.0), build) == 1            # new values: the same entry
    assert _memo.memo("k", fn, (jnp.ones(4), 1.0), build) == 2             # a new shape
    assert _memo.memo("k", fn, (jnp.ones(3, jnp.int32), 1.0), build) == 3  # a new dtype
    assert _memo.memo("k", fn, ({"a": jnp.ones(3)}, 1.0), build) == 4      # a new structure
    assert _memo.memo("other", fn, (jnp.ones(3), 1.0), build) == 5         # another kind of trace
    assert _memo.memo("k", lambda p, x: p * x, (jnp.ones(3), 1.0), build) == 6  # another function


class _OnlyHere(eqx.Module):
    """A model class of this test alone: no model of another test in the session compares equal to it."""

    mlp: eqx.nn.MLP

    def __call__(self, x):
        return self.mlp(x)


def _only_here(seed):
    return from_equinox(_OnlyHere(eqx.nn.MLP(3, 2, 4, 1, key=jax.random.key(seed))))


def test_an_equal_model_wrapped_again_shares_its_entries_and_a_dead_one_leaves_none():
    fn, params = _only_here(0)
    again, params2 = _only_here(1)
    assert fn == again and fn not in _memo._entries
    built, build = _counting()
    _memo.memo("k", fn, (params, jnp.ones(3)), build)
    _memo.memo("k", again, (params2, jnp.ones(3)), build)
    assert built == [1] and again in _memo._entries
    del fn, again
    gc.collect()
    third, _ = _only_here(2)
    assert third not in _memo._entries  # the entry died with the models it was made for


def test_an_unhashable_function_is_traced_every_time_and_entries_are_bounded():
    class Unhashable:
        __hash__ = None

        def __call__(self, p, x):
            return p * x

    built, build = _counting()
    fn = Unhashable()
    assert [_memo.memo("k", fn, (jnp.ones(3),), build) for _ in range(3)] == [1, 2, 3]
    g = lambda p: p  # noqa: E731
    for n in range(_memo.PER_MODEL + 1):
        _memo.memo("k", g, (jnp.ones(n + 1),), build)
    assert len(_memo._entries[g]) == _memo.PER_MODEL
    kept = [key[2][0][0] for key in _memo._entries[g]]
    assert (1,) not in kept and (_memo.PER_MODEL + 1,) in kept  # the oldest (shape (1,)) dropped


def test_trace_layers_returns_the_current_parameters_with_the_kept_trace():
    fn = lambda p, x: jnp.tanh(p["W"] @ x + p["b"])  # noqa: E731
    params = {"W": jnp.ones((4, 3)), "b": jnp.zeros(4)}
    params2 = {"W": 2 * jnp.ones((4, 3)), "b": jnp.ones(4)}
    layers, tapped, leaves = trace_layers(fn, params, jnp.ones(3))
    layers2, tapped2, leaves2 = trace_layers(fn, params2, jnp.ones(3))
    assert tapped2 is tapped and layers2 == layers
    for got, want in zip(leaves2, jax.tree_util.tree_leaves(params2), strict=True):
        np.testing.assert_array_equal(got, want)
