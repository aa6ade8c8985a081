"""KFAC factors against a by-hand computation from per-example activations and output gradients."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox
from tests import _draws as draws

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
    X = draws.normal(jax.random.key(1), (13, 3), jnp.float64)
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
    X = draws.normal(jax.random.key(2), (20, 3), jnp.float64)
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


# --- layers shared over positions: convolutions (via patches) and dense layers over tokens -------------


def _explicit_patches(x, kernel_hw, stride, padding, dilation):
    """(R, C kh kw) patches of one (C, H, W) image by slicing, channel-major (independent of jax.lax)."""
    x = np.pad(np.asarray(x), ((0, 0), *padding))
    C, H, W = x.shape
    (kh, kw), (sh, sw), (dh, dw) = kernel_hw, stride, dilation
    rows = []
    for i in range(0, H - (kh - 1) * dh, sh):
        for j in range(0, W - (kw - 1) * dw, sw):
            rows.append(x[:, i:i + (kh - 1) * dh + 1:dh, j:j + (kw - 1) * dw + 1:dw].reshape(-1))
    return np.stack(rows)


def _conv_model(groups):
    conv = eqx.nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=((1, 1), (0, 2)), dilation=(1, 2), groups=groups,
                         key=jax.random.key(0), dtype=jnp.float64)
    head = eqx.nn.Linear(6 * 4 * 7, 3, key=jax.random.key(1), dtype=jnp.float64)
    return (lambda p, x: p[1](jnp.tanh(p[0](x)).reshape(-1))), (conv, head)


@pytest.mark.parametrize(("groups", "approximation"), [(1, "expand"),  # 3 s each
                                                       pytest.param(2, "reduce", marks=pytest.mark.slow),
                                                       pytest.param(2, "expand", marks=pytest.mark.slow),
                                                       pytest.param(1, "reduce", marks=pytest.mark.slow)])
def test_conv_factors_match_their_definition_from_explicit_patches(groups, approximation):
    fn, params = _conv_model(groups)
    conv, head = params
    X = draws.normal(jax.random.key(2), (5, 4, 7, 7), jnp.float64)
    y = jnp.arange(5) % 3
    K = lo.kfac(fn, params, X, y, Categorical(), approximation=approximation, batch_size=2)
    assert K.kinds == ("conv", "dense") and K.positions == (28, 1) and K.other_leaves == ()
    assert K.weight_leaves == (0, 2) and K.bias_leaves == (1, 3)
    Wm = conv.weight.reshape(groups, 6 // groups, -1)  # (G, out, in) per group, the kernel's row-major order
    A = np.zeros((groups, Wm.shape[2], Wm.shape[2]))
    B = np.zeros((groups, 6 // groups, 6 // groups))
    Bb = np.zeros((6, 6))
    for n in range(5):
        a = _explicit_patches(X[n], (3, 2), (2, 1), ((1, 1), (0, 2)), (1, 2)).reshape(28, groups, -1)  # (R, G, in)
        z = jnp.einsum("goi,rgi->rgo", Wm, a).reshape(28, 6)  # the conv's output by definition

        def out(z):
            h = jnp.tanh(z.T.reshape(6, 4, 7) + conv.bias)
            return head(h.reshape(-1))

        Hf = Categorical().hessian_factor(out(z), y[n])  # (K, O)
        g = jnp.einsum("ko,orc->krc", Hf, jax.jacfwd(out)(z))  # (K, R, 6): output gradients per position
        gg = g.reshape(-1, 28, groups, 6 // groups)
        Bb += np.einsum("kc,kd->cd", g.sum(1), g.sum(1))
        if approximation == "expand":
            A += np.einsum("rgi,rgj->gij", a, a) / (5 * 28)
            B += np.einsum("krgo,krgp->gop", gg, gg)
        else:
            am = a.mean(0)
            A += np.einsum("gi,gj->gij", am, am) / 5
            B += np.einsum("kgo,kgp->gop", gg.sum(1), gg.sum(1))
    first, second = K.factors[0]
    if groups == 1:
        A, B = A[0], B[0]
    assert_close(first, B, rtol=1e-10)  # OIHW: the output index first, G ~ B (x) A
    assert_close(second, A, rtol=1e-10)
    assert_close(K.bias_blocks[0], Bb, rtol=1e-10)
    G = lo.GGNOp(fn, params, X, y, Categorical()).as_matrix()
    P0 = conv.weight.size
    assert_close(K.bias_blocks[0], G[P0:P0 + 6, P0:P0 + 6], rtol=1e-10)  # the bias block is exact


def _token_model(pooled, weight_first=True):
    """A linear model applied per token: outputs per token (pooled=False) or averaged over tokens."""
    def fn(p, x):  # x: (T, in)
        s = jax.vmap(lambda t: p["W"] @ t + p["b"])(x) if weight_first else x @ p["W"] + p["b"][None]
        return s.mean(0) if pooled else s.reshape(-1)
    shape = (2, 3) if weight_first else (3, 2)
    return fn, {"W": draws.normal(jax.random.key(3), shape, jnp.float64), "b": jnp.ones(2, jnp.float64)}


@pytest.mark.parametrize("weight_first", [True, False])
def test_expand_is_exact_per_token_and_reduce_exact_when_pooled_for_a_linear_gaussian_model(weight_first):
    X = draws.normal(jax.random.key(4), (6, 5, 3), jnp.float64)
    for pooled, exact, other in ((False, "expand", "reduce"), (True, "reduce", "expand")):
        fn, p = _token_model(pooled, weight_first)
        Y = jnp.zeros((6, 2 if pooled else 10))
        G = lo.GGNOp(fn, p, X, Y, Gaussian(0.5)).as_matrix()
        K = lo.kfac(fn, p, X, Y, Gaussian(0.5), approximation=exact)
        assert K.positions == (5,) and K.bias_leaves == (1,) and K.weight_leaves == (0,)
        first, second = K.factors[0]
        assert_close(np.kron(first, second), G[:6, :6], rtol=1e-10)  # leaves in order W, b
        assert_close(K.bias_blocks[0], G[6:, 6:], rtol=1e-10)
        first, second = lo.kfac(fn, p, X, Y, Gaussian(0.5), approximation=other).factors[0]
        assert np.abs(np.kron(first, second) - G[:6, :6]).max() > 1e-3  # the other approximation is not exact


def test_a_one_by_one_convolution_on_one_pixel_images_is_the_dense_layers_kfac():
    W = draws.normal(jax.random.key(5), (3, 4), jnp.float64)
    X = draws.normal(jax.random.key(6), (7, 4), jnp.float64)
    y = jnp.arange(7) % 3
    conv = lambda p, x: jax.lax.conv_general_dilated(  # noqa: E731
        x.reshape(1, 4, 1, 1), p["W"].reshape(3, 4, 1, 1), (1, 1), "SAME").reshape(-1)
    dense = lambda p, x: jnp.tanh(p["W"] @ x)  # noqa: E731
    for approximation in ("expand", "reduce"):
        Kc = lo.kfac(lambda p, x: jnp.tanh(conv(p, x)), {"W": W}, X, y, Categorical(), approximation=approximation)
        Kd = lo.kfac(dense, {"W": W}, X, y, Categorical(), approximation=approximation)
        assert Kc.kinds == ("conv",) and Kd.kinds == ("dense",)
        for c, d in zip(Kc.factors[0], Kd.factors[0], strict=True):
            assert_close(c, d, rtol=1e-12)


def test_an_hwio_kernel_puts_the_output_factor_second_in_its_row_major_order():
    """Flax's layout: kernel (kh, kw, in, out), NHWC. Per-pixel outputs of a linear conv: expand is exact."""
    kernel = draws.normal(jax.random.key(7), (2, 3, 2, 4), jnp.float64)

    def fn(p, x):  # x: (H, W, C)
        z = jax.lax.conv_general_dilated(x[None], p["k"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return z.reshape(-1)

    X = draws.normal(jax.random.key(8), (4, 3, 3, 2), jnp.float64)
    Y = jnp.zeros((4, 36))
    K = lo.kfac(fn, {"k": kernel}, X, Y, Gaussian(0.7))
    first, second = K.factors[0]
    assert first.shape == (12, 12) and second.shape == (4, 4)
    G = lo.GGNOp(fn, {"k": kernel}, X, Y, Gaussian(0.7)).as_matrix()
    assert_close(np.kron(first, second), G, rtol=1e-10)


class _NormThenTokens(eqx.Module):
    norm: eqx.nn.LayerNorm
    lin: eqx.nn.Linear

    def __call__(self, x):  # x: (tokens, features)
        return jax.vmap(self.lin)(self.norm(x)).reshape(-1)


def test_parameters_of_no_recognised_layer_are_listed_not_dropped():
    fn, params = from_equinox(_NormThenTokens(eqx.nn.LayerNorm((5, 3), dtype=jnp.float64),
                                              eqx.nn.Linear(3, 2, key=jax.random.key(9), dtype=jnp.float64)))
    X = draws.normal(jax.random.key(10), (3, 5, 3), jnp.float64)
    K = lo.kfac(fn, params, X, jnp.zeros((3, 10)), Gaussian(1.0))
    leaves = jax.tree_util.tree_leaves(params)
    assert sorted(leaves[i].shape for i in K.other_leaves) == [(5, 3), (5, 3)]  # the norm's scale and shift
    assert K.positions == (5,) and K.kinds == ("dense",) and None not in K.bias_leaves


def test_factors_of_a_multi_output_linear_gaussian_layer_in_closed_form_in_either_weight_layout():
    """W x + b with W (3, 4) and one noise scale per output: the output factor is N diag(1/sigma_o^2)
    (3 x 3), the input factor X^T X / N (4 x 4), the bias block N diag(1/sigma_o^2). For W (out, in) the
    output factor comes first (G_W = B (x) A in row-major order); for x @ W with W (in, out) second. Three
    outputs, four inputs and unequal noise make a swap change the shapes and the values."""
    rng = np.random.default_rng(12)
    N = 25
    X = jnp.asarray(rng.standard_normal((N, 4)) @ rng.standard_normal((4, 4)))
    sigma = jnp.array([0.3, 0.5, 0.8])
    B = N * np.diag(1.0 / np.asarray(sigma) ** 2)
    A = np.asarray(X).T @ np.asarray(X) / N
    W = jnp.asarray(rng.standard_normal((3, 4)))
    Y = jnp.zeros((N, 3))
    for fn, p, expected in ((lambda p, x: p["W"] @ x + p["b"], {"W": W, "b": jnp.zeros(3)}, (B, A)),
                            (lambda p, x: x @ p["W"] + p["b"], {"W": W.T, "b": jnp.zeros(3)}, (A, B))):
        K = lo.kfac(fn, p, X, Y, Gaussian(sigma))
        assert K.weight_leaves == (0,) and K.bias_leaves == (1,)
        first, second = K.factors[0]
        assert first.shape == expected[0].shape and second.shape == expected[1].shape
        assert_close(first, expected[0], rtol=1e-12)
        assert_close(second, expected[1], rtol=1e-12)
        assert_close(K.bias_blocks[0], B, rtol=1e-12)
        G = np.asarray(lo.GGNOp(fn, p, X, Y, Gaussian(sigma)).as_matrix())
        assert_close(np.kron(first, second), G[:12, :12], rtol=1e-10)  # B constant over examples: exact
        assert_close(K.bias_blocks[0], G[12:, 12:], rtol=1e-10)


@pytest.mark.parametrize("batch_size", [None, 2])
def test_other_diagonal_is_the_exact_ggn_diagonal_of_the_leaves_in_no_layer(batch_size):
    """``other_diagonal=True``: the norm's scale and shift get the dense GGN's diagonal entries, from the KFAC
    pass itself (a categorical likelihood: K rows per example; a short last batch with ``batch_size=2``)."""
    fn, params = from_equinox(_NormThenTokens(eqx.nn.LayerNorm((5, 3), dtype=jnp.float64),
                                              eqx.nn.Linear(3, 2, key=jax.random.key(9), dtype=jnp.float64)))
    X = draws.normal(jax.random.key(10), (3, 5, 3), jnp.float64)
    params = eqx.tree_at(lambda m: (m.norm.weight, m.norm.bias), params,
                         (1.0 + 0.3 * X[0], 0.2 * X[1]))  # not the initial ones and zeros
    y = jnp.array([1, 4, 9])
    K = lo.kfac(fn, params, X, y, Categorical(), other_diagonal=True, batch_size=batch_size)
    dense = np.diag(np.asarray(lo.GGNOp(fn, params, X, y, Categorical()).as_matrix()))
    starts = np.concatenate([[0], np.cumsum(K.leaf_sizes)])
    assert len(K.other_diagonals) == len(K.other_leaves) == 2
    for i, d in zip(K.other_leaves, K.other_diagonals, strict=True):
        expected = dense[starts[i]:starts[i + 1]]
        assert d.shape == jax.tree_util.tree_leaves(params)[i].shape and np.ptp(expected) > 0
        assert_close(d.reshape(-1), expected, rtol=1e-10)
    assert lo.kfac(fn, params, X, y, Categorical()).other_diagonals == ()


def test_per_example_sums_come_from_the_factors_pass():
    """``per_example``: ``KFAC.sums`` is its sum over the examples (a short last batch), as a forward pass of its own
    computes it, and the factors are unchanged; without it, None."""
    model = eqx.nn.MLP(3, 4, 5, 2, activation=jnp.tanh, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(1), (13, 3), jnp.float64)
    y = jnp.arange(13) % 4
    K = lo.kfac(fn, params, X, y, Categorical(), batch_size=5,
                per_example=lambda f, t, _: (Categorical().nll(f, t), f))
    outputs = jax.vmap(fn, in_axes=(None, 0))(params, X)
    losses = jax.vmap(Categorical().nll)(outputs, y)
    assert np.ptp(np.asarray(losses)) > 0
    assert_close(K.sums[0], jnp.sum(losses), rtol=1e-12)
    assert_close(K.sums[1], jnp.sum(outputs, axis=0), rtol=1e-12)
    plain = lo.kfac(fn, params, X, y, Categorical(), batch_size=5)
    assert plain.sums is None
    with pytest.raises(TypeError, match=r"kfac: per_example must be a function .* got str"):
        lo.kfac(fn, params, X, y, Categorical(), per_example="loss")
    for (a, b), (c, d) in zip(K.factors, plain.factors, strict=True):
        assert_close(a, c, rtol=1e-12)
        assert_close(b, d, rtol=1e-12)
