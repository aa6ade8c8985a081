"""The GGN diagonal by per-layer rules (`linops.nn._layer_diag`) against the dense GGN's diagonal.

Each model mixes what the rules must get right: convolutions with strides, dilation, padding and
feature groups; an HWIO kernel (output index last); a dense layer shared over tokens; a transposed
weight; biases through reshapes; leaves in no layer (a norm scale, a weight used twice) that take
their own reverse pass; a per-example likelihood; and rows of the Hessian factor in blocks.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox
from linops.nn import _layer_diag
from tests import _draws as draws

from ._util import assert_close


def _f64(tree):
    return jax.tree_util.tree_map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, tree)


class _CNN(eqx.Module):
    c1: eqx.nn.Conv2d
    c2: eqx.nn.Conv2d
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, groups, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.c1 = eqx.nn.Conv2d(2, 4, (3, 2), padding=((1, 1), (0, 2)), dilation=(1, 2), key=k1)
        self.c2 = eqx.nn.Conv2d(4, 4, 3, stride=2, groups=groups, key=k2)
        self.norm = eqx.nn.LayerNorm(4 * 3 * 2)
        self.head = eqx.nn.Linear(4 * 3 * 2, 3, key=k3)

    def __call__(self, x):
        h = jax.nn.relu(self.c1(x))
        h = eqx.nn.MaxPool2d(2, 1)(h)
        h = jnp.tanh(self.c2(h))
        return self.head(self.norm(h.reshape(-1)))


class _PooledCNN(eqx.Module):
    """Non-overlapping max-pools (rewritten as `first_max_pool`) on maps with a dropped remainder, after a
    convolution of images with constant regions (windows with tied non-zero maxima; which tied position takes
    the derivative is checked directly by `test_first_max_pool_is_xla_max_pool_with_its_derivative`)."""

    c1: eqx.nn.Conv2d
    c2: eqx.nn.Conv2d
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.c1 = eqx.nn.Conv2d(1, 3, 3, padding=1, key=k1)
        self.c2 = eqx.nn.Conv2d(3, 4, 2, key=k2)
        self.head = eqx.nn.Linear(4 * 1 * 1, 3, key=k3)

    def __call__(self, x):
        h = eqx.nn.MaxPool2d(2, 2)(jax.nn.relu(self.c1(x) + 1.0))  # (3, 4, 3): row 9 and column 7 dropped
        h = eqx.nn.MaxPool2d((2, 2), (2, 2))(jnp.tanh(self.c2(h)))  # (4, 1, 1)
        return self.head(h.reshape(-1))


def _hwio_tokens(p, x):
    """An HWIO convolution, a dense layer shared over the 25 pixels as tokens (weight transposed), a pooled
    head, and a matrix used twice (in no layer)."""
    h = jax.lax.conv_general_dilated(x[None], p["k"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))[0]
    h = jnp.tanh(h + p["b"].reshape(1, 1, 3))  # (5, 5, 3)
    t = jnp.tanh(h.reshape(-1, 3) @ p["W"].T).mean(0)  # (4,)
    t = jnp.tanh(p["S"] @ jnp.tanh(p["S"] @ t))
    return p["V"] @ t + p["c"]


def _hwio_params(key):
    k = jax.random.split(key, 4)
    return {"k": draws.normal(k[0], (3, 3, 2, 3), jnp.float64), "b": jnp.full(3, 0.1, jnp.float64),
            "W": draws.normal(k[1], (4, 3), jnp.float64), "S": draws.normal(k[2], (4, 4), jnp.float64) / 2,
            "V": draws.normal(k[3], (2, 4), jnp.float64), "c": jnp.zeros(2, jnp.float64)}


def _cases():
    key = jax.random.key(0)
    for groups in (1, 2):
        fn, params = from_equinox(_f64(_CNN(groups, jax.random.key(groups))))
        X = draws.normal(key, (7, 2, 8, 6), jnp.float64)
        yield f"cnn-groups{groups}", fn, params, X, jnp.arange(7) % 3, Categorical()
    fn, params = from_equinox(_f64(_PooledCNN(jax.random.key(3))))
    X = draws.normal(key, (7, 1, 9, 7), jnp.float64).at[:, :, :5, :4].set(0.0)
    yield "cnn-pool-ties", fn, params, X, jnp.arange(7) % 3, Categorical()
    X = draws.normal(key, (6, 5, 5, 2), jnp.float64)
    Y = draws.normal(jax.random.key(1), (6, 2), jnp.float64)
    yield "hwio-tokens", _hwio_tokens, _hwio_params(key), X, Y, Gaussian(0.5)
    sigma = jnp.linspace(0.5, 1.5, 6 * 2).reshape(6, 2)
    yield "hwio-tokens-heteroscedastic", _hwio_tokens, _hwio_params(key), X, Y, Gaussian(sigma, heteroscedastic=True)


CASES = {name: case for name, *case in _cases()}


@functools.cache
def _dense_diagonal(name):
    fn, params, X, Y, lik = CASES[name]
    return np.diag(np.asarray(lo.GGNOp(fn, params, X, Y, lik).as_matrix()))


@pytest.mark.parametrize("budget", [None, pytest.param(1, marks=pytest.mark.slow),  # the blocked paths: slow tier
                                    pytest.param(150, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_rules_give_the_dense_ggn_diagonal(name, budget, monkeypatch):
    """Budget 1: one row of the Hessian factor per block and one example per batch; 150: blocks of a few rows
    (a padded last block); None: all rows at once. Each equals diag of the dense GGN, eager and under jit."""
    fn, params, X, Y, lik = CASES[name]
    if budget is not None:
        monkeypatch.setattr(_layer_diag, "_BUDGET", budget)
    G = lo.GGNOp(fn, params, X, Y, lik, batch_size=4)  # a short last batch
    plan = _layer_diag.layer_plan(fn, params, X[0])
    assert plan is not None and (plan[3] or name == "cnn-pool-ties"), "a leaf in no layer (its own reverse pass)"
    dense = _dense_diagonal(name)
    assert dense.min() > 0 and np.ptp(dense) > 0
    assert_close(lo.diag(G), dense, rtol=1e-10)
    assert_close(jax.jit(lo.diag)(G), dense, rtol=1e-10)
    assert_close(G._diag_by_gradients(), dense, rtol=1e-10)


def test_the_layers_found_are_those_the_rules_use():
    fn, params, X, *_ = CASES["hwio-tokens"]
    layers = lo.nn.find_layers(fn, params, X[0])
    names = sorted(params)  # a dict's leaves are in key order
    assert [(L.kind, names[L.weight], None if L.bias is None else names[L.bias], L.positions) for L in layers] == [
        ("conv", "k", "b", 25), ("dense", "W", None, 25), ("dense", "V", "c", 1)]
    assert [names[i] for i in _layer_diag.layer_plan(fn, params, X[0])[3]] == ["S"]


def test_a_model_without_a_layer_takes_the_general_path():
    fn = lambda p, x: jnp.tanh(p["a"] * x + p["b"])  # noqa: E731 - elementwise parameters only
    params = {"a": jnp.linspace(0.5, 1.5, 3, dtype=jnp.float64), "b": jnp.ones(3, jnp.float64)}
    X = draws.normal(jax.random.key(0), (5, 3), jnp.float64)
    G = lo.GGNOp(fn, params, X, X, Gaussian(1.0))
    assert _layer_diag.layer_plan(fn, params, X[0]) is None
    assert_close(lo.diag(G), np.diag(np.asarray(G.as_matrix())), rtol=1e-12)


def test_first_max_pool_is_xla_max_pool_with_its_derivative():
    """`first_max_pool` (the rewrite of non-overlapping max-pools in the tapped program) against
    ``reduce_window`` max: values, reverse and forward derivatives, with tied maxima (the derivative goes to
    the first in row-major order), a -inf, and a remainder that pooling drops."""
    from linops.nn.layers import first_max_pool

    x = draws.normal(jax.random.key(0), (3, 7, 9), jnp.float64)
    x = x.at[0, :4, :4].set(2.0).at[1, 1, 1].set(-jnp.inf).at[2, 2:4, 2:4].set(jnp.array([[1.0, 3.0], [3.0, 3.0]]))
    reference = lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 3), (1, 2, 3), "VALID")  # noqa: E731
    ours = lambda x: first_max_pool(x, (1, 2, 3))  # noqa: E731
    y, vjp = jax.vjp(reference, x)
    assert y.shape == (3, 3, 3)
    assert_close(ours(x), y, rtol=0)
    g = draws.normal(jax.random.key(1), y.shape, jnp.float64)
    expected = vjp(g)[0]
    assert_close(jax.vjp(ours, x)[1](g)[0], expected, rtol=0)
    assert int(jnp.sum(expected[0, :4, :6] != 0)) == 4, "one position per tied window receives the derivative"
    t = draws.normal(jax.random.key(2), x.shape, jnp.float64)
    assert_close(jax.jvp(ours, (x,), (t,))[1], jax.jvp(reference, (x,), (t,))[1], rtol=0)


def test_non_overlapping_max_pools_are_rewritten_and_overlapping_ones_are_not():
    from linops.nn.layers import trace_layers

    for model, x, expected in ((_PooledCNN(jax.random.key(0)), jnp.ones((1, 9, 7)), 0),
                               (_CNN(1, jax.random.key(0)), jnp.ones((2, 8, 6)), 1)):
        fn, params = from_equinox(model)
        tapped = trace_layers(fn, params, x)[1]
        leaves = jax.tree_util.tree_leaves(params)
        deltas = [jnp.zeros(L.out_aval.shape) for L in trace_layers(fn, params, x)[0]]
        text = str(jax.make_jaxpr(tapped)(*leaves, x, *deltas))
        assert text.count("reduce_window_max") == expected
        assert_close(tapped(*leaves, x, *deltas)[0], fn(params, x), rtol=1e-6)


@pytest.mark.parametrize("spec, shape, filter_shape, strides, padding, lhs_dilation, rhs_dilation", [
    (("NCHW", "OIHW", "NCHW"), (1, 3, 9, 8), (3, 2), (1, 1), ((1, 1), (0, 2)), (1, 1), (1, 1)),
    (("NHWC", "HWIO", "NHWC"), (2, 9, 8, 3), (3, 3), (2, 1), ((0, 0), (2, 1)), (1, 1), (2, 1)),
    (("NCH", "OIH", "NCH"), (2, 4, 11), (4,), (3,), ((2, -1),), (2,), (1,)),  # a transposed convolution
    (("NHWC", "OIHW", "NCHW"), (1, 5, 6, 2), (2, 3), (1, 2), ((1, 1), (1, 0)), (2, 1), (1, 2)),
])
def test_conv_patches_are_jax_patches(spec, shape, filter_shape, strides, padding, lhs_dilation, rhs_dilation):
    """`conv_patches` (strided slices) against `jax.lax.conv_general_dilated_patches` (an identity-kernel
    convolution): the same values in the same feature order, for every layout, stride, padding (negative
    too), input and kernel dilation; and its reverse derivative."""
    from linops.nn.layers import conv_patches

    x = draws.normal(jax.random.key(0), shape, jnp.float64)
    rhs_shape = tuple(1 if c in "OI" else filter_shape["HW".index(c)] for c in spec[1])
    dn = jax.lax.conv_dimension_numbers(shape, rhs_shape, spec)

    def reference(x):
        return jax.lax.conv_general_dilated_patches(x, filter_shape, strides, padding, lhs_dilation=lhs_dilation,
                                                    rhs_dilation=rhs_dilation, dimension_numbers=spec)

    def ours(x):
        return conv_patches(x, filter_shape, strides, padding, lhs_dilation, rhs_dilation, dn)

    expected, vjp = jax.vjp(reference, x)
    assert_close(ours(x), expected, rtol=0)
    g = draws.normal(jax.random.key(1), expected.shape, jnp.float64)
    assert_close(jax.vjp(ours, x)[1](g)[0], vjp(g)[0], rtol=1e-12)


@pytest.mark.parametrize("name", ["cnn-groups2", "hwio-tokens-heteroscedastic"])
def test_the_diagonal_pass_sums_a_per_example_function_of_the_outputs(name):
    """``GGNOp._diag_and_sums(per_example)`` (the evidence's data terms in `posteriors.laplace`): the same diagonal,
    and the sum over the examples of the outputs' loss and squared outputs, equal to a forward pass of their own (a
    short last batch; a per-example likelihood hands each example its own)."""
    fn, params, X, Y, lik = CASES[name]
    G = lo.GGNOp(fn, params, X, Y, lik, batch_size=4)

    def terms(f, y, lik_n):
        return (lik if lik_n is None else lik_n).nll(f, y), f**2

    d, (loss, squares) = G._diag_and_sums(terms)
    outputs = jax.vmap(fn, in_axes=(None, 0))(params, X)
    axis = 0 if lik.per_example else None
    losses = jax.vmap(lambda lk, f, y: lk.nll(f, y), in_axes=(axis, 0, 0))(lik, outputs, Y)
    assert np.ptp(np.asarray(losses)) > 0
    assert_close(loss, jnp.sum(losses), rtol=1e-12)
    assert_close(squares, jnp.sum(outputs**2, axis=0), rtol=1e-12)
    assert_close(d, _dense_diagonal(name), rtol=1e-10)
