"""`pst.predictive.sampled_variances` (issue 35, item 4: predictive variances over many outputs without one pass
per output): unbiased against the exact path at O = 256 and O = 1,000 outputs, with honest standard errors (the
z-scores of every entry), and what it refuses."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posteriors as pst
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox
from tests import _draws as draws


def _wide(num_outputs):
    """A tanh MLP 4-8-O (float64) on 12 examples with Gaussian targets: a posterior over O outputs."""
    model = eqx.nn.MLP(4, num_outputs, 8, 1, activation=jnp.tanh, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(1), (12, 4), jnp.float64)
    Y = draws.normal(jax.random.key(2), (12, num_outputs), jnp.float64)
    return fn, params, X, Y


@pytest.mark.parametrize(("num_outputs", "structure"), [(256, "diag"),  # the others in the slow tier (8 s)
                                                       pytest.param(256, "kfac", marks=pytest.mark.slow),
                                                       pytest.param(1000, "diag", marks=pytest.mark.slow)])
def test_the_estimate_is_unbiased_with_honest_standard_errors(num_outputs, structure):
    """Every one of the M x O entries against the exact variances (one reverse pass per output): the z-scores
    (estimate - exact) / standard error have mean about 0 (unbiased) and spread about 1 (the standard errors are
    the estimate's own), and none is past 5. A standard error off by 2x, or a bias of a tenth of one, fails."""
    fn, params, X, Y = _wide(num_outputs)
    post = pst.laplace(fn, params, (X, Y), Gaussian(0.5), structure=structure, prior_precision=2.0)
    T = draws.normal(jax.random.key(3), (3, 4), jnp.float64)
    exact = pst.predictive.linearized(post, T)[1]
    est = pst.predictive.sampled_variances(post, jax.random.key(4), T, 3000)
    assert est.value.shape == exact.shape == (3, num_outputs) and est.num_samples == 3000
    z = np.asarray((est.value - exact) / est.standard_error).ravel()
    assert abs(z.mean()) < 0.2, z.mean()
    assert 0.7 < z.std() < 1.3, z.std()
    assert np.abs(z).max() < 5, np.abs(z).max()
    assert float(jnp.max(est.standard_error / est.value)) < 0.1  # 3,000 samples: a few per cent each


def test_what_it_cannot_estimate_is_refused():
    fn, params, X, Y = _wide(5)
    post = pst.laplace(fn, params, (X, Y), Gaussian(0.5), structure="diag")
    with pytest.raises(ValueError, match="num_samples must be an integer >= 2"):
        pst.predictive.sampled_variances(post, jax.random.key(0), X[:2], 1)
    with pytest.raises(ValueError, match="pass key"):
        pst.predictive.sampled_variances(post, None, X[:2], 10)
    y = jnp.arange(12) % 5
    sketched = pst.laplace(fn, params, (X, y), Categorical(), structure="sketched", rank=3, sketch_size=40,
                           key=jax.random.key(1))
    with pytest.raises(ValueError, match="no parameter samples"):
        pst.predictive.sampled_variances(sketched, jax.random.key(0), X[:2], 10)


def test_inputs_the_model_cannot_take_are_refused_by_name():
    fn, params, X, Y = _wide(256)
    post = pst.laplace(fn, params, (X, Y), Gaussian(0.5), structure="diag")
    with pytest.raises(ValueError, match="sampled_variances: the model fails on one input"):
        pst.predictive.sampled_variances(post, jax.random.key(0), jnp.ones((2, 5)), 10)
