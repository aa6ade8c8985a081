"""The linearised predictive in bounded memory: chunks of inputs and blocks of outputs give the dense
``diag(J Σ Jᵀ)``; a projected posterior's predictive from its linearised samples."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical
from posteriors import predictive

from ..linops._util import assert_close


def _problem(num_classes=7):
    net = eqx.nn.MLP(3, num_classes, 6, 2, activation=jnp.tanh, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = lo.models.from_equinox(net)
    X = jax.random.normal(jax.random.key(1), (20, 3), jnp.float64)
    y = jnp.arange(20) % num_classes
    return fn, params, X, y


@pytest.mark.parametrize("structure", ["full", "diag", "kfac", "last_layer", "lowrank"])
def test_variances_from_blocks_of_outputs_equal_the_dense_reference(structure, monkeypatch):
    fn, params, X, y = _problem()
    post = pst.laplace(fn, params, (X, y), Categorical(), structure=structure, prior_precision=0.7,
                       rank=10, key=jax.random.key(2))
    Xt = jax.random.normal(jax.random.key(3), (5, 3), jnp.float64)
    J = np.asarray(lo.JacobianOp(fn, params, Xt).as_matrix())  # (M O, P) example-major
    reference = np.einsum("rp,pq,rq->r", J, np.asarray(post.covariance.as_matrix()), J).reshape(5, 7)
    mean, var = predictive.linearized(post, Xt)
    assert_close(var, reference, rtol=1e-9)
    P = J.shape[1]
    monkeypatch.setattr(predictive, "ROW_BUDGET", 3 * P)  # one input at a time, three outputs per block
    assert predictive._plan(5, 7, P, None, False) == (1, 3)
    assert_close(predictive.linearized(post, Xt)[1], reference, rtol=1e-9)
    monkeypatch.setattr(predictive, "ROW_BUDGET", 14 * P)  # two inputs per chunk, the last one short
    assert predictive._plan(5, 7, P, None, False) == (2, 7)
    assert_close(predictive.linearized(post, Xt)[1], reference, rtol=1e-9)
    cov = predictive.linearized(post, Xt, output_covariance=True)[1]
    full = np.einsum("rp,pq,sq->rs", J, np.asarray(post.covariance.as_matrix()), J)
    assert_close(cov, np.stack([full[7 * m:7 * m + 7, 7 * m:7 * m + 7] for m in range(5)]), rtol=1e-9)


def test_a_projected_posteriors_predictive_comes_from_its_linearised_samples():
    fn, params, X, y = _problem(num_classes=3)
    post = pst.projected_posterior(fn, params, X[:4], batch_size=2, prior_precision="optimal", key=jax.random.key(4),
                                   num_trace_samples=16)
    Xt = jax.random.normal(jax.random.key(5), (6, 3), jnp.float64)
    J = np.asarray(lo.JacobianOp(fn, params, Xt).as_matrix())
    offsets = J @ (np.asarray(post.trace_draws) / np.sqrt(float(post.prior_precision)))  # (M O, 16)
    var = predictive.linearized(post, Xt)[1]
    assert_close(var, np.mean(offsets**2, axis=1).reshape(6, 3), rtol=1e-9)  # the trace draws, no projection
    cov = predictive.linearized(post, Xt, full_covariance=True)[1]
    assert_close(cov, offsets @ offsets.T / 16, rtol=1e-9)
    # fresh draws: the same estimator on the posterior's own samples of that key
    deltas = np.asarray(post.sample(jax.random.key(6), 5) - post.mean[None, :])
    fresh = predictive.linearized(post, Xt, key=jax.random.key(6), num_samples=5)[1]
    assert_close(fresh, np.mean((J @ deltas.T) ** 2, axis=1).reshape(6, 3), rtol=1e-8)
    exact = predictive.linearized(post, Xt, exact=True)[1]
    reference = np.einsum("rp,pr->r", J, np.asarray(post.covariance.mm(jnp.asarray(J.T)))).reshape(6, 3)
    assert_close(exact, reference, rtol=1e-8)
    plain = pst.projected_posterior(fn, params, X[:4], batch_size=2, prior_precision=2.0)
    with pytest.raises(ValueError, match="pass key=jax.random.key"):
        predictive.linearized(plain, Xt)
    probs = predictive.classification(plain, Xt, key=jax.random.key(7), num_samples=4)
    assert probs.shape == (6, 3) and np.allclose(np.sum(probs, axis=1), 1.0)


ARCHITECTURES = [("lenet5", {}, 12), ("resnet", {"norm": "batch"}, 8), ("vit", {}, 8), ("nnx_cnn", {}, 8)]


@pytest.mark.parametrize(("name", "kw", "side"), ARCHITECTURES, ids=[a[0] for a in ARCHITECTURES])
def test_every_structures_predictive_on_the_small_architectures_is_the_dense_reference(name, kw, side):
    """LeNet-5, a ResNet with inference-mode BatchNorm, a vision transformer and a Flax NNX CNN (float64):
    each Laplace structure's linearised variances equal the dense diag(J Σ Jᵀ) of its own covariance."""
    from posteriors.experiments.architectures import ARCHITECTURES as BUILD

    fn, params = BUILD[name](jax.random.key(0), size="small", dtype=jnp.float64, **kw)
    X = jax.random.normal(jax.random.key(1), (6, 1, side, side), jnp.float64)
    y = jnp.arange(6) % 10
    Xt = jax.random.normal(jax.random.key(2), (2, 1, side, side), jnp.float64)
    J = np.asarray(lo.JacobianOp(fn, params, Xt).as_matrix())  # (M O, P)
    P = J.shape[1]
    for structure, options in (("diag", {}), ("kfac", {}), ("last_layer", {}), ("full", {}),
                               ("lowrank", {"rank": 8, "key": jax.random.key(3)})):
        post = pst.laplace(fn, params, (X, y), Categorical(), structure=structure, prior_precision=3.0, **options)
        if structure == "kfac":  # convolutions and dense layers (per token too) in Kronecker factors, the rest diagonal
            expected = {"lenet5": set(), "nnx_cnn": set(), "resnet": {"weight", "bias"},
                        "vit": {"weight", "bias", "cls_token", "positions"}}[name]
            assert {d.split(".")[-1] for d in post.ggn.diagonal_leaves} == expected, post.ggn.diagonal_leaves
        Sigma = np.asarray(post.covariance.as_matrix())
        reference = np.einsum("rp,pq,rq->r", J, Sigma, J).reshape(2, 10)
        assert_close(predictive.linearized(post, Xt)[1], reference, rtol=1e-8, err_msg=structure)
    chosen = pst.subnetwork.largest_magnitude(params, P // 10)
    sub = pst.subnetwork.subnetwork_laplace(fn, params, (X, y), Categorical(), chosen, prior_precision=3.0)
    Sigma = np.asarray(sub.covariance.as_matrix())
    assert_close(predictive.linearized(sub, Xt)[1], np.einsum("rp,pq,rq->r", J, Sigma, J).reshape(2, 10),
                 rtol=1e-8, err_msg="subnetwork")
