"""The tabular-regression reproduction's pieces (`posteriors.experiments.uci`): its metric against Monte Carlo, and
its data sets (what ships offline, refused by name otherwise)."""

import numpy as np
import pytest

from posteriors.experiments import uci


def test_expected_log_likelihood_is_the_gaussian_expectation():
    """E_{f ~ N(m, v)}[log N(y | f, s^2)] in closed form, against 200,000 draws of f per point: the variance term
    matters (v up to 2 s^2 here), so a formula that dropped it, or used the predictive density instead, fails."""
    rng = np.random.default_rng(0)
    y, m = rng.normal(size=5), rng.normal(size=5)
    v, s2 = rng.uniform(0.1, 0.8, size=5), 0.4
    f = m + np.sqrt(v) * rng.normal(size=(200_000, 5))
    mc = np.mean(-0.5 * np.log(2 * np.pi * s2) - (y - f) ** 2 / (2 * s2))
    exact = uci.expected_log_likelihood(y, m, v, s2)
    assert abs(exact - mc) < 5e-3
    # the predictive log density log N(y | m, v + s^2) is a different number here
    density = np.mean(-0.5 * np.log(2 * np.pi * (v + s2)) - (y - m) ** 2 / (2 * (v + s2)))
    assert abs(exact - density) > 0.1
    # with v = 0 it is the plain Gaussian log-likelihood
    assert np.isclose(uci.expected_log_likelihood(y, m, 0.0, s2),
                      np.mean(-0.5 * np.log(2 * np.pi * s2) - (y - m) ** 2 / (2 * s2)))


def test_the_data_sets_ship_offline_and_unknown_ones_are_refused():
    pytest.importorskip("mlxtend")
    pytest.importorskip("sklearn")
    X, y = uci.load("boston")
    assert X.shape == (506, 13) and y.shape == (506,) and np.all(np.isfinite(X))
    assert np.isclose(y[:3], [24.0, 21.6, 34.7]).all()  # MEDV, in thousands of dollars
    X, y = uci.load("diabetes")
    assert X.shape == (442, 10) and y.shape == (442,)
    with pytest.raises(ValueError, match="unknown data set 'concrete'; choose 'boston' or 'diabetes'"):
        uci.load("concrete")
