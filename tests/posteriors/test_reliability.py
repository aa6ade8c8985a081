"""Issue 19's silent wrong answers, each now a clear error or an announced result.

Non-finite data, a precision that is not numerically positive definite, a projection that did not
converge, and an "optimal" prior precision from a rank that is not significantly positive.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
import posteriors as pst
from linops.kernels import Matern32
from linops.likelihoods import Gaussian
from posteriors.projected import optimal_prior_precision
from tests import _draws as draws
from tests.linops._util import assert_close
from tests.posteriors._shared import axes


def _linear(P=20, N=5, dtype=jnp.float64, seed=0):
    rng = np.random.default_rng(seed)
    X = jnp.asarray(rng.standard_normal((N, P)), dtype)
    y = jnp.asarray(rng.standard_normal((N, 1)), dtype)
    return (lambda p, x: p["W"] @ x), {"W": jnp.zeros((1, P), dtype)}, X, y


def _mlp(seed=0, n=12):
    rng = np.random.default_rng(seed)
    params = {"W1": jnp.asarray(rng.standard_normal((6, 3))), "b1": jnp.zeros(6),
              "W2": jnp.asarray(rng.standard_normal((3, 6)) / 3), "b2": jnp.zeros(3)}
    fn = lambda p, x: p["W2"] @ jnp.tanh(p["W1"] @ x + p["b1"]) + p["b2"]  # noqa: E731
    return fn, params, jnp.asarray(rng.standard_normal((n, 3))), jnp.asarray(np.arange(n) % 3)


@pytest.mark.parametrize("where", ["input NaN", "input Inf", "target NaN"])
def test_non_finite_data_is_refused_by_every_posterior_before_any_work(where):
    fn, w, X, y = _linear()
    if where == "input NaN":
        X = X.at[3, 2].set(jnp.nan)
    elif where == "input Inf":
        X = X.at[3, 2].set(jnp.inf)
    else:
        y = y.at[3, 0].set(jnp.nan)
    what = "targets" if where == "target NaN" else "inputs"
    match = f"{what} contain 1 non-finite values .* the first at index 3"
    calls = [
        lambda: pst.laplace(fn, w, (X, y), Gaussian(1.0), structure="diag"),
        lambda: pst.subnetwork_laplace(fn, w, (X, y), Gaussian(1.0), pst.subnetwork.largest_magnitude(w, 3)),
        lambda: pst.fsp_laplace(fn, w, (X, y), Matern32(0.5), X[:2], likelihood=Gaussian(1.0)),
        lambda: pst.loss_projected_posterior(fn, w, (X, y), Gaussian(1.0), batch_size=2),
    ]
    if what == "inputs":  # the projected posterior needs no targets
        calls.append(lambda: pst.projected_posterior(fn, w, X, batch_size=2))
    for call in calls:
        with pytest.raises(ValueError, match=match):
            call()


def test_fsp_laplace_refuses_non_finite_context_points():
    fn, w, X, y = _linear()
    with pytest.raises(ValueError, match="fsp_laplace: the context points contain 1 non-finite values"):
        pst.fsp_laplace(fn, w, (X, y), Matern32(0.5), X[:3].at[1, 0].set(jnp.nan), likelihood=Gaussian(1.0))


@pytest.mark.parametrize("structure", ["full", "last_layer", "subnetwork"])
def test_a_precision_that_is_not_positive_definite_in_float32_is_refused(structure):
    """A rank-deficient GGN (20 parameters, 5 examples) with prior precision 1e-9 in float32 (the issue saw
    it at 1e-6 on a trained net): the Cholesky factor was NaN and so were samples, predictions and
    evidence, silently."""
    fn, w, X, y = _linear(dtype=jnp.float32)
    match = r"not numerically positive definite in float32.*larger prior precision"
    if structure == "subnetwork":
        sub = pst.subnetwork.largest_magnitude(jax.tree_util.tree_map(lambda a: a + 1.0, w), 15)
        with pytest.raises(ValueError, match="subnetwork_laplace: .*" + match):
            pst.subnetwork_laplace(fn, w, (X, y), Gaussian(1.0), sub, prior_precision=1e-9, rescale_prior=False)
        return
    with pytest.raises(ValueError, match=match):
        pst.laplace(fn, w, (X, y), Gaussian(1.0), **axes(structure), prior_precision=1e-9)
    post = pst.laplace(fn, w, (X, y), Gaussian(1.0), **axes(structure), prior_precision=1.0)
    assert bool(jnp.all(jnp.isfinite(post.sample(jax.random.key(0), 3))))
    with pytest.raises(ValueError, match="with_prior: .*" + match):
        post.with_prior(1e-9)


def test_an_unconverged_projection_is_announced_and_recorded():
    fn, params, X, _ = _mlp()
    with pytest.warns(UserWarning, match=r"projections of \d+ of 8 trace probes did not converge"):
        post = pst.projected_posterior(fn, params, X, batch_size=4, prior_precision="optimal",
                                       key=jax.random.key(0), num_trace_samples=8, max_sweeps=2)
    assert not bool(post.projection_converged)
    with pytest.warns(UserWarning, match="ProjectedPosterior.sample: the projections of"):
        post.sample(jax.random.key(1), 3)
    good = pst.projected_posterior(fn, params, X[:4], batch_size=2, prior_precision="optimal",
                                   key=jax.random.key(0), num_trace_samples=8)
    assert bool(good.projection_converged)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        good.sample(jax.random.key(1), 3)
    # the record beside alpha*: sweeps run and the largest kernel residual ||J Pi e|| / ||J e|| of the probes
    # (standard Gaussian, drawn from the key), recomputed here from the trace draws
    J = jax.jacfwd(lambda p: jax.vmap(fn, in_axes=(None, 0))(p, X))(params)
    J = np.concatenate([np.asarray(leaf).reshape(X.shape[0] * 3, -1) for leaf in jax.tree_util.tree_leaves(J)], 1)
    eps = np.asarray(draws.normal(jax.random.key(0), (J.shape[1], 8), post.mean.dtype))
    for p_, rows in ((post, J), (good, J[:12])):
        residual = np.linalg.norm(rows @ np.asarray(p_.trace_draws), axis=0) / np.linalg.norm(rows @ eps, axis=0)
        assert_close(p_.projection_residual, residual.max(), rtol=1e-6)
    assert 1 <= int(post.projection_sweeps) <= 4 and int(good.projection_sweeps) >= 1
    assert float(good.projection_residual) < 1e-3 < float(post.projection_residual)


def test_optimal_prior_precision_refuses_a_rank_that_is_not_significantly_positive():
    """More Jacobian rows than parameters: Tr(Pi) ~ P, the estimated rank P - Tr(Pi) can come out negative
    (alpha* = -0.268 on a CNN, then NaN samples and an AUROC of 0.5). Refused with the numbers."""
    fn, params, X, _ = _mlp(n=40)  # 120 rows for 45 parameters: the kernel is trivial, rank = P
    P = 45
    # A projector onto a trivial kernel has Tr = 0: the rank is P, clearly positive, so this is accepted...
    post = pst.projected_posterior(fn, params, X, batch_size=8, prior_precision="optimal", key=jax.random.key(0),
                                   num_trace_samples=8)
    assert float(post.prior_precision) > 0
    assert abs(float(post.trace_estimate.value)) < 1e-3 * P
    # A training Jacobian that sees no direction (a zero row): Pi = I, the rank is 0 on every probe; refused, with
    # the numbers. (Until the estimator of the rank became eps^T (I - Pi) eps, whose variance is 2 r instead of
    # 2 Tr(Pi), a rank of 1 among 45 parameters was refused too: 8 probes of P - eps^T Pi eps had a standard
    # error of about 3. Now it is estimated, below.)
    Pi = lo.AlternatingProjectionOp.from_matrix(jnp.zeros((1, P)), batch_size=1)
    with pytest.raises(ValueError, match=r"not significantly positive.*P = 45, Tr\(Pi\) = 45\.0 \+- 0\.0 \(8 probes"):
        optimal_prior_precision(Pi, jnp.ones(P), jax.random.key(0), 8)
    Pi = lo.AlternatingProjectionOp.from_matrix(jnp.ones((1, P)), batch_size=1)
    alpha, estimate = optimal_prior_precision(Pi, jnp.ones(P), jax.random.key(0), 4000)  # rank 1
    assert abs(float(estimate.value) - 44) < 4 * float(estimate.standard_error)
    # 2% of a rank of 1 needs 2 r Tr(Pi) / P / (0.02 r)^2 = 4,900 probes: all 4,000 are used, and the error says so
    assert estimate.num_samples == 4000 and 0.02 < float(estimate.standard_error) < 0.03
    # ...and zero weights cannot give a positive alpha* (||theta||^2 = 0)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    with pytest.raises(ValueError, match="not significantly positive .*P = 45"):
        pst.projected_posterior(fn, zeros, X[:2], batch_size=2, prior_precision="optimal", key=jax.random.key(0),
                                num_trace_samples=8)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_parameters_are_refused_by_name(dtype):
    """They failed with a raw LAPACK error from deep inside a factorisation."""
    fn, w, X, y = _linear()
    half = jax.tree_util.tree_map(lambda a: a.astype(dtype), w)
    match = f"params hold {jnp.dtype(dtype).name} arrays; posteriors need float32 or float64"
    for call in (lambda: pst.laplace(fn, half, (X, y), Gaussian(1.0), structure="full"),
                 lambda: pst.projected_posterior(fn, half, X, batch_size=2),
                 lambda: pst.subnetwork_laplace(fn, half, (X, y), Gaussian(1.0),
                                                pst.subnetwork.largest_magnitude(w, 3)),
                 lambda: pst.fsp_laplace(fn, half, (X, y), Matern32(0.5), X[:2], likelihood=Gaussian(1.0))):
        with pytest.raises(TypeError, match=match):
            call()


@pytest.mark.parametrize("structure", ["full", "diag", "kfac", "last_layer", "lowrank"])
def test_laplace_under_jit_equals_the_eager_posterior(structure):
    """Item 10: the checks are trace-safe, so a whole fit can be jitted (its data traced), to the same posterior."""
    import equinox as eqx

    from linops.likelihoods import Categorical
    from linops.models import from_equinox

    model = eqx.nn.MLP(3, 3, 5, 2, activation=jnp.tanh, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(1), (30, 3), jnp.float64)
    y = jnp.arange(30) % 3  # three classes: the output covariance has off-diagonal terms to get wrong
    kw = {"rank": 6, "key": jax.random.key(2)} if structure == "lowrank" else {}

    def fit(params, X, y, alpha):
        return pst.laplace(fn, params, (X, y), Categorical(), **axes(structure), prior_precision=alpha, **kw)

    eager = fit(params, X, y, 0.7)
    jitted = eqx.filter_jit(fit)(params, X, y, jnp.asarray(0.7))
    T = X[:4] + 0.5
    for a, b in zip(pst.predictive.linearized(jitted, T, full_covariance=True),
                    pst.predictive.linearized(eager, T, full_covariance=True), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(pst.marginal_log_likelihood(jitted), pst.marginal_log_likelihood(eager), rtol=1e-10)
    key = jax.random.key(3)
    np.testing.assert_allclose(jitted.sample(key, 3), eager.sample(key, 3), rtol=1e-9, atol=1e-12)


def test_projected_posterior_under_jit_equals_the_eager_one():
    import equinox as eqx

    from linops.models import from_equinox

    model = eqx.nn.MLP(3, 2, 6, 1, activation=jnp.tanh, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(model)  # 38 parameters; 8 inputs x 2 outputs = 16 rows
    X = draws.normal(jax.random.key(1), (8, 3), jnp.float64)

    def fit(params, X):
        return pst.projected_posterior(fn, params, X, batch_size=4, prior_precision=2.0)

    eager = fit(params, X)
    jitted = eqx.filter_jit(fit)(params, X)
    key = jax.random.key(4)
    a, b = jitted.sample(key, 4), eager.sample(key, 4)
    np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)
    # and the samples are in the kernel of the training Jacobian (the projection ran under jit too)
    from linops.models import ravel

    J = jax.vmap(jax.jacobian(fn), in_axes=(None, 0))(params, X)
    Jm = np.concatenate([np.asarray(leaf).reshape(16, -1) for leaf in jax.tree_util.tree_leaves(J)], axis=1)
    steps = np.asarray(a) - np.asarray(ravel(params)[0])[None, :]
    assert np.linalg.norm(Jm @ steps.T) <= 1e-6 * np.linalg.norm(Jm) * np.linalg.norm(steps)
    assert np.linalg.norm(steps) > 1.0  # not a trivial zero step


@pytest.mark.parametrize("method", ["swag", "deep_ensemble", "subnetwork.swag"])
def test_swag_and_ensembles_refuse_targets_that_do_not_fit_before_any_training(method):
    """Label 5 of 5 classes and label -1 trained as if valid (identical results), 64 inputs ran with 10 targets,
    and (N,) targets for a two-output model were broadcast: each is refused before a single SGD step."""
    import jax
    import jax.numpy as jnp

    import posteriors as pst
    from linops.likelihoods import Categorical, Gaussian
    from posteriors import subnetwork

    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.standard_normal((64, 3)), jnp.float32)
    W = jnp.asarray(rng.standard_normal((3, 5)), jnp.float32)
    fn = lambda w, x: x @ w  # noqa: E731
    key = jax.random.key(0)

    def run(targets, likelihood, params=W):
        kw = dict(key=key, progress=False)
        if method == "swag":
            return pst.swag(fn, params, (X, targets), likelihood, num_snapshots=2, batch_size=8, **kw)
        if method == "deep_ensemble":
            return pst.deep_ensemble(fn, lambda k: params, (X, targets), likelihood, num_members=2, num_steps=2,
                                     batch_size=8, **kw)
        return subnetwork.swag(fn, params, (X, targets), likelihood, 2, num_steps=2, batch_size=8, **kw)

    labels = jnp.asarray(rng.integers(0, 5, 64))
    for bad, match in ((labels.at[3].set(5), r"labels must lie in \[0, 5\).*\[0, 5\]"),
                       (labels.at[3].set(-1), r"labels must lie in \[0, 5\).*\[-1, 4\]"),
                       (labels[:10], r"integer class labels of shape \(64,\)")):
        with pytest.raises(ValueError, match=f"{method}: .*" + match):
            run(bad, Categorical())
    two = jnp.asarray(rng.standard_normal((3, 2)), jnp.float32)
    with pytest.raises(ValueError, match=rf"{method}: a Gaussian likelihood needs targets of shape \(64, 2\), "
                                         r"got \(64,\)"):
        run(jnp.zeros(64), Gaussian(1.0), params=two)


def test_non_finite_noise_and_prior_sample_counts_and_empty_inputs_are_refused_clearly():
    """Gaussian(sigma=nan or inf) and an infinite prior precision were accepted (NaN posteriors downstream);
    sample(n=-1) and a predictive on 0 inputs crashed with raw MLIR and index errors."""
    X, Y = jnp.ones((4, 2)), jnp.zeros((4, 1))
    fn = lambda w, x: (x @ w)[None]  # noqa: E731
    for sigma in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="Gaussian: sigma must be finite"):
            Gaussian(sigma)
    for structure in ("diag", "full", "kfac", "lowrank"):
        kw = {"rank": 1, "key": jax.random.key(0)} if structure == "lowrank" else {}
        with pytest.raises(ValueError, match=r"laplace: prior_precision must be finite"):
            pst.laplace(fn, jnp.ones(2), (X, Y), Gaussian(1.0), structure=structure, prior_precision=float("inf"),
                        **kw)
    with pytest.raises(ValueError, match=r"projected_posterior: prior_precision must be finite, got inf"):
        pst.projected_posterior(fn, jnp.ones(2), X, batch_size=2, prior_precision=float("inf"))
    post = pst.laplace(fn, jnp.ones(2), (X, Y), Gaussian(1.0), structure="diag")
    for n in (-1, 0, 2.5):
        with pytest.raises(ValueError, match=r"LaplacePosterior.sample: n must be an integer >= 1"):
            post.sample(jax.random.key(0), n)
    with pytest.raises(ValueError, match=r"LaplacePosterior: the inputs hold no example \(M = 0\)"):
        pst.predictive.regression(post, jnp.ones((0, 2)))


def test_a_function_operator_of_the_wrong_length_and_a_write_protected_file_are_refused(tmp_path):
    """A FunctionOp declared (3, 3) whose function returned 2 numbers gave a wrong-length product silently; save
    replaced a file of mode 0444 (its rename needs only the folder's permission)."""
    import os

    F = lo.FunctionOp(lambda v: v[:2], (3, 3), jnp.float32)
    with pytest.raises(ValueError, match=r"FunctionOp\(3, 3\): its mv function returned shape \(2,\).*needs \(3,\)"):
        F @ jnp.ones(3)
    with pytest.raises(ValueError, match=r"its mv function returned shape \(2,\)"):
        F @ jnp.ones((3, 4))  # several vectors: checked per vector
    G = lo.FunctionOp(lambda v: jnp.ones(2), (2, 3), jnp.float32, rmv=lambda u: u)
    with pytest.raises(ValueError, match=r"FunctionOp\(2, 3\): its rmv function returned shape \(2,\).*needs \(3,\)"):
        G.T @ jnp.ones(2)
    X, Y = jnp.ones((4, 2)), jnp.zeros((4, 1))
    post = pst.laplace(lambda w, x: (x @ w)[None], jnp.ones(2), (X, Y), Gaussian(1.0), structure="diag")
    path = tmp_path / "post.eqx"
    pst.save(post, path)
    before = path.read_bytes()
    os.chmod(path, 0o444)  # refused for root too: the mode bits say the file is protected
    with pytest.raises(PermissionError, match=r"save: .*post.eqx is write-protected \(mode 0o444\)"):
        pst.save(post, path)
    assert path.read_bytes() == before


def test_kfac_warns_with_an_estimate_before_eigendecompositions_that_take_minutes(monkeypatch):
    """Issue 37: a KFAC fit whose Kronecker factors are wide (4,096 or more: cubic cost, about half an hour at
    20,000 inputs on 2 cores) says so, with the sizes and a time estimate, before eigendecomposing them (with
    warnings as errors the fit stops there); narrower factors pass silently. The threshold is lowered here to
    keep the test small: the rule, not the size, is what is tested."""
    from linops.likelihoods import Categorical
    from posteriors import _structures

    X = draws.normal(jax.random.key(0), (30, 12))
    y = jnp.arange(30) % 3
    params = {"V": 0.3 * draws.normal(jax.random.key(1), (3, 6)),
              "W": 0.3 * draws.normal(jax.random.key(2), (6, 12))}
    fn = lambda p, x: p["V"] @ jnp.tanh(p["W"] @ x)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pst.laplace(fn, params, (X, y), Categorical(), structure="kfac")  # factors 3, 6, 6, 12: below it
    monkeypatch.setattr(_structures, "LONG_EIGENDECOMPOSITION", 10)
    monkeypatch.setattr(_structures, "EIGH_SECONDS_PER_CUBE", 0.5)  # 2 x 0.5 s x (3^3 + 2 6^3 + 12^3): 36 min
    with pytest.warns(UserWarning, match=r"laplace\(structure='kfac'\): eigendecomposing Kronecker factors of sizes "
                                         r"12 \(a cost cubic in the size\) takes about 36 minutes"):
        pst.laplace(fn, params, (X, y), Categorical(), structure="kfac", batch_size=7)  # another program: traced
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="eigendecomposing"):
            pst.laplace(fn, params, (X, y), Categorical(), structure="kfac", batch_size=9)


@pytest.mark.parametrize("structure", ["full", "diag", "kfac", "lowrank"])
def test_a_fit_whose_outputs_or_curvature_overflow_is_refused_not_returned_as_nan(structure):
    """Issue 37: an exp head overflowing in float32 gave diag, KFAC and low-rank posteriors of NaN (full blamed the
    prior precision); a square root at 0 gives a finite loss but an infinite curvature. Both are refused, naming
    which, instead of returning a posterior every prediction of which is NaN."""
    from linops.likelihoods import Gaussian

    X = jnp.abs(draws.normal(jax.random.key(0), (40, 3), jnp.float32)) + 1.0
    Y = jnp.zeros((40, 2), jnp.float32)
    kw = {"structure": structure, **({"key": jax.random.key(1), "rank": 2} if structure == "lowrank" else {})}
    overflow = lambda p, x: jnp.exp(x @ p["W"])  # noqa: E731 - exp(30 x 3) overflows float32
    with pytest.raises(ValueError, match=rf"laplace\(structure='{structure}'\): the loss on the data is not finite"):
        pst.laplace(overflow, {"W": jnp.full((3, 2), 30.0, jnp.float32)}, (X, Y), Gaussian(1.0), **kw)
    root = lambda p, x: jnp.sqrt(jnp.abs(x @ p["W"]))  # noqa: E731 - output 0, derivative inf at W = 0
    with pytest.raises(ValueError, match=rf"laplace\(structure='{structure}'\): the loss is finite, but the fitted "
                                         r"curvature is not"):
        pst.laplace(root, {"W": jnp.zeros((3, 2), jnp.float32)}, (X, Y), Gaussian(1.0), **kw)


def test_data_without_examples_is_refused_by_the_function_called():
    """Issue 37: N = 0 reached GGNOp and was refused in its name ("GGNOp: inputs has no examples"), not the
    posterior's the user called (last layer gave an IndexError before that). Each posterior that takes training
    data now says it has none, in its own name."""
    from posteriors import subnetwork

    X, Y = jnp.ones((0, 2)), jnp.zeros((0, 1))
    fn = lambda w, x: (x @ w)[None]  # noqa: E731
    w, key = jnp.ones(2), jax.random.key(0)
    calls = {
        "laplace": lambda: pst.laplace(fn, w, (X, Y), Gaussian(1.0), structure="diag"),
        "laplace ": lambda: pst.laplace(fn, w, (X, Y), Gaussian(1.0), structure="kfac"),
        "swag": lambda: pst.swag(fn, w, (X, Y), Gaussian(1.0), key=key, progress=False),
        "deep_ensemble": lambda: pst.deep_ensemble(fn, lambda k: w, (X, Y), Gaussian(1.0), key=key, num_members=2,
                                                   progress=False),
        "loss_projected_posterior": lambda: pst.loss_projected_posterior(fn, w, (X, Y), Gaussian(1.0), batch_size=1),
        "subnetwork.swag": lambda: subnetwork.swag(fn, w, (X, Y), Gaussian(1.0), 1, key=key),
        "subnetwork.diagonal_laplace": lambda: subnetwork.diagonal_laplace(fn, w, (X, Y), Gaussian(1.0), 1),
    }
    for who, call in calls.items():
        with pytest.raises(ValueError, match=rf"^{who.strip()}: no examples in the data \(inputs of shape \(0, 2\)\)"):
            call()
    with pytest.raises(ValueError, match=r"^projected_posterior: no examples in the training inputs"):
        pst.projected_posterior(fn, w, X, batch_size=1)


@pytest.mark.parametrize("concat_limit", [2**20, 3])  # the small leaves checked together; every leaf on its own
@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf, -jnp.inf])
def test_the_finiteness_check_finds_one_bad_entry_in_any_leaf(bad, concat_limit, monkeypatch):
    """`_all_finite` (the fit's refusal of a non-finite curvature or factor) sees a single NaN or infinity in a
    small leaf, in a large one, in float32 or float64, under `jax.jit` too; a finite tree (huge entries, whose
    sum overflows, included) passes; integer leaves are not read."""
    from posteriors import laplace_family

    monkeypatch.setattr(laplace_family, "_FINITE_CONCAT", concat_limit)
    tree = {"a": jnp.ones(2, jnp.float32), "b": jnp.full((3, 4), 3e38, jnp.float32), "c": jnp.zeros(5, jnp.float64),
            "i": jnp.arange(3)}
    check = laplace_family._all_finite
    assert bool(check(tree)) and bool(jax.jit(check)(tree))
    for leaf, index in (("a", 1), ("b", (2, 3)), ("c", 0)):
        planted = {**tree, leaf: tree[leaf].at[index].set(bad)}
        assert not bool(check(planted)) and not bool(jax.jit(check)(planted)), (leaf, bad)
    assert bool(check({"i": jnp.arange(2)})) and bool(check({}))
