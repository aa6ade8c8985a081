"""Kernels of several axes (einsum, Flax's ``LinearGeneral``, the per-head projections of attention) are dense
layers with Kronecker factors, checked against the dense GGN: KFAC exact for a linear Gaussian model in both
kernel layouts, the per-layer GGN diagonal and the per-layer predictives on Flax NNX's and Equinox's
multi-head attention, and no leaf of either left to the diagonal fallback."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.nnx.nn.attention import dot_product_attention_weights

import linops as lo
import posteriors as pst
from linops.likelihoods import Gaussian
from linops.models import from_equinox, from_flax_nnx
from posteriors.predictive import _row_values
from tests import _draws as draws

from ._util import assert_close


@pytest.mark.parametrize("layout", ["in-first", "out-first"])
def test_kfac_of_a_kernel_of_three_axes_is_exact_for_a_linear_gaussian_model(layout):
    """``(in, heads, dim)`` contracted over its first axis, or ``(heads, dim, in)`` over its last, with a bias of
    shape ``(heads, dim)``: the Jacobian is ``I (x) [x; 1]``, so KFAC's factors reproduce the GGN exactly."""
    X = draws.normal(jax.random.key(0), (20, 3), jnp.float64)
    Y = jnp.zeros((20, 8))
    if layout == "in-first":
        params = {"W": jnp.zeros((3, 2, 4)), "b": jnp.zeros((2, 4))}
        fn = lambda p, x: (jnp.einsum("i,ihd->hd", x, p["W"]) + p["b"]).reshape(-1)  # noqa: E731
    else:
        params = {"W": jnp.zeros((2, 4, 3)), "b": jnp.zeros((2, 4))}
        fn = lambda p, x: (jnp.einsum("hdi,i->hd", p["W"], x) + p["b"]).reshape(-1)  # noqa: E731
    K = lo.kfac(fn, params, X, Y, Gaussian(0.5))
    assert K.other_leaves == () and K.bias_leaves == (1,)
    first, second = K.factors[0]
    G = np.asarray(lo.GGNOp(fn, params, X, Y, Gaussian(0.5)).as_matrix())
    w, b = slice(0, 24), slice(24, 32)  # leaves in key order: W (24 numbers), then b (8)
    assert_close(np.kron(first, second), G[w, w], rtol=1e-10)
    assert_close(K.bias_blocks[0], G[b, b], rtol=1e-10)


def _flax_attention_in_float64(query, key, value, **_):
    """flax's own attention weights, combined with the values as flax combines them. Its default attention
    function hands the work to `jax.nn.dot_product_attention`, which takes the softmax in float32 whatever the
    inputs' dtype. Then the model's outputs carry float32 rounding, and two exact ways of computing the same
    variances differ by about 1e-8 wherever XLA fuses them differently, so they could not be compared at 1e-10."""
    weights = dot_product_attention_weights(query, key)
    return jnp.einsum("...hqk,...khd->...qhd", weights, value)


class _FlaxAttention(nnx.Module):
    def __init__(self, rngs):
        self.mha = nnx.MultiHeadAttention(num_heads=2, in_features=4, qkv_features=6, out_features=3, decode=False,
                                          dtype=jnp.float64, param_dtype=jnp.float64,
                                          attention_fn=_flax_attention_in_float64, rngs=rngs)

    def __call__(self, x):
        return jnp.tanh(self.mha(x)).mean(0)


class _EquinoxAttention(eqx.Module):
    mha: eqx.nn.MultiheadAttention

    def __init__(self, key):
        self.mha = eqx.nn.MultiheadAttention(2, 4, output_size=3, use_query_bias=True, use_key_bias=True,
                                             use_value_bias=True, use_output_bias=True, key=key)

    def __call__(self, x):
        return jnp.tanh(self.mha(x, x, x)).mean(0)


def _model(framework):
    if framework == "flax":
        return from_flax_nnx(_FlaxAttention(nnx.Rngs(0)))
    fn, params = from_equinox(_EquinoxAttention(jax.random.key(0)))
    return fn, jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), params)


@pytest.mark.parametrize("framework", [pytest.param("flax", marks=pytest.mark.slow), "equinox"])  # flax: 6 s
def test_multi_head_attention_gets_kronecker_factors_and_exact_per_layer_rules(framework):
    fn, params = _model(framework)
    X = draws.normal(jax.random.key(1), (6, 5, 4), jnp.float64)  # 6 sequences of 5 tokens
    Y = draws.normal(jax.random.key(2), (6, 3), jnp.float64)
    lik = Gaussian(0.7)
    layers = lo.nn.find_layers(fn, params, X[0])
    leaves = jax.tree_util.tree_leaves(params)
    assert len(layers) == 4 and all(L.bias is not None and L.positions == 5 for L in layers)
    assert {i for L in layers for i in (L.weight, L.bias)} == set(range(len(leaves)))  # every leaf in a layer
    G = lo.GGNOp(fn, params, X, Y, lik, batch_size=4)
    dense = np.diag(np.asarray(G.as_matrix()))
    assert dense.min() > 0 and np.ptp(dense) > 0
    assert_close(lo.diag(G), dense, rtol=1e-10)  # the per-layer rules
    T = X[:3] * 1.1
    for structure in ("kfac", "diag"):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*in no layer KFAC recognises")  # every kernel is a layer
            post = pst.laplace(fn, params, (X, Y), lik, structure=structure, prior_precision=0.7)
        if structure == "kfac":
            assert post.ggn.diagonal_leaves == ()
        _, var = pst.predictive.linearized(post, T)
        ref = _row_values(post, T, 3, 3, False)
        assert np.ptp(np.asarray(ref)) > 0
        assert_close(var, ref, rtol=1e-10)


def test_a_kernel_kfac_cannot_factor_is_named_in_a_warning():
    """A weight used twice (tied) is no layer: `lo.kfac` warns, naming it and its shape, and gives it its exact
    GGN diagonal (the other weight is a layer); a norm scale (no product) is not named."""
    def fn(p, x):
        h = jnp.tanh(p["W"].T @ jnp.tanh(p["W"] @ x)) * p["scale"]
        return p["V"] @ h

    k = jax.random.split(jax.random.key(3), 2)
    params = {"V": draws.normal(k[0], (2, 3)), "W": draws.normal(k[1], (4, 3)), "scale": jnp.ones(3)}
    X, Y = draws.normal(jax.random.key(4), (5, 3)), jnp.zeros((5, 2))
    with pytest.warns(UserWarning, match=r"kfac: 1 kernel\(s\) .* get their exact GGN diagonal .*\['W'\] \(4, 3\)\."):
        K = lo.kfac(fn, params, X, Y, Gaussian(1.0), other_diagonal=True)
    assert K.weight_leaves == (0,) and K.other_leaves == (1, 2)
