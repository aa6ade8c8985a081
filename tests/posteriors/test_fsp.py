"""FSP-Laplace against a dense implementation of algorithm 2, its truncation invariant, the
training objective against its formula, dtype agreement and bad input."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
import posteriors as pst
from linops.kernels import RBF, Matern12, Matern52, Periodic, fit_gp
from linops.likelihoods import Categorical, Gaussian
from linops.models import ravel
from posteriors import fsp
from tests import _draws as draws

from ..linops._util import assert_close


def _mlp(widths, key, dtype=jnp.float64):
    keys = jax.random.split(key, len(widths) - 1)
    return [
        {"W": draws.normal(k, (a, b), dtype) / np.sqrt(a), "b": 0.1 * draws.normal(k, (b,), dtype)}
        for k, a, b in zip(keys, widths[:-1], widths[1:], strict=True)
    ]


def _fn(params, x):
    h = x
    for layer in params[:-1]:
        h = jnp.tanh(h @ layer["W"] + layer["b"])
    return h @ params[-1]["W"] + params[-1]["b"]


def _toy(n=8, d=1, outputs=1, seed=0, dtype=jnp.float64):
    key = jax.random.key(seed)
    params = _mlp([d, 5, outputs], key, dtype)
    X = draws.uniform(jax.random.fold_in(key, 1), (n, d), dtype, -1.0, 1.0)
    Y = jnp.sin(3 * X[:, :1]) if outputs == 1 else jnp.asarray(np.arange(n) % outputs)
    return params, X, Y


def _dense_algorithm2(params, X, Y, C, kernel, likelihood, L, rtol):
    """Algorithm 2 with dense matrices, from a given factor L (L L^T ~ K_CC^+)."""
    flat, unravel = ravel(params)
    jac = lambda inputs: jax.jacfwd(lambda w: jax.vmap(_fn, in_axes=(None, 0))(unravel(w), inputs).reshape(-1))(flat)  # noqa: E731
    JC, JX = np.asarray(jac(C)), np.asarray(jac(X))
    out = jax.vmap(_fn, in_axes=(None, 0))(params, X)
    H = np.zeros((JX.shape[0], JX.shape[0]))
    k = out.shape[1]
    for i in range(X.shape[0]):
        Hi = np.asarray(lo.likelihoods.Categorical().hessian(out[i], Y[i]).as_matrix()) if isinstance(
            likelihood, Categorical) else np.eye(k) / float(likelihood.sigma) ** 2
        H[i * k:(i + 1) * k, i * k:(i + 1) * k] = Hi
    G = JX.T @ H @ JX
    M = JC.T @ np.asarray(L)
    U, D, _ = np.linalg.svd(M, full_matrices=False)  # M's singular values (not M M^T's eigenvalues: squaring
    keep = D > rtol * D.max()                          # would bury those below sqrt(eps) in rounding)
    U_M, D2 = U[:, keep], D[keep] ** 2
    A = np.diag(D2) + U_M.T @ G @ U_M  # positive definite: inverted exactly, no cut-off
    D_A, U_A = np.linalg.eigh(A)
    inv = 1.0 / D_A
    S = U_M @ U_A * np.sqrt(inv)[None, :]
    prior_var = np.diag(np.asarray(kernel(C)))
    JS2 = (JC @ S) ** 2
    for k in range(S.shape[1] + 1):
        if np.all(JS2[:, k:].sum(axis=1) <= prior_var * (1 + 1e-12)):
            break
    return S[:, k:] @ S[:, k:].T, k


@pytest.mark.parametrize("rank", [12, pytest.param(8, marks=pytest.mark.slow)])
def test_matches_a_dense_implementation_of_algorithm_2(rank):
    """rank = n_C: the exact K^-1 (Lanczos on a well-conditioned Gram spans everything);
    rank 8: an incomplete Krylov space, where the variance truncation has work to do."""
    params, X, Y = _toy()
    C = jnp.linspace(-2.0, 2.0, 12)[:, None]
    kernel, lik, rtol = Matern12(0.5), Gaussian(0.2), 1e-10
    post = pst.fsp_laplace(_fn, params, (X, Y), kernel, C, likelihood=lik, rank=rank, rtol=rtol)
    v0 = lo.JacobianOp(_fn, params, C) @ jnp.ones(ravel(params)[0].shape[0])
    run = lo.lanczos(lo.KernelGramOp(kernel, C), rank, v0=v0)
    if rank == 12:
        K = np.asarray(kernel(C))
        assert_close(run.pinv_factor(rtol) @ run.pinv_factor(rtol).T, np.linalg.inv(K), rtol=1e-8)
    cov, k = _dense_algorithm2(params, X, Y, C, kernel, lik, run.pinv_factor(rtol), rtol)
    assert int(post.info.truncated) == k
    if rank == 8:
        assert k > 0, "this case is meant to exercise the truncation"
    _assert_same_posterior(post, cov, C)


def _assert_same_posterior(post, cov, C):
    # The covariance has weakly determined directions (entries ~1e5 here): compare it relative to
    # its largest entry, and the well-conditioned predictive covariance at the context points tightly.
    assert_close(post.covariance.as_matrix(), cov, rtol=1e-6, atol=1e-8)
    JC = np.asarray(lo.JacobianOp(_fn, post.params, C).as_matrix())
    assert_close(post.predictive_covariance(C).as_matrix(), JC @ cov @ JC.T, rtol=1e-6, atol=1e-7)


def test_multi_output_classification_matches_the_dense_kronecker_prior():
    params, X, Y = _toy(n=10, d=2, outputs=2, seed=3)
    C = draws.uniform(jax.random.key(4), (8, 2), jnp.float64, -2.0, 2.0)
    kernel, rtol = Matern12(1.0), 1e-10
    post = pst.fsp_laplace(_fn, params, (X, Y), kernel, C, likelihood=Categorical(), rtol=rtol)
    K2 = lo.kernels.Independent(kernel, num_outputs=2)
    assert_close(K2(C), np.kron(np.asarray(kernel(C)), np.eye(2)))  # example-major, like J's rows
    v0 = lo.JacobianOp(_fn, params, C) @ jnp.ones(ravel(params)[0].shape[0])
    run = lo.lanczos(lo.KernelGramOp(K2, C), 16, v0=v0)
    cov, k = _dense_algorithm2(params, X, Y, C, K2, Categorical(), run.pinv_factor(rtol), rtol)
    assert int(post.info.truncated) == k
    _assert_same_posterior(post, cov, C)


def test_products_in_blocks_of_columns_and_examples_give_the_dense_posterior(monkeypatch):
    """With a budget of one number, every product with the rank columns runs one example per batch and a few
    columns per block (and a shorter last block): the posterior is still the dense one."""
    monkeypatch.setattr(fsp, "_BUDGET", 1)
    params, X, Y = _toy()
    C = jnp.linspace(-2.0, 2.0, 12)[:, None]
    kernel, lik, rtol, rank = Matern12(0.5), Gaussian(0.2), 1e-10, 11
    batch, columns, context_batch, context_columns = fsp._products_plan(_fn, params, X, C, rank, None, None)
    assert batch == context_batch == 1 and 1 < columns < rank and rank % columns and context_columns == columns
    post = pst.fsp_laplace(_fn, params, (X, Y), kernel, C, likelihood=lik, rank=rank, rtol=rtol, progress=False)
    v0 = lo.JacobianOp(_fn, params, C) @ jnp.ones(ravel(params)[0].shape[0])
    run = lo.lanczos(lo.KernelGramOp(kernel, C), rank, v0=v0)
    cov, k = _dense_algorithm2(params, X, Y, C, kernel, lik, run.pinv_factor(rtol), rtol)
    assert int(post.info.truncated) == k > 0
    _assert_same_posterior(post, cov, C)


def test_the_laplace_step_holds_its_factors_not_a_batch_of_activations_per_rank_column():
    """XLA's memory analysis of the compiled step (compiled, not run): 4,000 examples of a 512-512 tanh MLP at
    rank 200 reserved 5.2 GB of temporaries with every rank column in one product, 23 times the step's own
    (P, rank) factors; planned, a few times those factors."""
    n, d, h, o, rank = 4000, 32, 512, 10, 200
    keys = jax.random.split(jax.random.key(0), 5)
    params = {"a": draws.normal(keys[0], (d, h), jnp.float32) / 8,
              "b": draws.normal(keys[1], (h, h), jnp.float32) / 32,
              "c": draws.normal(keys[2], (h, o), jnp.float32) / 32}
    fn = lambda w, x: jnp.tanh(jnp.tanh(x @ w["a"]) @ w["b"]) @ w["c"]  # noqa: E731
    X = draws.normal(keys[3], (n, d), jnp.float32)
    Y, C = jnp.zeros(n, jnp.int32), draws.normal(keys[4], (50, d), jnp.float32)
    kernel = lo.kernels.Independent(RBF(), num_outputs=o)
    factors = ravel(params)[0].shape[0] * rank * 4  # bytes of one (P, rank) float32 factor

    def temporaries(plan):
        step = eqx.filter_jit(fsp._algorithm2.__wrapped__)
        lowered = step.lower(fn, params, X, Y, C, kernel, Categorical(), rank, plan, 1e-6, None, None)
        return lowered.compile().compiled.memory_analysis().temp_size_in_bytes

    planned = fsp._products_plan(fn, params, X, C, rank, None, None)
    assert planned[1] < rank, "this case is meant to need blocks of columns"
    assert temporaries(planned) <= 6 * factors
    assert temporaries((n, rank, 50, rank)) > 6 * factors  # all columns at once: the check can fail


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_posterior_variance_never_exceeds_the_prior_variance_at_a_context_point(dtype):
    params, X, Y = _toy(n=20, seed=5, dtype=dtype)
    C = jnp.linspace(-3.0, 3.0, 40, dtype=dtype)[:, None]
    kernel = RBF(0.4, 2.0)
    post = pst.fsp_laplace(_fn, params, (X, Y), kernel, C, likelihood=Gaussian(0.1), rank=40)
    _, var = post.predictive(C)
    prior = np.asarray(kernel.diag(C))[:, None]
    eps = float(np.finfo(dtype).eps)
    assert np.all(np.asarray(var) <= prior * (1 + 100 * eps))
    assert float(post.info.max_variance_ratio) <= 1 + 100 * eps
    assert np.all(np.asarray(post.d)[: int(post.info.truncated)] == 0)  # (minimality: the dense test)


def _relative_singular_values_of_m(params, C, kernel):
    """$M = J(C)^T L$'s singular values over the largest, in float64, as `fsp_laplace` forms M (rtol 1e-6)."""
    J = lo.JacobianOp(_fn, params, C)
    run = lo.lanczos(lo.KernelGramOp(kernel, C), min(500, C.shape[0]), v0=J @ jnp.ones(J.shape[1]), restart=True)
    D = np.linalg.svd(np.asarray(J.T @ run.pinv_factor(1e-6)), compute_uv=False)
    return D / D[0]


# Float32 resolves a singular value D of M near the cut-off to eps / (D / D_max), so the variance 1 / D² of its
# direction to twice that: at the 1e-6 cut-off, 2 eps / 1e-6 = 0.24 of the largest variance.
_F32_VARIANCE_RESOLUTION = 2 * float(np.finfo(np.float32).eps) / 1e-6


@pytest.mark.parametrize("num_context,kernel", [(30, Matern52(0.6)),
                                                (pytest.param(300, RBF(0.3), marks=pytest.mark.slow))])  # 4 s
def test_float32_keeps_the_directions_float64_keeps_and_agrees_on_the_variances(num_context, kernel):
    """The default cut-off (1e-6 in both dtypes) keeps in float32 every direction float64 keeps clearly above it
    (a dropped direction gets zero variance), the variances agree to float32's resolution at the cut-off, and the
    posterior variance stays below the prior's at the context points.

    The largest variances are those of the least-determined directions (small singular values of M), which float32
    resolves only to about eps / (D / D_max), their variances to twice that: at the cut-off, 0.24 of the largest.
    Measured (largest variance error, float32 against float64, with XLA's back end at optimisation levels 0 / 1 /
    2 / 3, 3 being JAX's default): 1.8e-2 / 5.5e-2 / 5.5e-2 / 3.2e-2 at 30 context points and 0.17 / 9.0e-2 /
    9.0e-2 / 7.0e-2 at 300. (Tolerances of 5e-2 and 1e-1 set from the level-3 measurement alone failed at the
    other levels, which round as legitimately.) Float32's rounding also lifts a few singular values from below the
    cut-off above it (13 directions against float64's 12 at 30 points, 14 at 300): kept, they add variance,
    bounded at the context points by the truncation step. The previous default, n_C O eps (float32's worst-case
    rounding), made the ranks equal at 30 context points but dropped a direction float64 keeps from 100 on: 10 of
    12 at 300, with a variance error of 0.77 of the largest (and on the weekly Mauna Loa record, 10 of 43
    directions, test log-likelihood -49.5 per week against -6.2)."""
    p64, X, Y = _toy(n=20, seed=6)
    C = jnp.linspace(-2.0, 2.0, num_context)[:, None]
    T = jnp.linspace(-2.5, 2.5, 25)[:, None]
    lik = Gaussian(0.1)
    var, rank = {}, {}
    p32 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), p64)
    for dtype, params in ((jnp.float64, p64), (jnp.float32, p32)):
        post = pst.fsp_laplace(_fn, params, (X.astype(dtype), Y.astype(dtype)), kernel, C.astype(dtype),
                               likelihood=lik)
        var[dtype] = np.asarray(post.predictive(T.astype(dtype))[1])
        rank[dtype] = int(post.info.rank)
        at_context = np.asarray(post.predictive(C.astype(dtype))[1])
        assert np.all(at_context <= np.asarray(kernel.diag(C))[:, None] * (1 + 100 * np.finfo(dtype).eps))
    D = _relative_singular_values_of_m(p64, C, kernel)
    assert rank[jnp.float64] == np.sum(D > 1e-6)  # the default cut-off, 1e-6
    assert rank[jnp.float32] >= np.sum(D > 1e-5)  # every direction clearly above it
    np.testing.assert_allclose(var[jnp.float32], var[jnp.float64],
                               atol=_F32_VARIANCE_RESOLUTION * np.max(var[jnp.float64]))


def test_objective_is_the_scaled_nll_plus_the_rkhs_norm():
    params, X, Y = _toy(n=12, seed=7)
    C = jnp.linspace(-1.5, 1.5, 7)[:, None]
    kernel, lik = RBF(0.7, 1.5), Gaussian(0.3)
    obj = pst.fsp_objective(_fn, pst.GPPrior(kernel, mean=lambda x: jnp.array([0.2])), lik, num_data=48,
                            context=C, jitter=0.0)
    Xb, Yb = X[:4], Y[:4]
    f = np.asarray(jax.vmap(_fn, in_axes=(None, 0))(params, Xb))
    nll = np.sum(0.5 * ((f - np.asarray(Yb)) / 0.3) ** 2 + np.log(0.3) + 0.5 * np.log(2 * np.pi))
    r = np.asarray(jax.vmap(_fn, in_axes=(None, 0))(params, C))[:, 0] - 0.2
    expected = 48 / 4 * nll + 0.5 * r @ np.linalg.solve(np.asarray(kernel(C)), r)
    assert_close(obj(params, (Xb, Yb)), expected, rtol=1e-10)
    # fresh context points at every step: different keys, different values; the same key, the same value
    drawn = pst.fsp_objective(_fn, kernel, lik, num_data=48, context=lambda key: pst.context.uniform(key, X, 7))
    a, b = drawn(params, (Xb, Yb), jax.random.key(0)), drawn(params, (Xb, Yb), jax.random.key(1))
    assert float(a) != float(b) and float(a) == float(drawn(params, (Xb, Yb), jax.random.key(0)))
    grads = jax.jit(jax.grad(drawn))(params, (Xb, Yb), jax.random.key(0))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))


def test_image_shaped_inputs_are_the_flattened_inputs_to_the_kernel():
    """Inputs of any shape (n, ...): the network sees them as given, the kernel and the prior mean flattened. The
    same data as (n, 2, 3) arrays with a network that flattens them gives the posterior, the RKHS norm, the
    training objective and the prior moments of the same data as (n, 6) rows."""
    params, X, Y = _toy(n=10, d=6, seed=5)
    C = draws.uniform(jax.random.key(6), (12, 6), jnp.float64, -2.0, 2.0)
    images, C_images = X.reshape(10, 2, 3), C.reshape(12, 2, 3)
    fn_img = lambda p, x: _fn(p, x.reshape(-1))  # noqa: E731
    prior = pst.GPPrior(RBF(1.5), mean=lambda x: jnp.array([0.1 * x[0]]))
    flat = pst.fsp_laplace(_fn, params, (X, Y), prior, C, likelihood=Gaussian(0.1), progress=False)
    img = pst.fsp_laplace(fn_img, params, (images, Y), prior, C_images, likelihood=Gaussian(0.1), progress=False)
    assert_close(img.covariance.as_matrix(), flat.covariance.as_matrix(), atol=1e-10)
    assert int(img.info.rank) == int(flat.info.rank) > 0
    for a, b in zip(img.predictive(C_images), flat.predictive(C), strict=True):
        assert_close(a, b, atol=1e-10)
    assert_close(img.prior_variance(C_images), flat.prior_variance(C))
    assert_close(img.prior_mean(C_images), 0.1 * C[:, :1])
    assert float(pst.rkhs_norm(_fn, params, prior, C)) > 0.0
    assert_close(pst.rkhs_norm(fn_img, params, prior, C_images), pst.rkhs_norm(_fn, params, prior, C))
    objectives = [pst.fsp_objective(f, prior, Gaussian(0.1), num_data=10, context=c)
                  for f, c in ((_fn, C), (fn_img, C_images))]
    assert_close(objectives[1](params, (images, Y)), objectives[0](params, (X, Y)))
    with pytest.raises(ValueError, match=r"fsp_laplace: inputs must be \(n, d\) or \(n, ...\) with n >= 1.*\(12,\)"):
        pst.fsp_laplace(_fn, params, (X, Y), prior, C[:, 0], likelihood=Gaussian(0.1))


def test_bad_input_is_refused_with_a_clear_error():
    params, X, Y = _toy()
    C = jnp.linspace(-2.0, 2.0, 5)[:, None]
    with pytest.raises(ValueError, match=r"rank 8 needs at least that many context outputs.*5 context points x 1"):
        pst.fsp_laplace(_fn, params, (X, Y), RBF(), C, likelihood=Gaussian(0.1), rank=8)
    with pytest.raises(ValueError, match="2 lengthscales for inputs of dimension 1"):
        pst.fsp_laplace(_fn, params, (X, Y), RBF(jnp.array([1.0, 2.0])), C, likelihood=Gaussian(0.1))
    with pytest.raises(ValueError, match=r"fsp_laplace: batch_size must be an integer >= 1, got 2.5"):
        pst.fsp_laplace(_fn, params, (X, Y), RBF(), C, likelihood=Gaussian(0.1), batch_size=2.5)
    with pytest.raises(ValueError, match=r"fsp_laplace: context_batch_size must be an integer >= 1, got 0"):
        pst.fsp_laplace(_fn, params, (X, Y), RBF(), C, likelihood=Gaussian(0.1), context_batch_size=0)
    with pytest.raises(ValueError, match="lengthscale must be positive"):
        RBF(-1.0)
    with pytest.raises(ValueError, match="fn\\(params, x\\) fails on the first input"):
        pst.fsp_laplace(_fn, params, (X, Y), RBF(), jnp.ones((5, 3)), likelihood=Gaussian(0.1))
    with pytest.raises(ValueError, match="the prior kernel has 3 outputs but the network has 1"):
        pst.fsp_laplace(_fn, params, (X, Y), lo.kernels.Independent(RBF(), num_outputs=3), C,
                        likelihood=Gaussian(0.1))
    with pytest.raises(ValueError, match="data must be an \\(inputs, targets\\) pair"):
        pst.fsp_laplace(_fn, params, X, RBF(), C, likelihood=Gaussian(0.1))
    with pytest.raises(TypeError, match="prior must be a GPPrior or a linops.kernels.Kernel"):
        pst.fsp_laplace(_fn, params, (X, Y), "rbf", C, likelihood=Gaussian(0.1))
    obj = pst.fsp_objective(_fn, RBF(), Gaussian(0.1), num_data=8, context=lambda key: C)
    with pytest.raises(ValueError, match="pass key="):
        obj(params, (X, Y))
    with pytest.raises(ValueError, match="num_data must be a positive integer"):
        pst.fsp_objective(_fn, RBF(), Gaussian(0.1), num_data=0, context=C)


# --- the paper's qualitative claims, on its 1-D problem (sin(2 pi x), data on [-1,-.5] U [.5,1]) ---


def _paper_1d(n=60, seed=0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    side = jnp.where(jax.random.bernoulli(k2, 0.5, (n,)), 1.0, -1.0)
    X = (draws.uniform(k1, (n,), jnp.float64, 0.5, 1.0) * side)[:, None]
    return X, jnp.sin(2 * jnp.pi * X) + 0.1 * draws.normal(k3, (n, 1), jnp.float64)


def _train(objective, X, Y, steps=6000, seed=1):
    """Adam on the paper's 2 x 50 tanh MLP (an Equinox model), one jitted scan."""
    import equinox as eqx
    import optax

    from linops.models import from_equinox

    fn, params = from_equinox(eqx.nn.MLP(1, 1, 50, 2, activation=jnp.tanh, key=jax.random.key(seed),
                                         dtype=jnp.float64))
    opt = optax.adam(3e-3)

    @jax.jit
    def run(params):
        def step(carry, key):
            p, state = carry
            grads = jax.grad(objective(fn))(p, (X, Y), key)
            updates, state = opt.update(grads, state, p)
            return (optax.apply_updates(p, updates), state), None

        return jax.lax.scan(step, (params, opt.init(params)), jax.random.split(jax.random.key(2), steps))[0][0]

    return fn, run(params)


def _fsp_trained(prior, X, Y):
    def objective(fn):
        return pst.fsp_objective(fn, prior, Gaussian(0.1), num_data=X.shape[0],
                                 context=lambda key: pst.context.uniform(key, X, 100))

    fn, params = _train(objective, X, Y)
    return pst.fsp_laplace(fn, params, (X, Y), prior, pst.context.grid(X, 100), likelihood=Gaussian(0.1))


@pytest.mark.slow
def test_away_from_the_data_the_mean_moves_to_the_prior_mean_and_the_variance_grows():
    """At the edges of the context box (x = +-2, about 4 lengthscales from the data) the FSP
    network sits near the prior mean 0.5 where a network trained on the likelihood alone
    extrapolates far away (measured with a smaller network and 3,000 steps: 0.6-0.8 from the
    prior mean against 2.8-4.8, three seeds; training does not bring it all the way); the
    variance there is a large fraction of the prior's, and on the training data a small one."""
    X, Y = _paper_1d()
    prior = pst.GPPrior(RBF(0.23, 0.63), mean=lambda x: jnp.array([0.5]))  # fit_gp's RBF on these data
    post = _fsp_trained(prior, X, Y)
    far = jnp.array([[-2.0], [-1.9], [1.9], [2.0]])
    def nll(fn):  # the likelihood alone
        return lambda p, batch, key: jnp.sum(jax.vmap(Gaussian(0.1).nll)(jax.vmap(fn, in_axes=(None, 0))(p, batch[0]),
                                                                         batch[1]))

    fn, params = _train(nll, X, Y)
    plain = jax.vmap(fn, in_axes=(None, 0))(params, far)
    mean, var = post.predictive(far)
    assert float(jnp.max(jnp.abs(mean - 0.5))) < 0.35 * float(jnp.max(jnp.abs(plain - 0.5))), (mean, plain)
    assert np.all(np.asarray(var) > 0.3 * np.asarray(post.prior_variance(far))), var
    _, train_var = post.predictive(X)
    assert np.all(np.asarray(train_var) < 0.05 * np.asarray(post.prior_variance(X)))


@pytest.mark.slow
def test_a_periodic_prior_extrapolates_periodically_and_an_rbf_prior_does_not():
    X, Y = _paper_1d()
    gap = jnp.linspace(-0.35, 0.35, 15)[:, None]  # no data here
    rmse = {}
    for name, start in (("periodic", Periodic(1.0, 1.0, 1.0)), ("rbf", RBF(0.3, 1.0))):
        kernel = fit_gp(start, X, Y[:, 0], noise_variance=0.01, num_steps=300).kernel  # as the paper sets priors
        mean, _ = _fsp_trained(kernel, X, Y).predictive(gap)
        rmse[name] = float(jnp.sqrt(jnp.mean((mean - jnp.sin(2 * jnp.pi * gap)) ** 2)))
    assert rmse["periodic"] < 0.15 and rmse["rbf"] > 0.3, rmse


def test_context_points_far_apart_need_lanczos_restarts_and_still_match_the_exact_inverse():
    """A lengthscale much shorter than the context spacing makes K_CC nearly cI: Lanczos from
    J(C) 1 alone sees a one-dimensional Krylov space; with restarts it recovers K^-1."""
    params, X, Y = _toy()
    C = jnp.linspace(-3.0, 3.0, 10)[:, None]  # spacing 0.67, lengthscale 0.05
    kernel, lik, rtol = RBF(0.05, 0.7), Gaussian(0.2), 1e-10
    post = pst.fsp_laplace(_fn, params, (X, Y), kernel, C, likelihood=lik, rtol=rtol)
    assert int(post.info.lanczos_restarts) > 0 and int(post.info.lanczos_steps) == 10
    K = np.asarray(kernel(C))
    cov, k = _dense_algorithm2(params, X, Y, C, kernel, lik, np.linalg.cholesky(np.linalg.inv(K)), rtol)
    assert int(post.info.truncated) == k
    _assert_same_posterior(post, cov, C)
