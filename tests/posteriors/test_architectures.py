"""The experiments' architectures: the model contract, sizes, purity, batching, gradients, inference-mode BatchNorm."""

import doctest
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posteriors.experiments import architectures
from posteriors.experiments.architectures import ARCHITECTURES, count_params, lenet5, nnx_cnn, resnet, vit
from tests import _draws as draws

# (name, keyword arguments, image side of the small version)
CASES = [
    ("lenet5", (), 12),
    ("resnet", (("norm", "group"),), 8),
    ("resnet", (("norm", "layer"),), 8),
    ("resnet", (("norm", "batch"),), 8),
    ("vit", (), 8),
    ("vit", (("pool", "mean"),), 8),
    ("nnx_cnn", (), 8),
]
IDS = ["-".join([name, *(v for _, v in kw)]) for name, kw, _ in CASES]


@functools.cache
def _small(name, kw, dtype=None):
    """The small model, built once per test process."""
    return ARCHITECTURES[name](jax.random.key(0), size="small", dtype=dtype, **dict(kw))


def _images(side, n=3, seed=1):
    return draws.normal(jax.random.key(seed), (n, 1, side, side))


# The mean-pooled ViT differs from the class-token one in its last line only: its shapes and sizes are checked below.
@pytest.mark.parametrize(("name", "kw", "side"), [c for c in CASES if c[1] != (("pool", "mean"),)],
                         ids=[i for i in IDS if i != "vit-mean"])
def test_small_model_keeps_the_contract(name, kw, side):
    fn, params = _small(name, kw)
    assert 500 <= count_params(params) <= 5000
    leaves = jax.tree_util.tree_leaves(params)
    assert all(eqx.is_inexact_array(leaf) for leaf in leaves)
    X = _images(side)

    def loss(p):
        return jnp.sum(jax.vmap(fn, in_axes=(None, 0))(p, X) ** 2)

    # One compilation for everything (eager Equinox compiles every primitive on its own, which is slower).
    @jax.jit
    def run(p):
        return fn(p, X[0]), jax.vmap(fn, in_axes=(None, 0))(p, X), jax.grad(loss)(p)

    out, batched, grads = run(params)
    assert out.shape == (10,)
    assert bool(jnp.all(jnp.isfinite(out)))
    np.testing.assert_array_equal(run(params)[0], out)  # deterministic: no hidden randomness or state
    assert batched.shape == (3, 10)
    np.testing.assert_allclose(batched[0], out, rtol=1e-10, atol=1e-10)
    assert not np.allclose(batched[0], batched[1]), "the output should depend on the input"
    grads = jax.tree_util.tree_leaves(grads)
    assert len(grads) == len(leaves)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    assert sum(float(jnp.sum(g**2)) for g in grads) > 0


@pytest.mark.parametrize(("name", "kw", "side"), CASES, ids=IDS)
def test_real_model_has_between_1e5_and_1e6_parameters(name, kw, side):
    builder = ARCHITECTURES[name]
    shapes = jax.eval_shape(lambda k: builder(k, size="real", **dict(kw))[1], jax.random.key(0))
    assert 1e5 <= count_params(shapes) <= 1e6


@pytest.mark.parametrize(("name", "kw", "side"), CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_dtype_casts_every_parameter(name, kw, side, dtype):
    fn, params = _small(name, kw, dtype)
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(params)} == {jnp.dtype(dtype)}
    assert jax.eval_shape(fn, params, _images(side)[0].astype(dtype)).dtype == dtype


def _output_shape(builder, x, **kw):
    """The output shape of ``builder``'s model on ``x``, built and run abstractly (nothing compiles)."""

    def build_and_run(key, x):
        fn, params = builder(key, **kw)
        return fn(params, x)

    return jax.eval_shape(build_and_run, jax.random.key(0), x).shape


def test_classic_lenet5_and_custom_shapes():
    threefry = jax.random.key(0, impl="threefry2x32")  # the default outside this module
    assert count_params(jax.eval_shape(lambda k: lenet5(k, width=1.0)[1], threefry)) == 61706
    assert _output_shape(lenet5, jnp.ones((3, 16, 16)), size="small", in_channels=3, image_size=16,
                         num_classes=4) == (4,)
    assert _output_shape(resnet, jnp.ones((3, 10, 10)), size="small", in_channels=3, image_size=10,
                         num_classes=4, widths=(4, 6, 8), norm="layer") == (4,)
    assert _output_shape(vit, jnp.ones((3, 12, 12)), size="small", in_channels=3, image_size=12, patch_size=3,
                         num_classes=5) == (5,)
    assert _output_shape(vit, jnp.ones((1, 8, 8)), size="small", pool="mean") == (10,)
    assert _output_shape(nnx_cnn, jnp.ones((2, 12, 12)), size="small", in_channels=2, image_size=12,
                         num_classes=3) == (3,)


def test_batchnorm_normalises_by_the_closed_over_running_statistics():
    key, x = jax.random.key(0), _images(8)[0]
    model, state = architectures._build_resnet(key, size="small", in_channels=1, image_size=None, num_classes=10,
                                               widths=None, norm="batch", dtype=None)
    fn, params = _small("resnet", (("norm", "batch"),))
    np.testing.assert_allclose(jax.jit(fn)(params, x), eqx.filter_jit(model)(x, state), rtol=1e-12)
    # The statistics are constants, not params: the params are those of the same net with group norm.
    assert count_params(params) == count_params(_small("resnet", (("norm", "group"),))[1])

    # The stem's BatchNorm, by hand, with the (non-trivial) running statistics.
    bn = model.stem_norm
    mean, var = state.get(bn.batch_state_index)
    assert float(jnp.min(jnp.abs(mean))) > 0 and float(jnp.max(jnp.abs(var - 1))) > 0.05
    assert float(jnp.min(var)) >= 0.5
    h = model.stem(x)
    expected = (h - mean[:, None, None]) / jnp.sqrt(var[:, None, None] + bn.eps)
    expected = expected * bn.weight[:, None, None] + bn.bias[:, None, None]
    np.testing.assert_allclose(bn(h, state)[0], expected, rtol=1e-10, atol=1e-12)

    # Other statistics (equinox's initial zero means and unit variances) give a different function.
    _, default_state = eqx.nn.make_with_state(architectures._ResNet)(1, 8, 10, (4, 8), "batch", jax.random.key(1))
    assert not np.allclose(eqx.filter_jit(model)(x, default_state), fn(params, x))


def test_builders_reject_bad_arguments():
    with pytest.raises(ValueError, match="size must be one of"):
        lenet5(jax.random.key(0), size="tiny")
    with pytest.raises(ValueError, match="norm must be one of"):
        resnet(jax.random.key(0), size="small", norm="instance")
    with pytest.raises(ValueError, match="not a multiple of patch_size"):
        vit(jax.random.key(0), size="small", patch_size=3)
    with pytest.raises(ValueError, match="at least 12"):
        lenet5(jax.random.key(0), size="small", image_size=8)


def test_count_params_counts_scalars():
    assert count_params({"a": jnp.ones((2, 3)), "b": [jnp.zeros(4), jax.ShapeDtypeStruct((5,), jnp.float32)]}) == 15


def test_docstring_examples_run():
    result = doctest.testmod(architectures, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
