"""Context points: in the padded data box, reproducible under a key, the documented counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posteriors import context

from ..linops._util import assert_close

X = jnp.asarray(np.array([[0.0, -1.0], [2.0, 3.0], [1.0, 0.0]]))  # box [0, 2] x [-1, 3]


def _inside(C, padding):
    lo, hi = np.array([0.0, -1.0]), np.array([2.0, 3.0])
    pad = padding * (hi - lo)
    C = np.asarray(C)
    return bool(np.all(C >= lo - pad - 1e-12) and np.all(C <= hi + pad + 1e-12))


@pytest.mark.parametrize("padding", [0.0, 0.5])
def test_uniform_and_low_discrepancy_fill_the_padded_box(padding):
    for kind in ("halton", "sobol"):
        C = context.low_discrepancy(jax.random.key(0), X, 64, kind=kind, padding=padding)
        assert C.shape == (64, 2) and _inside(C, padding)
        assert_close(C, context.low_discrepancy(jax.random.key(0), X, 64, kind=kind, padding=padding))
    U = context.uniform(jax.random.key(1), X, 2000, padding=padding)
    assert U.shape == (2000, 2) and _inside(U, padding)
    # Uniform: the sample mean is the box centre, within 4 standard errors per axis.
    width = np.array([2.0, 4.0]) * (1 + 2 * padding)
    assert np.all(np.abs(np.asarray(U.mean(0)) - np.array([1.0, 1.0])) < 4 * width / np.sqrt(12 * 2000))


def test_grid_and_from_data():
    G = context.grid(X, 3, padding=0.0)
    assert G.shape == (9, 2)
    assert_close(np.unique(np.asarray(G[:, 0])), [0.0, 1.0, 2.0])
    assert_close(np.unique(np.asarray(G[:, 1])), [-1.0, 1.0, 3.0])
    D = context.from_data(jax.random.key(2), X, 3)
    assert sorted(map(tuple, np.asarray(D).tolist())) == sorted(map(tuple, np.asarray(X).tolist()))


def test_uniform_draws_images_pixel_by_pixel_within_each_pixels_range():
    images = jnp.stack([jnp.zeros((2, 3)), jnp.arange(6.0).reshape(2, 3)])  # pixel j ranges over [0, j]
    C = context.uniform(jax.random.key(0), images, 500, padding=0.0)
    assert C.shape == (500, 2, 3)
    assert bool(jnp.all(C >= 0.0)) and bool(jnp.all(C <= images[1][None]))
    assert_close(C.max(axis=0), jnp.arange(6.0).reshape(2, 3), atol=0.05)  # it fills each range


def test_bad_input():
    with pytest.raises(ValueError, match="asked for 4 points from a data set of"):
        context.from_data(jax.random.key(0), X, 4)
    with pytest.raises(ValueError, match="kind must be 'halton' or 'sobol'"):
        context.low_discrepancy(jax.random.key(0), X, 4, kind="random")
    with pytest.raises(ValueError, match=r"context.uniform: data must be \(n, d\) or \(n, ...\) with n >= 1, "
                                         r"got shape \(3,\)"):
        context.uniform(jax.random.key(0), jnp.ones(3), 4)
    with pytest.raises(ValueError, match=r"context.grid: data must be 2-D \(n, d\)"):
        context.grid(jnp.ones((3, 1, 2)), 2)
    with pytest.raises(ValueError, match="positive integer"):
        context.grid(X, 0)
