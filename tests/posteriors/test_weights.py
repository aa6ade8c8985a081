"""`posteriors.laplace`'s two axes: every selection of weights with every curvature structure, against the dense GGN
of the model restricted to the selection (a Gaussian likelihood with two outputs, float64).

For a selection $s$ the posterior is $E_s(G_{ss}/1 + \\alpha)^{-1}E_s^\\top$, $G_{ss}$ the block of the full GGN: its
diagonal structure keeps $\\operatorname{diag} G_{ss}$, its low-rank one at full rank $G_{ss}$ itself, and its KFAC
one, on a last layer (linear in its weights, Gaussian noise), the weight block of $G_{ss}$ exactly.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posteriors as pst
from linops.likelihoods import Gaussian
from linops.models import from_equinox, ravel
from tests import _draws as draws
from tests.posteriors._shared import dense_ggn

from ..linops._util import assert_close

SIGMA, ALPHA = 0.5, 0.7


def _problem():
    fn, params = from_equinox(eqx.nn.MLP(3, 2, 5, 1, activation=jnp.tanh, key=jax.random.key(0)))
    params = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), params)
    X = draws.normal(jax.random.key(1), (30, 3), jnp.float64)
    Y = jnp.stack([jnp.sin(X[:, 0]), X[:, 1] * X[:, 2]], axis=1)
    return fn, params, (X, Y)


def _dense_ggn(fn, params, X, Y):
    """The dense GGN (`tests.posteriors._shared.dense_ggn`) and the Jacobians ``(N, O, P)`` of the inputs."""
    flat, unravel = ravel(params)
    J = jax.vmap(lambda x: jax.jacfwd(lambda v: fn(unravel(v), x))(flat))(X)
    return dense_ggn(fn, params, X, Y, Gaussian(SIGMA)), J


def _selections(params):
    sub = pst.subnetwork.from_indices(params, [0, 4, 7, 20, 26])
    return {"last_layer": "last_layer", "first_layer": pst.weights.leaves(params, "layers.0"), "subnetwork": sub}


def _indices(post):
    return np.asarray(post.weights.indices)


@pytest.mark.parametrize("selection", ["last_layer", pytest.param("first_layer", marks=pytest.mark.slow), "subnetwork"])
def test_each_structure_over_a_selection_is_its_block_of_the_dense_ggn(selection):
    fn, params, data = _problem()
    G, J = _dense_ggn(fn, params, *data)
    spec = _selections(params)[selection]
    fit = lambda **kw: pst.laplace(fn, params, data, Gaussian(SIGMA), subset_of_weights=spec,  # noqa: E731
                                   prior_precision=ALPHA, **kw)
    full = fit(structure="full")
    idx = _indices(full)
    G_ss = G[np.ix_(idx, idx)]
    assert_close(full.ggn.G, G_ss, rtol=1e-10, atol=1e-12)
    P = G.shape[0]
    reference = np.zeros((P, P))
    reference[np.ix_(idx, idx)] = np.linalg.inv(G_ss + ALPHA * np.eye(idx.size))
    assert_close(full.covariance.as_matrix(), reference, rtol=1e-9, atol=1e-12)
    # the linearised predictive of the embedded covariance: J Σ J^T per output
    assert_close(pst.predictive.linearized(full, data[0][:7])[1],
                 np.einsum("nop,pq,noq->no", J[:7], reference, J[:7]), rtol=1e-8, atol=1e-12)

    diag = fit(structure="diag")
    assert_close(diag.ggn.g, np.diag(G_ss), rtol=1e-10, atol=1e-12)
    d_ref = np.zeros((P, P))
    d_ref[idx, idx] = 1.0 / (np.diag(G_ss) + ALPHA)
    assert_close(pst.predictive.linearized(diag, data[0][:7])[1], np.einsum("nop,pq,noq->no", J[:7], d_ref, J[:7]),
                 rtol=1e-8, atol=1e-12)

    low = fit(structure="lowrank", rank=idx.size, num_steps=idx.size, key=jax.random.key(3))
    assert_close(low.covariance.as_matrix(), reference, rtol=1e-6, atol=1e-9)

    # the evidence of the selection: -loss - alpha/2 |theta_s|^2 + S/2 log alpha - 1/2 logdet(G_ss + alpha)
    theta_s = np.asarray(ravel(params)[0])[idx]
    _, logdet = np.linalg.slogdet(G_ss + ALPHA * np.eye(idx.size))
    expected = -float(full.loss) - 0.5 * ALPHA * theta_s @ theta_s + 0.5 * idx.size * np.log(ALPHA) - 0.5 * logdet
    assert_close(pst.marginal_log_likelihood(full), expected, rtol=1e-10)


def test_kfac_over_the_last_layer_is_exact_for_its_weight_block():
    """The last layer is linear in its weights and the noise Gaussian: its GGN's weight block is the Kronecker product
    of the features' second moment and I/sigma^2, which KFAC computes exactly (the weight-bias coupling it drops)."""
    fn, params, data = _problem()
    G, _ = _dense_ggn(fn, params, *data)
    kfac = pst.laplace(fn, params, data, Gaussian(SIGMA), structure="kfac", subset_of_weights="last_layer",
                       prior_precision=ALPHA)
    idx = _indices(kfac)
    assert kfac.weights.leaves == (2, 3) and kfac.structure == "kfac"
    sizes = kfac.weights.group_sizes(params)  # the last layer's weight (2 x 5) and bias (2)
    assert sizes == [10, 2]
    precision = kfac.ggn.precision(kfac.prior_precision, kfac.noise_scale).as_matrix()
    G_ss = G[np.ix_(idx, idx)]
    assert_close(precision[:10, :10], G_ss[:10, :10] + ALPHA * np.eye(10), rtol=1e-10, atol=1e-12)
    assert_close(precision[10:, 10:], G_ss[10:, 10:] + ALPHA * np.eye(2), rtol=1e-10, atol=1e-12)
    assert not np.allclose(G_ss[:10, 10:], 0.0)  # the coupling KFAC drops is there: the check is not vacuous
    # its predictive (Jacobian rows over the last layer: the per-layer rule covers every weight only)
    _, J = _dense_ggn(fn, params, data[0][:5], data[1][:5])
    cov = np.zeros((G.shape[0],) * 2)
    cov[np.ix_(idx, idx)] = np.linalg.inv(precision)
    assert_close(pst.predictive.linearized(kfac, data[0][:5])[1], np.einsum("nop,pq,noq->no", J, cov, J), rtol=1e-8)


def test_a_selection_takes_a_per_parameter_prior_and_tunes_one_per_leaf():
    fn, params, data = _problem()
    P = ravel(params)[0].shape[0]
    per_param = jnp.linspace(0.5, 2.0, P)
    post = pst.laplace(fn, params, data, Gaussian(SIGMA), subset_of_weights="last_layer", prior_precision=per_param)
    assert_close(post.prior_precision, per_param[_indices(post)])
    tuned, report = pst.optimize_prior_precision(post, prior_structure="layerwise", num_steps=50, progress=False)
    alpha = np.asarray(report["prior_precision"])
    assert alpha.shape == (12,) and np.unique(alpha[:10]).size == 1 and np.unique(alpha[10:]).size == 1
    trace = report["log_marginal_likelihood"]
    assert trace[-1] > trace[0]
    assert_close(pst.marginal_log_likelihood(tuned), trace[-1], rtol=1e-8)
    with pytest.raises(ValueError, match="one prior precision per leaf"):
        pst.laplace(fn, params, data, Gaussian(SIGMA), structure="kfac", subset_of_weights="last_layer",
                    prior_precision=per_param)


def test_a_selection_saves_and_loads(tmp_path):
    fn, params, data = _problem()
    for spec in ("last_layer", pst.weights.leaves(params, "layers.0"),
                 pst.subnetwork.from_indices(params, [1, 2, 30])):
        post = pst.laplace(fn, params, data, Gaussian(SIGMA), structure="diag", subset_of_weights=spec)
        pst.save(post, tmp_path / "post.eqx")
        like = eqx.filter_eval_shape(pst.laplace, fn, params, data, Gaussian(SIGMA), structure="diag",
                                     subset_of_weights=spec)
        back = pst.load(tmp_path / "post.eqx", like)
        np.testing.assert_array_equal(back.sample(jax.random.key(0), 3), post.sample(jax.random.key(0), 3))
    other = eqx.filter_eval_shape(pst.laplace, fn, params, data, Gaussian(SIGMA), structure="diag",
                                  subset_of_weights=pst.weights.leaves(params, "layers.1"))
    with pytest.raises(ValueError, match="does not match the template"):
        pst.load(tmp_path / "post.eqx", other)


def test_bad_selections_are_refused_before_any_work():
    fn, params, data = _problem()
    with pytest.raises(ValueError, match="laplace: subset_of_weights must be one of"):
        pst.laplace(fn, params, data, Gaussian(SIGMA), subset_of_weights="first_layer")
    with pytest.raises(ValueError, match="laplace: the subnetwork indexes 3 parameters but params have 32"):
        pst.laplace(fn, params, data, Gaussian(SIGMA), subset_of_weights=pst.subnetwork.from_indices(jnp.zeros(3),
                                                                                                     [0]))
    with pytest.raises(ValueError, match=r"laplace: the selection's leaves \(7,\) are not leaves of params"):
        pst.laplace(fn, params, data, Gaussian(SIGMA), subset_of_weights=pst.weights.Leaves((7,), jnp.arange(2),
                                                                                             "bad"))
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 32\)"):
        pst.laplace(fn, params, data, Gaussian(SIGMA), subset_of_weights=pst.weights.Indices(jnp.array([0, 40])))


def test_last_layer_detection_refuses_a_convolutional_head_instead_of_guessing():
    """With a 1x1 convolution as the output layer (then global average pooling), the last dense layer found was an
    earlier one: the posterior silently covered the wrong weights. Refused, naming the convolution."""
    import jax
    import jax.numpy as jnp

    import posteriors as pst
    from linops.likelihoods import Categorical

    def fn(p, x):  # x: (1, 6, 6) -> dense features -> back to (4, 6, 6) -> 1x1 convolution to 3 classes -> mean
        h = jnp.tanh(x.reshape(-1) @ p["body"]["W"]).reshape(4, 6, 6)
        logits = jax.lax.conv_general_dilated(h[None], p["head"]["K"], (1, 1), "VALID")[0]
        return jnp.mean(logits, axis=(1, 2))

    params = {"body": {"W": 0.1 * jnp.ones((36, 144))}, "head": {"K": 0.1 * jnp.ones((3, 4, 1, 1))}}
    X = jnp.asarray(np.random.default_rng(0).standard_normal((8, 1, 6, 6)), jnp.float32)
    y = jnp.arange(8) % 3
    with pytest.raises(ValueError, match=r"last_layer: the last layer with weights .* is a conv layer \(head.K\)"):
        pst.laplace(fn, params, (X, y), Categorical(), subset_of_weights="last_layer")
    post = pst.laplace(fn, params, (X, y), Categorical(), subset_of_weights=pst.weights.leaves(params, "head"))
    assert post.weights.leaves == (1,)  # the convolution's kernel, named
