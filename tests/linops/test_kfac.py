"""KFAC factors against a by-hand computation from per-example activations and output gradients."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox

from ._util import assert_close


def _manual_factors(params, X, y, likelihood):
    """(A_l, B_l) per layer of an Equinox tanh MLP, summed over examples, by explicit Jacobians."""
    layers = params.layers
    A, B = [0.0] * len(layers), [0.0] * len(layers)
    for n in range(X.shape[0]):
        h, acts, zs = X[n], [], []
        for i, layer in enumerate(layers):
            acts.append(h)
            z = layer.weight @ h + layer.bias
            zs.append(z)
            h = jnp.tanh(z) if i < len(layers) - 1 else z
        factor = likelihood.hessian_factor(h, y[n])
        for l in range(len(layers)):  # noqa: E741

            def head(z, l=l):  # noqa: E741 - the output as a function of layer l's pre-activation
                out = z
                for i in range(l, len(layers)):
                    if i > l:
                        out = layers[i].weight @ out + layers[i].bias
                    out = jnp.tanh(out) if i < len(layers) - 1 else out
                return out

            g = factor @ jax.jacfwd(head)(zs[l])
            B[l] = B[l] + g.T @ g
            A[l] = A[l] + jnp.outer(acts[l], acts[l])
    return A, B


def test_factors_of_an_mlp_match_the_per_example_computation_with_a_short_last_batch():
    model = eqx.nn.MLP(3, 4, 5, 2, activation=jnp.tanh, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(model)
    X = jax.random.normal(jax.random.key(1), (13, 3), jnp.float64)
    y = jnp.arange(13) % 4
    K = lo.kfac(fn, params, X, y, Categorical(), batch_size=5)  # batches 5 + 5 + 3
    assert K.weight_leaves == (0, 2, 4) and K.bias_leaves == (1, 3, 5) and K.other_leaves == ()
    A, B = _manual_factors(params, X, y, Categorical())
    for l in range(3):  # noqa: E741
        assert_close(K.factors[l][0], B[l], rtol=1e-12)  # W is (out, in): G_W ~ B (x) A
        assert_close(K.factors[l][1], A[l] / 13, rtol=1e-12)
        assert_close(K.bias_blocks[l], B[l], rtol=1e-12)  # exact
    # the exact bias block is the GGN's diagonal block for the bias
    G = lo.GGNOp(fn, params, X, y, Categorical()).as_matrix()
    assert_close(G[15:20, 15:20], B[0], rtol=1e-10)


def test_kfac_is_exact_for_a_linear_gaussian_model_in_either_weight_layout():
    X = jax.random.normal(jax.random.key(2), (20, 3), jnp.float64)
    Y = jnp.zeros((20, 2))
    for fn, W in ((lambda p, x: p["W"] @ x, jnp.zeros((2, 3))), (lambda p, x: x @ p["W"], jnp.zeros((3, 2)))):
        K = lo.kfac(fn, {"W": W}, X, Y, Gaussian(0.5))
        first, second = K.factors[0]
        G = lo.GGNOp(fn, {"W": W}, X, Y, Gaussian(0.5)).as_matrix()
        assert_close(np.kron(first, second), G, rtol=1e-10)  # B constant over examples: exact


def test_leaves_outside_dense_layers_are_reported_and_models_without_any_refused():
    def fn(p, x):
        return (p["W"] @ x + p["b"]) * p["scale"]

    p = {"W": jnp.ones((2, 3)), "b": jnp.zeros(2), "scale": jnp.ones(2)}
    X, Y = jnp.ones((4, 3)), jnp.zeros((4, 2))
    K = lo.kfac(fn, p, X, Y, Gaussian(1.0))
    leaves = jax.tree_util.tree_leaves(p)  # order: W, b, scale
    assert [leaves[i].shape for i in K.other_leaves] == [(2,)] and K.bias_leaves == (1,)
    with pytest.raises(ValueError, match="found no dense layer"):
        lo.kfac(lambda p, x: p["v"] * x, {"v": jnp.ones(3)}, X, jnp.zeros((4, 3)), Gaussian(1.0))
    with pytest.raises(ValueError, match="inputs has 4 examples but targets has 3"):
        lo.kfac(fn, p, X, Y[:3], Gaussian(1.0))
