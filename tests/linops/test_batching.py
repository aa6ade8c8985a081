"""Streaming over examples (`linops.runtime.batched_map`, `batched_sum`): every example once, the loop body traced
once wherever the examples allow one batch shape."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linops.runtime import batched_map, batched_sum
from linops.testing import count_compilations
from tests import _draws as draws
from tests.linops._util import assert_close


def _per_example(x):
    """A nonlinear map of each row (of a batch), with a pytree output."""
    return {"a": jnp.tanh(x) * jnp.arange(1, x.shape[1] + 1)[None], "b": jnp.sum(x**2, axis=1)}


@pytest.mark.parametrize(("n", "batch"), [(5, 2), (7, 3), (6, 6), (6, 4), (1, 4), (10, 3), (256, 54)])
def test_batched_map_maps_every_example_once_with_one_batch_shape(n, batch):
    """The last batch overlaps the one before it (its repeated rows dropped): the result is the plain map,
    row for row, and the body is traced once, for one batch shape."""
    X = draws.normal(jax.random.key(n), (n, 3))
    shapes = []

    def body(x):
        shapes.append(x.shape)
        return _per_example(x)

    out = batched_map(body, X, batch)
    ref = _per_example(X)
    assert_close(out["a"], ref["a"], rtol=1e-12)
    assert_close(out["b"], ref["b"], rtol=1e-12)
    assert len(set(shapes)) == 1 and shapes[0][0] <= batch, shapes


def test_batched_map_rows_are_not_shuffled_by_the_overlap():
    """An identity map over 10 rows in batches of 4 (4, 4 and the last 4 starting at row 6) returns rows 0-9."""
    X = jnp.arange(10.0)[:, None]
    assert_close(batched_map(lambda b: b, X, 4), X, rtol=0)


@pytest.mark.parametrize(("n", "batch", "one_shape"), [(1000, 128, True), (100, 16, True), (12, 5, True),
                                                       (1009, 128, False), (5, 3, False)])
def test_batched_sum_takes_a_batch_size_that_divides_the_examples_where_one_does(n, batch, one_shape):
    """N = 1,000 in batches of 128 runs as 8 batches of 125: one shape, the body traced once; where no size of at
    least half the asked one divides N (1,009 is prime), the short last batch is summed on its own. The sum is the
    same either way."""
    X = draws.normal(jax.random.key(1), (n, 3))
    shapes = []

    def body(x):
        shapes.append(x.shape)
        return jnp.sum(jnp.tanh(x), axis=0)

    total = batched_sum(body, X, batch)
    assert_close(total, jnp.sum(jnp.tanh(X), axis=0), rtol=1e-10)
    assert all(batch // 2 <= s[0] <= batch for s in shapes[:1]), shapes
    assert (len(set(shapes)) == 1) == one_shape, shapes
    assert np.sum([s[0] for s in shapes[-1:]]) <= batch


@pytest.mark.parametrize("loop", ["sum", "map"])
def test_an_eager_loop_with_a_short_last_batch_compiles_one_program(loop):
    """Called outside a trace, the slices, the scan, the last batch's body and the additions run as one program
    (the last batch's body used to run operation by operation, each compiled on its own: 21 programs here for the
    sum, 12 for the map), with the values of the loop traced inside a program."""
    X = jnp.asarray(np.random.default_rng(0).standard_normal((11, 3)))  # batches of 4: 4, 4 and 3 (or 3 overlapping)
    total = lambda b: jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), _per_example(b))  # noqa: E731
    run = (lambda d: batched_sum(total, d, 4)) if loop == "sum" else (lambda d: batched_map(_per_example, d, 4))
    expected = jax.jit(run)(X)
    with count_compilations() as compiled:
        out = run(X)
    assert len(compiled) == 1, compiled
    for key in ("a", "b"):
        assert_close(out[key], expected[key], rtol=1e-12)
        assert_close(out[key], total(X)[key] if loop == "sum" else _per_example(X)[key], rtol=1e-12)
