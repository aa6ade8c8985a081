"""The linearised predictive in bounded memory: chunks of inputs and blocks of outputs give the dense
``diag(J Σ Jᵀ)``; a projected posterior's predictive from its linearised samples."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
import posteriors as pst
from linops.likelihoods import Bernoulli, Categorical
from posteriors import predictive
from tests import _draws as draws
from tests.posteriors._shared import axes

from ..linops._util import assert_close


def _problem(num_classes=7):
    net = eqx.nn.MLP(3, num_classes, 6, 2, activation=jnp.tanh, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = lo.models.from_equinox(net)
    X = draws.normal(jax.random.key(1), (20, 3), jnp.float64)
    y = jnp.arange(20) % num_classes
    return fn, params, X, y


@pytest.mark.parametrize("structure", ["full", "diag", "kfac", "last_layer", "lowrank"])
def test_variances_from_blocks_of_outputs_equal_the_dense_reference(structure, monkeypatch):
    fn, params, X, y = _problem()
    post = pst.laplace(fn, params, (X, y), Categorical(), **axes(structure), prior_precision=0.7,
                       rank=10, key=jax.random.key(2))
    Xt = draws.normal(jax.random.key(3), (5, 3), jnp.float64)
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


def test_a_projected_posteriors_sampled_predictive_inside_jit_equals_the_eager_one():
    """Eagerly, the draws go in blocks of 10 sliced on the host; inside a trace (a caller's `jax.jit`), all at
    once: the same moments, for the fit's draws, fewer of them, more (fresh ones from a key), and fresh ones only."""
    fn, params, X, _ = _problem(num_classes=3)
    post = pst.projected_posterior(fn, params, X[:4], batch_size=2, prior_precision="optimal", key=jax.random.key(4),
                                   num_trace_samples=16, trace_rtol=None, progress=False)
    plain = pst.projected_posterior(fn, params, X[:4], batch_size=2, prior_precision=2.0, progress=False)
    Xt = draws.normal(jax.random.key(5), (6, 3), jnp.float64)
    for p, kw in ((post, {}), (post, dict(num_samples=5)), (post, dict(num_samples=23, key=jax.random.key(6))),
                  (plain, dict(num_samples=12, key=jax.random.key(7)))):
        eager = predictive.linearized(p, Xt, progress=False, **kw)[1]
        traced = eqx.filter_jit(lambda q, t, kw=kw: predictive.linearized(q, t, progress=False, **kw)[1])(p, Xt)
        assert np.ptp(np.asarray(eager)) > 0
        assert_close(traced, eager, rtol=1e-10)


def test_a_projected_posteriors_predictive_comes_from_its_linearised_samples():
    fn, params, X, y = _problem(num_classes=3)
    post = pst.projected_posterior(fn, params, X[:4], batch_size=2, prior_precision="optimal", key=jax.random.key(4),
                                   num_trace_samples=16)
    Xt = draws.normal(jax.random.key(5), (6, 3), jnp.float64)
    J = np.asarray(lo.JacobianOp(fn, params, Xt).as_matrix())
    offsets = J @ (np.asarray(post.trace_draws) / np.sqrt(float(post.prior_precision)))  # (M O, 16)
    var = predictive.linearized(post, Xt)[1]
    assert_close(var, np.mean(offsets**2, axis=1).reshape(6, 3), rtol=1e-9)  # the trace draws, no projection
    cov = predictive.linearized(post, Xt, full_covariance=True)[1]
    assert_close(cov, offsets @ offsets.T / 16, rtol=1e-9)
    # fewer: the first of the fit's draws, still no projection (the key is not used)
    first = predictive.linearized(post, Xt, key=jax.random.key(6), num_samples=5)[1]
    assert_close(first, np.mean(offsets[:, :5] ** 2, axis=1).reshape(6, 3), rtol=1e-9)
    # more: the fit's 16 topped up with 4 fresh ones, the posterior's own samples of that key
    deltas = np.asarray(post.sample(jax.random.key(6), 4) - post.mean[None, :])
    more = np.concatenate([offsets, J @ deltas.T], axis=1)
    topped = predictive.linearized(post, Xt, key=jax.random.key(6), num_samples=20)[1]
    assert_close(topped, np.mean(more**2, axis=1).reshape(6, 3), rtol=1e-8)
    with pytest.raises(ValueError, match=r"ProjectedPosterior.draws: 20 samples asked for and the fit made 16 .* "
                                         r"pass key=.* for the 4 fresh ones"):
        predictive.linearized(post, Xt, num_samples=20)
    exact = predictive.linearized(post, Xt, exact=True)[1]
    reference = np.einsum("rp,pr->r", J, np.asarray(post.covariance.mm(jnp.asarray(J.T)))).reshape(6, 3)
    assert_close(exact, reference, rtol=1e-8)
    plain = pst.projected_posterior(fn, params, X[:4], batch_size=2, prior_precision=2.0)
    with pytest.raises(ValueError, match="pass key=jax.random.key"):
        predictive.linearized(plain, Xt)
    probs = predictive.classification(plain, Xt, key=jax.random.key(7), num_samples=4)
    assert probs.shape == (6, 3) and np.allclose(np.sum(probs, axis=1), 1.0)


# The ResNet and the ViT (about 100 s each on 2 cores) run in the slow tier, to keep the default suite under
# its 10 minutes; LeNet-5 and the Flax CNN run in both.
ARCHITECTURES = [pytest.param("lenet5", {}, 12, id="lenet5", marks=pytest.mark.slow),  # 11 s; nnx_cnn: a CNN too
                 pytest.param("resnet", {"norm": "batch"}, 8, id="resnet", marks=pytest.mark.slow),
                 pytest.param("vit", {}, 8, id="vit", marks=pytest.mark.slow),
                 pytest.param("nnx_cnn", {}, 8, id="nnx_cnn")]


@pytest.mark.parametrize(("name", "kw", "side"), ARCHITECTURES)
def test_every_structures_predictive_on_the_small_architectures_is_the_dense_reference(name, kw, side):
    """LeNet-5, a ResNet with inference-mode BatchNorm, a vision transformer and a Flax NNX CNN (float64):
    each Laplace structure's linearised variances equal the dense diag(J Σ Jᵀ) of its own covariance."""
    from posteriors.experiments.architectures import ARCHITECTURES as BUILD

    fn, params = BUILD[name](jax.random.key(0), size="small", dtype=jnp.float64, **kw)
    X = draws.normal(jax.random.key(1), (6, 1, side, side), jnp.float64)
    y = jnp.arange(6) % 10
    Xt = draws.normal(jax.random.key(2), (2, 1, side, side), jnp.float64)
    J = np.asarray(lo.JacobianOp(fn, params, Xt).as_matrix())  # (M O, P)
    P = J.shape[1]
    for structure, options in (("diag", {}), ("kfac", {}), ("last_layer", {}), ("full", {}),
                               ("lowrank", {"rank": 8, "key": jax.random.key(3)})):
        post = pst.laplace(fn, params, (X, y), Categorical(), **axes(structure), prior_precision=3.0, **options)
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


# --- the probit and Laplace-bridge links against their closed forms, computed here in numpy ---------------


def _probit_by_hand(mu, v):
    """softmax_k(mu_k / sqrt(1 + pi v_k / 8)) over the last axis."""
    z = mu / np.sqrt(1.0 + np.pi * v / 8.0)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_probit_in_closed_form_at_variances_one_to_five():
    """At variances 1..5 the constant pi/8 moves the probabilities by 1e-3 or more (pi/8 vs 3/8 at v = 5)."""
    mu = np.array([1.5, -0.7, 2.3, 0.4, -1.9])
    v = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    binary = 1.0 / (1.0 + np.exp(-mu / np.sqrt(1.0 + np.pi * v / 8.0)))
    assert_close(binary[0], 1.0 / (1.0 + np.exp(-1.5 / np.sqrt(1.0 + np.pi / 8.0))), rtol=1e-15)
    got = predictive.probit(jnp.asarray(mu)[:, None], jnp.asarray(v)[:, None], multiclass=False)
    assert got.shape == (5, 1)
    assert_close(got[:, 0], binary, rtol=1e-12)
    M = np.array([[1.0, -0.5, 2.0], [0.3, 0.3, -1.2], [2.5, 0.0, 1.0], [-1.0, 0.8, 0.1]])
    V = np.array([[1.0, 3.0, 5.0], [2.0, 4.0, 1.0], [5.0, 2.0, 3.0], [4.0, 1.0, 2.5]])  # distinct per class
    assert_close(predictive.probit(jnp.asarray(M), jnp.asarray(V)), _probit_by_hand(M, V), rtol=1e-12)
    assert np.abs(_probit_by_hand(M, V) - _probit_by_hand(M, 0.0 * V)).max() > 0.05  # the variance matters here


def test_probit_classification_of_a_linear_softmax_model_is_the_closed_form():
    """classification(link='probit') = softmax(mu_k / sqrt(1 + pi v_k / 8)) with mu, v of the linearised
    predictive of f(W, x) = W x + b, its GGN built by hand: sum_n J_n^T (diag p_n - p_n p_n^T) J_n."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((6, 2))
    y = np.array([0, 1, 2, 0, 1, 2])
    W, b = rng.standard_normal((3, 2)), rng.standard_normal(3)
    alpha = 0.3  # a weak prior and six examples: predictive variances of order one

    def jacobian(x):  # (3, 9): d f_o / d(vec W row-major, b)
        return np.hstack([np.kron(np.eye(3), x[None, :]), np.eye(3)])

    G = np.zeros((9, 9))
    for x in X:
        z = W @ x + b
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        G += jacobian(x).T @ (np.diag(p) - np.outer(p, p)) @ jacobian(x)
    Sigma = np.linalg.inv(G + alpha * np.eye(9))
    T = 2.0 * rng.standard_normal((4, 2))
    mu = T @ W.T + b
    v = np.stack([np.diag(jacobian(t) @ Sigma @ jacobian(t).T) for t in T])
    assert v.min() > 0.5 and v.max() < 50  # where the constant matters
    post = pst.laplace(lambda p, x: p["W"] @ x + p["b"], {"W": jnp.asarray(W), "b": jnp.asarray(b)},
                       (jnp.asarray(X), jnp.asarray(y)), Categorical(), structure="full", prior_precision=alpha)
    assert_close(predictive.classification(post, jnp.asarray(T), link="probit"), _probit_by_hand(mu, v), rtol=1e-10)
    # one logit: the Bernoulli probit sigma(mu / sqrt(1 + pi v / 8)) of class 1
    fn1 = lambda p, x: p["W"] @ x + p["b"]  # noqa: E731
    post1 = pst.laplace(fn1, {"W": jnp.asarray(W[:1]), "b": jnp.asarray(b[:1])},
                        (jnp.asarray(X), jnp.asarray((y == 1).astype(np.float64))[:, None]), Bernoulli(),
                        structure="full", prior_precision=alpha)
    G1 = np.zeros((3, 3))
    for x in X:
        s = 1.0 / (1.0 + np.exp(-(W[0] @ x + b[0])))
        phi = np.append(x, 1.0)
        G1 += s * (1 - s) * np.outer(phi, phi)
    Phi_t = np.hstack([T, np.ones((4, 1))])
    v1 = np.einsum("ij,jk,ik->i", Phi_t, np.linalg.inv(G1 + alpha * np.eye(3)), Phi_t)
    assert v1.min() > 0.5
    expected = 1.0 / (1.0 + np.exp(-(mu[:, 0]) / np.sqrt(1.0 + np.pi * v1 / 8.0)))
    assert_close(predictive.classification(post1, jnp.asarray(T), link="probit")[:, 0], expected, rtol=1e-10)


def _bridge_by_hand(m, S):
    """Hobbhahn, Kristiadi & Hennig (2022): condition N(m, S) on sum_k f_k = 0, then the Dirichlet
    alpha_k = (1 / S_kk) (1 - 2/K + e^{m_k} / K^2 sum_l e^{-m_l}); returns (alpha, its mean)."""
    K = m.shape[0]
    s = S.sum(axis=1)  # S 1
    m = m - s * m.sum() / s.sum()
    S = S - np.outer(s, s) / s.sum()
    alpha = (1.0 - 2.0 / K + np.exp(m) / K**2 * np.exp(-m).sum()) / np.diag(S)
    return alpha, alpha / alpha.sum()


def test_laplace_bridge_by_hand_on_asymmetric_three_class_cases():
    mean = np.array([[1.0, -0.5, 0.3], [0.2, 1.4, -2.0]])
    var = np.array([[0.5, 1.2, 2.0], [3.0, 0.4, 1.1]])  # distinct variances
    # one case by hand: K = 3, m = (1, -0.5, 0.3), S = diag(0.5, 1.2, 2); 1^T S 1 = 3.7, 1^T m = 0.8
    m0 = np.array([1.0, -0.5, 0.3]) - np.array([0.5, 1.2, 2.0]) * 0.8 / 3.7
    v0 = np.array([0.5, 1.2, 2.0]) - np.array([0.25, 1.44, 4.0]) / 3.7
    a0 = (1 / 3 + np.exp(m0) / 9 * np.exp(-m0).sum()) / v0
    alpha, probs = _bridge_by_hand(mean[0], np.diag(var[0]))
    assert_close(alpha, a0, rtol=1e-14)
    expected = np.stack([_bridge_by_hand(m, np.diag(v))[1] for m, v in zip(mean, var, strict=True)])
    got = predictive.laplace_bridge(jnp.asarray(mean), jnp.asarray(var))
    assert_close(got, expected, rtol=1e-12)
    assert_close(predictive.laplace_bridge(jnp.asarray(mean), jnp.asarray(np.stack([np.diag(v) for v in var]))),
                 expected, rtol=1e-12)  # the same covariance given as (M, K, K)
    # a full covariance: the conditioning uses its off-diagonal entries
    L = np.array([[1.0, 0.0, 0.0], [0.4, 0.8, 0.0], [-0.3, 0.5, 1.3]])
    S = L @ L.T
    got = predictive.laplace_bridge(jnp.asarray(mean[:1]), jnp.asarray(S[None]))
    assert_close(got[0], _bridge_by_hand(mean[0], S)[1], rtol=1e-12)
    # without the conditioning the answer would be different
    K = 3
    naive = (1 - 2 / K + np.exp(mean[0]) / K**2 * np.exp(-mean[0]).sum()) / var[0]
    assert np.abs(naive / naive.sum() - expected[0]).max() > 1e-2


def test_nll_refuses_targets_that_do_not_match_the_model_before_any_work():
    """`pst.predictive.nll` checks its targets as the metrics do: (N,) targets against (N, 1) means broadcast to an
    (N, N) sum, label -1 scored as the last class, a label past the classes gave NaN; each is refused, naming it."""
    from linops.likelihoods import Gaussian

    X = jnp.asarray(np.random.default_rng(0).standard_normal((6, 2)))
    reg = pst.laplace(lambda w, x: (x @ w)[None], jnp.ones(2), (X, jnp.zeros((6, 1))), Gaussian(1.0),
                      structure="diag")
    with pytest.raises(ValueError, match=r"nll: a Gaussian likelihood needs real targets of shape \(6, 1\).*\(6,\)"):
        pst.predictive.nll(reg, X, jnp.zeros(6))
    mean, var = pst.predictive.regression(reg, X)
    y = jnp.asarray(np.random.default_rng(1).standard_normal((6, 1)))
    expected = 0.5 * np.sum(np.log(2 * np.pi * np.asarray(var)) + (np.asarray(y) - np.asarray(mean)) ** 2
                            / np.asarray(var))
    assert_close(pst.predictive.nll(reg, X, y), expected)

    W = jnp.asarray(np.random.default_rng(2).standard_normal((2, 3)))
    labels = jnp.array([0, 1, 2, 0, 1, 2])
    clf = pst.laplace(lambda w, x: x @ w, W, (X, labels), Categorical(), structure="diag")
    for bad, match in ((labels.at[0].set(-1), r"labels must lie in \[0, 3\).*from -1 to 2"),
                       (labels.at[0].set(3), r"labels must lie in \[0, 3\).*from 0 to 3"),
                       (labels[:5], r"integer labels of shape \(6,\)"),
                       (labels.astype(float), r"integer labels of shape \(6,\)")):
        with pytest.raises(ValueError, match=match):
            pst.predictive.nll(clf, X, bad)
    probs = pst.predictive.classification(clf, X)
    assert_close(pst.predictive.nll(clf, X, labels), -np.sum(np.log(np.asarray(probs)[np.arange(6), labels])),
                 rtol=1e-6)

    binary = pst.laplace(lambda w, x: (x @ w)[None], jnp.ones(2), (X, jnp.array([0, 1, 1, 0, 1, 0])[:, None]),
                         Bernoulli(), structure="diag")
    with pytest.raises(ValueError, match=r"targets 0 or 1, got values \[2\]"):
        pst.predictive.nll(binary, X, jnp.array([0, 1, 2, 0, 1, 0]))
    p = np.asarray(pst.predictive.classification(binary, X))[:, 0]
    t = np.array([0, 1, 1, 0, 1, 0])
    expected = -np.sum(t * np.log(p) + (1 - t) * np.log(1 - p))
    assert_close(pst.predictive.nll(binary, X, jnp.asarray(t)), expected, rtol=1e-6)  # (N,) targets: no broadcast


def test_the_laplace_bridge_is_the_closed_form_and_finite_at_any_logit():
    """In log space the bridge equals its formula where that is finite, and stays a distribution where the formula
    overflowed (it gave [0, 0, 0] at logits +-45 and NaN at +-50)."""
    rng = np.random.default_rng(4)
    K = 4
    mean = rng.standard_normal((5, K)) * 3
    A = rng.standard_normal((5, K, K))
    cov = A @ np.transpose(A, (0, 2, 1)) / K + 0.1 * np.eye(K)

    def formula(mean, cov):  # the paper's formula, directly (float64, moderate logits)
        s = cov.sum(-1)
        total = s.sum(-1, keepdims=True)
        m = mean - s * mean.sum(-1, keepdims=True) / total
        var = np.diagonal(cov, axis1=-2, axis2=-1) - s**2 / total
        alpha = (1 - 2 / K + np.exp(m) / K**2 * np.exp(-m).sum(-1, keepdims=True)) / var
        return alpha / alpha.sum(-1, keepdims=True)

    assert_close(predictive.laplace_bridge(jnp.asarray(mean), jnp.asarray(cov)), formula(mean, cov), rtol=1e-10)
    diag = np.diagonal(cov, axis1=-2, axis2=-1)
    assert_close(predictive.laplace_bridge(jnp.asarray(mean), jnp.asarray(diag)),
                 formula(mean, np.eye(K) * diag[:, None, :]), rtol=1e-10)
    for L in (45.0, 50.0, 1e4):
        p = np.asarray(predictive.laplace_bridge(jnp.array([[L, -L, 0.0]], jnp.float32), jnp.ones((1, 3))))
        assert np.all(np.isfinite(p)) and abs(p.sum() - 1) < 1e-6 and p[0, 0] > 0.999
    assert_close(predictive.laplace_bridge(jnp.zeros((2, 1)), jnp.ones((2, 1))), np.ones((2, 1)))  # one class


def test_the_bridge_refuses_a_single_logit_before_any_work():
    post = pst.laplace(lambda w, x: (x @ w)[None], jnp.zeros(2), (jnp.eye(2), jnp.array([[0.0], [1.0]])), Bernoulli(),
                       structure="diag")
    with pytest.raises(ValueError, match=r"the Laplace bridge needs K >= 2 logits, got 1"):
        pst.predictive.classification(post, jnp.eye(2), link="bridge")
