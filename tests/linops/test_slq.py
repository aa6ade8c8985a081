"""`lo.logdet(A, method="slq")`: stochastic Lanczos quadrature against the dense log-determinant, its standard error,
and its gradient through Lanczos's adjoint against the closed form d/da logdet(A + a I) = tr((A + a I)^-1)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
from linops.likelihoods import Categorical
from linops.models import from_equinox
from tests import _draws as draws

from ._util import assert_close


def test_a_diagonal_is_exact_for_every_probe():
    d = jnp.linspace(0.5, 4.0, 6)
    est = lo.logdet(lo.Diagonal(d), method="slq", key=jax.random.key(0), num_samples=4, num_steps=6)
    assert_close(est.value, jnp.sum(jnp.log(d)), rtol=1e-10)
    assert float(est.standard_error) < 1e-10  # z^T log(D) z = sum log d for every Rademacher z
    assert est.num_samples == 4


@pytest.mark.slow  # 21 s: 1,800 GGN products and their adjoint on 5,530 parameters
def test_the_evidence_log_determinant_of_a_2000_parameter_ggn_and_its_gradient():
    """Issue 34's goal: on a GGN of 2,000+ parameters (5,530, float64), the estimate lies within its standard errors of
    the dense log-determinant (asserted at 3: a statistical bound, fixed key), and its gradient in the prior
    precision within 1% of tr((G + a I)^-1)."""
    model = eqx.nn.MLP(20, 10, 60, 2, activation=jnp.tanh, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(1), (60, 20), jnp.float64)
    G = lo.GGNOp(fn, params, X, jnp.arange(60) % 10, Categorical())
    P = G.shape[0]
    assert P >= 2000
    alpha = 0.5
    M = G.as_matrix() + alpha * jnp.eye(P)
    dense = jnp.linalg.slogdet(M)[1]

    def estimate(a):
        return lo.logdet(lo.shift(G, a, nonnegative=True), method="slq", key=jax.random.key(2), num_samples=30,
                         num_steps=60)

    est = estimate(alpha)
    assert abs(float(est.value - dense)) < 3 * float(est.standard_error)
    assert float(est.standard_error) < 0.02 * abs(float(dense))  # and the error bar is informative
    grad = jax.grad(lambda a: estimate(a).value)(alpha)
    assert_close(grad, jnp.trace(jnp.linalg.inv(M)), rtol=0.01, atol=0.0)


def test_slq_refuses_what_it_cannot_estimate():
    A = lo.Dense(jnp.array([[2.0, 1.0], [1.0, 3.0]]), tags={"symmetric"})
    with pytest.raises(ValueError, match="must be tagged PSD"):
        lo.logdet(A, method="slq", key=jax.random.key(0))
    B = lo.Dense(jnp.array([[2.0, 1.0], [1.0, 3.0]]), tags={"psd"})
    with pytest.raises(ValueError, match="needs an explicit PRNG key"):
        lo.logdet(B, method="slq")
    with pytest.raises(ValueError, match="num_samples must be >= 2"):
        lo.logdet(B, method="slq", key=jax.random.key(0), num_samples=1)
    with pytest.raises(ValueError, match="num_steps must be a positive integer"):
        lo.logdet(B, method="slq", key=jax.random.key(0), num_steps=0)
    with pytest.raises(ValueError, match="takes no key or options"):
        lo.logdet(B, method="dense", num_steps=3)
    with pytest.raises(ValueError, match="unknown method 'lanczos'; expected one of \\(None, 'dense', 'slq'\\)"):
        lo.logdet(B, method="lanczos")
    assert np.isfinite(float(lo.logdet(B, method="slq", key=jax.random.key(0), num_steps=5).value))
