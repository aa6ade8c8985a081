"""JacobianOp, GGNOp, LossJacobianOp and likelihoods against dense jacfwd / hessian references."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
from linops.likelihoods import Bernoulli, Categorical, Gaussian
from linops.models import from_equinox, per_example, ravel
from tests import _draws as draws

from ._util import assert_close

N, D_IN, WIDTH, O = 7, 3, 5, 3  # noqa: E741 (O: outputs, as in the design notes)


def _mlp(depth, act):
    def fn(p, x):
        h = x
        for i in range(depth):
            h = act(p[f"W{i}"] @ h + p[f"b{i}"])
        return p["Wout"] @ h + p["bout"]

    return fn


def _params(seed, depth, out=O):
    rng = np.random.default_rng(seed)
    p, d = {}, D_IN
    for i in range(depth):
        p[f"W{i}"] = jnp.asarray(rng.standard_normal((WIDTH, d)) / np.sqrt(d))
        p[f"b{i}"] = jnp.asarray(0.1 * rng.standard_normal(WIDTH))
        d = WIDTH
    p["Wout"] = jnp.asarray(rng.standard_normal((out, d)) / np.sqrt(d))
    p["bout"] = jnp.asarray(0.1 * rng.standard_normal(out))
    return p


def _inputs(seed, n=N):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((n, D_IN)))


def _dense_jacobian(fn, params, X):
    flat, unravel = ravel(params)
    return np.asarray(jax.jacfwd(lambda v: jax.vmap(fn, (None, 0))(unravel(v), X).reshape(-1))(flat))


def _per_example_lik(lik, n):
    if isinstance(lik, Gaussian) and lik.heteroscedastic:
        return Gaussian(lik.sigma[n])
    return lik


@jax.jit
def _dense_hessians(lik, F, Y):
    """Per-example output Hessians by autodiff of the nll (the slow obvious way)."""
    if isinstance(lik, Gaussian) and lik.heteroscedastic:
        return jax.vmap(lambda f, y, s: jax.hessian(lambda f: Gaussian(s).nll(f, y))(f))(F, Y, lik.sigma)
    return jax.vmap(lambda f, y: jax.hessian(lambda f: lik.nll(f, y))(f))(F, Y)


def _dense_ggn(fn, params, X, Y, lik):
    J = _dense_jacobian(fn, params, X).reshape(X.shape[0], -1, ravel(params)[0].shape[0])
    H = np.asarray(_dense_hessians(lik, jax.vmap(fn, (None, 0))(params, X), Y))
    return np.einsum("nop,noq,nqr->pr", J, H, J)


CASES = {
    "gaussian": (lambda rng: Gaussian(0.7), lambda rng: rng.standard_normal((N, O))),
    "gaussian_per_output": (lambda rng: Gaussian(jnp.array([0.5, 1.0, 2.0])), lambda rng: rng.standard_normal((N, O))),
    "gaussian_heteroscedastic": (
        lambda rng: Gaussian(jnp.asarray(0.5 + rng.random(N)), heteroscedastic=True),
        lambda rng: rng.standard_normal((N, O)),
    ),
    "gaussian_heteroscedastic_per_output": (
        lambda rng: Gaussian(jnp.asarray(0.5 + rng.random((N, O))), heteroscedastic=True),
        lambda rng: rng.standard_normal((N, O)),
    ),
    "categorical": (lambda rng: Categorical(), lambda rng: rng.integers(0, O, N)),
    "bernoulli": (lambda rng: Bernoulli(), lambda rng: rng.integers(0, 2, (N, O)).astype(float)),
}


@pytest.mark.parametrize(
    "depth, act, batch_size", [(1, jnp.tanh, 1), (1, jnp.tanh, None), (2, jax.nn.relu, 3), (2, jnp.tanh, N)]
)
def test_jacobian_matches_jacfwd(depth, act, batch_size):
    fn, params, X = _mlp(depth, act), _params(0, depth), _inputs(1)
    J = lo.JacobianOp(fn, params, X, batch_size=batch_size)
    ref = _dense_jacobian(fn, params, X)
    assert J.shape == ref.shape
    v = jnp.linspace(-1.0, 1.0, J.shape[1])
    u = jnp.cos(jnp.arange(J.shape[0], dtype=jnp.float64))
    assert_close(J @ v, ref @ np.asarray(v))
    assert_close(J.T @ u, ref.T @ np.asarray(u))
    assert_close(J.as_matrix(), ref)
    assert_close(J.example(4).as_matrix(), ref[4 * O : 5 * O])


def test_jacobian_restricted_to_a_parameter_subset():
    fn, params, X = _mlp(1, jnp.tanh), _params(2, 1), _inputs(3)
    J = lo.JacobianOp(fn, params, X, batch_size=2)
    idx = jnp.array([0, 5, 7, 20])
    E = lo.Selection(idx, J.shape[1]).T
    ref = _dense_jacobian(fn, params, X)[:, np.asarray(idx)]
    assert_close((J @ E).as_matrix(), ref)
    assert_close((J @ E).T.as_matrix(), ref.T)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("batch_size", [3, None])
def test_ggn_matches_the_dense_reference(case, batch_size):
    rng = np.random.default_rng(4)
    make_lik, make_y = CASES[case]
    lik, Y = make_lik(rng), jnp.asarray(make_y(rng))
    fn, params, X = _mlp(2, jnp.tanh), _params(5, 2), _inputs(6)
    G = lo.GGNOp(fn, params, X, Y, lik, batch_size=batch_size)  # N = 7: a short last batch of 1
    ref = _dense_ggn(fn, params, X, Y, lik)
    assert "psd" in G.tags and "symmetric" in G.tags
    dense = jax.jit(lambda G: G.as_matrix())(G)
    assert_close(dense, ref, rtol=1e-9)
    assert_close(jax.jit(lo.diag)(G), np.diag(ref), rtol=1e-9)
    v = jnp.linspace(-1.0, 1.0, G.shape[0])
    assert_close(G @ v, ref @ np.asarray(v), rtol=1e-9)
    V = jnp.stack([v, v**2], axis=1)
    assert_close(jax.jit(jax.vmap(lambda G, c: G @ c, in_axes=(None, 1), out_axes=1))(G, V), ref @ np.asarray(V),
                 rtol=1e-9)
    assert np.linalg.eigvalsh(np.asarray(dense)).min() > -1e-10 * np.abs(ref).max()


def test_ggn_does_not_drop_the_last_batch():
    """The reference projected-Bayes code drops the short last batch; here it counts."""
    rng = np.random.default_rng(7)
    fn, params, X = _mlp(1, jnp.tanh), _params(8, 1), _inputs(9)
    Y = jnp.asarray(rng.standard_normal((N, O)))
    dense = jax.jit(lambda G: G.as_matrix())
    full = dense(lo.GGNOp(fn, params, X, Y, Gaussian(1.0), batch_size=N))
    for b in (2, 4, 5):
        assert_close(dense(lo.GGNOp(fn, params, X, Y, Gaussian(1.0), batch_size=b)), full, rtol=1e-10)
    dropped = dense(lo.GGNOp(fn, params, X[:6], Y[:6], Gaussian(1.0)))
    assert np.abs(np.asarray(full - dropped)).max() > 1e-3


def test_linear_gaussian_ggn_is_exact():
    """Bayesian linear regression: G = X^T X / sigma^2 exactly, and the Laplace posterior is exact."""
    rng = np.random.default_rng(10)
    X = rng.standard_normal((9, 4))
    fn = lambda w, x: (x @ w)[None]  # noqa: E731
    G = lo.GGNOp(fn, jnp.zeros(4), jnp.asarray(X), jnp.zeros((9, 1)), Gaussian(0.5), batch_size=4)
    assert_close(G.as_matrix(), X.T @ X / 0.25, rtol=1e-12)
    alpha = 2.0
    posterior_cov = lo.inv(lo.shift(G, alpha), method="cg", rtol=1e-12)
    assert_close(posterior_cov @ jnp.ones(4), np.linalg.solve(X.T @ X / 0.25 + alpha * np.eye(4), np.ones(4)),
                 rtol=1e-8)


@pytest.mark.parametrize("case", ["gaussian", "categorical", "bernoulli", "gaussian_heteroscedastic"])
def test_loss_jacobian_matches_the_dense_reference(case):
    rng = np.random.default_rng(11)
    make_lik, make_y = CASES[case]
    lik, Y = make_lik(rng), jnp.asarray(make_y(rng))
    fn, params, X = _mlp(1, jnp.tanh), _params(12, 1), _inputs(13)
    JL = lo.LossJacobianOp(fn, params, X, Y, lik, batch_size=3)
    flat, unravel = ravel(params)
    rows = []
    for n in range(N):
        ln = _per_example_lik(lik, n)
        rows.append(jax.grad(lambda v, ln=ln, n=n: ln.nll(fn(unravel(v), X[n]), Y[n]))(flat))
    ref = np.stack(rows)
    assert JL.shape == (N, flat.shape[0])
    assert_close(JL.as_matrix(), ref)
    assert_close(JL.T.as_matrix(), ref.T)


def test_likelihood_closed_forms_match_autodiff():
    rng = np.random.default_rng(14)
    f = jnp.asarray(rng.standard_normal(O))
    u = jnp.asarray(rng.standard_normal(O))
    for lik, y in [(Gaussian(jnp.array([0.5, 1.0, 2.0])), jnp.asarray(rng.standard_normal(O))),
                   (Categorical(), jnp.asarray(1)),
                   (Bernoulli(), jnp.array([1.0, 0.0, 1.0]))]:
        H = jax.hessian(lambda f, lik=lik, y=y: lik.nll(f, y))(f)
        assert_close(lik.grad(f, y), jax.grad(lambda f, lik=lik, y=y: lik.nll(f, y))(f))
        assert_close(lik.hvp(f, y, u), H @ u)
        assert_close(lik.hessian(f, y).as_matrix(), H)
        A = lik.hessian_factor(f, y)
        assert_close(A.T @ A, H)
        assert "psd" in lik.hessian(f, y).tags
    # normalising constants: the Gaussian nll is the full negative log density
    g = Gaussian(0.3)
    assert_close(g.nll(jnp.array([0.2]), jnp.array([0.5])),
                 -jax.scipy.stats.norm.logpdf(0.5, 0.2, 0.3))


def test_equinox_adapter_and_per_example_helper():
    model = eqx.nn.MLP(D_IN, O, 4, 2, activation=jnp.tanh, key=jax.random.key(0))
    model = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, model)
    fn, params = from_equinox(model)
    X = _inputs(15)
    J = lo.JacobianOp(fn, params, X, batch_size=4)
    assert_close(J.as_matrix(), _dense_jacobian(fn, params, X))
    batched = lambda p, X: jax.vmap(model)(X)  # noqa: E731
    assert_close(per_example(batched)(params, X[2]), model(X[2]))


def test_bad_input_names_what_is_wrong():
    fn, params, X = _mlp(1, jnp.tanh), _params(16, 1), _inputs(17)
    Y = jnp.zeros((N, O))
    with pytest.raises(ValueError, match="GGNOp: inputs has 7 examples but targets has 6"):
        lo.GGNOp(fn, params, X, Y[:6], Gaussian(1.0))
    with pytest.raises(ValueError, match=r"GGNOp: a Gaussian likelihood needs targets of shape \(7, 3\), got \(7,\)"):
        lo.GGNOp(fn, params, X, jnp.zeros(N), Gaussian(1.0))
    with pytest.raises(ValueError, match=r"LossJacobianOp: a Categorical likelihood needs integer class labels"):
        lo.LossJacobianOp(fn, params, X, jnp.zeros(N), Categorical())
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        lo.GGNOp(fn, params, X, jnp.full(N, 3), Categorical())
    bad = jnp.full(N, 3)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):  # built under jit, labels closed over
        jax.jit(lambda v: lo.GGNOp(fn, params, X, bad, Categorical()) @ v)(ravel(params)[0])
    good = jnp.arange(N) % O
    v = jnp.linspace(-1.0, 1.0, ravel(params)[0].shape[0])
    assert_close(jax.jit(lambda v: lo.GGNOp(fn, params, X, good, Categorical()) @ v)(v),
                 lo.GGNOp(fn, params, X, good, Categorical()) @ v)
    with pytest.raises(ValueError, match="JacobianOp: fn\\(params, x\\) fails on the first example"):
        lo.JacobianOp(fn, {**params, "W0": jnp.zeros((WIDTH, D_IN + 1))}, X)  # params of another architecture
    with pytest.raises(ValueError, match=r"must return one example's outputs of shape \(O,\), got \(\)"):
        lo.JacobianOp(lambda p, x: jnp.sum(fn(p, x)), params, X)
    with pytest.raises(ValueError, match=r"Gaussian sigma must have shape \(7,\) or \(7, 3\)"):
        lo.GGNOp(fn, params, X, Y, Gaussian(jnp.ones(5), heteroscedastic=True))
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        lo.JacobianOp(fn, params, X, batch_size=0)
    with pytest.raises(ValueError, match="Gaussian: sigma must be positive"):
        Gaussian(0.0)


@pytest.mark.slow
def test_float32_ggn_at_p_1e5_has_no_nan():
    key = jax.random.key(0)
    model = eqx.nn.MLP(300, 10, 300, 1, activation=jnp.tanh, key=key)  # 93,310 parameters
    fn, params = from_equinox(model)
    params = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), params)  # the test session runs x64
    X = draws.normal(jax.random.key(1), (64, 300), jnp.float32)
    Y = jax.random.randint(jax.random.key(2), (64,), 0, 10)
    G = lo.GGNOp(fn, params, X, Y, Categorical(), batch_size=24)
    assert G.shape[0] > 9e4 and G.dtype == jnp.float32
    v = draws.normal(jax.random.key(3), (G.shape[0],), jnp.float32)
    Gv = jax.jit(lambda G, v: G @ v)(G, v)
    assert bool(jnp.isfinite(Gv).all()) and float(v @ Gv) >= 0.0
    d = lo.diag(G)
    assert bool(jnp.isfinite(d).all()) and float(d.min()) >= 0.0
    sol = lo.solve(lo.shift(G, 1.0), v, method="cg", rtol=1e-4)
    assert bool(sol.converged) and bool(jnp.isfinite(sol.value).all())


def test_flax_nnx_adapter():
    nnx = pytest.importorskip("flax.nnx")
    from linops.models import from_flax_nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(D_IN, 4, rngs=rngs, param_dtype=jnp.float64)
            self.out = nnx.Linear(4, O, rngs=rngs, param_dtype=jnp.float64)

        def __call__(self, x):
            return self.out(jnp.tanh(self.hidden(x)))

    net = Net(nnx.Rngs(0))
    fn, params = from_flax_nnx(net)
    X = _inputs(18)
    assert_close(fn(params, X[1]), net(X[1]))
    J = lo.JacobianOp(fn, params, X, batch_size=3)
    assert_close(J.as_matrix(), _dense_jacobian(fn, params, X))


def test_streaming_ggn_equals_the_in_memory_one(capsys, monkeypatch):
    import linops.runtime._progress

    monkeypatch.setattr(linops.runtime._progress, "DELAY", 0.0)
    rng = np.random.default_rng(19)
    fn, params, X = _mlp(2, jnp.tanh), _params(20, 2), _inputs(21)
    y = jnp.asarray(rng.integers(0, O, N))
    in_memory = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=3)
    chunks = [(X[i : i + 3], y[i : i + 3]) for i in range(0, N, 3)]  # 3 + 3 + 1: the short batch counts
    streaming = lo.StreamingGGNOp(fn, params, chunks, Categorical(), progress=True)
    regenerated = lo.StreamingGGNOp(fn, params, lambda: iter(chunks), Categorical())
    assert streaming.num_examples == N and "psd" in streaming.tags
    v = jnp.linspace(-1.0, 1.0, in_memory.shape[0])
    assert_close(streaming @ v, in_memory @ v, rtol=1e-12)
    assert_close(regenerated @ v, in_memory @ v, rtol=1e-12)
    err = capsys.readouterr().err  # one bar per product of the operator with progress=True
    assert err.count("StreamingGGNOp product: 100%") == 1 and "3/3" in err and err.endswith("\n")
    with pytest.raises(TypeError, match="one-shot iterator"):
        lo.StreamingGGNOp(fn, params, iter(chunks), Categorical())
    with pytest.raises(ValueError, match=r"batch 1 has 3 inputs but 2 targets"):
        lo.StreamingGGNOp(fn, params, [chunks[0], (X[3:6], y[3:5])], Categorical())


def test_stochastic_ggn_diagonal_is_unbiased():
    rng = np.random.default_rng(22)
    fn, params, X = _mlp(1, jnp.tanh), _params(23, 1), _inputs(24)
    y = jnp.asarray(rng.integers(0, O, N))
    G = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=4)
    exact = np.asarray(lo.diag(G))
    dense = np.asarray(jax.jit(lambda G: G.as_matrix())(G))
    s = 4000
    est = jax.jit(lambda G, k: lo.diag(G, method="hutchinson", key=k, num_samples=s))(G, jax.random.key(0))
    estimate = np.asarray(est.value)
    # Rademacher probes: entry i has variance sum_{j != i} G_ij^2 per probe.
    sd = np.sqrt((dense**2).sum(1) - np.diag(dense) ** 2) / np.sqrt(s)
    assert np.all(np.abs(estimate - exact) <= 5 * sd + 1e-12)
    # the reported standard errors are that formula's, estimated from the same probes (4,000: within 10%)
    assert est.num_samples == s
    np.testing.assert_allclose(np.asarray(est.standard_error), sd, rtol=0.1, atol=1e-7)


def test_swapping_params_with_tree_at_reuses_the_compiled_product():
    rng = np.random.default_rng(25)
    fn, params, X = _mlp(1, jnp.tanh), _params(26, 1), _inputs(27)
    y = jnp.asarray(rng.integers(0, O, N))
    G = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=3)
    traces = []

    @jax.jit
    def product(G, v):
        traces.append(1)
        return G @ v

    v = jnp.ones(G.shape[0])
    product(G, v)
    new_params = jax.tree_util.tree_map(lambda a: 1.5 * a, params)
    G2 = eqx.tree_at(lambda g: g.params, G, new_params)
    assert_close(product(G2, v), lo.GGNOp(fn, new_params, X, y, Categorical(), batch_size=3) @ v, rtol=1e-12)
    assert len(traces) == 1


@pytest.mark.parametrize("budget", [1, pytest.param(2 * 62, marks=pytest.mark.slow), 10**9])
def test_ggn_diagonal_in_blocks_of_outputs_equals_the_dense_one(monkeypatch, budget):
    """With many outputs the diagonal takes the rows A_n J_n a block of outputs at a time (budget 1: one row
    per block; 2 x 62: two rows, so the last of 7 outputs is a padded block). Each equals diag of the dense GGN."""
    from linops.nn import _layer_diag, _operators

    out = 7
    params, X = _params(21, 1, out=out), _inputs(22)
    Y = jnp.asarray(np.arange(N) % out)
    G = lo.GGNOp(_mlp(1, jnp.tanh), params, X, Y, Categorical(), batch_size=3)
    assert G.shape[0] == 62
    dense = np.diag(np.asarray(G.as_matrix()))
    monkeypatch.setattr(_operators, "_ROW_BUDGET", budget)
    assert_close(G._diag_by_gradients(), dense, rtol=1e-12)  # the general path (models with no layer found)
    monkeypatch.setattr(_layer_diag, "_BUDGET", budget)
    assert_close(lo.diag(G), dense, rtol=1e-12)  # the per-layer rules
