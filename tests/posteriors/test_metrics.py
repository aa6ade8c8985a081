"""Metrics against independent implementations (scikit-learn, hand-computed cases, scipy)."""

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
    # confidences 0.05 (first bin, (0, 0.1]), 0.1 (also the first bin), 0.55, 0.95, 0.95
    probs = jnp.array([[0.05, 0.95 - 1e-9], [0.9, 0.1], [0.55, 0.45], [0.95, 0.05], [0.05, 0.95]])
    probs = probs.at[0].set(jnp.array([0.05, 0.05]))  # a (non-normalised) top confidence of 0.05
    probs = probs.at[1].set(jnp.array([0.1, 0.1]))
    labels = jnp.array([0, 0, 1, 0, 1])
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
    with pytest.raises(ValueError, match=r"probs must be \(N, K\) and labels \(N,\)"):
        metrics.accuracy(jnp.ones(3), jnp.zeros(3, int))
