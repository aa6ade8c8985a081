"""Metrics against independent implementations (scikit-learn, hand-computed cases, scipy)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from posteriors import metrics

from ..linops._util import assert_close


def test_auroc_matches_scikit_learn_with_ties():
    sklearn = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    s_in = np.round(rng.normal(0, 1, 200), 1)  # rounding makes ties
    s_out = np.round(rng.normal(0.8, 1, 150), 1)
    expected = sklearn.roc_auc_score(np.r_[np.zeros(200), np.ones(150)], np.r_[s_in, s_out])
    assert_close(metrics.auroc(jnp.asarray(s_in), jnp.asarray(s_out)), expected, rtol=1e-12)


def test_fpr95_by_hand():
    s_in = jnp.arange(100.0)
    s_out = jnp.arange(50.0, 150.0)  # the largest threshold keeping 95 of the 100 OOD scores is 55
    assert float(metrics.fpr95(s_in, s_out)) == pytest.approx(45 / 100)  # in-scores 55..99


def test_ece_and_mce_by_hand_with_equal_width_bins_including_the_first():
    # 20 classes, so that top confidences of 0.05 (uniform) and 0.1 exist: 0.05 and 0.1 fall in the
    # first bin, (0, 0.1]; then 0.55, 0.95, 0.95
    K = 20
    probs = np.zeros((5, K))
    probs[0] = 1 / K
    probs[1] = 0.9 / (K - 1)
    probs[1, 0] = 0.1
    probs[2, :2] = [0.55, 0.45]
    probs[3, :2] = [0.95, 0.05]
    probs[4, :2] = [0.05, 0.95]
    probs, labels = jnp.asarray(probs), jnp.array([0, 0, 1, 0, 1])
    # bins: (0, .1]: confs .05 (correct: argmax 0 = label 0), .1 (argmax 0 = label 0) -> acc 1, conf .075
    #       (.5, .6]: conf .55, wrong -> acc 0;  (.9, 1]: .95 right, .95 right -> acc 1, conf .95
    gaps = {"first": abs(1 - 0.075), "mid": 0.55, "top": 0.05}
    expected_ece = (2 * gaps["first"] + 1 * gaps["mid"] + 2 * gaps["top"]) / 5
    assert_close(metrics.ece(probs, labels, num_bins=10), expected_ece, rtol=1e-6)
    assert_close(metrics.mce(probs, labels, num_bins=10), gaps["first"], rtol=1e-6)


def test_proper_scores_by_hand_and_crps_by_quadrature():
    probs = jnp.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    labels = jnp.array([1, 2])
    assert_close(metrics.nll(probs, labels), -(np.log(0.2) + np.log(0.8)) / 2, rtol=1e-6)
    assert_close(metrics.brier(probs, labels), ((0.49 + 0.64 + 0.01) + (0.01 + 0.01 + 0.04)) / 2, rtol=1e-6)
    assert_close(metrics.accuracy(probs, labels), 0.5)
    assert_close(metrics.confidence(probs), 0.75, rtol=1e-6)
    mu, var, y = 0.3, 2.0, 1.4
    F = stats.norm(mu, np.sqrt(var)).cdf
    reference = integrate.quad(lambda t: (F(t) - (t >= y)) ** 2, -30, 30, points=[y], limit=200)[0]
    assert_close(metrics.crps(jnp.array([mu]), jnp.array([var]), jnp.array([y])), reference, rtol=1e-6)
    assert_close(metrics.gaussian_nll(jnp.array([mu]), jnp.array([var]), jnp.array([y])),
                 -stats.norm(mu, np.sqrt(var)).logpdf(y), rtol=1e-10)


def test_bad_shapes():
    with pytest.raises(ValueError, match=r"accuracy: probs must be 2-D \(N, K\).*got shape \(3,\)"):
        metrics.accuracy(jnp.ones(3) / 3, jnp.zeros(3, int))
    with pytest.raises(ValueError, match=r"nll: labels must be 1-D .* shape \(2,\), got shape \(2, 1\)"):
        metrics.nll(jnp.full((2, 2), 0.5), jnp.zeros((2, 1), int))
    with pytest.raises(ValueError, match=r"brier: labels .* shape \(2,\), got shape \(3,\)"):
        metrics.brier(jnp.full((2, 2), 0.5), jnp.zeros(3, int))
    with pytest.raises(ValueError, match=r"confidence: probs must be 2-D .* got shape \(0, 2\)"):
        metrics.confidence(jnp.zeros((0, 2)))


# --- classification inputs: labels and probabilities -------------------------------------------------------

_PROBS = jnp.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
_CLASSIFICATION = [metrics.accuracy, metrics.nll, metrics.brier, metrics.ece, metrics.mce]


@pytest.mark.parametrize("metric", _CLASSIFICATION, ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad", [-1, 3])
def test_labels_out_of_range_are_refused(metric, bad):
    # -1 used to wrap to the last class
    with pytest.raises(ValueError, match=rf"{metric.__name__}: labels must lie in \[0, 3\).*from {min(bad, 0)} to "):
        metric(_PROBS, jnp.array([0, bad]))


@pytest.mark.parametrize("metric", _CLASSIFICATION, ids=lambda f: f.__name__)
def test_float_labels_are_refused(metric):
    with pytest.raises(TypeError, match=rf"{metric.__name__}: labels must be integer class indices, got dtype float"):
        metric(_PROBS, jnp.array([0.0, 2.0]))


@pytest.mark.parametrize("metric", _CLASSIFICATION + [metrics.confidence], ids=lambda f: f.__name__)
def test_nan_probabilities_are_refused(metric):
    # a NaN row used to count as a prediction of class 0
    probs = _PROBS.at[1].set(jnp.nan)
    args = (probs,) if metric is metrics.confidence else (probs, jnp.array([0, 0]))
    with pytest.raises(ValueError, match=rf"{metric.__name__}: probs must be finite, got 1 row"):
        metric(*args)


@pytest.mark.parametrize("metric", _CLASSIFICATION + [metrics.confidence], ids=lambda f: f.__name__)
def test_logits_are_refused(metric):
    # log-probabilities used to give an NLL of -0.68 and an ECE of 1.63
    logits = jnp.log(_PROBS)
    args = (logits,) if metric is metrics.confidence else (logits, jnp.array([0, 2]))
    with pytest.raises(ValueError, match=rf"{metric.__name__}: probs must be non-negative.*not logits"):
        metric(*args)


@pytest.mark.parametrize("metric", _CLASSIFICATION + [metrics.confidence], ids=lambda f: f.__name__)
def test_unnormalised_rows_are_refused(metric):
    scores = jnp.array([[2.0, 1.0, 0.5], [0.1, 0.1, 0.8]])  # non-negative scores, row 0 sums to 3.5
    args = (scores,) if metric is metrics.confidence else (scores, jnp.array([0, 2]))
    message = rf"{metric.__name__}: each row of probs must sum to one .* row 0 summing to 3.5"
    with pytest.raises(ValueError, match=message):
        metric(*args)


@pytest.mark.parametrize("dtype, tolerance", [(np.float64, 1e-6), (np.float32, 1e-3)])
def test_row_sum_tolerance_follows_the_dtype(dtype, tolerance):
    labels = jnp.array([0, 2])
    within = jnp.asarray(np.array([[0.5, 0.3, 0.2 + 0.5 * tolerance], [0.1, 0.1, 0.8]], dtype))
    beyond = jnp.asarray(np.array([[0.5, 0.3, 0.2 + 5 * tolerance], [0.1, 0.1, 0.8]], dtype))
    assert within.dtype == dtype
    assert_close(metrics.nll(within, labels), -(np.log(0.5) + np.log(0.8)) / 2, rtol=1e-6)
    with pytest.raises(ValueError, match=rf"within {tolerance:g} for {np.dtype(dtype).name}"):
        metrics.nll(beyond, labels)


def test_float32_softmax_of_many_classes_passes_the_row_sum_check():
    logits = jnp.asarray(np.random.default_rng(1).normal(0, 5, (64, 1000)), jnp.float32)
    probs = jnp.mean(jnp.stack([jax.nn.softmax(logits + i, axis=-1) for i in range(3)]), axis=0)
    labels = jnp.arange(64)
    expected = -np.mean(np.log(np.asarray(probs, np.float64)[np.arange(64), np.arange(64)]))
    assert_close(metrics.nll(probs, labels), expected, rtol=1e-5)


def test_num_bins_is_checked_first():
    with pytest.raises(ValueError, match=r"ece: num_bins must be a positive integer, got 0"):
        metrics.ece(_PROBS, jnp.array([0, 2]), num_bins=0)


def test_under_jit_shapes_are_still_checked_and_values_agree():
    labels = jnp.array([1, 2])
    for metric in _CLASSIFICATION:
        assert_close(jax.jit(metric)(_PROBS, labels), metric(_PROBS, labels), rtol=1e-12)
    with pytest.raises(ValueError, match=r"nll: labels must be 1-D .* got shape \(3,\)"):
        jax.jit(metrics.nll)(_PROBS, jnp.array([0, 1, 2]))
    with pytest.raises(TypeError, match=r"accuracy: labels must be integer"):
        jax.jit(metrics.accuracy)(_PROBS, jnp.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"gaussian_nll: mean, variance and targets must have the same shape"):
        jax.jit(metrics.gaussian_nll)(jnp.zeros((3, 1)), jnp.ones((3, 1)), jnp.zeros(3))
    with pytest.raises(ValueError, match=r"auroc: scores_out must be 1-D"):
        jax.jit(metrics.auroc)(jnp.zeros(3), jnp.zeros((3, 1)))


# --- OOD scores ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", [metrics.auroc, metrics.fpr95], ids=lambda f: f.__name__)
def test_nan_and_inf_scores_are_refused(metric):
    # a NaN used to sort as the largest score
    good = jnp.array([0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=rf"{metric.__name__}: scores_in must be finite, got 1 NaN or inf"):
        metric(good.at[0].set(jnp.nan), good)
    with pytest.raises(ValueError, match=rf"{metric.__name__}: scores_out must be finite, got 2 NaN or inf"):
        metric(good, good.at[:2].set(jnp.inf))


@pytest.mark.parametrize("metric", [metrics.auroc, metrics.fpr95], ids=lambda f: f.__name__)
def test_scores_must_be_one_dimensional_and_non_empty(metric):
    good = jnp.array([0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=rf"{metric.__name__}: scores_out must be 1-D .* got shape \(3, 1\)"):
        metric(good, good[:, None])
    with pytest.raises(ValueError, match=rf"{metric.__name__}: scores_in must be 1-D and non-empty.*\(0,\)"):
        metric(jnp.zeros(0), good)


def _mann_whitney_auroc(s_in, s_out):
    s_in, s_out = np.asarray(s_in, np.float64), np.asarray(s_out, np.float64)
    return stats.mannwhitneyu(s_out, s_in).statistic / (len(s_in) * len(s_out))


def test_auroc_mann_whitney_reference_is_pairwise_counting():
    # the reference itself, against the obvious n_in x n_out count with ties one half
    rng = np.random.default_rng(2)
    s_in, s_out = np.round(rng.normal(0, 1, 300), 1), np.round(rng.normal(0.5, 1, 200), 1)
    pairs = (s_out[:, None] > s_in[None, :]) + 0.5 * (s_out[:, None] == s_in[None, :])
    assert_close(_mann_whitney_auroc(s_in, s_out), pairs.mean(), rtol=1e-14)
    assert_close(metrics.auroc(jnp.asarray(s_in), jnp.asarray(s_out)), pairs.mean(), rtol=1e-12)


@pytest.mark.parametrize("x64", [True, False], ids=["float64", "float32"])
def test_auroc_at_a_hundred_thousand_by_a_hundred_thousand(x64):
    # n_in * n_out = 1e10 overflows int32: the pairwise count must never be formed in 32-bit integers
    n = 100_000
    rng = np.random.default_rng(3)
    s_in = np.round(rng.normal(0, 1, n), 3)  # rounding makes ties
    s_out = np.round(rng.normal(0.3, 1.2, n), 3)
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        a_in, a_out = jnp.asarray(s_in, dtype), jnp.asarray(s_out, dtype)
        auc = metrics.auroc(a_in, a_out)
        reference = _mann_whitney_auroc(a_in, a_out)  # of the scores as the metric saw them
        assert reference == pytest.approx(0.57, abs=0.02)
        # float32: each out-score's win fraction is exact to ~1e-7, their mean to ~1e-6 (stated accuracy)
        assert_close(auc, reference, rtol=1e-12 if x64 else 1e-5)


# --- regression ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", [metrics.gaussian_nll, metrics.crps], ids=lambda f: f.__name__)
def test_regression_shapes_must_agree(metric):
    # a (N, 1) mean against (N,) targets used to broadcast to N x N
    name = metric.__name__
    with pytest.raises(ValueError, match=rf"{name}: mean, variance and targets must have the same shape .*"
                                         r"got \(4, 1\), \(4, 1\) and \(4,\)"):
        metric(jnp.zeros((4, 1)), jnp.ones((4, 1)), jnp.zeros(4))
    with pytest.raises(ValueError, match=rf"{name}: .* got \(4,\), \(\) and \(4,\)"):
        metric(jnp.zeros(4), jnp.ones(()), jnp.zeros(4))


@pytest.mark.parametrize("metric", [metrics.gaussian_nll, metrics.crps], ids=lambda f: f.__name__)
def test_regression_values_are_checked(metric):
    name, mean, var, y = metric.__name__, jnp.zeros(3), jnp.ones(3), jnp.zeros(3)
    with pytest.raises(ValueError, match=rf"{name}: variance must be positive, got a smallest variance of -0.5"):
        metric(mean, var.at[1].set(-0.5), y)
    with pytest.raises(ValueError, match=rf"{name}: variance must be positive, got a smallest variance of 0"):
        metric(mean, var.at[1].set(0.0), y)
    with pytest.raises(ValueError, match=rf"{name}: variance must be finite"):
        metric(mean, var.at[1].set(jnp.inf), y)
    with pytest.raises(ValueError, match=rf"{name}: mean must be finite, got 1 NaN or inf"):
        metric(mean.at[0].set(jnp.nan), var, y)
    with pytest.raises(ValueError, match=rf"{name}: targets must be finite"):
        metric(mean, var, y.at[2].set(jnp.nan))


def test_regression_metrics_on_column_arrays_match_the_flat_ones():
    rng = np.random.default_rng(4)
    mean, var, y = rng.normal(size=5), rng.uniform(0.5, 2, 5), rng.normal(size=5)
    expected = np.mean(-stats.norm(mean, np.sqrt(var)).logpdf(y))
    flat = metrics.gaussian_nll(jnp.asarray(mean), jnp.asarray(var), jnp.asarray(y))
    column = metrics.gaussian_nll(jnp.asarray(mean)[:, None], jnp.asarray(var)[:, None], jnp.asarray(y)[:, None])
    assert_close(flat, expected, rtol=1e-12)
    assert_close(column, expected, rtol=1e-12)
