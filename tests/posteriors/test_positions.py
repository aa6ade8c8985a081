"""Outputs with a position axis (issue 35, item 2): a model returning ``(T, V)`` per example, its likelihood summed over
positions, in every structure, the evidence and the predictives, with no reshape asked of the user.

References: autodiff of the summed loss (the per-position likelihood), Bayesian linear regression over positions
(the posterior, the predictive and the evidence in closed form; KFAC exact for it), the dense GGN
``sum_n J_n^T H_n J_n`` of a nonlinear model, and the dense ``diag(J Sigma J^T)`` of a small GPT's LoRA adapters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posteriors as pst
from linops.likelihoods import Categorical, Flattened, Gaussian, MonteCarloFisher, PerPosition, with_positions
from linops.models import ravel
from linops.testing import count_compilations as compiles
from tests import _draws as draws
from tests.posteriors._shared import dense_ggn

from ..linops._util import assert_close

T, V, D = 3, 4, 2


@pytest.mark.parametrize("base", [Categorical(), Gaussian(0.7)], ids=["categorical", "gaussian"])
def test_per_position_likelihood_is_the_summed_loss(base):
    """nll, gradient, Hessian products, Hessian and its factor against autodiff of the sum over positions."""
    lik = PerPosition(base, (T, V))
    f = draws.normal(jax.random.key(0), (T * V,), jnp.float64)
    y = jnp.array([0, 3, 1]) if isinstance(base, Categorical) else draws.normal(jax.random.key(1), (T, V))
    total = lambda f: sum(base.nll(f.reshape(T, V)[t], y[t]) for t in range(T))  # noqa: E731
    u = draws.normal(jax.random.key(2), (T * V,), jnp.float64)
    H = jax.hessian(total)(f)
    assert_close(lik.nll(f, y), total(f))
    assert_close(lik.grad(f, y), jax.grad(total)(f))
    assert_close(lik.hvp(f, y, u), H @ u)
    assert_close(lik.hessian(f, y).as_matrix(), H)
    A = lik.hessian_factor(f, y)
    assert A.shape == (lik.factor_rows(T * V), T * V)
    assert_close(A.T @ A, H, atol=1e-12)
    assert float(jnp.abs(H).sum()) > 1.0  # the checked terms do not vanish


def test_a_monte_carlo_fisher_over_positions_is_unbiased_with_whole_sequences_per_draw():
    """One draw samples every position (one factor row per sample, whatever T and V): the mean of A^T A over many
    examples' draws equals the block-diagonal Hessian, the cross-position terms vanishing in expectation."""
    lik = PerPosition(Categorical(), (T, V))
    mc = MonteCarloFisher(lik, num_samples=2)
    f = draws.normal(jax.random.key(0), (T * V,), jnp.float64)
    n = 20_000
    _, keys = mc.with_keys(jnp.zeros((n, T), int), jax.random.key(1))
    A = jax.vmap(lambda k: mc.hessian_factor(f, (jnp.zeros(T, int), k)))(keys)  # (n, 2, T V)
    assert A.shape == (n, 2, T * V)
    outer = jnp.einsum("nko,nkq->noq", A, A)
    mean, se = outer.mean(0), outer.std(0) / np.sqrt(n)
    H = lik.hessian(f, jnp.zeros(T, int)).as_matrix()
    z = np.asarray((mean - H) / jnp.where(se > 0, se, 1.0))
    assert np.abs(z).max() < 5.0, np.abs(z).max()
    assert float(jnp.abs(H[:V, V:]).max()) == 0.0 and float(jnp.abs(mean[:V, V:]).max()) > 0  # cross terms: noise


def _blr(n=20, alpha=1.5, sigma=0.6):
    """Bayesian linear regression over positions: ``f(W, x) = x W`` with ``x`` of shape ``(T, D)``, Gaussian noise;
    the exact MAP and the closed forms (the precision is ``(A / sigma^2 + alpha I) (x) I_V``, ``A = sum x x^T``)."""
    X = draws.normal(jax.random.key(0), (n, T, D), jnp.float64)
    Y = draws.normal(jax.random.key(1), (n, T, V), jnp.float64)
    rows, targets = X.reshape(-1, D), Y.reshape(-1, V)
    prec = rows.T @ rows / sigma**2 + alpha * jnp.eye(D)
    W = jnp.linalg.solve(prec, rows.T @ targets / sigma**2)
    return (lambda w, x: x @ w), W, X, Y, prec, alpha, sigma


@pytest.mark.parametrize("structure", ["full", "kfac", "diag"])
def test_linear_regression_over_positions_matches_the_closed_forms(structure):
    fn, W, X, Y, prec, alpha, sigma = _blr()
    post = pst.laplace(fn, W, (X, Y), Gaussian(sigma), structure=structure, prior_precision=alpha)
    assert isinstance(post.fn, Flattened) and post.likelihood == PerPosition(Gaussian(sigma), (T, V))
    P = jnp.kron(prec, jnp.eye(V))  # vec(W) row-major: (D, V)
    S = jnp.linalg.inv(P) if structure != "diag" else jnp.diag(1.0 / jnp.diag(P))
    assert_close(post.covariance.as_matrix(), S, rtol=1e-10)
    Xt = draws.normal(jax.random.key(2), (5, T, D), jnp.float64)
    mean, var = pst.predictive.linearized(post, Xt)
    J = jax.vmap(lambda x: jax.jacfwd(lambda w: fn(w.reshape(D, V), x).reshape(-1))(W.reshape(-1)))(Xt)
    assert mean.shape == var.shape == (5, T, V)
    assert_close(mean, Xt @ W)
    assert_close(var, jnp.einsum("mop,pq,moq->mo", J, S, J).reshape(5, T, V), rtol=1e-10)
    m, v = pst.predictive.regression(post, Xt)
    assert_close(v, var + sigma**2)
    if structure == "full":  # the exact log evidence: each output column's N(y; 0, sigma^2 I + K / alpha)
        rows = X.reshape(-1, D)
        C = sigma**2 * jnp.eye(rows.shape[0]) + rows @ rows.T / alpha
        exact = sum(jax.scipy.stats.multivariate_normal.logpdf(Y.reshape(-1, V)[:, v], jnp.zeros(rows.shape[0]), C)
                    for v in range(V))
        assert_close(pst.marginal_log_likelihood(post), exact, rtol=1e-10)
        nll = pst.predictive.nll(post, Xt, Xt @ W + 0.1)
        assert_close(nll, 0.5 * jnp.sum(jnp.log(2 * jnp.pi * v) + 0.01 / v))


def _tanh_seq(seed=0):
    """A nonlinear sequence classifier ``tanh(x W1) W2``: ``(T, V)`` logits of ``(T, D)`` inputs (float64)."""
    k = jax.random.split(jax.random.key(seed), 4)
    params = {"W1": draws.normal(k[0], (D, 5), jnp.float64), "W2": draws.normal(k[1], (5, V), jnp.float64)}
    X = draws.normal(k[2], (8, T, D), jnp.float64)
    Y = jax.random.randint(k[3], (8, T), 0, V)
    return (lambda p, x: jnp.tanh(x @ p["W1"]) @ p["W2"]), params, X, Y


def test_the_ggn_of_a_sequence_classifier_is_the_dense_one_and_its_predictives_are_per_position():
    fn, params, X, Y = _tanh_seq()
    post = pst.laplace(fn, params, (X, Y), Categorical(), structure="full", prior_precision=0.3)
    G = dense_ggn(Flattened(fn, (T, V)), params, X, Y, PerPosition(Categorical(), (T, V)))
    assert np.abs(G).max() > 0.1
    assert_close(jnp.linalg.inv(post.covariance.as_matrix()), G + 0.3 * np.eye(G.shape[0]), rtol=1e-9, atol=1e-9)
    Xt = X[:3]
    mean, var = pst.predictive.linearized(post, Xt)
    probs = pst.predictive.classification(post, Xt)
    assert probs.shape == (3, T, V)
    assert_close(probs, jax.nn.softmax(mean / jnp.sqrt(1 + jnp.pi / 8 * var), axis=-1))
    assert_close(pst.predictive.nll(post, Xt, Y[:3]),
                 -jnp.sum(jnp.log(jnp.take_along_axis(probs, Y[:3, :, None], axis=-1))))
    # the bridge reads each position's V x V block of the output covariance
    _, cov = pst.predictive.linearized(post, Xt, output_covariance=True)
    assert cov.shape == (3, T, V, T, V)
    blocks = jnp.stack([cov[:, t, :, t, :] for t in range(T)], axis=1)
    bridge = pst.predictive.classification(post, Xt, link="bridge")
    assert_close(bridge, pst.predictive.laplace_bridge(mean.reshape(-1, V), blocks.reshape(-1, V, V)).reshape(3, T, V))
    assert pst.predictive.monte_carlo(post, jax.random.key(0), Xt, 5).shape == (5, 3, T, V)
    est = pst.predictive.sampled_variances(post, jax.random.key(0), Xt, 4000)
    z = np.asarray((est.value - var) / est.standard_error)
    assert est.value.shape == (3, T, V) and np.abs(z).max() < 5  # its unbiasedness: test_sampled_variances


def test_a_refit_with_a_position_axis_compiles_nothing():
    fn, params, X, Y = _tanh_seq(0)
    first = pst.laplace(fn, params, (X, Y), Categorical(), structure="kfac")
    pst.predictive.classification(first, X[:2])
    _, params2, X2, Y2 = _tanh_seq(1)
    with compiles() as events:
        second = pst.laplace(fn, params2, (X2, Y2), Categorical(), structure="kfac")
        jax.block_until_ready(pst.predictive.classification(second, X2[:2]))
    assert events == [], f"{len(events)} compilations on the second call"


def test_position_axis_refusals():
    fn, params, X, Y = _tanh_seq()
    with pytest.raises(ValueError, match=r"laplace: the targets of a model with outputs \(3, 4\) per example must "
                                         r"have shape \(8, 3, \.\.\.\)"):
        pst.laplace(fn, params, (X, Y[:, :2]), Categorical())
    with pytest.raises(ValueError, match=r"laplace: labels must lie in \[0, 4\)"):
        pst.laplace(fn, params, (X, Y + 4), Categorical())
    with pytest.raises(ValueError, match="laplace: the model returns outputs of shape .* per-example arrays"):
        pst.laplace(fn, params, (X, jnp.zeros((8, T, V))), Gaussian(jnp.ones(8), heteroscedastic=True))
    with pytest.raises(ValueError, match=r"reads outputs of shape \(2, 4\), the model returns \(3, 4\)"):
        pst.laplace(fn, params, (X, Y), PerPosition(Categorical(), (2, 4)))
    with pytest.raises(TypeError, match="PerPosition: base must be a likelihood of one position"):
        PerPosition(MonteCarloFisher(Categorical()), (T, V))
    with pytest.raises(ValueError, match=r"PerPosition: shape must have positions and outputs"):
        PerPosition(Categorical(), (4,))
    with pytest.raises(ValueError, match=r"must return one example's outputs of shape \(O,\), got \(3, 4\)"):
        pst.projected_posterior(fn, params, X, prior_precision=1.0, batch_size=4)
    post = pst.laplace(fn, params, (X, Y), Categorical(), structure="diag")
    with pytest.raises(ValueError, match=r"nll: the targets of a model with outputs \(3, 4\)"):
        pst.predictive.nll(post, X[:2], Y[:3])
    assert with_positions(MonteCarloFisher(Categorical(), 3), (T, V)).num_samples == 3


def _lora_problem():
    from posteriors.experiments.transformer import add_lora, corpus, gpt, lora_weights, windows

    fn, params = gpt(jax.random.key(0), size="small", context=8, dtype=jnp.float64)
    fn, params = add_lora(fn, params, jax.random.key(1), rank=2)
    # fine-tuned adapters are not zero: B = 0 would make the Jacobian of A vanish
    params = jax.tree_util.tree_map_with_path(
        lambda p, a: a + 0.3 * draws.normal(jax.random.key(len(str(p))), a.shape, a.dtype)
        if "lora_b" in str(p) else a, params)
    X, Y = windows(corpus("train"), 6, 8, jax.random.key(2))
    Xt, _ = windows(corpus("bytecode"), 2, 8, jax.random.key(3))
    return fn, params, X, Y, Xt, lora_weights(params)


@pytest.mark.parametrize("structure", [pytest.param("diag", marks=pytest.mark.slow),  # 5 s each: the slow tier
                                       pytest.param("full", marks=pytest.mark.slow),
                                       pytest.param("kfac", marks=pytest.mark.slow),
                                       pytest.param("lowrank", marks=pytest.mark.slow),
                                       pytest.param("functional", marks=pytest.mark.slow),
                                       pytest.param("sketched", marks=pytest.mark.slow)])
def test_laplace_lora_predictive_equals_the_dense_one_in_every_structure(structure):
    """A small GPT's LoRA adapters (128 parameters; 2,048 next-byte outputs per sequence): the predictive variances
    of every structure equal diag(J Sigma J^T) from the dense Jacobian of the adapters and the structure's own
    covariance (the sketched one against its exact covariance: a sketch of every coordinate is exact)."""
    fn, params, X, Y, Xt, adapters = _lora_problem()
    kw = {"lowrank": dict(rank=30, key=jax.random.key(4)), "functional": dict(num_points=4, key=jax.random.key(4)),
          "sketched": dict(rank=6, num_steps=128, sketch_size=128, key=jax.random.key(4))}.get(structure, {})
    post = pst.laplace(fn, params, (X, Y), Categorical(), structure=structure, subset_of_weights=adapters,
                       prior_precision=0.5, **kw)
    mean, var = pst.predictive.linearized(post, Xt)
    f_s, p_s, cov = post.own_space()
    flat, unravel = ravel(p_s)
    assert flat.size == 128
    J = jax.vmap(lambda x: jax.jacfwd(lambda w: f_s(unravel(w), x))(flat))(Xt)  # (M, T V, P)
    if structure == "sketched":
        top = post.ggn.top
        U = top.sketch.T.as_matrix() @ top.basis  # the sketch is orthogonal here: its transpose is its inverse
        lam = top.values
        S = jnp.eye(128) / 0.5 - U @ jnp.diag(lam / (0.5 * (lam + 0.5))) @ U.T
    else:
        S = cov.as_matrix()
    ref = jnp.einsum("mop,pq,moq->mo", J, S, J).reshape(var.shape)
    assert var.shape == mean.shape == (2, 8, 256)
    assert float(ref.max()) > 1e-3
    assert_close(var, ref, rtol=1e-8, atol=1e-12)


def test_an_exact_ggn_over_many_outputs_per_example_says_what_it_costs():
    """1,600 outputs per example (8 positions x 200 classes): the exact GGN's reverse passes are counted in a
    warning naming the unbiased alternative; the Monte-Carlo Fisher takes num_samples passes and says nothing."""
    X = draws.normal(jax.random.key(0), (2, 8, 3))
    Y = jax.random.randint(jax.random.key(1), (2, 8), 0, 200)
    fn = lambda w, x: x @ w  # noqa: E731
    w = 0.1 * jnp.ones((3, 200))
    with pytest.warns(UserWarning, match=r"laplace: the exact GGN takes 1,600 reverse passes per example \(3,200 in "
                                         r"all\) .* use curvature='fisher'"):
        pst.laplace(fn, w, (X, Y), Categorical(), structure="diag")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pst.laplace(fn, w, (X, Y), Categorical(), structure="diag", curvature="fisher", key=jax.random.key(2))


def test_a_posterior_with_a_position_axis_saves_and_loads(tmp_path):
    fn, params, X, Y = _tanh_seq()
    post = pst.laplace(fn, params, (X, Y), Categorical(), structure="kfac", prior_precision=0.7)
    pst.save(post, tmp_path / "post.npz")
    loaded = pst.load(tmp_path / "post.npz", post)
    assert isinstance(loaded.fn, Flattened) and loaded.likelihood == post.likelihood
    assert_close(pst.predictive.classification(loaded, X[:2]), pst.predictive.classification(post, X[:2]))
