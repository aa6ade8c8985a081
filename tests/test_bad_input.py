"""Bad input to the public entry points of linops and posteriors: a named error, before any work.

Each case names the function (or operator) that refuses, what it expected and what it got. The
model counts its calls with concrete arrays: a refusal must come before the model is evaluated on
data (tracing it to learn shapes is allowed; evaluating it is work).
"""

import jax
import jax.numpy as jnp
import pytest

import linops as lo
import posteriors as pst
from linops.likelihoods import Bernoulli, Gaussian
from tests import _draws as draws

EVALUATIONS = []


def fn(p, x):
    if not isinstance(x, jax.core.Tracer):
        EVALUATIONS.append(1)
    return p["W"] @ x


W = {"W": jnp.zeros((2, 4))}
X, Y = jnp.ones((6, 4)), jnp.zeros((6, 2))
NAN_X = X.at[2, 1].set(jnp.nan)
SYM = {"symmetric"}
KEY = jax.random.key(0)


def _nan_third_member():
    """An ``init`` whose third call (member 2) gives NaN weights."""
    calls = []

    def init(key):
        calls.append(key)
        return {"W": jnp.full((2, 4), jnp.nan if len(calls) == 3 else 0.0)}
    return init


def _wide_second_member():
    """An ``init`` whose second call (member 1) gives a wider weight."""
    calls = []

    def init(key):
        calls.append(key)
        return {"W": jnp.zeros((2, 5 if len(calls) == 2 else 4))}
    return init

CASES = {
    # posteriors
    "laplace: likelihood": (lambda: pst.laplace(fn, W, (X, Y), "gaussian"), TypeError,
                            r"laplace: likelihood must be a linops\.likelihoods\.Likelihood, got str"),
    "laplace: data": (lambda: pst.laplace(fn, W, X, Gaussian(1.0)), ValueError,
                      r"laplace: data must be an \(inputs, targets\) pair, got ArrayImpl"),
    "laplace: Bernoulli targets": (lambda: pst.laplace(fn, W, (X, Y.at[3, 1].set(2.0)), Bernoulli()), ValueError,
                                   r"laplace: a Bernoulli likelihood needs targets in \[0, 1\] .* got range \[0, 2\]"),
    "laplace: structure": (lambda: pst.laplace(fn, W, (X, Y), Gaussian(1.0), structure="dense"), ValueError,
                           r"laplace: unknown structure 'dense'; expected one of"),
    "laplace: prior": (lambda: pst.laplace(fn, W, (X, Y), Gaussian(1.0), prior_precision=-1.0), ValueError,
                       r"laplace: prior_precision must be positive, got min -1\.0"),
    "laplace: non-finite inputs": (lambda: pst.laplace(fn, W, (NAN_X, Y), Gaussian(1.0)), ValueError,
                                   r"laplace: the data's inputs contain 1 non-finite values .* at index 2"),
    "laplace: half precision": (lambda: pst.laplace(fn, {"W": W["W"].astype(jnp.bfloat16)}, (X, Y), Gaussian(1.0)),
                                TypeError, r"laplace: params hold bfloat16 arrays; posteriors need float32"),
    "laplace: targets count": (lambda: pst.laplace(fn, W, (X, Y[:5]), Gaussian(1.0)), ValueError,
                               r"laplace: a Gaussian likelihood needs targets of shape \(6, 2\), got \(5, 2\)"),
    "laplace: targets width": (lambda: pst.laplace(fn, W, (X, Y[:, :1]), Gaussian(1.0)), ValueError,
                               r"laplace: a Gaussian likelihood needs targets of shape \(6, 2\), got \(6, 1\)"),
    "laplace: batch size": (lambda: pst.laplace(fn, W, (X, Y), Gaussian(1.0), batch_size=0), ValueError,
                            r"GGNOp: batch_size must be a positive integer, got 0"),
    "projected: key": (lambda: pst.projected_posterior(fn, W, X, batch_size=2, prior_precision="optimal"),
                       ValueError, r"projected_posterior: prior_precision='optimal' .* pass key="),
    "projected: trace rtol": (lambda: pst.projected_posterior(fn, W, X, batch_size=2, prior_precision="optimal",
                                                             key=jax.random.key(0), trace_rtol=2.0), ValueError,
                              r"projected_posterior: trace_rtol \(the target relative standard error of alpha\*\) "
                              r"must be in \(0, 1\) or None, got 2\.0"),
    "projected: trace block": (lambda: pst.loss_projected_posterior(fn, W, (X, Y), Gaussian(1.0), batch_size=2,
                                                                    prior_precision="optimal", key=jax.random.key(0),
                                                                    trace_block=1), ValueError,
                               r"loss_projected_posterior: trace_block \(probes projected together\) must be an "
                               r"int >= 2, got 1"),
    "projected: probes": (lambda: pst.projected_posterior(fn, W, X, batch_size=2, prior_precision="optimal",
                                                          key=jax.random.key(0), num_trace_samples=1), ValueError,
                          r"projected_posterior: num_trace_samples must be an int >= 2 for a standard error, got 1"),
    "projected: prior": (lambda: pst.projected_posterior(fn, W, X, batch_size=2, prior_precision=0.0), ValueError,
                         r"projected_posterior: prior_precision must be positive, got 0\.0"),
    "projected: method": (lambda: pst.projected_posterior(fn, W, X, batch_size=2, method="fast"), ValueError,
                          r"AlternatingProjectionOp: method must be 'cg' or 'plain', got 'fast'"),
    "projected: batch size": (lambda: pst.projected_posterior(fn, W, X, batch_size=0), ValueError,
                              r"AlternatingProjectionOp: batch_size must be a positive integer, got 0"),
    "projected: non-finite inputs": (lambda: pst.projected_posterior(fn, W, NAN_X, batch_size=2), ValueError,
                                     r"projected_posterior: the inputs contain 1 non-finite values"),
    "projected: array prior": (lambda: pst.projected_posterior(fn, W, X, batch_size=2, prior_precision=jnp.ones(8)),
                               ValueError, r"projected_posterior: prior_precision must be a scalar .* shape \(8,\)"),
    "swag: prior shape": (lambda: pst.swag(fn, W, (X, Y), Gaussian(1.0), key=KEY, prior_precision=jnp.ones(3)),
                          ValueError, r"swag: prior_precision must be a scalar or one per parameter, shape \(8,\), "
                          r"got shape \(3,\)"),
    "swag: infinite rate": (lambda: pst.swag(fn, W, (X, Y), Gaussian(1.0), key=KEY, learning_rate=jnp.inf),
                            ValueError, r"swag: learning_rate must be finite and positive, got inf"),
    "swag: array rate": (lambda: pst.swag(fn, W, (X, Y), Gaussian(1.0), key=KEY, learning_rate=jnp.ones(2)),
                         ValueError, r"swag: learning_rate must be a scalar, got an array of shape \(2,\)"),
    "swag: momentum": (lambda: pst.swag(fn, W, (X, Y), Gaussian(1.0), key=KEY, momentum=1.0), ValueError,
                       r"swag: momentum must be a number in \[0, 1\)"),
    "subnetwork swag: rate": (lambda: pst.subnetwork.swag(fn, W, (X, Y), Gaussian(1.0), 2, key=KEY,
                                                          learning_rate=-1.0), ValueError,
                              r"subnetwork\.swag: learning_rate must be finite and positive, got -1\.0"),
    "subnetwork swag: steps": (lambda: pst.subnetwork.swag(fn, W, (X, Y), Gaussian(1.0), 2, key=KEY, num_steps=0),
                               ValueError, r"subnetwork\.swag: num_steps must be an integer >= 1, got 0"),
    "ensemble: prior shape": (lambda: pst.deep_ensemble(fn, lambda k: W, (X, Y), Gaussian(1.0), key=KEY,
                                                        prior_precision=jnp.ones(3)), ValueError,
                              r"deep_ensemble: prior_precision must be a scalar or one per parameter"),
    "ensemble: a member's init": (lambda: pst.deep_ensemble(fn, _nan_third_member(), (X, Y), Gaussian(1.0), key=KEY,
                                                            num_members=4), ValueError,
                                  r"deep_ensemble: init gave member 2 non-finite parameters"),
    "ensemble: a member's shapes": (lambda: pst.deep_ensemble(fn, _wide_second_member(), (X, Y), Gaussian(1.0),
                                                              key=KEY, num_members=3), ValueError,
                                    r"deep_ensemble: init gave member 1 parameters of another structure, shape"),
    "subnetwork: type": (lambda: pst.subnetwork_laplace(fn, W, (X, Y), Gaussian(1.0), [0, 1]), TypeError,
                         r"subnetwork_laplace: subnetwork must be a posteriors\.subnetwork\.Subnetwork, got list"),
    "subnetwork: size": (lambda: pst.subnetwork.largest_magnitude(W, 100), ValueError,
                         r"subnetwork\.largest_magnitude: size must be an integer in \[1, 8\], got 100"),
    "fsp: prior": (lambda: pst.fsp_laplace(fn, W, (X, Y), "rbf", X[:2], likelihood=Gaussian(1.0)), TypeError,
                   r"fsp_laplace: prior must be a GPPrior or a linops\.kernels\.Kernel, got str"),
    "metrics: labels": (lambda: pst.metrics.nll(jnp.full((2, 3), 1 / 3), jnp.array([0, 3])), ValueError,
                        r"nll: labels must lie in \[0, 3\) .* got labels from 0 to 3"),
    "metrics: logits": (lambda: pst.metrics.ece(jnp.array([[2.0, -1.0]]), jnp.array([0])), ValueError,
                        r"ece: probs must be non-negative"),
    "metrics: scores": (lambda: pst.metrics.auroc(jnp.array([0.1, jnp.nan]), jnp.array([0.3])), ValueError,
                        r"auroc: scores_in must be finite"),
    "save: not a posterior": (lambda: pst.save({"a": 1}, "unused.post"), TypeError,
                              r"save: post must be a posterior"),
    "load: not a template": (lambda: pst.load("unused.post", {"a": 1}), TypeError,
                             r"load: like must be a posterior"),
    # linops
    "solve: cg needs psd": (lambda: lo.solve(lo.Dense(jnp.eye(2)), jnp.ones(2), method="cg"), ValueError,
                            r"solve\(method='cg'\): Dense\(2, 2\) is not tagged psd"),
    "solve: shape": (lambda: lo.solve(lo.Dense(jnp.eye(2)), jnp.ones(3)), ValueError,
                     r"solve: Dense\(2, 2\) needs a right-hand side of shape \(2,\) or \(2, k\), got \(3,\)"),
    "lanczos: steps": (lambda: lo.lanczos(lo.Dense(jnp.eye(2), tags=SYM), 0, key=jax.random.key(0)), ValueError,
                       r"lanczos: num_steps must be an integer in \[1, 2\] for Dense\(2, 2\), got 0"),
    "LanczosLowRankOp: rank": (lambda: lo.LanczosLowRankOp(lo.Dense(jnp.eye(3), tags=SYM), 5, jax.random.key(0)),
                               ValueError, r"LanczosLowRankOp: rank must be an integer in \[1, 3\], got 5"),
    "kfac: no layer": (lambda: lo.kfac(lambda p, x: jnp.tanh(x[:2] * p), jnp.ones(2), X, Y, Gaussian(1.0)),
                       ValueError, r"kfac: found no dense layer"),
    "GGNOp: likelihood": (lambda: lo.GGNOp(fn, W, X, Y, "gaussian"), TypeError,
                          r"GGNOp: likelihood must be a linops\.likelihoods\.Likelihood, got str"),
    "JacobianOp: input shape": (lambda: lo.JacobianOp(fn, W, jnp.ones((3, 5))), ValueError,
                                r"JacobianOp: fn\(params, x\) fails on the first example"),
    "AlternatingProjectionOp: sweeps": (
        lambda: lo.AlternatingProjectionOp.from_matrix(jnp.ones((2, 3)), batch_size=1, max_sweeps=0), ValueError,
        r"AlternatingProjectionOp: max_sweeps must be >= 1, got 0"),
    "AlternatingProjectionOp: cutoff": (
        lambda: lo.AlternatingProjectionOp.from_matrix(jnp.ones((2, 3)), batch_size=1, cutoff=1.5), ValueError,
        r"AlternatingProjectionOp: cutoff is relative to each Gram's largest eigenvalue and must lie in \[0, 1\), "
        r"got 1.5"),
    "AlternatingProjectionOp: cutoff type": (
        lambda: lo.AlternatingProjectionOp.from_matrix(jnp.ones((2, 3)), batch_size=1, cutoff="tight"), TypeError,
        r"AlternatingProjectionOp: cutoff must be a number or None, got str 'tight'"),
    "AlternatingProjectionOp: row_dtype without rows": (
        lambda: lo.AlternatingProjectionOp.from_jacobian(fn, W, X, batch_size=2, row_dtype="float16"), ValueError,
        r"AlternatingProjectionOp: row_dtype=float16 keeps the stored rows in that dtype: pass "
        r"store_linearization='rows' with it \(got store_linearization=None\)"),
    "AlternatingProjectionOp: row_dtype wider": (
        lambda: lo.AlternatingProjectionOp.from_jacobian(fn, {"W": jnp.zeros((2, 4), jnp.float32)}, X, batch_size=2,
                                                         store_linearization="rows", row_dtype="float64"),
        ValueError, r"AlternatingProjectionOp: row_dtype must be a floating dtype no wider than the parameters' "
                    r"\(float32\), got float64"),
    "AlternatingProjectionOp: row_dtype not a float": (
        lambda: lo.AlternatingProjectionOp.from_jacobian(fn, W, X, batch_size=2, store_linearization="rows",
                                                         row_dtype="int8"), ValueError,
        r"AlternatingProjectionOp: row_dtype must be a floating dtype no wider than the parameters' \(float64\), "
        r"got int8"),
    "AlternatingProjectionOp: row_dtype not a dtype": (
        lambda: lo.AlternatingProjectionOp.from_jacobian(fn, W, X, batch_size=2, store_linearization="rows",
                                                         row_dtype="half precision"), TypeError,
        r"AlternatingProjectionOp: row_dtype must be a floating dtype such as 'float16', got 'half precision'"),
    "AlternatingProjectionOp: precision": (
        lambda: lo.AlternatingProjectionOp.from_jacobian(fn, W, X, batch_size=2, precision="tf32"), ValueError,
        r"AlternatingProjectionOp: precision must be None or one of \('default', 'high', 'highest', 'bfloat16', "
        r"'tensorfloat32', 'float32'\) \(as jax.default_matmul_precision takes it\), got 'tf32'"),
    "hutchinson: samples": (
        lambda: lo.trace(lo.Dense(jnp.eye(3)), method="hutchinson", num_samples=1, key=jax.random.key(0)),
        ValueError, r"hutchinson: num_samples must be >= 2"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_a_named_error_before_any_work(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    call, error, match = CASES[case]
    EVALUATIONS.clear()
    with pytest.raises(error, match=match):
        call()
    assert EVALUATIONS == [], f"{case}: the model was evaluated on data before the refusal"


def test_a_predictive_on_inputs_the_model_cannot_take_names_the_shapes():
    post = pst.laplace(fn, W, (X, Y), Gaussian(1.0), structure="diag")
    EVALUATIONS.clear()
    with pytest.raises(ValueError, match=r"LaplacePosterior: the model fails on the first input \(shape \[\(5,\)\]\)"):
        pst.predictive.linearized(post, jnp.ones((3, 5)))
    assert EVALUATIONS == []


def test_a_progress_option_that_is_not_a_label_is_refused_naming_the_operation():
    """linops operations take a progress bar's label (str) or None; a bool is refused before any work."""
    model = lambda w, x: x @ w  # noqa: E731
    w, X, Y = jnp.ones((2, 1)), jnp.ones((3, 2)), jnp.zeros((3, 1))
    lik = Gaussian(1.0)
    with pytest.raises(TypeError, match=r"GGNOp: progress must be a label \(str\) or None, got bool True"):
        lo.GGNOp(model, w, X, Y, lik, progress=True)
    with pytest.raises(TypeError, match=r"kfac: progress must be a label \(str\) or None, got int 1"):
        lo.kfac(lambda p, x: p @ x, jnp.ones((1, 2)), X, Y, lik, progress=1)
    with pytest.raises(TypeError, match=r"lanczos: progress must be a label \(str\) or None, got bool True"):
        lo.lanczos(lo.Diagonal(jnp.ones(3)), 2, v0=jnp.ones(3), progress=True)
    assert lo.GGNOp(model, w, X, Y, lik, progress="fit").progress == "fit"


def test_a_diverged_run_is_refused_never_returned_as_a_posterior():
    """SGD, Adam and the evidence's Adam at a learning rate far too large for the loss: float32 iterates overflow
    to inf and NaN, and each fit says so, naming the rate, instead of returning a posterior of NaN (issue 37)."""
    lin = lambda p, x: x @ p  # noqa: E731
    Xs = 100.0 * draws.normal(jax.random.key(1), (40, 3), jnp.float32)
    Ys = Xs @ jnp.ones((3, 2), jnp.float32)
    data = (Xs, Ys)
    with pytest.raises(ValueError, match=r"swag: the run diverged \(.*non-finite entries\); SGD at learning_rate=100"):
        pst.swag(lin, jnp.zeros((3, 2), jnp.float32), data, Gaussian(1.0), key=KEY, learning_rate=100.0,
                 num_snapshots=5, progress=False)
    with pytest.raises(ValueError, match=r"subnetwork\.swag: the run diverged \(variance has"):
        pst.subnetwork.swag(lin, jnp.zeros((3, 2), jnp.float32), data, Gaussian(1.0), 2, key=KEY,
                            learning_rate=100.0, num_steps=200, progress=False)
    with pytest.raises(ValueError, match=r"deep_ensemble: the run diverged .*members \[0, 1, 2\] of 3 diverged"):
        pst.deep_ensemble(lin, lambda k: draws.normal(k, (3, 2), jnp.float32), data, Gaussian(1.0), key=KEY,
                          num_members=3, num_steps=200, learning_rate=1e37, progress=False)
    post = pst.laplace(fn, W, (X, Y), Gaussian(1.0), structure="diag")
    with pytest.raises(ValueError, match=r"optimize_prior_precision: the run diverged \(prior_precision has 1 "
                                         r"non-finite entries\); Adam on the log evidence at "
                                         r"learning_rate=100000000\.0"):
        pst.optimize_prior_precision(post, learning_rate=1e8, num_steps=20, progress=False)


def test_the_prior_tuning_refuses_rates_and_grids_it_cannot_use():
    post = pst.laplace(fn, W, (X, Y), Gaussian(1.0), structure="diag")
    for rate in (float("inf"), -1.0, 0.0):
        with pytest.raises(ValueError, match=r"optimize_prior_precision: learning_rate must be finite and positive"):
            pst.optimize_prior_precision(post, learning_rate=rate, progress=False)
    with pytest.raises(ValueError, match=r"optimize_prior_precision: grid must be a 1-D array of at least two finite"):
        pst.optimize_prior_precision(post, method="gridsearch", validation=(X, Y), grid=[1.0, jnp.inf])
    with pytest.raises(ValueError, match=r"nll: .*targets"):  # validation targets that do not fit: before any value
        pst.optimize_prior_precision(post, method="gridsearch", validation=(X, Y[:, :1]))


def test_a_file_whose_header_nests_past_the_stack_is_refused_by_name(tmp_path):
    """A hostile header (JSON nested 200,000 deep) is "not a posterior", not a raw RecursionError."""
    post = pst.laplace(fn, W, (X, Y), Gaussian(1.0), structure="diag")
    pst.save(post, tmp_path / "a.post")
    body = (tmp_path / "a.post").read_bytes().split(b"\n", 1)[1]
    (tmp_path / "b.post").write_bytes(b"[" * 200_000 + b"]" * 200_000 + b"\n" + body)
    with pytest.raises(ValueError, match=r"load: .*b\.post is not a posterior saved by posteriors\.save"):
        pst.load(tmp_path / "b.post", post)
